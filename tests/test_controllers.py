"""Step-size controllers: accept/reject, limits, memory, and their effect on a solve."""

from __future__ import annotations

import re

import numpy as np
import pytest

import dxode

from problems import oscillator


def _adapt(controller, errors, memory=None, h=1.0, order=4):
    errors = np.asarray(errors, dtype=float)
    memory = controller.init(np, errors) if memory is None else memory
    return controller.adapt(np, errors, np.full_like(errors, h), memory, order)


def test_accepts_iff_error_at_most_one():
    accept, _, _ = _adapt(dxode.PIController(), [0.5, 1.0, 1.0001, np.inf])
    assert accept.tolist() == [True, True, False, False]


def test_integral_controller_factor():
    ctrl = dxode.IController()
    _, h, _ = _adapt(ctrl, [0.5], order=4)
    assert h[0] == pytest.approx(0.9 * 0.5 ** (-1 / 5))


def test_factor_limits_and_rejection_shrinks():
    ctrl = dxode.PIController(factor_min=0.2, factor_max=5.0)
    _, h, _ = _adapt(ctrl, [0.0, 1e-30, 1e30, np.inf, 2.0])
    assert h[0] == h[1] == 5.0  # zero error: grow by the maximum factor
    assert h[2] == h[3] == 0.2  # huge or non-finite error: shrink by the minimum factor
    assert h[4] <= 0.9  # any rejection shrinks the step


def test_memory_updates_only_on_acceptance():
    ctrl = dxode.PIDController(beta1=0.6, beta2=-0.2, beta3=0.1)
    accept, _, memory = _adapt(ctrl, [0.25, 4.0])
    assert accept.tolist() == [True, False]
    assert memory[0].tolist() == [0.25, 1.0]
    _, _, memory = _adapt(ctrl, [0.5, 0.5], memory)
    assert memory[0].tolist() == [0.5, 0.5] and memory[1].tolist() == [0.25, 1.0]


def test_pi_uses_the_previous_error():
    ctrl = dxode.PIController()
    _, after_small, _ = _adapt(ctrl, [0.5], (np.array([0.1]), np.array([1.0])))
    _, after_large, _ = _adapt(ctrl, [0.5], (np.array([0.9]), np.array([1.0])))
    # beta2 < 0: after a small error the step grows less (it already grew), which damps
    # the oscillating step sequences an I controller produces.
    assert after_large[0] > after_small[0]
    assert after_large[0] == pytest.approx(0.9 * 0.5 ** (-0.7 / 5) * 0.9 ** (0.4 / 5))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"safety": 1.5}, "safety must be in"),
        ({"factor_min": 1.2}, "factor_min < 1 < factor_max"),
        ({"factor_max": 0.5}, "factor_min < 1 < factor_max"),
        ({"beta1": 0.0}, "beta1 must be positive"),
        ({"beta2": float("nan")}, "'beta2' must be finite"),
    ],
)
def test_invalid_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dxode.PIDController(**kwargs)


@pytest.mark.parametrize("value", ["0.7", None, True])
def test_parameters_that_are_not_numbers_are_named(value):
    # "0.7" and None failed in math.isfinite ("must be real number, not str").
    message = f"controller parameter 'beta1' must be a number, got {value!r}"
    with pytest.raises(TypeError, match=re.escape(message)):
        dxode.PIDController(beta1=value)


@pytest.mark.parametrize(
    "controller",
    [dxode.IController(), dxode.PIController(), dxode.PIDController(0.6, -0.2, 0.1)],
    ids=["I", "PI", "PID"],
)
def test_every_controller_meets_the_tolerance(controller):
    prob = dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 10.0))
    sol = dxode.solve(prob, controller=controller, rtol=1e-7, atol=1e-7, saveat=[10.0])
    assert sol.retcode == dxode.ReturnCode.Success
    assert abs(sol.u[-1, 0] - np.cos(10.0)) < 1e-5


def test_pi_control_rejects_fewer_steps_than_i_control_on_an_oscillation():
    prob = dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 50.0))
    i_sol = dxode.solve(prob, controller=dxode.IController(), rtol=1e-6, atol=1e-6)
    pi_sol = dxode.solve(prob, controller=dxode.PIController(), rtol=1e-6, atol=1e-6)
    assert pi_sol.stats.nreject <= i_sol.stats.nreject


def _steps_below(sol, dtmin, landings):
    """The accepted steps shorter than ``dtmin`` that do not end on one of ``landings``."""
    t = np.asarray(sol.t)
    short = np.diff(t) < dtmin
    return [(a, b) for a, b, s in zip(t[:-1], t[1:], short, strict=True) if s and b not in landings]


@pytest.mark.parametrize("tstops", [None, [0.95]])
def test_dtmin_is_a_floor_under_every_step_but_a_landing_one(tstops):
    # u' = -u at rtol 1e-3 takes steps of 0.15 to 0.6; from dtmin=0.1 on they were also taken
    # below the floor, which only rejected steps were checked against. Only the steps that
    # land on the end or a stop may be shorter (the one onto 0.95 is 0.05 here).
    prob = dxode.ODEProblem(lambda u, p, t: -u, [1.0], (0.0, 1.0))
    sol = dxode.solve(prob, dxode.Tsit5(), dtmin=0.2, tstops=tstops, dense=False)
    assert sol.retcode == dxode.ReturnCode.Success
    assert _steps_below(sol, 0.2, {1.0, 0.95}) == []
    assert float(sol.t[-1]) == 1.0


def test_a_step_proposed_below_dtmin_after_an_accepted_one_fails():
    # At rtol 1e-10 u' = -u needs steps near 0.01: every one was accepted, so dtmin=0.05
    # was never checked and the solve ended in Success with every step below it.
    prob = dxode.ODEProblem(lambda u, p, t: -u, [1.0], (0.0, 1.0))
    sol = dxode.solve(prob, dxode.Tsit5(), rtol=1e-10, atol=1e-10, dtmin=0.05, dense=False)
    assert sol.retcode == dxode.ReturnCode.DtLessThanMin
    assert _steps_below(sol, 0.05, set()) == []
    # Without the floor the same solve succeeds (the tolerance is reachable).
    assert dxode.solve(prob, dxode.Tsit5(), rtol=1e-10, atol=1e-10).retcode.name == "Success"
