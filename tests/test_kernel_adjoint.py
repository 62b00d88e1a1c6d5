"""The kernel path's discrete adjoint (``sensealg=DiscreteAdjoint()`` with ``kernel=True`` or
``EnsembleKernel``, and the default above ``ADJOINT_ABOVE`` inputs).

Checked against the kernel's forward sensitivities (the same derivative of the same steps,
computed forward), the array path's ``DiscreteAdjoint`` (autograd through an independent
implementation, steps equal to rounding) and central differences.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("numba")
autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")

import dxode  # noqa: E402
from dxode.demo.lorenz import lorenz, lorenz_jac, lorenz_paramjac  # noqa: E402
from dxode.kernels.errors import KernelUnsupportedError  # noqa: E402

TIMES = np.linspace(0.0, 5.0, 11)
ADJOINT = dxode.DiscreteAdjoint()
FORWARD = dxode.ForwardSensitivity()


def damped(u, p, t):
    x, v = u
    omega, zeta = p
    return [v, -omega * omega * x - 2.0 * zeta * omega * v]


def _oscillator_loss(theta, sensealg, kernel=True, dtype=np.float64, alg="tsit5", rtol=1e-10):
    u0 = theta[:2] if dtype == np.float64 else anp.array(theta[:2], dtype=dtype)
    prob = dxode.ODEProblem(damped, u0, (0.0, 5.0), (theta[2], theta[3]))
    options = {"saveat": TIMES, "rtol": rtol, "atol": rtol, "kernel": kernel}
    sol = dxode.solve(prob, alg, sensealg=sensealg, **options)
    return anp.sum(sol.u**2)


def _central_differences(func, x, eps=1e-6):
    return np.array([(func(x + eps * e) - func(x - eps * e)) / (2 * eps) for e in np.eye(x.size)])


THETA = np.array([1.0, 0.5, 1.6, 0.3])  # u0 (x, v) and p (omega, zeta)


def test_single_solve_adjoint_matches_forward_sensitivities_array_and_differences():
    adjoint = autograd.grad(lambda th: _oscillator_loss(th, ADJOINT))(THETA)
    forward = autograd.grad(lambda th: _oscillator_loss(th, FORWARD))(THETA)
    array = autograd.grad(lambda th: _oscillator_loss(th, ADJOINT, kernel=False))(THETA)
    differences = _central_differences(lambda th: _oscillator_loss(th, None), THETA)
    np.testing.assert_allclose(adjoint, forward, rtol=1e-12)  # the same derivative
    np.testing.assert_allclose(adjoint, array, rtol=1e-12)
    np.testing.assert_allclose(adjoint, differences, rtol=1e-6)


def test_the_adjoint_forward_pass_is_the_plain_kernel_solve():
    prob = dxode.ODEProblem(damped, THETA[:2], (0.0, 5.0), (1.6, 0.3))
    options = {"saveat": TIMES, "rtol": 1e-8, "atol": 1e-8, "kernel": True}
    plain = dxode.solve(prob, "tsit5", **options)
    seen = {}

    def loss(u0):
        sol = dxode.solve(prob.remake(u0=u0), "tsit5", sensealg=ADJOINT, **options)
        seen["u"], seen["stats"] = autograd.tracer.getval(sol.u), sol.stats
        return anp.sum(sol.u)

    autograd.grad(loss)(THETA[:2])
    assert np.array_equal(seen["u"], plain.u)
    assert seen["stats"] == plain.stats


@pytest.mark.slow
def test_float32_adjoint_agrees_with_float64():
    single = autograd.grad(lambda th: _oscillator_loss(th, ADJOINT, dtype=np.float32, rtol=1e-6))
    double = autograd.grad(lambda th: _oscillator_loss(th, ADJOINT))(THETA)
    np.testing.assert_allclose(single(THETA), double, rtol=1e-4)


@pytest.mark.slow
def test_extra_interpolation_stages_and_backward_time():
    """Vern7 saves from extra stages (their VJPs enter where a save falls in a step); a
    tspan running backward."""
    adjoint = autograd.grad(lambda th: _oscillator_loss(th, ADJOINT, alg="vern7"))(THETA)
    forward = autograd.grad(lambda th: _oscillator_loss(th, FORWARD, alg="vern7"))(THETA)
    np.testing.assert_allclose(adjoint, forward, rtol=1e-11)

    def backward_loss(th, sensealg):
        prob = dxode.ODEProblem(damped, th[:2], (2.0, 0.0), (th[2], th[3]))
        options = {"saveat": [1.5, 0.7, 0.0], "rtol": 1e-10, "atol": 1e-10, "kernel": True}
        return anp.sum(dxode.solve(prob, "tsit5", sensealg=sensealg, **options).u ** 2)

    adjoint = autograd.grad(lambda th: backward_loss(th, ADJOINT))(THETA)
    forward = autograd.grad(lambda th: backward_loss(th, FORWARD))(THETA)
    np.testing.assert_allclose(adjoint, forward, rtol=1e-11)


U0S = np.array([[1.0, 0.0, 0.0], [0.5, 1.0, 2.0], [-1.0, 2.0, 20.0], [3.0, -2.0, 10.0]])
SCALES = np.array([1.0, 0.95, 1.05, 1.1])


def _lorenz_loss(p, ensemble_alg, shared, sensealg, f=lorenz, batch_size=None, **problem):
    base = dxode.ODEProblem(f, U0S[0], (0.0, 1.0), (10.0, 28.0, 8 / 3), **problem)
    if shared:  # one parameter vector for every trajectory: its cotangents are summed
        eprob = dxode.EnsembleProblem(base.remake(p=p), u0=U0S)
    else:  # per-trajectory parameters (4, 3)
        eprob = dxode.EnsembleProblem(base, u0=U0S, p=p)
    options = {"saveat": [0.25, 0.5, 1.0], "rtol": 1e-10, "atol": 1e-10}
    sim = dxode.solve(
        eprob,
        dxode.Tsit5(),
        ensemble_alg,
        trajectories=4,
        sensealg=sensealg,
        batch_size=batch_size,
        **options,
    )
    return anp.sum(sim.u**2)


@pytest.mark.slow
def test_dask_workers_run_the_kernel_adjoint(client):
    """``EnsembleDask(kernel=...)``: each batch's record stays on its worker, whose backward
    sweep gives the local kernel's per-lane cotangents bit for bit."""
    pytest.importorskip("distributed")
    p = np.array([10.0, 28.0, 8 / 3]) * SCALES[:, None]
    local = dxode.EnsembleKernel(threads=1)
    dask = dxode.EnsembleDask(client, kernel=local)
    here = autograd.grad(lambda q: _lorenz_loss(q, local, False, ADJOINT))(p)
    there = autograd.grad(lambda q: _lorenz_loss(q, dask, False, ADJOINT, batch_size=2))(p)
    np.testing.assert_array_equal(there, here)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-p", "per-lane-p"])
def test_ensemble_adjoint_matches_forward_sensitivities_and_the_array_path(shared):
    theta = np.array([10.0, 28.0, 8 / 3])
    p = theta if shared else theta * SCALES[:, None]
    kernel = dxode.EnsembleKernel()
    adjoint = autograd.grad(lambda q: _lorenz_loss(q, kernel, shared, ADJOINT))(p)
    forward = autograd.grad(lambda q: _lorenz_loss(q, kernel, shared, FORWARD))(p)
    array = autograd.grad(lambda q: _lorenz_loss(q, dxode.EnsembleArray(), shared, ADJOINT))(p)
    assert adjoint.shape == p.shape
    np.testing.assert_allclose(adjoint, forward, rtol=1e-9)
    np.testing.assert_allclose(adjoint, array, rtol=1e-9)


def _lorenz_math(u, p, t):  # math.exp: traced as autograd.numpy.exp in the parameter pass
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z * math.exp(0.0 * t)]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["math-functions", "jacobians"])
def test_parameter_cotangents_of_kernel_style_f(how):
    """``f`` calling ``math`` functions (autograd traces its copy with ``autograd.numpy``'s);
    with ``jac`` and ``paramjac``: from them (compiled)."""
    p = np.array([10.0, 28.0, 8 / 3]) * SCALES[:, None]
    kernel = dxode.EnsembleKernel()
    if how == "math-functions":
        loss = lambda q, s: _lorenz_loss(q, kernel, False, s, f=_lorenz_math)
    else:
        hand = {"jac": lorenz_jac, "paramjac": lorenz_paramjac}
        loss = lambda q, s: _lorenz_loss(q, kernel, False, s, **hand)
    adjoint = autograd.grad(lambda q: loss(q, ADJOINT))(p)
    forward = autograd.grad(lambda q: loss(q, FORWARD))(p)
    np.testing.assert_allclose(adjoint, forward, rtol=1e-9)


def _blowup(u, p, t):
    (x,) = u
    return [p[0] * x * x]  # x(t) = 1 / (1 - p t): infinite at t = 1 / p


def test_a_failed_lane_gets_nan_gradients_the_others_exact_ones():
    prob = dxode.ODEProblem(_blowup, np.array([1.0]), (0.0, 2.0), (0.1,))

    def loss(p):
        eprob = dxode.EnsembleProblem(prob, p=p)
        options = {"saveat": [2.0], "rtol": 1e-10, "atol": 1e-10, "sensealg": ADJOINT}
        sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), trajectories=3, **options)
        return anp.sum(anp.where(np.isfinite(autograd.tracer.getval(sim.u)), sim.u, 0.0) ** 2)

    p = np.array([[0.1], [0.2], [1.0]])  # the last lane blows up at t = 1
    grad = autograd.grad(loss)(p)[:, 0]
    exact = 4.0 / (1.0 - 2.0 * p[:2, 0]) ** 3  # d/dp x(2)^2 = 4 / (1 - 2p)^3
    np.testing.assert_allclose(grad[:2], exact, rtol=1e-8)
    assert np.isnan(grad[2])


def _many(u, p, t):
    """A 2-state system with 20 parameters: the default differentiates it by the adjoint."""
    x, v = u
    w = p[0]
    force = 0.0
    for k in range(20):
        force = force + w[k] * np.sin((k + 1) * 0.1 * t)
    return [v, -x - 0.1 * v + 0.05 * force]


def test_which_algorithm_the_default_picks():
    """Forward sensitivities up to ADJOINT_ABOVE inputs and MAX_FORWARD_COMPONENTS, the
    adjoint above, on the CPU and CUDA through explicit methods (checked without
    compiling)."""
    from types import SimpleNamespace

    from dxode.kernels.adjoint import KernelDiscreteAdjoint
    from dxode.kernels.gradients import (
        ADJOINT_ABOVE,
        MAX_FORWARD_COMPONENTS,
        KernelForwardSensitivity,
        kernel_sensealg,
    )

    default = KernelForwardSensitivity(adjoint_above=ADJOINT_ABOVE)
    explicit = SimpleNamespace(options=SimpleNamespace(alg=dxode.Tsit5()))
    stiff = SimpleNamespace(options=SimpleNamespace(alg=dxode.Rodas5P()))
    assert not default._adjoint_instead(explicit, 2, ADJOINT_ABOVE)
    assert default._adjoint_instead(explicit, 2, ADJOINT_ABOVE + 1)
    n = MAX_FORWARD_COMPONENTS // 4 + 1  # 8 states, 3 inputs: 32 components
    assert default._adjoint_instead(explicit, n, 3)
    assert not default._adjoint_instead(stiff, 2, ADJOINT_ABOVE + 1)  # no adjoint: forward
    with pytest.raises(KernelUnsupportedError, match="components"):
        default._adjoint_instead(stiff, n, 3)
    cuda = KernelForwardSensitivity(device="cuda", adjoint_above=ADJOINT_ABOVE)
    assert not cuda._adjoint_instead(explicit, 2, ADJOINT_ABOVE)
    assert cuda._adjoint_instead(explicit, 2, ADJOINT_ABOVE + 1)
    assert cuda._adjoint_instead(explicit, n, 3)
    assert kernel_sensealg(ADJOINT, device="cuda") == KernelDiscreteAdjoint(device="cuda")


@pytest.mark.slow
def test_the_default_switches_to_the_adjoint_above_the_threshold(monkeypatch):
    from dxode.kernels import adjoint, gradients

    calls = []
    forward_lanes = adjoint.KernelDiscreteAdjoint.forward_lanes

    def spy(self, *args):
        calls.append(1)
        return forward_lanes(self, *args)

    monkeypatch.setattr(adjoint.KernelDiscreteAdjoint, "forward_lanes", spy)
    w0 = np.linspace(-1.0, 1.0, 20)
    assert w0.size > gradients.ADJOINT_ABOVE

    def loss(w, kernel):
        prob = dxode.ODEProblem(_many, np.array([1.0, 0.0]), (0.0, 3.0), (w,))
        options = {"saveat": [1.0, 3.0], "rtol": 1e-10, "atol": 1e-10, "kernel": kernel}
        return anp.sum(dxode.solve(prob, "tsit5", **options).u ** 2)

    default = autograd.grad(lambda w: loss(w, True))(w0)
    assert calls == [1]
    array = autograd.grad(lambda w: loss(w, False))(w0)
    np.testing.assert_allclose(default, array, rtol=1e-9, atol=1e-14)


def test_what_the_kernel_adjoint_refuses():
    prob = dxode.ODEProblem(damped, np.array([1.0, 0.5]), (0.0, 1.0), (1.6, 0.3))

    def grad(alg, sensealg, **options):
        def loss(u0):
            sol = dxode.solve(prob.remake(u0=u0), alg, sensealg=sensealg, saveat=[1.0], **options)
            return anp.sum(sol.u)

        return autograd.grad(loss)(np.array([1.0, 0.5]))

    with pytest.raises(KernelUnsupportedError, match="DiscreteAdjoint"):
        grad("tsit5", dxode.InterpolatingAdjoint(), kernel=True)
    with pytest.raises(NotImplementedError, match="InterpolatingAdjoint"):
        grad(dxode.Rodas5P(), ADJOINT, kernel=True)


def test_the_traceable_copy_of_a_kernel_style_f():
    from dxode.kernels.adjoint_params import traceable_copy

    def g(x):
        return math.exp(0.5 * x) * np.sin(x) + math.pi

    copy = traceable_copy(g)
    assert copy(0.3) == g(0.3)
    exact = 0.5 * math.exp(0.15) * math.sin(0.3) + math.exp(0.15) * math.cos(0.3)
    np.testing.assert_allclose(autograd.grad(copy)(0.3), exact, rtol=1e-15)


def _mixing(u, p, t):
    return -p[0] * u + 0.1 * np.sum(u)  # per lane: Σ over the state; over columns: over all


def test_an_f_that_mixes_columns_is_not_linearized_in_bulk():
    """The one-VJP parameter pass traces ``f`` over all stages as columns; an ``f`` whose
    values there differ from its per-lane values is left to complex step (checked in
    Python, no compile)."""
    from types import SimpleNamespace

    from dxode.kernels.adjoint_params import autograd_rows

    rng = np.random.default_rng(0)
    ys = rng.normal(size=(6, 2))
    record = {
        "y": ys,
        "t": np.zeros(6),
        "kbar": rng.normal(size=(6, 2)),
        "k": np.stack([_mixing(y, (0.7,), 0.0) for y in ys]),  # per lane, as compiled
        "lane": np.array([0, 0, 0, 1, 1, 1]),
    }
    static = SimpleNamespace(f=_mixing, p_template=(0.7,), lane_leaf=[False], diff_leaf=[True])
    assert autograd_rows(static, [0.7], record, 2) is None
    static.f = lambda u, p, t: -p[0] * u  # elementwise: taken, and exact
    record["k"] = -0.7 * ys
    (bar,) = autograd_rows(static, [0.7], record, 2)
    np.testing.assert_allclose(bar.sum(), np.sum(-ys * record["kbar"]), rtol=1e-14)


@pytest.mark.slow
def test_mixing_f_gets_exact_gradients_by_complex_step():
    def loss(theta, sensealg):
        prob = dxode.ODEProblem(_mixing, theta[:2], (0.0, 2.0), (theta[2],))
        options = {"saveat": [1.0, 2.0], "rtol": 1e-10, "atol": 1e-10, "kernel": True}
        return anp.sum(dxode.solve(prob, "tsit5", sensealg=sensealg, **options).u ** 2)

    theta = np.array([1.0, -0.5, 0.7])
    adjoint = autograd.grad(lambda th: loss(th, ADJOINT))(theta)
    forward = autograd.grad(lambda th: loss(th, FORWARD))(theta)
    np.testing.assert_allclose(adjoint, forward, rtol=1e-10)


def test_forward_sensitivities_beyond_the_kernels_argument_limit_are_refused_clearly():
    """2 states, 20 weights: 42 components, over the 28 a kernel can pass to its RHS (numba
    refuses a call with more than 30 arguments); the error names the adjoint (no compile)."""

    def loss(w):
        prob = dxode.ODEProblem(_many, np.array([1.0, 0.0]), (0.0, 3.0), (w,))
        sol = dxode.solve(prob, "tsit5", saveat=[3.0], kernel=True, sensealg=FORWARD)
        return anp.sum(sol.u**2)

    with pytest.raises(KernelUnsupportedError, match=r"42 components.*DiscreteAdjoint"):
        autograd.grad(loss)(np.linspace(-1.0, 1.0, 20))


def _fall(u, p, t):
    _, v = u
    return [v, -p[0]]


def _bounce(u, p, t, fired):
    return [u[0], -p[1] * u[1]]


def _ground(u, p, t):
    return u[0]


@pytest.mark.slow
def test_ensemble_adjoint_through_event_segments():
    """Bouncing balls: each segment between events is a kernel adjoint solve, the jumps are
    traced; against the kernel's forward sensitivities and the array path."""
    ball = dxode.ContinuousCallback(_ground, _bounce, direction="down")

    def loss(theta, sensealg, alg):
        u0s = np.array([[1.0, 0.0], [1.5, 0.5]]) * theta[0]
        prob = dxode.ODEProblem(_fall, u0s[0], (0.0, 1.2), (9.81, theta[1]))
        options = {"saveat": [0.3, 0.9, 1.2], "rtol": 1e-10, "atol": 1e-10, "callback": ball}
        eprob = dxode.EnsembleProblem(prob, u0=u0s)
        sim = dxode.solve(eprob, "tsit5", alg, trajectories=2, sensealg=sensealg, **options)
        return anp.sum(sim.u[:, :, 0] ** 2)

    theta = np.array([1.0, 0.8])
    kernel = dxode.EnsembleKernel()
    adjoint = autograd.grad(lambda th: loss(th, ADJOINT, kernel))(theta)
    forward = autograd.grad(lambda th: loss(th, FORWARD, kernel))(theta)
    array = autograd.grad(lambda th: loss(th, None, dxode.EnsembleArray()))(theta)
    np.testing.assert_allclose(adjoint, forward, rtol=1e-10)
    np.testing.assert_allclose(adjoint, array, rtol=1e-8)
