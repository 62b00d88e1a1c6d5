"""The Bogacki–Shampine 3(2) pair."""

from __future__ import annotations

from .explicit_rk import ExplicitRungeKutta
from .tableau import ButcherTableau

BS3_TABLEAU = ButcherTableau(
    c=[0.0, 1 / 2, 3 / 4, 1.0],
    a=[
        [0.0, 0.0, 0.0, 0.0],
        [1 / 2, 0.0, 0.0, 0.0],
        [0.0, 3 / 4, 0.0, 0.0],
        [2 / 9, 1 / 3, 4 / 9, 0.0],
    ],
    b=[2 / 9, 1 / 3, 4 / 9, 0.0],
    order=3,
    # b - b_embedded, with b_embedded = [7/24, 1/4, 1/3, 1/8].
    b_error=[-5 / 72, 1 / 12, 1 / 9, -1 / 8],
    error_order=2,
    # Cubic Hermite interpolation on (u0, k1, u1, k4), written in the stages.
    interpolant=[
        [1.0, -4 / 3, 5 / 9],
        [0.0, 1.0, -2 / 3],
        [0.0, 4 / 3, -8 / 9],
        [0.0, -1.0, 1.0],
    ],
    interpolant_order=3,
)


class BS3(ExplicitRungeKutta):
    """Bogacki–Shampine 3(2): order 3, adaptive, FSAL, dense output of order 3.

    Four stages, of which the last is ``f(u1)`` and is reused as the next step's first
    (first same as last), so a step costs three new right-hand-side evaluations. The error
    is estimated with the embedded order-2 solution and the order-3 solution is propagated.
    Dense output is the cubic Hermite interpolant through both end points and slopes.

    Use it for loose tolerances (``rtol`` around 1e-2 to 1e-4) or for mildly stiff or
    non-smooth right-hand sides, where its low order and cheap steps pay off.

    References
    ----------
    1. P. Bogacki and L. F. Shampine, "A 3(2) pair of Runge–Kutta formulas",
       Applied Mathematics Letters 2(4), 321–325, 1989.
    """

    tableau = BS3_TABLEAU
