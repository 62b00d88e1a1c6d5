"""Every generated CUDA kernel compiled by libNVVM and run on a real GPU (skipped without one).

The simulator tests (``test_kernel_cuda_sim.py``, ``test_kernel_cuda_adjoint.py`` and the
``CUDA_SCRIPT`` checks of the kernel modules) run the generated CUDA code as Python, so they
cannot show that libNVVM compiles it. Here each variant — callbacks, Rosenbrock and TRBDF2,
AutoSwitch, the recording kernel and the adjoint sweep, forward sensitivities — runs on the
GPU on the simulator tests' problems. FMA contraction changes the last bits there (see
``test_kernel_gpu.py``), so the results are held to the CPU kernel's within a few times the
solves' tolerance, not bitwise, and event counts and return codes must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest

import dxode

from matrix import real_gpu_marks

pytest.importorskip("numba")
pytest.importorskip("numba.cuda")
autograd = pytest.importorskip("autograd")

pytestmark = real_gpu_marks()

GPU = dxode.EnsembleKernel(device="cuda")
CPU = dxode.EnsembleKernel()


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def test_callbacks_on_the_gpu_give_the_cpu_kernels_events():
    from test_kernel_events import RATES, STARTS, mixed_callbacks, rate

    prob = dxode.ODEProblem(rate, np.array([0.0]), (0.0, 4.0), (1.0,))
    eprob = dxode.EnsembleProblem(prob, u0=STARTS, p=RATES)
    callbacks = mixed_callbacks()
    opts = {"callback": callbacks, "saveat": 0.5, "rtol": 1e-8, "atol": 1e-10}
    gpu = dxode.solve(eprob, "tsit5", GPU, **opts)
    cpu = dxode.solve(eprob, "tsit5", CPU, **opts)
    np.testing.assert_array_equal(gpu.retcodes, cpu.retcodes)
    np.testing.assert_allclose(_host(gpu.u), _host(cpu.u), rtol=1e-6, atol=1e-8, equal_nan=True)
    assert len(gpu.events) == len(cpu.events) > 5
    for name in ("callback", "trajectory"):
        np.testing.assert_array_equal(getattr(gpu.events, name), getattr(cpu.events, name))
    # A DiscreteCallback fires at the end of a step, and FMA contraction moves the GPU's
    # steps: its events are where each device's steps ended (seen: 1e-6 apart, relative, in
    # u = 1.88 growing at rate 1.2), while located crossings and preset times are the
    # problem's own and agree to the solves' tolerance.
    discrete = np.asarray(cpu.events.callback) == len(callbacks.callbacks) - 1
    assert isinstance(callbacks.callbacks[-1], dxode.DiscreteCallback) and discrete.any()
    for name in ("t", "u_before", "u_after"):
        a, b = (_host(getattr(sim.events, name)) for sim in (gpu, cpu))
        near = {"equal_nan": True, "err_msg": name}
        np.testing.assert_allclose(a[~discrete], b[~discrete], rtol=1e-6, atol=1e-8, **near)
        np.testing.assert_allclose(a[discrete], b[discrete], rtol=1e-4, **near)


@pytest.mark.parametrize(
    ("alg", "with_jac"),
    [(dxode.Rodas5P(), True), (dxode.Rosenbrock23(), False), (dxode.TRBDF2(), True)],
    ids=["Rodas5P", "Rosenbrock23-no-jac", "TRBDF2"],
)
def test_stiff_kernels_on_the_gpu_agree_with_the_cpu_kernel(alg, with_jac):
    from test_kernel_stiff import _problem

    prob = _problem("rober", with_jac=with_jac).remake(tspan=(0.0, 10.0))
    p = np.array([[0.04 * (1 + i / 4), 3e7, 1e4] for i in range(3)])
    eprob = dxode.EnsembleProblem(prob, p=p)
    options = {"saveat": [0.0, 0.5, 5.0, 10.0], "rtol": 1e-8, "atol": 1e-12}
    gpu = dxode.solve(eprob, alg, GPU, **options)
    cpu = dxode.solve(eprob, alg, CPU, **options)
    assert np.all(gpu.retcodes == 0) and np.all(cpu.retcodes == 0)
    np.testing.assert_allclose(_host(gpu.u), _host(cpu.u), rtol=1e-6, atol=1e-11)


def test_autoswitch_on_the_gpu_switches_where_the_cpu_kernel_does():
    from test_kernel_autoswitch import prothero

    prob = dxode.ODEProblem(prothero, np.array([1.0]), (0.0, 10.0), 0.0)
    eprob = dxode.EnsembleProblem(prob, p=np.array([1e4, 0.0, 3e3]))
    options = {"trajectories": 3, "saveat": [0.0, 3.0, 10.0], "rtol": 1e-6, "atol": 1e-8}
    gpu = dxode.solve(eprob, dxode.AutoSwitch(), GPU, **options)
    cpu = dxode.solve(eprob, dxode.AutoSwitch(), CPU, **options)
    np.testing.assert_allclose(_host(gpu.u), _host(cpu.u), rtol=1e-4, atol=1e-7)
    assert list(gpu.stats.nswitch) == list(cpu.stats.nswitch) == [2, 0, 2]


@pytest.mark.parametrize(
    "sensealg", [dxode.ForwardSensitivity(), dxode.DiscreteAdjoint()], ids=["forward", "adjoint"]
)
def test_gradients_on_the_gpu_agree_with_the_cpu_kernel_and_differences(sensealg):
    from test_kernel_cuda_adjoint import U0S, P, central_differences, loss

    def grad(device):
        return autograd.grad(lambda a: loss(*a, device, sensealg))((U0S, P))

    gpu, cpu = grad("cuda"), grad("cpu")
    for a, b in zip(gpu, cpu, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-7)
    np.testing.assert_allclose(
        gpu[0], central_differences(lambda u: loss(u, P, "cuda"), U0S), rtol=1e-6
    )
    np.testing.assert_allclose(
        gpu[1], central_differences(lambda p: loss(U0S, p, "cuda"), P), rtol=1e-6
    )


def test_adjoint_lanes_that_overflow_their_record_are_rerun_on_the_gpu(monkeypatch):
    from test_kernel_cuda_adjoint import ADJOINT, U0S, P, loss

    from dxode.kernels import adjoint_record

    full = autograd.grad(lambda a: loss(*a, "cuda", ADJOINT))((U0S, P))
    monkeypatch.setattr(adjoint_record, "RECORD_CAPACITY", 4)
    short = autograd.grad(lambda a: loss(*a, "cuda", ADJOINT))((U0S, P))
    for a, b in zip(short, full, strict=True):
        np.testing.assert_array_equal(a, b)


def test_many_lanes_fill_the_gpu_and_match_the_cpu_kernel():
    from problems import lorenz

    n = 50_000
    rho = np.linspace(20.0, 30.0, n)
    p = np.column_stack([np.full(n, 10.0), rho, np.full(n, 8 / 3)])
    prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 1.0), (10.0, 28.0, 8 / 3))
    eprob = dxode.EnsembleProblem(prob, p=p)
    options = {"saveat": [0.5, 1.0], "rtol": 1e-10, "atol": 1e-10}
    gpu = dxode.solve(eprob, "tsit5", GPU, **options)
    cpu = dxode.solve(eprob, "tsit5", CPU, **options)
    assert np.all(gpu.retcodes == 0)
    np.testing.assert_allclose(_host(gpu.u), _host(cpu.u), rtol=1e-7, atol=1e-8)
    steps = np.asarray(gpu.stats.naccept) - np.asarray(cpu.stats.naccept)
    assert np.max(np.abs(steps)) <= 2
