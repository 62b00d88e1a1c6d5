"""Callbacks and events: located per lane, applied per lane, recorded, batch-independent."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dxode

from conftest import to_numpy

G, E, H0 = 9.81, 0.8, 1.0


# Module-level functions (so they pickle for Dask).
def fall(u, p, t):
    return [u[1], -G + 0.0 * u[0]]


def height(u, p, t):
    return u[0, ...]


def bounce(u, p, t, fired):
    return [u[0], -E * u[1]]


def growth(u, p, t):
    return p[0, ...] * u


def above_two(u, p, t):
    return u[0, ...] - 2.0


def decay(u, p, t):
    return -p[0] * u


def dose(u, p, t, fired):
    return u + 1.0


def impact_times(n: int) -> np.ndarray:
    """Closed form: first impact at sqrt(2 h0 / g); each later flight is e times the last."""
    first = math.sqrt(2 * H0 / G)
    times = [first]
    for k in range(1, n):
        times.append(times[-1] + 2 * E**k * first)
    return np.array(times)


def ball(xp, dtype=None, t1=3.0):
    dtype = xp.float64 if dtype is None else dtype
    return dxode.ODEProblem(fall, xp.asarray([H0, 0.0], dtype=dtype), (0.0, t1))


# ---- continuous events ----------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["down", "both"])
def test_bouncing_ball_event_times_match_closed_form(xp, direction):
    cb = dxode.ContinuousCallback(height, bounce, direction=direction)
    sol = dxode.solve(ball(xp), dxode.Tsit5(), callback=cb, rtol=1e-10, atol=1e-12)
    expected = impact_times(12)
    expected = expected[expected < 3.0]
    ev = sol.events
    assert len(ev) == len(expected)
    np.testing.assert_allclose(to_numpy(ev.t), expected, rtol=0, atol=1e-10)
    assert np.all(ev.callback == 0) and np.all(ev.trajectory == 0)
    before, after = to_numpy(ev.u_before), to_numpy(ev.u_after)
    np.testing.assert_allclose(before[:, 0], 0.0, atol=1e-9)  # on the floor, falling
    v_impact = -G * math.sqrt(2 * H0 / G) * E ** np.arange(len(expected))
    np.testing.assert_allclose(before[:, 1], v_impact, rtol=1e-9)
    np.testing.assert_allclose(after[:, 1], -E * before[:, 1], rtol=1e-12)
    assert sol.retcode == dxode.ReturnCode.Success
    # The ball never goes through the floor (dense output between events).
    grid = np.linspace(0.0, 3.0, 601)
    assert np.all(to_numpy(sol(xp.asarray(grid)))[:, 0] > -1e-9)


def test_every_step_output_has_both_sides_of_each_event(xp):
    cb = dxode.ContinuousCallback(height, bounce, direction="down")
    sol = dxode.solve(ball(xp, t1=1.0), dxode.Tsit5(), callback=cb, rtol=1e-8)
    t, u = to_numpy(sol.t), to_numpy(sol.u)
    t_ev = to_numpy(sol.events.t)[0]
    (at,) = np.nonzero(t == t_ev)
    assert len(at) == 2  # the state before and the state after, in that order
    assert u[at[0], 1] < 0 < u[at[1], 1]
    assert np.all(np.diff(t) >= 0)


def test_save_positions_off_keeps_nan_and_no_extra_point():
    cb = dxode.ContinuousCallback(height, bounce, direction="down", save_positions=(False, False))
    sol = dxode.solve(ball(np, t1=1.0), dxode.Tsit5(), callback=cb)
    assert len(sol.events) == 1 and np.all(np.isnan(sol.events.u_before))
    assert np.all(np.isnan(sol.events.u_after))
    assert len(np.unique(sol.t)) == len(sol.t)


def test_float32_bouncing_ball(xp):
    cb = dxode.ContinuousCallback(height, bounce, direction="down")
    sol = dxode.solve(ball(xp, xp.float32), dxode.Tsit5(), callback=cb, rtol=1e-5, atol=1e-6)
    expected = impact_times(12)
    expected = expected[expected < 3.0]
    assert sol.events.t.dtype == xp.float32 and sol.u.dtype == xp.float32
    assert len(sol.events) == len(expected)
    # Each bounce starts from a state rounded to float32 (eps 1.2e-7): errors add up.
    np.testing.assert_allclose(to_numpy(sol.events.t), expected, rtol=0, atol=5e-5)


def ramp(u, p, t):
    return 0.0 * u + 1.0


def sine_of_time(u, p, t):
    return np.sin(2 * np.pi * t / 0.1)


def test_many_events_in_one_step_are_all_found():
    """u' = 1 takes huge steps; the condition crosses zero every 0.05 time units, many times
    per step, and each step is sampled finely enough to see every crossing."""
    cb = dxode.ContinuousCallback(sine_of_time, interp_points=60)
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 1.02))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb)
    assert sol.stats.naccept - len(sol.events) < 10  # only a handful of steps of its own
    np.testing.assert_allclose(sol.events.t, 0.05 * np.arange(1, 21), rtol=0, atol=1e-12)


def sink(u, p, t):
    return 0.0 * u - 1.0


def level(u, p, t):
    return u[0]


def lift(u, p, t, fired):
    return u + 0.05


def test_a_crossing_right_after_an_affect_is_found():
    """u' = -1 crosses zero at t = 1; each event lifts u by 0.05, which reaches zero again
    0.05 later. The steps are long (u is linear): the next crossing comes before the first
    sample of the step after the event, and must not be mistaken for the lane sitting on
    the old crossing (the affect moved it off)."""
    cb = dxode.ContinuousCallback(level, lift, direction="down")
    prob = dxode.ODEProblem(sink, np.array([1.0]), (0.0, 1.975))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb, saveat=[1.975])
    np.testing.assert_allclose(sol.events.t, 1.0 + 0.05 * np.arange(20), rtol=0, atol=1e-12)
    np.testing.assert_allclose(sol.u[-1], [0.025], atol=1e-12)


def near_zero(u, p, t):
    return abs(u[0]) < 1e-9


def jump_up(u, p, t, fired):
    return u + 1.0


def test_the_continuous_event_applies_before_a_discrete_one_listed_first():
    """At t = 1 the lift applies first (u = 0.05), so the discrete check, listed before it,
    sees u = 0.05 and does not fire; it would fire on the state before the lift."""
    cbs = dxode.CallbackSet(
        dxode.DiscreteCallback(near_zero, jump_up),
        dxode.ContinuousCallback(level, lift, direction="down"),
    )
    prob = dxode.ODEProblem(sink, np.array([1.0]), (0.0, 1.975))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cbs, saveat=[1.975])
    assert np.all(sol.events.callback == 1) and len(sol.events) == 20
    np.testing.assert_allclose(sol.u[-1], [0.025], atol=1e-12)


def half_time(u, p, t):
    return t - 0.5


def add_ten(u, p, t, fired):
    return u + 10.0


def test_a_condition_zero_over_an_interval_fires_where_it_first_reaches_zero():
    """The condition rises to zero at t = 0.2, stays zero until 0.4 and then goes positive. The
    event is where it first reaches zero; the root finder used to stop at whichever zero an
    iterate hit (t = 0.2017 on the falling ball, anywhere in [0.2, 0.4] in general)."""

    def flat(u, p, t):
        return np.where(t < 0.2, t - 0.2, np.where(t > 0.4, t - 0.4, 0.0)) + 0.0 * u[0]

    for alg in (dxode.Tsit5(), dxode.Vern7(), dxode.Rodas5P()):
        stop = dxode.ContinuousCallback(flat, terminate=True)
        sol = dxode.solve(dxode.ODEProblem(fall, [H0, 0.0], (0.0, 1.0)), alg, callback=stop)
        assert sol.retcode == dxode.ReturnCode.Terminated
        assert abs(float(sol.events.t[0]) - 0.2) < 1e-12, (alg, sol.events.t)


def test_two_callbacks_crossing_at_the_same_time_both_fire():
    """Both conditions are exactly zero at the event: the first listed fires, and the second
    (its condition zero after the affect, so no sign to cross from) right after it, at the
    same time; it was never fired."""
    cbs = dxode.CallbackSet(
        dxode.ContinuousCallback(half_time, dose), dxode.ContinuousCallback(half_time, add_ten)
    )
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 1.0))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cbs, saveat=[1.0])
    np.testing.assert_array_equal(sol.events.callback, [0, 1])
    np.testing.assert_array_equal(sol.events.t, [0.5, 0.5])
    np.testing.assert_allclose(sol.u[-1], [12.0], rtol=1e-12)


@pytest.mark.parametrize("direction, first", [("up", 0.1), ("down", 0.05)])
def test_direction_selects_crossings(direction, first):
    cb = dxode.ContinuousCallback(sine_of_time, direction=direction)
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 0.32))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb)
    np.testing.assert_allclose(sol.events.t, first + 0.1 * np.arange(3), atol=1e-12)


def test_event_at_tspan_end_and_just_before_it():
    def at(c):  # u' = 1 from 0: crosses zero at t = c (exactly zero at the end for c = 1)
        return lambda u, p, t: t - c

    for c in (1.0, 1.0 - 1e-9):
        cb = dxode.ContinuousCallback(at(c), lambda u, p, t, fired: u + 10.0)
        sol = dxode.solve(
            dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 1.0)), dxode.Tsit5(), callback=cb
        )
        assert sol.retcode == dxode.ReturnCode.Success
        np.testing.assert_allclose(sol.events.t, [c], atol=1e-14)
        np.testing.assert_allclose(sol.u[-1], [11.0], atol=1e-12)
        assert float(sol.t[-1]) == 1.0


@pytest.mark.parametrize(
    "cb, end, after",
    [
        (dxode.ContinuousCallback(half_time, add_ten, terminate=True), 0.5, 10.5),
        (dxode.PresetTimeCallback([0.5, 1.0], add_ten), 1.0, 21.0),
    ],
    ids=["terminated", "preset at t1"],
)
def test_dense_output_at_an_event_at_the_end_is_the_state_after_it(cb, end, after):
    """u' = 1 from 0, 10 added at 0.5 (and 1): sol(t) at an event time is the state after
    the event, at the span's end too (it was the last step's end, the state before it)."""
    sol = dxode.solve(dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 1.0)), "tsit5", callback=cb)
    assert float(sol.t[-1]) == end
    np.testing.assert_array_equal(sol(end), sol.u[-1])
    np.testing.assert_allclose(sol(np.array([0.5, end]))[:, 0], [10.5, after], rtol=1e-12)


def test_ensemble_dense_output_at_a_terminating_event_is_the_state_after_it():
    cb = dxode.ContinuousCallback(half_time, add_ten, terminate=True)
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 1.0))
    sim = dxode.solve(
        dxode.EnsembleProblem(prob, u0=np.array([[0.0], [1.0]])), "tsit5", callback=cb, dense=True
    )
    for i in range(2):
        np.testing.assert_allclose(sim[i](0.5), [10.5 + i], rtol=1e-12)
        np.testing.assert_array_equal(sim[i](0.5), sim[i].events.u_after[0])


def below_half(u, p, t):
    return u[0, ...] - 0.5


def double(u, p, t, fired):
    return 2.0 * u


@pytest.mark.parametrize("alg", ["rodas4", "rodas5p", "trbdf2", "tsit5"])
@pytest.mark.parametrize("terminate", [True, False], ids=["terminated", "continued"])
@pytest.mark.parametrize("ensemble", [False, True], ids=["single", "ensemble"])
def test_dense_output_inside_a_step_an_event_cut_short(alg, terminate, ensemble):
    """u' = -u from 1 crosses 0.5 at ln 2 (where it stops, or doubles). The step an event cuts
    short keeps its own interpolant: Rosenbrock and TRBDF2 interpolants pass through the
    step's end, which was recorded as the state at the event, so sol(t) inside that step
    was off by 1e-3 at rtol=1e-6."""
    if terminate:
        cb = dxode.ContinuousCallback(below_half, terminate=True)
    else:
        cb = dxode.ContinuousCallback(below_half, double, direction="down")
    prob = dxode.ODEProblem(decay, np.array([1.0]), (0.0, 1.0), np.array([1.0]))
    kwargs = {"callback": cb, "rtol": 1e-6, "atol": 1e-9}
    if ensemble:
        eprob = dxode.EnsembleProblem(prob, u0=np.array([[1.0], [1.0]]))
        sol = dxode.solve(eprob, alg, dense=True, **kwargs)[1]
    else:
        sol = dxode.solve(prob, alg, **kwargs)
    end = float(sol.events.t[0]) if terminate else 1.0  # an ensemble saves NaN after it
    t = np.linspace(0.0, end, 200)
    t = t[np.abs(t - math.log(2)) > 1e-3]  # not at the event, where both states are right
    exact = np.where(t < math.log(2), np.exp(-t), np.exp(math.log(2) - t))
    np.testing.assert_allclose(sol(t)[:, 0], exact, rtol=0, atol=5e-5)


@pytest.mark.parametrize("alg", ["rodas4", "tsit5"])
def test_every_step_output_through_events_does_not_depend_on_dense_output(alg):
    # Dense output records each step's own end; every-step output the state at the event.
    cb = dxode.ContinuousCallback(below_half, double, direction="down")
    prob = dxode.ODEProblem(decay, np.array([1.0]), (0.0, 2.0), np.array([1.0]))
    dense, states = (dxode.solve(prob, alg, callback=cb, dense=d) for d in (True, False))
    np.testing.assert_array_equal(dense.t, states.t)
    np.testing.assert_array_equal(dense.u, states.u)
    before = dense.u[np.isin(dense.t, dense.events.t)][::2]
    np.testing.assert_array_equal(before, dense.events.u_before)


def test_saveat_points_around_an_event():
    """Saves just before, at and just after the first impact: before-values, then after."""
    t_hit = impact_times(1)[0]
    saveat = [0.0, t_hit - 1e-6, t_hit + 1e-6, 0.6]
    cb = dxode.ContinuousCallback(height, bounce, direction="down")
    sol = dxode.solve(ball(np), dxode.Tsit5(), callback=cb, saveat=saveat, rtol=1e-10, atol=1e-12)
    v_hit = -G * t_hit
    np.testing.assert_allclose(sol.u[1, 1], v_hit + G * 1e-6, rtol=1e-8)  # still falling
    np.testing.assert_allclose(sol.u[2, 1], -E * v_hit - G * 1e-6, rtol=1e-8)  # rebounded
    # Closed form after the bounce at 0.6.
    s = 0.6 - t_hit
    np.testing.assert_allclose(sol.u[3], [-E * v_hit * s - G * s**2 / 2, -E * v_hit - G * s])


def test_terminating_continuous_callback_single():
    cb = dxode.ContinuousCallback(above_two, terminate=True)
    prob = dxode.ODEProblem(growth, np.array([1.0]), (0.0, 5.0), np.array([1.0]))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb, rtol=1e-10, atol=1e-12)
    assert sol.retcode == dxode.ReturnCode.Terminated and sol.success
    np.testing.assert_allclose(sol.t[-1], math.log(2), rtol=1e-10)
    np.testing.assert_allclose(sol.u[-1], [2.0], rtol=1e-9)
    saved = dxode.solve(prob, dxode.Tsit5(), callback=cb, saveat=1.0)
    assert np.all(np.isnan(saved.u[1:]))  # save points never reached, as for failures
    np.testing.assert_allclose(saved.u[0], [1.0])


# ---- discrete and preset-time callbacks -----------------------------------------------------


def past_one(u, p, t):
    return u[0] > 1.0


def reset(u, p, t, fired):
    return u - 1.0


def test_discrete_callback_checked_after_each_step():
    cb = dxode.DiscreteCallback(past_one, reset)
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 3.0))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb, dtmax=0.3, saveat=3.0)
    ev = sol.events
    assert len(ev) == 2
    np.testing.assert_allclose(ev.u_after, ev.u_before - 1.0)
    assert np.all(ev.u_before[:, 0] > 1.0)
    np.testing.assert_allclose(sol.u[-1], [3.0 - 2.0])  # u' = 1 exactly: two resets


def test_dosing_at_preset_times(xp):
    k, dose_times = 0.7, [1.0, 2.0, 2.5]
    cb = dxode.PresetTimeCallback(dose_times, dose)
    prob = dxode.ODEProblem(decay, xp.asarray([1.0], dtype=xp.float64), (0.0, 4.0), [k])
    saveat = np.linspace(0.0, 4.0, 17)
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb, saveat=saveat, rtol=1e-10, atol=1e-12)

    def exact(t):  # each dose adds 1 and decays from then on
        total = np.exp(-k * t)
        for td in dose_times:
            total = total + np.where(t > td, np.exp(-k * (t - td)), 0.0)
        return total

    np.testing.assert_allclose(to_numpy(sol.u)[:, 0], exact(saveat), rtol=1e-9)
    ev = sol.events
    assert to_numpy(ev.t).tolist() == dose_times  # hit exactly
    np.testing.assert_allclose(to_numpy(ev.u_after) - to_numpy(ev.u_before), 1.0)


def test_preset_time_at_t0_and_outside_span():
    prob = dxode.ODEProblem(decay, np.array([1.0]), (0.0, 1.0), [0.0])
    outside = dxode.PresetTimeCallback([-1.0, 0.0, 9.0], dose)
    with pytest.raises(ValueError, match=r"time -1\.0 is outside the time span"):
        dxode.solve(prob, dxode.Tsit5(), callback=outside)
    cb = dxode.PresetTimeCallback([0.0], dose)
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb, saveat=[0.0, 1.0])
    np.testing.assert_allclose(sol.events.t, [0.0])
    np.testing.assert_allclose(sol.u, [[1.0], [2.0]])  # the save at t0 is before the dose


def never(u, p, t):
    return u[0] < -1.0


def test_callback_set_order_and_indices():
    cbs = dxode.CallbackSet(
        dxode.PresetTimeCallback([0.5], dose),
        dxode.CallbackSet(dxode.DiscreteCallback(never, reset)),
        dxode.ContinuousCallback(above_two, reset),
    )
    assert len(cbs) == 3
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 2.5))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cbs)
    # +1 at 0.5 (callback 0) makes u = t + 1 cross 2 at t = 1 (callback 2), reset to 1; then
    # u = t crosses 2 again at t = 2 (callback 2). Not at the span's end: whether u reaches
    # exactly 2 there depends on the last bits of the located t = 1 (a root at the end:
    # test_event_at_tspan_end_and_just_before_it).
    assert sol.events.callback.tolist() == [0, 2, 2]
    np.testing.assert_allclose(sol.events.t, [0.5, 1.0, 2.0], atol=1e-12)
    np.testing.assert_allclose(sol.u[-1], [1.5], atol=1e-12)


def test_terminate_function_ends_only_where_true():
    def stop_if_large(u, p, t):
        return u[0] > 1.5

    cb = dxode.PresetTimeCallback([1.0, 2.0], dose, terminate=stop_if_large)
    prob = dxode.ODEProblem(decay, np.array([1.0]), (0.0, 3.0), [0.1])
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb)
    assert sol.retcode == dxode.ReturnCode.Terminated
    assert float(sol.t[-1]) == 1.0


# ---- ensembles: per-lane events, batch independence ----------------------------------------


def ball_ensemble(n: int):
    heights = np.linspace(0.5, 2.0, n)
    u0 = np.stack([heights, np.zeros(n)], axis=1)
    return dxode.EnsembleProblem(ball(np), u0=u0), heights


def test_termination_in_some_lanes_only():
    rates = np.linspace(0.1, 2.0, 9)
    prob = dxode.ODEProblem(growth, np.array([1.0]), (0.0, 1.0), np.array([1.0]))
    eprob = dxode.EnsembleProblem(prob, p=rates[:, None])
    cb = dxode.ContinuousCallback(above_two, terminate=True)
    sim = dxode.solve(
        eprob, dxode.Tsit5(), trajectories=9, callback=cb, saveat=1.0, rtol=1e-10, atol=1e-12
    )
    stops = rates > math.log(2)
    expected = np.where(stops, dxode.ReturnCode.Terminated, dxode.ReturnCode.Success)
    assert sim.retcodes.tolist() == expected.tolist()
    assert sim.events.trajectory.tolist() == np.nonzero(stops)[0].tolist()
    np.testing.assert_allclose(sim.events.t, math.log(2) / rates[stops], rtol=1e-9)
    # The others ran to the end: closed form at t = 1.
    np.testing.assert_allclose(sim.u[~stops, -1, 0], np.exp(rates[~stops]), rtol=1e-8)
    assert sim.success
    assert len(sim[int(np.nonzero(stops)[0][0])].events) == 1 and len(sim[0].events) == 0


def _same(a, b):
    for name in ("t", "u_before", "u_after"):
        np.testing.assert_array_equal(to_numpy(getattr(a, name)), to_numpy(getattr(b, name)))
    assert a.callback.tolist() == b.callback.tolist()
    assert a.trajectory.tolist() == b.trajectory.tolist()


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Vern7()])
def test_ensemble_equals_each_trajectory_alone(alg):
    n = 7
    eprob, heights = ball_ensemble(n)
    cbs = dxode.CallbackSet(
        dxode.ContinuousCallback(height, bounce, direction="down"),
        dxode.PresetTimeCallback([0.3, 1.1], kick),
    )
    kw = {"callback": cbs, "saveat": np.linspace(0, 3, 31), "rtol": 1e-6}
    sim = dxode.solve(eprob, alg, trajectories=n, **kw)
    small = dxode.solve(eprob, alg, trajectories=n, batch_size=2, **kw)
    serial = dxode.solve(eprob, alg, dxode.EnsembleSerial(), trajectories=n, **kw)
    for other in (small, serial):
        np.testing.assert_array_equal(other.u, sim.u)
        np.testing.assert_array_equal(other.stats.nf, sim.stats.nf)
        np.testing.assert_array_equal(other.stats.naccept, sim.stats.naccept)
        _same(other.events, sim.events)
    for i in (0, n - 1):
        alone = dxode.solve(ball(np).remake(u0=np.array([heights[i], 0.0])), alg, **kw)
        np.testing.assert_array_equal(alone.u, sim.u[i])
        _same(alone.events, sim[i].events)


def kick(u, p, t, fired):
    return [u[0], u[1] + 0.5]


def test_lane_mask_protects_lanes_that_did_not_fire():
    def wild(u, p, t, fired):
        return u * 0.0 + 123.0  # touches every lane; only fired lanes may change

    spans = np.array([[0.0, 1.0], [0.0, 2.0]])
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 2.0))
    eprob = dxode.EnsembleProblem(prob, tspan=spans)
    cb = dxode.PresetTimeCallback([1.5], wild)
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=2, callback=cb, saveat=[0.0, 1.0])
    np.testing.assert_allclose(sim.u[:, -1, 0], [1.0, 1.0])
    assert sim.events.trajectory.tolist() == [1]


def test_a_preset_time_some_spans_miss_is_passed_by_on_every_algorithm():
    # 0.25 lies in trajectory 0's span only: EnsembleSerial refused it for trajectory 1.
    spans = np.array([[0.0, 1.0], [0.5, 2.0]])
    prob = dxode.ODEProblem(decay, np.array([1.0]), (0.0, 2.0), [0.5])
    eprob = dxode.EnsembleProblem(prob, tspan=spans)
    kw = {"callback": dxode.PresetTimeCallback([0.25, 0.75], dose), "rtol": 1e-10}
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=2, **kw)
    assert sim.events.trajectory.tolist() == [0, 0, 1]
    np.testing.assert_allclose(sim.events.t, [0.25, 0.75, 0.75])
    for alg, size in [(dxode.EnsembleSerial(), 2), (dxode.EnsembleSerial(), 1), (None, 1)]:
        other = dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=2, batch_size=size, **kw)
        np.testing.assert_array_equal(other.u, sim.u)
        _same(other.events, sim.events)


def test_a_preset_time_inside_the_spans_prob_func_builds_is_not_checked_against_prob():
    # prob.tspan is (0, 1); every trajectory's own span, (0, 3), holds the dose at 2.
    prob = dxode.ODEProblem(decay, np.array([1.0]), (0.0, 1.0), [0.5])
    eprob = dxode.EnsembleProblem(prob, prob_func=lambda prob, i, r: prob.remake(tspan=(0, 3)))
    cb = dxode.PresetTimeCallback([2.0], dose)
    for alg in (dxode.EnsembleArray(), dxode.EnsembleSerial()):
        sim = dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=2, callback=cb, rtol=1e-10)
        np.testing.assert_allclose(sim.events.t, [2.0, 2.0])
        exact = np.exp(-1.5) + np.exp(-0.5)  # decayed to t = 3, plus the dose decayed from 2
        np.testing.assert_allclose(sim.u[:, -1, 0], exact, rtol=1e-8)


def test_ensemble_events_array_api(xp):
    one = xp.asarray([1.0], dtype=xp.float64)
    prob = dxode.ODEProblem(growth, one, (0.0, 1.0), one)
    rates = np.array([[0.5], [1.5], [2.0]])
    eprob = dxode.EnsembleProblem(prob, p=rates)
    cb = dxode.ContinuousCallback(above_two, terminate=True)
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=3, callback=cb, rtol=1e-10, atol=1e-12)
    assert sim.retcodes.tolist() == [0, 4, 4]
    np.testing.assert_allclose(to_numpy(sim.events.t), math.log(2) / rates[1:, 0], rtol=1e-9)


# ---- errors ----------------------------------------------------------------------------------


def test_gradients_reach_the_event_time():
    """Differentiable callbacks (tests/test_event_gradients.py has the rest): ``u' = k u``
    from 1 ends at ``u = 2``, at ``t* = ln 2 / k``."""
    autograd = pytest.importorskip("autograd")
    cb = dxode.ContinuousCallback(above_two, terminate=True)

    def event_time(k):
        prob = dxode.ODEProblem(growth, np.array([1.0]), (0.0, 1.0), k)
        sol = dxode.solve(prob, dxode.Tsit5(), callback=cb, saveat=[1.0], rtol=1e-10, atol=1e-12)
        assert np.isnan(autograd.tracer.getval(sol.u[0, 0]))  # saved after the end: NaN
        return sol.events.t[0]

    k = np.array([1.0])
    np.testing.assert_allclose(autograd.grad(event_time)(k), -math.log(2) / k**2, rtol=1e-7)


def test_bad_callbacks_are_named():
    with pytest.raises(ValueError, match="direction"):
        dxode.ContinuousCallback(height, direction="sideways")
    with pytest.raises(ValueError, match="interp_points"):
        dxode.ContinuousCallback(height, interp_points=0)
    with pytest.raises(TypeError, match="CallbackSet takes"):
        dxode.CallbackSet(height)
    with pytest.raises(TypeError, match="callback must be"):
        dxode.solve(ball(np), callback=height)
    with pytest.raises(ValueError, match="finite"):
        dxode.PresetTimeCallback([1.0, float("nan")])
    bad_shape = dxode.ContinuousCallback(lambda u, p, t: u, bounce)
    with pytest.raises(ValueError, match="condition returned shape"):
        dxode.solve(ball(np), callback=bad_shape)
    bools = dxode.ContinuousCallback(lambda u, p, t: u[0] > 0)
    with pytest.raises(TypeError, match="not bools"):
        dxode.solve(ball(np), callback=bools)
    shrink = dxode.PresetTimeCallback([1.0], lambda u, p, t, fired: u[:1])
    with pytest.raises(ValueError, match="affect returned"):
        dxode.solve(ball(np), callback=shrink)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        # Read as times 0.5 and 1 (as saveat and tstops were before they refused them).
        (lambda: dxode.PresetTimeCallback(["0.5"]), TypeError, "times must be"),
        (lambda: dxode.PresetTimeCallback([True]), TypeError, "times must be"),
        # "ab" unpacked into two true strings; 1 and 0 are not the bools asked for.
        (lambda: dxode.ContinuousCallback(height, save_positions="ab"), TypeError, "got 'ab'"),
        (lambda: dxode.DiscreteCallback(height, save_positions=(1, 0)), TypeError, "pair"),
        (lambda: dxode.ContinuousCallback(height, abstol=True), TypeError, "abstol"),
        (lambda: dxode.ContinuousCallback(height, abstol="1e-9"), TypeError, "abstol"),
    ],
    ids=[
        "times str",
        "times bool",
        "save_positions str",
        "save_positions int",
        "abstol bool",
        "abstol str",
    ],
)
def test_callback_options_that_are_not_what_they_name_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_callback_options_take_numpy_numbers():
    """interp_points=np.int64(20) was refused as not a positive integer, abstol=np.float32
    as not a positive number."""
    cb = dxode.ContinuousCallback(
        height, bounce, "down", interp_points=np.int64(20), abstol=np.float32(1e-12)
    )
    assert cb.interp_points == 20 and type(cb.interp_points) is int
    sol = dxode.solve(ball(np), dxode.Tsit5(), callback=cb, rtol=1e-10, atol=1e-12)
    expected = impact_times(12)
    np.testing.assert_allclose(sol.events.t, expected[expected < 3.0], rtol=0, atol=1e-10)
    doses = dxode.PresetTimeCallback(np.array([2, 1]), dose)  # integer times
    sol = dxode.solve(dxode.ODEProblem(decay, np.array([1.0]), (0.0, 3.0), (1.0,)), callback=doses)
    np.testing.assert_array_equal(sol.events.t, [1.0, 2.0])


def test_an_affect_returning_too_few_rows_is_named_not_taken_for_f():
    # A list of rows of the wrong length was reported as "the right-hand side returned 1 rows".
    one_row = dxode.ContinuousCallback(height, lambda u, p, t, fired: [u[0]])
    with pytest.raises(ValueError, match=r"callback 0: affect's rows .* shape \(2,\)"):
        dxode.solve(ball(np), callback=one_row)
    eprob, _ = ball_ensemble(3)
    with pytest.raises(ValueError, match=r"callback 0: affect's rows .* shape \(2, 3\)"):
        dxode.solve(eprob, trajectories=3, callback=one_row)


_RERUNS: dict[int, int] = {}


def count_events_rerun_first(sol, i):
    """Rerun trajectory 0 once; every value is the trajectory's own event count."""
    _RERUNS[i] = _RERUNS.get(i, 0) + 1
    return len(sol.events), i == 0 and _RERUNS[i] == 1


def test_output_func_sees_events_and_reruns_replace_them():
    _RERUNS.clear()
    eprob, _ = ball_ensemble(4)
    eprob = dxode.EnsembleProblem(
        eprob.prob, u0=eprob.arrays["u0"], output_func=count_events_rerun_first
    )
    cb = dxode.ContinuousCallback(height, bounce, direction="down")
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=4, callback=cb)
    counts = np.bincount(sim.events.trajectory, minlength=4)
    assert sim.u.tolist() == counts.tolist()
    assert _RERUNS[0] == 2
    assert np.all(np.diff(sim.events.trajectory) >= 0)  # still grouped by trajectory


def test_events_integrating_backwards():
    def half(u, p, t):
        return t - 0.5

    cbs = [dxode.ContinuousCallback(half, dose), dxode.PresetTimeCallback([0.75, 0.25], dose)]
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (1.0, 0.0))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cbs, saveat=[1.0, 0.6, 0.4, 0.0])
    np.testing.assert_allclose(sol.events.t, [0.75, 0.5, 0.25], atol=1e-12)
    assert sol.events.callback.tolist() == [1, 0, 1]
    # u' = 1 backwards from u(1) = 0 is u = t - 1, plus 1 at each event passed.
    np.testing.assert_allclose(sol.u[:, 0], [0.0, 0.6 - 1 + 1, 0.4 - 1 + 2, 0.0 - 1 + 3])


def _add_one_in_place(u, p, t, fired):
    """An affect written the DifferentialEquations.jl way: it changes ``u`` in place."""
    u[0] += 1.0
    return u


@pytest.mark.parametrize("kind", ["preset", "continuous"])
def test_affect_that_changes_u_in_place_is_applied_once_per_trajectory(kind):
    """An affect that mutates its ``u`` argument must not reach lanes that did not fire (nor
    the logged state before the event, nor the step it cut): ``u`` is the lanes' own copy."""
    prob = dxode.ODEProblem(lambda u, p, t: -u, [1.0], (0.0, 2.0))
    if kind == "preset":
        cb = dxode.PresetTimeCallback([1.0], _add_one_in_place)
        te = np.array([1.0, 1.0, 1.0])
    else:
        cb = dxode.ContinuousCallback(lambda u, p, t: u[0] - 0.5, _add_one_in_place)
        te = np.log(np.array([1.0, 2.0, 3.0]) / 0.5)
    u0 = np.array([[1.0], [2.0], [3.0]])
    tspan = np.column_stack([np.zeros(3), te + 1.0])
    eprob = dxode.EnsembleProblem(prob, u0=u0, tspan=tspan)
    sim = dxode.solve(eprob, dxode.Tsit5(), callback=cb, rtol=1e-10, atol=1e-10)
    at_event = u0[:, 0] * np.exp(-te)
    np.testing.assert_allclose(sim.events.t, te, rtol=1e-9)
    np.testing.assert_allclose(sim.events.u_before[:, 0], at_event, rtol=1e-8)
    np.testing.assert_allclose(sim.events.u_after[:, 0], at_event + 1.0, rtol=1e-8)
    np.testing.assert_allclose(sim.u[:, -1, 0], (at_event + 1.0) * np.exp(-1.0), rtol=1e-8)
    single = dxode.solve(
        prob.remake(u0=[3.0], tspan=tuple(tspan[2])), callback=cb, rtol=1e-10, atol=1e-10
    )
    np.testing.assert_allclose(single.events.u_before[:, 0], at_event[2:], rtol=1e-8)
    np.testing.assert_allclose(single.u[-1, 0], (at_event[2] + 1.0) * np.exp(-1.0), rtol=1e-8)


def test_terminate_at_t0_by_a_preset_time_without_saveat():
    """A preset time at ``t0`` whose callback terminates ends the solve before any step: the
    solution holds ``t0`` before and after the event (it raised an AssertionError)."""
    prob = dxode.ODEProblem(lambda u, p, t: -u, [1.0], (0.0, 2.0))
    cb = dxode.PresetTimeCallback([0.0], lambda u, p, t, fired: u + 1.0, terminate=True)
    sol = dxode.solve(prob, dxode.Tsit5(), callback=cb)
    assert sol.retcode == dxode.ReturnCode.Terminated
    np.testing.assert_array_equal(to_numpy(sol.t), [0.0, 0.0])
    np.testing.assert_array_equal(to_numpy(sol.u)[:, 0], [1.0, 2.0])
    np.testing.assert_array_equal(sol.events.t, [0.0])
    assert sol.stats.naccept == 0


def _ramp(u, p, t):
    return [1.0 + 0.0 * u[0], 0.0 * u[1]]


@pytest.mark.parametrize("first", ["state", "time"])
@pytest.mark.parametrize("at", [0.3, 0.7, 1.3])
def test_two_continuous_events_at_the_same_time_both_fire(first, at):
    """``x' = 1`` from 0 crosses ``at`` when ``t`` does: a callback on ``x - at`` and one on
    ``t - at`` cross at the same time. Both fire, whichever the root finder places first (the
    other's condition may already sit a rounding error across at that point); one was lost."""
    on_state = dxode.ContinuousCallback(
        lambda u, p, t: u[0] - at, lambda u, p, t, fired: [u[0], u[1] + 1.0]
    )
    on_time = dxode.ContinuousCallback(
        lambda u, p, t: t - at, lambda u, p, t, fired: [u[0], u[1] + 100.0]
    )
    pair = (on_state, on_time) if first == "state" else (on_time, on_state)
    prob = dxode.ODEProblem(_ramp, [0.0, 0.0], (0.0, 2.0))
    sol = dxode.solve(prob, dxode.Tsit5(), callback=dxode.CallbackSet(*pair))
    np.testing.assert_allclose(sol.events.t, [at, at], rtol=1e-14)
    assert sorted(sol.events.callback.tolist()) == [0, 1]
    assert to_numpy(sol.u)[-1, 1] == 101.0
    eprob = dxode.EnsembleProblem(prob, u0=np.array([[0.0, 0.0], [0.0, 5.0]]))
    sim = dxode.solve(eprob, dxode.Tsit5(), callback=dxode.CallbackSet(*pair), saveat=[2.0])
    np.testing.assert_array_equal(to_numpy(sim.u)[:, -1, 1], [101.0, 106.0])


def _ramps(u, p, t):
    return [p[1] + 0.0 * u[0], p[1] + 0.0 * u[1], 0.0 * u[2]]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0)])
def test_three_continuous_events_at_the_same_time_fire_once_each_in_every_lane(order):
    """Three conditions crossing together (``x - T``, ``y - T`` for ``x = y = v t``, and
    ``t - T``) over 100 lanes of random ``T`` and speeds ``v``: each fires exactly once per
    lane (before, about a third of the lanes lost one or fired one twice)."""
    conditions = [
        lambda u, p, t: u[0] - p[0] * p[1],
        lambda u, p, t: u[1] - p[0] * p[1],
        lambda u, p, t: t - p[0],
    ]
    affects = [
        lambda u, p, t, fired, jump=jump: [u[0], u[1], u[2] + jump] for jump in (1.0, 10.0, 100.0)
    ]
    callbacks = [dxode.ContinuousCallback(conditions[k], affects[k]) for k in order]
    rng = np.random.default_rng(0)
    p = np.column_stack([rng.uniform(0.05, 1.9, 100), rng.choice([0.1, 1.0, 3.0, 7.0], 100)])
    prob = dxode.ODEProblem(_ramps, [0.0, 0.0, 0.0], (0.0, 2.0), [1.0, 1.0])
    sim = dxode.solve(
        dxode.EnsembleProblem(prob, p=p), callback=dxode.CallbackSet(*callbacks), saveat=[2.0]
    )
    np.testing.assert_array_equal(to_numpy(sim.u)[:, -1, 2], np.full(100, 111.0))
    assert np.bincount(sim.events.trajectory, minlength=100).tolist() == [3] * 100


def _speed(u, p, t):
    return [p[0] + 0.0 * u[0], 0.0 * u[1]]


def test_event_cut_onto_a_stop_does_not_stall_the_lane():
    """``x = v t`` crosses ``v T`` at the preset time ``T``: in some lanes the continuous
    event's root lands exactly on the stop ``T``, whose step then has length zero. The lane
    goes on with its step size; a zero step proposed a zero next step, and the lane stepped
    by zero until ``maxiters`` (``MaxIters`` after 100,000 iterations, 64 s for 200 lanes)."""
    at = 0.1
    cross = dxode.ContinuousCallback(
        lambda u, p, t: u[0] - p[0] * at, lambda u, p, t, fired: [u[0], u[1] + 1.0]
    )
    dose = dxode.PresetTimeCallback([at], lambda u, p, t, fired: [u[0], u[1] + 100.0])
    speeds = np.random.default_rng(1).uniform(0.1, 10.0, 200)[:, None]
    prob = dxode.ODEProblem(_speed, [0.0, 0.0], (0.0, 2.0), [1.0])
    sim = dxode.solve(
        dxode.EnsembleProblem(prob, p=speeds),
        callback=dxode.CallbackSet(cross, dose),
        saveat=[2.0],
        maxiters=1000,
    )
    assert sim.retcodes.tolist() == [0] * 200
    np.testing.assert_allclose(to_numpy(sim.u)[:, -1, 0], 2.0 * speeds[:, 0], rtol=1e-12)


def _triple_rate_in_place(u, p, t, fired):
    """An affect written the DifferentialEquations.jl way (``integrator.p[1] = 3``)."""
    p[0] = 3.0
    return u


@pytest.mark.parametrize("ensemble", [False, True])
def test_affect_that_changes_p_in_place_is_refused(ensemble):
    """``p`` is fixed during a solve (shared by lanes, and the caller's own array): an affect
    that changes it in place is refused with the fix. It changed the caller's ``prob.p`` and
    reached lanes that had not fired yet (a silent wrong answer)."""
    rate = np.array([1.0])
    prob = dxode.ODEProblem(lambda u, p, t: -p[0] * u, [1.0], (0.0, 2.0), rate)
    if ensemble:
        prob = dxode.EnsembleProblem(prob, u0=np.array([[1.0], [2.0]]))
    cb = dxode.PresetTimeCallback([1.0], _triple_rate_in_place)
    with pytest.raises(TypeError, match=r"callback 0: affect changed p in place.*state"):
        dxode.solve(prob, dxode.Tsit5(), callback=cb, saveat=[2.0])
    assert rate.tolist() == [1.0]


def test_an_event_a_few_ulps_before_a_stop_does_not_restart_the_step_size():
    # Rodas5P places the root of u - 1 (u = t) a few ulps before the tstop at 1: the lane then
    # stepped by that sliver, and the controller grew the next steps back from it (35 steps
    # against 9 without the tstop), each with its own Jacobian and LU.
    prob = dxode.ODEProblem(lambda u, p, t: 0.0 * u + 1.0, [0.0], (0.0, 2.0))
    reset = dxode.ContinuousCallback(lambda u, p, t: u[0] - 1.0, lambda u, p, t, fired: u + 1.0)
    free = dxode.solve(prob, dxode.Rodas5P(), callback=reset)
    stopped = dxode.solve(prob, dxode.Rodas5P(), callback=reset, tstops=[1.0])
    assert free.events.t[0] < 1.0  # the root is placed before the crossing
    assert stopped.stats.naccept <= free.stats.naccept + 2
    np.testing.assert_allclose(stopped.u[-1], [3.0], rtol=1e-12)


def _every_step(u, p, t):
    return True


def _count_step(u, p, t, fired):
    return [u[0], u[1] + 1.0]


def _grow_and_count(u, p, t):
    return [p[0] * u[0], 0.0 * u[1]]


def test_a_constant_condition_fires_in_every_lane_as_for_one_trajectory():
    # An ensemble refused DiscreteCallback(lambda u, p, t: True) ("condition returned shape
    # ()"), although the same callback runs per trajectory alone and on EnsembleKernel.
    prob = dxode.ODEProblem(_grow_and_count, np.array([1.0, 0.0]), (0.0, 1.0), np.array([1.0]))
    rates = np.array([[0.5], [1.0], [3.0]])
    eprob = dxode.EnsembleProblem(prob, p=rates)
    cb = dxode.DiscreteCallback(_every_step, _count_step, terminate=lambda u, p, t: False)
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=3, callback=cb, rtol=1e-8)
    for i in range(3):
        alone = dxode.solve(prob.remake(p=rates[i]), dxode.Tsit5(), callback=cb, rtol=1e-8)
        _same(alone.events, sim[i].events)
        steps = sim.stats.naccept[i]
        assert len(sim[i].events) == steps == sim[i].events.u_after[-1, 1]  # every step
