"""The discrete adjoint: the exact gradient of the Runge–Kutta steps the forward pass took.

The forward pass keeps every iteration's trial steps of its working set by reference
(``Trial``): times, step sizes, which lanes accepted, and the stage inputs ``y_i`` where it
evaluated ``f``, or, with checkpoints, the working set's state every ``k``-th iteration, from
which a segment's stage inputs are recomputed by the same arithmetic. The backward pass
replays the iterations in reverse, every lane at once, with no per-step gathers. At each
accepted step it adds the cotangents ``ḡ_s`` of the save points the step produced and pulls
the cotangent back through the stages:

    k̄_i = h (b_i ū_{n+1} + Σ_{l>i} a_li ȳ_l + Σ_s w_i(θ_s) ḡ_s),
    (ȳ_i, p̄_i) = VJP of f at y_i applied to k̄_i,
    ū_n = ū_{n+1} + Σ_i ȳ_i + Σ_s ḡ_s,    p̄ += Σ_i p̄_i,

where a save point inside the step at ``θ_s`` is the dense output ``u_n + h Σ_i w_i(θ_s) k_i``
and one at the step's end (``θ = 1``, the end state itself) enters ``ū_{n+1}``. A lane that did
not accept at an iteration (rejected, retired or failed) keeps its cotangents. Where
autograd would trace ``f`` for each of those VJPs, ``bulk_linearization`` evaluates them from
Jacobians linearized at all recorded stage inputs at once (the same sweep, fewer traces).
An FSAL method's last stage, which only the dense output uses, is evaluated at the step's
end state, where the lane's next step takes its first VJP: ``fsal_carry`` adds its cotangent
there instead of pulling it back over the whole working set wherever a lane saves inside a
step (6 VJPs per Tsit5 step instead of 7; 8 % off the 1,000-trajectory Lorenz sweep).

Step sizes are constants of the computed solution (not differentiated), so the result is the
gradient of exactly what the forward pass computed. Every array operation goes through the
batch's backend, so the sweep runs where the forward pass ran (NumPy, CuPy, any array-API
library); the bookkeeping (which lanes accepted, which save points a step produced) is
computed once on the host.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

import numpy as np

from .._retcode import ReturnCode
from .._traced_rhs import TracedRHS
from ..backends import to_host
from ..backends._base import ordered_sum
from ..integrator.lanes import Trial
from ..integrator.replay import replay
from . import bulk_linearization, fsal_carry

Array = Any


def backward(
    backend: Any,
    stepper: Any,
    rhs: TracedRHS,
    trials: list[Trial],
    leaves: list[Any],
    save_grid: np.ndarray | None,
    t0: np.ndarray,
    retcodes: np.ndarray,
    cotangent: Array,
    rhs_for: Any = None,
) -> tuple[Array, list[Any]]:
    """Cotangents of the initial states and of the differentiable parameter leaves.

    Parameters
    ----------
    backend : Backend
        Where the batch's arrays live and the sweep computes.
    trials : list of Trial
        The forward pass's iterations in order, with their stage inputs or checkpoints.
    leaves : list
        The batch's parameter leaf values (per-lane leaves have a trailing lane axis).
    save_grid : (nsave,) host array or None
        Save times shared by the lanes, in the direction of integration; ``None``: each lane
        saves its own start and end (save index 0 is its ``t0``).
    t0 : (L,) host array
        Start times.
    retcodes : (L,) int host array
        Lanes that failed get NaN cotangents (their saved values are not a solution).
    cotangent : (L, nsave, *shape) array
        Cotangent of the saved states (on the backend).
    rhs_for : callable, optional
        The plain lane RHS for per-lane leaf values: recomputes the stage inputs of
        checkpointed trials.

    Returns
    -------
    u0_bar : (*shape, L) array
    leaf_bars : list
        One entry per differentiable leaf: per-lane leaves ``(..., L)``; shared leaves summed.
    """

    def new_sweep() -> _Sweep:
        return _Sweep(backend, stepper, rhs, trials, leaves, save_grid, retcodes, cotangent)

    sweep = new_sweep()
    checkpointed = bool(trials) and trials[0].inputs is None
    with backend.ignore_fp_errors():  # rejected trials may hold overflowed stages
        if bulk_linearization.prepare(sweep, cotangent.dtype):
            inputs = _Replayed(sweep, rhs_for) if checkpointed else _Recorded(trials)
            single = rhs if rhs.single_lane else None
            if bulk_linearization.BulkSweep(sweep, single).run(inputs):
                return sweep.finish(t0)
            sweep = new_sweep()  # f mixed a chunk's columns: start over, step by step
        if checkpointed:
            _checkpointed_sweep(sweep, rhs_for)
        else:
            for j in range(len(trials) - 1, -1, -1):
                sweep.step_back(j, trials[j].inputs)
    return sweep.finish(t0)


def _checkpointed_sweep(sweep: _Sweep, rhs_for: Any) -> None:
    """The sweep segment by segment, last to first: each segment's stage inputs are recomputed
    from its checkpoint with the recorded step sizes and acceptances (the forward pass's own
    arithmetic, so the same values to the last bit), then pulled back through."""
    trials = sweep.trials
    starts = [j for j, trial in enumerate(trials) if trial.start is not None]
    ends = [*starts[1:], len(trials)]
    for first, end in zip(reversed(starts), reversed(ends), strict=True):
        inputs = _replay_forward(sweep, rhs_for, first, end)
        for j in range(end - 1, first - 1, -1):
            sweep.step_back(j, inputs[j - first])


class _Recorded:
    """Iteration ``j``'s stage inputs, as the forward pass kept them (``inputs(j)``)."""

    def __init__(self, trials: list[Trial]) -> None:
        self.trials = trials

    def __call__(self, j: int) -> tuple[Array, ...]:
        return self.trials[j].inputs

    def release(self, first: int) -> None:
        """Nothing to free: the record holds them."""


class _Replayed:
    """Iteration ``j``'s stage inputs, recomputed segment by segment from the checkpoints
    (``_replay_forward``); a segment stays until ``release`` says the sweep is past it."""

    def __init__(self, sweep: _Sweep, rhs_for: Any) -> None:
        self.sweep, self.rhs_for = sweep, rhs_for
        trials = sweep.trials
        self.starts = [j for j, trial in enumerate(trials) if trial.start is not None]
        self.segments: dict[int, list[tuple]] = {}

    def __call__(self, j: int) -> tuple[Array, ...]:
        s = bisect.bisect_right(self.starts, j) - 1
        first = self.starts[s]
        if first not in self.segments:
            end = self.starts[s + 1] if s + 1 < len(self.starts) else len(self.sweep.trials)
            self.segments[first] = _replay_forward(self.sweep, self.rhs_for, first, end)
        return self.segments[first][j - first]

    def release(self, first: int) -> None:
        """Free the segments that start at or after iteration ``first`` (swept)."""
        self.segments = {a: seg for a, seg in self.segments.items() if a < first}


def _replay_forward(sweep: _Sweep, rhs_for: Any, first: int, end: int) -> list[tuple]:
    """The stage inputs of trials ``first .. end - 1``, from the checkpoint at ``first`` (the
    integrator in replay mode)."""

    def keep_at(i: int) -> Array | None:
        j = first + i
        return sweep.positions(j - 1, j) if sweep.size(j) != sweep.size(j - 1) else None

    def rhs_at(i: int) -> Any:
        return rhs_for(tuple(sweep.lane_leaves(first + i)))

    return replay(sweep.backend, sweep.stepper, sweep.trials[first:end], rhs_at, keep_at)


class _Sweep:
    """The backward sweep's running cotangents in the current iteration's working-set layout."""

    def __init__(
        self,
        backend: Any,
        stepper: Any,
        rhs: TracedRHS,
        trials: list[Trial],
        leaves: list[Any],
        save_grid: np.ndarray | None,
        retcodes: np.ndarray,
        cotangent: Array,
    ) -> None:
        xp = self.xp = backend.xp
        self.backend, self.stepper, self.rhs = backend, stepper, rhs
        self.trials, self.leaves = trials, leaves
        self.n_lanes, self.n_save = cotangent.shape[0], cotangent.shape[1]
        self.shape = tuple(cotangent.shape[2:])
        self.lanes_last = (*range(1, len(self.shape) + 1), 0)  # (k, *shape) -> (*shape, k)
        self.save_grid = save_grid
        # Cotangents of the saved states as rows ``lane * nsave + save index``.
        self.g = xp.reshape(cotangent, (self.n_lanes * self.n_save, *self.shape))
        self.failed = ~np.isin(retcodes, [int(ReturnCode.Success), int(ReturnCode.Terminated)])
        self._bookkeeping(trials)
        self.coefficients = _StageWeights(stepper, xp, cotangent[0, 0, ...][..., None])
        # The dense-only FSAL stage's save cotangents, moved to the next steps' first stages
        # (``fsal_carry``), and where it is still pulled back (None: wherever a save is inside).
        self.carries: dict[int, list[tuple[Array, Array]]] = {}
        self.dense_in_place: set[int] | None = None
        self._gather_saves(trials)
        self.diff_idx = rhs.diff_positions()
        self.shared_diff = any(not rhs.lane_leaf[i] for i in self.diff_idx)
        # State in the layout of the last iteration's working set (all lanes if none ran).
        self.layout = self.lane[-1] if trials else np.arange(self.n_lanes)
        self.u_bar = xp.zeros((*self.shape, self.layout.shape[0]), dtype=cotangent.dtype)
        width = int(self.layout.shape[0])
        self.leaf_bars = [
            _zero_cotangent(xp, leaves[i], width if rhs.lane_leaf[i] else None)
            for i in self.diff_idx
        ]
        self._layout_leaves()

    def _bookkeeping(self, trials: list[Trial]) -> None:
        """Host copies of every trial's lanes and acceptances (one transfer from a device)."""
        xp = self.xp
        sizes = [int(trial.lane.shape[0]) for trial in trials]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if xp is np or not trials:  # on the host already
            self.lane = [trial.lane for trial in trials]
            self.accept = [trial.accept for trial in trials]
        else:
            self.lane = _pieces(to_host(xp.concat([tr.lane for tr in trials])), self.offsets)
            self.accept = _pieces(to_host(xp.concat([tr.accept for tr in trials])), self.offsets)
        if self.failed.any():
            self.accept = [
                accept & ~self.failed[lane]
                for accept, lane in zip(self.accept, self.lane, strict=True)
            ]

    def size(self, j: int) -> int:
        return int(self.offsets[j + 1] - self.offsets[j])

    def positions(self, j_from: int, j_to: int) -> Array:
        """Where trial ``j_to``'s lanes sit in trial ``j_from``'s working set (device)."""
        return self._device_index(np.searchsorted(self.lane[j_from], self.lane[j_to]))

    def _leaves_at(self, lanes: np.ndarray) -> list[Any]:
        """Every parameter leaf as a working set of ``lanes`` sees it (per-lane ones taken)."""
        idx = self._device_index(lanes)
        return [
            self.xp.take(leaf, idx, axis=-1) if lane else leaf
            for leaf, lane in zip(self.leaves, self.rhs.lane_leaf, strict=True)
        ]

    def lane_leaves(self, j: int) -> list[Any]:
        """The per-lane parameter leaves in trial ``j``'s layout, in order."""
        leaves = self._leaves_at(self.lane[j])
        return [leaf for leaf, lane in zip(leaves, self.rhs.lane_leaf, strict=True) if lane]

    def _layout_leaves(self) -> None:
        """The parameter leaves and the RHS's VJP for the current layout."""
        self.stage_vjp = self.rhs.vjp_for(self._leaves_at(self.layout))

    def _device_index(self, host: np.ndarray) -> Array:
        return self.backend.asarray(np.asarray(host, dtype=np.int64), dtype=self.xp.int64)

    def _device_mask(self, host: np.ndarray) -> Array:
        return self.backend.asarray(host, dtype=self.xp.bool)

    def _spread(self, keys: Array, rows: Array, width: int) -> Array:
        """``rows`` (lanes first) placed at positions ``keys`` of a working set of ``width``
        lanes, lanes last; the other lanes hold zeros."""
        xp = self.xp
        return xp.moveaxis(self.backend.scatter_rows(keys, rows, width, 0.0), 0, -1)

    def _relayout(self, lanes: np.ndarray) -> None:
        """Move the running cotangents into the (larger) layout ``lanes``: the lanes that had
        retired meanwhile start with zero cotangents."""
        keys = self._device_index(np.searchsorted(lanes, self.layout))
        width = int(lanes.shape[0])
        self.u_bar = self._spread(keys, self.xp.moveaxis(self.u_bar, -1, 0), width)
        self.leaf_bars = [
            self._spread(keys, self.xp.moveaxis(bar, -1, 0), width)
            if self.rhs.lane_leaf[i]
            else bar
            for bar, i in zip(self.leaf_bars, self.diff_idx, strict=True)
        ]
        self.layout = lanes
        self._layout_leaves()

    def has_inside(self, j: int) -> bool:
        """Whether iteration ``j``'s backward step pulls back the stages only the dense output
        uses: a save point lies inside one of its steps (and, for an FSAL method, inside a
        lane's last step: see ``fsal_carry``)."""
        if self.dense_in_place is not None:
            return j in self.dense_in_place
        return any(w is not None and not at_end.all() for _, _, w, at_end in self.rounds.get(j, ()))

    def step_back(self, j: int, inputs: tuple[Array, ...], vjp: Any = None) -> None:
        """Pull the cotangents back through iteration ``j``'s accepted steps: with the RHS's
        traced VJP at the stage ``inputs``, or with ``vjp`` at the stage handles ``inputs``
        (a bulk linearization's, which gives the parameter cotangents later)."""
        xp, trial = self.xp, self.trials[j]
        if self.size(j) != self.layout.shape[0]:  # the forward pass compacted after iteration j
            self._relayout(self.lane[j])
        accept = self.accept[j]
        if not accept.any():
            return
        h = trial.h
        idle = not accept.all()
        if idle:
            mask = self._device_mask(accept)
            h = xp.where(mask, h, xp.zeros_like(h))
            if self.shared_diff and vjp is None:  # idle lanes pull zero through their start
                inputs = (inputs[0], *(xp.where(mask, y, inputs[0]) for y in inputs[1:]))
        ends, inside = self._save_cotangents(j)
        u_bar, step_bars = _step_vjp(
            self.backend,
            self.coefficients,
            self.stage_vjp if vjp is None else vjp,
            inputs,
            trial.t,
            h,
            self.u_bar,
            ends,
            inside,
            self.has_inside(j),
            self.carries.get(j, ()),
        )
        if idle:
            u_bar = xp.where(mask, u_bar, self.u_bar)
        self.u_bar = u_bar
        if not step_bars:  # a bulk linearization adds the parameter cotangents
            return
        if idle:
            step_bars = [
                xp.where(mask, bar, xp.zeros_like(bar)) if self.rhs.lane_leaf[i] else bar
                for bar, i in zip(step_bars, self.diff_idx, strict=True)
            ]
        self.leaf_bars = [a + b for a, b in zip(self.leaf_bars, step_bars, strict=True)]

    def _gather_saves(self, trials: list[Trial]) -> None:
        """Every save round's cotangents ``ḡ`` (and dense-output weights ``w(θ)``), gathered
        for all rounds at once: ``self.rounds[j]`` lists trial ``j``'s rounds as
        ``(positions, ḡ (*shape, k), w (stages, 1, ..., k) or None, host θ == 1 flags)``."""
        xp = self.xp
        found = [(j, *r) for j, trial in enumerate(trials) for r in trial.saves]
        self.rounds: dict[int, list] = {}
        if not found:
            return
        sizes = np.array([int(idx.shape[0]) for _, idx, _, _ in found], dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        positions = np.asarray(to_host(xp.concat([r[1] for r in found])))
        save_idx = np.asarray(to_host(xp.concat([r[2] for r in found])))
        theta = xp.concat([r[3] for r in found])
        at_end = np.asarray(to_host(theta == 1))
        pieces = _pieces(positions, bounds)
        lanes = np.concatenate([self.lane[r[0]][pos] for r, pos in zip(found, pieces, strict=True)])
        rows = xp.take(self.g, self._device_index(lanes * self.n_save + save_idx), axis=0)
        g = xp.permute_dims(rows, self.lanes_last)  # (*shape, total)
        landing = bool(self.stepper.interpolation_rhs_evals)  # extra stages: saves at step ends
        weights = None if landing else self.stepper.interpolation_weights(xp, g, theta)
        co = self.coefficients
        if weights is not None and fsal_carry.applies(self.stepper, co.last, co.used[0]):
            iteration = np.repeat(np.array([r[0] for r in found], dtype=np.int64), sizes)
            weights, self.carries, self.dense_in_place = fsal_carry.plan(
                self, iteration, positions, lanes, at_end, g, weights
            )
        for (j, idx, _, _), (a, b) in zip(found, itertools.pairwise(bounds.tolist()), strict=True):
            w = None if weights is None else weights[..., a:b]
            self.rounds.setdefault(j, []).append((idx, g[..., a:b], w, at_end[a:b]))

    def _save_cotangents(self, j: int) -> tuple[list, list]:
        """The cotangents of the save points trial ``j``'s steps filled, on the saving lanes
        only: ``ends``, pairs ``(positions, ḡ)`` of those at the steps' ends (``θ = 1``: the
        end state itself), and ``inside``, triples ``(positions, w(θ), ḡ)`` of those inside
        them (the dense output)."""
        xp = self.xp
        ends: list = []
        inside: list = []
        for idx, g, weights, at_end in self.rounds.get(j, ()):
            if weights is None or at_end.all():
                ends.append((idx, g))
                continue
            if at_end.any():
                mask = self._device_mask(at_end)
                zero = xp.zeros_like(g)
                ends.append((idx, xp.where(mask, g, zero)))
                g = xp.where(mask, zero, g)
            inside.append((idx, weights, g))
        return ends, inside

    def add_leaf_cotangents(self, bars: list[Any]) -> None:
        """Add cotangents of the differentiated leaves (per-lane ones over all lanes)."""
        if self.layout.shape[0] != self.n_lanes:
            self._relayout(np.arange(self.n_lanes))
        self.leaf_bars = [a + b for a, b in zip(self.leaf_bars, bars, strict=True)]

    def finish(self, t0: np.ndarray) -> tuple[Array, list[Any]]:
        """Add the save points at ``t0``; NaN for failed lanes (and the leaves they share)."""
        xp, backend = self.xp, self.backend
        if self.layout.shape[0] != self.n_lanes:
            self._relayout(np.arange(self.n_lanes))
        at = _save_index(self.save_grid, np.asarray(t0, dtype=np.float64))
        rows = xp.take(
            self.g, self._device_index(self.layout * self.n_save + np.maximum(at, 0)), axis=0
        )
        entering = xp.moveaxis(rows, 0, -1)
        u_bar = self.u_bar + xp.where(self._device_mask(at >= 0), entering, xp.zeros_like(entering))
        leaf_bars = self.leaf_bars
        if np.any(self.failed):
            bad = self._device_mask(self.failed)
            nan = backend.asarray(float("nan"), dtype=u_bar.dtype)
            u_bar = xp.where(bad, nan, u_bar)
            for j, i in enumerate(self.diff_idx):
                if self.rhs.lane_leaf[i]:
                    leaf_bars[j] = xp.where(bad, nan, leaf_bars[j])
                else:
                    leaf_bars[j] = leaf_bars[j] * float("nan")
        return u_bar, leaf_bars


class _StageWeights:
    """A method's coefficients for the backward step.

    The scratch array's rows hold the stage cotangents ``ȳ_0 .. ȳ_q`` of the stages that
    feed the step's end state (``q = last_used``), then ``ū_{n+1}``, then those of the stages
    only the dense output uses (an FSAL method's last stage), which are needed only when a
    save point lies inside the step. ``b`` is the column ``b_0 .. b_last`` and ``below[l]``
    the column ``a_l0 .. a_l(l-1)`` (what ``ȳ_l`` adds to the earlier stages' ``k̄ / h``).
    """

    def __init__(self, stepper: Any, xp: Any, like: Array) -> None:
        tab = stepper.tableau
        s = tab.stages
        a, b = np.asarray(tab.a, dtype=np.float64), np.asarray(tab.b, dtype=np.float64)
        self.used = [b[i] != 0.0 or bool(np.any(a[i + 1 :, i] != 0.0)) for i in range(s)]
        dense = np.any(np.asarray(tab.interpolant, dtype=np.float64)[:s] != 0.0, axis=1)
        q = self.last_used = max(i for i in range(s) if self.used[i])
        self.last = max(i for i in range(s) if self.used[i] or dense[i])
        self.row = [i if i <= q else i + 1 for i in range(self.last + 1)]
        self.c = stepper._coefs(xp, like).c
        trailing = (1,) * like.ndim
        dev = getattr(like, "device", None)

        def column(values: np.ndarray) -> Array:
            host = [float(x) for x in values]
            return xp.reshape(xp.asarray(host, dtype=like.dtype, device=dev), (-1, *trailing))

        self.b = column(b[: self.last + 1])
        self.below = [column(a[i, :i]) for i in range(self.last + 1)]
        # Per ``dense`` flag: the stages last to first as ``(i, scratch row, pulled, below)``.
        self.backward_order = {
            inside: [
                (i, self.row[i], i in self.stages_pulled(inside), self.below[i])
                for i in range(self.last if inside else q, -1, -1)
            ]
            for inside in (False, True)
        }
        self._scratch: Array | None = None

    def stages_pulled(self, inside: bool) -> list[int]:
        """The stages a backward step pulls back through, first to last: those that feed the
        end state, and with a save point inside the step those only the dense output uses."""
        last = self.last if inside else self.last_used
        return [i for i in range(last + 1) if inside or self.used[i]]

    def scratch(self, xp: Any, like: Array) -> Array:
        """A ``(last + 2, *like.shape)`` array for a step's cotangents, reused from step to
        step (a fresh one per step would cost a large allocation each time)."""
        shape = (self.last + 2, *like.shape)
        if self._scratch is None or tuple(self._scratch.shape) != shape:
            self._scratch = xp.empty(shape, dtype=like.dtype, device=getattr(like, "device", None))
        return self._scratch


def _step_vjp(
    backend: Any,
    co: _StageWeights,
    vjp: Any,
    inputs: tuple[Array, ...],
    t: Array,
    h: Array,
    u1_bar: Array,
    ends: list[tuple[Array, Array]],
    inside: list[tuple[Array, Array, Array]],
    dense: bool,
    carry: Any = (),
) -> tuple[Array, list[Any]]:
    """Pull ``u1_bar`` and the save cotangents of the step (``ends`` and ``inside``, see
    ``_Sweep._save_cotangents``) back through one explicit Runge–Kutta step of every lane
    from its stage inputs; ``vjp(y, t, v, out)`` is the RHS's VJP (``TracedRHS.vjp_for``).
    ``dense``: pull back the stages only the dense output uses too; ``carry``: pairs
    ``(positions, k̄)`` added to the first stage's cotangent (``fsal_carry``).

    ``k̄_i / h`` is accumulated for all stages at once: ``b_i ū_{n+1} + Σ_s w_i(θ_s) ḡ_s``
    first, then ``a_li ȳ_l`` as soon as stage ``l``'s ``ȳ_l`` is known.
    """
    xp = backend.xp
    q = co.last_used
    last = co.last if dense else q  # the dense-only stages matter for inside saves alone
    stage_times = t + co.c * h
    bars = co.scratch(xp, u1_bar)
    bars[q + 1, ...] = u1_bar
    for idx, g in ends:
        bars[q + 1, ...] = backend.add_to_lanes(bars[q + 1, ...], idx, g)
    k_bars = co.b[: last + 1, ...] * bars[q + 1, ...]  # k̄_i / h
    for idx, weights, g in inside:
        k_bars = backend.add_to_lanes(k_bars, idx, weights[: last + 1, ...] * g)
    leaf_bars: list[Any] = []
    for i, r, pulled, below in co.backward_order[dense]:
        if not pulled:
            bars[r, ...] = 0.0
            continue
        row = bars[r, ...]
        v = k_bars[i, ...] * h
        if not i:
            for idx, k_bar in carry:
                v = backend.add_to_lanes(v, idx, k_bar)
        y_bar, stage_leaf_bars = vjp(inputs[i], stage_times[i, ...], v, out=row)
        if y_bar is not row:
            bars[r, ...] = y_bar
        if i:
            k_bars[:i, ...] += below * y_bar
        if leaf_bars:
            leaf_bars = [a + c for a, c in zip(leaf_bars, stage_leaf_bars, strict=True)]
        else:
            leaf_bars = stage_leaf_bars
    u_bar = ordered_sum(xp, bars[: last + 2, ...])
    for idx, _, g in inside:  # the dense output's u_n term
        u_bar = backend.add_to_lanes(u_bar, idx, g)
    return u_bar, leaf_bars


def _pieces(x: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """``x`` cut at ``offsets`` (views; ``np.split`` costs far more for many pieces)."""
    bounds = offsets.tolist()
    return [x[a:b] for a, b in itertools.pairwise(bounds)]


def _save_index(grid: np.ndarray | None, times: np.ndarray) -> np.ndarray:
    """For each time, the index of the save point equal to it, or -1 (``grid`` ``None``:
    every lane saves its start first)."""
    if grid is None:
        return np.zeros(times.shape, dtype=np.int64)
    if grid.shape[0] == 0:
        return np.full(times.shape, -1, dtype=np.int64)
    order = np.argsort(grid, kind="stable")
    pos = np.clip(np.searchsorted(grid[order], times), 0, grid.shape[0] - 1)
    return np.where(grid[order][pos] == times, order[pos], -1)


def _zero_cotangent(xp: Any, leaf: Any, n_lanes: int | None) -> Any:
    """A zero cotangent for a leaf (a per-lane leaf's in a layout of ``n_lanes`` lanes)."""
    if isinstance(leaf, (int, float, np.generic)):
        return 0.0
    shape = tuple(leaf.shape) if n_lanes is None else (*leaf.shape[:-1], n_lanes)
    if isinstance(leaf, np.ndarray):
        return np.zeros(shape, dtype=np.result_type(leaf, np.float32))
    return xp.zeros(shape, dtype=leaf.dtype)
