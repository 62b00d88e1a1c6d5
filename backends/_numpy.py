"""The NumPy backend: the CPU, synchronous, with indexed assignment."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._base import Array, Backend

# States at most this size use one fused reduction (fewer calls); larger ones work in place.
_SMALL = 2048


class NumpyBackend(Backend):
    """NumPy on the CPU. NumPy 2 is itself an array-API namespace, so ``xp`` is ``numpy``."""

    name = "numpy"

    @property
    def xp(self) -> Any:
        return np

    def ignore_fp_errors(self) -> Any:
        return np.errstate(over="ignore", invalid="ignore", divide="ignore")

    def combine(self, u: Array | None, h: Array, weights: Array, stages: Array) -> Array:
        m = weights.shape[0]
        if stages[0].size <= _SMALL:
            increment = h * np.cumsum(weights * stages[:m], axis=0)[-1]
            return increment if u is None else u + increment
        # In place, term by term (the same operations, in the same order, as above): two
        # buffers in all, and scalar weights (numpy's fastest loops).
        acc = np.multiply(stages[0], weights[0])
        term = np.empty_like(acc)
        for j in range(1, m):
            np.multiply(stages[j], weights[j], out=term)
            np.add(acc, term, out=acc)
        np.multiply(acc, h, out=acc)
        return acc if u is None else np.add(acc, u, out=acc)

    def stack_rows(self, rows: Any, out: Array | None = None) -> Array:
        return np.asarray(rows) if out is None else np.stack(rows, out=out)

    def scatter_rows(self, keys: Array, values: Array, n_rows: int, fill: float) -> Array:
        out = np.full((n_rows, *values.shape[1:]), fill, dtype=values.dtype)
        out[keys] = values
        return out
