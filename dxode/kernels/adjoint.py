"""A discrete adjoint for the compiled kernels: gradients for many parameters.

``KernelDiscreteAdjoint`` is the kernel path's ``DiscreteAdjoint``. Its forward pass runs the
recording kernel (``adjoint_record``: on the CPU lane by lane, on CUDA one thread per lane),
recording every accepted step's time and state (the steps and saved states are those of the
solve without gradients on the same device, bit for bit). Its backward pass, per lane,
replays the steps backward in compiled code (``adjoint_sweep``, on the same device: state
Jacobians from ``n`` complex-step JVPs, or the problem's ``jac``) and then computes the
parameter cotangent over the whole record at once, on the host (``adjoint_params``: the
problem's ``paramjac``, one autograd VJP over all stages, or complex step).

Forward sensitivities integrate ``n`` components per differentiated input; the adjoint's
cost is one backward sweep (``n`` JVPs per stage) plus the parameter pass, whatever the
number of parameters. Like ``DiscreteAdjoint`` it differentiates the computed solution with
the step sizes held fixed; step sizes are taken as ``t_{k+1} - t_k`` of the record (the
kernel's own ``h`` to rounding). CPU and CUDA; explicit Runge–Kutta methods; callbacks only
through ``EnsembleKernel``'s event segments (each segment a solve without callbacks).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from .. import _pytree
from ..sensitivity.algorithms import DiscreteAdjoint
from .adjoint_record import recorded_lanes
from .batch import KernelBatch, lane_params
from .description import StepperDescription, describe
from .ensemble_batch import check_state
from .errors import ARRAY_PATH, KernelUnsupportedError
from .stability_check import CheckedBatch, limited_lanes, may_be_limited

__all__ = ["KernelDiscreteAdjoint"]


@dataclasses.dataclass(frozen=True)
class KernelDiscreteAdjoint(DiscreteAdjoint):
    """The discrete adjoint of the compiled kernel's steps, on ``device`` (``"cpu"`` or
    ``"cuda"``; the parameter pass on the host)."""

    device: str = "cpu"

    compiled: ClassVar[bool] = True

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
        """One batch's forward pass: ``u0`` ``(n, L)``, parameter leaves, spans ``(L,)``,
        save times ``(nsave, L)``; a ``BatchForward`` whose record holds every lane's
        accepted steps."""
        from ..sensitivity.passes import BatchForward

        u0 = np.asarray(u0)
        check_state(u0[..., 0])
        if not isinstance(describe(static.options.alg), StepperDescription):
            raise KernelUnsupportedError(
                f"the kernel discrete adjoint replays explicit Runge–Kutta steps, not "
                f"{static.options.alg!r}; use sensealg=ForwardSensitivity()"
            )
        lanes = u0.shape[1]
        p = _pytree.rebuild(static.p_template, leaves)
        layout, params = lane_params(p, static.lane_leaf, lanes, u0.dtype)
        batch = KernelBatch(
            static.f, u0, params, layout, t0, t1, save_grid, stops, static.options, jac=None
        )
        steps, saved, outcome = recorded_lanes(batch, self.device)
        found = (
            limited_lanes(
                CheckedBatch(static, leaves, u0, t0, t1, save_grid, stops), steps, outcome
            )
            if may_be_limited(static.options)
            else None
        )
        if found is not None:
            raise _stability_refusal(static.options.alg, *found, len(steps))
        record = {
            "steps": steps,
            "save_grid": save_grid,
            "params": params,
            "layout": layout,
            "direction": np.where(np.asarray(t1) >= np.asarray(t0), 1.0, -1.0),
        }
        return BatchForward(saved, record, outcome, self)

    def event_lanes(
        self, static: Any, callbacks: Any, u0: Any, leaves: list[Any], t0: Any, t1: Any
    ) -> tuple[np.ndarray, ...] | None:
        """The event pass by the plain kernel with the callbacks, on this device (as for
        ``KernelForwardSensitivity``)."""
        from .event_pass import kernel_event_log

        return kernel_event_log(static, callbacks, u0, leaves, t0, t1, self.device)

    def backward(
        self, static: Any, record: Any, leaves: list[Any], retcode: Any, t0: Any, g: Any
    ) -> Any:
        """Cotangents of ``u0`` ``(n, L)`` and of the differentiated leaves (NaN for lanes
        that failed)."""
        from .adjoint_backward import backward

        return backward(static, record, leaves, np.asarray(retcode), np.asarray(g), self.device)


def _stability_refusal(alg: Any, limited: int, rho: float, lanes: int) -> ValueError:
    """The array path's refusal of a stability-limited ``DiscreteAdjoint`` (``stability_check``),
    with the kernels' alternatives: they have no interpolating adjoint to switch to."""
    from ..sensitivity import stability

    why = (
        "The compiled kernels have no interpolating adjoint to switch to: use "
        "sensealg=ForwardSensitivity() (up to 28 components n (1 + inputs); for such a "
        "solve its sensitivities join the error norm, accurate to the tolerance), or "
        f"differentiate on {ARRAY_PATH}, whose default switches to InterpolatingAdjoint()."
    )
    interval = alg.tableau.real_stability_interval
    return stability.refusal(DiscreteAdjoint(), alg, limited, lanes, interval, rho, why)
