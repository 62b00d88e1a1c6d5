"""The kernel discrete adjoint's forward pass: every lane's accepted steps, recorded.

On the CPU each lane runs alone through the recording kernel (its buffers grow as it goes).
On CUDA the recording kernel runs every lane at once, one thread per lane, each writing its
steps into a preallocated buffer of ``RECORD_CAPACITY`` steps (fewer where ``maxiters``
allows no more); a lane that took more steps counts them without writing, and those lanes
run again alone with buffers as long as the longest of them. A lane's steps are its own
(never its batch's), so the rerun takes the very steps the first run counted; the saved
states and statistics of the first run are complete either way. Nothing is truncated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch import KernelBatch, KernelResult

__all__ = ["RECORD_CAPACITY", "recorded_lanes"]

# Steps each lane's buffer holds on the first CUDA run (a few hundred bytes per component).
RECORD_CAPACITY = 128


def recorded_lanes(
    batch: KernelBatch, device: str
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, dict[str, np.ndarray]]:
    """Integrate every lane with the recording kernel on ``device``: each lane's
    ``(times, states)`` of its accepted steps (the start included), the saved states
    ``(L, nsave, n)`` and the statistics (host arrays)."""
    if device == "cuda":
        return _cuda_lanes(batch)
    return _cpu_lanes(batch)


def _cpu_lanes(
    batch: KernelBatch,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, dict[str, np.ndarray]]:
    """Every lane alone through the CPU recording kernel."""
    kernel = batch.prepare("cpu", 1, record=True)
    args = batch.arguments()
    outs = batch.outputs()
    steps = []
    for g in range(batch.n_lanes):
        t_rec, u_rec, count = kernel.call(kernel.block, g, batch.n_lanes, *args, *outs)
        steps.append((t_rec[:count].copy(), u_rec[:count].copy()))
    result = KernelResult.from_outputs(outs, None, None)
    return steps, np.ascontiguousarray(outs[0]), _outcome(result)


def _cuda_lanes(
    batch: KernelBatch,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, dict[str, np.ndarray]]:
    """Every lane at once through the CUDA recording kernel; lanes whose steps overflowed
    their buffers again, alone, with room for all of them."""
    from .cuda import run_cuda

    capacity = min(RECORD_CAPACITY, int(batch.options.maxiters) + 1)
    result = run_cuda(batch, record_capacity=capacity)
    assert result.steps is not None
    times, states, counts = result.steps
    steps = [(times[g, :c].copy(), states[g, :c].copy()) for g, c in enumerate(counts)]
    over = np.flatnonzero(counts > capacity)
    if over.size:
        longest = int(counts[over].max())
        again = run_cuda(batch.select(over, batch.event_capacity), record_capacity=longest)
        assert again.steps is not None
        times, states, recounted = again.steps
        if not np.array_equal(recounted, counts[over]):
            raise RuntimeError(
                "a lane rerun to record its steps took other steps than the first time "
                f"(counts {counts[over]} then {recounted}): please report this as a bug"
            )
        for k, g in enumerate(over):
            steps[g] = (times[k, : counts[g]].copy(), states[k, : counts[g]].copy())
    return steps, np.ascontiguousarray(result.saved), _outcome(result)


def _outcome(result: KernelResult) -> dict[str, Any]:
    return {
        "retcode": np.asarray(result.retcode, dtype=np.int64),
        "nf": np.asarray(result.nf, dtype=np.int64),
        "naccept": np.asarray(result.naccept, dtype=np.int64),
        "nreject": np.asarray(result.nreject, dtype=np.int64),
    }
