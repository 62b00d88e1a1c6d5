"""The discrete adjoint: the exact gradient of the accepted Runge–Kutta steps, replayed backward.

The forward pass records each lane's accepted steps (start time, step size, start state) and
lands exactly on every save time. The backward pass walks each lane's steps in reverse, all
lanes at once (lane ``l`` at backward iteration ``k`` processes its ``k``-th last step):
at a save time it adds that save point's cotangent, then pulls the cotangent back through
the step's stages,

    k̄_i = h b_i ū_{n+1} + Σ_{l>i} h a_li ȳ_l,   (ȳ_i, p̄_i) = VJP of f at stage i (k̄_i),
    ū_n = ū_{n+1} + Σ_i ȳ_i,                     p̄ += Σ_i p̄_i.

Step sizes are constants of the computed solution (not differentiated), so the result is the
gradient of exactly what the forward pass computed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._retcode import ReturnCode
from ._traced_rhs import TracedRHS

Array = Any


def backward(
    stepper: Any,
    rhs: TracedRHS,
    steps: dict[str, np.ndarray],
    leaves: list[Any],
    save_grid: np.ndarray,
    t0: np.ndarray,
    retcodes: np.ndarray,
    cotangent: np.ndarray,
    checkpoints: dict[str, np.ndarray] | None = None,
    checkpoint_every: int = 0,
    rhs_for: Any = None,
) -> tuple[np.ndarray, list[Any]]:
    """Cotangents of the initial states and of the differentiable parameter leaves.

    Parameters
    ----------
    steps : dict
        Accepted steps lanes-last and grouped by lane: ``lane, t, h, t_end`` and, without
        checkpoints, each step's start state ``u0``.
    leaves : list
        The batch's parameter leaf values (per-lane leaves have a trailing lane axis).
    save_grid : (nsave,) array
        Save times shared by the lanes (every one is a step end or the start).
    t0 : (L,) array
        Start times.
    retcodes : (L,) int array
        Lanes that failed get NaN cotangents (their saved values are not a solution).
    cotangent : (L, nsave, *shape) array
        Cotangent of the saved states.
    checkpoints : dict, optional
        The states and RHS values kept every ``k``-th step of each lane (keys ``lane, index,
        u, f``), every ``checkpoint_every`` steps; each segment's states are then recomputed
        from them with ``rhs_for``, the plain lane RHS for a working set's per-lane leaves.

    Returns
    -------
    u0_bar : (*shape, L) array
    leaf_bars : list
        One entry per differentiable leaf: per-lane leaves ``(..., L)``; shared leaves summed.
    """
    n_lanes = cotangent.shape[0]
    lane = np.asarray(steps["lane"])
    counts = np.bincount(lane, minlength=n_lanes)
    ends = np.cumsum(counts)
    failed = ~np.isin(retcodes, [int(ReturnCode.Success), int(ReturnCode.Terminated)])
    sweep = _Sweep(stepper.tableau, rhs, steps, leaves, save_grid, cotangent)
    counts = np.where(failed, 0, counts)
    if checkpoints is None:
        for k in range(int(counts.max(initial=0))):
            act = np.nonzero(k < counts)[0]
            step = ends[act] - 1 - k
            sweep.step_back(act, step, steps["u0"][..., step])
    else:
        _checkpointed_sweep(
            sweep, stepper, rhs_for, checkpoints, checkpoint_every, counts, ends - counts, leaves
        )
    return sweep.finish(t0, failed)


class _Sweep:
    """The backward sweep's running cotangents; each lane pulls back its own steps in reverse."""

    def __init__(
        self,
        tab: Any,
        rhs: TracedRHS,
        steps: dict[str, np.ndarray],
        leaves: list[Any],
        save_grid: np.ndarray,
        cotangent: np.ndarray,
    ) -> None:
        n_lanes = cotangent.shape[0]
        self.tab, self.rhs, self.steps, self.leaves = tab, rhs, steps, leaves
        self.save_grid = save_grid
        self.g = np.moveaxis(cotangent, 0, -1)  # (nsave, *shape, L)
        self.u_bar = np.zeros(self.g.shape[1:], dtype=self.g.dtype)  # (*shape, L)
        self.save_ptr = np.full(n_lanes, len(save_grid) - 1)
        self.diff_idx = [i for i, d in enumerate(rhs.diff_leaf) if d]
        self.leaf_bars: list[Any] = [_zero_cotangent(leaves[i]) for i in self.diff_idx]

    def step_back(self, act: np.ndarray, step: np.ndarray, u_n: np.ndarray) -> None:
        """Lanes ``act`` pull their cotangent back through their step ``step`` (global index)
        that started from ``u_n``."""
        steps, rhs = self.steps, self.rhs
        t_start, h = steps["t"][step], steps["h"][step]
        t_end = steps["t_end"][step]
        # A save point at this step's end: its cotangent enters here.
        ptr = np.maximum(self.save_ptr[act], 0)
        hit = (self.save_ptr[act] >= 0) & (self.save_grid[ptr] == t_end)
        ub = self.u_bar[..., act] + np.where(hit, _gather_save(self.g, ptr, act), 0.0)
        self.save_ptr[act] -= hit
        lane_leaves = [
            leaf[..., act] if lane_ax else leaf
            for leaf, lane_ax in zip(self.leaves, rhs.lane_leaf, strict=True)
        ]
        ub, step_bars = _step_vjp(self.tab, rhs, u_n, t_start, h, ub, lane_leaves)
        self.u_bar[..., act] = ub
        for j, i in enumerate(self.diff_idx):
            if rhs.lane_leaf[i]:
                self.leaf_bars[j][..., act] += step_bars[j]
            else:
                self.leaf_bars[j] = self.leaf_bars[j] + step_bars[j]

    def finish(self, t0: np.ndarray, failed: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        """Add a save point at ``t0``; NaN for failed lanes (and the leaves they share)."""
        save_ptr, g = self.save_ptr, self.g
        n_lanes = save_ptr.shape[0]
        at_start = (save_ptr >= 0) & (self.save_grid[np.maximum(save_ptr, 0)] == t0)
        u_bar = self.u_bar + np.where(
            at_start, _gather_save(g, np.maximum(save_ptr, 0), np.arange(n_lanes)), 0.0
        )
        leaf_bars = self.leaf_bars
        if np.any(failed):
            u_bar[..., failed] = np.nan
            for j, i in enumerate(self.diff_idx):
                if self.rhs.lane_leaf[i]:
                    leaf_bars[j][..., failed] = np.nan
                else:
                    leaf_bars[j] = leaf_bars[j] * np.nan
        return u_bar, leaf_bars


def _checkpointed_sweep(
    sweep: _Sweep,
    stepper: Any,
    rhs_for: Any,
    checkpoints: dict[str, np.ndarray],
    k_every: int,
    counts: np.ndarray,
    starts: np.ndarray,
    leaves: list[Any],
) -> None:
    """The backward sweep segment by segment, from each lane's last segment to its first.

    Round ``r`` recomputes every lane's ``r``-th last segment forward from its checkpoint with
    the recorded step sizes (the same arithmetic as the forward pass, so the same states to
    the last bit), then pulls the cotangents back through it.
    """
    from ..backends import get_backend

    backend = get_backend("numpy")
    cp_start = np.searchsorted(np.asarray(checkpoints["lane"]), np.arange(counts.shape[0]))
    n_seg = -(-counts // k_every)
    steps = sweep.steps
    lane_positions = [i for i, lane in enumerate(sweep.rhs.lane_leaf) if lane]
    for r in range(int(n_seg.max(initial=0))):
        act = np.nonzero(r < n_seg)[0]
        seg = n_seg[act] - 1 - r
        first = starts[act] + seg * k_every  # global index of each segment's first step
        length = np.minimum(k_every, counts[act] - seg * k_every)
        cp = cp_start[act] + seg
        u, f = checkpoints["u"][..., cp], checkpoints["f"][..., cp]
        plain = rhs_for(tuple(leaves[i][..., act] for i in lane_positions))
        longest = int(length.max())
        states = np.empty((longest, *u.shape), dtype=u.dtype)
        with np.errstate(all="ignore"):  # lanes past their segment's end step on, unused
            for i in range(longest):
                states[i] = u
                if i == longest - 1:
                    break
                idx = first + np.minimum(i, length - 1)
                t_end = steps["t_end"][idx]
                result = stepper.step(backend, plain, steps["t"][idx], u, f, steps["h"][idx])
                u = result.u1
                f = result.f1 if stepper.fsal else plain(u, t_end)
        for q in range(longest):
            live = np.nonzero(q < length)[0]
            local = length[live] - 1 - q
            u_n = np.moveaxis(states[local, ..., live], 0, -1)
            sweep.step_back(act[live], first[live] + local, u_n)


def _gather_save(g: np.ndarray, ptr: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """``g[ptr[i], ..., lanes[i]]`` for each i, as ``(*shape, len(lanes))``."""
    return np.moveaxis(g[ptr, ..., lanes], 0, -1)


def _zero_cotangent(leaf: Any) -> Any:
    return np.zeros(np.shape(leaf), dtype=np.result_type(leaf, np.float32))


def _step_vjp(
    tab: Any,
    rhs: TracedRHS,
    u: np.ndarray,
    t: np.ndarray,
    h: np.ndarray,
    u1_bar: np.ndarray,
    leaves: list[Any],
) -> tuple[np.ndarray, list[Any]]:
    """Pull ``u1_bar`` back through one explicit Runge–Kutta step of every lane."""
    s = tab.stages
    a = [[float(x) for x in row] for row in tab.a]  # Python floats keep float32 lanes float32
    b = [float(x) for x in tab.b]
    # Stages that feed the solution (an FSAL method's last stage feeds only the error estimate).
    used = [b[i] != 0.0 or any(a[m][i] != 0.0 for m in range(i + 1, s)) for i in range(s)]
    last = max(i for i in range(s) if used[i])
    stages: list[np.ndarray] = []
    pulls = []
    for i in range(last + 1):
        # The forward pass's stage input, in its order of operations.
        y = u if i == 0 else u + h * sum(a[i][j] * stages[j] for j in range(i))
        k_i, pull = rhs.pullback(y, t + float(tab.c[i]) * h, leaves)
        stages.append(np.asarray(k_i))
        pulls.append(pull)
    k_bar = [h * b[i] * u1_bar for i in range(last + 1)]
    u_bar = u1_bar.copy()
    leaf_bars: list[Any] = []
    for i in range(last, -1, -1):
        if not used[i]:
            continue
        y_bar, bars = pulls[i](k_bar[i])
        u_bar = u_bar + y_bar
        leaf_bars = bars if not leaf_bars else [a + c for a, c in zip(leaf_bars, bars, strict=True)]
        for j in range(i):
            if a[i][j] != 0.0:
                k_bar[j] = k_bar[j] + h * a[i][j] * y_bar
    return u_bar, leaf_bars
