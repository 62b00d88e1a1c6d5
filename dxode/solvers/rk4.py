"""The classic fourth-order Runge–Kutta method (fixed step)."""

from __future__ import annotations

from .explicit_rk import ExplicitRungeKutta
from .tableau import ButcherTableau

RK4_TABLEAU = ButcherTableau(
    c=[0.0, 1 / 2, 1 / 2, 1.0],
    a=[
        [0.0, 0.0, 0.0, 0.0],
        [1 / 2, 0.0, 0.0, 0.0],
        [0.0, 1 / 2, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
    ],
    b=[1 / 6, 1 / 3, 1 / 3, 1 / 6],
    order=4,
    # The natural continuous extension: w1 = θ - 3θ²/2 + 2θ³/3, w2 = w3 = θ² - 2θ³/3,
    # w4 = -θ²/2 + 2θ³/3 (order 3).
    interpolant=[
        [1.0, -3 / 2, 2 / 3],
        [0.0, 1.0, -2 / 3],
        [0.0, 1.0, -2 / 3],
        [0.0, -1 / 2, 2 / 3],
    ],
    interpolant_order=3,
)


class RK4(ExplicitRungeKutta):
    """The classic Runge–Kutta method: order 4, fixed step (``dt`` required).

    Four stages, four right-hand-side evaluations per step, no error estimate and so no
    adaptive stepping; not FSAL. Dense output is the method's natural continuous extension,
    of order 3.

    Use it when a fixed, known step is wanted (e.g. to compare against textbook results or
    when the step is dictated by the data); for anything else an adaptive pair such as
    ``Tsit5`` or ``DP5`` is both safer and cheaper.

    References
    ----------
    1. W. Kutta, "Beitrag zur näherungsweisen Integration totaler
       Differentialgleichungen", Zeitschrift für Mathematik und Physik 46, 435–453, 1901.
    2. M. Zennaro, "Natural continuous extensions of Runge–Kutta methods",
       Mathematics of Computation 46(173), 119–133, 1986.
    """

    tableau = RK4_TABLEAU
