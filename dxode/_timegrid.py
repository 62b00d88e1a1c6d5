"""Validated time grids: ``saveat`` save times and ``tstops``."""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
import numpy as np

from ._validation import holds_real_numbers, refuse_traced
from .backends import to_host

# The most points a ``saveat`` interval may make (explicit arrays of times are not limited).
MAX_SAVE_POINTS = 10_000_000


def save_times(saveat: Any, t0: float, t1: float) -> np.ndarray | None:
    """The save times asked for by ``saveat`` on ``[t0, t1]`` (float64, in time order).

    ``saveat`` is ``None`` (no fixed grid), a positive interval ``dt`` (``t0, t0 + dt, ...``
    and always ``t1``; at most ``MAX_SAVE_POINTS`` points) or a sequence of times inside the
    span, strictly ordered in the direction of integration.
    """
    if saveat is None:
        return None
    refuse_traced("saveat", saveat)
    direction = 1.0 if t1 > t0 else -1.0
    if np.ndim(saveat) == 0:
        interval = _interval(saveat)
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"saveat as an interval must be positive and finite, got {saveat!r}")
        span = abs(t1 - t0)
        n = math.floor(span / interval * (1 + 1e-12))
        if n + 2 > MAX_SAVE_POINTS:
            raise ValueError(
                f"saveat={saveat!r} on a span of {span:g} would save {n + 1:,} points, more than "
                f"the limit of {MAX_SAVE_POINTS:,} for an interval; use a larger interval, or "
                f"pass the save times you need as an array"
            )
        times = t0 + direction * interval * np.arange(n + 1)
        return _ending_at(times, t1, span)
    return _checked_grid("saveat", saveat, t0, t1, direction)


def _ending_at(times: np.ndarray, t1: float, span: float) -> np.ndarray:
    """An interval's grid ``times`` (from ``t0``) ending at ``t1`` exactly: points within
    rounding of ``t1``, or past it, give way to ``t1``. Rounding is the span's (``1e-12``
    of it) and the times' own, an ulp of ``t1``, which counts far from ``t = 0`` (with
    ``t0 = 1e6``, ``t0 + 3 * 0.1`` is ``t1 = 1e6 + 0.3`` to the bit, but the span,
    ``0.30000000004656613``, seemed to leave a sliver, and ``t1`` was saved twice)."""
    close = 1e-12 * span + float(np.spacing(abs(t1)))
    before = (t1 - times) * np.sign(t1 - times[0]) > close
    before[0] = True  # t0 itself, however short the span
    return np.append(times[before], t1)


def _interval(saveat: Any) -> float:
    """A scalar ``saveat`` as a float, refusing what is not a number (a string, a bool)."""
    try:
        if isinstance(saveat, (bool, np.bool_, str, bytes)):  # float("0.1") is 0.1
            raise TypeError
        return float(saveat)
    except (TypeError, ValueError):
        raise TypeError(
            f"saveat must be None, a positive interval or a 1-D sequence of times, got {saveat!r}"
        ) from None


def lane_save_grid(
    saveat: Any, t0: np.ndarray, t1: np.ndarray, trajectories: np.ndarray | None = None
) -> np.ndarray:
    """Save times ``(nsave, L)`` (float64, host) of lanes on spans ``t0``, ``t1`` (``(L,)``):
    ``saveat``'s (see ``save_times``), shared by the lanes (a read-only view of one column),
    or each lane's end points.
    ``trajectories`` (``(L,)``, the lanes' trajectory indices) name the trajectory whose span
    a save time lies outside of."""
    n = t0.shape[0]
    if saveat is None:
        return np.stack([t0, t1])
    shared = _all_equal(t0) and _all_equal(t1)
    if shared and (trajectories is None or np.ndim(saveat) == 0):
        grid = save_times(saveat, float(t0[0]), float(t1[0]))
        assert grid is not None
        return np.broadcast_to(grid[:, None], (grid.shape[0], n))
    if np.ndim(saveat) == 0:
        raise ValueError(
            "saveat as an interval needs one shared tspan; with per-trajectory tspans give the "
            "save times as an array inside every trajectory's span (or saveat=None for the ends)"
        )
    ends = (t0[:1], t1[:1]) if shared else (t0, t1)  # one span: check it once
    lo, hi = np.minimum(*ends), np.maximum(*ends)
    direction = 1.0 if t1[0] > t0[0] else -1.0
    grid = save_times(saveat, -direction * math.inf, direction * math.inf)  # ordered, finite
    assert grid is not None
    outside = (grid.min() < lo) | (grid.max() > hi)
    if np.any(outside):
        lane = int(np.argmax(outside))
        time = grid[(grid < lo[lane]) | (grid > hi[lane])][0]
        who = "a trajectory" if trajectories is None else f"trajectory {int(trajectories[lane])}"
        raise ValueError(
            f"saveat time {float(time)} is outside the tspan ({float(t0[lane])}, "
            f"{float(t1[lane])}) of {who}; a shared saveat must lie inside every trajectory's "
            f"tspan (or pass saveat=None to save each trajectory's ends)"
        )
    return np.broadcast_to(grid[:, None], (grid.shape[0], n))


def _all_equal(values: np.ndarray) -> bool:
    """Whether the lanes' ``values`` ``(L,)`` are one number (at once for a broadcast one)."""
    return values.strides[0] == 0 or bool(np.all(values == values[0]))


def trajectory_times(grid: np.ndarray) -> np.ndarray:
    """A batch's save times from its lanes' grid ``(nsave, L)``: ``(nsave,)`` when every lane
    saves at the same times, else ``(L, nsave)``. Decided by the times alone, so an
    ensemble's ``sim.t`` has the same shape however its trajectories are batched."""
    shared = grid.strides[1] == 0 or bool(np.all(grid == grid[:, :1]))  # a broadcast column
    return grid[:, 0] if shared else grid.T


def lane_stop_times(tstops: Any, t0: np.ndarray, t1: np.ndarray) -> np.ndarray | None:
    """``tstops`` for lanes with spans ``t0 -> t1`` (``(L,)`` each, all in one direction),
    checked to be ordered and finite: each lane steps onto those inside its own span and
    passes the others by. Not checked against the lanes' spans, whose union depends on how
    trajectories are batched (an ensemble checks its stops against all spans it knows)."""
    direction = 1.0 if t1[0] > t0[0] else -1.0
    return stop_times(tstops, -direction * math.inf, direction * math.inf)


def stop_times(tstops: Any, t0: float, t1: float) -> np.ndarray | None:
    """``tstops`` validated: times the integrator must step to exactly, inside the span."""
    if tstops is None:
        return None
    refuse_traced("tstops", tstops)
    direction = 1.0 if t1 > t0 else -1.0
    grid = _checked_grid("tstops", tstops, t0, t1, direction)
    return grid if grid.size else None


def host_times(name: str, values: Any) -> np.ndarray:
    """``values`` (numbers, or an array of any array library) as host float64 times; strings
    and bools are refused, which ``float64`` would read as times ("0.5" as 0.5, True as 1)."""
    if array_api_compat.is_array_api_obj(values) and not isinstance(values, np.ndarray):
        values = to_host(values)
    try:
        if not holds_real_numbers(values):
            raise TypeError
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D sequence of times, got {values!r}") from exc


def _checked_grid(name: str, values: Any, t0: float, t1: float, direction: float) -> np.ndarray:
    grid = host_times(name, values)
    if grid.ndim == 0:  # saveat's scalars are intervals, handled before
        raise ValueError(f"{name} must be a 1-D sequence of times; for one time give [{values!r}]")
    if grid.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {grid.shape}")
    if not np.all(np.isfinite(grid)):
        raise ValueError(f"{name} contains non-finite times")
    if name == "saveat" and grid.size == 0:
        raise ValueError("saveat is empty; pass None to save every step, or at least one time")
    lo, hi = min(t0, t1), max(t0, t1)
    outside = grid[(grid < lo) | (grid > hi)]
    if outside.size:
        raise ValueError(f"{name} time {float(outside[0])} is outside tspan ({t0}, {t1})")
    if grid.size > 1 and not np.all(direction * np.diff(grid) > 0):
        order = "increasing" if direction > 0 else "decreasing (tspan runs backwards)"
        raise ValueError(f"{name} times must be strictly {order}")
    return grid
