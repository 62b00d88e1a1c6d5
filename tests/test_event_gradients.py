"""Gradients through callbacks (the array path): a bouncing ball against its closed form, a
terminating event, dosing at preset times and by a discrete callback, ensembles with
per-lane parameters, float32, and the sensitivity algorithms that can and cannot take them."""

from __future__ import annotations

import math

import numpy as np
import pytest

autograd = pytest.importorskip("autograd")

import autograd.numpy as anp  # noqa: E402

import dxode  # noqa: E402
from dxode import (  # noqa: E402
    BacksolveAdjoint,
    CallbackSet,
    ContinuousCallback,
    DiscreteAdjoint,
    DiscreteCallback,
    EnsembleArray,
    EnsembleProblem,
    EnsembleSerial,
    ForwardSensitivity,
    InterpolatingAdjoint,
    ODEProblem,
    PresetTimeCallback,
)

G = 9.81
TIGHT = {"rtol": 1e-10, "atol": 1e-10}


def ball_height(h0, v0, e, time, g=G):
    """The closed-form height of a ball dropped from ``h0`` with upward speed ``v0``, bouncing
    with restitution ``e``, at ``time`` (written with autograd.numpy: its gradient is the
    exact reference)."""
    speed = anp.sqrt(v0**2 + 2 * g * h0)  # at the first impact
    t = (v0 + speed) / g
    if time < t:
        return h0 + v0 * time - 0.5 * g * time**2
    v = e * speed  # upward, just after the bounce
    while t + 2 * v / g < time:
        t, v = t + 2 * v / g, e * v
    tau = time - t
    return v * tau - 0.5 * g * tau**2


def fall(u, p, t):
    return anp.array([u[1], -p[0]])


def bounce(u, p, t, fired):
    return anp.array([u[0], -p[1] * u[1]])


def ground(u, p, t):
    return u[0]


BALL = ContinuousCallback(ground, bounce, direction="down")


def ball_loss(sensealg=None, T=0.6, dtype=np.float64, **options):
    """The height at ``T`` as a function of ``(h0, v0, e)``."""

    def loss(theta):
        u0 = anp.array([theta[0], theta[1]])
        prob = ODEProblem(
            fall, u0, (0.0, T), np.array([G, 0.0], dtype=dtype) + anp.array([0.0, 1.0]) * theta[2]
        )
        sol = dxode.solve(
            prob, saveat=[0.1, T], callback=BALL, sensealg=sensealg, **(options or TIGHT)
        )
        return sol.u[-1, 0]

    return loss


THETA = np.array([1.0, 0.0, 0.8])


def exact_gradient(theta, T=0.6):
    return autograd.grad(lambda x: ball_height(x[0], x[1], x[2], T))(theta)


@pytest.mark.parametrize(
    "sensealg",
    [
        None,
        ForwardSensitivity(),
        InterpolatingAdjoint(),
        BacksolveAdjoint(),
        DiscreteAdjoint(checkpoint_every=3),
    ],
    ids=repr,
)
def test_bouncing_ball_gradient_matches_the_closed_form(sensealg):
    loss = ball_loss(sensealg)
    assert loss(THETA) == pytest.approx(ball_height(*THETA, 0.6), rel=1e-9)
    np.testing.assert_allclose(autograd.grad(loss)(THETA), exact_gradient(THETA), rtol=1e-7)


def test_bouncing_ball_gradient_matches_central_differences_with_several_bounces():
    T, theta = 2.5, np.array([1.0, 0.5, 0.7])  # three bounces before T
    loss = ball_loss(T=T)
    gradient = autograd.grad(loss)(theta)
    step = 1e-5
    central = [(loss(theta + step * d) - loss(theta - step * d)) / (2 * step) for d in np.eye(3)]
    np.testing.assert_allclose(gradient, central, rtol=1e-5)
    np.testing.assert_allclose(gradient, exact_gradient(theta, T), rtol=1e-7)


def test_gradient_without_the_event_time_term_would_be_wrong():
    """The event time's dependence on h0 matters: holding it fixed changes dy/dh0."""
    T = 0.6
    gradient = autograd.grad(ball_loss(T=T))(THETA)
    h0, _, e = THETA
    t1 = np.sqrt(2 * h0 / G)
    held = e * np.sqrt(2 * G) / (2 * np.sqrt(h0)) * (T - t1)  # t1 fixed
    assert abs(gradient[0] - held) > 0.1


def test_float32_gradient_is_close_to_the_closed_form():
    """float32: the event time and the states carry relative errors of order 1e-6 (float32's
    resolution amplified by the steps), so the gradient agrees to about 1e-3."""

    def loss(theta):
        u0 = anp.array([theta[0], theta[1]])
        p = np.array([G, 0.0], dtype=np.float32) + np.array([0.0, 1.0], dtype=np.float32) * theta[2]
        prob = ODEProblem(fall, u0, (0.0, 0.6), p)
        sol = dxode.solve(prob, saveat=[0.6], callback=BALL, rtol=1e-5, atol=1e-6)
        assert sol.u.dtype == np.float32
        return sol.u[-1, 0]

    gradient = autograd.grad(loss)(THETA.astype(np.float32))
    assert gradient.dtype == np.float32
    np.testing.assert_allclose(gradient, exact_gradient(THETA), rtol=2e-3, atol=2e-4)


def test_terminating_event_time_and_final_state_are_differentiable():
    """Free fall until the ground: t* = sqrt(2 h0 / g), final speed -sqrt(2 g h0)."""
    stop = ContinuousCallback(ground, terminate=True)

    def final(theta):
        prob = ODEProblem(fall, anp.array([theta[0], 0.0]), (0.0, 5.0), anp.array([theta[1], 0.0]))
        sol = dxode.solve(prob, callback=stop, **TIGHT)
        assert sol.retcode == dxode.ReturnCode.Terminated
        return sol.events.t[0] + 10 * sol.u[-1, 1]

    theta = np.array([2.0, G])
    h0, g = theta
    assert final(theta) == pytest.approx(np.sqrt(2 * h0 / g) - 10 * np.sqrt(2 * g * h0), rel=1e-9)
    expected = [
        1 / np.sqrt(2 * g * h0) - 10 * np.sqrt(g / (2 * h0)),
        -np.sqrt(2 * h0) / (2 * g**1.5) - 10 * np.sqrt(h0 / (2 * g)),
    ]
    np.testing.assert_allclose(autograd.grad(final)(theta), expected, rtol=1e-7)


def growth(u, p, t):
    return p[0] * (1.0 + t) + 0.0 * u


def threshold(u, p, t):
    return u[0] - p[1]


def scale_by_time(u, p, t, fired):
    return u * (1.0 + t)


@pytest.mark.parametrize("sensealg", [None, ForwardSensitivity()], ids=repr)
def test_time_dependent_affect_and_rhs(sensealg):
    """``u' = a (1 + t)`` until ``u = c``, then ``u -> u (1 + t*)`` (above ``c``: no more
    events): the jump's ``a_t`` term and ``a_u f⁻ - f⁺`` (nonzero here) both enter; the
    closed form is differentiated exactly."""

    def loss(theta):
        prob = ODEProblem(
            growth, anp.array([theta[0]]), (0.0, 2.0), anp.array([theta[1], theta[2]])
        )
        cb = ContinuousCallback(threshold, scale_by_time, direction="up")
        sol = dxode.solve(prob, saveat=[2.0], callback=cb, sensealg=sensealg, **TIGHT)
        return sol.u[-1, 0] + sol.events.t[0]

    def closed(theta):
        u0, a, c = theta[0], theta[1], theta[2]
        t_star = -1.0 + anp.sqrt(1.0 + 2.0 * (c - u0) / a)
        end = c * (1.0 + t_star) + a * ((2.0 - t_star) + (4.0 - t_star**2) / 2.0)
        return end + t_star

    theta = np.array([0.2, 0.9, 1.0])
    assert loss(theta) == pytest.approx(closed(theta), rel=1e-9)
    np.testing.assert_allclose(autograd.grad(loss)(theta), autograd.grad(closed)(theta), rtol=1e-7)


def decay(u, p, t):
    return -p[0] * u


def dose(u, p, t, fired):
    return u + p[1]


def dosed(u0, k, amount, T, at):
    """``u' = -k u`` with ``amount`` added at time ``at``: ``u(T)``."""
    return (u0 * anp.exp(-k * at) + amount) * anp.exp(-k * (T - at))


def test_preset_time_dose_gradient():
    def loss(theta):
        prob = ODEProblem(decay, anp.array([theta[0]]), (0.0, 3.0), anp.array([theta[1], theta[2]]))
        sol = dxode.solve(
            prob, saveat=[0.5, 3.0], callback=PresetTimeCallback([1.0], dose), **TIGHT
        )
        return sol.u[-1, 0] + sol.u[0, 0]

    theta = np.array([2.0, 0.7, 1.5])
    reference = autograd.grad(
        lambda x: dosed(x[0], x[1], x[2], 3.0, 1.0) + x[0] * anp.exp(-x[1] * 0.5)
    )(theta)
    np.testing.assert_allclose(autograd.grad(loss)(theta), reference, rtol=1e-7)


def test_float32_save_at_a_dose_time_holds_the_state_before_the_dose():
    """A float32 solve keeps its times in float32, so the dose at 0.9 happens at
    float32(0.9) < 0.9, where the save at 0.9 is too: the save holds the state before the
    dose, with and without gradients (it held the one after, its gradient in the dose 1)."""

    def loss(theta, kept):
        prob = ODEProblem(decay, theta[:1], (0.0, 1.5), theta[1:])
        callback = PresetTimeCallback([0.9], dose)
        sol = dxode.solve(prob, saveat=[0.9, 1.5], callback=callback, rtol=1e-6, atol=1e-7)
        kept.append(sol)
        return sol.u[0, 0]

    theta = np.array([1.0, 0.5, 2.0], dtype=np.float32)
    plain, traced = [], []
    before = loss(theta, plain)
    gradient = autograd.grad(lambda x: loss(x, traced))(theta)
    assert autograd.tracer.getval(traced[0].u).dtype == np.float32
    np.testing.assert_array_equal(autograd.tracer.getval(traced[0].u)[0], plain[0].u[0])
    assert before == pytest.approx(np.exp(-0.45), rel=1e-5)
    np.testing.assert_allclose(gradient, [np.exp(-0.45), -0.9 * np.exp(-0.45), 0.0], rtol=1e-5)


def test_float32_lanes_apart_save_at_a_dose_time():
    """Lanes whose events differ end their segments at the save times too; in float32 the
    save at 0.3 and the dose at float32(0.3) > 0.3 made a segment empty in float32, which
    failed every lane (NaN rows and gradient)."""
    passing = ContinuousCallback(lambda u, p, t: u[0] - 0.5)  # in lane 1 only, at t = 0.67
    doses = PresetTimeCallback([0.3], dose)

    def loss(theta):  # (u0, amount, k of lane 0, k of lane 1)
        prob = ODEProblem(decay, theta[:1], (0.0, 1.0), theta[1:3])
        u0 = anp.stack([theta[:1], theta[:1]])
        p = anp.stack([anp.stack([theta[2], theta[1]]), anp.stack([theta[3], theta[1]])])
        sim = dxode.solve(
            EnsembleProblem(prob, u0=u0, p=p),
            callback=CallbackSet(passing, doses),
            saveat=[0.3, 1.0],
            rtol=1e-6,
            atol=1e-7,
        )
        assert sim.events.trajectory.tolist() == [0, 1, 1]
        return anp.sum(sim.u)

    def reference(theta):
        u0, amount, k = theta[0], theta[1], theta[2:]
        return anp.sum(u0 * anp.exp(-0.3 * k) + dosed(u0, k, amount, 1.0, 0.3))

    theta = np.array([1.0, 0.5, 1.0, 2.0])
    gradient = autograd.grad(loss)(theta.astype(np.float32))
    assert gradient.dtype == np.float32
    np.testing.assert_allclose(gradient, autograd.grad(reference)(theta), rtol=1e-4)


@pytest.mark.parametrize("closed_over", ["condition", "affect"])
def test_a_callback_closing_over_a_differentiated_value_is_refused_by_name(closed_over):
    # The event pass runs without gradients, so a value the callback reads from outside
    # (not from p) cannot be followed: it failed inside isfinite, or in the affect's stacking.
    def loss(theta):
        level = theta[1] if closed_over == "condition" else 0.5
        e = theta[1] if closed_over == "affect" else 0.8
        ball = ContinuousCallback(
            lambda u, p, t: u[0] - level, lambda u, p, t, fired: anp.array([u[0], -e * u[1]])
        )
        prob = ODEProblem(fall, anp.array([1.0, 0.0]), (0.0, 0.6), anp.array([theta[0], 0.8]))
        return anp.sum(dxode.solve(prob, saveat=[0.6], callback=ball, **TIGHT).u)

    with pytest.raises(TypeError, match=f"callback 0: {closed_over} returned a value autograd"):
        autograd.grad(loss)(np.array([G, 0.5]))


def _bounce_in_place(u, p, t, fired):
    u[1] = -p[1] * u[1]
    return u


def _bounce_into_a_new_array(u, p, t, fired):
    new = np.empty(u.shape)
    new[0], new[1] = u[0], -p[1] * u[1]
    return new


@pytest.mark.parametrize(
    ("condition", "affect", "message"),
    [
        (ground, lambda u, p, t, fired: np.array([u[0], -p[1] * u[1]]), "affect .*plain `numpy`"),
        (ground, _bounce_in_place, "affect .*changes u in place.*return the new state"),
        (ground, _bounce_into_a_new_array, "affect .*writes a traced value into a NumPy"),
        (lambda u, p, t: np.array(u[0]), bounce, "condition .*plain `numpy`"),
        (lambda u, p, t: math.sin(u[0]), bounce, "condition .*autograd says: must be real"),
    ],
    ids=[
        "np.array affect",
        "in-place affect",
        "affect writing into np.empty",
        "np.array condition",
        "math.sin condition",
    ],
)
@pytest.mark.parametrize("lanes", [False, True], ids=["single", "ensemble"])
def test_a_callback_autograd_cannot_trace_is_refused_by_name(condition, affect, message, lanes):
    if lanes and "must be real" in message:
        pytest.skip("math.sin takes one number: a single problem's condition only")
    # They ran without gradients; differentiated, the affect's object array went on into the
    # next segment and failed there as "row 0 of the right-hand side's result has shape ()",
    # and the in-place affect and math.sin failed with autograd's messages about ArrayBox.
    ball = ContinuousCallback(condition, affect, direction="down")

    def loss(theta):
        rhs = lanes_fall if lanes else fall
        prob = ODEProblem(rhs, anp.array([theta[0], 0.0]), (0.0, 0.6), anp.array([G, theta[1]]))
        ensemble = {"trajectories": 2} if lanes else {}
        if lanes:
            prob = EnsembleProblem(prob)
        sol = dxode.solve(prob, saveat=[0.6], callback=ball, **ensemble, **TIGHT)
        return anp.sum(sol.u)

    assert np.isfinite(loss(np.array([1.0, 0.8])))
    with pytest.raises(TypeError, match=f"callback 0: {message}"):
        autograd.grad(loss)(np.array([1.0, 0.8]))


def test_discrete_callback_gradient_holds_its_firing_time_fixed():
    """A dose when ``t >= 1`` first holds at a step end: the step end ``t_s`` (read from
    ``sol.events``) is held fixed, as DiffEqSensitivity does."""

    def flow(u, p, t):
        return anp.array([-p[0] * u[0], 0.0 * u[1]])

    def give(u, p, t, fired):
        return anp.array([u[0] + p[1], 1.0 + 0.0 * u[1]])

    given = DiscreteCallback(lambda u, p, t: bool(t >= 1.0) and bool(u[1] < 0.5), give)
    fired_at = []

    def loss(theta):
        prob = ODEProblem(
            flow, anp.array([theta[0], 0.0]), (0.0, 3.0), anp.array([theta[1], theta[2]])
        )
        sol = dxode.solve(prob, saveat=[3.0], callback=given, rtol=1e-9, atol=1e-9)
        fired_at.append(float(np.asarray(autograd.tracer.getval(sol.events.t))[0]))
        return sol.u[-1, 0]

    theta = np.array([2.0, 0.7, 1.5])
    gradient = autograd.grad(loss)(theta)
    t_s = fired_at[-1]
    assert t_s > 1.0
    reference = autograd.grad(lambda x: dosed(x[0], x[1], x[2], 3.0, t_s))(theta)
    np.testing.assert_allclose(gradient, reference, rtol=1e-7)


def lanes_fall(u, p, t):
    """``fall`` for lanes: ``u`` is ``(2, L)``, ``p[0]`` a scalar or per lane ``(L,)``."""
    return anp.stack([u[1], -p[0] * anp.ones_like(u[1])])


LANES_BALL = BALL  # per-lane p: p[1] is (L,), and bounce's rows are (L,) each
HEIGHTS, SPEEDS, RESTITUTION = (
    np.array([1.0, 0.4, 1.6]),
    np.array([0.0, 1.0, -0.5]),
    np.array([0.8, 0.6, 0.9]),
)
WEIGHTS = np.array([1.0, 2.0, 3.0])


def ensemble_loss(ensemble_alg, sensealg=None, T=1.2):
    """A weighted sum of the lanes' heights at ``T``; the lanes bounce different numbers of
    times (per-lane u0 and p)."""

    def loss(theta):
        u0 = anp.stack([theta[:3], theta[3:6]], axis=1)
        p = anp.stack([G * anp.ones(3), theta[6:]], axis=1)
        prob = ODEProblem(lanes_fall, np.array([1.0, 0.0]), (0.0, T), np.array([G, 0.5]))
        eprob = EnsembleProblem(prob, u0=u0, p=p)
        sim = dxode.solve(
            eprob,
            dxode.Tsit5(),
            ensemble_alg,
            saveat=[T],
            callback=LANES_BALL,
            sensealg=sensealg,
            **TIGHT,
        )
        return anp.sum(WEIGHTS * sim.u[:, -1, 0])

    return loss


X = np.concatenate([HEIGHTS, SPEEDS, RESTITUTION])


def ensemble_reference(T=1.2):
    def loss(x):
        return sum(w * ball_height(x[i], x[3 + i], x[6 + i], T) for i, w in enumerate(WEIGHTS))

    return autograd.grad(loss)(X)


@pytest.mark.parametrize("ensemble_alg", [EnsembleArray(), EnsembleSerial()], ids=repr)
@pytest.mark.parametrize("sensealg", [None, ForwardSensitivity()], ids=repr)
def test_ensemble_with_per_lane_parameters(ensemble_alg, sensealg):
    gradient = autograd.grad(ensemble_loss(ensemble_alg, sensealg))(X)
    np.testing.assert_allclose(gradient, ensemble_reference(), rtol=1e-7)


def test_continuous_adjoints_refuse_lanes_whose_events_differ():
    with pytest.raises(NotImplementedError, match="ForwardSensitivity"):
        autograd.grad(ensemble_loss(EnsembleArray(), InterpolatingAdjoint()))(X)


def test_ensemble_preset_dose_with_a_continuous_adjoint():
    """Preset times are the same for every lane, so the segments share their spans and the
    interpolating adjoint can run."""

    def lanes_dose(u, p, t, fired):
        return u + p[1]

    def loss(theta):
        prob = ODEProblem(decay, np.array([1.0]), (0.0, 3.0), anp.array([theta[0], theta[1]]))
        eprob = EnsembleProblem(prob, u0=anp.reshape(theta[2:], (-1, 1)))
        sim = dxode.solve(
            eprob,
            saveat=[3.0],
            callback=PresetTimeCallback([1.0, 2.0], lanes_dose),
            sensealg=InterpolatingAdjoint(),
            **TIGHT,
        )
        return anp.sum(sim.u[:, -1, 0] ** 2)

    theta = np.array([0.7, 1.5, 2.0, 3.0])

    def reference(x):
        k, amount = x[0], x[1]
        out = 0.0
        for u0 in (x[2], x[3]):
            u1 = u0 * anp.exp(-k) + amount
            out = out + dosed(u1, k, amount, 2.0, 1.0) ** 2  # from t = 1: dose at 2, end 3
        return out

    np.testing.assert_allclose(
        autograd.grad(loss)(theta), autograd.grad(reference)(theta), rtol=1e-7
    )


def test_terminated_lanes_save_what_the_plain_solve_saves_their_ends_are_events():
    # Without saveat a differentiated ensemble saved each lane's state at its termination,
    # at its own time, where the same solve without gradients saves NaN at the span's end:
    # the loss evaluated was NaN, its gradient a finite number.
    stop = ContinuousCallback(ground, terminate=True)
    prob = ODEProblem(lanes_fall, np.array([1.0, 0.0]), (0.0, 5.0), np.array([G, 0.0]))

    def loss(heights):
        value = autograd.tracer.getval
        u0 = anp.stack([heights, anp.zeros(2)], axis=1)
        sim = dxode.solve(EnsembleProblem(prob, u0=u0), callback=stop, **TIGHT)
        plain = dxode.solve(EnsembleProblem(prob, u0=value(u0)), callback=stop, **TIGHT)
        np.testing.assert_array_equal(value(sim.u), plain.u)  # NaN at t = 5
        np.testing.assert_array_equal(sim.t, plain.t)
        np.testing.assert_allclose(value(sim.events.t), np.sqrt(2 * value(heights) / G))
        return anp.sum(sim.events.u_before[:, 1])  # the speed at impact

    heights = np.array([1.0, 2.0])
    np.testing.assert_allclose(autograd.grad(loss)(heights), -np.sqrt(G / (2 * heights)), rtol=1e-7)


@pytest.mark.slow
def test_dask_ensemble_gradient_matches_the_local_one(client):
    """On a LocalCluster of processes the event pass and every segment's forward and backward
    passes run as keyed tasks, and give the local gradient."""
    distributed = pytest.importorskip("distributed")
    ensemble_alg = dxode.EnsembleDask(client, batch_size=2)
    with distributed.get_task_stream(client=client) as stream:
        gradient = autograd.grad(ensemble_loss(ensemble_alg))(X)
    np.testing.assert_allclose(
        gradient, autograd.grad(ensemble_loss(EnsembleArray()))(X), rtol=1e-12
    )
    np.testing.assert_allclose(gradient, ensemble_reference(), rtol=1e-7)
    keys = [str(task["key"]) for task in stream.data]
    for label in ("events", "forward", "backward"):
        assert any(key.startswith(f"dxode-{label}-") for key in keys), keys


@pytest.mark.parametrize("lanes", [1, 3])
def test_many_save_points_match_the_plain_solve_and_central_differences(lanes):
    """Saves between events (inside the segments of a single problem, ending segments of an
    ensemble whose lanes bounce at different times): values as without gradients, gradient
    as central differences of the plain solve."""
    times = np.linspace(0.05, 2.0, 25)

    def solved(theta):
        u0 = anp.stack([theta[0] * np.linspace(1.0, 1.5, lanes), np.zeros(lanes)], axis=1)
        p = anp.stack([G * np.ones(lanes), theta[1] * np.ones(lanes)], axis=1)
        prob = ODEProblem(lanes_fall, np.array([1.0, 0.0]), (0.0, 2.0), np.array([G, 0.5]))
        sim = dxode.solve(EnsembleProblem(prob, u0=u0, p=p), saveat=times, callback=BALL, **TIGHT)
        return sim.u

    def loss(theta):
        return anp.sum(solved(theta)[..., 0] ** 2)

    theta = np.array([1.0, 0.8])
    np.testing.assert_allclose(
        solved(theta)[:, :, 0],
        [[ball_height(h, 0.0, 0.8, t) for t in times] for h in np.linspace(1.0, 1.5, lanes)],
        rtol=1e-8,
        atol=1e-9,
    )
    step = 1e-6
    central = [(loss(theta + step * d) - loss(theta - step * d)) / (2 * step) for d in np.eye(2)]
    np.testing.assert_allclose(autograd.grad(loss)(theta), central, rtol=1e-6)


def test_other_backends_refuse_event_gradients_clearly():
    xps = pytest.importorskip("array_api_strict")

    def xp_decay(u, p, t):
        return -p[0] * u

    def xp_decay_vjp(u, p, t, v):
        return -p[0] * v, -u * v

    def loss(k):
        prob = ODEProblem(xp_decay, xps.asarray([1.0]), (0.0, 1.0), 1.0, vjp=xp_decay_vjp)
        eprob = EnsembleProblem(prob, p=anp.reshape(k, (-1, 1)))
        cb = PresetTimeCallback([0.5], lambda u, p, t, fired: u + 1.0)
        return anp.sum(dxode.solve(eprob, saveat=[1.0], callback=cb).u)

    with pytest.raises(NotImplementedError, match="through callbacks are computed on NumPy only"):
        autograd.grad(loss)(np.array([0.5, 0.7]))


def test_event_record_of_a_differentiated_ensemble_matches_the_plain_one():
    """``sim.events`` of a differentiated solve: the plain solve's events (same order, times
    and states to the tolerance), with traced values."""
    heights = np.array([1.0, 0.3, 1.7])

    def solved(h):
        prob = ODEProblem(lanes_fall, np.array([1.0, 0.0]), (0.0, 2.0), np.array([G, 0.5]))
        u0 = anp.stack([h, anp.zeros(3)], axis=1)
        return dxode.solve(EnsembleProblem(prob, u0=u0), saveat=[2.0], callback=BALL, **TIGHT)

    plain = solved(heights).events
    traced = []
    autograd.grad(lambda h: (traced.append(solved(h).events), anp.sum(traced[-1].t))[1])(heights)
    events = traced[-1]
    np.testing.assert_array_equal(events.trajectory, plain.trajectory)
    np.testing.assert_array_equal(events.callback, plain.callback)
    for name in ("t", "u_before", "u_after"):
        got = autograd.tracer.getval(getattr(events, name))
        np.testing.assert_allclose(got, getattr(plain, name), rtol=1e-8, atol=1e-9)


def test_a_failing_lane_gets_nan_rows_and_gradient():
    """``u' = k u²`` from 1 blows up at ``t = 1 / k``: the lane with ``k = 1`` fails (out of
    steps) before ``t = 2``; its rows and its gradient are NaN, the other lane's are right."""

    def blow_up(u, p, t):
        return p[0] * u**2

    def loss(rates):
        prob = ODEProblem(blow_up, np.array([1.0]), (0.0, 2.0), 1.0)
        eprob = EnsembleProblem(prob, p=anp.reshape(rates, (-1, 1)))
        bump = PresetTimeCallback([0.1], lambda u, p, t, fired: 1.01 * u)
        sim = dxode.solve(eprob, saveat=[0.2, 2.0], callback=bump, maxiters=300, **TIGHT)
        assert sim.retcodes.tolist()[1] != 0
        assert np.all(np.isnan(autograd.tracer.getval(sim.u)[1]))
        return anp.sum(sim.u[:, 0, 0])

    def first_save(k):  # u(0.1) = 1 / (1 - 0.1 k), bumped, then to t = 0.2
        bumped = 1.01 / (1 - 0.1 * k)
        return bumped / (1 - 0.1 * k * bumped)

    gradient = autograd.grad(loss)(np.array([0.1, 1.0]))
    assert np.isnan(gradient[1])
    np.testing.assert_allclose(gradient[0], autograd.grad(first_save)(0.1), rtol=1e-7)


def test_a_discrete_callback_listed_before_the_continuous_one():
    """A discrete callback listed first (firing at every step end, the bounce's too) applies
    after the bounce, whose event time still counts."""
    every_step = DiscreteCallback(lambda u, p, t: True, lambda u, p, t, fired: 1.0 * u)

    def loss(theta):
        prob = ODEProblem(fall, anp.array([theta[0], 0.0]), (0.0, 0.6), anp.array([G, theta[1]]))
        sol = dxode.solve(prob, saveat=[0.6], callback=[every_step, BALL], **TIGHT)
        return sol.u[-1, 0]

    theta = np.array([1.0, 0.8])
    np.testing.assert_allclose(
        autograd.grad(loss)(theta), exact_gradient(np.array([1.0, 0.0, 0.8]))[[0, 2]], rtol=1e-7
    )


def ramp_at(u, p, t):
    return anp.array([p[1] + 0.0 * u[0]])


def reached(u, p, t):
    return u[0] - p[0]


def test_two_continuous_events_at_one_time_move_it_once():
    """u' = s from 0 reaches c at t* = c / s, where two callbacks with the same condition
    fire at one time (the first records, the second adds 10): the breakpoint moves by dt*/dθ
    once (it was added once per callback)."""
    record = ContinuousCallback(reached, direction="up")
    jump = ContinuousCallback(reached, lambda u, p, t, fired: u + 10.0, direction="up")

    def loss(theta):
        prob = ODEProblem(ramp_at, anp.array([0.0]), (0.0, 1.0), theta)
        sol = dxode.solve(prob, saveat=[0.75], callback=[record, jump])
        assert len(sol.events) == 2
        return sol.u[0, 0] + 3 * sol.events.t[0] + 5 * sol.events.t[1]

    theta = np.array([0.5, 2.0])
    plain = ODEProblem(ramp_at, np.array([0.0]), (0.0, 1.0), theta)
    times = dxode.solve(plain, saveat=[0.75], callback=[record, jump]).events.t
    assert times[0] == times[1]
    c, s = theta
    assert loss(theta) == pytest.approx(0.75 * s + 10 + 8 * c / s, rel=1e-12)
    np.testing.assert_allclose(autograd.grad(loss)(theta), [8 / s, 0.75 - 8 * c / s**2], rtol=1e-9)


def test_one_trajectory_of_a_differentiated_ensemble_keeps_its_traced_events():
    def first_impact(heights):
        prob = ODEProblem(lanes_fall, np.array([1.0, 0.0]), (0.0, 1.0), np.array([G, 0.5]))
        u0 = anp.stack([heights, anp.zeros(2)], axis=1)
        sim = dxode.solve(EnsembleProblem(prob, u0=u0), saveat=[1.0], callback=BALL, **TIGHT)
        return sim[1].events.t[0]

    heights = np.array([1.0, 1.2])
    np.testing.assert_allclose(
        autograd.grad(first_impact)(heights), [0.0, 1 / np.sqrt(2 * G * heights[1])], rtol=1e-7
    )


def kick(u, p, t, fired):
    return [u[0], p[1]]  # the speed is set to a parameter shared by the lanes


@pytest.mark.parametrize("shape", ["ensemble", "matrix"])
def test_an_affect_row_that_is_a_shared_parameter(shape):
    # affect returns a list of rows, one of them the scalar p[1]: it is broadcast to the
    # lanes as f's rows are (before: anp.array of the ragged rows failed with "setting an
    # array element with a sequence"; a plain solve took it). Thrown at t = 0, the speed set
    # to p[1] at t = a: x(T) = x(a) + p[1] (T - a) - g (T - a)^2 / 2.
    a, T = 0.3, 1.0
    u0s = np.array([[0.0, 1.0], [2.0, -3.0]])

    def rows(u, p, t):
        return [u[1], -p[0]]

    def loss(theta):
        callback = PresetTimeCallback([a], kick)
        if shape == "ensemble":
            eprob = EnsembleProblem(ODEProblem(rows, [0.0, 0.0], (0.0, T), theta), u0=u0s)
            sim = dxode.solve(eprob, saveat=[T], callback=callback, **TIGHT)
            return anp.sum(sim.u[:, -1, 0])
        prob = ODEProblem(rows, u0s.T, (0.0, T), theta)
        return anp.sum(dxode.solve(prob, saveat=[T], callback=callback, **TIGHT).u[-1, 0])

    expected = 2 * np.array([-(a**2 + (T - a) ** 2) / 2, T - a])
    np.testing.assert_allclose(autograd.grad(loss)(np.array([G, 2.0])), expected, rtol=1e-9)


@pytest.mark.parametrize("terminate", [False, True], ids=["bounce", "terminate"])
def test_every_step_row_before_an_event_moves_with_it(terminate):
    """Without saveat the output has a row at each event's time holding the state before it.
    Its derivative is the one at the moving event, like the row after it and the plain
    solve's central differences (it was the derivative at the event's time held fixed:
    d(speed)/dh0 = 0 where the impact speed -sqrt(2 g h0) gives -sqrt(g / (2 h0)))."""
    callback = ContinuousCallback(ground, None if terminate else bounce, terminate=terminate)

    def rows(h0):
        prob = ODEProblem(fall, anp.array([h0, 0.0]), (0.0, 0.6), np.array([G, 0.8]))
        sol = dxode.solve(prob, callback=callback, **TIGHT)
        (hit,) = np.nonzero(sol.t == autograd.tracer.getval(sol.events.t[0]))
        return sol.u[hit[0]]  # the state before the impact

    h0 = 1.0
    speed = -np.sqrt(2 * G * h0)
    np.testing.assert_allclose(rows(h0), [0.0, speed], atol=1e-9)
    np.testing.assert_allclose(
        autograd.jacobian(rows)(h0), [0.0, -np.sqrt(G / (2 * h0))], rtol=1e-7, atol=1e-9
    )
