"""Gradients through the compiled kernels: forward sensitivities integrated by the kernel
(and the choice between them and the discrete adjoint of ``adjoint``).

``KernelForwardSensitivity`` is the sensitivity algorithm of ``solve(..., kernel=True)`` and
``EnsembleKernel`` when autograd differentiates them. Its forward pass integrates each
batch's augmented state ``[u, S_1, ..., S_D]`` (``sensitivity_rhs``) with the compiled
kernel; the derivatives of ``f`` are computed inside the compiled code (complex step, or the
problem's ``jac`` and ``paramjac``), never by autograd. The backward pass is
``ForwardSensitivity``'s: the saved ``S`` contracted with the cotangent of the saved states.

The error norm and the initial step see the state only (CVODES's ``errconS = false``): the
steps are those of the same solve without gradients, so ``sol.u`` is bitwise the undifferentiated
kernel solve's. A Runge–Kutta method applied to ``[u, S]`` on fixed steps computes exactly the
derivative of its own ``u`` (and the dense output is linear in the stages), so ``S`` is the
derivative of the computed solution with the step sizes held fixed, as ``DiscreteAdjoint``'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from .. import _pytree
from ..sensitivity.algorithms import DiscreteAdjoint, ForwardSensitivity
from .batch import KernelBatch, lane_params
from .compiler import dtype_name, user_function_mode
from .ensemble_batch import MAX_COMPONENTS, check_state
from .errors import ARRAY_PATH, CUDA_GRADIENT_U, KernelUnsupportedError
from .rhs_source import function_key

__all__ = ["ADJOINT_ABOVE", "MAX_FORWARD_COMPONENTS", "KernelForwardSensitivity", "kernel_sensealg"]

# Forward sensitivities integrate n (1 + inputs) components: at most a kernel's state.
MAX_FORWARD_COMPONENTS = MAX_COMPONENTS
# The default (``sensealg=None``) differentiates with forward sensitivities up to this many
# differentiated inputs per trajectory (u0 components and parameter elements) and
# ``MAX_FORWARD_COMPONENTS``, above either with the discrete adjoint (``adjoint``), on the CPU
# and on CUDA, through explicit methods (measured on the CPU in
# ``asv_bench/kernel_gradient_scaling.py``; see the gradients guide).
ADJOINT_ABOVE = 8


@dataclasses.dataclass(frozen=True)
class KernelForwardSensitivity(ForwardSensitivity):
    """Forward sensitivities integrated by the compiled kernel on ``device``."""

    device: str = "cpu"
    block_size: int = 32
    threads: int | None = None
    # Hand batches with more differentiated inputs than this to the discrete adjoint
    # (``None``: never; the default sensealg sets ``ADJOINT_ABOVE``).
    adjoint_above: int | None = None

    compiled: ClassVar[bool] = True  # its forward pass takes lanes, not array-path batches

    def steps_onto_save_times(self, options: Any) -> bool:
        return False  # saves come from the dense output, as without gradients

    def forward_lanes(
        self,
        static: Any,
        u0: np.ndarray,
        leaves: list[Any],
        t0: np.ndarray,
        t1: np.ndarray,
        save_grid: np.ndarray,
        stops: np.ndarray | None,
    ) -> Any:
        """One batch's forward pass: states ``u0`` ``(n, L)``, the batch's parameter leaves,
        spans ``(L,)``, save times ``(nsave, L)``; a ``BatchForward``."""
        from ..sensitivity.forward_sensitivity import directions
        from ..sensitivity.passes import BatchForward

        u0 = np.asarray(u0)
        check_state(u0[..., 0])
        n, lanes = u0.shape
        p = _pytree.rebuild(static.p_template, leaves)
        layout, params = lane_params(p, static.lane_leaf, lanes, u0.dtype)
        dirs = directions(static, leaves, n)
        if self._adjoint_instead(static, n, len(dirs)):
            from .adjoint import KernelDiscreteAdjoint

            adjoint = KernelDiscreteAdjoint(device=self.device)
            return adjoint.forward_lanes(static, u0, leaves, t0, t1, save_grid, stops)
        offsets = np.cumsum([0, *layout.leaf_rows])
        rows = [None if pos is None else int(offsets[pos]) + j for pos, j in dirs]
        f_aug = _augmented(static, layout, params, n, rows, dtype_name(u0.dtype), self.device)
        z0 = np.zeros((n * (1 + len(dirs)), lanes), dtype=u0.dtype)
        z0[:n] = u0
        for d, (pos, j) in enumerate(dirs):
            if pos is None:
                z0[n * (1 + d) + j] = 1.0
        batch = KernelBatch(f_aug, z0, params, layout, t0, t1, save_grid, stops, static.options, n)
        result = self._run(batch)
        steps = result.naccept  # the plain solve's: the sensitivities are outside the norm
        if self._stability_limited(
            static, leaves, u0, params, layout, t0, t1, save_grid, stops, steps
        ):
            # frozen steps beyond the stability interval: their derivative is not the
            # gradient; with the sensitivities in the error norm (as the array path's
            # ForwardSensitivity) they are accurate to the tolerance
            result = self._run(_sensitivities_controlled(batch, n, len(dirs)))
        saved = np.asarray(result.saved)  # (L, nsave, n (1 + D))
        sens = saved[..., n:].reshape(lanes, saved.shape[1], len(dirs), n)
        record = (sens, dirs, [np.shape(leaf) for leaf in leaves])
        outcome = {
            "retcode": np.asarray(result.retcode, dtype=np.int64),
            "nf": np.asarray(result.nf, dtype=np.int64),
            "naccept": np.asarray(result.naccept, dtype=np.int64),
            "nreject": np.asarray(result.nreject, dtype=np.int64),
        }
        return BatchForward(np.ascontiguousarray(saved[..., :n]), record, outcome, self)

    def _stability_limited(
        self,
        static: Any,
        leaves: list[Any],
        u0: np.ndarray,
        params: Any,
        layout: Any,
        t0: np.ndarray,
        t1: np.ndarray,
        save_grid: np.ndarray,
        stops: np.ndarray | None,
        naccept: np.ndarray,
    ) -> bool:
        """Whether an explicit method's adaptive steps of this batch went beyond its stability
        interval (``stability_check``; the plain kernel takes the same steps: first its
        screen, then, for a batch the screen does not clear, its recorded steps)."""
        from .adjoint_record import recorded_lanes
        from .stability_check import (
            CheckedBatch,
            limited_lanes,
            may_be_limited,
            probe_steps,
            screen_clears,
        )

        if not may_be_limited(static.options):
            return False
        screen = KernelBatch(
            static.f,
            u0,
            params,
            layout,
            t0,
            t1,
            None,
            stops,
            static.options,
            screen_steps=probe_steps(naccept),
        )
        checked = CheckedBatch(static, leaves, u0, t0, t1, save_grid, stops)
        if screen_clears(checked, self._run(screen)):
            return False
        plain = KernelBatch(
            static.f, u0, params, layout, t0, t1, save_grid, stops, static.options, jac=None
        )
        steps, _, outcome = recorded_lanes(plain, self.device)
        return limited_lanes(checked, steps, outcome) is not None

    def event_lanes(
        self, static: Any, callbacks: Any, u0: Any, leaves: list[Any], t0: Any, t1: Any
    ) -> tuple[np.ndarray, ...] | None:
        """The event pass by the plain kernel with the callbacks, on this device (on CUDA the
        array path's pass found events where the array path's steps ended, not the CUDA
        kernel's). A method the kernels run no callbacks with raises, as without gradients
        (the kernel batch refuses it)."""
        from .event_pass import kernel_event_log

        run = {"block": self.block_size, "threads": self.threads} if self.device == "cpu" else {}
        return kernel_event_log(static, callbacks, u0, leaves, t0, t1, self.device, **run)

    def _adjoint_instead(self, static: Any, n: int, inputs: int) -> bool:
        """Whether the default hands this batch to the discrete adjoint: more than
        ``adjoint_above`` differentiated inputs or ``MAX_FORWARD_COMPONENTS``, through an
        explicit method (on either device). Otherwise too many components raise, naming the
        fix."""
        from .description import StepperDescription, describe

        components = n * (1 + inputs)
        many = components > MAX_FORWARD_COMPONENTS
        above = self.adjoint_above
        # (describe, a few hundred floats from the tableau, only when the answer turns on it)
        wanted = above is not None and (many or inputs > above)
        if wanted and isinstance(describe(static.options.alg), StepperDescription):
            return True
        if many:
            raise KernelUnsupportedError(
                f"forward sensitivities of {inputs} inputs integrate n (1 + {inputs}) = "
                f"{components} components, the compiled kernels at most "
                f"{MAX_FORWARD_COMPONENTS}; differentiate with sensealg=DiscreteAdjoint() "
                f"(or None; explicit methods), or use {ARRAY_PATH}"
            )
        return False

    def _run(self, batch: KernelBatch) -> Any:
        if self.device == "cuda":
            from .cuda import run_cuda

            return run_cuda(batch)
        from .cpu import run_cpu

        return run_cpu(batch, block=self.block_size, threads=self.threads)


# ``_augmented``'s answers: the probe of ``f``, the generated source and its digest cost
# about 0.5 ms a batch, a twentieth of the 1,000-trajectory Lorenz gradient.
_AUGMENTED: dict[tuple[Any, ...], Any] = {}


def _augmented(
    static: Any,
    layout: Any,
    params: np.ndarray,
    n: int,
    rows: list[int | None],
    dtype: str,
    target: str,
) -> Any:
    """The augmented RHS for the batch (``f`` checked for complex step first), remembered
    by everything that decides it (``f``, ``jac`` and ``paramjac`` by ``function_key``:
    their source and the values they read)."""
    keys = tuple(None if fn is None else function_key(fn) for fn in (static.jac, static.paramjac))
    key = (function_key(static.f), *keys, n, layout, tuple(rows), dtype, params.dtype.str, target)
    f_aug = _AUGMENTED.get(key)
    if f_aug is None:
        f_aug = _AUGMENTED[key] = _build_augmented(static, layout, params, n, rows, dtype, target)
    return f_aug


def _build_augmented(
    static: Any,
    layout: Any,
    params: np.ndarray,
    n: int,
    rows: list[int | None],
    dtype: str,
    target: str,
) -> Any:
    from .sensitivity_rhs import augmented_rhs, check_jacobian_rows

    example = eval(layout.expression("COL").replace("COL", "0"), {"P": params[:, :1]})
    as_array = user_function_mode(static.f, n, dtype, example, target)
    if as_array and target == "cuda":
        raise KernelUnsupportedError(CUDA_GRADIENT_U)
    check_jacobian_rows(static, n, as_array, example, params.shape[0])
    return augmented_rhs(
        static.f, n, layout, rows, as_array, dtype, example, static.jac, static.paramjac, target
    )


def _sensitivities_controlled(batch: KernelBatch, n: int, inputs: int) -> KernelBatch:
    """``batch`` (state and ``inputs`` sensitivities of ``n`` components each) with the
    sensitivities in the error norm, each under its state component's ``atol``."""
    from ..sensitivity.forward_sensitivity import augmented_atol

    options = augmented_atol(batch.options, (n,), inputs)
    return dataclasses.replace(batch, options=options, error_components=0)


def kernel_sensealg(sensealg: Any, **device: Any) -> Any:
    """The kernel's sensitivity algorithm for the user's ``sensealg``: ``None`` (forward
    sensitivities up to ``ADJOINT_ABOVE`` differentiated inputs, the discrete adjoint above),
    ``ForwardSensitivity()`` or ``DiscreteAdjoint()`` (explicit methods; CPU or CUDA)."""
    if sensealg is None:
        return KernelForwardSensitivity(adjoint_above=ADJOINT_ABOVE, **device)
    if type(sensealg) is ForwardSensitivity:
        return KernelForwardSensitivity(**device)
    if type(sensealg) is DiscreteAdjoint:
        if sensealg.checkpoint_every is not None:
            raise KernelUnsupportedError(
                "the kernel discrete adjoint keeps every accepted step (no checkpoints): use "
                f"DiscreteAdjoint() without checkpoint_every, or {ARRAY_PATH}"
            )
        from .adjoint import KernelDiscreteAdjoint

        return KernelDiscreteAdjoint(device=device.get("device", "cpu"))
    raise KernelUnsupportedError(
        f"the compiled kernels differentiate with forward sensitivities or the discrete "
        f"adjoint (sensealg=None, ForwardSensitivity() or DiscreteAdjoint()), not "
        f"{sensealg!r}; use {ARRAY_PATH} for the others"
    )
