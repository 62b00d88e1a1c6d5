"""The Dormand–Prince 5(4) pair with Shampine's dense output."""

from __future__ import annotations

from .explicit_rk import ExplicitRungeKutta
from .tableau import ButcherTableau

_B = [35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0]

DP5_TABLEAU = ButcherTableau(
    c=[0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0],
    a=[
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [1 / 5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [3 / 40, 9 / 40, 0.0, 0.0, 0.0, 0.0, 0.0],
        [44 / 45, -56 / 15, 32 / 9, 0.0, 0.0, 0.0, 0.0],
        [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729, 0.0, 0.0, 0.0],
        [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656, 0.0, 0.0],
        _B,
    ],
    b=_B,
    order=5,
    # b - b_embedded, b_embedded = [5179/57600, 0, 7571/16695, 393/640, -92097/339200,
    # 187/2100, 1/40].
    b_error=[71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40],
    error_order=4,
    # Shampine's quartic, expanded from the Hermite-form ("contd5") representation.
    interpolant=[
        [1.0, -8048581381 / 2820520608, 8663915743 / 2820520608, -12715105075 / 11282082432],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 131558114200 / 32700410799, -68118460800 / 10900136933, 87487479700 / 32700410799],
        [0.0, -1754552775 / 470086768, 14199869525 / 1410260304, -10690763975 / 1880347072],
        [0.0, 127303824393 / 49829197408, -318862633887 / 49829197408, 701980252875 / 199316789632],
        [0.0, -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844],
        [0.0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423],
    ],
    interpolant_order=4,
)


class DP5(ExplicitRungeKutta):
    """Dormand–Prince 5(4): order 5, adaptive, FSAL, dense output of order 4.

    Seven stages, of which the last is ``f(u1)`` and starts the next step (first same as
    last), so a step costs six new right-hand-side evaluations. The error is estimated with
    the embedded order-4 solution and the order-5 solution is propagated (local
    extrapolation). Dense output is Shampine's free quartic interpolant.

    The workhorse of non-stiff solvers (``ode45``, ``RK45``, ``dopri5``): use it at moderate
    tolerances (``rtol`` about 1e-3 to 1e-8), or to match results from those codes;
    ``Tsit5`` is usually a little more efficient at the same accuracy.

    References
    ----------
    1. J. R. Dormand and P. J. Prince, "A family of embedded Runge–Kutta formulae",
       Journal of Computational and Applied Mathematics 6(1), 19–26, 1980.
    2. L. F. Shampine, "Some practical Runge–Kutta formulas", Mathematics of
       Computation 46(173), 135–150, 1986.
    """

    tableau = DP5_TABLEAU
