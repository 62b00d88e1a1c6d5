"""Where a differentiated solve with callbacks breaks: find the events, plan the segments.

A first pass solves the lanes with their callbacks and without gradients (batch by batch,
where the batches run: here or as Dask tasks) and keeps only the event log: each event's
lane, time and callback, in the order they fired, and each lane's return code. From it
every lane gets its breakpoints, in the direction of time: its start, its events, its save
times and ``tstops`` up to its end (the last event of a terminated lane), and its end. All
lanes get the same number of segments (a lane with fewer breakpoints has its longest
segments halved), so segment ``j`` of every lane is one lane problem on per-lane spans.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._lane_problem import lane_problem, lane_values, parameters_for
from .._retcode import ReturnCode
from ..backends import get_backend
from ..integrator.loop import integrate

_TERMINATED = int(ReturnCode.Terminated)
_SUCCEEDED = (int(ReturnCode.Success), _TERMINATED)


@dataclasses.dataclass
class EventLog:
    """The events of every lane (host arrays, grouped by lane, in firing order within a lane)
    and the lanes' return codes."""

    lane: np.ndarray  # (k,) int64
    t: np.ndarray  # (k,) in the state's dtype
    callback: np.ndarray  # (k,) int64
    retcode: np.ndarray  # (L,) int64


def find_events(
    static: Any, callbacks: Any, u0: np.ndarray, leaves: list[Any], run: Any
) -> EventLog:
    """Solve lanes ``u0`` ``(*shape, L)`` with ``callbacks`` and parameter leaf values
    ``leaves`` (no autograd boxes), batch by batch through ``run`` (``differentiable._Pass``)."""
    from .differentiable import _task_static

    task = _task_static(static)
    args = []
    for start in range(0, u0.shape[-1], static.batch_size):
        lanes = slice(start, min(start + static.batch_size, u0.shape[-1]))
        batch_leaves = [
            leaf[..., lanes] if lane else leaf
            for leaf, lane in zip(leaves, static.lane_leaf, strict=True)
        ]
        args.append((task, callbacks, u0[..., lanes], batch_leaves, lanes))
    parts = run.map_batches(_events_task, args, "events")
    return EventLog(*(np.concatenate([part[i] for part in parts]) for i in range(4)))


def _events_task(
    static: Any, callbacks: Any, u0: np.ndarray, leaves: list[Any], lanes: slice
) -> tuple[np.ndarray, ...]:
    """One batch's event pass: ``(lane, t, callback, retcode)`` on the host (by the
    sensitivity algorithm's compiled kernel where it has one, else by the array path)."""
    from .passes import _functions

    by_kernel = static.sensealg.event_lanes(
        static, callbacks, u0, leaves, static.t0[lanes], static.t1[lanes]
    )
    if by_kernel is not None:
        lane, t, callback, retcode = by_kernel
        return lane + lanes.start, t, callback, retcode
    backend = get_backend("numpy")
    problem = lane_problem(
        backend,
        _functions(static),
        parameters_for(static.p_template, leaves, static.lane_leaf),
        lane_values(leaves, static.lane_leaf),
        np.asarray(u0),
        static.t0[lanes],
        static.t1[lanes],
        stepper=static.options.alg,
        save_grid=None,
        record_steps="",
        tstops=static.tstops,
        callbacks=callbacks,
    )
    result = integrate(problem, static.options, backend)
    log = result.events
    return (
        np.asarray(log["lane"], dtype=np.int64) + lanes.start,
        np.asarray(log["t"]),
        np.asarray(log["callback"], dtype=np.int64),
        np.asarray(result.retcode, dtype=np.int64),
    )


@dataclasses.dataclass
class SegmentPlan:
    """Every lane's breakpoints, what happens at them, and where the save times fall.

    ``points[i]`` are lane ``i``'s ``n + 1`` breakpoints (float64, in the direction of time);
    segment ``j`` runs from ``points[:, j]`` to ``points[:, j + 1]``. ``grids[j]`` is the save
    grid of segment ``j`` when all lanes share its span (its ends and the save times inside),
    else ``None`` (each lane saves its ends). ``fires[j][m]`` is the ``m``-th callback
    (``-1``: none) each lane applies at breakpoint ``j``, in firing order. The saved rows
    of a lane are its start, then each segment's saves after its first; ``save_at[i, s]`` is
    the row of lane ``i``'s save ``s`` (``-1``: after the lane ended, a NaN row), ``None``
    when each lane saves only its start and end. ``event_rows`` lists each logged event as
    ``(breakpoint, slot)``, in the log's order.
    """

    points: np.ndarray  # (L, n + 1)
    grids: list[np.ndarray | None]  # n entries
    fires: list[np.ndarray]  # n + 1 entries of (slots, L) int64
    save_at: np.ndarray | None  # (L, nsave) int64
    event_rows: np.ndarray  # (k, 2) int64
    ok: np.ndarray  # (L,) bool: the event pass succeeded on the lane

    @property
    def segments(self) -> int:
        return self.points.shape[1] - 1


def plan_segments(
    log: EventLog,
    t0: np.ndarray,
    t1: np.ndarray,
    save_grid: np.ndarray | None,
    tstops: np.ndarray | None,
    dtype: Any = np.float64,
) -> SegmentPlan:
    """The segments of lanes on spans ``t0``, ``t1`` (``(L,)``) with the events of ``log``,
    saving at ``save_grid`` (shared, or ``None`` for each lane's ends). Where every lane has
    the same span and events (a single problem, preset times), save times fall inside the
    segments; otherwise they end segments too.

    The solves keep their times in the state's ``dtype``, and so do the event times of
    ``log``: the spans, save times and ``tstops`` are rounded to it first, as the solve
    without gradients rounds them. (In float32 a save at 0.9 fell after a dose logged at
    float32(0.9) < 0.9 and held the state after it; with lanes apart, a save at 0.3 made a
    segment from float32(0.3) - 1e-8 to it, empty in float32, and failed the lane.)"""
    t0, t1, save_grid, tstops = (
        None if x is None else np.asarray(x).astype(dtype).astype(np.float64)
        for x in (t0, t1, save_grid, tstops)
    )
    n_lanes = t0.shape[0]
    direction = 1.0 if t1[0] > t0[0] else -1.0
    starts = np.searchsorted(log.lane, np.arange(n_lanes + 1))
    events, ends = [], []
    for i in range(n_lanes):
        times = log.t[starts[i] : starts[i + 1]].astype(np.float64)
        end = times[-1] if log.retcode[i] == _TERMINATED and times.size else t1[i]
        if direction * (end - t0[i]) <= 0:
            raise NotImplementedError(
                f"trajectory {i} was terminated at its start time; gradients through a "
                "callback that terminates at t0 are not supported: start after the event"
            )
        events.append(times)
        ends.append(end)
    shared = all(
        t0[i] == t0[0] and ends[i] == ends[0] and np.array_equal(events[i], events[0])
        for i in range(n_lanes)
    )
    inner = [x for x in (tstops, None if shared else save_grid) if x is not None]
    fixed = np.concatenate(inner) if inner else np.zeros(0)
    per_lane = []
    for i in range(n_lanes):
        inside = fixed[(direction * (fixed - t0[i]) > 0) & (direction * (ends[i] - fixed) > 0)]
        both = np.concatenate([[t0[i], ends[i]], events[i], inside])
        per_lane.append(direction * np.unique(direction * both))
    n = max(p.shape[0] for p in per_lane) - 1
    points = np.stack([_split_longest(p, n) for p in per_lane])
    grids = [_segment_grid(points[:, j], points[:, j + 1], save_grid, direction) for j in range(n)]
    fires, event_rows = _fires(log, points)
    save_at = None if save_grid is None else _save_rows(points, grids, save_grid)
    return SegmentPlan(points, grids, fires, save_at, event_rows, np.isin(log.retcode, _SUCCEEDED))


def _segment_grid(
    a: np.ndarray, b: np.ndarray, saves: np.ndarray | None, direction: float
) -> np.ndarray | None:
    """A segment's shared save grid (its ends and the save times strictly inside), or
    ``None`` when the lanes' spans ``a`` to ``b`` differ."""
    if not (np.all(a == a[0]) and np.all(b == b[0])):
        return None
    inside = np.zeros(0) if saves is None else saves
    inside = inside[(direction * (inside - a[0]) > 0) & (direction * (b[0] - inside) > 0)]
    return np.concatenate([[a[0]], inside, [b[0]]])


def _save_rows(points: np.ndarray, grids: list[np.ndarray | None], saves: np.ndarray) -> np.ndarray:
    """The saved row of every lane's save times (``-1``: after the lane ended)."""
    n_lanes = points.shape[0]
    at = np.full((n_lanes, saves.shape[0]), -1, dtype=np.int64)
    for i in range(n_lanes):
        rows = [points[i, :1]] + [
            points[i, j + 1 : j + 2] if grid is None else grid[1:] for j, grid in enumerate(grids)
        ]
        hit = np.concatenate(rows)[None, :] == saves[:, None]
        found = hit.any(axis=1)
        at[i, found] = np.argmax(hit[found], axis=1)
    return at


def _split_longest(points: np.ndarray, n: int) -> np.ndarray:
    """``points`` with midpoints added (each halving the longest segment) up to ``n + 1``."""
    points = list(points)
    while len(points) < n + 1:
        j = int(np.argmax(np.abs(np.diff(points))))
        points.insert(j + 1, 0.5 * (points[j] + points[j + 1]))
    return np.asarray(points)


def _fires(log: EventLog, points: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Which callbacks fire at each breakpoint (slots in firing order), and each event's
    ``(breakpoint, slot)``."""
    n_lanes, n_points = points.shape
    rows = np.zeros((log.lane.shape[0], 2), dtype=np.int64)
    slot_count = np.zeros((n_points, n_lanes), dtype=np.int64)
    for e in range(log.lane.shape[0]):
        i = int(log.lane[e])
        j = int(np.nonzero(points[i] == float(log.t[e]))[0][0])
        rows[e] = (j, slot_count[j, i])
        slot_count[j, i] += 1
    fires = [
        np.full((int(slot_count[j].max()), n_lanes), -1, dtype=np.int64) for j in range(n_points)
    ]
    for e, (j, m) in enumerate(rows):
        fires[j][m, int(log.lane[e])] = log.callback[e]
    return fires, rows
