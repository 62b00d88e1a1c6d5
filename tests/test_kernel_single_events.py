"""Gradients of a single ``solve(kernel=True)`` through callbacks: event to event, each segment
through the kernel's forward sensitivities or its discrete adjoint, each event's jump traced.

A bouncing ball in free fall (which Tsit5 integrates exactly, so only the event location and
the tolerances limit the error) against its closed form, against the array path's gradients
(the same event segments through autograd) and central differences of the kernel solve.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("numba")
autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")

import dxode  # noqa: E402
from dxode.kernels.errors import KernelUnsupportedError  # noqa: E402

ADJOINT = dxode.DiscreteAdjoint()
FORWARD = dxode.ForwardSensitivity()
TOL = {"rtol": 1e-10, "atol": 1e-10}
G = 9.81


def _fall(u, p, t):
    _, v = u
    return [v, -p[0]]


def _ground(u, p, t):
    return u[0]


def _bounce(u, p, t, fired):
    return [u[0], -p[1] * u[1]]


def _kick(u, p, t, fired):
    return [u[0], u[1] - p[2]]


def _at_one(u, p, t):
    return t == 1.0


def _halve(u, p, t, fired):
    return [u[0], 0.5 * u[1] + p[2]]


BALL = dxode.ContinuousCallback(_ground, _bounce, direction="down")
# A bounce, a kick down at a preset time, and a discrete callback pinned by tstops=[1.0].
MIXED = dxode.CallbackSet(
    BALL, dxode.PresetTimeCallback([0.3], _kick), dxode.DiscreteCallback(_at_one, _halve)
)


def _problem(theta, t1):
    """Dropped from ``theta[0]`` at rest; ``p = (g, restitution theta[1], kick theta[2])``."""
    u0 = anp.array([theta[0], 0.0])
    return dxode.ODEProblem(_fall, u0, (0.0, t1), anp.array([G, theta[1], theta[2]]))


def _after_first_bounce(theta, sensealg):
    """The state at ``T = 0.6`` (after the first bounce, before the second) and the event times
    (the kick at 0.3, the bounce); the discrete callback does not fire before 1.0."""
    sol = dxode.solve(
        _problem(theta, 0.6),
        "tsit5",
        saveat=[0.6],
        callback=MIXED,
        kernel=True,
        sensealg=sensealg,
        **TOL,
    )
    assert list(sol.events.callback) == [1, 0]
    return anp.concatenate([sol.u[-1], sol.events.t])


def _closed_form(h0, e, T=0.6, t_kick=0.3):
    """d(x(T), v(T), t_kick, t*)/d(h0, e, k) at kick ``k = 0``: the ball lands at
    ``t* = sqrt(2 h0 / g)`` with speed ``w = g t* + k`` and leaves at ``e w``, so
    ``x(T) = e w s - g s^2 / 2`` and ``v(T) = e w - g s`` with ``s = T - t*``. A kick at
    ``t_kick`` moves the landing by ``dt*/dk = -(t* - t_kick) / w`` (the implicit function
    theorem on ``x(t*) = 0`` with ``dx/dk = -(t - t_kick)``, ``dx/dt = -w``)."""
    t_star = math.sqrt(2 * h0 / G)
    w, s = G * t_star, T - t_star
    dt_dk = -(t_star - t_kick) / w
    columns = []
    for dt, dw in ((1 / w, G / w), (dt_dk, G * dt_dk + 1)):  # h0, then k
        columns.append([e * dw * s - (e * w - G * s) * dt, e * dw + G * dt, 0.0, dt])
    h0_column, k_column = columns
    e_column = [w * s, w, 0.0, 0.0]
    return np.array([h0_column, e_column, k_column]).T


@pytest.mark.slow
@pytest.mark.parametrize("sensealg", [FORWARD, ADJOINT], ids=["forward", "adjoint"])
def test_bouncing_ball_gradient_is_the_closed_form(sensealg):
    theta = np.array([1.0, 0.8, 0.0])
    jac = autograd.jacobian(lambda th: _after_first_bounce(th, sensealg))(theta)
    np.testing.assert_allclose(jac, _closed_form(1.0, 0.8), rtol=1e-8, atol=1e-10)


def _mixed_loss(theta, kernel, sensealg=None, solutions=None):
    """States at the save times, and the events' times and states after them."""
    sol = dxode.solve(
        _problem(theta, 1.4),
        "tsit5",
        saveat=[0.2, 0.5, 0.8, 1.1, 1.4],
        tstops=[1.0],
        callback=MIXED,
        kernel=kernel,
        sensealg=sensealg,
        **TOL,
    )
    if solutions is not None:
        solutions.append(sol)
    events = sol.events
    # The kick, a bounce, the pinned discrete event, a second bounce.
    assert list(events.callback) == [1, 0, 2, 0]
    return anp.sum(sol.u[:, 0] ** 2) + anp.sum(events.t) + anp.sum(events.u_after[:, 1])


THETA = np.array([1.0, 0.8, 0.5])  # drop height, restitution, kick


def _central_differences(func, x, eps=1e-6):
    return np.array([(func(x + eps * e) - func(x - eps * e)) / (2 * eps) for e in np.eye(x.size)])


@pytest.mark.slow
def test_mixed_callbacks_match_the_array_path_and_central_differences():
    from autograd.tracer import getval

    traced = []
    forward = autograd.grad(lambda th: _mixed_loss(th, True, FORWARD, traced))(THETA)
    adjoint = autograd.grad(lambda th: _mixed_loss(th, True, ADJOINT, traced))(THETA)
    array = autograd.grad(lambda th: _mixed_loss(th, False))(THETA)
    differences = _central_differences(lambda th: _mixed_loss(th, True), THETA)
    np.testing.assert_allclose(forward, array, rtol=1e-9)
    np.testing.assert_allclose(adjoint, forward, rtol=1e-10)
    np.testing.assert_allclose(forward, differences, rtol=1e-6)
    # The event pass is the plain kernel solve: the same events, bit for bit.
    plain = []
    _mixed_loss(THETA, True, solutions=plain)
    for sol in traced:
        np.testing.assert_array_equal(getval(sol.events.t), plain[0].events.t)
        np.testing.assert_allclose(getval(sol.u), plain[0].u, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("terminate", [False, True])
def test_without_saveat_the_kernel_saves_the_array_paths_rows_and_derivatives(terminate):
    """Every step and each event's after-state, as on the array path (a terminating bounce
    ends the solve at the moving event); the final row, the state after the last event, is
    differentiated. (Each path saves its own steps: Tsit5 integrates the fall exactly, so the
    error estimates are rounding noise, and the two paths' step sizes differ; see
    test_kernel_events.)"""
    from autograd.tracer import getval

    stop = dxode.ContinuousCallback(_ground, _bounce, direction="down", terminate=True)
    callback = stop if terminate else MIXED
    solutions = {}

    def final(theta, kernel):
        sol = dxode.solve(_problem(theta, 0.6), "tsit5", callback=callback, kernel=kernel, **TOL)
        solutions[kernel] = sol
        return sol.u[-1]

    kernel = autograd.jacobian(lambda th: final(th, True))(THETA)
    array = autograd.jacobian(lambda th: final(th, False))(THETA)
    np.testing.assert_allclose(kernel, array, rtol=1e-9, atol=1e-12)
    end = math.sqrt(2 * THETA[0] / G) if terminate else 0.6
    for sol in solutions.values():
        assert sol.t[0] == 0.0 and sol.t[-1] == pytest.approx(end, rel=1e-10)
        assert sol.retcode == (
            dxode.ReturnCode.Terminated if terminate else dxode.ReturnCode.Success
        )
    np.testing.assert_allclose(
        getval(solutions[True].u[-1]), getval(solutions[False].u[-1]), rtol=1e-9, atol=1e-12
    )
    if terminate:  # at the bounce x = 0 and v = e sqrt(2 g h0): dv/de = sqrt(2 g h0)
        np.testing.assert_allclose(kernel[:, 1], [0.0, math.sqrt(2 * G * THETA[0])], atol=1e-8)


def test_callbacks_with_a_stiff_method_are_refused_naming_the_array_path():
    def loss(theta):
        sol = dxode.solve(_problem(theta, 0.6), "rodas5p", callback=BALL, kernel=True)
        return anp.sum(sol.u)

    with pytest.raises(KernelUnsupportedError, match=r"explicit Runge–Kutta.*kernel=False"):
        autograd.grad(loss)(THETA)


def test_a_preset_time_outside_the_span_is_refused_before_differentiating():
    late = dxode.PresetTimeCallback([2.0], _kick)

    def loss(theta):
        sol = dxode.solve(_problem(theta, 0.6), "tsit5", callback=late, kernel=True)
        return anp.sum(sol.u)

    with pytest.raises(ValueError, match=r"time 2.0 is outside the time span"):
        autograd.grad(loss)(THETA)


@pytest.mark.parametrize("kernel", [False, True], ids=["array", "kernel"])
def test_without_saveat_a_differentiated_solve_saves_what_the_plain_one_saves(kernel):
    # The plain solve saves every step and each event's after-state; the differentiated one
    # must save the same rows (value_and_grad's value is the plain loss), differentiated with
    # those times held fixed: the gradient of the same rows saved at the plain step times
    # plus the events' after-states.
    from autograd.tracer import getval

    options = {"callback": MIXED, "tstops": [1.0], "kernel": kernel, **TOL}
    theta = np.array([1.0, 0.8, 0.5])
    plain = dxode.solve(_problem(theta, 1.5), "tsit5", **options)
    seen = []

    def loss(theta):
        sol = dxode.solve(_problem(theta, 1.5), "tsit5", **options)
        seen.append(sol)
        return anp.sum(sol.u**2)

    value, grad = autograd.value_and_grad(loss)(theta)
    steps = np.unique(plain.t)
    assert len(plain.events) == 4 and plain.t.shape == (steps.size + 4,)
    np.testing.assert_array_equal(seen[0].t, plain.t)
    np.testing.assert_allclose(getval(seen[0].u), plain.u, rtol=1e-9, atol=1e-12)
    assert value == pytest.approx(np.sum(plain.u**2), rel=1e-12)

    def reference(theta):
        sol = dxode.solve(_problem(theta, 1.5), "tsit5", saveat=steps, **options)
        return anp.sum(sol.u**2) + anp.sum(sol.events.u_after**2)

    np.testing.assert_allclose(grad, autograd.grad(reference)(theta), rtol=1e-12)


def _cosine(u, p, t):
    return [math.cos(t) + 0.0 * u[0]]


def _reached(u, p, t):
    return u[0] - p[0]


def _kick(u, p, t, fired):
    return [u[0] + 0.5]


@pytest.mark.parametrize("stop", [1.0, 0.7, 1.3])
def test_an_event_ulps_from_a_stop_keeps_the_step_size_as_on_the_array_path(stop):
    # u = sin t crosses sin(stop) within ~1e-8 of the tstop at stop; the lane then stepped by
    # that sliver and the controller grew its steps back from it (the kernel took 50 steps
    # where the array path, which keeps the proposal after a sliver, takes 33)
    prob = dxode.ODEProblem(_cosine, np.array([0.0]), (0.0, 3.0), (math.sin(stop),))
    kick = dxode.ContinuousCallback(_reached, _kick)
    tol = {"rtol": 1e-8, "atol": 1e-8}
    kernel = dxode.solve(prob, dxode.Tsit5(), kernel=True, callback=kick, tstops=[stop], **tol)
    array = dxode.solve(prob, dxode.Tsit5(), callback=kick, tstops=[stop], **tol)
    free = dxode.solve(prob, dxode.Tsit5(), kernel=True, callback=kick, **tol)
    assert abs(free.events.t[0] - stop) < 1e-7  # the root is a sliver away from the stop
    # landing on the stop costs a few steps (34 against 28 at stop = 1.3); growing the step
    # back from a sliver cost about twenty
    assert kernel.stats.naccept == array.stats.naccept < free.stats.naccept + 10
    np.testing.assert_allclose(kernel.u[-1], array.u[-1], rtol=1e-7)
