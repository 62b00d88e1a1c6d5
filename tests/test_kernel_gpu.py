"""The compiled kernels with CuPy on a real GPU (skipped without one: CI has none).

The CUDA kernel is not bitwise the CPU kernel there: numba-cuda compiles with libNVVM's FMA
contraction on (``a * b + c`` rounded once, not twice), so the last bits differ and an
adaptive trajectory may take other steps. So it is held to the CPU kernel's accuracy against
a float64 reference, and to bitwise independence of the batch size on the GPU itself. The
generated code is checked bitwise against the CPU kernel under numba-cuda's simulator
(``test_kernel_cuda_sim.py`` and the kernel test modules).
"""

from __future__ import annotations

import numpy as np
import pytest

import dxode

from matrix import real_gpu_marks
from problems import lorenz

pytest.importorskip("numba")
pytest.importorskip("numba.cuda")

pytestmark = real_gpu_marks()

N = 1000
SAVEAT = [0.0, 0.5, 1.0]


def _inputs(dtype):
    p = np.stack([np.full(N, 10.0), np.linspace(20.0, 30.0, N), np.full(N, 8 / 3)], axis=1)
    u0 = np.tile([1.0, 0.0, 0.0], (N, 1))
    return u0.astype(dtype), p.astype(dtype)


def _solve(u0, p, alg, method="tsit5", **options):
    prob = dxode.ODEProblem(lorenz, u0[0], (0.0, 1.0), p[0])
    eprob = dxode.EnsembleProblem(prob, u0=u0, p=p)
    return dxode.solve(eprob, method, alg, trajectories=N, saveat=SAVEAT, **options)


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cuda_kernel_takes_and_returns_cupy_and_is_as_accurate_as_the_cpu_kernel(dtype):
    import cupy

    u0, p = _inputs(dtype)
    tol = 1e-6 if dtype == np.float64 else 1e-5
    gpu = _solve(
        cupy.asarray(u0), cupy.asarray(p), dxode.EnsembleKernel(device="cuda"), rtol=tol, atol=tol
    )
    cpu = _solve(u0, p, dxode.EnsembleKernel(), rtol=tol, atol=tol)
    exact = _solve(
        u0.astype(np.float64),
        p.astype(np.float64),
        dxode.EnsembleKernel(),
        "vern7",
        rtol=1e-12,
        atol=1e-12,
    )
    assert isinstance(gpu.u, cupy.ndarray) and gpu.u.dtype == dtype
    assert np.array_equal(_host(gpu.retcodes), _host(cpu.retcodes))
    reference = np.asarray(exact.u)
    scale = np.maximum(np.abs(reference), 1.0)
    err_gpu = np.max(np.abs(_host(gpu.u) - reference) / scale)
    err_cpu = np.max(np.abs(np.asarray(cpu.u) - reference) / scale)
    assert err_gpu <= 2 * err_cpu + np.finfo(dtype).eps, (err_gpu, err_cpu)


def test_cuda_kernel_is_bitwise_independent_of_the_batch_size():
    import cupy

    u0, p = (cupy.asarray(a) for a in _inputs(np.float64))
    alg = dxode.EnsembleKernel(device="cuda")
    whole = _solve(u0, p, alg, rtol=1e-6, atol=1e-6)
    batched = _solve(u0, p, alg, rtol=1e-6, atol=1e-6, batch_size=77)
    assert cupy.array_equal(whole.u, batched.u)


def test_single_kernel_solve_of_a_cupy_state_runs_on_the_host():
    import cupy

    u0, p = _inputs(np.float64)
    prob = dxode.ODEProblem(lorenz, u0[0], (0.0, 1.0), tuple(p[0]))
    on_host = dxode.solve(prob, saveat=SAVEAT, kernel=True)
    from_gpu = dxode.solve(prob.remake(u0=cupy.asarray(u0[0])), saveat=SAVEAT, kernel=True)
    assert np.array_equal(np.asarray(from_gpu.u), np.asarray(on_host.u))
