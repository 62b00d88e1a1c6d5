"""A Robertson ensemble with dxode's stiff (Rosenbrock) solvers.

Robertson's reaction ``y1' = -k1 y1 + k3 y2 y3``, ``y2' = k1 y1 - k3 y2 y3 - k2 y2^2``,
``y3' = k2 y2^2`` with ``k1 = 0.04``, ``k2 = 3e7``, ``k3 = 1e4``, ``u0 = (1, 0, 0)``, over
``t in [0, 1e5]`` saved at 10 log-spaced times, ``rtol = 1e-6``, ``atol = 1e-10``, float64.
Trajectory ``i`` scales ``k1`` by ``1 + 0.1 · (U_i − 0.5)``, ``U_i`` uniform from a fixed seed
(the same first rows for every ``N``), so every lane has its own stiffness and step sizes.

``compare_stiff.py`` next to this folder imports these definitions and adds the peers (SciPy
BDF and Radau loops, Diffrax's Kvaerno5).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

import dxode

K = (0.04, 3e7, 1e4)  # k1, k2, k3
U0 = (1.0, 0.0, 0.0)
T_SPAN = (0.0, 1e5)
SAVE_TIMES = np.logspace(-4.0, 5.0, 10)  # 1e-4, 1e-3, ..., 1e5
RTOL, ATOL = 1e-6, 1e-10
SEED = 20261121
METHODS = ("Rodas5P", "Rodas4", "Rosenbrock23", "TRBDF2")


def robertson(u, p, t):
    """``du/dt`` for a state ``(3,)`` or lanes ``(3, L)`` and rates ``(k1, k2, k3)``."""
    y1, y2, y3 = u
    k1, k2, k3 = p
    return [-k1 * y1 + k3 * y2 * y3, k1 * y1 - k3 * y2 * y3 - k2 * y2 * y2, k2 * y2 * y2]


def robertson_jac(u, p, t):
    """The Jacobian ``(3, 3)``, or ``(3, 3, L)`` for lanes."""
    y1, y2, y3 = u
    k1, k2, k3 = p
    zero = 0.0 * y1
    return np.stack(
        [
            np.stack([zero - k1, k3 * y3, k3 * y2]),
            np.stack([zero + k1, -k3 * y3 - 2.0 * k2 * y2, -k3 * y2]),
            np.stack([zero, 2.0 * k2 * y2, zero]),
        ]
    )


PROBLEM = dxode.ODEProblem(robertson, list(U0), T_SPAN, K, jac=robertson_jac)


def parameters(n: int, seed: int = SEED) -> np.ndarray:
    """Per-trajectory rates ``(n, 3)``; row ``i`` is the same for every ``n > i``."""
    scale = 1.0 + 0.1 * (np.random.default_rng(seed).random(n) - 0.5)
    params = np.tile(np.asarray(K), (n, 1))
    params[:, 0] *= scale
    return params


def available_methods() -> list[str]:
    """The stiff methods this dxode has (TRBDF2 may come later than the Rosenbrock ones)."""
    return [name for name in METHODS if hasattr(dxode, name)]


def run_dxode(params: np.ndarray, method: str = "Rodas5P", batch_size: int | None = None):
    """The ensemble in dxode (``EnsembleArray``); returns the ``EnsembleSolution``."""
    return dxode.solve(
        dxode.EnsembleProblem(PROBLEM, p=params),
        getattr(dxode, method)(),
        dxode.EnsembleArray(),
        trajectories=params.shape[0],
        batch_size=batch_size,
        saveat=SAVE_TIMES,
        rtol=RTOL,
        atol=ATOL,
    )


class RobertsonEnsemble:
    """Wall time of an N-trajectory Robertson ensemble, per stiff method."""

    params: ClassVar[list[Any]] = [[100], list(METHODS)]
    param_names: ClassVar[list[str]] = ["trajectories", "method"]
    timeout = 300

    def setup(self, n, method):
        if not hasattr(dxode, method):  # asv skips a benchmark whose setup raises this
            raise NotImplementedError(f"dxode has no {method}")
        self.p = parameters(n)
        run_dxode(self.p[:4], method)  # warm caches (coefficient arrays, imports)

    def time_dxode_ensemble_array(self, n, method):
        run_dxode(self.p, method)

    def track_steps_per_trajectory(self, n, method):
        sim = run_dxode(self.p, method)
        return sim.stats.total_steps / n

    track_steps_per_trajectory.unit = "steps"
