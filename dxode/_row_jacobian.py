"""State Jacobians of an autograd-traced ``f`` over many columns: one trace, one reverse pass
per output row.

The discrete adjoint's bulk linearization (``dxode.sensitivity.bulk_linearization``) needs
``J = df/dy`` at hundreds of thousands of columns (every recorded stage input of a chunk of
steps, all lanes). Here autograd traces ``f`` once over the columns, with only the state
boxed, and runs one reverse pass from each output row ``r`` with a cotangent of ones: the
state cotangent it returns is row ``r`` of ``J`` at every column. When ``f`` returns a list
of rows (``[sigma * (y - x), ...]``), each pass starts at its own row and visits only the
operations that row depends on, so the ``n`` passes together cost about one reverse pass of
``f`` plus the trace. When ``f`` returns one array, each pass starts at an index of it and
visits the whole trace (``n`` reverse passes). The numbers are autograd's own: those of a VJP
with a one-hot cotangent, to the last bit. ``parameter_vjp`` is the VJP with respect to the
parameter leaves alone (the state not traced), for the parameter cotangents of the same
columns.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from . import _column_boxes, _pytree
from ._traced_rhs import _PLAIN_NUMPY, TracedRHS, _as_traced_array, _columns, substituted

Array = Any


def state_jacobian(rhs: TracedRHS, y: Array, t: Array, leaves: list[Any]) -> Array:
    """``J`` ``(n, n, K)``, ``J[r, c] = df_r/dy_c`` at every column of ``y`` ``(*shape, K)``
    (a NumPy state with lanes last; ``t`` ``(K,)``; ``leaves`` the parameter leaves as these
    columns see them, per-lane ones ``(..., K)``), ``n = prod(shape)``. Rows that do not
    depend on the state are zero."""
    from autograd.core import VJPNode, backward_pass
    from autograd.tracer import isbox, new_box, trace_stack

    shape, k = tuple(y.shape[:-1]), int(y.shape[-1])
    n = math.prod(shape)
    p = _pytree.rebuild(rhs.p_template, leaves)
    root = VJPNode.new_root()
    try:
        with trace_stack.new_trace() as trace:
            start = new_box(_column_boxes.as_columns(y), trace, root)
            rows = _output_rows(rhs.f(start, p, t), start, n, k)
    except (TypeError, AttributeError) as exc:
        if "Box" not in str(exc):
            raise
        raise TypeError(_PLAIN_NUMPY) from exc
    jac = np.zeros((n, n, k), dtype=y.dtype)
    ones = np.ones(k, dtype=y.dtype)
    for r, row in enumerate(rows):
        if getattr(row, "dtype", None) == np.dtype(object):
            raise TypeError(_PLAIN_NUMPY)
        if isbox(row) and row._trace == trace:  # else row r is constant in the state
            jac[r] = np.reshape(np.asarray(backward_pass(ones, row._node)), (n, k))
    return jac


def parameter_vjp(
    rhs: TracedRHS, y: Array, t: Array, leaves: list[Any], wrt: list[int], v: Array
) -> list[Any]:
    """The cotangents of the leaves at positions ``wrt`` from the VJP of ``f`` at the columns
    ``y`` ``(*shape, K)`` applied to ``v`` (like ``y``): per-lane leaves ``(..., K)``, one per
    column; leaves shared by the columns summed over them. Only those leaves are traced."""
    import autograd

    leaves = _columns(y, leaves, rhs.lane_leaf)[1]

    def call(*values: Any) -> Array:
        return rhs._evaluate(y, t, substituted(leaves, wrt, values), True)

    try:
        with warnings.catch_warnings():  # a leaf f does not use: a zero cotangent
            warnings.filterwarnings("ignore", "Output seems independent of input")
            argnums = tuple(range(len(wrt)))
            vjp, _ = autograd.make_vjp(call, argnum=argnums)(*[leaves[i] for i in wrt])
    except (TypeError, AttributeError) as exc:
        if "Box" not in str(exc):
            raise
        raise TypeError(_PLAIN_NUMPY) from exc
    return [np.asarray(g) if isinstance(g, np.ndarray) else g for g in vjp(v)]


def _output_rows(out: Any, state: Any, n: int, k: int) -> list[Any]:
    """``f``'s output as ``n`` rows of ``K`` columns: its own rows where it returned a list of
    them for a 1-D state, else indexes of the stacked, flattened output."""
    import autograd.numpy as anp

    own_rows = type(out) in (list, tuple) and len(out) == n and len(state.shape) == 2
    if own_rows and all(np.shape(row) == (k,) or isinstance(row, (int, float)) for row in out):
        return list(out)
    whole = _as_traced_array(out, state, _column_boxes.stack_rows)
    flat = anp.reshape(whole, (n, k))
    return [_column_boxes.take_row(flat, r) for r in range(n)]
