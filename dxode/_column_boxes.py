"""Autograd over a batch of many columns without its per-element slow paths.

Autograd's reverse pass of indexing (``x, y, z = u``, ``p[0]``) scatters the cotangent with
``np.add.at``, and its ``stack`` indexes every row the same way: over the hundreds of
thousands of columns of a bulk linearization that costs ten times the arithmetic of ``f``.
Here the state and the per-lane parameter leaves are traced as ``Columns`` (an ``ndarray``
subclass with no behaviour of its own), whose box indexes through a primitive that adds a
basic index's cotangent in place (the same numbers: a basic index names each element once),
and ``stack_rows`` stacks a list of rows with a slicing VJP. Values and derivatives are those
of ``autograd.numpy`` to the last bit; only the bookkeeping differs.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

Array = Any


@functools.cache
def _primitives() -> tuple[type, Any, Any]:
    """The ``Columns`` type (registered with autograd on first use), ``stack_rows`` and the
    indexing primitive ``take_basic``."""
    from autograd.extend import SparseObject, defvjp, defvjp_argnums, primitive, vspace
    from autograd.numpy.numpy_boxes import ArrayBox
    from autograd.numpy.numpy_vspaces import ArrayVSpace

    class Columns(np.ndarray):
        """A batch of columns that autograd boxes as ``ColumnsBox``."""

    @primitive
    def take_basic(a: Array, idx: Any) -> Array:
        return a[idx]

    def untake(g: Array, idx: Any, vs: Any) -> Any:
        def add(a: Array) -> Array:
            if _basic(idx):
                a[idx] += g
            else:  # an integer or boolean array may name an element twice
                np.add.at(a, idx, g)
            return a

        return SparseObject(vs, add)

    defvjp(take_basic, lambda ans, a, idx: lambda g: untake(g, idx, vspace(a)))

    class ColumnsBox(ArrayBox):
        __slots__ = ()

        def __getitem__(self, idx: Any) -> Any:
            return take_basic(self, idx)

    ColumnsBox.register(Columns)
    ArrayVSpace.register(Columns)

    @primitive
    def stack_rows(*rows: Array) -> Array:
        return np.stack(rows)

    defvjp_argnums(stack_rows, lambda argnums, ans, args, kwargs: lambda g: [g[i] for i in argnums])
    return Columns, stack_rows, take_basic


def _basic(idx: Any) -> bool:
    """Whether ``idx`` is a basic index (integers, slices, ``None``, ``...``)."""
    parts = idx if isinstance(idx, tuple) else (idx,)
    return all(
        part is None or part is Ellipsis or isinstance(part, (int, np.integer, slice))
        for part in parts
    )


def as_columns(x: Array) -> Array:
    """``x`` (a NumPy array) as ``Columns``, traced by autograd with the fast indexing."""
    return x.view(_primitives()[0])


def stack_rows(rows: list[Array]) -> Array:
    """The rows (traced or not, all of one shape) stacked along a new first axis."""
    return _primitives()[1](*rows)


def take_row(x: Array, r: int) -> Array:
    """``x[r]`` (traced or not) through the indexing primitive with the in-place VJP."""
    return _primitives()[2](x, r)
