"""What the step loop hands each iteration's steps to: the observers and their protocol.

The loop (``dxode.integrator.loop``) only proposes, steps, controls the error, advances and
retires lanes; everything else it does per iteration is an observer's job: stepping onto
``tstops``, continuous and discrete events, filling save points, recording steps for dense
output or for the discrete adjoint. Each iteration the loop calls the hooks of every observer
in this order (a hook an observer does not need is the base class's no-op):

1. ``target`` — before the step: shorten the lanes' targets (``tstops``).
2. ``cut`` — after the accept/reject decision: cut accepted steps short (events), so every
   later hook sees the step ending at ``attempt.t_end`` with state ``attempt.u_end``.
3. ``accepted`` — still before the lanes advance: read the (cut) steps (saving, then the
   recorders, which keep the save points saving filled).
4. ``advanced`` — after the lanes advanced: count landings on ``tstops``, apply events; may
   return lanes to terminate.

``start`` runs once before the first iteration (it may return lanes to terminate at ``t0``)
and ``finish`` once on the result. The observers' per-lane state lives in the working set, so
it is compacted with the lanes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..solvers import Step, StepResult
from .lanes import LaneRecords, LaneResult, Trial, WorkingSet

Array = Any


@dataclasses.dataclass(slots=True)
class Attempt:
    """One iteration's trial steps of the working set, as the observers see them.

    ``step`` is the trial step of every lane (with its dense output); ``f0`` the RHS at its
    start; ``accept`` which lanes accept it; ``hit`` which lanes stepped exactly onto their
    target; ``t_new`` the steps' end times; ``h_next`` the next step sizes and ``finite`` the
    lanes with a finite error (see ``_Loop._control``). ``t_end``/``u_end`` are where the
    accepted steps end after events cut them (``t_new``/``step.u1`` until then), ``which`` the
    continuous callback that fired per lane and ``cut`` the lanes whose step it cut (``None``:
    no event). ``saves`` are the save rounds the step filled (see ``Trial``).
    """

    iteration: int
    step: Step
    result: StepResult
    f0: Array
    accept: Array
    hit: Array
    t_new: Array
    h_next: Array
    finite: Array
    t_end: Array
    u_end: Array
    which: Array | None = None
    cut: Array | None = None
    saves: tuple[tuple[Array, Array, Array], ...] = ()


class Observer:
    """The protocol the loop hands steps to (see the module docstring); every hook a no-op."""

    def start(self, lanes: WorkingSet, rhs: Any) -> Array | None:
        """Set up per-lane state at ``t0``; return lanes to terminate there, or ``None``."""
        return None

    def target(self, lanes: WorkingSet, target: Array) -> Array:
        """The lanes' next targets (``(L,)`` times the step must land on exactly)."""
        return target

    def cut(self, lanes: WorkingSet, attempt: Attempt) -> None:
        """Cut accepted steps short (set ``attempt.t_end``, ``u_end``, ``which``, ``cut``)."""

    def accepted(self, lanes: WorkingSet, attempt: Attempt) -> None:
        """Read the iteration's (cut) steps before the lanes advance."""

    def advanced(self, lanes: WorkingSet, attempt: Attempt) -> Array | None:
        """React to the lanes having advanced; return lanes to terminate, or ``None``."""
        return None

    def finish(self, result: LaneResult) -> None:
        """Add to the result."""


class StopTimes(Observer):
    """Every lane steps exactly onto each of ``tstops`` (ordered in the direction of time).

    Per lane, ``stop_idx`` in the working set counts the stops passed; between ``target`` and
    ``advanced`` of one iteration the observer keeps which lanes aimed at a stop.
    """

    def __init__(self, xp: Any, tstops: Array, direction: float) -> None:
        self._xp, self._tstops, self._direction = xp, tstops, direction
        self._use_stop: Array = None

    def start(self, lanes: WorkingSet, rhs: Any) -> None:
        xp = self._xp
        before = self._direction * (xp.reshape(self._tstops, (-1, 1)) - lanes["t"]) <= 0
        lanes.put(stop_idx=xp.sum(xp.astype(before, xp.int64), axis=0))

    def target(self, lanes: WorkingSet, target: Array) -> Array:
        xp, tstops = self._xp, self._tstops
        stop_idx = lanes["stop_idx"]
        next_stop = xp.take(tstops, xp.clip(stop_idx, max=tstops.shape[0] - 1))
        use_stop = (stop_idx < tstops.shape[0]) & (self._direction * (next_stop - target) < 0)
        self._use_stop = use_stop
        return xp.where(use_stop, next_stop, target)

    def advanced(self, lanes: WorkingSet, attempt: Attempt) -> None:
        landed = attempt.accept & attempt.hit & self._use_stop
        if attempt.cut is not None:
            landed = landed & ~attempt.cut
        lanes.put(stop_idx=lanes["stop_idx"] + self._xp.astype(landed, self._xp.int64))


class Events(Observer):
    """The callbacks of a batch (``dxode.events.lanes.EventHandler``) as an observer."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler

    def start(self, lanes: WorkingSet, rhs: Any) -> Array | None:
        return self._handler.start(lanes, rhs)

    def cut(self, lanes: WorkingSet, attempt: Attempt) -> None:
        located = self._handler.locate(lanes, attempt.step, attempt.accept, attempt.t_new)
        attempt.t_end, attempt.u_end, attempt.which, attempt.cut = located

    def advanced(self, lanes: WorkingSet, attempt: Attempt) -> Array | None:
        return self._handler.apply(lanes, attempt.step.rhs, attempt.accept, attempt.which)

    def finish(self, result: LaneResult) -> None:
        result.events = self._handler.log()


class Saving(Observer):
    """Fill each lane's save points (``(nsave, L)`` times) from the dense output of its steps.

    Each lane keeps its next save time (``inf`` past the last), so a step that passes no save
    point costs three elementwise operations. One grid shared by all lanes is looked up
    without per-lane copies.
    """

    def __init__(
        self,
        backend: Any,
        records: LaneRecords,
        save_times: Array,
        rhs_for: Any,
        direction: float,
        keep_rounds: bool = False,
    ) -> None:
        self._backend, self._xp, self._records = backend, backend.xp, records
        self._rhs_for, self._direction = rhs_for, direction
        self._save_times, self._keep_rounds = save_times, keep_rounds
        self._grid: Array | None = None

    def start(self, lanes: WorkingSet, rhs: Any) -> None:
        xp, t0, n_lanes = self._xp, lanes["t"], lanes.size
        first = self._save_times[0, ...] == t0
        self._records.save(lanes["lane"], xp.zeros(n_lanes, dtype=xp.int64), lanes["u"], first)
        # A sentinel row past the last save time: a lane that saved everything never saves again.
        sentinel = xp.full((1, n_lanes), self._direction * math.inf, dtype=t0.dtype)
        ts = xp.concat([self._save_times, sentinel])
        save_idx = xp.astype(first, xp.int64)
        next_save = _save_time(xp, ts, save_idx)
        if bool(xp.all(ts == ts[:, :1])):
            self._grid = ts[:, 0]  # one grid for all lanes: look it up without per-lane copies
        else:
            lanes.put(ts=ts)
        lanes.put(save_idx=save_idx, next_save=next_save)

    def accepted(self, lanes: WorkingSet, attempt: Attempt) -> None:
        """Fill the save points each accepted lane stepped over, all with one interpolation (a
        dense grid puts hundreds in one step). With ``keep_rounds`` (the discrete adjoint's
        recording) keep them in ``attempt.saves`` as rounds ``(idx, save_idx, theta)``: the
        saving lanes' positions in the working set, their save point numbers and where in the
        step they are (round ``k`` holds each lane's ``k``-th save point in the step)."""
        xp, direction = self._xp, self._direction
        next_save = lanes["next_save"]
        due = attempt.accept & (direction * (next_save - attempt.t_end) <= 0)
        if not bool(xp.any(due)):
            return
        first = lanes["save_idx"]
        if self._grid is None:
            pairs, save_idx, next_save = self._pairs_by_rounds(lanes, attempt, due)
        else:
            pairs, save_idx, next_save = self._pairs_on_grid(attempt, due, first)
        lanes.put(save_idx=save_idx, next_save=next_save)
        theta = self._save(lanes, attempt.step, pairs, save_idx - first)
        if self._keep_rounds:
            positions, numbers, _, offsets = pairs
            rounds = []
            for k in range(int(xp.max(offsets)) + 1):
                sel = xp.nonzero(offsets == k)[0]
                rounds.append(tuple(xp.take(a, sel) for a in (positions, numbers, theta)))
            attempt.saves = tuple(rounds)

    def _pairs_by_rounds(
        self, lanes: WorkingSet, attempt: Attempt, due: Array
    ) -> tuple[tuple[Array, ...], Array, Array]:
        """The save points due, as ``(positions, save numbers, save times, k)`` (``k``: which
        of its lane's points in the step), found one point per lane at a time (per-lane
        grids); with the lanes' new save numbers and next save times."""
        xp, direction = self._xp, self._direction
        next_save, save_idx = lanes["next_save"], lanes["save_idx"]
        rounds = []
        while True:
            idx = xp.nonzero(due)[0]
            k = xp.full(idx.shape, len(rounds), dtype=xp.int64)
            rounds.append((idx, xp.take(save_idx, idx), xp.take(next_save, idx), k))
            save_idx = save_idx + xp.astype(due, xp.int64)
            next_save = xp.where(due, _save_time(xp, lanes["ts"], save_idx), next_save)
            due = due & (direction * (next_save - attempt.t_end) <= 0)
            if not bool(xp.any(due)):
                break
        pairs = tuple(xp.concat([r[i] for r in rounds]) for i in range(4))
        return pairs, save_idx, next_save

    def _pairs_on_grid(
        self, attempt: Attempt, due: Array, save_idx: Array
    ) -> tuple[tuple[Array, ...], Array, Array]:
        """As ``_pairs_by_rounds`` for one grid shared by all lanes: each lane's points in the
        step are the grid's from its save number to the first past the step's end."""
        xp, direction, grid = self._xp, self._direction, self._grid
        assert grid is not None
        # direction * grid is increasing (a sentinel +inf last); d t <= d t_end, as in ``due``
        past = xp.searchsorted(direction * grid, direction * attempt.t_end, side="right")
        new_idx = xp.where(due, xp.astype(past, xp.int64), save_idx)
        idx = xp.nonzero(due)[0]
        counts = xp.take(new_idx - save_idx, idx)
        ends = xp.cumulative_sum(counts)
        j = xp.arange(int(ends[-1]), dtype=xp.int64)
        owner = xp.searchsorted(ends, j, side="right")  # which due lane pair j belongs to
        k = j - xp.take(ends - counts, owner)
        numbers = xp.take(xp.take(save_idx, idx), owner) + k
        pairs = (xp.take(idx, owner), numbers, xp.take(grid, numbers), k)
        return pairs, new_idx, _save_time(xp, grid, new_idx)

    def _save(
        self, lanes: WorkingSet, step: Step, pairs: tuple[Array, ...], counts: Array
    ) -> Array:
        """Save the points ``pairs`` (positions, save numbers, save times, ...) with one
        interpolation; ``counts``: each lane's number of them. Returns their ``theta``."""
        xp, extra_evals = self._xp, step.stepper.interpolation_rhs_evals
        idx, save_idx, t_save = pairs[0], pairs[1], pairs[2]

        def sub(x: Array) -> Array:
            return xp.take(x, idx, axis=-1)

        # Only interpolants with extra stages evaluate the RHS (on the saving lanes alone).
        rhs = self._rhs_for(tuple(sub(p) for p in lanes.group("p"))) if extra_evals else None
        saving = step.take(idx, rhs)
        theta = (t_save - saving.t) / saving.h
        self._records.save(sub(lanes["lane"]), save_idx, saving.interpolate(theta), None)
        if extra_evals:
            lanes.put(nf_extra=lanes["nf_extra"] + extra_evals * counts)
        return theta


class StepRecorder(Observer):
    """Keep every accepted step: its times and the state at its end (``u_end``, for
    save-everything) and, with ``dense``, its own ``u0``, ``u1`` and stages (its dense output;
    ``u_end`` then only with ``cuts``, where events may end a step short of ``u1``)."""

    def __init__(self, records: LaneRecords, dense: bool, cuts: bool) -> None:
        self._records, self._dense, self._cuts = records, dense, cuts

    def accepted(self, lanes: WorkingSet, attempt: Attempt) -> None:
        step = attempt.step
        fields = {"lane": lanes["lane"], "t": step.t, "h": step.h, "t_end": attempt.t_end}
        if self._dense:
            fields.update(u0=step.u0, u1=step.u1, stages=step.stages)
        if self._cuts or not self._dense:
            fields["u_end"] = attempt.u_end
        self._records.step(attempt.accept, **fields)


class TrialRecorder(Observer):
    """Keep every iteration's trial steps as they are, rejected ones included (for the
    discrete adjoint's replay): with their stage inputs or, with ``checkpoint_every``, the
    working set's state and RHS before every ``checkpoint_every``-th iteration."""

    def __init__(self, records: LaneRecords, checkpoint_every: int) -> None:
        self._records, self._every = records, checkpoint_every

    def accepted(self, lanes: WorkingSet, attempt: Attempt) -> None:
        step, every = attempt.step, self._every
        checkpoint = every and (attempt.iteration - 1) % every == 0
        self._records.trial(
            Trial(
                lanes["lane"],
                step.t,
                step.h,
                attempt.t_end,
                attempt.accept,
                attempt.saves,
                None if every else attempt.result.inputs,
                (step.u0, attempt.f0) if checkpoint else None,
            )
        )


def _save_time(xp: Any, ts: Array, save_idx: Array) -> Array:
    """Each lane's save time number ``save_idx`` from a shared ``(nsave,)`` or per-lane grid."""
    if ts.ndim == 1:
        return xp.take(ts, save_idx)
    return xp.squeeze(xp.take_along_axis(ts, save_idx[None, ...], axis=0), axis=0)
