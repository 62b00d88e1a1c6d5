"""Shared fixtures: the array backends and dtypes every core test runs on.

``DXODE_TEST_BACKENDS`` (comma-separated: numpy, array_api_strict, cupy) narrows the set.
CuPy is used only where it imports and sees a GPU; elsewhere its cases are skipped with the
reason, never silently dropped.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from dxode.backends import cupy_available

_ALL = ("numpy", "array_api_strict", "cupy")
_SELECTED = tuple(
    name for name in os.environ.get("DXODE_TEST_BACKENDS", ",".join(_ALL)).split(",") if name
)


def _namespace(name: str):
    if name == "numpy":
        return np
    if name == "array_api_strict":
        import array_api_strict

        return array_api_strict
    if name == "cupy":
        if not cupy_available():
            pytest.skip("CuPy with a CUDA GPU is not available on this machine")
        import array_api_compat.cupy

        return array_api_compat.cupy
    raise ValueError(name)


@pytest.fixture(
    params=[pytest.param(n, marks=[pytest.mark.gpu] if n == "cupy" else []) for n in _SELECTED]
)
def xp(request):
    """An array namespace: NumPy, array_api_strict (the standard and nothing more) or CuPy."""
    return _namespace(request.param)


@pytest.fixture(params=["float64", "float32"])
def dtype_name(request):
    return request.param


def to_numpy(x) -> np.ndarray:
    """A host NumPy copy of any backend's array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get"):
        return x.get()
    return np.from_dlpack(x)


@pytest.fixture(scope="module")
def client():
    """A ``distributed.Client`` on a two-worker local cluster of processes, one per module."""
    distributed = pytest.importorskip("distributed", reason="needs dxode[dask]")
    import dxode

    with (
        dxode.local_cluster(n_workers=2) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        yield c
