"""``df/dt`` without a user ``tgrad`` is differenced on each trajectory's own time scale.

A stiff problem forced on a time scale far below 1 (``u = sin(w t)`` with ``w = 1e9`` over
``tspan = (0, 1e-8)``) must take about the steps it takes with an exact ``tgrad``, on the
array path, in the compiled kernels and per lane of an ensemble whose spans differ by nine
orders of magnitude. (Differenced over ``sqrt(eps) max(|t|, 1)``, wider than the whole span,
Rodas5P hit ``maxiters`` = 1e5 there.) So must a forcing on the scale 1 far from ``t = 0``
(over ``sqrt(eps) |t|``, Rodas5P took 8416 steps over ``(1e6, 1e6 + 3)``, 15 with ``tgrad``).
Near ``t = 0``, spans of at least 1 keep the increment they had, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dxode
from dxode._jacobian import time_increment, time_scale

STIFFNESS = 1e4  # lam / w: the forcing is slow next to the decay towards it
OPTIONS = {"rtol": 1e-6, "atol": 1e-8, "maxiters": 2000}


def forced(u, p, t):
    """``u' = -lam (u - sin(w t)) + w cos(w t)``: ``u = sin(w t)`` on the time scale ``1/w``."""
    lam, w = p[0], p[1]
    return [-lam * (u[0] - np.sin(w * t)) + w * np.cos(w * t)]


def forced_tgrad(u, p, t):
    lam, w = p[0], p[1]
    return [lam * w * np.cos(w * t) - w * w * np.sin(w * t)]


def _problem(tspan, w, tgrad=None, dtype=np.float64):
    u0 = np.array([math.sin(w * tspan[0])], dtype=dtype)
    return dxode.ODEProblem(forced, u0, tspan, (STIFFNESS * w, w), tgrad=tgrad)


# (tspan, w): nanoseconds forward and backward, a short span far from t = 0, where an
# increment of sqrt(eps) max(|t|, span) would be 5e4 times the span (Rodas5P took 11258
# steps), and a span of 3 at t = 1e6, where sqrt(eps) |t| is 0.015.
SPANS = {
    "ns": ((0.0, 1e-8), 1e9),
    "ns-backward": ((1e-8, 0.0), 1e9),
    "short-at-large-t": ((0.5, 0.5 + 1e-5), 1e6),
    "unit-far-from-zero": ((1e6, 1e6 + 3.0), 1.0),
}
# Rosenbrock23 (order 2) needs 5000 steps at rtol = 1e-6 on these 1.6 periods, with the exact
# tgrad as without: it runs at rtol = 1e-3 (287 steps).
RTOL = {"Rodas5P": 1e-6, "Rodas4": 1e-6, "Rosenbrock23": 1e-3}


def _solve_both(tspan, w, alg, **kwargs):
    """Solutions without and with the exact ``tgrad``, saved at 5 points, and the points."""
    saveat = np.linspace(*tspan, 5)
    opts = {**OPTIONS, "saveat": saveat, **kwargs}
    differenced = dxode.solve(_problem(tspan, w), alg, **opts)
    exact = dxode.solve(_problem(tspan, w, forced_tgrad), alg, **opts)
    return differenced, exact, saveat


def _check_close_to_exact_tgrad(differenced, exact, saveat, w, error):
    """As many steps (up to 2x) as with the exact ``tgrad``, and both solutions within
    ``error`` (the global error the tolerances allow) of ``sin(w t)``."""
    assert differenced.retcode == exact.retcode == dxode.ReturnCode.Success
    assert differenced.stats.naccept <= 2 * exact.stats.naccept
    for sol in (differenced, exact):
        np.testing.assert_allclose(np.asarray(sol.u)[:, 0], np.sin(w * saveat), atol=error)


@pytest.mark.parametrize("name", list(RTOL))
@pytest.mark.parametrize("case", list(SPANS))
def test_short_time_scale_takes_the_steps_of_an_exact_tgrad(name, case):
    tspan, w = SPANS[case]
    alg = getattr(dxode, name)()
    differenced, exact, saveat = _solve_both(tspan, w, alg, rtol=RTOL[name])
    error = 1e-4 if RTOL[name] < 1e-4 else 10 * RTOL[name]
    _check_close_to_exact_tgrad(differenced, exact, saveat, w, error)


def test_float32_short_time_scale():
    """float32's ``eps``: differenced over ``sqrt(eps) = 3.5e-4`` of the span; the step
    counts and the error (the controller's, 3e-3 at rtol = 1e-4) are the exact tgrad's."""
    tspan, w = SPANS["ns"]
    saveat = np.linspace(*tspan, 5)
    opts = {"rtol": 1e-4, "atol": 1e-5, "maxiters": 2000, "saveat": saveat}
    differenced = dxode.solve(_problem(tspan, w, dtype=np.float32), dxode.Rodas5P(), **opts)
    exact = dxode.solve(_problem(tspan, w, forced_tgrad, dtype=np.float32), dxode.Rodas5P(), **opts)
    _check_close_to_exact_tgrad(differenced, exact, saveat, w, 1e-2)


def test_autoswitch_stiff_half():
    tspan, w = SPANS["ns"]
    differenced, exact, saveat = _solve_both(tspan, w, dxode.AutoSwitch())
    assert differenced.stats.nlu > 0  # its stiff method stepped
    _check_close_to_exact_tgrad(differenced, exact, saveat, w, 1e-4)


# ---------------------------------------------------------------- the increment itself


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spans_of_at_least_one_near_zero_keep_the_increment_bit_for_bit(dtype):
    """Where ``|t|`` is within the span (``s >= 1``): ``sqrt(eps) max(|t|, 1)``, as always."""
    t = np.array([0.0, -0.5, 1.0, 2.5, -7.0, 1e6, 3e12], dtype=dtype)
    t0, t1 = t, t + np.array([1.0, -1.0, 2.0, 1e3, -40.0, 2e6, 1e15], dtype=dtype)
    scale = time_scale(np, t0, t1)
    legacy = math.sqrt(np.finfo(dtype).eps) * np.maximum(np.abs(t), np.ones_like(t))
    increment = time_increment(np, t, scale)
    assert increment.dtype == dtype
    np.testing.assert_array_equal(increment, legacy)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spans_far_from_zero_take_the_geometric_mean(dtype):
    """Where ``|t| > s >= 1``: ``sqrt(eps) sqrt(|t| s)``, below ``sqrt(eps) |t|``."""
    t = np.array([1e6, -1e6, 5.0, 3e12], dtype=dtype)
    span = np.array([3.0, 3.0, 3.0, 1e3], dtype=dtype)
    scale = time_scale(np, t, t + span)
    increment = time_increment(np, t, scale)
    expected = math.sqrt(np.finfo(dtype).eps) * np.sqrt(np.abs(t).astype(float) * scale)
    np.testing.assert_allclose(increment, expected, rtol=4 * np.finfo(dtype).eps)
    assert np.all(increment < math.sqrt(np.finfo(dtype).eps) * np.abs(t))


def test_short_spans_set_the_increment():
    eps = np.finfo(np.float64).eps
    t0 = np.array([0.0, 1e-8, 0.5, 0.0])
    t1 = np.array([1e-8, 0.0, 0.5 + 1e-5, 1e-320])
    scale = time_scale(np, t0, t1)
    np.testing.assert_allclose(scale[:3], [1e-8, 1e-8, 1e-5], rtol=1e-9)
    assert scale[3] == np.finfo(np.float64).smallest_normal  # never zero
    increment = time_increment(np, t0, scale)
    expected = math.sqrt(eps) * np.array([1e-8, 1e-8, math.sqrt(0.5 * scale[2])])
    np.testing.assert_allclose(increment[:3], expected, rtol=1e-12)
    assert increment[3] > 0.0


# ---------------------------------------------------------------- ensembles


def _ensemble(tgrad=None):
    """Four trajectories whose spans and forcing scales range from 1e-8 to 10."""
    lengths = np.array([1e-8, 1e-5, 1e-2, 10.0])
    w = 10.0 / lengths
    p = np.column_stack([STIFFNESS * w, w])
    spans = np.column_stack([np.zeros(4), lengths])
    return dxode.EnsembleProblem(_problem((0.0, 1.0), 1.0, tgrad), p=p, tspan=spans), spans


def _saveat_end():
    return {**OPTIONS, "saveat": None}


def test_ensemble_lanes_use_their_own_spans_and_equal_their_solo_runs():
    eprob, spans = _ensemble()
    sim = dxode.solve(eprob, dxode.Rodas5P(), dxode.EnsembleArray(), **_saveat_end())
    with_tgrad = dxode.solve(
        _ensemble(forced_tgrad)[0], dxode.Rodas5P(), dxode.EnsembleArray(), **_saveat_end()
    )
    for i, (lane, exact) in enumerate(zip(sim, with_tgrad, strict=True)):
        assert lane.retcode == dxode.ReturnCode.Success
        assert lane.stats.naccept <= 2 * exact.stats.naccept
        np.testing.assert_allclose(np.asarray(lane.u)[-1], np.sin([10.0]), atol=1e-4)
        alone_prob = dxode.EnsembleProblem(
            eprob.prob, p=eprob.arrays["p"][i : i + 1], tspan=spans[i : i + 1]
        )
        alone = dxode.solve(alone_prob, dxode.Rodas5P(), dxode.EnsembleArray(), **_saveat_end())
        np.testing.assert_array_equal(np.asarray(alone.u)[0], np.asarray(sim.u)[i])
        assert alone.stats.nf[0] == sim.stats.nf[i]


# ---------------------------------------------------------------- compiled kernels


def _agree(kernel, array):
    """The kernel's steps and solution against the array path's (the same derivatives; the
    kernel's LU and controller round differently, see ``test_kernel_stiff``: the span-10 lane
    of ``_ensemble`` takes 40 steps there and 42 on the array path, before this change too)."""
    assert kernel.retcode == array.retcode == dxode.ReturnCode.Success
    assert abs(kernel.stats.naccept - array.stats.naccept) <= 2
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ns", "ns-backward", "unit-far-from-zero"])
def test_kernel_short_time_scale(case):
    pytest.importorskip("numba")
    tspan, w = SPANS[case]
    differenced, exact, saveat = _solve_both(tspan, w, dxode.Rodas5P())
    kernel = dxode.solve(_problem(tspan, w), dxode.Rodas5P(), kernel=True, saveat=saveat, **OPTIONS)
    _agree(kernel, differenced)
    _check_close_to_exact_tgrad(kernel, exact, saveat, w, 1e-4)


@pytest.mark.slow
def test_kernel_autoswitch_short_time_scale():
    pytest.importorskip("numba")
    tspan, w = SPANS["ns"]
    differenced, exact, saveat = _solve_both(tspan, w, dxode.AutoSwitch())
    kernel = dxode.solve(
        _problem(tspan, w), dxode.AutoSwitch(), kernel=True, saveat=saveat, **OPTIONS
    )
    _agree(kernel, differenced)
    _check_close_to_exact_tgrad(kernel, exact, saveat, w, 1e-4)


@pytest.mark.slow
def test_ensemble_kernel_lanes_use_their_own_spans():
    pytest.importorskip("numba")
    eprob, _ = _ensemble()
    kernel = dxode.solve(eprob, dxode.Rodas5P(), dxode.EnsembleKernel(), **_saveat_end())
    array = dxode.solve(eprob, dxode.Rodas5P(), dxode.EnsembleArray(), **_saveat_end())
    for k, a in zip(kernel, array, strict=True):
        _agree(k, a)
