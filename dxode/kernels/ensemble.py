"""``EnsembleKernel``: ensembles solved by compiled whole-trajectory kernels."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._validation import positive_int
from ..ensemble.algorithms import AbstractEnsembleAlgorithm
from ..ensemble.batch import BatchResult, BatchSpec
from ..ensemble.problem import EnsembleProblem
from .errors import ARRAY_PATH, KernelUnsupportedError

__all__ = ["EnsembleKernel"]

_DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class EnsembleKernel(AbstractEnsembleAlgorithm):
    """Each trajectory integrated by a compiled kernel (numba), from the unchanged ``f``.

    The method's tableau, the step-size control, the return codes and statistics are the
    array path's (``EnsembleArray``), lane by lane; ``f`` is compiled once per method and
    option signature and reused (see the kernels guide for what ``f`` may contain).
    Differentiable with autograd (forward sensitivities compiled with the kernel, or for many
    parameters its discrete adjoint; the derivatives of ``f`` by complex step or from its
    ``jac`` and ``paramjac``).

    Parameters
    ----------
    device : {"cpu", "cuda"}
        ``"cpu"``: lanes in blocks of ``block_size`` computed together with SIMD, blocks spread
        over ``threads`` threads. ``"cuda"``: one GPU thread per trajectory (numba-cuda;
        CuPy arrays in and out when the problem's arrays are CuPy arrays).
    block_size : int
        Lanes per SIMD block on the CPU (results do not depend on it).
    threads : int, optional
        CPU threads (default: numba's, ``NUMBA_NUM_THREADS``).
    """

    device: str = "cpu"
    block_size: int = 32
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.device not in _DEVICES:
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        # As Python ints (NumPy integers are taken too).
        object.__setattr__(self, "block_size", positive_int("block_size", self.block_size))
        threads = positive_int("threads", self.threads, allow_none=True)
        object.__setattr__(self, "threads", threads)

    @property
    def default_batch_size(self) -> int:  # type: ignore[override]
        return 1_000_000 if self.device == "cuda" else 100_000

    def gradient_sensealg(self, sensealg: Any) -> Any:
        """Forward sensitivities compiled with the kernel or its discrete adjoint (see
        ``kernels.gradients``)."""
        from .gradients import kernel_sensealg

        return kernel_sensealg(
            sensealg, device=self.device, block_size=self.block_size, threads=self.threads
        )

    def run_batch(
        self,
        eprob: EnsembleProblem,
        indices: np.ndarray | range,
        spec: BatchSpec,
        repeat: np.ndarray,
    ) -> BatchResult:
        from .ensemble_batch import solve_kernel_batch

        if spec.dense:
            raise KernelUnsupportedError(
                f"the compiled kernels keep no dense output; use saveat=..., or {ARRAY_PATH} "
                f"for dense=True"
            )
        return solve_kernel_batch(self, eprob, indices, spec, repeat)

    def describe_device(self) -> str:
        """``"cpu"`` or ``"cuda"`` (for messages)."""
        return self.device

    def options(self) -> dict[str, Any]:
        """The run options the device modules take."""
        return {"block": self.block_size, "threads": self.threads}
