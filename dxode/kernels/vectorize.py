"""Compile the CPU kernels so that the process that compiles them runs vectorized code.

numba optimizes each compiled function's LLVM module in two rounds: a "cheap" round (at
``-O0`` with the loop vectorizer off, unless ``NUMBA_OPT=max``) then the full ``-O3``
round. A kernel's ``attempt`` is compiled on its own and linked into ``block`` and
``run_blocks``, whose modules go through both rounds again, so the copies numba writes to
its on-disk cache have been optimized twice, and there the lane loop of
a large ``attempt`` (the 12 components ``[u, S]`` of forward sensitivities, say) vectorizes.
The process that compiled the kernel runs the copies optimized once (the first definition of
a symbol wins when numba's JIT links the driver), whose lane loop stayed scalar: on the
1,000-trajectory Lorenz gradient (``asv_bench/gradient_cost.py``) 41 ms a run against
11 ms in every later process that loaded the kernel from the cache.

``vectorized_compiles`` runs numba's cheap round at ``-O3`` with the loop vectorizer
(what ``NUMBA_OPT=max`` does for a whole process) while a kernel compiles; it changes no
arithmetic (no fastmath, no reductions across lanes: the vectorized and scalar loops give
the same bits, as the cached kernels always did), and costs about 10 % more compile time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["needs_compile", "vectorized_compiles"]

_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: tuple[Any, Any] | None = None


def _codegen() -> Any:
    """numba's CPU code generator, if it has the two settings this module changes (private
    numba attributes: where a numba release renames them, compiles run as numba's default)."""
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    if hasattr(codegen, "_loopvect") and hasattr(codegen, "_opt_level"):
        return codegen
    return None


def needs_compile(function: Any) -> bool:
    """Whether calling the numba CPU dispatcher ``function`` may compile (it holds no compiled
    or cache-loaded signature yet); ``False`` for anything else (a CUDA launch)."""
    overloads = getattr(function, "overloads", None)
    return overloads is not None and len(overloads) == 0


@contextlib.contextmanager
def vectorized_compiles() -> Iterator[None]:
    """While inside, numba's cheap optimization round runs at ``-O3`` with the loop
    vectorizer (re-entrant and thread-safe: the settings return when the last user leaves)."""
    global _DEPTH, _SAVED
    with _LOCK:
        codegen = _codegen()
        if codegen is not None:
            if _DEPTH == 0:
                _SAVED = (codegen._loopvect, codegen._opt_level)
                codegen._loopvect, codegen._opt_level = True, 3
            _DEPTH += 1
    try:
        yield
    finally:
        if codegen is not None:
            with _LOCK:
                _DEPTH -= 1
                if _DEPTH == 0 and _SAVED is not None:
                    codegen._loopvect, codegen._opt_level = _SAVED
                    _SAVED = None
