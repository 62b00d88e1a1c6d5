"""The backend contract: everything in dxode that knows which array library or device it runs on."""

from __future__ import annotations

import abc
import contextlib
import math
from typing import Any

import numpy as np

from . import _lu

Array = Any


def ordered_sum(xp: Any, x: Array) -> Array:
    """``x[0] + x[1] + ...`` over the first axis, added in that order for every element.

    A library's sum adds in order while the first axis is not the innermost loop, which it
    is not as long as the rest of the array has two or more elements. With a single element
    the first axis becomes innermost, where NumPy adds blocks of eight or more terms pairwise
    (in an order that depends on the length): then the element is summed beside a copy.
    """
    reduce = np.add.reduce if xp is np else (lambda a, axis: xp.sum(a, axis=axis))
    rest = x.shape[1:]
    if x.shape[0] < 8 or math.prod(rest) != 1:
        return reduce(x, axis=0)
    flat = xp.reshape(x, (x.shape[0], 1))
    pair = xp.concat([flat, flat], axis=1)
    return xp.reshape(reduce(pair, axis=0)[:1], rest)


def row_shape(rows: Any, shape: tuple[int, ...] | None) -> tuple[int, ...]:
    """The shape each row of a list-of-rows RHS result fills: ``shape[1:]`` for a state of
    ``shape``, else (no state shape known) the rows' common broadcast shape."""
    if shape is not None:
        if len(rows) != shape[0]:
            raise ValueError(
                f"the right-hand side returned {len(rows)} rows for a state of {shape[0]}"
            )
        return tuple(shape[1:])
    shapes = [tuple(np.shape(row)) for row in rows]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(
            f"the right-hand side returned rows of shapes {shapes}, which do not broadcast to "
            f"one row shape"
        ) from None


def row_mismatch(index: int, row: Any, target: tuple[int, ...]) -> str:
    """The message for a returned row that does not broadcast to the state's row shape."""
    return (
        f"row {index} of the right-hand side's result has shape {tuple(np.shape(row))}, which "
        f"does not broadcast to the state's row shape {target}"
    )


def check_row(index: int, row: Any, target: tuple[int, ...]) -> None:
    """Raise unless ``row`` fills a row of shape ``target`` without guessing.

    A number or a 0-d array is a constant row; an array must have the row's shape exactly
    (one element will do for a scalar row). A row of another shape that merely broadcasts,
    such as ``u[0][:1]`` beside lanes of shape ``(L,)``, would copy one lane's value into all
    of them. Nested lists (rows of a Jacobian) are left to the stacking.
    """
    if row is None or isinstance(row, (str, bytes)):
        raise TypeError(
            f"row {index} of the right-hand side's result is {type(row).__name__}; each row "
            f"must be a number or an array of the state's row shape {target}"
        )
    shape = getattr(row, "shape", None)
    if shape is None or shape == target or shape == ():
        return
    if target == () and math.prod(shape) == 1:
        return
    raise ValueError(
        f"row {index} of the right-hand side's result has shape {tuple(shape)}, which is not "
        f"the state's row shape {target}: return a number for a constant row (p[0], not a "
        f"one-element slice), or an array of the row's shape"
    )


class Backend(abc.ABC):
    """One array library (and device) that dxode can compute on.

    The solver core computes through the array namespace ``xp`` alone; a backend adds what
    the array API standard leaves out: placing data on a device, copying results to the host,
    synchronising before a timer stops, and fast scatter where the library allows it.
    """

    name: str

    @property
    @abc.abstractmethod
    def xp(self) -> Any:
        """The array namespace (the library imported on first use)."""

    def asarray(self, x: Any, dtype: Any = None) -> Array:
        """``x`` as an array of this backend (on its device), optionally cast to ``dtype``."""
        return self.xp.asarray(x, dtype=dtype)

    def to_host(self, x: Array) -> np.ndarray:
        """A NumPy copy (or view, on the CPU) of ``x``."""
        return np.asarray(x)

    def synchronize(self) -> None:  # noqa: B027 - a no-op unless the backend is asynchronous
        """Wait until queued work is done (a no-op on synchronous backends)."""

    def ignore_fp_errors(self) -> Any:
        """A context in which overflow or invalid operations pass silently.

        Lanes that blow up are handled by return codes, so the library's floating-point
        warnings would only be noise. A no-op for libraries that do not warn.
        """
        return contextlib.nullcontext()

    def combine(self, u: Array | None, h: Array, weights: Array, stages: Array) -> Array:
        """``u + h * sum_j weights[j] * stages[j]``: a Runge–Kutta stage combination.

        With ``u=None`` the ``u +`` is left out (for error estimates).

        ``weights`` is ``(m, 1, ..., 1)`` (or ``(m, 1, ..., L)``, per lane) and ``stages``
        ``(>= m, *shape, L)``; ``h`` is ``(L,)``.
        The sum runs over ``j`` in order, elementwise per lane, so every backend gives a lane
        the same bits whatever the batch size.
        """
        m = weights.shape[0]
        increment = h * ordered_sum(self.xp, weights * stages[:m, ...])
        return increment if u is None else u + increment

    def stack_rows(
        self,
        rows: Any,
        out: Array | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: Any = None,
    ) -> Array:
        """An RHS that returned a list of rows, stacked along a new first axis (into ``out``).

        Rows are broadcast to the state's row shape (``out.shape[1:]``, else ``shape[1:]``,
        else the rows' common shape), so a constant row such as ``-9.81`` fills a whole row
        of a batch of lanes. Python numbers take the dtype of the array rows, or ``dtype``
        (the state's) when every row is a Python number.
        """
        xp = self.xp
        target = row_shape(rows, out.shape if out is not None else shape)
        for i, row in enumerate(rows):
            check_row(i, row, target)
        converted = [
            row if isinstance(row, (int, float)) or hasattr(row, "dtype") else xp.asarray(row)
            for row in rows
        ]
        arrays = [row for row in converted if not isinstance(row, (int, float))]
        dtype = xp.result_type(*arrays) if arrays else dtype
        full = []
        for i, row in enumerate(converted):
            try:
                full.append(xp.broadcast_to(xp.asarray(row, dtype=dtype), target))
            except ValueError:
                raise ValueError(row_mismatch(i, row, target)) from None
        stacked = xp.stack(full)
        if out is None:
            return stacked
        out[...] = stacked
        return out

    def scatter_rows(self, keys: Array, values: Array, n_rows: int, fill: float) -> Array:
        """Rows ``values[i]`` placed at ``out[keys[i]]`` in an ``(n_rows, ...)`` array.

        Rows that no key names hold ``fill``; keys are unique. This generic version uses only
        sorting and searching from the array API standard; libraries with indexed assignment
        override it.
        """
        xp = self.xp
        shape = (n_rows, *values.shape[1:])
        if keys.shape[0] == 0:
            return xp.full(shape, fill, dtype=values.dtype)
        order = xp.argsort(keys)
        sorted_keys = xp.take(keys, order)
        sorted_values = xp.take(values, order, axis=0)
        wanted = xp.arange(n_rows, dtype=keys.dtype)
        pos = xp.clip(xp.searchsorted(sorted_keys, wanted), max=keys.shape[0] - 1)
        found = xp.take(sorted_keys, pos) == wanted
        found = xp.reshape(found, (n_rows,) + (1,) * (values.ndim - 1))
        return xp.where(
            found, xp.take(sorted_values, pos, axis=0), xp.asarray(fill, dtype=values.dtype)
        )

    def add_to_lanes(self, target: Array, positions: Array, values: Array) -> Array:
        """``target`` with ``values[..., i]`` added to lane ``positions[i]`` (the last axis).

        ``positions`` are unique; the other lanes are unchanged. Libraries with indexed
        assignment update ``target`` in place (and return it); this generic version builds a
        new array.
        """
        xp = self.xp
        rows = self.scatter_rows(positions, xp.moveaxis(values, -1, 0), target.shape[-1], 0.0)
        return target + xp.moveaxis(rows, 0, -1)

    def lu_factor(self, a: Array) -> Any:
        """Factor each lane's matrix of ``a`` (``(n, n, L)``, lanes last) for ``lu_solve``.

        The result is opaque: pass it to this backend's ``lu_solve``, as often as needed.
        This generic version is Gaussian elimination with partial pivoting per lane, through
        the array API alone (elementwise across lanes: batching never changes a lane's bits).
        """
        return _lu.lu_factor(self.xp, a)

    def lu_solve(self, factors: Any, b: Array) -> Array:
        """Solve ``A x = b`` per lane with ``factors = lu_factor(A)``; ``b``, ``x``: ``(n, L)``."""
        return _lu.lu_solve(self.xp, factors, b)

    def __repr__(self) -> str:
        return f"<dxode backend {self.name!r}>"
