"""saveat, dense output, tstops, backward integration, statistics and step-size options."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

import dxode

from problems import DECAY, decay, oscillator


def _oscillator(tspan=(0.0, 2.0)):
    return dxode.ODEProblem(oscillator, [1.0, 0.0], tspan)


def test_default_saves_every_step_with_dense_output():
    sol = dxode.solve(_oscillator(), rtol=1e-8, atol=1e-8)
    assert float(sol.t[0]) == 0.0 and float(sol.t[-1]) == 2.0
    assert len(sol.t) == sol.stats.naccept + 1
    assert np.all(np.diff(sol.t) > 0)
    np.testing.assert_allclose(sol.u[:, 0], np.cos(sol.t), atol=1e-7)
    np.testing.assert_allclose(sol(1.234), [math.cos(1.234), -math.sin(1.234)], atol=1e-7)
    assert sol(1.234).shape == (2,)
    assert sol([0.1, 0.2, 0.3]).shape == (3, 2)
    np.testing.assert_array_equal(sol(sol.t[5]), sol.u[5])


def test_saveat_interval_and_array():
    sol = dxode.solve(_oscillator(), saveat=0.3, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(sol.t, [0, 0.3, 0.6, 0.9, 1.2, 1.5, 1.8, 2.0])
    np.testing.assert_allclose(sol.u[:, 0], np.cos(sol.t), atol=1e-7)
    sol = dxode.solve(_oscillator(), saveat=[0.25, 1.0], rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(sol.u[:, 0], np.cos([0.25, 1.0]), atol=1e-7)


@pytest.mark.parametrize("tspan", [(1e6, 1e6 + 0.3), (1e6 + 0.3, 1e6), (0.0, 0.3)])
def test_saveat_interval_saves_its_end_once_far_from_zero(tspan):
    # t0 + 3 * 0.1 rounds to t1 = 1e6 + 0.3 itself, though the stored span is 0.3 + 4.7e-11.
    prob = dxode.ODEProblem(decay, [1.0], tspan, 1.0)
    sol = dxode.solve(prob, saveat=0.1, rtol=1e-10, atol=1e-10)
    assert sol.t.shape == (4,) and float(sol.t[-1]) == tspan[1]
    np.testing.assert_allclose(np.abs(np.diff(sol.t)), 0.1, rtol=1e-9)
    np.testing.assert_allclose(sol.u[:, 0], np.exp(-(sol.t - tspan[0])), rtol=1e-9)


def test_saveat_with_dense_keeps_interpolation():
    sol = dxode.solve(_oscillator(), saveat=[1.0], dense=True, rtol=1e-8, atol=1e-8)
    assert sol.t.shape == (1,)
    np.testing.assert_allclose(sol(0.5)[0], math.cos(0.5), atol=1e-7)


def test_many_save_points_within_one_step():
    # Far more save points than steps: several per step, all filled from the interpolant.
    sol = dxode.solve(_oscillator(), saveat=np.linspace(0, 2, 401), rtol=1e-6, atol=1e-6)
    assert sol.stats.naccept < 100
    np.testing.assert_allclose(sol.u[:, 0], np.cos(sol.t), atol=1e-5)


@pytest.mark.parametrize("alg", [dxode.Tsit5, dxode.Vern7], ids=["tsit5", "vern7"])
def test_a_step_fills_all_its_save_points_with_one_interpolation(alg, monkeypatch):
    # A dense grid (plotting) puts hundreds of save points in one step: they were filled
    # one interpolation (and a dozen array calls) each, 59 s for 10^6 points of a Lorenz solve
    # that takes 0.1 s (now 0.65 s). Same values and statistics as one at a time.
    from dxode.solvers import Step

    calls = []
    interpolate = Step.interpolate
    monkeypatch.setattr(Step, "interpolate", lambda s, th: calls.append(1) or interpolate(s, th))
    times = np.linspace(0, 2, 4001)
    sol = dxode.solve(_oscillator(), alg(), saveat=times, rtol=1e-6, atol=1e-6)
    assert len(calls) <= sol.stats.naccept < 100
    np.testing.assert_allclose(sol.u[:, 0], np.cos(sol.t), atol=1e-5)
    few = dxode.solve(_oscillator(), alg(), saveat=times[::400], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(sol.u[::400], few.u)
    extra = alg().interpolation_rhs_evals  # Vern7's extra stages, per save point
    assert sol.stats.nf - few.stats.nf == extra * (len(times) - len(few.t))


def test_the_discrete_adjoint_through_many_save_points_per_step():
    # its replay reads the save points' rounds (each lane's k-th point of a step), which the
    # one interpolation per step now builds from the grid; against finite differences
    import autograd

    times = np.linspace(0, 2, 801)

    def spring(u, p, t):
        x, v = u
        return [v, -p[0] * x - 0.1 * v]

    def loss(k):
        prob = dxode.ODEProblem(spring, [1.0, 0.0], (0.0, 2.0), (k,))
        sol = dxode.solve(
            prob, saveat=times, rtol=1e-10, atol=1e-10, sensealg=dxode.DiscreteAdjoint()
        )
        return (sol.u[:, 0] ** 2).sum()

    h = 1e-6
    fd = (loss(1.0 + h) - loss(1.0 - h)) / (2 * h)
    assert abs(fd) > 1.0
    np.testing.assert_allclose(autograd.grad(loss)(1.0), fd, rtol=1e-6)


def test_tstops_are_hit_exactly():
    stops = [0.123, 0.777, 1.5]
    sol = dxode.solve(_oscillator(), tstops=stops)
    for stop in stops:
        assert np.any(sol.t == stop)


def test_tstops_with_a_discontinuous_rhs():
    # f jumps at t = 1; stepping to t = 1 exactly keeps full accuracy.
    def f(u, p, t):
        return -u if t < 1.0 else -2.0 * u

    prob = dxode.ODEProblem(f, [1.0], (0.0, 2.0))
    with_stop = dxode.solve(prob, tstops=[1.0], rtol=1e-8, atol=1e-10, saveat=[2.0])
    assert with_stop.u[-1, 0] == pytest.approx(math.exp(-3.0), rel=1e-6)


@pytest.mark.parametrize("alg", [dxode.Tsit5, dxode.Vern7, dxode.BS3])
def test_backward_integration(alg):
    prob = dxode.ODEProblem(oscillator, [math.cos(2.0), -math.sin(2.0)], (2.0, 0.0))
    sol = dxode.solve(prob, alg(), rtol=1e-8, atol=1e-8, saveat=[1.5, 1.0, 0.0], dense=True)
    assert sol.retcode == dxode.ReturnCode.Success
    np.testing.assert_allclose(sol.u[:, 0], np.cos([1.5, 1.0, 0.0]), atol=1e-6)
    np.testing.assert_allclose(sol(0.5)[0], math.cos(0.5), atol=1e-6)
    every = dxode.solve(prob, alg(), rtol=1e-8, atol=1e-8)
    assert np.all(np.diff(every.t) < 0) and float(every.t[-1]) == 0.0


def test_backward_fixed_step():
    prob = dxode.ODEProblem(decay, [1.0], (1.0, 0.0), 1.0)
    sol = dxode.solve(prob, dxode.RK4(), dt=0.01)
    assert sol.u[-1, 0] == pytest.approx(math.e, rel=1e-8)


def test_stats_count_rhs_evaluations():
    calls = []

    def f(u, p, t):
        calls.append(t)
        return -u

    sol = dxode.solve(dxode.ODEProblem(f, [1.0], (0.0, 3.0)), dxode.Tsit5())
    attempts = sol.stats.naccept + sol.stats.nreject
    # One call to check f, one for the initial step, six new stages per attempt (FSAL).
    assert sol.stats.nf == 2 + 6 * attempts == len(calls)
    fixed = dxode.solve(dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0), dxode.RK4(), dt=0.1)
    assert fixed.stats.naccept == 10 and fixed.stats.nreject == 0 and fixed.stats.nf == 1 + 4 * 10


def test_stats_count_vern7_interpolation_stages():
    prob = dxode.ODEProblem(decay, [1.0], (0.0, 3.0), 1.0)
    plain = dxode.solve(prob, dxode.Vern7(), saveat=[3.0])
    interpolated = dxode.solve(prob, dxode.Vern7(), saveat=[0.5, 3.0])
    assert interpolated.stats.nf == plain.stats.nf + 6


def test_dtmax_and_initial_dt():
    sol = dxode.solve(_oscillator(), dtmax=0.01)
    assert np.max(np.diff(sol.t)) <= 0.01 + 1e-15
    sol = dxode.solve(_oscillator(), dt=1e-4)
    assert float(sol.t[1]) == pytest.approx(1e-4)


def test_per_component_atol():
    prob = dxode.ODEProblem(DECAY.f, DECAY.u0, DECAY.tspan, DECAY.p)
    loose = dxode.solve(prob, rtol=1e-12, atol=np.array([1e-2, 1e-2, 1e-2]))
    tight = dxode.solve(prob, rtol=1e-12, atol=np.array([1e-2, 1e-10, 1e-2]))
    assert tight.stats.naccept > loose.stats.naccept


def test_tighter_tolerance_takes_more_steps_and_is_more_accurate():
    loose = dxode.solve(_oscillator(), rtol=1e-4, atol=1e-4, saveat=[2.0])
    tight = dxode.solve(_oscillator(), rtol=1e-9, atol=1e-9, saveat=[2.0])
    assert tight.stats.naccept > 3 * loose.stats.naccept
    assert abs(tight.u[-1, 0] - math.cos(2)) < abs(loose.u[-1, 0] - math.cos(2))


def test_remake():
    prob = dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0)
    other = prob.remake(p=2.0, tspan=(0.0, 2.0))
    assert other.p == 2.0 and other.tspan == (0.0, 2.0) and prob.p == 1.0
    assert dxode.solve(other, saveat=[2.0], rtol=1e-8).u[-1, 0] == pytest.approx(
        math.exp(-4), rel=1e-6
    )
    with pytest.raises(ValueError, match="non-finite"):
        prob.remake(u0=[math.nan])


def test_fixed_steps_that_divide_the_span_leave_no_sliver():
    prob = dxode.ODEProblem(decay, [1.0], (0.0, 50.0), 1.0)
    assert dxode.solve(prob, dxode.RK4(), dt=0.01).stats.naccept == 5000


def test_failure_before_the_first_save_point_gives_nan_not_a_crash():
    prob = dxode.ODEProblem(decay, [1.0], (0.0, 100.0), 1.0)
    sol = dxode.solve(prob, saveat=[50.0], maxiters=10)
    assert sol.retcode == dxode.ReturnCode.MaxIters
    assert sol.u.shape == (1, 1) and np.isnan(sol.u[0, 0])


@pytest.mark.parametrize("alg", [dxode.Vern7, dxode.Tsit5, dxode.BS3])
def test_dense_output_at_many_times_equals_one_at_a_time_bitwise(alg):
    # Scalar states and 16-stage interpolants included: sums run in order, never pairwise.
    sol = dxode.solve(dxode.ODEProblem(decay, [1.0], (0.0, 2.0), 1.0), alg(), rtol=1e-8)
    times = np.linspace(0.05, 1.95, 13)
    together = sol(times)
    for i, t in enumerate(times):
        np.testing.assert_array_equal(together[i], sol(t))


def test_every_step_without_dense_output():
    # Every step saved, but only the step end states kept (no stages): no interpolation.
    prob = dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 2.0))
    dense = dxode.solve(prob, rtol=1e-8, atol=1e-8)
    states = dxode.solve(prob, rtol=1e-8, atol=1e-8, dense=False)
    np.testing.assert_array_equal(states.t, dense.t)
    np.testing.assert_array_equal(states.u, dense.u)
    with pytest.raises(ValueError, match="no dense output"):
        states(1.0)


@pytest.mark.parametrize("alg", [dxode.Rodas5P(), dxode.Rodas4(), dxode.TRBDF2()])
def test_stiff_save_points_made_stops_meet_the_tolerance(alg):
    # The saving guide's Prothero-Robinson advice (lambda = 1e9, rtol = 1e-8): the
    # interpolant between the long steps is off by up to 0.2 (f amplifies the state's error
    # by lambda), the step ends are not; save times that are also stops are step ends.
    def f(u, p, t):
        return -1e9 * (u - np.cos(t)) - np.sin(t)

    prob = dxode.ODEProblem(f, [1.0], (0.0, 10.0))
    grid = np.linspace(0.0, 10.0, 11)
    sol = dxode.solve(prob, alg, saveat=grid, tstops=grid, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(sol.u[:, 0], np.cos(grid), rtol=0, atol=1e-9)


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Vern7(), dxode.Rodas5P()])
def test_a_solution_with_dense_output_pickles_and_copies(alg):
    # Solutions go to other processes (multiprocessing, Dask) by plain pickle: the dense
    # output kept the backend's array module and the RHS as a closure, neither of which
    # pickles (cloudpickle copes, pickle did not).
    sol = dxode.solve(dxode.ODEProblem(decay, [1.0, 2.0], (0.0, 2.0), 1.5), alg, rtol=1e-8)
    times = np.linspace(0.0, 2.0, 9)
    for back in (pickle.loads(pickle.dumps(sol)), copy.deepcopy(sol)):
        np.testing.assert_array_equal(back.u, sol.u)
        np.testing.assert_array_equal(back(times), sol(times))
