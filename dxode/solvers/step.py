"""The step value: one step of a working set of lanes, with its dense output."""

from __future__ import annotations

from typing import Any, NamedTuple

Array = Any


class Step(NamedTuple):
    """One step of every lane of a working set from ``t`` to ``t + h``, and its interpolant.

    Attributes
    ----------
    stepper : AbstractStepper
        The method that took the step; its ``interpolate`` is the step's dense output.
    backend : Backend
        Where the step's arrays live.
    rhs : callable or None
        The lane RHS for these lanes; ``None`` is fine for methods whose interpolant makes no
        RHS evaluations (``interpolation_rhs_evals == 0``).
    t, h : (L,) arrays
        The step's start time and signed size.
    u0, u1 : (*shape, L) arrays
        The states at ``t`` and ``t + h``.
    stages : (s, *shape, L) array
        The method's stage data (``StepResult.stages``).
    """

    stepper: Any
    backend: Any
    rhs: Any
    t: Array
    h: Array
    u0: Array
    u1: Array
    stages: Array

    def interpolate(self, theta: Array) -> Array:
        """The state at ``t + theta * h`` (``theta`` is ``(L,)`` in ``[0, 1]``)."""
        return self.stepper.interpolate(self, theta)

    def take(self, idx: Array, rhs: Any = None) -> Step:
        """The step of the lanes at positions ``idx`` (``rhs`` is the RHS for those lanes)."""
        xp = self.backend.xp

        def sub(x: Array) -> Array:
            return xp.take(x, idx, axis=-1)

        return Step(
            self.stepper,
            self.backend,
            rhs,
            sub(self.t),
            sub(self.h),
            sub(self.u0),
            sub(self.u1),
            sub(self.stages),
        )
