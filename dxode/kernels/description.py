"""A stepper description: a method as data, the input of the kernel generator.

Every explicit Runge–Kutta method of dxode is described from its ``ButcherTableau``, so the
kernels use exactly the coefficients the array path uses. Rosenbrock methods have their own
description (``rosenbrock_description``, which also describes TRBDF2) and generator
(``rosenbrock_codegen``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..solvers import TRBDF2, AutoSwitch, ExplicitRungeKutta, Rosenbrock, Rosenbrock23
from ..solvers.tableau import ButcherTableau
from .autoswitch_description import AutoSwitchDescription
from .errors import ARRAY_PATH, KernelUnsupportedError
from .rosenbrock_description import RosenbrockDescription, describe_rosenbrock

__all__ = ["StepperDescription", "describe"]


@dataclasses.dataclass(frozen=True)
class StepperDescription:
    """An explicit Runge–Kutta method as plain numbers (Python floats, rows as tuples).

    Attributes
    ----------
    name : str
        The method's class name (``"Tsit5"``).
    c, b : tuple of float
        Stage times and solution weights, ``s`` each.
    a : tuple of tuple of float
        Row ``i`` holds ``a[i, :i]`` (the coefficients stage ``i`` uses).
    b_error : tuple of float or None
        ``b - b_embedded`` (``None`` for fixed-step methods).
    fsal : bool
        The last stage is ``f(u1, t + h)`` and starts the next step.
    interpolant : tuple of tuple of float
        Dense-output coefficients, one row per stage (main and extra): row ``i`` holds the
        coefficients of ``theta**1, theta**2, ...`` of weight ``w_i(theta)``.
    c_extra, a_extra
        Extra stages evaluated only for interpolation (Verner): times, and row ``i`` holding
        ``a_extra[i, :s + i]``.
    order, error_order : int
        Orders of the solution and of the error estimate (``None`` for fixed-step methods).
    """

    name: str
    c: tuple[float, ...]
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    b_error: tuple[float, ...] | None
    fsal: bool
    interpolant: tuple[tuple[float, ...], ...]
    c_extra: tuple[float, ...]
    a_extra: tuple[tuple[float, ...], ...]
    order: int
    error_order: int | None

    @property
    def stages(self) -> int:
        """Main stages ``s``."""
        return len(self.c)

    @property
    def extra_stages(self) -> int:
        """Stages evaluated only to interpolate."""
        return len(self.c_extra)

    @property
    def adaptive(self) -> bool:
        """Whether the method has an error estimate."""
        return self.b_error is not None

    @property
    def rhs_per_attempt(self) -> int:
        """RHS evaluations per attempted step, counted as the array path counts them."""
        return self.stages - 1 + (0 if self.fsal else 1)

    @classmethod
    def from_tableau(cls, name: str, tab: ButcherTableau) -> StepperDescription:
        """The description of the method with tableau ``tab``."""
        s = tab.stages

        def floats(values: Any) -> tuple[float, ...]:
            return tuple(float(v) for v in values)

        n_extra = 0 if tab.c_extra is None else tab.c_extra.shape[0]
        return cls(
            name=name,
            c=floats(tab.c),
            a=tuple(floats(tab.a[i, :i]) for i in range(s)),
            b=floats(tab.b),
            b_error=None if tab.b_error is None else floats(tab.b_error),
            fsal=tab.fsal,
            interpolant=tuple(floats(row) for row in tab.interpolant),
            c_extra=() if tab.c_extra is None else floats(tab.c_extra),
            a_extra=()
            if tab.a_extra is None
            else tuple(floats(tab.a_extra[i, : s + i]) for i in range(n_extra)),
            order=tab.order,
            error_order=tab.error_order,
        )


def describe(stepper: Any) -> StepperDescription | RosenbrockDescription | AutoSwitchDescription:
    """The description of an algorithm instance (``StepperDescription``,
    ``RosenbrockDescription`` or ``AutoSwitchDescription``), or a clear error for methods
    kernels lack."""
    if isinstance(stepper, AutoSwitch):
        return AutoSwitchDescription(
            describe(stepper.nonstiff),  # type: ignore[arg-type]
            describe(stepper.stiff),  # type: ignore[arg-type]
            stepper.stiff_tol,
            stepper.nonstiff_tol,
            stepper.stiff_steps,
            stepper.nonstiff_steps,
            float(stepper.boundary),
        )
    _refuse_own_steps(stepper)
    if isinstance(stepper, ExplicitRungeKutta):
        return StepperDescription.from_tableau(type(stepper).__name__, stepper.tableau)
    rosenbrock = describe_rosenbrock(stepper)
    if rosenbrock is not None:
        return rosenbrock
    raise KernelUnsupportedError(
        f"the compiled kernels run explicit Runge–Kutta methods (Tsit5, DP5, BS3, Vern7, RK4, "
        f"Euler), Rosenbrock23, Rodas4, Rodas5P and TRBDF2, not {stepper!r}; "
        f"for other methods use the array path (kernel=False, or EnsembleArray())"
    )


# The classes whose arithmetic the kernels generate from their data (tableau, coefficients),
# with the methods that arithmetic replaces.
_GENERATED = (
    (ExplicitRungeKutta, ("step", "interpolate", "interpolation_weights")),
    (TRBDF2, ("step", "interpolate", "derivatives")),
    (Rosenbrock23, ("step", "interpolate", "derivatives")),
    (Rosenbrock, ("step", "interpolate", "derivatives")),
)


def _refuse_own_steps(stepper: Any) -> None:
    """Refuse a subclass that overrides how a step is taken, interpolated or differentiated:
    the kernels generate those from the tableau and would silently run the base method."""
    for base, names in _GENERATED:
        if isinstance(stepper, base):
            own = [
                name for name in names if getattr(type(stepper), name) is not getattr(base, name)
            ]
            if own:
                raise KernelUnsupportedError(
                    f"{type(stepper).__name__} overrides {base.__name__}.{own[0]}, and the "
                    f"compiled kernels generate their steps, interpolation and Jacobians from "
                    f"the method's coefficients and the problem's jac, so they would ignore "
                    f"it; use {ARRAY_PATH}, which calls it"
                )
            return
