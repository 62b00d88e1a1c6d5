"""The one list of methods, backends and dtypes the tests draw from, and their matrix.

Test files take their methods from here (``EXPLICIT``, ``FIXED_STEP``, ``ADAPTIVE``,
``STIFF``, ``METHODS``) instead of writing the list out, and parametrize a method × backend ×
dtype study with :func:`matrix`. ``test_structure.py`` checks that ``METHODS`` holds every
method dxode offers, so a new method cannot be left out of the tests silently.

``DXODE_TEST_BACKENDS`` (comma-separated: numpy, array_api_strict, cupy) narrows the
backends. CuPy is used only where it imports and sees a GPU; elsewhere its cases are skipped
with the reason, never silently dropped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import dxode
from dxode.backends import cupy_available

# ---- methods ------------------------------------------------------------------------------

#: Explicit Runge–Kutta methods with a fixed step only (no error estimate).
FIXED_STEP: tuple[type[dxode.AbstractStepper], ...] = (dxode.Euler, dxode.RK4)
#: Explicit Runge–Kutta methods with an embedded error estimate, by order.
ADAPTIVE: tuple[type[dxode.AbstractStepper], ...] = (dxode.BS3, dxode.DP5, dxode.Tsit5, dxode.Vern7)
#: Every explicit Runge–Kutta method, by order.
EXPLICIT = FIXED_STEP + ADAPTIVE
#: The stiff methods (Rosenbrock and TRBDF2), by order within each family.
STIFF: tuple[type[dxode.AbstractStepper], ...] = (
    dxode.Rosenbrock23,
    dxode.Rodas4,
    dxode.Rodas5P,
    dxode.TRBDF2,
)
#: Every method dxode offers.
METHODS = EXPLICIT + STIFF


def method_id(method: Any) -> str:
    """A method's test ID: its class name, for a class or an instance."""
    return method.__name__ if isinstance(method, type) else type(method).__name__


# ---- backends and dtypes ------------------------------------------------------------------

ALL_BACKENDS = ("numpy", "array_api_strict", "cupy")
#: The backends this run covers (``DXODE_TEST_BACKENDS`` narrows them).
BACKENDS = tuple(
    name
    for name in os.environ.get("DXODE_TEST_BACKENDS", ",".join(ALL_BACKENDS)).split(",")
    if name
)
DTYPES = ("float64", "float32")


def namespace(backend: str) -> ModuleType:
    """The array namespace of ``backend``; skips the test (with the reason) without a GPU."""
    if backend == "numpy":
        return np
    if backend == "array_api_strict":
        return pytest.importorskip(
            "array_api_strict", reason="array-api-strict is not installed (extra 'test')"
        )
    if backend == "cupy":
        if not cupy_available():
            pytest.skip("CuPy with a CUDA GPU is not available on this machine")
        import array_api_compat.cupy

        return array_api_compat.cupy
    raise ValueError(f"unknown backend {backend!r}; choose one of {ALL_BACKENDS}")


def real_gpu_marks() -> list[pytest.MarkDecorator]:
    """The marks of a module that needs CuPy on a real CUDA GPU: ``gpu``, and skipped without
    one or under numba-cuda's simulator (which runs NumPy arrays on the CPU)."""
    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(simulated, reason="needs a real GPU, not numba-cuda's simulator"),
        pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a CUDA GPU"),
    ]


def backend_marks(backend: str) -> list[pytest.MarkDecorator]:
    """The marks a backend's cases carry (``gpu`` for CuPy)."""
    return [pytest.mark.gpu] if backend == "cupy" else []


def backend_params(backends: Iterable[str] = BACKENDS) -> list[Any]:
    """One ``pytest.param`` per backend, marked as :func:`backend_marks` says."""
    return [pytest.param(name, marks=backend_marks(name), id=name) for name in backends]


def matrix(
    methods: Sequence[Any],
    backends: Iterable[str] = BACKENDS,
    dtypes: Iterable[str] = DTYPES,
) -> list[Any]:
    """The ``(backend, dtype_name, method)`` cases, IDs ``backend-dtype-Method``.

    Use with ``@pytest.mark.parametrize(("backend", "dtype_name", "alg"), matrix(ADAPTIVE))``
    and turn ``backend`` into its namespace with :func:`namespace` in the test.
    """
    return [
        pytest.param(
            backend,
            dtype,
            method,
            marks=backend_marks(backend),
            id=f"{backend}-{dtype}-{method_id(method)}",
        )
        for backend in backends
        for dtype in dtypes
        for method in methods
    ]
