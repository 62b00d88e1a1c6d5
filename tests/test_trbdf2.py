"""TRBDF2: L-stability, the per-lane Newton iteration and its failures, work counts, backends.

Accuracy against SciPy's Radau, the observed order, dense output, float32 and ensembles of very
different stiffness are checked with the other stiff methods in ``test_stiff.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import dxode
from dxode.backends import get_backend
from dxode.solvers.newton import solve_stage

from conftest import to_numpy


def decay(u, p, t):
    return [p * u[0]]


def decay_jac(u, p, t):
    return [[p + 0.0 * u[0]]]


def test_stiff_decay_is_damped_in_one_step():
    """L-stability: with h |lambda| = 1e7 the trapezoidal rule would give about -1 per step."""
    prob = dxode.ODEProblem(decay, [1.0], (0.0, 1.0), -1e8)
    sol = dxode.solve(prob, dxode.TRBDF2(), adaptive=False, dt=0.1)
    u = np.abs(sol.u[:, 0])
    assert u[1] < 1e-6
    assert np.all(u[1:] <= 1e-6 * u[:-1])


def test_stiff_component_stays_on_the_slow_solution():
    """Prothero-Robinson with lambda = -1e8 from off the slow manifold: large fixed steps."""

    def f(u, p, t):
        return [p * (u[0] - np.sin(t)) + np.cos(t)]

    prob = dxode.ODEProblem(f, [1.0], (0.0, 1.0), -1e8)
    sol = dxode.solve(prob, dxode.TRBDF2(), adaptive=False, dt=0.1)
    deviation = sol.u[:, 0] - np.sin(sol.t)
    assert abs(deviation[1]) < 1e-6
    assert np.all(np.abs(deviation[2:]) < 1e-10)


def test_order_two_on_a_stiff_problem():
    """No order reduction on Prothero-Robinson with lambda = -1e6 (stiffly accurate)."""

    def f(u, p, t):
        return [p * (u[0] - np.sin(t)) + np.cos(t)]

    prob = dxode.ODEProblem(f, [0.0], (0.0, 2.0), -1e6)
    errors = [
        abs(dxode.solve(prob, "trbdf2", adaptive=False, dt=2.0 / n).u[-1, 0] - np.sin(2.0))
        for n in (20, 40)
    ]
    assert 1.7 < np.log2(errors[0] / errors[1]) < 2.5


def test_work_counts_on_a_linear_problem():
    """Exact Jacobian, linear f: the stages take one and two Newton iterations."""

    def f(u, p, t):
        return [-1e3 * u[0] + u[1], -u[1]]

    def jac(u, p, t):
        zero = 0.0 * u[0]
        return [[-1e3 + zero, 1.0 + zero], [zero, -1.0 + zero]]

    prob = dxode.ODEProblem(f, [1.0, 1.0], (0.0, 1.0), jac=jac)
    sol = dxode.solve(prob, dxode.TRBDF2(), rtol=1e-5, atol=1e-8)
    attempts = sol.stats.naccept + sol.stats.nreject
    assert sol.stats.njac == sol.stats.nlu == attempts
    # f(u0) and the initial step's probe; per attempt f at its start, one iteration for the
    # trapezoidal stage (its linearly implicit predictor solves a linear stage exactly, so
    # the first correction vanishes) and two for the BDF2 stage (the second one confirms).
    assert sol.stats.nf == 2 + 4 * attempts


def test_newton_lanes_stop_on_their_own():
    """A lane with a wrong-signed Jacobian diverges; the others converge as they would alone."""
    backend = get_backend("numpy")
    lam = np.array([-1e3, -1e3, -10.0])
    jac_sign = np.array([1.0, -1.0, 1.0])  # lane 1's W uses +|lambda|: the iteration diverges
    dh = np.full(3, 0.1)
    factors = backend.lu_factor((1.0 - dh * lam * jac_sign)[None, None, :])

    def rhs(y, t, lanes=slice(None)):
        return lam[lanes] * y

    base = np.ones((1, 3))
    args = (np.zeros(3), base, dh, base, factors, np.ones((1, 3)), np.ones(3, dtype=bool))
    out = solve_stage(backend, rhs, *args, kappa=1e-2, max_iters=10)
    np.testing.assert_array_equal(out.converged, [True, False, True])
    np.testing.assert_allclose(out.y[0, [0, 2]], 1.0 / (1.0 - dh[[0, 2]] * lam[[0, 2]]))
    assert out.iterations[1] < 10  # divergence is detected early
    for lane in (0, 2):
        alone = solve_stage(
            backend,
            lambda y, t, lane=lane: rhs(y, t, slice(lane, lane + 1)),
            np.zeros(1),
            base[:, :1],
            dh[:1],
            base[:, :1],
            backend.lu_factor((1.0 - dh[:1] * lam[lane])[None, None, :]),
            np.ones((1, 1)),
            np.ones(1, dtype=bool),
            kappa=1e-2,
            max_iters=10,
        )
        np.testing.assert_array_equal(alone.y[:, 0], out.y[:, lane])
        assert alone.iterations[0] == out.iterations[lane]


def test_a_lane_whose_newton_fails_shrinks_its_own_steps():
    """A wrong Jacobian in one lane: its Newton fails at large steps, then small ones work."""

    def f(u, p, t):
        return [p[0] * (u[0] - np.sin(t)) + np.cos(t)]

    def jac(u, p, t):  # p[1] = -1 flips the sign: only steps with h |lambda| < ~3 converge
        # (after t = 0: a jac flipped at u0 is refused before the first step)
        return [[p[0] * np.where(t > 0, p[1], 1.0) + 0.0 * u[0]]]

    prob = dxode.ODEProblem(f, [0.0], (0.0, 0.1), (-1e4, 1.0), jac=jac)
    params = (np.full(3, -1e4), np.array([1.0, -1.0, 1.0]))
    opts = {"rtol": 1e-4, "atol": 1e-8, "saveat": [0.05, 0.1]}
    sim = dxode.solve(dxode.EnsembleProblem(prob, p=params), "trbdf2", trajectories=3, **opts)
    assert np.all(sim.retcodes == int(dxode.ReturnCode.Success))
    np.testing.assert_allclose(sim.u[::2, :, 0], np.sin([[0.05, 0.1]] * 2), atol=1e-7)
    # Lane 1's ~4,000 steps and ~1,000 failed Newton iterations are a path that rounding in
    # the last bits reshuffles (its error was 5.7e-8, 1.8e-7 once steps were rounded to how
    # far they move t): bound it by a tenth of its tolerance (atol + rtol |u| ~ 1e-5).
    np.testing.assert_allclose(sim.u[1, :, 0], np.sin([0.05, 0.1]), atol=1e-6)
    assert sim.stats.nreject[0] == sim.stats.nreject[2] == 0
    assert sim.stats.nreject[1] > 100  # every step that grows past h |lambda| ~ 3 fails
    alone = dxode.solve(
        dxode.EnsembleProblem(prob, p=(params[0][:1], params[1][:1])),
        "trbdf2",
        trajectories=1,
        **opts,
    )
    np.testing.assert_array_equal(alone.u[0], sim.u[0])
    np.testing.assert_array_equal(alone.u[0], sim.u[2])
    assert alone.stats.nf[0] == sim.stats.nf[0] == sim.stats.nf[2]


def test_a_lane_that_cannot_converge_ends_with_dt_less_than_min():
    """u' = p (1 + u^2) blows up at t = pi / (2p): the other lane finishes."""

    def f(u, p, t):
        return [p * (1.0 + u[0] * u[0])]

    prob = dxode.ODEProblem(f, [0.0], (0.0, 2.0), 1.0)
    sim = dxode.solve(
        dxode.EnsembleProblem(prob, p=np.array([0.5, 1.0])), "trbdf2", trajectories=2, saveat=[1.0]
    )
    codes = [dxode.ReturnCode(int(c)) for c in sim.retcodes]
    assert codes == [dxode.ReturnCode.Success, dxode.ReturnCode.DtLessThanMin]
    np.testing.assert_allclose(sim.u[0, 0, 0], np.tan(0.5), rtol=1e-2)


def test_newton_failure_with_fixed_steps_stops_that_lane():
    def f(u, p, t):
        return [-p[0] * u[0]]

    def jac(u, p, t):  # p[1] = -1 flips the sign after t = 0 (at u0 it would be refused)
        return [[-p[0] * np.where(t > 0, p[1], 1.0) + 0.0 * u[0]]]

    prob = dxode.ODEProblem(f, [1.0], (0.0, 1.0), (1e4, 1.0), jac=jac)
    eprob = dxode.EnsembleProblem(prob, p=(np.full(2, 1e4), np.array([1.0, -1.0])))
    sim = dxode.solve(eprob, "trbdf2", trajectories=2, adaptive=False, dt=0.1, saveat=[1.0])
    codes = [dxode.ReturnCode(int(c)) for c in sim.retcodes]
    assert codes == [dxode.ReturnCode.Success, dxode.ReturnCode.Unstable]
    assert "Newton" in dxode.ReturnCode.Unstable.message


def test_array_api_backends(xp):
    def linear(u, p, t):
        return xp.stack([-1000.0 * u[0, ...] + u[1, ...], -0.5 * u[1, ...]])

    def linear_one(u, p, t):
        return linear(u[:, None], p, t)[:, 0]

    prob = dxode.ODEProblem(linear_one, xp.asarray([1.0, 1.0]), (0.0, 2.0))
    sol = dxode.solve(prob, dxode.TRBDF2(), rtol=1e-5, atol=1e-8, saveat=[2.0])
    assert sol.retcode == dxode.ReturnCode.Success
    c = 1.0 / 999.5
    exact = [(1 - c) * np.exp(-2000.0) + c * np.exp(-1.0), np.exp(-1.0)]
    np.testing.assert_allclose(to_numpy(sol.u)[-1], exact, rtol=1e-4)


def test_configure_leaves_the_users_instance_alone():
    alg = dxode.TRBDF2()
    configured = alg.configure(1e-6, 1e-9)
    assert configured is not alg
    backend = get_backend("numpy")
    args = (backend, lambda u, t, out=None: -u, np.zeros(1), np.ones((1, 1)), -np.ones((1, 1)))
    with pytest.raises(RuntimeError, match="configure"):
        alg.step(*args, np.full(1, 0.1))
    result = configured.step(*args, np.full(1, 0.1))
    assert not bool(result.failed[0])
    explicit = dxode.Tsit5()
    assert explicit.configure(1e-6, 1e-9) is explicit


def test_options_and_repr():
    assert repr(dxode.TRBDF2()) == "TRBDF2()"
    assert repr(dxode.TRBDF2(kappa=0.1, max_iters=5)) == "TRBDF2(kappa=0.1, max_iters=5)"
    with pytest.raises(ValueError, match="kappa"):
        dxode.TRBDF2(kappa=2.0)
    with pytest.raises(ValueError, match="max_iters"):
        dxode.TRBDF2(max_iters=0)
    with pytest.raises(ValueError, match="autodiff"):
        dxode.TRBDF2(autodiff="forward")
    # NumPy scalars were refused ("kappa must be a number in (0, 1), got np.float32(0.1)").
    numpy_scalars = dxode.TRBDF2(kappa=np.float32(0.1), max_iters=np.int64(5))
    assert repr(numpy_scalars) == "TRBDF2(kappa=0.10000000149011612, max_iters=5)"
    assert type(numpy_scalars.max_iters) is int


def test_an_approximate_jacobian_costs_iterations_not_accuracy():
    """Robertson with a Jacobian missing its d/dy3 terms: same steps and error as the exact one."""

    def robertson(u, p, t):
        y1, y2, y3 = u
        return [-0.04 * y1 + 1e4 * y2 * y3, 0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2**2, 3e7 * y2**2]

    def jac(u, p, t, exact=True):
        _, y2, y3 = u
        d3 = 1e4 * y2 if exact else 0.0 * y2
        return [[-0.04, 1e4 * y3, d3], [0.04, -1e4 * y3 - 6e7 * y2, -d3], [0.0, 6e7 * y2, 0.0]]

    prob = dxode.ODEProblem(robertson, [1.0, 0.0, 0.0], (0.0, 1e3), jac=jac)
    opts = {"rtol": 1e-5, "atol": 1e-9, "saveat": [1e3]}
    exact = dxode.solve(prob, dxode.TRBDF2(), **opts)
    rough = dxode.solve(prob.remake(jac=lambda u, p, t: jac(u, p, t, False)), "trbdf2", **opts)
    assert exact.retcode == rough.retcode == dxode.ReturnCode.Success
    np.testing.assert_allclose(rough.u[-1], exact.u[-1], rtol=1e-3)
    assert rough.stats.naccept < 1.2 * exact.stats.naccept
    assert rough.stats.nf > exact.stats.nf  # the price: more Newton iterations
