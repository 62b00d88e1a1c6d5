"""Continuous adjoints: ``a' = -(df/du)^T a``, ``g' = -(df/dp)^T a``, integrated backward.

Each lane integrates an augmented state lanes-last with the one integrator, segment by
segment from the last save time back to ``t0``; at every save time the save point's
cotangent is added to ``a``. ``InterpolatingAdjoint`` takes ``u(t)`` from the forward pass's
dense output (state ``[a, g]``); ``BacksolveAdjoint`` integrates ``u`` backward with them
(state ``[u, a, g]``), starting from the last saved state.

``g`` holds one row per element of each differentiated parameter leaf and lane; a leaf
shared by all lanes gets its per-lane rows from forward-mode products (a reverse-mode
product would already sum it over the lanes), and its rows are summed over the lanes at the
end, in lane order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .._jacobian import time_scale
from .._retcode import ReturnCode
from .._traced_rhs import TracedRHS, leaf_size
from ..backends import get_backend
from ..backends._base import ordered_sum
from ..integrator.loop import LaneProblem, integrate
from ..solvers import Step
from .augmented_jacobians import augmented_options, is_stiff, with_jacobian
from .forward_sensitivity import one_hot

Array = Any
_OK = (int(ReturnCode.Success), int(ReturnCode.Terminated))


def backward(
    static: Any,
    rhs: TracedRHS,
    plain_rhs_for: Any,
    record: Any,
    leaves: list[Any],
    save_grid: np.ndarray,
    t0: np.ndarray,
    retcodes: np.ndarray,
    cotangent: np.ndarray,
    backsolve: bool,
) -> tuple[np.ndarray, list[Any]]:
    """Cotangents of ``u0`` ``(*shape, L)`` and of the differentiated leaves.

    ``record`` is the forward pass's accepted steps with stages (interpolating) or, with
    ``backsolve``, its saved states ``(L, nsave, *shape)``.
    """
    n_lanes, n_save = cotangent.shape[:2]
    shape = cotangent.shape[2:]
    n = math.prod(shape)
    dtype = cotangent.dtype
    diff = rhs.diff_positions()
    sizes = [leaf_size(leaves[i], rhs.lane_leaf[i]) for i in diff]
    n_par = sum(sizes)
    ok = np.nonzero(np.isin(retcodes, _OK))[0]
    a_bar = np.full((n, n_lanes), np.nan, dtype=dtype)
    p_bar = np.full((n_par, n_lanes), np.nan, dtype=dtype)
    if ok.size:
        width = ok.size
        g = np.moveaxis(cotangent[ok].reshape(width, n_save, n), 0, -1)  # (nsave, n, W)
        off = n if backsolve else 0
        z = np.zeros((off + n + n_par, width), dtype=dtype)
        if backsolve:
            z[:n] = record[ok, -1].reshape(width, n).T
        lane_positions = [i for i, lane in enumerate(rhs.lane_leaf) if lane]
        params = (ok, *[leaves[i][..., ok] for i in lane_positions])
        dense = None if backsolve else _Dense(static.options.alg, record, n_lanes, plain_rhs_for)
        stiff = is_stiff(static.options.alg)
        system = _AdjointSystem(rhs, leaves, lane_positions, shape, off, sizes, dense, stiff)
        options = augmented_options(_backward_options(static.options))
        backend = get_backend("numpy")
        good = np.ones(width, dtype=bool)
        start = float(t0[0])
        # df/dt on the forward trajectory's time scale, whatever the save points' spacing
        scale = time_scale(np, np.full(width, start, dtype), np.full(width, static.t1[0], dtype))
        for s in range(n_save - 1, -1, -1):
            z[off : off + n] += g[s]
            t_from = float(save_grid[s])
            t_to = float(save_grid[s - 1]) if s else start
            if t_from == t_to:
                continue
            problem = LaneProblem(
                rhs_for=system.rhs_for,
                u0=z,
                t0=np.full(width, t_from, dtype=dtype),
                t1=np.full(width, t_to, dtype=dtype),
                params=params,
                time_scale=scale,
            )
            result = integrate(problem, options, backend)
            good &= np.isin(np.asarray(result.retcode), _OK)
            z = np.ascontiguousarray(np.asarray(result.u).T)
        z[:, ~good] = np.nan
        a_bar[:, ok] = z[off : off + n]
        p_bar[:, ok] = z[off + n :]
    leaf_bars = []
    row = 0
    for i, k in zip(diff, sizes, strict=True):
        rows = p_bar[row : row + k]
        row += k
        if rhs.lane_leaf[i]:
            leaf_bars.append(rows.reshape(np.shape(leaves[i])))
        else:  # summed over the lanes, in lane order
            total = ordered_sum(np, np.moveaxis(rows, -1, 0)) if n_lanes else rows[:, 0] * 0
            leaf_bars.append(np.asarray(total).reshape(np.shape(leaves[i])))
    return a_bar.reshape(*shape, n_lanes), leaf_bars


def _backward_options(options: Any) -> Any:
    """The forward options for the backward solve: a scalar ``atol``, no first-step size."""
    atol = options.atol if isinstance(options.atol, float) else float(np.min(options.atol))
    return dataclasses.replace(options, atol=atol, dt=None if options.adaptive else options.dt)


@dataclasses.dataclass
class _AdjointSystem:
    """The augmented right-hand side ``d[u, a, g]/dt`` (``u`` only when backsolving)."""

    rhs: TracedRHS
    leaves: list[Any]
    lane_positions: list[int]
    shape: tuple[int, ...]
    off: int  # rows of u in the state (0 or n)
    sizes: list[int]
    dense: Any  # u(t) for the interpolating adjoint, None when u is part of the state
    stiff: bool = False  # give the method the system's Jacobian

    def rhs_for(self, params: tuple) -> Any:
        lanes, lane_values = params[0], params[1:]
        current = list(self.leaves)
        for i, value in zip(self.lane_positions, lane_values, strict=True):
            current[i] = value
        rhs = self.rhs
        n = math.prod(self.shape)
        off = self.off
        diff = rhs.diff_positions()
        # Reverse mode where it gives each lane its own cotangent; forward mode otherwise.
        by_vjp = [i for i in diff if rhs.lane_leaf[i] or rhs.single_lane]

        def f(z: Array, t: Array, out: Array | None = None) -> Array:
            width = z.shape[-1]
            if self.dense is None:
                u = z[:n].reshape(*self.shape, width)
            else:
                u = self.dense(t, lanes, lane_values)
            a = z[off : off + n].reshape(*self.shape, width)
            value, pull = rhs.pullback(u, t, current, by_vjp)
            u_bar, bars = pull(a)
            dz = np.empty_like(z) if out is None else out
            if off:
                dz[:n] = np.reshape(value, (n, width))
            dz[off : off + n] = -np.reshape(u_bar, (n, width))
            row = off + n
            for i, k in zip(diff, self.sizes, strict=True):
                if i in by_vjp:
                    dz[row : row + k] = -np.reshape(bars[by_vjp.index(i)], (k, width))
                else:
                    zero = np.zeros_like(u)
                    for j in range(k):
                        tangent = {i: one_hot(current[i], j, rhs, i)}
                        _, dot = rhs.jvp(u, t, current, zero, tangent)
                        terms = np.reshape(a * dot, (n, width))
                        dz[row + j] = -ordered_sum(np, terms)
                row += k
            return dz

        if not self.stiff:
            return f

        def jac(z: Array, t: Array) -> Array:
            # Linear in a: column c of the a-block from the VJP with cotangent e_c.
            width = z.shape[-1]
            u = self.dense(t, lanes, lane_values)
            _, pull = rhs.pullback(u, t, current, by_vjp)
            out = np.zeros((z.shape[0], z.shape[0], width), dtype=z.dtype)
            for c in range(n):
                e_c = np.zeros((n, width), dtype=z.dtype)
                e_c[c] = 1.0
                u_bar, bars = pull(e_c.reshape(*self.shape, width))
                out[:n, c] = -np.reshape(u_bar, (n, width))
                row = n
                for i, k in zip(diff, self.sizes, strict=True):
                    if i in by_vjp:
                        out[row : row + k, c] = -np.reshape(bars[by_vjp.index(i)], (k, width))
                    row += k
            row = n
            for i, k in zip(diff, self.sizes, strict=True):
                if i not in by_vjp:
                    zero = np.zeros_like(u)
                    for j in range(k):
                        _, dot = rhs.jvp(u, t, current, zero, {i: one_hot(current[i], j, rhs, i)})
                        out[row + j, :n] = -np.reshape(dot, (n, width))
                row += k
            return out

        return with_jacobian(f, jac)


class _Dense:
    """``u(t)`` of lanes ``lanes`` at their own times from the forward pass's steps."""

    def __init__(self, stepper: Any, steps: dict[str, Array], n_lanes: int, rhs_for: Any):
        self._stepper = stepper
        self._steps = steps
        lane = np.asarray(steps["lane"])
        self._start = np.searchsorted(lane, np.arange(n_lanes), side="left")
        self._end = np.searchsorted(lane, np.arange(n_lanes), side="right")
        h = steps["h"]
        self._direction = 1.0 if h.size == 0 or h[0] > 0 else -1.0
        self._rounds = max(1, int(np.max(self._end - self._start, initial=1)).bit_length())
        self._rhs_for = rhs_for
        self._backend = get_backend("numpy")

    def __call__(self, t: Array, lanes: Array, lane_values: tuple) -> Array:
        steps, d = self._steps, self._direction
        lo = self._start[lanes]
        hi = self._end[lanes] - 1
        ts = steps["t"]
        for _ in range(self._rounds + 1):  # the last step of each lane starting at or before t
            mid = (lo + hi + 1) // 2
            go = d * ts[mid] <= d * t
            lo = np.where(go, mid, lo)
            hi = np.where(go, hi, mid - 1)
        idx = lo
        t_step, h = ts[idx], steps["h"][idx]
        theta = np.clip((t - t_step) / h, 0.0, 1.0)
        rhs = self._rhs_for(lane_values) if self._stepper.interpolation_rhs_evals else None
        step = Step(
            self._stepper,
            self._backend,
            rhs,
            t_step,
            h,
            steps["u0"][..., idx],
            steps["u1"][..., idx],
            steps["stages"][..., idx],
        )
        return step.interpolate(theta)
