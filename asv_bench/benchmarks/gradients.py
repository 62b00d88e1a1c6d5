"""Gradients of a Lorenz ensemble loss with each of dxode's sensitivity algorithms.

The loss of ``gradient_cost.py`` at a size asv can repeat quickly: ``N`` Lorenz
trajectories from ``u0 = (1, 0, 0)`` over ``t in [0, 2]``, saved every 0.5, each with the
shared parameters ``theta`` scaled per trajectory, Tsit5 at ``rtol = atol = 1e-6``,
``loss = sum(u**2)``. ``time_forward`` is the loss alone; the others its value and gradient,
so their ratio to ``time_forward`` is the gradient's cost.
"""

from __future__ import annotations

from typing import ClassVar

import autograd
import autograd.numpy as anp
import numpy as np

import dxode

from .ensemble import PROBLEM, parameters

THETA = np.array([10.0, 28.0, 8 / 3])
SENSEALGS = {
    "discrete": dxode.DiscreteAdjoint(),
    "discrete_checkpointed": dxode.DiscreteAdjoint(checkpoint_every=10),
    "interpolating": dxode.InterpolatingAdjoint(),
    "forward": dxode.ForwardSensitivity(),
}


def make_loss(n: int, sensealg=None):
    scale = parameters(n) / np.asarray(PROBLEM.p)
    prob = PROBLEM.remake(tspan=(0.0, 2.0))

    def loss(theta):
        eprob = dxode.EnsembleProblem(prob, p=theta[None, :] * scale)
        sim = dxode.solve(
            eprob,
            dxode.Tsit5(),
            trajectories=n,
            saveat=0.5,
            rtol=1e-6,
            atol=1e-6,
            sensealg=sensealg,
        )
        return anp.sum(sim.u**2)

    return loss


class LorenzEnsembleGradient:
    """Forward loss and (loss, gradient) of a 100-trajectory Lorenz ensemble."""

    params: ClassVar[list[str]] = list(SENSEALGS)
    param_names: ClassVar[list[str]] = ["sensealg"]
    timeout = 300

    def setup(self, sensealg):
        self.loss = make_loss(100, SENSEALGS[sensealg])
        self.value_and_grad = autograd.value_and_grad(self.loss)

    def time_forward(self, sensealg):
        self.loss(THETA)

    def time_value_and_gradient(self, sensealg):
        self.value_and_grad(THETA)
