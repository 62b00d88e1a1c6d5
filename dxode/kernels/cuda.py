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

    Inputs are copied to the device once; outputs come back as host NumPy arrays, or stay on
    the device as CuPy arrays with ``as_cupy``.
    """
    from numba import cuda

    kernel = batch.prepare("cuda", 1)
    args = [cuda.to_device(a) for a in batch.arguments()]
    outs = [cuda.to_device(a) for a in batch.outputs()]
    events = [cuda.to_device(a) for a in batch.event_arrays()]
    lanes = batch.n_lanes
    grid = (lanes + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    kernel.call(kernel.driver[grid, THREADS_PER_BLOCK], *args, *outs, *events)
    cuda.synchronize()
    log = tuple(a.copy_to_host() for a in events[2:]) or None  # host: read to build records
    return KernelResult.from_outputs([_result_array(a, as_cupy) for a in outs], None, log)


def _result_array(array: Any, as_cupy: bool) -> Any:
    if as_cupy:
        import cupy

        return cupy.asarray(array)
    return array.copy_to_host()
