"""Stability-limited steps in a kernel solve (``sensitivity.stability``, applied to the
steps a kernel recorded).

Both kernel gradients hold the steps fixed: forward sensitivities outside the error norm and
the discrete adjoint give the derivative of the computed solution at those steps. Where an
explicit method's adaptive steps went beyond its stability interval, that derivative is not
the gradient (a heated rod started on its slowest mode: 10^5 times too large, silently).

Forward sensitivities screen a batch first (``screen_clears``), from one vectorized run of the
plain kernel that returns each lane's largest accepted step and its states after ``PROBES``
step counts spread over its steps (``probe_steps``; spread over time instead, they missed a
short stiff stretch that the steps crowd into): the common, non-stiff batch is cleared there,
in about the time of its forward solve. Only a batch the screen does not clear has its steps
recorded (one lane at a time, about 30 µs a lane) and checked step by step (``limited_lanes``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._retcode import ReturnCode
from .description import StepperDescription, describe

__all__ = ["CheckedBatch", "limited_lanes", "may_be_limited", "probe_steps", "screen_clears"]

_SUCCEEDED = (int(ReturnCode.Success), int(ReturnCode.Terminated))


class CheckedBatch(NamedTuple):
    """A gradient batch as the check evaluates its ``f`` on the array path (``BatchRHS``):
    the solve's static part, the parameter leaves, states ``u0`` ``(n, L)``, spans ``(L,)``,
    save times and tstops."""

    static: Any
    leaves: list[Any]
    u0: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    save_grid: np.ndarray
    stops: np.ndarray | None


def may_be_limited(options: Any) -> bool:
    """Whether a solve with ``options`` can be stability-limited: adaptive steps (fixed ones
    are the user's choice, as on the array path) of an explicit Runge–Kutta method."""
    return bool(options.adaptive) and isinstance(describe(options.alg), StepperDescription)


def limited_lanes(
    batch: CheckedBatch,
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

    counts = np.array([len(t) - 1 for t, _ in steps])
    if counts.size == 0 or counts.max() <= 0:
        return None
    shape = batch.u0.shape[:-1]
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
            start = (
                np.moveaxis(rows.reshape(len(lanes), *shape), 0, -1).astype(batch.u0.dtype),
                None,
            )
        trials.append(Trial(lanes, t, h, t + h, np.ones(lanes.size, dtype=bool), (), None, start))
    succeeded = np.isin(outcome["retcode"], _SUCCEEDED)
    return _limited(batch, trials, succeeded)


def probe_steps(naccept: np.ndarray) -> np.ndarray:
    """The screen's probes: ``PROBES`` accepted-step counts spread evenly over each lane's
    ``naccept`` steps, ascending from 0 (the start), ``-1`` after a lane's last distinct one,
    ``(PROBES, L)``."""
    from ..sensitivity.stability import PROBES

    counts = np.asarray(naccept, dtype=np.int64)
    steps = np.arange(PROBES)[:, None] * np.maximum(counts, 0) // PROBES
    repeated = np.zeros(steps.shape, dtype=bool)
    repeated[1:] = steps[1:] == steps[:-1]
    steps[repeated] = -1
    # each lane's distinct counts moved up, in order, the -1 below them
    return np.take_along_axis(steps, np.argsort(repeated, axis=0, kind="stable"), axis=0)


def screen_clears(
    batch: CheckedBatch,
    screen: Any,
) -> bool:
    """Whether no succeeded lane's step can be beyond the stability interval, by the
    ``screen`` run (a ``KernelResult`` of the plain kernel with ``screen_steps``): every
    lane's largest accepted step against the Jacobian's rate at its probed states (as if it
    took its largest step at every probe: a batch this clears has no limited lane, one it
    does not may have none)."""
    from ..integrator.lanes import Trial

    largest, states, times = (np.asarray(a) for a in screen.screen)
    succeeded = np.isin(np.asarray(screen.retcode), _SUCCEEDED)
    shape = batch.u0.shape[:-1]
    trials = []
    for k in range(states.shape[1]):
        lanes = np.flatnonzero(succeeded & np.isfinite(states[:, k]).all(axis=1))
        start = (np.moveaxis(states[lanes, k].reshape(lanes.size, *shape), 0, -1), None)
        t, h = times[lanes, k], largest[lanes]
        trials.append(Trial(lanes, t, h, t + h, np.ones(lanes.size, dtype=bool), (), None, start))
    if all(trial.lane.size == 0 for trial in trials):
        return True
    return _limited(batch, trials, succeeded) is None


def _limited(
    batch: CheckedBatch,
    trials: list[Any],
    succeeded: np.ndarray,
) -> tuple[int, float] | None:
    """``stability.stability_limited`` of the ``trials`` on the array path's lane RHS of
    the batch, as ``limited_lanes`` returns it."""
    from ..sensitivity import stability
    from ..sensitivity.passes import BatchRHS

    interval = batch.static.options.alg.tableau.real_stability_interval
    try:
        rhs = BatchRHS.of(*batch)
        limited, rho = stability.stability_limited(
            rhs.backend, rhs.rhs_for, rhs.params, trials, succeeded, interval
        )
    except Exception:  # an f the array path cannot evaluate: left unchecked
        return None
    return (int(limited.sum()), float(rho)) if limited.any() else None
