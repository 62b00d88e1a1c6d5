"""A per-lane simplified Newton iteration for the implicit stages of SDIRK-type methods.

Each stage solves ``y = base + dh * f(y, t)`` for every lane, with ``W = I - dh J`` factored
once per step attempt (``dh``: the method's diagonal coefficient times ``h``, per lane):

    W dy_k = base + dh f(y_k, t) - y_k,    y_{k+1} = y_k + dy_k.

Every lane stops on its own test (Hairer & Wanner, Solving ODEs II, IV.8): with the
contraction rate ``theta_k = |dy_k| / |dy_{k-1}|`` and ``eta_k = theta_k / (1 - theta_k)``
(``eta_0 = 1``), a lane has converged once ``eta_k |dy_k| <= kappa`` in the tolerance-scaled
RMS norm; it has failed when ``theta_k >= 1`` (divergence), when its correction is not
finite, or at the iteration limit.
Lanes that stopped keep their value while the others iterate on, so a lane's result and
iteration count never depend on the batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._norms import rms_norm

Array = Any


@dataclasses.dataclass(frozen=True)
class StageSolve:
    """The outcome of one implicit stage for every lane.

    Attributes
    ----------
    y : (n, L) array
        The stage value (the last iterate; meaningless where ``converged`` is false).
    converged : (L,) bool array
    iterations : (L,) int64 array
        Newton iterations made (one RHS evaluation and one linear solve each).
    """

    y: Array
    converged: Array
    iterations: Array


def solve_stage(
    backend: Any,
    rhs: Any,
    t: Array,
    base: Array,
    dh: Array,
    guess: Array,
    factors: Any,
    scale: Array,
    run: Array,
    kappa: float,
    max_iters: int,
) -> StageSolve:
    """Solve ``y = base + dh * f(y, t)`` per lane, starting from ``guess``.

    Parameters
    ----------
    t, dh : (L,) arrays
        Stage time and diagonal coefficient times the step, per lane.
    base, guess : (n, L) arrays
    factors
        ``backend.lu_factor`` of ``I - dh J``.
    scale : (n, L) array or broadcastable
        Error scale ``rtol |u| + atol``: corrections are measured as ``|dy / scale|``.
    run : (L,) bool array
        The lanes to solve; the others are left at ``guess``, not converged, with no
        iterations.
    kappa : float
        Stopping tolerance for the estimated iteration error, relative to the error scale.
    max_iters : int
        Iteration limit.
    """
    xp = backend.xp
    y = guess
    active = run
    converged = xp.zeros_like(run)
    iterations = xp.zeros(run.shape, dtype=xp.int64)
    previous = None
    for _ in range(max_iters):
        dy = backend.lu_solve(factors, base + dh * rhs(y, t) - y)
        norm = rms_norm(xp, dy / scale)
        iterations = iterations + xp.astype(active, xp.int64)
        y = xp.where(active[None, ...], y + dy, y)
        if previous is None:
            done = norm <= kappa
            bad = ~xp.isfinite(norm)
        else:
            rate = norm / previous
            # Written so that a NaN rate (or norm) counts as divergence.
            contracting = rate < 1.0
            rate = xp.where(contracting, rate, 0.0)
            done = contracting & (rate / (1.0 - rate) * norm <= kappa)
            bad = ~contracting
        done = active & done
        converged = converged | done
        active = active & ~done & ~bad
        if not bool(xp.any(active)):
            break
        previous = norm
    return StageSolve(y=y, converged=converged, iterations=iterations)
