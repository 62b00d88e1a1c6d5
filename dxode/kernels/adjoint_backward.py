"""The kernel discrete adjoint's backward pass for one batch (see ``adjoint``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._retcode import ReturnCode
from ..backends._base import ordered_sum
from .adjoint_params import autograd_rows, compiled_rows, leaf_rows
from .adjoint_sweep import lane_sweep
from .compiler import user_function_mode
from .description import StepperDescription, describe
from .sensitivity_rhs import check_jacobian_rows

__all__ = ["backward", "tableau_arrays"]

_OK = (int(ReturnCode.Success), int(ReturnCode.Terminated))


def tableau_arrays(desc: StepperDescription) -> tuple[np.ndarray, ...]:
    """``A`` ``(S+E, S+E)`` (main and extra stages), ``b`` ``(S,)``, ``c`` ``(S+E,)`` and the
    interpolant's coefficients ``(S+E, degree)`` (rows zero-padded) as float64 arrays."""
    s, e = desc.stages, desc.extra_stages
    a = np.zeros((s + e, s + e))
    for i, row in enumerate(desc.a):
        a[i, : len(row)] = row
    for x, row in enumerate(desc.a_extra):
        a[s + x, : len(row)] = row
    c = np.array([*desc.c, *desc.c_extra], dtype=np.float64)
    rows = desc.interpolant
    degree = max((len(r) for r in rows), default=0)
    w = np.zeros((s + e, max(degree, 1)))
    for i, row in enumerate(rows):
        w[i, : len(row)] = row
    return a, np.array(desc.b, dtype=np.float64), c, w


def backward(
    static: Any,
    record: dict[str, Any],
    leaves: list[Any],
    retcode: np.ndarray,
    g: np.ndarray,
    device: str = "cpu",
) -> tuple[np.ndarray, list[Any]]:
    """Cotangents of ``u0`` ``(n, L)`` and of the differentiated leaves from the cotangent
    ``g`` ``(L, nsave, n)`` of the saved states; NaN for lanes that failed. The sweep runs
    on ``device``, the parameter pass on the host."""
    desc = describe(static.options.alg)
    assert isinstance(desc, StepperDescription)
    steps, grid, params, layout = (record[k] for k in ("steps", "save_grid", "params", "layout"))
    n_lanes, _, n = g.shape
    example = eval(layout.expression("0"), {"P": params[:, :1]})
    as_array = user_function_mode(static.f, n, "float64", example, "cpu")
    check_jacobian_rows(static, n, as_array, example, params.shape[0])
    s, e = desc.stages, desc.extra_stages
    lanes = lane_sweep(
        static.f,
        n,
        as_array,
        layout.expression("g"),
        _float64(example),
        static.jac,
        device,
        s + e,
    )
    a, b, c, w = tableau_arrays(desc)
    params64 = np.ascontiguousarray(params, dtype=np.float64)
    counts = np.array([t.shape[0] for t, _ in steps], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    rows = int(np.sum(counts - 1)) * (s + e)
    stages = {key: np.empty((rows, n)) for key in ("y", "kbar", "k")}
    stages["t"] = np.empty(rows)
    u0_bar = np.zeros((n_lanes, n))
    lanes(
        np.concatenate([t for t, _ in steps]).astype(np.float64),
        np.concatenate([u for _, u in steps]).astype(np.float64),
        offsets,
        params64,
        np.ascontiguousarray(grid.T, dtype=np.float64),
        np.ascontiguousarray(g, dtype=np.float64),
        a,
        b,
        c,
        w,
        s,
        e,
        np.asarray(record["direction"], dtype=np.float64),
        u0_bar,
        stages["y"],
        stages["t"],
        stages["kbar"],
        stages["k"],
    )
    stages["lane"] = np.repeat(np.arange(n_lanes), (counts - 1) * (s + e))
    # Failed lanes get NaN rows anyway (_finish): their stages (maybe inf) stay out.
    # (copied only then: on 1,000 Lorenz trajectories the stages are 2.3 M rows, 135 ms)
    ok = np.isin(retcode, _OK)
    if not ok.all():
        keep = ok[stages["lane"]]
        stages = {key: value[keep] for key, value in stages.items()}
    leaf_bars = _leaf_cotangents(static, leaves, stages, params64, layout, n, as_array, n_lanes)
    return _finish(static, u0_bar.T.copy(), leaf_bars, leaves, retcode, g.dtype)


def _float64(tree: Any) -> Any:
    if isinstance(tree, tuple):
        return tuple(_float64(x) for x in tree)
    return None if tree is None else float(tree)


def _leaf_cotangents(
    static: Any,
    leaves: list[Any],
    stages: dict[str, np.ndarray],
    params: np.ndarray,
    layout: Any,
    n: int,
    as_array: bool,
    n_lanes: int,
) -> list[np.ndarray]:
    """Each differentiated leaf's per-lane cotangent ``(*lane shape, L)``: from
    ``paramjac``, one autograd VJP over the stages, or complex step (``adjoint_params``)."""
    if not any(static.diff_leaf):
        return []
    if static.paramjac is None or static.jac is None:
        bars = autograd_rows(static, leaves, stages, n_lanes)
        if bars is not None:
            return bars
    positions = leaf_rows(static, leaves)
    rows = [r for _, leaf in positions for r in leaf]
    values = compiled_rows(
        static.f,
        n,
        as_array,
        layout,
        rows,
        params,
        stages,
        static.paramjac if static.jac is not None else None,
    )
    out, start = [], 0
    for i, leaf in positions:
        block = values[start : start + len(leaf)]
        start += len(leaf)
        shape = np.shape(leaves[i])[:-1] if static.lane_leaf[i] else np.shape(leaves[i])
        out.append(block.reshape(*shape, n_lanes))
    return out


def _finish(
    static: Any,
    u0_bar: np.ndarray,
    leaf_bars: list[np.ndarray],
    leaves: list[Any],
    retcode: np.ndarray,
    dtype: Any,
) -> tuple[np.ndarray, list[Any]]:
    """NaN for failed lanes; shared leaves summed over the lanes in order; ``dtype``."""
    failed = ~np.isin(retcode, _OK)
    u0_bar[:, failed] = np.nan
    diff = [i for i, d in enumerate(static.diff_leaf) if d]
    out = []
    for i, bar in zip(diff, leaf_bars, strict=True):
        bar = np.array(bar, dtype=np.float64)
        bar[..., failed] = np.nan
        if static.lane_leaf[i]:
            out.append(bar.astype(dtype))
        else:
            summed = ordered_sum(np, np.moveaxis(bar, -1, 0))
            out.append(np.asarray(summed, dtype=dtype).reshape(np.shape(leaves[i])))
    return u0_bar.astype(dtype), out
