"""Solver options: validated once, before any work, with messages naming the fix."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._controllers import AbstractController, PIController
from ._solvers import AbstractStepper, get_algorithm
from ._validation import positive_float

__all__ = ["SolverOptions"]


@dataclasses.dataclass(frozen=True)
class SolverOptions:
    """Everything ``solve`` needs besides the problem and the save request.

    ``atol`` may be a scalar or an array broadcastable to the state's shape (per-component
    absolute tolerances). ``dt`` is the step for fixed-step methods and the initial step of
    adaptive ones (chosen automatically when ``None``).
    """

    alg: AbstractStepper
    rtol: float = 1e-3
    atol: Any = 1e-6
    dt: float | None = None
    adaptive: bool = True
    controller: AbstractController = dataclasses.field(default_factory=PIController)
    maxiters: int = 100_000
    dtmin: float | None = None
    dtmax: float | None = None

    @classmethod
    def from_user(
        cls,
        alg: Any,
        *,
        rtol: Any = 1e-3,
        atol: Any = 1e-6,
        dt: Any = None,
        adaptive: Any = None,
        controller: Any = None,
        maxiters: Any = 100_000,
        dtmin: Any = None,
        dtmax: Any = None,
    ) -> SolverOptions:
        stepper = get_algorithm(alg)
        if adaptive is None:
            adaptive = stepper.adaptive
        adaptive = bool(adaptive)
        if adaptive and not stepper.adaptive:
            raise ValueError(
                f"{stepper!r} has no error estimate, so it cannot take adaptive steps; pass "
                f"adaptive=False with a step dt=..., or choose an adaptive method such as Tsit5()"
            )
        if not adaptive and dt is None:
            raise ValueError(
                f"fixed-step integration with {stepper!r} needs a step size: pass dt=..."
            )
        if controller is None:
            controller = PIController()
        elif not isinstance(controller, AbstractController):
            raise TypeError(
                "controller must be a step-size controller such as PIController(), "
                f"got {controller!r}"
            )
        if isinstance(maxiters, bool) or not isinstance(maxiters, int) or maxiters <= 0:
            raise ValueError(f"maxiters must be a positive integer, got {maxiters!r}")
        rtol_f = positive_float("rtol", rtol)
        assert rtol_f is not None
        return cls(
            alg=stepper,
            rtol=rtol_f,
            atol=_as_atol(atol),
            dt=positive_float("dt", dt, allow_none=True),
            adaptive=adaptive,
            controller=controller,
            maxiters=maxiters,
            dtmin=positive_float("dtmin", dtmin, allow_none=True),
            dtmax=positive_float("dtmax", dtmax, allow_none=True),
        )


def _as_atol(atol: Any) -> Any:
    if isinstance(atol, (int, float)) and not isinstance(atol, bool):
        return positive_float("atol", atol)
    import array_api_compat
    import numpy as np

    array = atol if array_api_compat.is_array_api_obj(atol) else np.asarray(atol, dtype=float)
    xp = array_api_compat.array_namespace(array)
    if not bool(xp.all(array > 0)) or not bool(xp.all(xp.isfinite(array))):
        raise ValueError("atol must be positive and finite in every component")
    return array
