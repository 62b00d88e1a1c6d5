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
        sol = dxode.solve(prob, alg, saveat=[1.0], rtol=1e-10, atol=1e-10,
                          sensealg=dxode.ForwardSensitivity())
        return anp.sum(sol.u**2)

    theta = np.array([1.0, 0.5, 0.3, 0.7])
    end = theta[:2] + np.array([theta[2], theta[3] / 2])
    expected = np.concatenate([2 * end, 2 * end * np.array([1.0, 0.5])])
    np.testing.assert_allclose(autograd.grad(loss)(theta), expected, rtol=1e-8)
