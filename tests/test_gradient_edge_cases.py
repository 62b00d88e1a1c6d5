"""Gradients through solve on inputs at the edges: right-hand sides that ignore the state,
lanes that fail, ... each checked against a closed form or central differences."""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode


def _drift(u, p, t):  # u(t) = u0 + (p0 t, p1 t^2 / 2): f does not depend on u
    return anp.array([p[0] + 0.0 * t, p[1] * t])


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Rodas5P()], ids=["Tsit5", "Rodas5P"])
def test_forward_sensitivity_of_a_state_independent_rhs_warns_nothing(alg):
    """autograd warns "Output seems independent of input" for a forward-mode product of an
    ``f`` that ignores ``u``; the gradient is right and the warning (an error under
    ``filterwarnings = error``) must not reach the user."""

    def loss(theta):
        prob = dxode.ODEProblem(_drift, theta[:2], (0.0, 1.0), (theta[2], theta[3]))
        sol = dxode.solve(
            prob, alg, saveat=[1.0], rtol=1e-10, atol=1e-10, sensealg=dxode.ForwardSensitivity()
        )
        return anp.sum(sol.u**2)

    theta = np.array([1.0, 0.5, 0.3, 0.7])
    end = theta[:2] + np.array([theta[2], theta[3] / 2])
    expected = np.concatenate([2 * end, 2 * end * np.array([1.0, 0.5])])
    np.testing.assert_allclose(autograd.grad(loss)(theta), expected, rtol=1e-8)


@pytest.mark.parametrize("sensealg", [None, dxode.ForwardSensitivity()], ids=["default", "forward"])
def test_ensemble_with_per_trajectory_tspans_and_no_saveat_differentiates_its_ends(sensealg):
    """Without gradients such an ensemble saves each trajectory's ends (``t`` is
    ``(trajectories, 2)``); a differentiated one saves the same, as it does with callbacks."""

    def decay(u, p, t):
        return -p[0] * u

    def solve(theta):
        prob = dxode.ODEProblem(decay, [theta[1]], (0.0, 1.0), (theta[0],))
        eprob = dxode.EnsembleProblem(
            prob, prob_func=lambda prob, i, repeat: prob.remake(tspan=(0.1 * i, 1.0 + 0.2 * i))
        )
        return dxode.solve(
            eprob, dxode.Tsit5(), trajectories=3, rtol=1e-10, atol=1e-12, sensealg=sensealg
        )

    theta = np.array([0.7, 1.3])
    plain = solve(theta)
    spans = np.array([[0.1 * i, 1.0 + 0.2 * i] for i in range(3)])
    gradient = autograd.grad(lambda th: anp.sum(solve(th).u[:, -1, 0]))(theta)
    lengths = spans[:, 1] - spans[:, 0]
    ends = theta[1] * np.exp(-theta[0] * lengths)
    np.testing.assert_array_equal(plain.t, spans)
    np.testing.assert_allclose(plain.u[:, -1, 0], ends, rtol=1e-8)
    np.testing.assert_allclose(
        gradient, [np.sum(-lengths * ends), np.sum(ends) / theta[1]], rtol=1e-8
    )
