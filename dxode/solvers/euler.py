"""Forward Euler: the first-order fixed-step method."""

from __future__ import annotations

from .explicit_rk import ExplicitRungeKutta
from .tableau import ButcherTableau

EULER_TABLEAU = ButcherTableau(
    c=[0.0],
    a=[[0.0]],
    b=[1.0],
    order=1,
    interpolant=[[1.0]],  # linear interpolation between the step's end points
    interpolant_order=1,
)


class Euler(ExplicitRungeKutta):
    """Forward Euler, order 1, fixed step (``dt`` required).

    Mostly a teaching and testing aid: every practical problem is solved faster, at the same
    accuracy, by an adaptive higher-order method.
    """

    tableau = EULER_TABLEAU
