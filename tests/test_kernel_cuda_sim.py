"""The CUDA kernel under numba-cuda's simulator agrees bitwise with the CPU kernel.

``NUMBA_ENABLE_CUDASIM`` must be set before ``numba.cuda`` is first imported, so the check runs
in a fresh interpreter.
"""

from __future__ import annotations

import textwrap

import pytest
from scripts import assert_runs_under_cuda_simulator

pytest.importorskip("numba")
pytest.importorskip("numba.cuda")


SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import dxode
    from problems import lorenz

    prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 1.0), (10.0, 28.0, 8 / 3))
    p = np.array([[10.0, 28.0 + i / 4, 8 / 3] for i in range(5)])
    spans = np.array([[0.0, 1.0 - i / 10] for i in range(5)])
    for dtype in (np.float64, np.float32):
        eprob = dxode.EnsembleProblem(prob.remake(u0=prob.u0.astype(dtype)), p=p, tspan=spans)
        options = {"saveat": [0.0, 0.25, 0.5], "rtol": 1e-5, "atol": 1e-5}
        gpu = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device="cuda"), **options)
        cpu = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **options)
        assert np.asarray(gpu.u).dtype == dtype
        assert np.array_equal(np.asarray(gpu.u), np.asarray(cpu.u)), dtype
        stats = lambda sim: [(s.stats.naccept, s.stats.nreject, s.stats.nf) for s in sim]
        assert stats(gpu) == stats(cpu)
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_kernel_under_the_simulator_matches_the_cpu_kernel(tmp_path):
    assert_runs_under_cuda_simulator(SCRIPT)


NUMPY_TOO_NEW = textwrap.dedent(
    """
    import array_api_compat.numpy  # copies NumPy's namespace, row_stack included
    import numpy as np

    del np.row_stack  # as NumPy 2.5 removed it, which numba-cuda 0.30's array typing still uses
    import dxode
    from problems import lorenz

    prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 1.0), (10.0, 28.0, 8 / 3))
    eprob = dxode.EnsembleProblem(prob, p=np.array([[10.0, 28.0, 8 / 3]] * 2))
    try:
        dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device="cuda"), trajectories=2)
    except ValueError as exc:
        assert "numba-cuda cannot load with NumPy" in str(exc), exc
        assert 'pip install "numpy<2.5"' in str(exc), exc
        print("ok")
    """
)


def test_a_numpy_numba_cuda_cannot_load_with_is_named_before_compiling():
    # on an H200 with NumPy 2.5 the first CUDA solve failed deep in numba-cuda's typing
    # (AttributeError: module 'numpy' has no attribute 'row_stack')
    assert_runs_under_cuda_simulator(NUMPY_TOO_NEW, timeout=120)


LARGEST_STEP = textwrap.dedent(
    """
    import dataclasses

    import numpy as np
    import dxode
    from dxode.kernels import ensemble_batch
    from dxode.kernels.cpu import run_cpu
    from dxode.kernels.cuda import run_cuda
    from dxode.kernels.stability_check import probe_steps
    from problems import lorenz

    seen = []
    run = ensemble_batch.run_events
    ensemble_batch.run_events = lambda r, b: seen.append(b) or run(r, b)
    prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 1.0), (10.0, 28.0, 8 / 3))
    p = np.array([[10.0, 28.0 + i / 4, 8 / 3] for i in range(4)])
    spans = np.array([[0.0, 1.0 - i / 5] for i in range(4)])
    eprob = dxode.EnsembleProblem(prob, p=p, tspan=spans)
    dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), saveat=[0.0, 0.4], rtol=1e-5, atol=1e-5)
    batch = dataclasses.replace(seen[0], screen_steps=probe_steps(run_cpu(seen[0]).naccept))
    gpu, cpu = run_cuda(batch), run_cpu(batch)
    assert np.all(cpu.screen[0] > 0.01), cpu.screen[0]
    assert np.isfinite(cpu.screen[1][:, :4]).all()
    for mine, theirs in zip(gpu.screen, cpu.screen):
        assert np.array_equal(mine, theirs, equal_nan=True), (mine, theirs)
    assert np.array_equal(gpu.saved, cpu.saved)
    print("ok")
    """
)


@pytest.mark.slow
def test_the_cuda_screen_run_returns_the_cpu_kernels_steps_and_probes():
    # the stability check's screen (kernel forward sensitivities) on CUDA: the one-lane
    # blocks' scalar accept against the CPU's vectorized commit
    assert_runs_under_cuda_simulator(LARGEST_STEP)
