"""AutoSwitch in the compiled kernels switches as the array path does, lane by lane.

The switching problem is ``test_autoswitch``'s Prothero–Robinson, written with ``math`` so
numba compiles it: ``u' = -lambda(t) (u - cos t) - sin t``, exact solution ``cos t``, with
``lambda`` rising by ``a`` near ``t = 2`` and falling back near ``t = 6`` (a lane with
``a = 1e4`` switches to Rodas5P and back; ``a = 0`` never switches). Both paths use the same
elimination (``generic_lu``), so what is left between them is rounding in the last bits.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scripts import assert_runs_under_cuda_simulator

import dxode

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[1]
SPAN = (0.0, 10.0)
TOL = {"rtol": 1e-6, "atol": 1e-8}
SAVEAT = np.linspace(*SPAN, 41)


def prothero(u, p, t):
    lam = 1.0 + p * 0.5 * (math.tanh(5.0 * (t - 2.0)) - math.tanh(5.0 * (t - 6.0)))
    return [-lam * (u[0] - math.cos(t)) - math.sin(t)]


def vdp(u, p, t):
    x, y = u
    return [y, p * (1.0 - x * x) * y - x]


@pytest.fixture
def generic_lu(monkeypatch):
    """The array path with the kernel's elimination (partial pivoting) instead of LAPACK's."""
    from dxode.backends import _base, get_backend

    numpy_backend = type(get_backend("numpy"))
    monkeypatch.setattr(numpy_backend, "lu_factor", _base.Backend.lu_factor)
    monkeypatch.setattr(numpy_backend, "lu_solve", _base.Backend.lu_solve)


def _stats(sol):
    s = sol.stats
    return (s.naccept, s.nreject, s.njac, s.nlu, s.nswitch)


def test_a_lane_switches_both_ways_as_on_the_array_path(generic_lu):
    options = {"saveat": SAVEAT, **TOL}
    for amplitude, switches in ((1e4, 2), (0.0, 0)):
        prob = dxode.ODEProblem(prothero, np.array([1.0]), SPAN, amplitude)
        kernel = dxode.solve(prob, dxode.AutoSwitch(), kernel=True, **options)
        array = dxode.solve(prob, dxode.AutoSwitch(), **options)
        assert kernel.retcode == dxode.ReturnCode.Success
        assert kernel.stats.nswitch == switches
        assert _stats(kernel) == _stats(array)
        # One more RHS per switch back to Tsit5: f at the lane's state (Rodas5P keeps none).
        assert kernel.stats.nf == array.stats.nf + switches // 2
        u = np.asarray(kernel.u)[:, 0]
        # The controller's factor is the kernel's log/exp, not NumPy's pow: last-bit step
        # differences, which the stiff phase (a = 1e4) amplifies to 2e-9 in the values
        # (as in test_kernel_stiff): agreement to a hundredth of the tolerance.
        np.testing.assert_allclose(u, np.asarray(array.u)[:, 0], rtol=0, atol=1e-8)
        np.testing.assert_allclose(u, np.cos(SAVEAT), atol=2e-5)


PAIRS_SCRIPT = textwrap.dedent(
    """
    import dataclasses

    import numpy as np
    import dxode
    from dxode.backends import _base, get_backend
    from test_kernel_autoswitch import SAVEAT, SPAN, TOL, prothero

    numpy_backend = type(get_backend("numpy"))
    numpy_backend.lu_factor = _base.Backend.lu_factor
    numpy_backend.lu_solve = _base.Backend.lu_solve
    fd = {"autodiff": "finite_difference"}
    pairs = (
        dxode.AutoSwitch(dxode.DP5(), dxode.Rosenbrock23(**fd)),
        dxode.AutoSwitch(stiff=dxode.TRBDF2(**fd)),
    )
    prob = dxode.ODEProblem(prothero, np.array([1.0]), SPAN, 1e4)
    for alg in pairs:
        kernel = dxode.solve(prob, alg, kernel=True, saveat=SAVEAT, **TOL)
        array = dxode.solve(prob, alg, saveat=SAVEAT, **TOL)
        assert kernel.stats.nswitch == 2, kernel.stats
        # f at the state on the way back to the explicit method (Rosenbrock23 has it)
        extra = 0 if alg.stiff.fsal else 1
        expected = dataclasses.replace(array.stats, nf=array.stats.nf + extra)
        difference = np.max(np.abs(np.asarray(kernel.u) - np.asarray(array.u)))
        if isinstance(alg.stiff, dxode.Rosenbrock23):  # the same steps, to 1e-2 rtol
            assert kernel.stats == expected, (alg, kernel.stats, array.stats)
            assert difference < 1e-8, (alg, difference)
        else:  # one Newton-dependent vote lands one step later: one more step, within rtol
            assert abs(kernel.stats.naccept - array.stats.naccept) <= 1, kernel.stats
            assert difference < TOL["rtol"], (alg, difference)
    print("ok")
    """
)


@pytest.mark.slow
def test_other_method_pairs_take_the_array_paths_steps_without_avx512():
    """An FSAL stiff method (Rosenbrock23 hands its ``f(u1)`` on) and TRBDF2 (Newton
    iterations counted per lane), with the same derivatives (differences of ``f``) and the
    same elimination on both paths, switch as the array path does. The kernel's controller
    factor is its own log/exp, not NumPy's ``power``: its last-bit step differences leave
    Rosenbrock23 on the array path's steps (values to a hundredth of the tolerance), and make
    TRBDF2 cast one vote a step later (one more step, values within the tolerance). Run where
    NumPy's ``power`` is the C library's (its AVX-512 loops off, as on an AVX2 CPU):
    with AVX-512 the step sizes drift apart by 1e-9 before any switch, and near the stiff
    transition Rosenbrock23's error estimate amplifies that to 2e-8 in the values."""
    from cpu_features import avx2_environment

    env = {
        **avx2_environment(),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PAIRS_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_states_past_the_stiff_limit_are_refused():
    from dxode.kernels.errors import KernelUnsupportedError

    prob = dxode.ODEProblem(lambda u, p, t: -u, np.ones(29), SPAN)
    with pytest.raises(KernelUnsupportedError, match=r"at most 28 components, u0 has 29"):
        dxode.solve(prob, dxode.AutoSwitch(), kernel=True)


def test_gradients_through_a_switch_are_refused():
    autograd = pytest.importorskip("autograd")

    def final(a):
        prob = dxode.ODEProblem(prothero, np.array([1.0]), SPAN, a)
        return dxode.solve(prob, dxode.AutoSwitch(), kernel=True, saveat=[10.0]).u[-1][0]

    with pytest.raises(NotImplementedError, match="choose one"):
        autograd.grad(final)(1e4)


@pytest.mark.slow
def test_every_step_is_recorded_across_the_switches():
    prob = dxode.ODEProblem(prothero, np.array([1.0]), SPAN, 1e4)
    sol = dxode.solve(prob, dxode.AutoSwitch(), kernel=True, **TOL)
    assert sol.stats.nswitch == 2 and 0 < sol.stats.njac < sol.stats.naccept
    assert len(sol.t) == sol.stats.naccept + 1
    np.testing.assert_allclose(np.asarray(sol.u)[:, 0], np.cos(np.asarray(sol.t)), atol=2e-5)


def test_mixed_van_der_pol_ensemble_switches_only_its_stiff_lanes(generic_lu):
    mu = 1000.0 ** np.random.default_rng(19).uniform(0.0, 1.0, 12)
    mu[:2] = (1.0, 1000.0)
    prob = dxode.ODEProblem(vdp, np.array([2.0, 0.0]), (0.0, 50.0), 1.0)
    eprob = dxode.EnsembleProblem(prob, p=mu)
    options = {"trajectories": len(mu), "saveat": [25.0, 50.0], "maxiters": 10**5, **TOL}
    kernel = dxode.solve(eprob, dxode.AutoSwitch(), dxode.EnsembleKernel(block_size=4), **options)
    array = dxode.solve(eprob, dxode.AutoSwitch(), dxode.EnsembleArray(), **options)
    assert all(s.retcode == dxode.ReturnCode.Success for s in kernel)
    switches = np.asarray(kernel.stats.nswitch)
    np.testing.assert_array_equal(switches, array.stats.nswitch)
    np.testing.assert_array_equal(kernel.stats.naccept, array.stats.naccept)
    assert switches[0] == 0 and switches[1] > 0
    assert np.all(switches[mu < 2.0] == 0) and np.all(switches[mu > 100.0] > 0)
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=1e-6, atol=1e-8)


CUDA_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import dxode
    from test_kernel_autoswitch import prothero

    prob = dxode.ODEProblem(prothero, np.array([1.0]), (0.0, 10.0), 0.0)
    eprob = dxode.EnsembleProblem(prob, p=np.array([1e4, 0.0, 3e3]))
    options = {"trajectories": 3, "saveat": [0.0, 3.0, 10.0], "rtol": 1e-6, "atol": 1e-8}
    gpu = dxode.solve(eprob, dxode.AutoSwitch(), dxode.EnsembleKernel(device="cuda"), **options)
    cpu = dxode.solve(eprob, dxode.AutoSwitch(), dxode.EnsembleKernel(), **options)
    assert np.array_equal(np.asarray(gpu.u), np.asarray(cpu.u))
    stats = lambda sim: [(s.stats.naccept, s.stats.nreject, s.stats.nf) for s in sim]
    assert stats(gpu) == stats(cpu), (stats(gpu), stats(cpu))
    assert list(gpu.stats.nswitch) == list(cpu.stats.nswitch) == [2, 0, 2]
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_kernel_under_the_simulator_matches_the_cpu_kernel():
    """The CUDA AutoSwitch kernel under numba-cuda's simulator agrees bitwise with the CPU
    kernel (in a fresh interpreter: the simulator is chosen when ``numba.cuda`` loads)."""
    pytest.importorskip("numba.cuda")
    assert_runs_under_cuda_simulator(CUDA_SCRIPT)
