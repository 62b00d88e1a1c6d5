"""Run a batch on a CUDA GPU: one thread per trajectory (numba-cuda).

The generated ``block`` is the CPU's, compiled as a device function with one-lane blocks and
block-local arrays in thread-local memory. Under numba-cuda's simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before ``numba.cuda`` is imported) the same code runs on the
CPU, which is how the tests check it without a GPU.
"""

from __future__ import annotations

from typing import Any

from .batch import KernelBatch, KernelResult

__all__ = ["run_cuda"]

THREADS_PER_BLOCK = 128


def run_cuda(batch: KernelBatch, as_cupy: bool = False) -> KernelResult:
    """Integrate every lane of ``batch`` on the GPU, one thread per lane.

    Inputs are copied to the device once; outputs come back as host NumPy arrays, except that
    with ``as_cupy`` the saved states stay on the device as a CuPy array (the per-lane return
    codes and statistics always come to the host, where the ensemble's bookkeeping reads them).
    """
    cuda = require_gpu()
    kernel = batch.prepare("cuda", 1)
    args = [cuda.to_device(a) for a in batch.arguments()]
    outs = [cuda.to_device(a) for a in batch.outputs()]
    events = [cuda.to_device(a) for a in batch.event_arrays()]
    lanes = batch.n_lanes
    grid = (lanes + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    kernel.call(kernel.driver[grid, THREADS_PER_BLOCK], *args, *outs, *events)
    cuda.synchronize()
    log = tuple(a.copy_to_host() for a in events[2:]) or None  # host: read to build records
    saved, *per_lane = outs
    host = [_result_array(saved, as_cupy)] + [a.copy_to_host() for a in per_lane]
    return KernelResult.from_outputs(host, None, log)


def require_gpu() -> Any:
    """``numba.cuda``, once it has found a CUDA GPU (or runs as the simulator), else a
    ``ValueError`` naming ``device="cpu"`` and the simulator."""
    fix = (
        'use EnsembleKernel(device="cpu"), or set NUMBA_ENABLE_CUDASIM=1 before numba.cuda is '
        "imported to run the CUDA code on numba-cuda's simulator (slow; for tests)"
    )
    try:
        from numba import cuda
    except ImportError as exc:
        raise ValueError(
            f'device="cuda" needs numba-cuda (pip install numba-cuda), which failed to import '
            f"({exc}); {fix}"
        ) from exc
    if not cuda.is_available():
        raise ValueError(f'device="cuda" but numba.cuda found no usable CUDA GPU or driver; {fix}')
    return cuda


def _result_array(array: Any, as_cupy: bool) -> Any:
    if as_cupy:
        import cupy

        return cupy.asarray(array)
    return array.copy_to_host()
