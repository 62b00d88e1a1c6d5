"""A backend for any array-API-conforming library (e.g. ``array_api_strict``), host memory."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ._base import Array, Backend


class ArrayAPIBackend(Backend):
    """Computes through a namespace that follows the array API standard and nothing more.

    dxode's tests run the whole core on ``array_api_strict`` through this backend, which
    proves the core needs nothing beyond the standard.
    """

    def __init__(self, namespace: Any) -> None:
        self._xp = namespace
        self.name = getattr(namespace, "__name__", repr(namespace))

    @property
    def xp(self) -> Any:
        return self._xp

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Travels (to Dask workers) as the name of its namespace's module.
        return _for_module, (self._xp.__name__,)

    def to_host(self, x: Array) -> np.ndarray:
        return np.from_dlpack(x)

    def ignore_fp_errors(self) -> Any:
        # Namespaces that compute with NumPy underneath (array_api_strict, for one) warn
        # through its error state; for the others this is a no-op.
        return np.errstate(over="ignore", invalid="ignore", divide="ignore")


def _for_module(name: str) -> ArrayAPIBackend:
    """The backend of the array namespace importable as ``name``."""
    return ArrayAPIBackend(importlib.import_module(name))
