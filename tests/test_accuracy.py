"""Accuracy against analytic solutions, DETEST (via SciPy's DOP853) and the Arenstorf orbit.

Errors are measured in units of the requested tolerance, ``|u - ref| / (atol + rtol |ref|)``.
"""

from __future__ import annotations

import numpy as np
import pytest

import dxode

from matrix import ADAPTIVE
from problems import (
    ARENSTORF,
    DECAY,
    DETEST,
    OSCILLATOR,
    PLEIADES,
    scipy_reference,
    scipy_rk45,
)

HIGH_ORDER = ADAPTIVE[1:]  # fifth order and up: DP5, Tsit5, Vern7


def scaled_error(u, ref, rtol, atol):
    return np.max(np.abs(u - ref) / (atol + rtol * np.abs(ref)))


# BS3 is a low-order method: at 1e-10 it would need ~10^5 steps, so it stops at 1e-7.
TOLERANCE_CASES = [
    (alg, tol)
    for alg in ADAPTIVE
    for tol in (1e-4, 1e-7, 1e-10)
    if not (alg is dxode.BS3 and tol < 1e-9)
]


@pytest.mark.parametrize(("alg", "tol"), TOLERANCE_CASES, ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize("problem", [DECAY, OSCILLATOR], ids=lambda p: p.name)
def test_analytic_solutions_within_tolerance(alg, tol, problem):
    prob = dxode.ODEProblem(problem.f, problem.u0, problem.tspan, problem.p)
    times = np.linspace(*problem.tspan, 9)
    sol = dxode.solve(prob, alg(), saveat=times, rtol=tol, atol=tol)
    assert sol.retcode == dxode.ReturnCode.Success
    exact = np.array([problem.exact(t) for t in times])
    assert scaled_error(sol.u, exact, tol, tol) < 20


@pytest.mark.parametrize("alg", HIGH_ORDER)
@pytest.mark.parametrize("problem", DETEST, ids=lambda p: p.name)
def test_detest_against_scipy_dop853(alg, problem):
    tol = 1e-8
    prob = dxode.ODEProblem(problem.f, problem.u0, problem.tspan, problem.p)
    times = np.linspace(*problem.tspan, 21)
    sol = dxode.solve(prob, alg(), saveat=times, rtol=tol, atol=tol)
    assert sol.retcode == dxode.ReturnCode.Success
    ref = scipy_reference(problem, times)
    # Global errors grow with the interval and with the problem's sensitivity (D5 is a very
    # eccentric orbit), so bound them by SciPy's RK45 at the same tolerance, or 50 tolerances.
    peer = scipy_rk45(problem, times, tol)
    assert scaled_error(sol.u, ref, tol, tol) < max(50.0, 1.5 * scaled_error(peer, ref, tol, tol))


@pytest.mark.parametrize("alg", HIGH_ORDER)
def test_arenstorf_orbit_closes(alg):
    tol = 1e-10
    prob = dxode.ODEProblem(ARENSTORF.f, ARENSTORF.u0, ARENSTORF.tspan)
    sol = dxode.solve(prob, alg(), rtol=tol, atol=tol, saveat=[ARENSTORF.tspan[1]])
    assert sol.retcode == dxode.ReturnCode.Success
    end = sol.u[-1]
    # Published property of the orbit: it returns to its start after one period. The orbit
    # passes close to the moon, so the global error is many tolerances; bound it absolutely.
    np.testing.assert_allclose(end, ARENSTORF.exact(ARENSTORF.tspan[1]), atol=2e-5)


@pytest.mark.parametrize("alg", [dxode.DP5, dxode.Vern7])
def test_pleiades_reaches_the_bari_reference(alg):
    # 28 components, close encounters of the stars near t = 1.2 and 2.8
    prob = dxode.ODEProblem(PLEIADES.f, PLEIADES.u0, PLEIADES.tspan)
    sol = dxode.solve(prob, alg(), rtol=1e-10, atol=1e-10, saveat=[3.0])
    assert sol.retcode == dxode.ReturnCode.Success
    ref = PLEIADES.exact(3.0)
    # 1e-9 to 3e-9 relative to 1 + |ref| at rtol = 1e-10 (DP5, Tsit5, Vern7)
    assert np.max(np.abs(sol.u[-1] - ref) / (1 + np.abs(ref))) < 2e-8


def test_tight_tolerance_agrees_with_scipy_on_lorenz():
    def lorenz(u, p, t):
        x, y, z = u
        return [10.0 * (y - x), x * (28.0 - z) - y, x * y - 8.0 / 3.0 * z]

    from problems import Reference

    ref_problem = Reference("lorenz", lorenz, (1.0, 0.0, 0.0), (0.0, 5.0))
    prob = dxode.ODEProblem(lorenz, ref_problem.u0, ref_problem.tspan)
    times = np.linspace(0, 5, 11)
    sol = dxode.solve(prob, dxode.Vern7(), saveat=times, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sol.u, scipy_reference(ref_problem, times), rtol=1e-7, atol=1e-7)
