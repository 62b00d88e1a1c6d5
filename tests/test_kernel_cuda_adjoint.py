"""The kernel discrete adjoint on CUDA (``EnsembleKernel(device="cuda")``), under numba-cuda's
simulator: the recording forward kernel and the backward sweep run one thread per lane.

Checked against the CPU kernel's discrete adjoint (the same generated sweep compiled by numba
for the CPU; under the simulator the CUDA code runs as Python on the same IEEE doubles, without
FMA contraction, so the two agree bit for bit where ``f`` is plain arithmetic; with ``math``
functions to a few ulps, the libraries' last bits),
central differences, the plain CUDA solve (the forward pass's saves and statistics, bit for
bit) and the CPU recording kernel (the step record, bit for bit).

``NUMBA_ENABLE_CUDASIM`` must be set before ``numba.cuda`` is first imported, so each check
runs in a fresh interpreter; the simulator is slow, so a few lanes over short spans.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from scripts import assert_runs_under_cuda_simulator

pytest.importorskip("numba")
pytest.importorskip("numba.cuda")
autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")

from test_kernel_adjoint import _bounce, _fall, _ground  # noqa: E402

import dxode  # noqa: E402

ADJOINT = dxode.DiscreteAdjoint()
U0S = np.array([[1.0, 0.5], [0.2, -0.3], [2.0, 0.0]])
P = np.array([[1.6, 0.3], [1.2, 0.1], [2.0, 0.5]])  # per lane (omega, zeta)


def damped(u, p, t):
    x, v = u
    omega, zeta = p
    return [v, -omega * omega * x - 2.0 * zeta * omega * v]


def damped_without_literals(u, p, t):
    """``damped`` with no Python float literal: for a float32 state numba promotes
    ``2.0 * zeta`` to float64 where the simulator's NumPy keeps float32, so the CPU and
    simulated kernels would compute ``damped`` differently (not the code under test)."""
    x, v = u
    omega, zeta = p
    return [v, -omega * omega * x - (zeta + zeta) * omega * v]


def loss(u0s, p, device, sensealg=ADJOINT, rtol=1e-10, f=damped):
    prob = dxode.ODEProblem(f, U0S[0], (0.0, 2.0), (1.6, 0.3))
    eprob = dxode.EnsembleProblem(prob, u0=u0s, p=p)
    options = {"saveat": [0.5, 1.3, 2.0], "rtol": rtol, "atol": rtol, "sensealg": sensealg}
    sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device=device), **options)
    return anp.sum(sim.u**2)


def vern7_backward_grad(device):
    """Vern7 (extra interpolation stages where a save falls in a step), time running
    backward."""

    def loss_(u0s, p):
        prob = dxode.ODEProblem(damped, U0S[0], (2.0, 0.0), (1.6, 0.3))
        eprob = dxode.EnsembleProblem(prob, u0=u0s, p=p)
        options = {"saveat": [1.5, 0.7, 0.0], "rtol": 1e-10, "atol": 1e-10, "sensealg": ADJOINT}
        sim = dxode.solve(eprob, "vern7", dxode.EnsembleKernel(device=device), **options)
        return anp.sum(sim.u**2)

    return autograd.grad(lambda a: loss_(*a))((U0S, P))


def central_differences(func, x, eps=1e-6):
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        out[i] = (func(x + e) - func(x - e)) / (2 * eps)
    return out


AGREEMENT = textwrap.dedent(
    """
    import autograd, numpy as np
    from autograd.tracer import getval
    import dxode
    from dxode.kernels import adjoint, adjoint_record, adjoint_sweep, cuda
    from test_kernel_cuda_adjoint import ADJOINT, P, U0S, central_differences, damped, loss

    launches, sweeps, records = [], [], []
    run_cuda, on_device, recorded = cuda.run_cuda, adjoint_sweep._on_device, adjoint.recorded_lanes

    def spy_run(batch, as_cupy=False, record_capacity=None):
        launches.append((batch.n_lanes, record_capacity))
        return run_cuda(batch, as_cupy, record_capacity)

    def spy_sweep(kernel, *arrays):
        sweeps.append(arrays[2].shape[0] - 1)
        return on_device(kernel, *arrays)

    def both_records(batch, device):  # the device's record, and the CPU kernel's
        out = recorded(batch, device)
        records.append((out, recorded(batch, "cpu")))
        return out

    cuda.run_cuda, adjoint_sweep._on_device = spy_run, spy_sweep
    adjoint.recorded_lanes = both_records

    grad = lambda device: autograd.grad(lambda a: loss(*a, device))((U0S, P))
    gpu = grad("cuda")
    assert sweeps == [3] and launches == [(3, adjoint_record.RECORD_CAPACITY)], (sweeps, launches)
    cpu = grad("cpu")
    for a, b in zip(gpu, cpu):  # the same sweep on both, plain arithmetic: bit for bit
        np.testing.assert_array_equal(a, b)

    (steps, saved, outcome), (cpu_steps, cpu_saved, cpu_outcome) = records[0]
    assert all(np.array_equal(a, c) for s, cs in zip(steps, cpu_steps) for a, c in zip(s, cs))
    assert np.array_equal(saved, cpu_saved)
    assert all(np.array_equal(outcome[k], cpu_outcome[k]) for k in outcome)

    # the forward pass is the plain CUDA solve, bit for bit
    seen = {}
    def spy_loss(u0s):
        prob = dxode.ODEProblem(damped, U0S[0], (0.0, 2.0), (1.6, 0.3))
        eprob = dxode.EnsembleProblem(prob, u0=u0s, p=P)
        options = {"saveat": [0.5, 1.3, 2.0], "rtol": 1e-10, "atol": 1e-10}
        kernel = dxode.EnsembleKernel(device="cuda")
        sim = dxode.solve(eprob, "tsit5", kernel, sensealg=ADJOINT, **options)
        plain = dxode.solve(eprob, "tsit5", kernel, **options)
        stats = lambda s: [(x.stats.naccept, x.stats.nreject, x.stats.nf) for x in s]
        seen["same"] = np.array_equal(getval(sim.u), plain.u) and stats(sim) == stats(plain)
        return np.sum(sim.u)
    autograd.grad(spy_loss)(U0S)
    assert seen["same"]

    # buffers too short for the steps: those lanes again with room for all, the same gradient
    adjoint_record.RECORD_CAPACITY = 4
    launches.clear()
    short = grad("cuda")
    assert launches[0] == (3, 4) and launches[1][0] == 3, launches
    counts = [len(t) for t, _ in steps]
    assert launches[1][1] == max(counts) > 4, (launches, counts)
    assert all(np.array_equal(a, b) for a, b in zip(short, gpu))

    diff_u0 = central_differences(lambda u: loss(u, P, "cuda", None), U0S)
    diff_p = central_differences(lambda p: loss(U0S, p, "cuda", None), P)
    np.testing.assert_allclose(gpu[0], diff_u0, rtol=1e-6)
    np.testing.assert_allclose(gpu[1], diff_p, rtol=1e-6)
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_adjoint_matches_the_cpu_adjoint_and_differences():
    assert_runs_under_cuda_simulator(AGREEMENT)


def _forced(u, p, t):
    """A 2-state system driven by 12 weights: the default differentiates it by the adjoint."""
    x, v = u
    w = p[0]
    force = 0.0
    for k in range(12):
        force = force + w[k] * math.sin((k + 1) * 0.3 * t)
    return [v, -x - 0.1 * v + 0.05 * force]


def forced_loss(w, device):
    prob = dxode.ODEProblem(_forced, np.array([1.0, 0.0]), (0.0, 1.5), (w,))
    eprob = dxode.EnsembleProblem(prob, u0=np.array([[1.0, 0.0], [0.0, 1.0]]))
    options = {"saveat": [0.5, 1.5], "rtol": 1e-10, "atol": 1e-10}
    sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device=device), **options)
    return anp.sum(sim.u**2)


MANY = textwrap.dedent(
    """
    import autograd, numpy as np
    from dxode.kernels import adjoint, gradients
    from test_kernel_cuda_adjoint import central_differences, forced_loss

    devices = []
    forward_lanes = adjoint.KernelDiscreteAdjoint.forward_lanes

    def spy(self, *args):
        devices.append(self.device)
        return forward_lanes(self, *args)

    adjoint.KernelDiscreteAdjoint.forward_lanes = spy
    w0 = np.linspace(-1.0, 1.0, 12)
    assert w0.size > gradients.ADJOINT_ABOVE
    gpu = autograd.grad(lambda w: forced_loss(w, "cuda"))(w0)
    assert devices == ["cuda"], devices
    cpu = autograd.grad(lambda w: forced_loss(w, "cpu"))(w0)
    assert devices == ["cuda", "cpu"], devices
    np.testing.assert_allclose(gpu, cpu, rtol=1e-13, atol=1e-16)  # math.sin: a few ulps
    differences = central_differences(lambda w: forced_loss(w, "cpu"), w0)
    # relative to the gradient's size: differences of adaptive solves also see the steps move
    np.testing.assert_allclose(gpu, differences, rtol=0, atol=1e-6 * np.max(np.abs(gpu)))
    print("ok")
    """
)


@pytest.mark.slow
def test_many_parameters_take_the_adjoint_on_cuda_by_default():
    assert_runs_under_cuda_simulator(MANY)


def _blowup(u, p, t):
    (x,) = u
    return [p[0] * x * x]  # x(t) = 1 / (1 - p t): infinite at t = 1 / p


def blowup_grad(device):
    prob = dxode.ODEProblem(_blowup, np.array([1.0]), (0.0, 2.0), (0.1,))

    def loss_(p):
        eprob = dxode.EnsembleProblem(prob, p=p)
        options = {"saveat": [2.0], "rtol": 1e-10, "atol": 1e-10, "sensealg": ADJOINT}
        sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device=device), **options)
        return anp.sum(anp.where(np.isfinite(autograd.tracer.getval(sim.u)), sim.u, 0.0) ** 2)

    return autograd.grad(loss_)(np.array([[0.1], [0.2], [1.0]]))[:, 0]  # the last one fails


EDGES = textwrap.dedent(
    """
    import autograd, numpy as np
    from test_kernel_cuda_adjoint import (
        ADJOINT, P, U0S, blowup_grad, damped_without_literals, loss, vern7_backward_grad
    )

    grad = blowup_grad("cuda")
    exact = 4.0 / (1.0 - 2.0 * np.array([0.1, 0.2])) ** 3  # d/dp x(2)^2 = 4 / (1 - 2p)^3
    np.testing.assert_allclose(grad[:2], exact, rtol=1e-8)
    assert np.isnan(grad[2])

    f = damped_without_literals
    single = lambda device: autograd.grad(lambda a: loss(*a, device, ADJOINT, 1e-6, f))(
        (U0S.astype(np.float32), P.astype(np.float32))
    )
    gpu, cpu = single("cuda"), single("cpu")
    double = autograd.grad(lambda a: loss(*a, "cuda", f=f))((U0S, P))
    for a, b, c in zip(gpu, cpu, double):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)  # the same float32 steps, the same float64 sweep
        np.testing.assert_allclose(a, c, rtol=1e-4)

    for a, b in zip(vern7_backward_grad("cuda"), vern7_backward_grad("cpu")):
        np.testing.assert_array_equal(a, b)
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_adjoint_failed_lane_float32_extra_stages_and_backward_time():
    assert_runs_under_cuda_simulator(EDGES)


def bouncing_grad(sensealg, device):
    """Two bouncing balls: each segment between events a kernel solve, the jumps traced."""
    ball = dxode.ContinuousCallback(_ground, _bounce, direction="down")

    def loss_(theta):
        u0s = np.array([[1.0, 0.0], [1.5, 0.5]]) * theta[0]
        prob = dxode.ODEProblem(_fall, u0s[0], (0.0, 1.2), (9.81, theta[1]))
        options = {"saveat": [0.3, 0.9, 1.2], "rtol": 1e-10, "atol": 1e-10, "callback": ball}
        eprob = dxode.EnsembleProblem(prob, u0=u0s)
        kernel = dxode.EnsembleKernel(device=device)
        sim = dxode.solve(eprob, "tsit5", kernel, trajectories=2, sensealg=sensealg, **options)
        return anp.sum(sim.u[:, :, 0] ** 2)

    return autograd.grad(loss_)(np.array([1.0, 0.8]))


EVENTS = textwrap.dedent(
    """
    import numpy as np
    import dxode
    from test_kernel_cuda_adjoint import ADJOINT, bouncing_grad

    adjoint = bouncing_grad(ADJOINT, "cuda")
    forward = bouncing_grad(dxode.ForwardSensitivity(), "cuda")
    on_cpu = bouncing_grad(ADJOINT, "cpu")  # its event pass by the CPU kernel, not the array path
    np.testing.assert_allclose(adjoint, forward, rtol=1e-12)
    np.testing.assert_allclose(adjoint, on_cpu, rtol=1e-12)
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_adjoint_through_event_segments():
    assert_runs_under_cuda_simulator(EVENTS)


def test_the_cuda_sweep_refuses_an_f_that_takes_u_as_an_array():
    """As forward sensitivities on CUDA do (checked without compiling or a GPU)."""
    from dxode.kernels.adjoint_sweep import lane_sweep
    from dxode.kernels.errors import KernelUnsupportedError

    with pytest.raises(KernelUnsupportedError, match=r"tuple of numbers.*device='cpu'"):
        lane_sweep(damped, 2, True, "(P[0, g], P[1, g])", (1.6, 0.3), target="cuda", stages=7)


def _rate(u, p, t):
    return [p[0] * u[0]]


def _above(u, p, t):
    return u[0] > p[1]


def _scale(u, p, t, fired):
    return [u[0] * p[2]]


def discrete_event_grad(sensealg, device):
    """Lanes cut by a ``DiscreteCallback`` (it fires at a step's end): the value, its events
    and the gradient."""
    cut = dxode.DiscreteCallback(_above, _scale)
    seen = {}

    def loss_(p):
        prob = dxode.ODEProblem(_rate, np.array([1.0]), (0.0, 2.0), (1.0, 1.5, 0.5))
        eprob = dxode.EnsembleProblem(prob, u0=np.array([[1.0], [0.7], [1.3]]), p=p)
        options = {"saveat": [0.5, 1.0, 2.0], "rtol": 1e-6, "atol": 1e-6, "callback": cut}
        kernel = dxode.EnsembleKernel(device=device)
        sim = dxode.solve(eprob, "tsit5", kernel, sensealg=sensealg, **options)
        seen["u"], seen["t"] = autograd.tracer.getval(sim.u), np.asarray(sim.events.t)
        return anp.sum(sim.u**2)

    p = np.array([[1.1, 1.5, 0.5], [0.9, 1.4, 0.6], [1.3, 1.6, 0.4]])
    return autograd.grad(loss_)(p), seen["u"], seen["t"]


DISCRETE_EVENTS = textwrap.dedent(
    """
    import numpy as np
    import dxode
    from test_kernel_cuda_adjoint import ADJOINT, discrete_event_grad

    for sensealg in (ADJOINT, dxode.ForwardSensitivity()):
        gpu, cpu = discrete_event_grad(sensealg, "cuda"), discrete_event_grad(sensealg, "cpu")
        assert len(cpu[2]) > 5
        for a, b in zip(gpu, cpu):
            np.testing.assert_array_equal(a, b)
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_event_pass_is_the_cuda_kernels_solve():
    # On CUDA the event pass of a differentiated solve with callbacks was the array path's:
    # a DiscreteCallback fired where the array path's steps ended, not the kernel's (event
    # times 1e-11 off the CPU kernel's, and so the values and gradients in the last bits)
    assert_runs_under_cuda_simulator(DISCRETE_EVENTS)
