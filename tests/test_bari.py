"""dxode's stiff methods on the Bari test set: the published reference at the test set's tolerances.

Each method must reach an expected number of significant correct digits (scd, see
``stiff_problems.scd``) at the tolerances in ``stiff_problems`` (deTestSet's defaults). The
thresholds are about half a digit under what each method reached on 2026-11-21; for comparison,
SciPy at the same tolerances with the analytic Jacobian reached (Radau / BDF): hires 4.8 / 2.8,
vdpol 8.2 / 4.8, orego 7.4 / 4.2, pollu 5.4 / 4.2, rober 10.1 / 5.9. A method with a wrong
Jacobian or an error estimate that does not control the error falls below them (checked by hand
with a Jacobian missing one term, and with rtol 100x looser). TRBDF2 reached hires 2.6,
pollu 3.6, vdpol 4.0, orego 3.0, rober 4.8 (and 1.4, 2.9, 2.8, 1.7 on the first four with
rtol and atol 100x looser); its Newton iteration corrects an inexact Jacobian, which then
costs iterations rather than digits.

E5's reference splits ``y2`` and ``y3`` only to about three digits (see
``test_stiff_problems``), so E5 asks for 2.8 digits of Rodas5P (3.3 reached; Rosenbrock23
reaches 2.4 in 11,000 steps and is not run). Rodas4 drifts off E5's linear invariant
``y2 - y3 - y4 = 0`` at the test set's tolerances (by 2e-22, scd -0.2): a known issue.
"""

from __future__ import annotations

import numpy as np
import pytest
from stiff_problems import E5, HIRES, OREGO, POLLU, ROBER, VDPOL, StiffProblem, scd

import dxode

# (problem, method) -> minimum scd; (problem, method) pairs slower than ~5 s are marked slow.
EXPECTED = {
    (HIRES, "Rodas5P"): 3.5,
    (HIRES, "Rodas4"): 3.7,
    (HIRES, "Rosenbrock23"): 2.4,
    (POLLU, "Rodas5P"): 5.6,
    (POLLU, "Rodas4"): 4.9,
    (POLLU, "Rosenbrock23"): 3.2,
    (VDPOL, "Rodas5P"): 5.8,
    (VDPOL, "Rodas4"): 6.5,
    (VDPOL, "Rosenbrock23"): 4.1,
    (OREGO, "Rodas5P"): 5.9,
    (OREGO, "Rodas4"): 5.6,
    (OREGO, "Rosenbrock23"): 3.0,
    (ROBER, "Rodas5P"): 7.4,
    (ROBER, "Rodas4"): 7.7,
    (E5, "Rodas5P"): 2.8,
    (HIRES, "TRBDF2"): 2.0,
    (POLLU, "TRBDF2"): 3.1,
    (VDPOL, "TRBDF2"): 3.5,
    (OREGO, "TRBDF2"): 2.5,
    (ROBER, "TRBDF2"): 4.3,
}
SLOW = {
    (VDPOL, "Rosenbrock23"),
    (OREGO, "Rosenbrock23"),
    (ROBER, "Rodas5P"),
    (ROBER, "Rodas4"),
    (OREGO, "TRBDF2"),
    (ROBER, "TRBDF2"),
}


def solve_final(problem: StiffProblem, method: str, rtol: float, atol: float) -> np.ndarray:
    prob = dxode.ODEProblem(problem.f, list(problem.u0), problem.tspan, problem.p, jac=problem.jac)
    sol = dxode.solve(
        prob, getattr(dxode, method)(), rtol=rtol, atol=atol, saveat=[problem.tspan[1]]
    )
    assert sol.retcode == dxode.ReturnCode.Success, sol.retcode
    return np.asarray(sol.u)[-1]


def _cases():
    for (problem, method), minimum in EXPECTED.items():
        marks = [pytest.mark.slow] if (problem, method) in SLOW else []
        yield pytest.param(problem, method, minimum, marks=marks, id=f"{problem.name}-{method}")


@pytest.mark.parametrize(("problem", "method", "minimum"), list(_cases()))
def test_reaches_reference_at_test_set_tolerances(problem, method, minimum):
    if not hasattr(dxode, method):
        pytest.skip(f"dxode has no {method}")
    u = solve_final(problem, method, problem.rtol, problem.atol)
    assert scd(u, problem) >= minimum


def test_robertson_ensemble_with_per_lane_stiffness_equals_each_alone():
    """Lanes with k1 from 0.5x to 10x step differently; each equals its own single solve."""
    scales = np.array([0.5, 1.0, 2.0, 10.0])
    params = np.tile(np.asarray(ROBER.p or (0.04, 3e7, 1e4)), (scales.size, 1))
    params[:, 0] *= scales
    tspan, saves = (0.0, 1e3), np.logspace(-3.0, 3.0, 7)
    prob = dxode.ODEProblem(ROBER.f, list(ROBER.u0), tspan, tuple(params[0]), jac=ROBER.jac)
    options = {"rtol": 1e-6, "atol": 1e-10, "saveat": saves}
    ens = dxode.solve(
        dxode.EnsembleProblem(prob, p=params),
        dxode.Rodas5P(),
        dxode.EnsembleArray(),
        trajectories=scales.size,
        **options,
    )
    assert ens.success
    steps = ens.stats.naccept + ens.stats.nreject
    assert len(set(np.asarray(steps).tolist())) > 1  # the lanes really took their own steps
    for i, p in enumerate(params):
        alone = dxode.solve(prob.remake(p=tuple(p)), dxode.Rodas5P(), **options)
        np.testing.assert_allclose(np.asarray(ens.u)[i], np.asarray(alone.u), rtol=1e-12, atol=0)
