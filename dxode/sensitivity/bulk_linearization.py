"""The discrete adjoint's stage VJPs from a bulk linearization of an autograd-traced ``f``.

Tracing ``f`` with autograd costs a fixed overhead per call, which the per-step backward
sweep pays once per stage and step (thousands of calls, each over a working set of lanes).
After the forward pass every stage input ``y_i`` of every step is known, so the sweep
linearizes ``f`` at all of them at once, a chunk of iterations at a time (all their steps ×
stages × lanes stacked as one batch of columns):

* one trace of ``f`` over the chunk's columns, with the state and the per-lane parameter
  leaves traced (each from its own root), and one reverse pass from each output row
  (``dxode._row_jacobian.linearize``) give ``J = [df/dy | df/dq]`` ``(n, n + m, K)`` at
  every column (``q``: the ``m`` per-lane parameter entries); where ``f`` returns a list of
  rows, each pass visits only the operations its row depends on;
* the recursion of the discrete adjoint (``discrete_adjoint._step_vjp``) then takes each
  stage's ``ȳ_i = J_iᵀ k̄_i`` as a product with the stored Jacobians (plain NumPy, nothing
  traced), and keeps ``k̄_i``;
* the parameter cotangent is linear in the ``k̄_i``: per-lane leaves get theirs per column
  as ``Σ_r J[r, q] k̄_r`` (then summed over each step's stages); leaves shared by the lanes
  (and per-lane leaves beyond ``MAX_LANE_ROWS`` rows) from ONE VJP of ``f`` over the chunk's
  columns with all their ``k̄_i`` stacked (``dxode._row_jacobian.parameter_vjp``).

Autograd traces the columns as ``dxode._column_boxes.Columns``, whose indexing VJP does not
go through ``np.add.at`` (ten times the arithmetic of ``f`` over this many columns).

It is the same discrete adjoint, evaluated in another order: the cotangents agree with the
per-step sweep to rounding. The chunks follow from the record alone, so a checkpointed
sweep (which replays segments into them) keeps the bits of an uncheckpointed one. Memory per
chunk: ``K n (n + m)`` Jacobian entries plus the columns, their cotangents and a trace of
``f``, for ``K`` columns within ``CHUNK_BYTES`` (at least one iteration). Larger chunks pay
autograd's fixed cost per call less often; the chunk's Jacobians, columns and cotangents
live in arrays reused from chunk to chunk, because fresh multi-megabyte arrays cost page
faults on every chunk (glibc returns large freed blocks to the kernel), which outweighed the
arithmetic on a 2-core VM.
Above ``MAX_STATE`` state components (``n`` reverse passes, ``n²`` entries) the per-step sweep
runs instead, and so it does where ``pays`` finds the extra arithmetic (``f``'s work per
lane, counted) larger than the overhead saved. Only autograd-traced RHSs take this path: a
hand-written ``vjp`` or ``jac`` + ``paramjac`` has no tracing overhead to save, only NumPy's
per-call cost, and its Jacobian would take ``n`` VJPs per column. Timed per stage for the
Lorenz VJP (``asv_bench/hand_vjp_bulk_cost.py``, 2-core CPU, 2026-11-24): over 1,000 lanes
the per-step VJP cost 20 µs and the bulk one 29 µs (``Jᵀ k̄`` 7, the Jacobian's share 22 in
chunks of 6,000 columns, 91 in chunks of 60,000), before its parameter VJP; the bulk one wins
only below a few hundred lanes (100 lanes: 12 against 5 µs), where a hand VJP's gradient
is cheap already. A single
trajectory's ``f`` (``single_lane``: written for one state, no lane axis) takes it where it
also computes columns of states ``(*shape, K)`` and times ``(K,)`` column by column, as ``f``
written with arithmetic, rows and ``A @ u`` does: checked on the solve's own stage inputs,
spread over it, every column's value against ``f`` of that column alone (``for_columns``),
and then on every chunk, whose values of ``f`` must rebuild the recorded stage inputs
(``column_check``); where they do not, the sweep starts over step by step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .. import _pytree
from .._row_jacobian import linearize, parameter_vjp
from .._traced_rhs import TracedRHS
from ..backends._base import ordered_sum
from . import column_check, rhs_cost

Array = Any

MAX_STATE = 8  # state components above which the per-step sweep runs (J: n² per column)
# Rows of per-lane parameter leaves traced with the state (J: n (n + rows) per column); the
# others get their cotangents from one VJP per chunk.
MAX_LANE_ROWS = 8
# Extra elements of bulk arithmetic that cost about as much as autograd's overhead for one
# traced operation of the per-step sweep. Re-measured on the current sweep (2-core CPU,
# 2026-11-24, gradients timed both ways: asv_bench/bulk_break_even.py), the break-even
# depends on what f computes, not only on how much: about 5,200 for a 2-32-2 tanh MLP,
# 22,000 for an 8-state tanh system, above 34,000 (every batch size) for Lorenz, which the
# constant sends to the per-step sweep from 4,000 up (2.9x slower at 3,000 lanes). It is the
# lowest: the bulk sweep is chosen only where it won in every measurement.
CALL_ELEMENTS = 4000
CHUNK_BYTES = 8 * 2**20  # per chunk: Jacobians, columns, the trace of f
# Stage inputs on which a single trajectory's f is checked to compute columns one by one.
PROBE_COLUMNS = 11


def applies(rhs: TracedRHS, shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether the backward sweep of a batch with states of ``shape`` (one lane) and
    ``dtype`` linearizes ``rhs`` in bulk: autograd traces it (no ``vjp``, no ``jac`` +
    ``paramjac``; NumPy arrays of real floats), it takes a lane axis, and the state has at
    most ``MAX_STATE`` components."""
    n = math.prod(shape)
    autograd_traced = rhs.vjp is None and not rhs.has_jacobians and rhs.backend.name == "numpy"
    real = autograd_traced and np.issubdtype(np.dtype(dtype), np.floating)
    return real and 0 < n <= MAX_STATE


def prepare(sweep: Any, dtype: Any) -> bool:
    """Whether the bulk linearization runs this sweep (``applies``, ``pays`` and
    ``for_columns``, the cheap checks first); where it does, ``sweep.rhs`` becomes the RHS
    it evaluates over columns. (``pays`` counts ``f``'s work on one column, which is the
    same for a single trajectory's RHS and its column copy.)"""
    if not applies(sweep.rhs, sweep.shape, dtype) or not pays(sweep):
        return False
    rhs = for_columns(sweep)
    if rhs is None:
        return False
    sweep.rhs = rhs
    return True


def for_columns(sweep: Any) -> TracedRHS | None:
    """The RHS to evaluate over columns of stage inputs: the batch's own over lanes; for a
    single trajectory, a copy that hands ``f`` the columns as lanes, where ``f`` gives up to
    ``PROBE_COLUMNS`` of the solve's stage inputs, evaluated together, the values each gives
    alone (to rounding: NumPy's vector and scalar transcendental functions may differ in the
    last bits); else ``None``, and the per-step sweep runs."""
    rhs = sweep.rhs
    if not rhs.single_lane:
        return rhs
    y, t = _probe_columns(sweep)
    if t.shape[0] < 2:
        return None
    columns = dataclasses.replace(rhs, single_lane=False)
    leaves = sweep._leaves_at(sweep.lane[0])
    p = _pytree.rebuild(rhs.p_template, leaves)
    n, k = math.prod(sweep.shape), t.shape[0]
    try:
        with np.errstate(all="ignore"):
            together = np.asarray(columns._plain_value(y, t, p))
            alone = [rhs._plain_value(y[..., j : j + 1], t[j : j + 1], p) for j in range(k)]
            # and autograd traces it over columns as the bulk sweep will
            linearize(columns, y, t, leaves, [], np.empty((n, n, k), dtype=y.dtype))
            if sweep.diff_idx:
                parameter_vjp(columns, y, t, leaves, sweep.diff_idx, np.zeros_like(y))
    except Exception:  # f written for one state (an `if` on a value, math.sin, a reshape)
        return None
    alone = np.concatenate([np.asarray(a) for a in alone], axis=-1)
    return columns if column_check.same_values(together, alone) else None


def _probe_columns(sweep: Any) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``PROBE_COLUMNS`` stage inputs of a single trajectory, ``(*shape, K)``, and their
    times ``(K,)``: from iterations spread evenly over the whole record, each giving its
    share of stages, the first stage turning with the iteration (start states where only
    checkpoints are kept).

    Spread, not the first iterations only: an ``f`` whose branch reads a reduction over the
    state (``if anp.sum(u**2) > 1:``) computes each column alone only while every column is
    on one side of it, and a bulk chunk holding columns from both sides took one branch for
    all of them, a silently wrong gradient, where the first iterations all lay on one side."""
    ys, ts = [], []
    c = np.reshape(np.asarray(sweep.coefficients.c, dtype=np.float64), -1)
    kept = [trial for trial in sweep.trials if trial.inputs is not None or trial.start is not None]
    spread = np.linspace(0, len(kept) - 1, min(len(kept), PROBE_COLUMNS)).round()
    picks = np.unique(spread.astype(int))
    share = max(1, PROBE_COLUMNS // max(len(picks), 1))
    for m, j in enumerate(picks):
        trial = kept[j]
        t, h = float(trial.t[0]), float(trial.h[0])
        if trial.inputs is not None:
            stages = min(len(trial.inputs), c.shape[0])
            for stage in sorted({(m + i) % stages for i in range(share)}):
                ys.append(trial.inputs[stage])
                ts.append(t + c[stage] * h)
        else:
            ys.append(trial.start[0])
            ts.append(t)
    if not ts:
        return np.zeros((*sweep.shape, 0)), np.zeros(0)
    y = np.concatenate([np.asarray(v) for v in ys], axis=-1)
    return y, np.asarray(ts, dtype=y.dtype)


def pays(sweep: Any) -> bool:
    """Whether the bulk linearization should cost less than the per-step sweep for this
    batch: ``extra_per_call(sweep)`` at most ``CALL_ELEMENTS``."""
    extra = extra_per_call(sweep)
    return extra is not None and extra <= CALL_ELEMENTS


def extra_per_call(sweep: Any) -> float | None:
    """The bulk linearization's extra arithmetic, up to ``n`` reverse passes of ``f`` per
    column (fewer where ``f`` returns its rows) and one more trace, plus the ``n²`` Jacobian
    products, in elements per traced operation of ``f`` it saves (whose overhead it saves),
    from ``f``'s operation and element counts (``rhs_cost.probe`` at the first iteration's
    start; shapes only, so the same on every run, checkpointed or not). ``None`` where
    there is nothing to sweep or save, or ``f`` cannot take the counting array."""
    rhs, trials = sweep.rhs, sweep.trials
    if not trials:
        return None
    first = trials[0]
    y = first.inputs[0] if first.inputs is not None else first.start[0]
    p = _pytree.rebuild(rhs.p_template, sweep._leaves_at(sweep.lane[0]))
    try:
        calls, elements = rhs_cost.probe(lambda u: rhs.f(u, p, first.t), y)
    except Exception:  # f that cannot take the counting array: the per-step sweep
        return None
    if calls == 0:  # no overhead to save
        return None
    n = math.prod(sweep.shape)
    lanes = float(np.mean([sweep.size(j) for j in range(len(trials))]))
    per_lane = elements / y.shape[-1]
    return (n * per_lane + n * n) * lanes / calls


class BulkSweep:
    """Runs a discrete-adjoint sweep (``discrete_adjoint._Sweep``) chunk by chunk, with the
    stage VJPs from each chunk's bulk linearization, and hands it the summed parameter
    cotangents at the end.

    ``single``: a single trajectory's own RHS (``f`` for one state), whose values over each
    chunk's columns are checked against the forward pass's (``column_check``) before any
    cotangent is pulled through the chunk: the probe of ``for_columns`` samples the solve and
    misses an ``f`` that mixes columns only briefly (a short spike over a threshold of
    ``anp.max(u)``)."""

    def __init__(self, sweep: Any, single: TracedRHS | None = None) -> None:
        self.sweep = sweep
        self.single = single
        self.xp = sweep.xp
        self.n = math.prod(sweep.shape)
        rhs = sweep.rhs
        self.lane_diff = [rhs.lane_leaf[i] for i in sweep.diff_idx]
        self.lane_wrt, self.shared_wrt = _split_wrt(sweep)
        self.rows = self.n + sum(_lane_rows(sweep.leaves[i]) for i in self.lane_wrt)
        dtype = np.dtype(sweep.u_bar.dtype)
        self.chunk_columns = max(1, CHUNK_BYTES // (dtype.itemsize * self.n * (self.rows + 4)))
        self.buffers = _Buffers(dtype)
        self.totals: list[Any] | None = None  # parameter cotangents, all lanes

    def run(self, inputs: Any) -> bool:
        """The whole sweep, last iteration to first, chunk by chunk; ``inputs(j)`` gives
        iteration ``j``'s stage inputs and ``inputs.release(first)`` frees those of the
        iterations from ``first`` on. The chunks depend on the record alone (not on where
        the inputs come from), so a checkpointed sweep gives the same bits. ``False`` (the
        sweep left half done, to be discarded) where a single trajectory's ``f`` did not
        compute a chunk's columns one by one."""
        sweep = self.sweep
        plans = [self._plan(j) for j in range(len(sweep.trials))]
        bounds = [0]
        columns = 0
        for j, plan in enumerate(plans):
            width = len(plan) * sweep.size(j)
            if columns and columns + width > self.chunk_columns:
                bounds.append(j)
                columns = 0
            columns += width
        bounds.append(len(plans))
        for first, end in zip(reversed(bounds[:-1]), reversed(bounds[1:]), strict=True):
            chunk_inputs = [inputs(j) for j in range(first, end)]
            if not self._chunk(first, end, plans[first:end], chunk_inputs):
                return False
            inputs.release(first)
        if self.totals is not None:
            sweep.add_leaf_cotangents(self.totals)
        return True

    def _plan(self, j: int) -> list[int]:
        """The stages whose VJPs the backward step of iteration ``j`` takes (none if no lane
        accepted)."""
        sweep = self.sweep
        if not sweep.accept[j].any():
            return []
        return sweep.coefficients.stages_pulled(sweep.has_inside(j))

    def _chunk(self, first: int, end: int, plans: list, inputs: list) -> bool:
        """Linearize ``f`` at the stage inputs of iterations ``first .. end - 1``, pull the
        cotangents back through them (last to first) and add their parameter cotangents;
        ``False`` (nothing pulled) where a single trajectory's ``f`` mixed the columns."""
        sweep, n = self.sweep, self.n
        columns, handles = self._stack(first, plans, inputs)
        if columns is None:  # no lane accepted at any of these iterations
            for j in range(end - 1, first - 1, -1):
                sweep.step_back(j, inputs[j - first])
            return True
        y, t, lanes = columns
        state = np.reshape(y, (*sweep.shape, y.shape[-1]))
        leaves = sweep._leaves_at(lanes)
        out = self.buffers.get("jac", (n, self.rows, state.shape[-1]))
        values = None if self.single is None else self.buffers.get("values", (n, y.shape[-1]))
        jac = linearize(sweep.rhs, state, t, leaves, self.lane_wrt, out, values)
        if values is not None and not self._columns_alone(first, inputs, handles, values, y, t):
            return False
        k_bars = self.buffers.get("k_bars", (n, state.shape[-1]))
        stage_vjp = _StageVJP(jac[:, :n], k_bars)
        for j in range(end - 1, first - 1, -1):
            sweep.step_back(j, handles[j - first], vjp=stage_vjp)
        if sweep.diff_idx:
            self._add(self._parameter_bars(jac, k_bars, state, t, leaves), first, plans)
        return True

    def _columns_alone(
        self, first: int, inputs: list, handles: list, values: Array, y: Array, t: Array
    ) -> bool:
        """Whether the chunk's values of ``f`` ``(n, K)`` at its columns ``y`` ``(n, K)``
        and times ``t`` ``(K,)`` are those of each column alone (``column_check``; a single
        trajectory's stage fills one column)."""
        sweep, single = self.sweep, self.single
        p = _pytree.rebuild(single.p_template, sweep._leaves_at(sweep.lane[0]))
        steps = []
        for k, stage_handles in enumerate(handles):
            pulled = tuple(i for i, ab in enumerate(stage_handles) if ab is not None)
            if not pulled:
                continue
            following = inputs[k + 1][0] if k + 1 < len(inputs) else None
            starts = tuple(stage_handles[i][0] for i in pulled)
            h = sweep.trials[first + k].h
            steps.append(column_check.ChunkStep(pulled, starts, inputs[k], h, following))

        def alone(column: int) -> Array:
            state = np.reshape(y[:, column : column + 1], (*sweep.shape, 1))
            return np.reshape(single._plain_value(state, t[column : column + 1], p), (self.n, 1))

        return column_check.chunk_agrees(sweep.stepper.tableau, steps, values, y, alone)

    def _parameter_bars(
        self, jac: Array, k_bars: Array, state: Array, t: Array, leaves: list[Any]
    ) -> list[Any]:
        """The chunk's parameter cotangents, one entry per differentiated leaf: per-lane
        leaves traced with the state from their Jacobian columns (``Σ_r J[r, q] k̄_r`` per
        column), the others from ONE VJP over the chunk's columns."""
        sweep, n = self.sweep, self.n
        bars: dict[int, Any] = {}
        if self.lane_wrt:
            q_bars = np.einsum("rqk,rk->qk", jac[:, n:], k_bars)
            offset = 0
            for i in self.lane_wrt:
                size = _lane_rows(leaves[i])
                bars[i] = np.reshape(q_bars[offset : offset + size], leaves[i].shape)
                offset += size
        if self.shared_wrt:
            v = np.reshape(k_bars, state.shape)
            vjps = parameter_vjp(sweep.rhs, state, t, leaves, self.shared_wrt, v)
            bars.update(zip(self.shared_wrt, vjps, strict=True))
        return [bars[i] for i in sweep.diff_idx]

    def _stack(self, first: int, plans: list, inputs: list) -> tuple[Any, list]:
        """The chunk's columns ``(y (n, K), t (K,), host lane numbers (K,))`` (``None`` if
        empty) and, per iteration, the stage handles ``(a, b)`` (column ranges) that stand in
        for its stage inputs. A lane that did not accept contributes its start state at the
        step's start time (as in the per-step sweep), so overflowed rejected stages never
        reach the cotangents."""
        sweep, n = self.sweep, self.n
        co = sweep.coefficients
        widths = [len(plan) * sweep.size(first + k) for k, plan in enumerate(plans)]
        handles: list[tuple] = [(None,) * len(stage_inputs) for stage_inputs in inputs]
        total = sum(widths)
        if not total:
            return None, handles
        y = self.buffers.get("y", (n, total))
        t = self.buffers.get("t", (total,))
        lanes = []
        offset = 0
        for k, plan in enumerate(plans):
            if not plan:
                continue
            j = first + k
            trial, accept = sweep.trials[j], sweep.accept[j]
            width = int(accept.shape[0])
            end = offset + len(plan) * width
            idle = None if accept.all() else ~accept
            h = trial.h if idle is None else np.where(idle, 0.0, trial.h)
            columns = np.reshape(y[:, offset:end], (n, len(plan), width))  # a view
            np.stack([np.reshape(inputs[k][i], (n, width)) for i in plan], axis=1, out=columns)
            if idle is not None:
                np.copyto(columns, np.reshape(inputs[k][0], (n, 1, width)), where=idle)
            stage_times = trial.t + co.c * h  # (stages, width)
            np.take(stage_times, plan, axis=0, out=np.reshape(t[offset:end], (len(plan), width)))
            stage: list[Any] = [None] * len(inputs[k])
            for m, i in enumerate(plan):
                stage[i] = (offset + m * width, offset + (m + 1) * width)
            handles[k] = tuple(stage)
            lanes.append(np.tile(sweep.lane[j], len(plan)))
            offset = end
        return (y, t, np.concatenate(lanes)), handles

    def _add(self, leaf_bars: list[Any], first: int, plans: list) -> None:
        """Add a chunk's parameter cotangents: shared leaves as summed by the VJP, per-lane
        ones summed over each iteration's stages and added to its lanes, last iteration
        first."""
        xp, sweep = self.xp, self.sweep
        if self.totals is None:
            self.totals = [
                xp.zeros((*bar.shape[:-1], sweep.n_lanes), dtype=bar.dtype) if lane else 0.0
                for bar, lane in zip(leaf_bars, self.lane_diff, strict=True)
            ]
        for m, (bar, lane) in enumerate(zip(leaf_bars, self.lane_diff, strict=True)):
            if not lane:
                self.totals[m] = self.totals[m] + bar
                continue
            leaf_rows = math.prod(bar.shape[:-1])
            flat = xp.reshape(bar, (leaf_rows, bar.shape[-1]))
            total = xp.reshape(self.totals[m], (leaf_rows, self.totals[m].shape[-1]))
            ends = np.cumsum([len(plan) * sweep.size(first + k) for k, plan in enumerate(plans)])
            for k in range(len(plans) - 1, -1, -1):  # last to first, as chunks: bits by record
                plan, width = plans[k], sweep.size(first + k)
                if not plan:
                    continue
                span = flat[:, int(ends[k]) - len(plan) * width : int(ends[k])]
                per_stage = xp.moveaxis(xp.reshape(span, (leaf_rows, len(plan), width)), 1, 0)
                summed = ordered_sum(xp, per_stage)
                if width == sweep.n_lanes:  # every lane, in order (working sets are sorted)
                    total += summed
                    continue
                lanes = sweep._device_index(sweep.lane[first + k])
                total = sweep.backend.add_to_lanes(total, lanes, summed)
            self.totals[m] = xp.reshape(total, tuple(self.totals[m].shape))


class _Buffers:
    """Work arrays reused from chunk to chunk, by name: a chunk's Jacobians and columns are
    megabytes, and fresh ones would cost their page faults on every chunk (glibc hands large
    freed blocks back to the kernel)."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.memory: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A C-contiguous array of ``shape`` (contents undefined) on ``name``'s memory."""
        size = math.prod(shape)
        memory = self.memory.get(name)
        if memory is None or memory.shape[0] < size:
            memory = self.memory[name] = np.empty(size, dtype=self.dtype)
        return np.reshape(memory[:size], shape)


def _lane_rows(leaf: Any) -> int:
    """The Jacobian columns a per-lane leaf ``(..., L)`` takes (one per lane scalar)."""
    return math.prod(leaf.shape[:-1])


def _split_wrt(sweep: Any) -> tuple[list[int], list[int]]:
    """The differentiated leaves traced with the state (per-lane arrays, up to
    ``MAX_LANE_ROWS`` rows together, the first ones in order), and the others (their
    cotangents from one VJP per chunk)."""
    rhs, leaves = sweep.rhs, sweep.leaves
    with_state: list[int] = []
    rows = 0
    for i in sweep.diff_idx:
        leaf = leaves[i]
        lane_array = rhs.lane_leaf[i] and isinstance(leaf, np.ndarray)
        if lane_array and rows + _lane_rows(leaf) <= MAX_LANE_ROWS:
            with_state.append(i)
            rows += _lane_rows(leaf)
    return with_state, [i for i in sweep.diff_idx if i not in with_state]


class _StageVJP:
    """``vjp(handle, t, v, out=None) -> (Jᵀ v, [])`` for the stage whose columns are
    ``handle = (a, b)`` of the chunk's state Jacobians ``J`` ``(n, n, K)``; keeps ``v`` (the
    stage's ``k̄``) in column ``a .. b`` of ``k_bars`` ``(n, K)`` for the parameter
    cotangents. NumPy only (as the bulk linearization): ``Jᵀ v`` is written into ``out`` where
    given (one ``einsum`` over the ``n`` rows)."""

    def __init__(self, jac: Array, k_bars: Array) -> None:
        self.jac, self.k_bars = jac, k_bars
        k_bars[...] = 0.0  # a stage the sweep does not pull back adds nothing

    def __call__(
        self, handle: tuple[int, int], t: Array, v: Array, out: Array | None = None
    ) -> tuple[Array, list[Any]]:
        a, b = handle
        n = self.k_bars.shape[0]
        flat = np.reshape(v, (n, b - a))
        self.k_bars[:, a:b] = flat
        if out is None or out.shape != v.shape or not out.flags.c_contiguous:
            out = np.empty(v.shape, dtype=self.k_bars.dtype)
        np.einsum("rcw,rw->cw", self.jac[:, :, a:b], flat, out=np.reshape(out, (n, b - a)))
        return out, []
