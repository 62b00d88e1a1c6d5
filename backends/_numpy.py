"""The NumPy backend: the CPU, synchronous, with indexed assignment."""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

from ._base import Array, Backend, check_row, ordered_sum, row_mismatch, row_shape

# States (times lanes) from these sizes on reuse a scratch array for the stage products, and
# combine stages term by term, in place.
_SCRATCH_FROM = 1_024
_IN_PLACE_FROM = 16_384


class _Inverses(NamedTuple):
    """Per-lane inverses ``(L, n, n)``, lanes first (what LAPACK batches over)."""

    inverse: np.ndarray


class NumpyBackend(Backend):
    """NumPy on the CPU. NumPy 2 is itself an array-API namespace, so ``xp`` is ``numpy``."""

    name = "numpy"

    def __init__(self) -> None:
        self._local = threading.local()

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Travels (in a pickled solution, to and from Dask workers) as its class, built
        # afresh there: its thread-local scratch space cannot be pickled and is not state.
        return NumpyBackend, ()

    @property
    def xp(self) -> Any:
        return np

    def ignore_fp_errors(self) -> Any:
        return np.errstate(over="ignore", invalid="ignore", divide="ignore")

    def combine(self, u: Array | None, h: Array, weights: Array, stages: Array) -> Array:
        m = weights.shape[0]
        size = stages[0].size
        if size < _SCRATCH_FROM:  # tiny: a fresh temporary is cheaper than managing one
            acc = ordered_sum(np, weights * stages[:m])
        elif size < _IN_PLACE_FROM:
            # Few calls: all products at once into scratch space, then one ordered sum.
            products = np.multiply(weights, stages[:m], out=self._buffer(stages, m))
            acc = ordered_sum(np, products)
        else:
            # Large arrays: term by term, two buffers that stay in cache (the same
            # operations in the same order: products first, then added in stage order).
            acc = np.multiply(stages[0], weights[0])
            term = np.empty_like(acc)
            for j in range(1, m):
                np.multiply(stages[j], weights[j], out=term)
                np.add(acc, term, out=acc)
        np.multiply(acc, h, out=acc)
        return acc if u is None else np.add(acc, u, out=acc)

    def _buffer(self, stages: Array, m: int) -> Array:
        """A reused ``(m, *shape, L)`` scratch array (per thread: Dask workers may share us)."""
        local = self._local
        buffer = getattr(local, "buffer", None)
        if (
            buffer is None
            or buffer.shape[1:] != stages.shape[1:]
            or buffer.dtype != stages.dtype
            or buffer.shape[0] < m
        ):
            # One working-set shape at a time (compaction changes it).
            buffer = local.buffer = np.empty(stages.shape, dtype=stages.dtype)
        return buffer[:m]

    def stack_rows(
        self,
        rows: Any,
        out: Array | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: Any = None,
    ) -> Array:
        target = row_shape(rows, out.shape if out is not None else shape)
        if out is not None and all(type(row) is np.ndarray and row.shape == target for row in rows):
            for i, row in enumerate(rows):  # arrays of the row shape: nothing to check
                out[i, ...] = row
            return out
        for i, row in enumerate(rows):
            check_row(i, row, target)
        if out is None:
            if not rows:
                return np.asarray(rows)
            if dtype is None or any(type(row) not in (int, float, bool) for row in rows):
                try:  # arrays and Python numbers (weakly typed, NEP 50)
                    dtype = np.result_type(*rows)
                except TypeError:  # a row given as a list
                    dtype = np.result_type(*map(_dtype_operand, rows))
            out = np.empty((len(rows), *target), dtype=dtype)
        for i, row in enumerate(rows):  # row by row: cheaper than np.stack for a few rows
            try:
                out[i, ...] = row
            except ValueError:
                raise ValueError(row_mismatch(i, row, target)) from None
        return out

    def scatter_rows(self, keys: Array, values: Array, n_rows: int, fill: float) -> Array:
        out = np.full((n_rows, *values.shape[1:]), fill, dtype=values.dtype)
        out[keys] = values
        return out

    def add_to_lanes(self, target: Array, positions: Array, values: Array) -> Array:
        target[..., positions] += values
        return target

    def lu_factor(self, a: Array) -> Any:
        """Per-lane inverses from LAPACK (``np.linalg.inv`` on ``(L, n, n)``).

        On NumPy one batched LAPACK call and a batched product per solve beat lanes-last
        elimination at every size measured (``asv_bench/batched_lu.py``: equal for ``n = 3``
        and ``10^5`` lanes, 2-70x faster for larger ``n`` or few lanes); LAPACK treats each
        lane's matrix on its own, so a lane's bits do not depend on its batch. A batch with an
        exactly singular matrix falls back to the generic elimination, which lets that lane
        fail (non-finite error, a smaller step) instead of the whole batch.
        """
        if a.ndim != 3 or a.shape[0] != a.shape[1]:
            return super().lu_factor(a)  # raises the shape error
        try:
            return _Inverses(np.linalg.inv(np.moveaxis(a, -1, 0)))
        except np.linalg.LinAlgError:
            return super().lu_factor(a)

    def lu_solve(self, factors: Any, b: Array) -> Array:
        if not isinstance(factors, _Inverses):
            return super().lu_solve(factors, b)
        x = np.matmul(factors.inverse, np.moveaxis(b, -1, 0)[..., None])
        return np.moveaxis(x[..., 0], 0, -1)


def _dtype_operand(row: Any) -> Any:
    """A row as ``np.result_type`` takes it: lists become arrays, Python numbers stay
    weakly typed (NEP 50)."""
    if isinstance(row, (int, float)) or hasattr(row, "dtype"):
        return row
    return np.asarray(row)
