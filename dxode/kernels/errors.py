"""Errors of the kernel path, each naming what to use instead."""

from __future__ import annotations

from typing import Any

__all__ = ["ARRAY_PATH", "KernelCompileError", "KernelUnsupportedError", "numba_refusals"]

ARRAY_PATH = "the array path (solve(..., kernel=False), or ensemble_alg=EnsembleArray())"


class KernelUnsupportedError(NotImplementedError):
    """An option or method the compiled kernels do not support (yet)."""


class KernelCompileError(TypeError):
    """The user's ``f`` cannot be compiled by numba."""


def numba_refusals() -> tuple[Any, ...]:
    """The exceptions numba raises for user code it cannot compile: its ``NumbaError``
    family and ``UnsupportedBytecodeError`` (``a, *rest = p``), which is not one of them."""
    from numba.core import errors

    return (errors.NumbaError, errors.UnsupportedBytecodeError)
