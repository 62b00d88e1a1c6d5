"""Spans far from t = 0: each step moves the state by exactly as far as its time moves.

Where ``t + h`` rounds by an amount that is not small against ``h`` (float32 from
``|t| ~ 1e3``, float64 from ``|t| ~ 1e8``; a Unix time stamp is ~1.7e9 s), a state advanced by
``h`` while its time advanced by ``fl(t + h) - t`` drifted off its time every step. On the
autonomous decay below, the error at the end was then far above the tolerance with a
``Success`` return code (float32 from ``t0 = 1e4``: 7e-4 at ``rtol = 1e-5``; float64 from
``t0 = 1e9``: 1.2e-7 at ``rtol = 1e-9``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dxode

from problems import lorenz


def decay(u, p, t):
    return -u


def _relative_error(t0, dtype, alg, rtol, kernel=False, **kwargs):
    prob = dxode.ODEProblem(decay, np.array([1.0], dtype), (t0, t0 + 3.0))
    sol = dxode.solve(
        prob, alg, rtol=rtol, atol=rtol * 1e-2, saveat=[t0 + 3.0], kernel=kernel, **kwargs
    )
    return sol, abs(float(sol.u[-1][0]) / math.exp(-3.0) - 1.0)


@pytest.mark.parametrize("alg", [dxode.Tsit5, dxode.Vern7, dxode.Rodas5P])
@pytest.mark.parametrize("t0", [1e4, 1e5])
def test_float32_far_from_zero_within_tolerance(alg, t0):
    sol, error = _relative_error(t0, np.float32, alg(), 1e-5)
    assert sol.retcode == dxode.ReturnCode.Success
    assert error < 5e-5


@pytest.mark.parametrize("alg", [dxode.Tsit5, dxode.Rodas5P])
@pytest.mark.parametrize("t0", [1.7e9, -1e12])
def test_float64_at_unix_time_scales_within_tolerance(alg, t0):
    sol, error = _relative_error(t0, np.float64, alg(), 1e-9)
    assert sol.retcode == dxode.ReturnCode.Success
    assert error < 5e-9


def test_fixed_steps_far_from_zero_move_state_and_time_together():
    # dt = 0.1 is not a float32 multiple of an ulp at t = 1e4 (ulp 2^-10): the steps taken
    # are the rounded ones, so RK4's error is its own truncation error, not the rounding's.
    sol, error = _relative_error(1e4, np.float32, dxode.RK4(), 1e-5, dt=0.1)
    assert sol.retcode == dxode.ReturnCode.Success
    assert error < 1e-5


def test_a_step_under_an_ulp_of_t_fails_instead_of_a_wrong_success():
    # float32 at t = 1e6 (ulp 0.0625): BS3 at rtol 1e-5 wants steps of ~0.05. It reported
    # Success with a 43% error; now a step either moves the time or the lane fails.
    sol, error = _relative_error(1e6, np.float32, dxode.BS3(), 1e-5)
    assert sol.retcode == dxode.ReturnCode.DtLessThanMin or error < 5e-5
    assert sol.retcode != dxode.ReturnCode.MaxIters  # a step rounded to 0 must not stall


def test_kernel_rounds_the_step_like_the_array_path():
    # The Lorenz kernel of test_kernel_agreement (same f, dtype, method and options), so a
    # test run compiles it once. Lorenz is autonomous: from t0 = 1e4 it is its own solution
    # from t0 = 0, where float32 rounds t + h finely.
    pytest.importorskip("numba")
    u0, p = np.array([1.0, 0.0, 0.0], dtype=np.float32), (10.0, 28.0, 8 / 3)
    options = {"saveat": 0.5, "rtol": 1e-4, "atol": 1e-4}
    far = dxode.ODEProblem(lorenz, u0, (1e4, 1e4 + 1.0), p)
    array = dxode.solve(far, "tsit5", **options)
    kernel = dxode.solve(far, "tsit5", kernel=True, **options)
    near = dxode.ODEProblem(lorenz, u0.astype(np.float64), (0.0, 1.0), p)
    reference = dxode.solve(near, "vern7", saveat=0.5, rtol=1e-10, atol=1e-10)
    assert kernel.retcode == array.retcode == dxode.ReturnCode.Success
    assert (kernel.stats.naccept, kernel.stats.nreject) == (
        array.stats.naccept,
        array.stats.nreject,
    )
    for sol in (array, kernel):
        np.testing.assert_allclose(sol.u, reference.u, rtol=2e-3, atol=2e-3)
