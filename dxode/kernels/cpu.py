"""Run a batch on the CPU: blocks of lanes (SIMD across trajectories) spread over threads."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .batch import DEFAULT_BLOCK, KernelBatch, KernelResult
from .vectorize import needs_compile, vectorized_compiles

__all__ = ["run_cpu"]


def _thread_count(threads: int | None) -> int:
    """``threads``, or numba's thread count (``NUMBA_NUM_THREADS``, or what
    ``numba.set_num_threads`` set); raises, before anything is compiled, if ``threads``
    exceeds ``NUMBA_NUM_THREADS`` (the limit the kernels keep to, named with its fix)."""
    import numba

    if threads is None:
        return numba.get_num_threads()
    most = numba.config.NUMBA_NUM_THREADS
    if threads > most:
        raise ValueError(
            f"EnsembleKernel(threads={threads}) asks for more threads than numba has here: "
            f"NUMBA_NUM_THREADS={most} (by default the CPU count); give threads <= {most} or "
            f"None, or set NUMBA_NUM_THREADS before numba is imported"
        )
    return threads


def _spread(driver: Any, blocks: int, threads: int, *arrays: Any) -> None:
    """Run ``driver`` (``run_blocks``, which releases the GIL) over ``blocks`` blocks in
    ``threads`` contiguous ranges of (nearly) equal size, the first on this thread: a
    static schedule like that of numba's ``prange``, whose parallel region took numba
    seconds to compile."""
    bounds = [blocks * i // threads for i in range(threads + 1)]
    if threads == 1:
        driver(0, blocks, *arrays)
        return
    with ThreadPoolExecutor(threads - 1) as pool:
        # map submits every range at once; reading its results re-raises a range's error
        others = pool.map(lambda i: driver(bounds[i], bounds[i + 1], *arrays), range(1, threads))
        driver(bounds[0], bounds[1], *arrays)
        for _ in others:
            pass


def run_cpu(
    batch: KernelBatch, block: int = DEFAULT_BLOCK, threads: int | None = None, record: bool = False
) -> KernelResult:
    """Integrate every lane of ``batch``; lanes in blocks of ``block``.

    Each lane's arithmetic is its own (no fastmath, no reductions across lanes), so results
    are bitwise the same for every block size and thread count. ``record`` (one lane only)
    also returns every accepted step.
    """
    threads = _thread_count(threads)
    if record:
        block = 1
    kernel = batch.prepare("cpu", block, record)
    args = batch.arguments()
    outs = batch.outputs()
    events = batch.event_arrays()
    steps = None
    one_block = record or batch.n_lanes <= block  # one block: no driver
    function = kernel.block if one_block else kernel.driver
    # (a block of one lane, as recording runs, has no lane loop to vectorize)
    vectorize = block > 1 and needs_compile(function)
    compiling = vectorized_compiles() if vectorize else contextlib.nullcontext()
    with compiling:
        if one_block:
            out = kernel.call(function, 0, batch.n_lanes, *args, *outs, *events)
        else:
            blocks = -(-batch.n_lanes // block)
            kernel.call(_spread, function, blocks, min(threads, blocks), *args, *outs, *events)
    if record:
        t_rec, u_rec, count = out
        steps = (t_rec[:count].copy(), u_rec[:count].copy())
    return KernelResult.from_outputs(
        outs, steps, events[2:] or None, batch.screen_steps is not None
    )
