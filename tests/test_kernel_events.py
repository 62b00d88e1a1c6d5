"""Callbacks on the kernel path: the array path's events, compiled.

Each compiled kernel is solved once in a module-scoped fixture and checked by several tests:
against closed forms (bounce times, dose levels, growth reaching a threshold) and against the
array path, which has the same semantics (event times, callbacks, states around the events,
return codes and statistics).
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest

pytest.importorskip("numba")

from scripts import assert_runs_under_cuda_simulator

import dxode
from dxode.kernels.errors import KernelCompileError, KernelUnsupportedError
from dxode.kernels.events import EVENT_CAPACITY

GRAVITY = 9.81
TOL = {"rtol": 1e-8, "atol": 1e-10}


# ---- the functions, written once for both paths ------------------------------------------


def fall(u, p, t):
    return [u[1], -GRAVITY + 0.0 * u[0]]


def height(u, p, t):
    return u[0]


def velocity(u, p, t):
    return u[1]


def bounce(u, p, t, fired):
    return [u[0], -p[0] * u[1]]


def low_apex(u, p, t):
    return u[0] < 0.5


def rate(u, p, t):
    return [p[0] * u[0]]


def reached_two(u, p, t):
    return u[0] - 2.0


def below(u, p, t):
    return u[0] - 1.8


def high(u, p, t):
    return u[0] > 1.5


def dose(u, p, t, fired):
    return [u[0] + 1.0]


class _Level:
    def value(self):
        return 1.0


LEVEL = _Level()


def opaque(u, p, t):
    return u[0] - LEVEL.value()


def bounce_times(e, count, h0=1.0):
    """Impact times of a ball dropped from ``h0`` with restitution ``e``."""
    first = math.sqrt(2 * h0 / GRAVITY)
    return np.array([first * (1 + 2 * sum(e**k for k in range(1, i))) for i in range(1, count + 1)])


def ball_height(t, e, h0=1.0):
    """The height at times ``t`` (sorted) of a ball dropped from ``h0`` at ``t = 0``."""
    impacts = bounce_times(e, 8, h0)
    t = np.asarray(t)
    bounced = np.searchsorted(impacts, t, side="right")  # impacts before each time
    start = np.where(bounced == 0, 0.0, impacts[np.maximum(bounced - 1, 0)])
    up = np.where(bounced == 0, 0.0, e**bounced * math.sqrt(2 * GRAVITY * h0))
    return np.where(bounced == 0, h0, 0.0) + up * (t - start) - GRAVITY / 2 * (t - start) ** 2


def both_paths(run):
    """``run(kernel)`` for the kernel and the array path."""
    return run(True), run(False)


def assert_same_events(kernel, array, atol):
    assert kernel.events is not None and array.events is not None
    np.testing.assert_array_equal(kernel.events.callback, array.events.callback)
    np.testing.assert_array_equal(kernel.events.trajectory, array.events.trajectory)
    np.testing.assert_allclose(np.asarray(kernel.events.t), np.asarray(array.events.t), atol=atol)
    for name in ("u_before", "u_after"):
        np.testing.assert_allclose(
            np.asarray(getattr(kernel.events, name)),
            np.asarray(getattr(array.events, name)),
            atol=atol,
        )


def stats(sim):
    return [(s.stats.naccept, s.stats.nreject, s.stats.nf, int(s.retcode)) for s in sim]


# ---- a single bouncing ball that stops at its first apex below 0.5 -----------------------


@pytest.fixture(scope="module")
def ball():
    prob = dxode.ODEProblem(fall, np.array([1.0, 0.0]), (0.0, 3.0), (0.8,))
    callbacks = dxode.CallbackSet(
        dxode.ContinuousCallback(height, bounce, direction="down"),
        dxode.ContinuousCallback(velocity, direction="down", terminate=low_apex),
    )
    return both_paths(
        lambda kernel: dxode.solve(prob, "tsit5", callback=callbacks, kernel=kernel, **TOL)
    )


def test_bounces_at_the_closed_form_times(ball):
    kernel, _ = ball
    e, v0 = 0.8, math.sqrt(2 * GRAVITY)
    impacts = bounce_times(e, 2)
    apexes = impacts + e ** np.arange(1, 3) * v0 / GRAVITY
    np.testing.assert_array_equal(kernel.events.callback, [0, 1, 0, 1])
    np.testing.assert_allclose(
        kernel.events.t, [impacts[0], apexes[0], impacts[1], apexes[1]], rtol=0, atol=1e-9
    )
    np.testing.assert_allclose(
        kernel.events.u_after[[0, 2], 1], -e * kernel.events.u_before[[0, 2], 1]
    )


def test_terminate_function_ends_the_solve_at_the_event(ball):
    kernel, _ = ball
    assert kernel.retcode == dxode.ReturnCode.Terminated
    assert kernel.t[-1] == kernel.events.t[-1]
    apex = bounce_times(0.8, 2)[-1] + 0.8**2 * math.sqrt(2 * GRAVITY) / GRAVITY
    assert abs(kernel.t[-1] - apex) < 1e-9
    assert abs(kernel.u[-1, 0] - 0.8**4) < 1e-8  # apex height e^(2n) h0, below 0.5


def test_single_solve_matches_the_array_path(ball):
    kernel, array = ball
    assert_same_events(kernel, array, atol=1e-12)
    # Every step, with the state after each event inserted after it. The fall is a parabola,
    # which Tsit5 integrates exactly: its error estimate is rounding noise, so the step
    # sizes follow last-bit differences between the paths (the controller's factor is the
    # kernel's own log/exp, not NumPy's pow), 8e-5 apart here. Each path's states are the
    # closed form's at its own step times.
    for sol in (kernel, array):
        np.testing.assert_allclose(sol.u[:, 0], ball_height(sol.t, 0.8), rtol=0, atol=1e-12)
    assert len(kernel.t) == len(array.t)
    assert (kernel.stats.nf, kernel.stats.naccept, kernel.stats.nreject) == (
        array.stats.nf,
        array.stats.naccept,
        array.stats.nreject,
    )


# ---- a crossing right after an affect; the continuous event applies first --------------


def sink(u, p, t):
    return [0.0 * u[0] - 1.0]


def level(u, p, t):
    return u[0]


def lift(u, p, t, fired):
    return [u[0] + 0.05]


def near_zero(u, p, t):
    return abs(u[0]) < 1e-9


def jump_up(u, p, t, fired):
    return [u[0] + 1.0]


def test_a_crossing_right_after_an_affect_and_the_order_of_application():
    """u' = -1 crosses zero at t = 1 and each lift by 0.05 makes it cross again 0.05 later,
    before the first sample of the (long) next step: 20 events, as on the array path. The
    lift applies before the discrete check listed first, which then sees u = 0.05."""
    cbs = dxode.CallbackSet(
        dxode.DiscreteCallback(near_zero, jump_up),
        dxode.ContinuousCallback(level, lift, direction="down"),
    )
    prob = dxode.ODEProblem(sink, np.array([1.0]), (0.0, 1.975))
    kernel, array = both_paths(
        lambda kernel: dxode.solve(prob, "tsit5", callback=cbs, saveat=[1.975], kernel=kernel)
    )
    np.testing.assert_array_equal(kernel.events.callback, np.ones(20))
    np.testing.assert_allclose(kernel.events.t, 1.0 + 0.05 * np.arange(20), rtol=0, atol=1e-12)
    np.testing.assert_allclose(kernel.u[-1], [0.025], atol=1e-12)
    assert_same_events(kernel, array, atol=1e-12)


def ramp(u, p, t):
    return [0.0 * u[0] + 1.0]


def half_time(u, p, t):
    return t - 0.5


def add_ten(u, p, t, fired):
    return [u[0] + 10.0]


def test_two_callbacks_crossing_at_the_same_time_both_fire():
    cbs = dxode.CallbackSet(
        dxode.ContinuousCallback(half_time, dose), dxode.ContinuousCallback(half_time, add_ten)
    )
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 1.0))
    kernel, array = both_paths(
        lambda kernel: dxode.solve(prob, "tsit5", callback=cbs, saveat=[1.0], kernel=kernel)
    )
    np.testing.assert_array_equal(kernel.events.callback, [0, 1])
    np.testing.assert_array_equal(kernel.events.t, [0.5, 0.5])
    np.testing.assert_allclose(kernel.u[-1], [12.0], rtol=1e-12)
    assert_same_events(kernel, array, atol=0)


# ---- an ensemble of balls with per-lane restitution (more events than the log holds) ----


RESTITUTION = np.linspace(0.8, 0.9, 5)


@pytest.fixture(scope="module")
def balls():
    prob = dxode.ODEProblem(fall, np.array([1.0, 0.0]), (0.0, 3.8), (0.8,))
    eprob = dxode.EnsembleProblem(prob, p=RESTITUTION[:, None])
    floor = dxode.ContinuousCallback(height, bounce, direction="down")

    def run(alg, **kwargs):
        return dxode.solve(eprob, "tsit5", alg, callback=floor, saveat=0.5, **TOL, **kwargs)

    return run(dxode.EnsembleKernel()), run(dxode.EnsembleArray()), run


def test_ensemble_bounces_per_lane(balls):
    kernel, _, _ = balls
    counts = np.bincount(kernel.events.trajectory, minlength=RESTITUTION.size)
    assert counts[0] > EVENT_CAPACITY  # those lanes ran again with a larger log
    assert len(set(counts.tolist())) > 2
    for i, e in enumerate(RESTITUTION):
        own = kernel[i].events
        np.testing.assert_allclose(own.t, bounce_times(e, counts[i]), rtol=0, atol=1e-8)
        assert bounce_times(e, counts[i] + 1)[-1] > 3.8


def test_ensemble_matches_the_array_path(balls):
    kernel, array, _ = balls
    assert_same_events(kernel, array, atol=1e-11)
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), atol=1e-11)
    assert stats(kernel) == stats(array)


def test_events_are_bitwise_independent_of_the_batch_size(balls):
    kernel, _, run = balls
    other = run(dxode.EnsembleKernel(threads=1), batch_size=2)
    for name in ("t", "callback", "trajectory", "u_before", "u_after"):
        np.testing.assert_array_equal(getattr(other.events, name), getattr(kernel.events, name))
    np.testing.assert_array_equal(np.asarray(other.u), np.asarray(kernel.u))


# ---- doses, termination, direction and a discrete check on one set ------------------------


RATES = np.array([[-0.5], [1.2], [0.9]])
STARTS = np.array([[0.5], [1.0], [1.0]])


def mixed_callbacks():
    return dxode.CallbackSet(
        dxode.ContinuousCallback(reached_two, direction="up", terminate=True),
        dxode.ContinuousCallback(below, direction="down"),
        dxode.PresetTimeCallback([1.0, 2.0, 3.0], dose),
        dxode.DiscreteCallback(high, save_positions=(False, True)),
    )


def solve_mixed(dtype, alg, tspan=(0.0, 4.0)):
    prob = dxode.ODEProblem(rate, np.array([0.0], dtype=dtype), tspan, (1.0,))
    eprob = dxode.EnsembleProblem(prob, u0=STARTS.astype(dtype), p=RATES)
    tol = TOL if dtype == np.float64 else {"rtol": 1e-5, "atol": 1e-7}
    return dxode.solve(eprob, "tsit5", alg, callback=mixed_callbacks(), saveat=0.25, **tol)


@pytest.fixture(scope="module")
def mixed():
    return solve_mixed(np.float64, dxode.EnsembleKernel()), solve_mixed(
        np.float64, dxode.EnsembleArray()
    )


@pytest.fixture(scope="module")
def mixed32():
    return solve_mixed(np.float32, dxode.EnsembleKernel()), solve_mixed(
        np.float32, dxode.EnsembleArray()
    )


def _check_closed_forms(sim, tol):
    codes = [dxode.ReturnCode(c) for c in sim.retcodes]
    assert codes == [dxode.ReturnCode.Success] + [dxode.ReturnCode.Terminated] * 2
    dosed = sim[0].events
    doses = dosed.callback == 2
    np.testing.assert_array_equal(dosed.t[doses], [1.0, 2.0, 3.0])
    levels = [STARTS[0, 0]]
    for _ in range(3):
        levels.append(1 + levels[-1] * math.exp(-0.5))
    np.testing.assert_allclose(dosed.u_after[doses, 0], levels[1:], rtol=tol)
    # The third dose lifts the level above 2, and it decays through 2 and 1.8: only the
    # downward crossing of 1.8 fires (callback 0 fires upwards only).
    assert levels[3] > 2 and not np.any(dosed.callback == 0)
    [down] = dosed.t[dosed.callback == 1]
    assert abs(down - (3 + 2 * math.log(levels[3] / 1.8))) < tol
    for i in (1, 2):
        own = sim[i].events
        assert not np.any(own.callback == 1)  # crossed 1.8 upward only: filtered out
        assert own.callback[-1] == 0  # terminated there, no discrete check after it
        assert abs(own.t[-1] - math.log(2) / RATES[i, 0]) < tol
        saved = np.asarray(sim[i].u)[:, 0]
        after = sim.t > own.t[-1]
        assert np.all(np.isnan(saved[after])) and np.all(np.isfinite(saved[~after]))
    discrete = sim.events.callback == 3
    assert discrete.any()
    assert np.all(np.isnan(sim.events.u_before[discrete]))
    assert np.all(sim.events.u_after[discrete, 0] > 1.5)


def test_doses_termination_and_direction_closed_forms(mixed):
    _check_closed_forms(mixed[0], tol=1e-7)


def test_mixed_callbacks_match_the_array_path(mixed):
    kernel, array = mixed
    assert_same_events(kernel, array, atol=1e-12)
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), atol=1e-12)
    assert stats(kernel) == stats(array)


def test_backward_in_time_matches_the_array_path():
    kernel, array = (solve_mixed(np.float64, alg, (4.0, 0.0)) for alg in _ALGS)
    assert len(kernel.events) > 5 and np.all(np.diff(kernel[0].events.t) <= 0)
    assert_same_events(kernel, array, atol=1e-12)
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), atol=1e-12)
    assert stats(kernel) == stats(array)


_ALGS = (dxode.EnsembleKernel(), dxode.EnsembleArray())


def test_float32(mixed32):
    kernel = mixed32[0]
    assert kernel.events.t.dtype == np.float32 and kernel.events.u_after.dtype == np.float32
    assert np.asarray(kernel.u).dtype == np.float32
    _check_closed_forms(kernel, tol=2e-5)
    # Rounding differs from the array path's float32 (so may the step count, and with it how
    # often the discrete check fires); the located events agree to float32 accuracy.
    located = [sim.events.select(np.nonzero(sim.events.callback != 3)[0]) for sim in mixed32]
    np.testing.assert_array_equal(located[0].callback, located[1].callback)
    np.testing.assert_array_equal(located[0].trajectory, located[1].trajectory)
    np.testing.assert_allclose(located[0].t, located[1].t, rtol=1e-5)
    np.testing.assert_allclose(located[0].u_after, located[1].u_after, rtol=1e-5)


def raised_floor(u, p, t):
    return u[0] - 0.1


def test_a_changed_condition_compiles_a_new_kernel(ball):
    # The functions are bound into the generated module by name: a kernel reused for another
    # condition of the same shape would locate the old condition's events.
    prob = dxode.ODEProblem(fall, np.array([1.0, 0.0]), (0.0, 3.0), (0.8,))
    callbacks = dxode.CallbackSet(
        dxode.ContinuousCallback(raised_floor, bounce, direction="down"),
        dxode.ContinuousCallback(velocity, direction="down", terminate=low_apex),
    )
    sol = dxode.solve(prob, "tsit5", callback=callbacks, kernel=True, **TOL)
    assert abs(sol.events.t[0] - math.sqrt(2 * 0.9 / GRAVITY)) < 1e-9
    assert abs(ball[0].events.t[0] - math.sqrt(2 / GRAVITY)) < 1e-9


# ---- errors ------------------------------------------------------------------------------


def _solve_with(callback):
    prob = dxode.ODEProblem(rate, np.array([1.0]), (0.0, 1.0), (1.0,))
    return dxode.solve(prob, "tsit5", callback=callback, kernel=True)


def test_uncompilable_condition_names_it_and_the_array_path():
    with pytest.raises(
        KernelCompileError,
        match=r"(?s)callback 0: the ContinuousCallback "
        r"condition defined at .*test_kernel_events.py.*array path",
    ):
        _solve_with(dxode.ContinuousCallback(opaque))


def _past_the_state(u, p, t):
    return u[3] - 0.5


def test_a_condition_reading_past_the_end_of_u_is_refused():
    # it compiled with u as an array, and the kernel read past the 1-component state
    # unchecked (a condition's trial call now checks its indexing)
    with pytest.raises(KernelCompileError, match=r"test_kernel_events\.py:\d+ indexes u"):
        _solve_with(dxode.ContinuousCallback(_past_the_state))


def test_condition_returning_a_bool_is_refused():
    with pytest.raises(KernelCompileError, match="use DiscreteCallback"):
        _solve_with(dxode.ContinuousCallback(high))
    with pytest.raises(KernelCompileError, match="must return a bool"):
        _solve_with(dxode.DiscreteCallback(reached_two))


def test_affect_returning_nothing_is_refused():
    def forgot(u, p, t, fired):
        u[0] + 1.0

    with pytest.raises(KernelCompileError, match="forget to return"):
        _solve_with(dxode.PresetTimeCallback([0.5], forgot))


def _halve_into_a_list(u, p, t, fired):
    new = [0.5 * u[0]]
    return new


@pytest.mark.parametrize("affect", [_halve_into_a_list, lambda u, p, t, fired: [0.5 * u[0]]])
def test_affect_returning_a_list_that_is_not_a_literal_in_its_return(affect):
    # was refused: "returns list(float64); it must return ... as a list or tuple"
    prob = dxode.ODEProblem(rate, np.array([1.0]), (0.0, 1.0), (1.0,))
    sols = [
        dxode.solve(
            prob, "tsit5", callback=dxode.PresetTimeCallback([0.5], affect), kernel=kernel, **TOL
        )
        for kernel in (False, True)
    ]
    for sol in sols:  # u' = u, halved at t = 0.5
        np.testing.assert_allclose(sol.u[-1], [0.5 * math.e], rtol=1e-7)
        np.testing.assert_allclose(sol.events.u_after, [[0.5 * math.exp(0.5)]], rtol=1e-7)


def test_a_callback_function_that_is_not_a_plain_function_is_refused_clearly():
    import functools

    def shifted(u, p, t, by):
        return u[0] - by

    with pytest.raises(KernelUnsupportedError, match="condition as a plain Python function"):
        _solve_with(dxode.ContinuousCallback(functools.partial(shifted, by=0.5)))


@pytest.mark.parametrize("length", [0, 2])
def test_affect_returning_an_array_of_the_wrong_length_is_refused(length):
    # the kernel read the state's numbers from the returned array unchecked: a shorter one
    # past its end, a longer one cut short, silently (the array path raises)
    def resized(u, p, t, fired):
        return np.zeros(length) + u[0]

    with pytest.raises(KernelCompileError, match=rf"returns shape \({length},\).*: 1 numbers"):
        _solve_with(dxode.PresetTimeCallback([0.5], resized))


def _reset_to_integers(u, p, t, fired):
    return np.array([1])


def _reset_to_bools(u, p, t, fired):
    return u > 0.0


def _reset_to_integer_rows(u, p, t, fired):
    return [1]


@pytest.mark.parametrize(
    ("affect", "dtype"), [(_reset_to_integers, "int64"), (_reset_to_bools, "bool")]
)
def test_affect_returning_an_integer_or_bool_array_is_refused_on_both_paths(affect, dtype):
    # the kernel cast it to the state's dtype silently (the array path raises)
    prob = dxode.ODEProblem(rate, np.array([1.0]), (0.0, 1.0), (1.0,))
    callback = dxode.PresetTimeCallback([0.5], affect)
    message = f"callback 0: affect returned dtype {dtype} for a float64 state; keep it in u's dtype"
    for kernel in (False, True):
        with pytest.raises(TypeError, match=message):
            dxode.solve(prob, "tsit5", callback=callback, kernel=kernel)


def _reset_to_float64(u, p, t, fired):
    return np.ones(1)


def test_affect_returning_float64_for_a_float32_state_is_refused_on_both_paths():
    # the kernel cast it to the state's dtype silently (the array path raises)
    prob = dxode.ODEProblem(rate, np.array([1.0], dtype=np.float32), (0.0, 1.0), (1.0,))
    callback = dxode.PresetTimeCallback([0.5], _reset_to_float64)
    message = "callback 0: affect returned dtype float64 for a float32 state; keep it in u's"
    for kernel in (False, True):
        with pytest.raises(TypeError, match=message):
            dxode.solve(prob, "tsit5", callback=callback, kernel=kernel)


def test_affect_returning_rows_of_integers_sets_the_state_on_both_paths():
    # the array path refused them (dtype int64), unlike f's rows of Python numbers
    prob = dxode.ODEProblem(rate, np.array([1.0]), (0.0, 1.0), (1.0,))
    callback = dxode.PresetTimeCallback([0.5], _reset_to_integer_rows)
    for kernel in (False, True):
        sol = dxode.solve(prob, "tsit5", callback=callback, kernel=kernel, **TOL)
        np.testing.assert_array_equal(sol.events.u_after, [[1.0]])
        np.testing.assert_allclose(sol.u[-1], [math.exp(0.5)], rtol=1e-7)


# ---- a condition that returns NaN ---------------------------------------------------------


# ``x ** False`` is 1 and ``nan ** True`` NaN: a NaN where the test holds, on both paths and
# per lane (without NumPy's invalid-value warning)
def nan_after_half(u, p, t):
    return (u[0] - 2.0) * math.nan ** (t > 0.5)


def nan_at_start(u, p, t):
    return (u[0] - 2.0) * math.nan ** (t <= 0.0)


def nan_below_zero(u, p, t):
    return (u[0] - 1.0) * math.nan ** (u[0] < 0.0)


def drop(u, p, t, fired):
    return [u[0] - 5.0]


def _nan_message(solve):
    with pytest.raises(ValueError, match="condition returned NaN at t = ") as info:
        solve()
    return str(info.value)


@pytest.mark.parametrize(
    ("condition", "affect", "at"),
    [(nan_after_half, None, None), (nan_at_start, None, "0"), (nan_below_zero, drop, "1")],
    ids=["in-a-step", "at-t0", "after-an-affect"],
)
def test_a_condition_returning_nan_raises_as_on_the_array_path(condition, affect, at):
    # the kernel went on with no event (its sign unknown), missing the crossing at t = 2
    callback = dxode.ContinuousCallback(condition, affect)
    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 3.0))
    # the kernel names the first trajectory's NaN (the array path the first one it meets,
    # here the same: the first trajectory's steps are ahead)
    eprob = dxode.EnsembleProblem(prob, u0=np.array([[0.5], [0.0], [0.0]]))
    single = [
        _nan_message(lambda k=kernel: dxode.solve(prob, "tsit5", callback=callback, kernel=k))
        for kernel in (False, True)
    ]
    ensemble = [
        _nan_message(lambda a=alg: dxode.solve(eprob, "tsit5", a, callback=callback))
        for alg in (dxode.EnsembleArray(), dxode.EnsembleKernel())
    ]
    assert single[0] == single[1] and ensemble[0] == ensemble[1], (single, ensemble)
    assert single[0].startswith("callback 0: the ContinuousCallback condition returned NaN")
    if at is not None:
        assert f"at t = {at} for a finite state" in single[0]


# ---- the CUDA kernel under numba-cuda's simulator ----------------------------------------


CUDA_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import dxode
    from test_kernel_events import RATES, STARTS, mixed_callbacks, rate

    prob = dxode.ODEProblem(rate, np.array([0.0]), (0.0, 4.0), (1.0,))
    eprob = dxode.EnsembleProblem(prob, u0=STARTS, p=RATES)
    opts = {"callback": mixed_callbacks(), "saveat": 0.5, "rtol": 1e-6, "atol": 1e-8}
    gpu = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device="cuda"), **opts)
    cpu = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **opts)
    assert np.array_equal(np.asarray(gpu.u), np.asarray(cpu.u), equal_nan=True)
    assert np.array_equal(gpu.retcodes, cpu.retcodes)
    for name in ("t", "callback", "trajectory", "u_before", "u_after"):
        a, b = getattr(gpu.events, name), getattr(cpu.events, name)
        assert np.array_equal(a, b, equal_nan=True), name
    assert len(cpu.events) > 5
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_kernel_under_the_simulator_matches_the_cpu_kernel():
    pytest.importorskip("numba.cuda")
    assert_runs_under_cuda_simulator(CUDA_SCRIPT)


NAN_CUDA_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import pytest
    import dxode
    from test_kernel_events import nan_after_half, ramp

    prob = dxode.ODEProblem(ramp, np.array([0.0]), (0.0, 3.0))
    eprob = dxode.EnsembleProblem(prob, u0=np.array([[0.5], [0.0]]))
    callback = dxode.ContinuousCallback(nan_after_half)
    messages = []
    for device in ("cuda", "cpu"):
        with pytest.raises(ValueError, match="condition returned NaN at t = ") as info:
            dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device=device), callback=callback)
        messages.append(str(info.value))
    assert messages[0] == messages[1], messages
    print("ok")
    """
)


@pytest.mark.slow
def test_a_nan_condition_raises_from_the_cuda_kernel_under_the_simulator():
    pytest.importorskip("numba.cuda")
    assert_runs_under_cuda_simulator(NAN_CUDA_SCRIPT)
