"""Errors of the kernel path, each naming what to use instead."""

from __future__ import annotations

__all__ = ["ARRAY_PATH", "KernelCompileError", "KernelUnsupportedError"]

ARRAY_PATH = "the array path (solve(..., kernel=False), or ensemble_alg=EnsembleArray())"


class KernelUnsupportedError(NotImplementedError):
    """An option or method the compiled kernels do not support (yet)."""


class KernelCompileError(TypeError):
    """The user's ``f`` cannot be compiled by numba."""
