"""Errors of the kernel path, each naming what to use instead."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ARRAY_PATH",
    "CUDA_GRADIENT_U",
    "KernelCompileError",
    "KernelUnsupportedError",
    "numba_refusals",
]

ARRAY_PATH = "the array path (solve(..., kernel=False), or ensemble_alg=EnsembleArray())"
# The refusal of an f taking u as an array by gradients on CUDA (both sensitivity kinds).
CUDA_GRADIENT_U = (
    "gradients on CUDA take an f that reads u as a tuple of numbers (x, y = u), not as an "
    f"array; rewrite f, or use device='cpu' or {ARRAY_PATH}"
)


class KernelUnsupportedError(NotImplementedError):
    """An option or method the compiled kernels do not support (yet)."""


class KernelCompileError(TypeError):
    """The user's ``f`` cannot be compiled by numba."""


def numba_refusals() -> tuple[Any, ...]:
    """The exceptions numba raises for user code it cannot compile: its ``NumbaError``
    family and ``UnsupportedBytecodeError`` (``a, *rest = p``), which is not one of them."""
    from numba.core import errors

    return (errors.NumbaError, errors.UnsupportedBytecodeError)
