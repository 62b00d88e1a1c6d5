"""Jacobians of an autograd-traced ``f`` over many columns: one trace, one reverse pass per
output row.

The discrete adjoint's bulk linearization (``dxode.sensitivity.bulk_linearization``) needs
``df/dy`` (and ``df/dq`` for the per-lane parameters ``q``) at hundreds of thousands of
columns (every recorded stage input of a chunk of steps, all lanes). Here autograd traces
``f`` once over the columns, with the state and the per-lane leaves boxed from roots of
their own, and runs one reverse pass from each output row ``r`` with a cotangent of ones:
the cotangents it leaves at the roots are row ``r`` of the Jacobians at every column. When
``f`` returns a list of rows (``[sigma * (y - x), ...]``), each pass starts at its own row
and visits only the operations that row depends on, so the ``n`` passes together cost about
one reverse pass of ``f`` plus the trace. When ``f`` returns one array, each pass starts at
an index of it and visits the whole trace (``n`` reverse passes). The numbers are autograd's
own: those of a VJP with a one-hot cotangent, to the last bit. ``parameter_vjp`` is the VJP
with respect to chosen parameter leaves alone (the state not traced), for the cotangents of
leaves shared by the columns."""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

import numpy as np

from . import _column_boxes, _pytree
from ._traced_rhs import (
    _PLAIN_NUMPY,
    TracedRHS,
    _as_traced_array,
    _columns,
    hides_the_trace,
    substituted,
)

Array = Any


def linearize(
    rhs: TracedRHS,
    y: Array,
    t: Array,
    leaves: list[Any],
    lane_wrt: list[int],
    out: Array,
    values: Array | None = None,
) -> Array:
    """``J = [df/dy | df/dq]`` ``(n, n + m, K)`` at every column of ``y`` ``(*shape, K)``
    (``n = prod(shape)``), written into ``out`` (a NumPy array of at least that size; the
    view is returned): ``J[r, c] = df_r/dy_c`` for ``c < n``, then ``df_r/dq_{c-n}`` for the
    ``m`` entries ``q`` of the per-lane leaves at positions ``lane_wrt`` (each flattened, in
    order). ``t`` is ``(K,)``, ``leaves`` the parameter leaves as these columns see them
    (per-lane ones ``(..., K)``). The state and those leaves are traced, each from its own
    root, so each output row's reverse pass gives the whole row. Rows that depend on none of
    them are zero. Where ``values`` ``(n, K)`` is given, the traced call's value of ``f`` is
    written into it."""
    from autograd.core import VJPNode
    from autograd.tracer import isbox, new_box, trace_stack

    k = int(y.shape[-1])
    n = math.prod(y.shape[:-1])
    sizes = [n, *(math.prod(leaves[i].shape[:-1]) for i in lane_wrt)]
    roots = [VJPNode.new_root() for _ in sizes]
    try:
        with trace_stack.new_trace() as trace:
            boxes = [
                new_box(_column_boxes.as_columns(x), trace, root)
                for x, root in zip([y, *(leaves[i] for i in lane_wrt)], roots, strict=True)
            ]
            p = _pytree.rebuild(rhs.p_template, substituted(leaves, lane_wrt, boxes[1:]))
            rows = _output_rows(rhs.f(boxes[0], p, t), boxes[0], n, k)
    except (TypeError, AttributeError, ValueError) as exc:
        if not hides_the_trace(exc):
            raise
        raise TypeError(_PLAIN_NUMPY) from exc
    jac = np.reshape(out.reshape(-1)[: n * sum(sizes) * k], (n, sum(sizes), k))
    jac[...] = 0.0
    ones = np.ones(k, dtype=y.dtype)
    bounds = list(itertools.pairwise(itertools.accumulate(sizes, initial=0)))
    shapes = [y.shape, *(leaves[i].shape for i in lane_wrt)]
    for r, row in enumerate(rows):
        if getattr(row, "dtype", None) == np.dtype(object):
            raise TypeError(_PLAIN_NUMPY)
        if values is not None:
            values[r] = row._value if isbox(row) else row
        if isbox(row) and row._trace == trace:  # else row r is constant in y and q
            parts = [np.reshape(jac[r, a:b], s) for (a, b), s in zip(bounds, shapes, strict=True)]
            _reverse_into(ones, row._node, roots, parts)
    return jac


def _reverse_into(g: Array, end: Any, roots: list[Any], parts: list[Array]) -> None:
    """Autograd's reverse pass from ``end`` with cotangent ``g`` (``autograd.core
    .backward_pass``), adding the cotangent of each of several ``roots`` into its zeroed
    ``parts`` array in place: autograd accumulates into an array it is handed as mutable,
    so no root cotangent is allocated and copied (for a chunk's columns, that traffic
    cost more than the arithmetic)."""
    from autograd.core import add_outgrads
    from autograd.util import toposort

    outgrads: dict[Any, tuple[Array, bool]] = {
        root: (part, True) for root, part in zip(roots, parts, strict=True)
    }
    outgrads[end] = add_outgrads(outgrads.get(end), g)
    reached = {id(root): part for root, part in zip(roots, parts, strict=True)}
    for node in toposort(end):
        outgrad = outgrads.pop(node)[0]
        if id(node) in reached:
            reached[id(node)] = outgrad
        for parent, ingrad in zip(node.parents, node.vjp(outgrad), strict=True):
            outgrads[parent] = add_outgrads(outgrads.get(parent), ingrad)
    for root, part in zip(roots, parts, strict=True):
        if reached[id(root)] is not part:  # autograd replaced rather than added in place
            part[...] = reached[id(root)]


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
    except (TypeError, AttributeError, ValueError) as exc:
        if not hides_the_trace(exc):
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
