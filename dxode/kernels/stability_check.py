"""Stability-limited steps in a kernel solve (``sensitivity.stability``, applied to the
steps a kernel recorded).

Both kernel gradients hold the steps fixed: forward sensitivities outside the error norm and
the discrete adjoint give the derivative of the computed solution at those steps. Where an
explicit method's adaptive steps went beyond its stability interval, that derivative is not
the gradient (a heated rod started on its slowest mode: 10^5 times too large, silently).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._retcode import ReturnCode
from .description import StepperDescription, describe

__all__ = ["limited_lanes", "may_be_limited"]

_SUCCEEDED = (int(ReturnCode.Success), int(ReturnCode.Terminated))


def may_be_limited(options: Any) -> bool:
    """Whether a solve with ``options`` can be stability-limited: adaptive steps (fixed ones
    are the user's choice, as on the array path) of an explicit Runge–Kutta method."""
    return bool(options.adaptive) and isinstance(describe(options.alg), StepperDescription)


def limited_lanes(
    static: Any,
    leaves: list[Any],
    u0: np.ndarray,
    t0: np.ndarray,
    t1: np.ndarray,
    save_grid: np.ndarray,
    stops: np.ndarray | None,
    steps: list[tuple[np.ndarray, np.ndarray]],
    outcome: dict[str, np.ndarray],
) -> tuple[int, float] | None:
    """``(lanes, ρ)``: how many succeeded lanes of the batch took a recorded step ``h`` with
    ``|h| ρ`` beyond the method's real stability interval, and the largest estimate of the
    Jacobian's dominant eigenvalue modulus ``ρ`` among them; ``None`` when none did.

    ``steps`` holds each lane's accepted ``(times, states)`` (``adjoint_record``). ``ρ``
    comes from the array path's power iterations of ``f`` on lane arrays; an ``f`` that runs
    only compiled (``math.sin`` of a lane array) is not checked."""
    from ..integrator.lanes import Trial
    from ..sensitivity import stability
    from ..sensitivity.passes import BatchRHS

    counts = np.array([len(t) - 1 for t, _ in steps])
    if counts.size == 0 or counts.max() <= 0:
        return None
    shape = u0.shape[:-1]
    last = int(counts.max())
    times = np.full((last + 1, len(steps)), np.nan)
    for lane, (t, _) in enumerate(steps):
        times[: len(t), lane] = t
    # only the states that stability_limited probes (every ceil(K / probes)-th step) are kept
    probed = set(range(0, last, -(-last // stability.PROBES)))
    trials = []
    for k in range(last):
        lanes = np.flatnonzero(counts > k)
        t, h = times[k, lanes], times[k + 1, lanes] - times[k, lanes]
        start = None
        if k in probed:
            rows = np.stack([steps[lane][1][k] for lane in lanes])  # (lanes, *shape)
            start = (np.moveaxis(rows.reshape(len(lanes), *shape), 0, -1).astype(u0.dtype), None)
        trials.append(Trial(lanes, t, h, t + h, np.ones(lanes.size, dtype=bool), (), None, start))
    interval = static.options.alg.tableau.real_stability_interval
    succeeded = np.isin(outcome["retcode"], _SUCCEEDED)
    try:
        batch = BatchRHS.of(static, leaves, u0, t0, t1, save_grid, stops)
        limited, rho = stability.stability_limited(
            batch.backend, batch.rhs_for, batch.params, trials, succeeded, interval
        )
    except Exception:  # an f the array path cannot evaluate: left unchecked
        return None
    return (int(limited.sum()), float(rho)) if limited.any() else None
