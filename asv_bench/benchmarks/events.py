"""Events per lane: a bouncing-ball ensemble with a ``ContinuousCallback``.

``N`` balls dropped from heights spread over ``[1, 10]`` m bounce with a coefficient of
restitution 0.9 until ``t = 10`` s; each impact is located per lane by root finding on the
step's dense output. ``time_no_callback`` solves the same ensemble without the callback
(falling through the floor) to show the cost of event handling.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

import dxode


def fall(u, p, t):
    x, v = u
    return [v, -9.81 + 0.0 * x]


def height(u, p, t):
    return u[0]


def bounce(u, p, t, fired):
    return [u[0], -0.9 * u[1]]


BOUNCE = dxode.ContinuousCallback(height, bounce, direction="down")


class BouncingBalls:
    """An ensemble of bouncing balls with and without the impact callback."""

    params: ClassVar[list[int]] = [100, 10_000]
    param_names: ClassVar[list[str]] = ["trajectories"]
    timeout = 300

    def setup(self, n):
        u0 = np.column_stack([np.linspace(1.0, 10.0, n), np.zeros(n)])
        prob = dxode.ODEProblem(fall, [10.0, 0.0], (0.0, 10.0))
        self.eprob = dxode.EnsembleProblem(prob, u0=u0)
        self.n = n

    def solve(self, callback):
        return dxode.solve(
            self.eprob,
            dxode.Tsit5(),
            trajectories=self.n,
            saveat=1.0,
            rtol=1e-8,
            atol=1e-8,
            callback=callback,
        )

    def time_with_bounces(self, n):
        self.solve(BOUNCE)

    def time_no_callback(self, n):
        self.solve(None)

    def track_events(self, n):
        """Impacts located in the whole ensemble."""
        return len(self.solve(BOUNCE).events.t)

    track_events.unit = "events"
