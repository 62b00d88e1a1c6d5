"""The discrete adjoint: the exact gradient of the accepted Runge–Kutta steps, replayed backward.

The forward pass records each lane's accepted steps (start time, step size, start state) and
lands exactly on every save time. The backward pass walks each lane's steps in reverse, all
lanes of the batch at once: at backward iteration ``k`` lane ``l`` processes its ``k``-th last
step (a lane with fewer steps idles: a zero step from its own start state, which contributes
exactly nothing). At
a save time it adds that save point's cotangent, then pulls the cotangent back through the
step's stages,

    k̄_i = h (b_i ū_{n+1} + Σ_{l>i} a_li ȳ_l),   (ȳ_i, p̄_i) = VJP of f at stage i (k̄_i),
    ū_n = ū_{n+1} + Σ_i ȳ_i,                     p̄ += Σ_i p̄_i.

Step sizes are constants of the computed solution (not differentiated), so the result is the
gradient of exactly what the forward pass computed. Every array operation goes through the
batch's backend, so the sweep runs where the forward pass ran (NumPy, CuPy, any array-API
library); only per-step bookkeeping (which step, which save point) is computed on the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._retcode import ReturnCode
from ..backends import to_host
from ..backends._base import ordered_sum
from ._traced_rhs import TracedRHS

Array = Any


def backward(
    backend: Any,
    stepper: Any,
    rhs: TracedRHS,
    steps: dict[str, Array],
    leaves: list[Any],
    save_grid: np.ndarray,
    t0: np.ndarray,
    retcodes: np.ndarray,
    cotangent: Array,
    checkpoints: dict[str, Array] | None = None,
    checkpoint_every: int = 0,
    rhs_for: Any = None,
) -> tuple[Array, list[Any]]:
    """Cotangents of the initial states and of the differentiable parameter leaves.

    Parameters
    ----------
    backend : Backend
        Where the batch's arrays live and the sweep computes.
    steps : dict
        Accepted steps lanes-last and grouped by lane: ``lane, t, h, t_end`` and, without
        checkpoints, each step's start state ``u0``.
    leaves : list
        The batch's parameter leaf values (per-lane leaves have a trailing lane axis).
    save_grid : (nsave,) host array
        Save times shared by the lanes (every one is a step end or the start).
    t0 : (L,) host array
        Start times.
    retcodes : (L,) int host array
        Lanes that failed get NaN cotangents (their saved values are not a solution).
    cotangent : (L, nsave, *shape) array
        Cotangent of the saved states (on the backend).
    checkpoints : dict, optional
        The states and RHS values kept every ``checkpoint_every``-th step of each lane (keys
        ``lane, index, u, f``); each segment's states are then recomputed from them with
        ``rhs_for``, the plain lane RHS for per-lane leaf values.

    Returns
    -------
    u0_bar : (*shape, L) array
    leaf_bars : list
        One entry per differentiable leaf: per-lane leaves ``(..., L)``; shared leaves summed.
    """
    n_lanes = cotangent.shape[0]
    lane = np.asarray(to_host(steps["lane"]))
    failed = ~np.isin(retcodes, [int(ReturnCode.Success), int(ReturnCode.Terminated)])
    counts = np.where(failed, 0, np.bincount(lane, minlength=n_lanes))
    starts = np.searchsorted(lane, np.arange(n_lanes))
    sweep = _Sweep(backend, stepper, rhs, steps, leaves, save_grid, cotangent)
    with backend.ignore_fp_errors():  # idle lanes replay steps of no consequence
        if checkpoints is None:
            _plain_sweep(sweep, counts, starts)
        else:
            _checkpointed_sweep(sweep, rhs_for, checkpoints, checkpoint_every, counts, starts)
    return sweep.finish(t0, failed)


def _plain_sweep(sweep: _Sweep, counts: np.ndarray, starts: np.ndarray) -> None:
    """Every lane's steps in reverse, from the recorded start states."""
    for k in range(int(counts.max(initial=0))):
        active = k < counts
        sweep.step_back(np.where(active, starts + counts - 1 - k, starts), active)


def _checkpointed_sweep(
    sweep: _Sweep,
    rhs_for: Any,
    checkpoints: dict[str, Array],
    k_every: int,
    counts: np.ndarray,
    starts: np.ndarray,
) -> None:
    """The backward sweep segment by segment, from each lane's last segment to its first.

    Round ``r`` recomputes every lane's ``r``-th last segment forward from its checkpoint with
    the recorded step sizes (the same arithmetic as the forward pass, so the same states to
    the last bit), then pulls the cotangents back through it.
    """
    xp, backend, steps = sweep.xp, sweep.backend, sweep.steps
    n_lanes = counts.shape[0]
    cp_lane = np.asarray(to_host(checkpoints["lane"]))
    cp_start = np.searchsorted(cp_lane, np.arange(n_lanes))
    n_seg = -(-counts // k_every)
    params = tuple(
        leaf for leaf, lane in zip(sweep.leaves, sweep.rhs.lane_leaf, strict=True) if lane
    )
    plain = rhs_for(params)
    for r in range(int(n_seg.max(initial=0))):
        seg = n_seg - 1 - r
        live = seg >= 0
        first = starts + np.maximum(seg, 0) * k_every  # each segment's first step
        length = np.where(live, np.minimum(k_every, counts - np.maximum(seg, 0) * k_every), 0)
        cp = sweep.index(cp_start + np.maximum(seg, 0), len(cp_lane))
        u, f = xp.take(checkpoints["u"], cp, axis=-1), xp.take(checkpoints["f"], cp, axis=-1)
        states = [u]
        for i in range(int(length.max()) - 1):
            moving = i < length - 1
            idx = sweep.index(np.where(moving, first + i, first))
            h = xp.where(sweep.device(moving), xp.take(steps["h"], idx), 0.0)
            t_end = xp.take(steps["t_end"], idx)
            result = sweep.stepper.step(backend, plain, xp.take(steps["t"], idx), u, f, h)
            u = result.u1
            f = result.f1 if sweep.stepper.fsal else plain(u, t_end)
            states.append(u)
        for q in range(len(states) - 1, -1, -1):
            active = q < length
            sweep.step_back(np.where(active, first + q, first), active, states[q])


class _Sweep:
    """The backward sweep's running cotangents, lanes last, on the batch's backend."""

    def __init__(
        self,
        backend: Any,
        stepper: Any,
        rhs: TracedRHS,
        steps: dict[str, Array],
        leaves: list[Any],
        save_grid: np.ndarray,
        cotangent: Array,
    ) -> None:
        xp = self.xp = backend.xp
        self.backend, self.stepper, self.rhs = backend, stepper, rhs
        self.steps, self.leaves = steps, leaves
        n_lanes, n_save = cotangent.shape[0], cotangent.shape[1]
        self.n_steps = int(steps["lane"].shape[0])
        self.save_grid, self.n_save = save_grid, n_save
        # Cotangents of the saved states as rows ``lane * nsave + save index``.
        self.g = xp.reshape(cotangent, (n_lanes * n_save, *cotangent.shape[2:]))
        self.lane_rows = xp.arange(n_lanes, dtype=xp.int64) * n_save
        # The save point each recorded step ends at (-1: none).
        t_end = np.asarray(to_host(steps["t_end"]), dtype=np.float64)
        self.save_of_step = _save_index(save_grid, t_end)
        self.u_bar = xp.zeros((*cotangent.shape[2:], n_lanes), dtype=cotangent.dtype)
        self.diff_idx = rhs.diff_positions()
        self.leaf_bars: list[Any] = [_zero_cotangent(xp, leaves[i]) for i in self.diff_idx]
        self.coefficients = _StageWeights(stepper, xp, self.u_bar)

    def index(self, host: np.ndarray, size: int | None = None) -> Array:
        """Host indices as a device index array, clipped to ``size`` (default: the steps)."""
        size = self.n_steps if size is None else size
        host = np.clip(host, 0, max(size - 1, 0))
        return self.backend.asarray(host.astype(np.int64), dtype=self.xp.int64)

    def device(self, mask: np.ndarray) -> Array:
        return self.backend.asarray(mask, dtype=self.xp.bool)

    def step_back(self, step: np.ndarray, active: np.ndarray, u_n: Array | None = None) -> None:
        """Every lane pulls its cotangent back through its step ``step`` (host global step
        indices) that started from ``u_n`` (by default the recorded start states); lanes not
        ``active`` take a zero step."""
        xp, steps = self.xp, self.steps
        step = np.clip(step, 0, max(self.n_steps - 1, 0))
        idx = self.index(step)
        if u_n is None:
            u_n = xp.take(steps["u0"], idx, axis=-1)
        t_start = xp.take(steps["t"], idx)
        h = xp.take(steps["h"], idx)
        if not active.all():
            h = xp.where(self.device(active), h, xp.zeros_like(h))
        ub = self.u_bar
        save = self.save_of_step[step]
        hit = active & (save >= 0)
        if hit.any():  # a save point at this step's end: its cotangent enters here
            rows = xp.take(self.g, self.lane_rows + self.index(save, self.n_save), axis=0)
            entering = xp.moveaxis(rows, 0, -1)
            ub = ub + xp.where(self.device(hit), entering, xp.zeros_like(entering))
        self.u_bar, step_bars = _step_vjp(
            self.backend, self.coefficients, self.rhs, u_n, t_start, h, ub, self.leaves
        )
        self.leaf_bars = [a + b for a, b in zip(self.leaf_bars, step_bars, strict=True)]

    def finish(self, t0: np.ndarray, failed: np.ndarray) -> tuple[Array, list[Any]]:
        """Add the save points at ``t0``; NaN for failed lanes (and the leaves they share)."""
        xp, backend = self.xp, self.backend
        at = _save_index(self.save_grid, np.asarray(t0, dtype=np.float64))
        at_start = self.device(at >= 0)
        rows = xp.take(self.g, self.lane_rows + self.index(at, self.n_save), axis=0)
        entering = xp.moveaxis(rows, 0, -1)
        u_bar = self.u_bar + xp.where(at_start, entering, xp.zeros_like(entering))
        leaf_bars = self.leaf_bars
        if np.any(failed):
            bad = self.device(failed)
            nan = backend.asarray(float("nan"), dtype=u_bar.dtype)
            u_bar = xp.where(bad, nan, u_bar)
            for j, i in enumerate(self.diff_idx):
                if self.rhs.lane_leaf[i]:
                    leaf_bars[j] = xp.where(bad, nan, leaf_bars[j])
                else:
                    leaf_bars[j] = leaf_bars[j] * float("nan")
        return u_bar, leaf_bars


class _StageWeights:
    """A method's coefficients for the backward step, in the stage combinations' layout.

    ``forward[i]`` are the weights of stage ``i``'s input (as in the forward step) and
    ``adjoint[i]`` those of ``k̄_i`` over ``[ȳ_{i+1}, ..., ȳ_last, ū_{n+1}]``.
    """

    def __init__(self, stepper: Any, xp: Any, like: Array) -> None:
        tab = stepper.tableau
        s = tab.stages
        a, b = np.asarray(tab.a, dtype=np.float64), np.asarray(tab.b, dtype=np.float64)
        # Stages that feed the solution (an FSAL method's last stage feeds only the error).
        used = [b[i] != 0.0 or bool(np.any(a[i + 1 :, i] != 0.0)) for i in range(s)]
        self.last = max(i for i in range(s) if used[i])
        self.used = used[: self.last + 1]
        co = stepper._coefs(xp, like)
        self.c, self.forward = co.c, co.a
        trailing = (1,) * like.ndim
        dev = getattr(like, "device", None)
        self.adjoint = [
            xp.reshape(
                xp.asarray(
                    [float(x) for x in (*a[i + 1 : self.last + 1, i], b[i])],
                    dtype=like.dtype,
                    device=dev,
                ),
                (-1, *trailing),
            )
            for i in range(self.last + 1)
        ]


def _step_vjp(
    backend: Any,
    co: _StageWeights,
    rhs: TracedRHS,
    u: Array,
    t: Array,
    h: Array,
    u1_bar: Array,
    leaves: list[Any],
) -> tuple[Array, list[Any]]:
    """Pull ``u1_bar`` back through one explicit Runge–Kutta step of every lane."""
    xp = backend.xp
    last = co.last
    stage_times = t + co.c * h
    stages = xp.empty((last + 1, *u.shape), dtype=u.dtype, device=getattr(u, "device", None))
    pulls = []
    for i in range(last + 1):
        # The forward pass's stage input, by the same operations.
        y = u if i == 0 else backend.combine(u, h, co.forward[i], stages)
        stages[i, ...], pull = rhs.pullback(y, stage_times[i, ...], leaves)
        pulls.append(pull)
    # Rows 0..last: ȳ_i; row last + 1: ū_{n+1}.
    bars = xp.empty((last + 2, *u.shape), dtype=u1_bar.dtype, device=getattr(u, "device", None))
    bars[last + 1, ...] = u1_bar
    leaf_bars: list[Any] = []
    for i in range(last, -1, -1):
        if not co.used[i]:
            bars[i, ...] = 0.0
            continue
        k_bar = backend.combine(None, h, co.adjoint[i], bars[i + 1 :, ...])
        bars[i, ...], stage_leaf_bars = pulls[i](k_bar)
        leaf_bars = (
            stage_leaf_bars
            if not leaf_bars
            else [a + c for a, c in zip(leaf_bars, stage_leaf_bars, strict=True)]
        )
    return ordered_sum(xp, bars), leaf_bars


def _save_index(grid: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each time, the index of the save point equal to it, or -1."""
    if grid.shape[0] == 0:
        return np.full(times.shape, -1, dtype=np.int64)
    order = np.argsort(grid, kind="stable")
    pos = np.clip(np.searchsorted(grid[order], times), 0, grid.shape[0] - 1)
    return np.where(grid[order][pos] == times, order[pos], -1)


def _zero_cotangent(xp: Any, leaf: Any) -> Any:
    if isinstance(leaf, (int, float, np.generic)):
        return 0.0
    if isinstance(leaf, np.ndarray):
        return np.zeros(leaf.shape, dtype=np.result_type(leaf, np.float32))
    return xp.zeros(leaf.shape, dtype=leaf.dtype)
