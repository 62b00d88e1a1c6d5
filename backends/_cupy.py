"""The CuPy backend: one NVIDIA GPU. CuPy is imported only when this backend is first used."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ._base import Array, Backend


@functools.cache
def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the 'cupy' backend needs CuPy: install dxode with the 'gpu' extra "
            "(pip install 'dxode[gpu]') on a machine with an NVIDIA GPU"
        ) from exc
    if not cupy.is_available():  # pragma: no cover - depends on the machine
        raise RuntimeError("the 'cupy' backend needs a CUDA GPU, and CuPy found none")
    return cupy


def cupy_available() -> bool:
    """Whether CuPy imports and sees at least one GPU (never raises)."""
    try:
        _cupy()
    except (ImportError, RuntimeError):
        return False
    return True


class CupyBackend(Backend):
    """CuPy on one GPU.

    Parameters
    ----------
    device : int, optional
        CUDA device id; ``None`` uses CuPy's current device (the one a Dask-CUDA worker is
        pinned to through ``CUDA_VISIBLE_DEVICES``).
    """

    name = "cupy"

    def __init__(self, device: int | None = None) -> None:
        self.device = device

    @property
    def xp(self) -> Any:
        _cupy()  # CuPy and a GPU, or an error saying what to install
        import array_api_compat.cupy

        return array_api_compat.cupy

    def _device(self) -> Any:
        cupy = _cupy()
        return cupy.cuda.Device(self.device) if self.device is not None else cupy.cuda.Device()

    def asarray(self, x: Any, dtype: Any = None) -> Array:
        with self._device():
            return _cupy().asarray(x, dtype=dtype)

    def to_host(self, x: Array) -> np.ndarray:
        return _cupy().asnumpy(x)

    def synchronize(self) -> None:
        _cupy().cuda.get_current_stream().synchronize()

    def scatter_rows(self, keys: Array, values: Array, n_rows: int, fill: float) -> Array:
        cupy = _cupy()
        out = cupy.full((n_rows, *values.shape[1:]), fill, dtype=values.dtype)
        out[keys] = values
        return out

    def add_to_lanes(self, target: Array, positions: Array, values: Array) -> Array:
        target[..., positions] += values
        return target
