"""Gradients through events: a bouncing ball's restitution and drop height.

``N`` balls dropped from heights in ``[1, 2]`` m with restitutions in ``[0.6, 0.9]`` (per
trajectory) bounce until ``t = 3`` s; ``loss = sum(height**2)`` over 10 save times, Tsit5
at ``rtol = atol = 1e-8``. ``time_forward`` is the loss with plain arrays (a solve with the
callback, no gradients); ``time_value_and_grad`` its value and gradient with respect to
every ball's height and restitution, so their ratio is the gradient's cost. ``N = 1`` is a
single ``ODEProblem`` (its save times fall between events); larger ``N`` an ensemble whose
balls bounce at different times (each save time and event ends a piece).
"""

from __future__ import annotations

from typing import ClassVar

import autograd
import autograd.numpy as anp
import numpy as np

import dxode

SAVES = np.linspace(0.3, 3.0, 10)


def fall(u, p, t):
    return anp.array([u[1], -p[0] * anp.ones_like(u[1])])


def bounce(u, p, t, fired):
    return anp.array([u[0], -p[1] * u[1]])


def height(u, p, t):
    return u[0]


BOUNCE = dxode.ContinuousCallback(height, bounce, direction="down")


def make_loss(n: int):
    prob = dxode.ODEProblem(fall, np.array([1.0, 0.0]), (0.0, 3.0), np.array([9.81, 0.8]))

    def loss(theta):
        heights, restitution = theta[:n], theta[n:]
        options = {"saveat": SAVES, "callback": BOUNCE, "rtol": 1e-8, "atol": 1e-8}
        if n == 1:
            single = prob.remake(
                u0=anp.array([heights[0], 0.0]), p=anp.array([9.81, restitution[0]])
            )
            return anp.sum(dxode.solve(single, **options).u[:, 0] ** 2)
        u0 = anp.stack([heights, anp.zeros(n)], axis=1)
        p = anp.stack([9.81 * anp.ones(n), restitution], axis=1)
        sim = dxode.solve(dxode.EnsembleProblem(prob, u0=u0, p=p), **options)
        return anp.sum(sim.u[..., 0] ** 2)

    return loss


class BouncingBallGradient:
    """Forward loss and (loss, gradient) of bouncing balls."""

    params: ClassVar[list[int]] = [1, 100]
    param_names: ClassVar[list[str]] = ["trajectories"]
    timeout = 300

    def setup(self, n):
        self.loss = make_loss(n)
        self.value_and_grad = autograd.value_and_grad(self.loss)
        self.theta = np.concatenate([np.linspace(1.0, 2.0, n), np.linspace(0.6, 0.9, n)])

    def time_forward(self, n):
        self.loss(self.theta)

    def time_value_and_grad(self, n):
        self.value_and_grad(self.theta)


def fall_per_trajectory(u, p, t):  # as the compiled kernels take f: one trajectory's u
    return [u[1], -p[0] + 0.0 * u[0]]


def bounce_per_trajectory(u, p, t, fired):
    return [u[0], -p[1] * u[1]]


BOUNCE_PER_TRAJECTORY = dxode.ContinuousCallback(height, bounce_per_trajectory, direction="down")


class SingleBallGradientKernel:
    """One ball (6 bounces, 40 save times) with ``kernel=True`` (forward sensitivities, the
    default for 3 inputs) against the array path, the same per-trajectory ``f``."""

    params: ClassVar[list[bool]] = [False, True]
    param_names: ClassVar[list[str]] = ["kernel"]
    timeout = 600

    def setup(self, kernel):
        saves = np.linspace(0.0, 3.0, 40)

        def loss(theta):
            prob = dxode.ODEProblem(
                fall_per_trajectory,
                anp.array([theta[0], 0.0]),
                (0.0, 3.0),
                anp.array([9.81, theta[1]]),
            )
            options = {"saveat": saves, "rtol": 1e-8, "atol": 1e-8, "kernel": kernel}
            sol = dxode.solve(prob, callback=BOUNCE_PER_TRAJECTORY, **options)
            return anp.sum(sol.u[:, 0] ** 2)

        self.loss = loss
        self.value_and_grad = autograd.value_and_grad(loss)
        self.theta = np.array([1.0, 0.8])
        self.value_and_grad(self.theta)  # compile the kernels outside the timing
        self.loss(self.theta)

    def time_forward(self, kernel):
        self.loss(self.theta)

    def time_value_and_grad(self, kernel):
        self.value_and_grad(self.theta)
