"""Differentiated solves with callbacks: integrate event to event, jump at each event.

The forward pass first finds the events without gradients (``event_plan``). Then each
segment between breakpoints is a differentiated solve without callbacks (the primitive of
``differentiable``, with the requested sensitivity algorithm, here or on Dask), and each
event a traced jump (``event_jumps``); autograd chains them. Every sensitivity algorithm
differentiates the segments; the continuous adjoints need the segments' spans shared by all
lanes (always so for a single problem; in ensembles when the lanes' events coincide).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._retcode import ReturnCode
from ..backends import get_backend
from ..events.record import EventRecord
from .differentiable import _leaves_with, _Pass, _Static, per_lane_span_sensealgs, traced_solve
from .event_jumps import EventJumps, Jump
from .event_plan import SegmentPlan, find_events, plan_segments

Array = Any
_SUCCEEDED = (int(ReturnCode.Success), int(ReturnCode.Terminated))


@dataclasses.dataclass
class SegmentedSolve:
    """The saved states ``(L, nsave, *shape)`` (traced), their times (``(nsave,)`` or per lane
    ``(L, nsave)``), the statistics, and the events with traced times and states."""

    saved: Array
    t: np.ndarray
    outcome: dict[str, np.ndarray]
    events: EventRecord


def solve_segmented(
    static: _Static, callbacks: Any, u0_lanes: Array, diff_values: list[Any], scheduler: Any = None
) -> SegmentedSolve:
    """A differentiated solve of lanes ``u0_lanes`` ``(*shape, L)`` with ``callbacks``."""
    import autograd.numpy as anp
    from autograd.tracer import getval

    if get_backend(static.backend).name != "numpy":
        raise NotImplementedError(
            "gradients through callbacks are computed on NumPy only; solve with NumPy arrays"
        )
    values = _leaves_with(static, [np.asarray(getval(v)) for v in diff_values])
    u0_value = np.asarray(getval(u0_lanes))
    log = find_events(static, callbacks, u0_value, values, _Pass(scheduler))
    plan = plan_segments(log, static.t0, static.t1, static.save_grid, static.tstops, static.dtype)
    _check_sensealg(static, plan)
    jumps = EventJumps(static, callbacks, _leaves_with(static, diff_values), values)
    first = jumps.at(u0_lanes, plan.points[:, 0], plan.fires[0])
    marks, outcomes = [first], []
    rows = [anp.moveaxis(u0_lanes, -1, 0)[:, None]]  # (L, 1, *shape), then each segment's
    for j in range(plan.segments):
        a, b = plan.points[:, j], plan.points[:, j + 1]
        segment = dataclasses.replace(static, t0=a, t1=b, save_grid=plan.grids[j], tstops=None)
        saved, outcome = traced_solve(segment, marks[-1].start, diff_values, scheduler)
        outcomes.append(outcome)
        marks.append(jumps.at(anp.moveaxis(saved[:, -1], 0, -1), b, plan.fires[j + 1]))
        # The segment's end row is the state before the events there, at their moving time.
        end = anp.moveaxis(marks[-1].state_before, -1, 0)[:, None]
        rows.append(anp.concatenate([saved[:, 1:-1], end], axis=1))
    saved, t = _saved(static, plan, rows, marks)
    return SegmentedSolve(
        saved, t, _outcome(log.retcode, outcomes), _events(static, callbacks, log, plan, marks)
    )


def _check_sensealg(static: _Static, plan: SegmentPlan) -> None:
    shared = bool(np.all(plan.points == plan.points[:1]))
    if static.sensealg.one_tspan and not shared:
        raise NotImplementedError(
            f"{static.sensealg!r} needs every trajectory's segments between events on one "
            "shared time span, and these trajectories' events happen at different times; use "
            f"{per_lane_span_sensealgs(static.options.alg)}"
        )


def _saved(
    static: _Static, plan: SegmentPlan, rows: list[Array], marks: list[Jump]
) -> tuple[Array, np.ndarray]:
    """The saved states from the segments' saved ``rows`` (``(L, k, *shape)`` blocks): at
    the save times, the states before any event there (NaN after a lane ended, and on lanes
    whose forward pass failed); without a save grid, as the solve without gradients, each
    lane's start and the end of its span: its final state (after the events there), NaN
    where a terminating callback ended the lane before it (its state is in the events)."""
    import autograd.numpy as anp

    n_lanes = plan.points.shape[0]
    if plan.save_at is None:
        last = marks[-1].after[-1] if marks[-1].after else marks[-1].start
        saved = anp.concatenate([rows[0], anp.moveaxis(last, -1, 0)[:, None]], axis=1)
        ends = np.asarray(static.t1, dtype=np.float64).astype(static.dtype).astype(np.float64)
        t = np.stack([plan.points[:, 0], ends], axis=1)
        missing = np.zeros((n_lanes, 2), dtype=bool)
        missing[:, 1] = plan.points[:, -1] != ends  # terminated
        t = t[0] if np.all(t == t[:1]) else t
    else:
        every = anp.concatenate(rows, axis=1)  # (L, rows, *shape)
        at = plan.save_at
        saved = every[np.arange(n_lanes)[:, None], np.maximum(at, 0)]
        missing = at < 0
        t = static.save_grid
    missing = missing | ~plan.ok[:, None]
    if missing.any():
        mask = np.reshape(missing, missing.shape + (1,) * (np.ndim(saved) - 2))
        saved = anp.where(mask, np.nan, saved)
    return saved, t


def _outcome(retcode: np.ndarray, outcomes: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The statistics summed over the segments; the event pass's return code unless a
    segment failed."""
    out = {k: sum(o[k] for o in outcomes) for k in ("nf", "naccept", "nreject")}
    code = retcode.copy()
    for o in outcomes:
        bad = ~np.isin(o["retcode"], _SUCCEEDED) & np.isin(code, _SUCCEEDED)
        code[bad] = o["retcode"][bad]
    out["retcode"] = code
    return out


def _events(
    static: _Static, callbacks: Any, log: Any, plan: SegmentPlan, marks: list[Jump]
) -> EventRecord:
    """The events, with times and states traced (NaN where ``save_positions`` says not),
    gathered per breakpoint and slot, then put in the log's order."""
    import autograd.numpy as anp

    if log.lane.shape[0] == 0:
        empty = np.zeros((0, *np.shape(marks[0].start)[:-1]), dtype=static.dtype)
        return EventRecord(np.zeros(0, dtype=static.dtype), log.callback, log.lane, empty, empty)
    groups: dict[tuple[int, int], list[int]] = {}
    for e, (j, m) in enumerate(plan.event_rows.tolist()):
        groups.setdefault((j, m), []).append(e)
    order, times, before, after = [], [], [], []
    for (j, m), rows in groups.items():
        lanes = log.lane[rows]
        order.extend(rows)
        times.append(anp.reshape(marks[j].t, (-1,))[lanes])
        before.append(marks[j].before[m][..., lanes])
        after.append(marks[j].after[m][..., lanes])
    back = np.argsort(np.asarray(order))
    kept = np.array([cb.save_positions for cb in callbacks])[log.callback]  # (k, 2)

    def states(parts: list[Array], keep: np.ndarray) -> Array:
        rows = anp.moveaxis(anp.concatenate(parts, axis=-1), -1, 0)[back]
        return anp.where(np.reshape(keep, (-1,) + (1,) * (np.ndim(rows) - 1)), rows, np.nan)

    t = anp.concatenate(times)[back]
    return EventRecord(
        t, log.callback, log.lane, states(before, kept[:, 0]), states(after, kept[:, 1])
    )
