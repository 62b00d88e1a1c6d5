"""Verner's "most efficient" 7(6) pair with its lazily computed order-7 interpolant."""

from __future__ import annotations

from . import vern7_coefficients as _co
from .explicit_rk import ExplicitRungeKutta
from .tableau import ButcherTableau

VERN7_TABLEAU = ButcherTableau(
    c=_co.C,
    a=_co.A,
    b=_co.B,
    order=7,
    b_error=_co.B_ERROR,
    error_order=6,
    interpolant=_co.INTERPOLANT,
    interpolant_order=7,
    c_extra=_co.C_EXTRA,
    a_extra=_co.A_EXTRA,
)


class Vern7(ExplicitRungeKutta):
    """Verner 7(6): order 7, adaptive, not FSAL, dense output of order 7.

    Ten stages per step (the tenth only feeds the error estimate, so the step is not FSAL);
    the error is estimated with the embedded order-6 solution and the order-7 solution is
    propagated. The order-7 interpolant needs six extra stages (16 in all), which are
    computed only for the steps that are actually interpolated.

    Use it for smooth non-stiff problems at tight tolerances (``rtol`` about 1e-7 to 1e-13),
    where it takes far fewer steps than the fifth-order pairs; at loose tolerances prefer
    ``Tsit5``.

    References
    ----------
    1. J. H. Verner, "Numerically optimal Runge–Kutta pairs with interpolants",
       Numerical Algorithms 53(2–3), 383–396, 2010.
    """

    tableau = VERN7_TABLEAU
