"""Where a kernel batch's per-lane arrays live: NumPy on the host, or CuPy on the GPU that runs
the CUDA kernel (a CuPy ensemble's lanes are built, laid out and read there, without a trip
through the host: at millions of trajectories each host pass costs tens of milliseconds)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
from array_api_compat import is_cupy_array

__all__ = ["array_module"]


def array_module(x: Any) -> ModuleType:
    """The module of ``x``'s kind of array, ``numpy`` or ``cupy`` (with ``ascontiguousarray``,
    ``full``, ``concatenate`` and ``broadcast_to`` as NumPy has them)."""
    if is_cupy_array(x):
        import cupy

        return cupy
    return np
