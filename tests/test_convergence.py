"""Observed global order of every method, and of its dense output, with fixed steps."""

from __future__ import annotations

import numpy as np
import pytest

import dxode

from matrix import ADAPTIVE, EXPLICIT, method_id
from problems import OSCILLATOR

# Step sizes large enough that round-off stays far below the truncation error.
STEPS = {
    dxode.Euler: [0.02, 0.01, 0.005, 0.0025],
    dxode.RK4: [0.2, 0.1, 0.05, 0.025],
    dxode.BS3: [0.2, 0.1, 0.05, 0.025],
    dxode.DP5: [0.4, 0.2, 0.1, 0.05],
    dxode.Tsit5: [0.2, 0.1, 0.05, 0.025],
    dxode.Vern7: [0.5, 0.25, 0.125],
}


def _slope(hs, errors):
    return np.polyfit(np.log(hs), np.log(errors), 1)[0]


def _solve_fixed(alg, dt, **kwargs):
    prob = dxode.ODEProblem(OSCILLATOR.f, OSCILLATOR.u0, (0.0, 4.0))
    return dxode.solve(prob, alg(), dt=dt, adaptive=False, **kwargs)


@pytest.mark.parametrize("alg", EXPLICIT, ids=method_id)
def test_global_order_matches_theory(alg):
    errors = []
    for dt in STEPS[alg]:
        sol = _solve_fixed(alg, dt)
        errors.append(np.max(np.abs(sol.u[-1] - OSCILLATOR.exact(4.0))))
    assert _slope(STEPS[alg], errors) == pytest.approx(alg().order, abs=0.35)


@pytest.mark.parametrize("alg", EXPLICIT, ids=method_id)
def test_dense_output_order_matches_theory(alg):
    # Between steps, the error is the global error (order p) plus the interpolant's local error
    # (order q + 1), so the observed order is min(p, q + 1).
    tableau = alg.tableau
    expected = min(tableau.order, tableau.interpolant_order + 1)
    errors = []
    for dt in STEPS[alg]:
        sol = _solve_fixed(alg, dt)
        times = np.arange(0.37, 3.9, 0.5) * 1.0
        exact = np.array([OSCILLATOR.exact(t) for t in times])
        errors.append(np.max(np.abs(sol(times) - exact)))
    assert _slope(STEPS[alg], errors) >= expected - 0.35


@pytest.mark.parametrize("alg", ADAPTIVE, ids=method_id)
def test_adaptive_error_falls_with_tolerance(alg):
    # Tolerance proportionality: the global error tracks the tolerance over 4 decades.
    prob = dxode.ODEProblem(OSCILLATOR.f, OSCILLATOR.u0, (0.0, 4.0))
    tols = [1e-4, 1e-6, 1e-8]
    errors = [
        np.max(np.abs(dxode.solve(prob, alg(), rtol=t, atol=t).u[-1] - OSCILLATOR.exact(4.0)))
        for t in tols
    ]
    assert _slope(tols, errors) == pytest.approx(1.0, abs=0.3)
