"""Forward sensitivities: the state and its derivatives ``S = du/dθ`` integrated together.

Every lane integrates the augmented state ``[u, S_1, ..., S_D]`` (``(n + n D, L)``) with
``S_d' = (df/du) S_d + (df/dθ_d)``, one forward-mode Jacobian-vector product of ``f`` per
direction and stage. The directions are the ``u0`` components (when ``u0`` is
differentiated; ``S_d(t0) = e_d``) and every element of each differentiated parameter leaf
(``S_d(t0) = 0``; per-lane leaves give each lane its own element, shared leaves the same one).
The saved ``S`` is the Jacobian of the saved states: the backward pass only contracts it with
the cotangent.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .._jacobian import lane_jacobian
from .._retcode import ReturnCode
from .._traced_rhs import TracedRHS, leaf_size, parameter_offsets, substituted
from ..backends._base import ordered_sum
from ..integrator.loop import LaneProblem, integrate
from .augmented_jacobians import (
    augmented_options,
    is_stiff,
    sensitivity_jacobian,
    u_jacobian,
    with_jacobian,
)

Array = Any
_OK = (int(ReturnCode.Success), int(ReturnCode.Terminated))


def directions(static: Any, leaves: list[Any], n: int) -> list[tuple[int | None, int]]:
    """``(leaf position or None for u0, flat element)`` for each differentiated input of a
    problem with ``n`` state components."""
    out: list[tuple[int | None, int]] = []
    if static.u0_diff:
        out += [(None, j) for j in range(n)]
    for i, d in enumerate(static.diff_leaf):
        if d:
            out += [(i, j) for j in range(leaf_size(leaves[i], static.lane_leaf[i]))]
    return out


def forward(
    static: Any,
    batch: Any,
    u0: np.ndarray,
    t0: np.ndarray,
    t1: np.ndarray,
    save_times: np.ndarray,
    stops: np.ndarray | None,
) -> tuple[np.ndarray, tuple, Any]:
    """Integrate the batch with its sensitivities: saved states, ``(S, directions)``, result."""
    shape, n_lanes = u0.shape[:-1], u0.shape[-1]
    n = math.prod(shape)
    leaves = batch.leaves
    dirs = directions(static, leaves, n)
    z0 = np.zeros((n * (1 + len(dirs)), n_lanes), dtype=u0.dtype)
    z0[:n] = u0.reshape(n, n_lanes)
    for d, (pos, j) in enumerate(dirs):
        if pos is None:
            z0[n * (1 + d) + j] = 1.0
    rhs_for = _augmented_rhs_for(static, batch, dirs, shape)
    problem = LaneProblem(
        rhs_for=rhs_for,
        u0=z0,
        t0=np.asarray(t0, dtype=u0.dtype),
        t1=np.asarray(t1, dtype=u0.dtype),
        params=batch.params,
        save_times=save_times,
        tstops=stops,
    )
    result = integrate(
        problem, augmented_atol(augmented_options(static.options), shape, len(dirs)), batch.backend
    )
    saved = result.saved  # (L, nsave, n (1 + D))
    n_save = saved.shape[1]
    u_saved = saved[..., :n].reshape(n_lanes, n_save, *shape)
    sens = saved[..., n:].reshape(n_lanes, n_save, len(dirs), n)
    leaf_shapes = [np.shape(leaf) for leaf in leaves]
    return u_saved, (sens, dirs, leaf_shapes), result


def augmented_atol(options: Any, shape: tuple[int, ...], n_dirs: int) -> Any:
    """``options`` with a per-component ``atol`` (broadcastable to the state's shape)
    extended to the augmented state ``[u, S_1, ..., S_D]``: each sensitivity takes its state
    component's (the state-shaped ``atol`` did not broadcast to it: a ValueError from inside
    the integrator)."""
    if isinstance(options.atol, float):
        return options
    atol = np.broadcast_to(np.asarray(options.atol), shape).reshape(-1)
    return dataclasses.replace(options, atol=np.tile(atol, 1 + n_dirs))


def _augmented_rhs_for(
    static: Any, batch: Any, dirs: list[tuple[int | None, int]], shape: tuple[int, ...]
) -> Any:
    """``rhs_for(params)`` of the augmented state ``[u, S_1, ..., S_D]`` (flattened,
    lanes last): ``f`` and each direction's ``(df/du) S_d + df/dθ_d``, with the exact
    Jacobian for a stiff method."""
    n = math.prod(shape)
    leaves = batch.leaves
    traced = TracedRHS(
        static.f,
        static.p_template,
        static.lane_leaf,
        static.diff_leaf,
        static.single_lane,
        jac=static.jac,
        paramjac=static.paramjac,
    )
    # The coupling blocks of a stiff method's Jacobian differentiate the JVPs: autograd.
    traced_twice = dataclasses.replace(traced, jac=None, paramjac=None)
    offsets = parameter_offsets(leaves, static.lane_leaf)

    stiff = is_stiff(static.options.alg)

    def rhs_for(params: tuple) -> Any:
        current = substituted(leaves, batch.lane_positions, params)

        def rhs(z: Array, t: Array, out: Array | None = None) -> Array:
            width = z.shape[-1]
            u = z[:n].reshape(*shape, width)
            dz = np.empty_like(z) if out is None else out
            if traced.has_jacobians:  # one jac and paramjac, contracted with every direction
                value, j_u, j_p = traced.linearization(u, t, current)
                columns = np.moveaxis(j_u, 1, 0)
                for d, (pos, j) in enumerate(dirs):
                    s_d = z[n * (1 + d) : n * (2 + d)]
                    dot = ordered_sum(np, columns * s_d[:, None, :])
                    dz[n * (1 + d) : n * (2 + d)] = (
                        dot if pos is None else dot + j_p[:, offsets[pos] + j]
                    )
                dz[:n] = value
                return dz
            for d, (pos, j) in enumerate(dirs):
                y_dot = z[n * (1 + d) : n * (2 + d)].reshape(*shape, width)
                tangents = {} if pos is None else {pos: one_hot(current[pos], j, static, pos)}
                value, value_dot = traced.jvp(u, t, current, y_dot, tangents)
                dz[n * (1 + d) : n * (2 + d)] = np.reshape(value_dot, (n, width))
            if not dirs:
                value = traced._evaluate(u, t, current)
            dz[:n] = np.reshape(value, (n, width))
            return dz

        if not stiff:
            return rhs

        def jac(z: Array, t: Array) -> Array:
            # J from the problem's jac / autograd / differences, the couplings M_d exactly.
            width = z.shape[-1]
            u = z[:n]
            plain = batch.rhs_for(params)
            mode = static.options.alg.autodiff
            j_u, _ = lane_jacobian(batch.backend, plain, u, t, plain(u, t), mode)
            tangents = [
                {} if pos is None else {pos: one_hot(current[pos], j, static, pos)}
                for pos, j in dirs
            ]

            def products(u_: Array) -> Array:
                import autograd.numpy as anp

                rows = [
                    traced_twice.jvp(u_, t, current, z[n * (1 + d) : n * (2 + d)], tangents[d])[1]
                    for d in range(len(dirs))
                ]
                return anp.concatenate(rows) if rows else anp.zeros((0, width))

            return sensitivity_jacobian(np.asarray(j_u), u_jacobian(products, u))

        return with_jacobian(rhs, jac)

    return rhs_for


def one_hot(leaf: Any, j: int, static: Any, pos: int) -> Array:
    """A tangent shaped like ``leaf`` with one lane element ``j`` set (in every lane)."""
    arr = np.zeros(np.shape(leaf), dtype=np.result_type(leaf, np.float32))
    if static.lane_leaf[pos]:
        arr.reshape(-1, arr.shape[-1])[j] = 1.0
    else:
        arr.reshape(-1)[j] = 1.0
    return arr


def contract(
    static: Any, payload: tuple, retcode: np.ndarray, g: np.ndarray
) -> tuple[np.ndarray, list[Any]]:
    """Cotangents of ``u0`` ``(*shape, L)`` and of the differentiated leaves from the
    saved Jacobian: ``bar_d = Σ_save Σ_i g_i S_{d,i}`` lane by lane."""
    sens, dirs, leaf_shapes = payload
    n_lanes, n_save = g.shape[:2]
    shape = g.shape[2:]
    n = math.prod(shape)
    gf = g.reshape(n_lanes, n_save, 1, n)
    prod = gf * sens.astype(g.dtype)  # (L, nsave, D, n)
    # Per lane, the save points and state components added in a fixed order.
    terms = np.moveaxis(prod, (1, 3, 0), (0, 1, 3)).reshape(n_save * n, len(dirs), n_lanes)
    bar = ordered_sum(np, terms) if n_save * n else np.zeros((len(dirs), n_lanes), g.dtype)
    failed = ~np.isin(retcode, _OK)
    bar[:, failed] = np.nan
    u0_bar = np.zeros((n, n_lanes), dtype=g.dtype)
    leaf_bars: dict[int, list[Array]] = {}
    for d, (pos, j) in enumerate(dirs):
        if pos is None:
            u0_bar[j] = bar[d]
        else:
            leaf_bars.setdefault(pos, []).append(bar[d])
    if not static.u0_diff:
        u0_bar[:, failed] = np.nan
    out = []
    for pos, rows in leaf_bars.items():
        stacked = np.stack(rows)  # (k, L)
        if static.lane_leaf[pos]:
            out.append(stacked.reshape(leaf_shapes[pos]))
        else:
            summed = ordered_sum(np, np.moveaxis(stacked, -1, 0))  # over lanes, in order
            out.append(np.asarray(summed).reshape(leaf_shapes[pos]))
    return u0_bar.reshape(*shape, n_lanes), out
