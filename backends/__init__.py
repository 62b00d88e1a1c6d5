"""Array backends (shipped as ``dxode.backends``): the only part of dxode that knows hardware.

``backend_for(x)`` finds the backend of an existing array without importing any library that
is not already loaded; ``get_backend(name)`` picks one by name (``"numpy"`` or ``"cupy"``).
"""

from __future__ import annotations

import functools
from typing import Any

import array_api_compat
import numpy as np

from ._array_api import ArrayAPIBackend
from ._base import Array, Backend
from ._cupy import CupyBackend, cupy_available
from ._numpy import NumpyBackend

__all__ = [
    "ArrayAPIBackend",
    "Backend",
    "CupyBackend",
    "NumpyBackend",
    "backend_for",
    "cupy_available",
    "get_backend",
    "host_dtype",
    "to_host",
]

_NAMED = {"numpy": NumpyBackend, "cupy": CupyBackend}


def get_backend(name: str | Backend) -> Backend:
    """The backend named ``name`` (``"numpy"`` or ``"cupy"``); a Backend passes through."""
    if isinstance(name, Backend):
        return name
    try:
        return _named(name)
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_NAMED)}") from None


@functools.cache
def _named(name: str) -> Backend:
    return _NAMED[name]()


def backend_for(x: Array) -> Backend:
    """The backend that computes on arrays like ``x`` (NumPy, CuPy or any array-API library)."""
    if isinstance(x, np.ndarray) or np.isscalar(x):
        return _named("numpy")
    if array_api_compat.is_cupy_array(x):
        return _named("cupy")
    return _generic(array_api_compat.array_namespace(x))


@functools.cache
def _generic(namespace: Any) -> Backend:
    return ArrayAPIBackend(namespace)


def to_host(x: Array) -> np.ndarray:
    """``x`` as a NumPy array on the host (NumPy arrays pass through uncopied)."""
    return x if isinstance(x, np.ndarray) else backend_for(x).to_host(x)


def host_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of an array library's ``dtype`` (NumPy's and CuPy's pass through;
    ``array_api_strict.float32`` becomes ``np.float32``, by name)."""
    if isinstance(dtype, np.dtype):
        return dtype
    return np.dtype(str(dtype).rsplit(".", 1)[-1])
