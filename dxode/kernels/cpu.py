"""Run a batch on the CPU: blocks of lanes (SIMD across trajectories) spread over threads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .batch import DEFAULT_BLOCK, KernelBatch, KernelResult
from .vectorize import needs_compile, vectorized_compiles

__all__ = ["run_cpu"]


@contextlib.contextmanager
def _threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` numba threads (``None``: numba's default, ``NUMBA_NUM_THREADS``)."""
    if threads is None:
        yield
        return
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _check_threads(threads: int | None) -> None:
    """Raise, before anything is compiled, if ``threads`` exceeds numba's thread count (numba's
    own message names neither the argument nor the fix)."""
    if threads is None:
        return
    import numba

    most = numba.config.NUMBA_NUM_THREADS
    if threads > most:
        raise ValueError(
            f"EnsembleKernel(threads={threads}) asks for more threads than numba has here: "
            f"NUMBA_NUM_THREADS={most} (by default the CPU count); give threads <= {most} or "
            f"None, or set NUMBA_NUM_THREADS before numba is imported"
        )


def _driver(kernel: Any) -> Any:
    """The kernel's batch driver for numba's current thread count: blocks over threads, or
    on one thread one after another (the same bits either way)."""
    import numba

    return kernel.serial if numba.get_num_threads() == 1 else kernel.driver


def run_cpu(
    batch: KernelBatch, block: int = DEFAULT_BLOCK, threads: int | None = None, record: bool = False
) -> KernelResult:
    """Integrate every lane of ``batch``; lanes in blocks of ``block``.

    Each lane's arithmetic is its own (no fastmath, no reductions across lanes), so results
    are bitwise the same for every block size and thread count. ``record`` (one lane only)
    also returns every accepted step.
    """
    _check_threads(threads)
    if record:
        block = 1
    kernel = batch.prepare("cpu", block, record)
    args = batch.arguments()
    outs = batch.outputs()
    events = batch.event_arrays()
    steps = None
    one_block = record or batch.n_lanes <= block  # one block: skip the thread pool's start-up
    function = kernel.block if one_block else _driver(kernel)
    # (a block of one lane, as recording runs, has no lane loop to vectorize)
    vectorize = block > 1 and needs_compile(function)
    compiling = vectorized_compiles() if vectorize else contextlib.nullcontext()
    with _threads(threads), compiling:
        if one_block:
            out = kernel.call(function, 0, batch.n_lanes, *args, *outs, *events)
        else:
            kernel.call(function, *args, *outs, *events)
    if record:
        t_rec, u_rec, count = out
        steps = (t_rec[:count].copy(), u_rec[:count].copy())
    return KernelResult.from_outputs(outs, steps, events[2:] or None)
