"""Tsitouras' 5(4) pair with its free fourth-order interpolant."""

from __future__ import annotations

from .explicit_rk import ExplicitRungeKutta
from .tableau import ButcherTableau

# Coefficients of Tsitouras (2011), each the nearest double to its 80-digit value.
_B = [
    0.09646076681806523,
    0.01,
    0.4798896504144996,
    1.379008574103742,
    -3.290069515436081,
    2.324710524099774,
    0.0,
]

TSIT5_TABLEAU = ButcherTableau(
    c=[0.0, 0.161, 0.327, 0.9, 0.9800255409045097, 1.0, 1.0],
    a=[
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.161, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [-0.008480655492356989, 0.335480655492357, 0.0, 0.0, 0.0, 0.0, 0.0],
        [2.8971530571054935, -6.359448489975075, 4.3622954328695815, 0.0, 0.0, 0.0, 0.0],
        [
            5.325864828439257,
            -11.748883564062828,
            7.4955393428898365,
            -0.09249506636175525,
            0.0,
            0.0,
            0.0,
        ],
        [
            5.86145544294642,
            -12.92096931784711,
            8.159367898576159,
            -0.071584973281401,
            -0.028269050394068383,
            0.0,
            0.0,
        ],
        _B,
    ],
    b=_B,
    order=5,
    # b - b_embedded; b_embedded[6] = 1/66.
    b_error=[
        0.0017800110522257714,
        0.0008164344596567469,
        -0.007880878010261995,
        0.1447110071732629,
        -0.5823571654525552,
        0.45808210592918697,
        -0.015151515151515152,
    ],
    error_order=4,
    # The paper's b_i(θ), expanded in powers θ, θ², θ³, θ⁴.
    interpolant=[
        [1.0, -2.763706197274826, 2.9132554618219126, -1.0530884977290216],
        [0.0, 0.13169999999999998, -0.2234, 0.1017],
        [0.0, 3.9302962368947516, -5.941033872131505, 2.490627285651253],
        [0.0, -12.411077166933676, 30.33818863028232, -16.548102889244902],
        [0.0, 37.50931341651104, -88.1789048947664, 47.37952196281928],
        [0.0, -27.896526289197286, 65.09189467479366, -34.87065786149661],
        [0.0, 1.5, -4.0, 2.5],
    ],
    interpolant_order=4,
)


class Tsit5(ExplicitRungeKutta):
    """Tsitouras 5(4): order 5, adaptive, FSAL, dense output of order 4.

    Seven stages, of which the last is ``f(u1)`` and starts the next step (first same as
    last), so a step costs six new right-hand-side evaluations. The error is estimated with
    the embedded order-4 solution and the order-5 solution is propagated. The coefficients
    satisfy only the first-column simplifying assumption, which buys smaller principal
    error coefficients than Dormand–Prince at the same cost; dense output is the method's
    own quartic interpolant.

    The recommended default for non-stiff problems at moderate tolerances (``rtol`` about
    1e-3 to 1e-8); for tighter tolerances prefer ``Vern7``.

    References
    ----------
    1. Ch. Tsitouras, "Runge–Kutta pairs of order 5(4) satisfying only the first column
       simplifying assumption", Computers & Mathematics with Applications 62(2), 770–775,
       2011.
    """

    tableau = TSIT5_TABLEAU
