"""The timing helper the comparison scripts share: the best wall time of repeated calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["best_of"]


def best_of(fn: Callable[[], Any], repeats: int, warm_up: bool = False) -> tuple[float, Any]:
    """The fastest wall time (s) of ``repeats`` calls of ``fn()`` and the last call's result;
    with ``warm_up`` one untimed call first (compilation, caches)."""
    if warm_up:
        fn()
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result
