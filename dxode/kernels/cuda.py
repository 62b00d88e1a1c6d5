"""Run a batch on a CUDA GPU: one thread per trajectory (numba-cuda).

The generated ``block`` is the CPU's, compiled as a device function with one-lane blocks and
block-local arrays in thread-local memory. Under numba-cuda's simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before ``numba.cuda`` is imported) the same code runs on the
CPU, which is how the tests check it without a GPU.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from array_api_compat import is_cupy_array

from .batch import WRITTEN_IN_FULL, KernelBatch, KernelResult

__all__ = ["launch", "run_cuda"]

THREADS_PER_BLOCK = 128


def run_cuda(
    batch: KernelBatch, as_cupy: bool = False, record_capacity: int | None = None
) -> KernelResult:
    """Integrate every lane of ``batch`` on the GPU, one thread per lane.

    Host inputs are copied to the device once (a batch built on the GPU, whose states and
    parameters are CuPy arrays, is read where it is); outputs come back as host NumPy arrays,
    except that with ``as_cupy`` the saved states stay on the device as a CuPy array (the
    per-lane return codes and statistics always come to the host, where the ensemble's
    bookkeeping reads them) and that the lanes' final states and times (``KernelResult.u``,
    ``.t``) stay on the device as numba device arrays.
    With ``record_capacity`` (at least 1) the recording kernel also writes each lane's
    accepted steps into buffers of that many steps: ``steps`` is ``(times (L, capacity),
    states (L, capacity, n), counts (L,))`` on the host, where a count above the capacity
    means the lane took more steps than its buffer kept (those past it are not written).
    """
    cuda = require_gpu()
    record = record_capacity is not None
    kernel = batch.prepare("cuda", 1, record)
    args = [_on_device(cuda, a) for a in batch.arguments()]
    outs = [
        cuda.device_array(a.shape, a.dtype)
        if k in WRITTEN_IN_FULL and not is_cupy_array(a)
        else _on_device(cuda, a)
        for k, a in enumerate(batch.outputs())
    ]
    events = [cuda.to_device(a) for a in batch.event_arrays()]
    buffers = [cuda.to_device(a) for a in _record_buffers(batch, record_capacity)]
    kernel.call(launch(kernel.driver, batch.n_lanes), *args, *outs, *events, *buffers)
    cuda.synchronize()
    log = tuple(a.copy_to_host() for a in events[2:]) or None  # host: read to build records
    steps = tuple(a.copy_to_host() for a in buffers) or None
    # the lanes' final states and times stay on the device (nothing reads them on the host)
    saved, u_end, t_end, *per_lane = outs
    host = [_result_array(saved, as_cupy), u_end, t_end] + [_host(a) for a in per_lane]
    return KernelResult.from_outputs(host, steps, log, batch.screen_steps is not None)


def launch(kernel: Any, lanes: int) -> Any:
    """``kernel`` configured for one thread per lane, in blocks of ``THREADS_PER_BLOCK``.

    numba-cuda warns (``NumbaPerformanceWarning``) at every launch of fewer than 128 blocks,
    i.e. below 16,384 lanes here; a small ensemble is the user's problem size, not a mistake
    they can fix, so that warning is not passed on.
    """
    grid = max(1, (lanes + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(\x1b\[\d+m)*Grid size \d+ will likely")
        return kernel[grid, THREADS_PER_BLOCK]


def _record_buffers(batch: KernelBatch, capacity: int | None) -> tuple[np.ndarray, ...]:
    """``TRECS, URECS, NRECS`` of a recording kernel (``()`` without ``capacity``)."""
    if capacity is None:
        return ()
    if capacity < 1:
        raise ValueError(f"record_capacity must be at least 1 (the start), got {capacity}")
    n, lanes = batch.u0.shape
    return (
        np.empty((lanes, capacity), dtype=batch.dtype),
        np.empty((lanes, capacity, n), dtype=batch.dtype),
        np.zeros(lanes, dtype=np.int64),
    )


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
    try:  # loaded at the first compile otherwise, where its failure reads as a numba bug
        from numba.cuda.np import arrayobj  # noqa: F401
    except ImportError:  # the simulator has no such module
        pass
    except AttributeError as exc:  # seen: numba-cuda 0.30 with NumPy 2.5 (no np.row_stack)
        raise ValueError(
            f'device="cuda": numba-cuda cannot load with NumPy {np.__version__} ({exc}); install '
            f'a NumPy that numba-cuda supports (pip install "numpy<2.5"), or {fix}'
        ) from exc
    return cuda


def _on_device(cuda: Any, array: Any) -> Any:
    """``array`` on the GPU: a CuPy array as it is (numba-cuda takes it without a copy), a
    host array copied there."""
    return array if is_cupy_array(array) else cuda.to_device(array)


def _host(array: Any) -> np.ndarray:
    """A host copy of the device ``array``, through page-locked memory from CuPy's pool where
    CuPy is there: a copy into fresh pageable memory ran at 2.7 GB/s on an H200 (page faults
    and the driver's staging): 0.1 s for the return codes and counts of 8.4 million lanes."""
    try:
        import cupyx
    except ImportError:
        return array.get() if is_cupy_array(array) else array.copy_to_host()
    out = cupyx.empty_pinned(array.shape, array.dtype)
    if is_cupy_array(array):
        array.get(out=out)
    else:
        array.copy_to_host(out)
    return out


def _result_array(array: Any, as_cupy: bool) -> Any:
    if is_cupy_array(array) or not as_cupy:
        return array if is_cupy_array(array) else array.copy_to_host()
    import cupy

    return cupy.asarray(array)
