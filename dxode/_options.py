"""Solver options: validated once, before any work, with messages naming the fix."""

from __future__ import annotations

import dataclasses
from typing import Any

import array_api_compat
import numpy as np

from ._validation import (
    OPTION_FIX,
    check_flag,
    check_span_fits,
    positive_float,
    refuse_traced,
)
from .controllers import AbstractController, PIController
from .solvers import AbstractStepper, get_algorithm

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
        check_flag("adaptive", adaptive, allow_none=True)
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
        if (
            isinstance(maxiters, (bool, np.bool_))
            or not isinstance(maxiters, (int, np.integer))
            or not 0 < maxiters < 2**63  # the kernels count steps in int64
        ):
            raise ValueError(f"maxiters must be a positive integer below 2**63, got {maxiters!r}")
        maxiters = int(maxiters)
        rtol_f = positive_float("rtol", rtol)
        assert rtol_f is not None
        dtmin_f = positive_float("dtmin", dtmin, allow_none=True)
        dtmax_f = positive_float("dtmax", dtmax, allow_none=True)
        if dtmin_f is not None and dtmax_f is not None and dtmin_f > dtmax_f:
            raise ValueError(
                f"dtmin={dtmin_f} is larger than dtmax={dtmax_f}: no step size satisfies both; "
                f"give dtmin <= dtmax"
            )
        dt_f = positive_float("dt", dt, allow_none=True)
        _check_dt(dt_f, dtmin_f, dtmax_f, adaptive)
        return cls(
            alg=stepper,
            rtol=rtol_f,
            atol=_as_atol(atol),
            dt=dt_f,
            adaptive=adaptive,
            controller=controller,
            maxiters=maxiters,
            dtmin=dtmin_f,
            dtmax=dtmax_f,
        )

    def check_state(self, u0: Any, tspan: tuple[float, float] | None = None) -> None:
        """Raise if the method, the tolerances (or ``tspan``) do not fit a state like ``u0`` (its
        shape and dtype).

        Time is kept in the state's dtype: a float32 state needs ``t0`` and ``t1`` distinct in
        float32 (``(1e8, 1e8 + 1)`` is one float32 time), and every state ``tspan``'s times and
        width within its dtype's range (``check_span_fits``).

        ``atol`` must broadcast to the state's shape. ``rtol`` must be at least the dtype's
        machine epsilon: no relative accuracy finer than one rounding is achievable, and
        asking for it only makes the step size crawl. ``atol`` must be at least the dtype's
        smallest normal number (``2.2e-308`` for float64, ``1.2e-38`` for float32): below
        it, it rounds to a subnormal or to zero, and a zero component fails at once.
        """
        from autograd.tracer import getval

        state = getval(u0)
        shape = tuple(state.shape)
        xp = array_api_compat.array_namespace(state)
        finfo = xp.finfo(state.dtype)
        atol_shape = tuple(np.shape(self.atol)) if not isinstance(self.atol, float) else ()
        try:
            fits = tuple(np.broadcast_shapes(atol_shape, shape)) == shape
        except ValueError:
            fits = False
        self.alg.check_state_shape(shape)
        if not fits:
            raise ValueError(
                f"atol has shape {atol_shape}, which does not broadcast to the state's shape "
                f"{shape}; give a number or an array of u0's shape"
            )
        if tspan is not None:
            check_span_fits(tspan, state.dtype, float(finfo.max))
        if tspan is not None and finfo.bits == 32 and np.float32(tspan[0]) == np.float32(tspan[1]):
            raise ValueError(
                f"tspan {tuple(tspan)} is one time in float32 ({np.float32(tspan[0])!r}), the "
                f"dtype of a float32 state's time; shift time to start near 0 (and add t0 inside "
                f"f), or use a float64 state"
            )
        eps = float(finfo.eps)
        if self.rtol < eps:
            raise ValueError(
                f"rtol={self.rtol:g} is below what {state.dtype} resolves: its machine epsilon "
                f"is {eps:.3g}; use rtol >= {eps:.3g} (atol sets the absolute accuracy)"
            )
        atol_min = float(finfo.smallest_normal)
        atol = self.atol
        smallest = (
            atol
            if isinstance(atol, float)
            else float(array_api_compat.array_namespace(atol).min(atol))
        )
        if smallest < atol_min:
            raise ValueError(
                f"atol={smallest:g} is below what {state.dtype} resolves: its smallest normal "
                f"number is {atol_min:.3g}; use atol >= {atol_min:.3g} (rtol sets the relative "
                f"accuracy)"
            )

    def check_step_budget(self, tspan: tuple[Any, Any], callbacks: Any) -> None:
        """Raise where steps of at most ``dtmax`` (fixed steps: of ``dt``) need more than
        ``maxiters`` attempts to cover ``tspan``: the solve could only crawl to ``MaxIters``
        (a ``dtmax`` of 1e-9 over 10 time units took 100,000 steps to get there). Not where
        a callback (``callbacks``: a ``CallbackSet`` or ``None``) may terminate it sooner."""
        largest = self.dtmax if self.adaptive else self.dt
        if largest is None or any(cb.terminate is not False for cb in callbacks or ()):
            return
        needed = abs(float(tspan[1]) - float(tspan[0])) / largest
        if needed <= self.maxiters * (1 + 1e-6):  # float32 time may round a step up
            return
        name = "dtmax" if self.adaptive else "fixed steps of dt"
        raise ValueError(
            f"{name}={largest:g} needs {needed:.4g} steps to cover tspan {tuple(tspan)}, more "
            f"than maxiters={self.maxiters}: the solve could only end with MaxIters; raise "
            f"{name.split()[-1]} or maxiters"
        )


def _as_atol(atol: Any) -> Any:
    if isinstance(atol, (int, float)) and not isinstance(atol, bool):
        return positive_float("atol", atol)
    refuse_traced("atol", atol, OPTION_FIX)
    given_array = array_api_compat.is_array_api_obj(atol) and not np.isscalar(atol)
    try:
        array = atol if given_array else np.asarray(atol)
        xp = array_api_compat.array_namespace(array)
        if not xp.isdtype(array.dtype, ("real floating", "integral")):
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(
            f"atol must be a positive number or an array of them, got {atol!r}"
        ) from None
    if not given_array:
        array = array.astype(float)
    if not bool(xp.all(array > 0)) or not bool(xp.all(xp.isfinite(array))):
        raise ValueError("atol must be positive and finite in every component")
    return array


def _check_dt(dt: float | None, dtmin: float | None, dtmax: float | None, adaptive: bool) -> None:
    """Raise for a ``dt`` outside ``[dtmin, dtmax]``: an adaptive solve's first step below
    ``dtmin``, or fixed steps outside the bounds (they were silently shortened to ``dtmax``,
    a solve with other steps than asked for, and ``dtmin`` was ignored). An adaptive first
    step above ``dtmax`` is clipped to it, as every later step is."""
    if dt is None:
        return
    if adaptive:
        if dtmin is not None and dt < dtmin:
            raise ValueError(
                f"the first step dt={dt} is below dtmin={dtmin}, the smallest step "
                f"allowed; give dt >= dtmin (or leave dt out to have it chosen)"
            )
        return
    if dtmax is not None and dt > dtmax:
        raise ValueError(
            f"fixed steps of dt={dt} are larger than dtmax={dtmax}; a fixed-step solve takes "
            f"every step at dt (shortened only to land on a stop or the end): give dt <= dtmax, or "
            f"leave dtmax out"
        )
    if dtmin is not None and dt < dtmin:
        raise ValueError(
            f"fixed steps of dt={dt} are smaller than dtmin={dtmin}; a fixed-step solve takes "
            f"every step at dt: give dt >= dtmin, or leave dtmin out"
        )
