"""Rodas4: the 4th-order stiffly accurate Rosenbrock method of Hairer & Wanner."""

from __future__ import annotations

from .rodas_coefficients import RODAS4
from .rosenbrock import Rosenbrock, RosenbrockTableau

_TABLEAU = RosenbrockTableau.stiffly_accurate_from(**RODAS4)


class Rodas4(Rosenbrock):
    """Rodas4: an L-stable, stiffly accurate Rosenbrock method of order 4 (Hairer & Wanner).

    Six stages (five new RHS evaluations), one Jacobian and one LU factorization per step
    attempt, an embedded order-3 error estimate and an order-3 dense output.

    Parameters
    ----------
    autodiff : {"auto", "autograd", "finite_difference"}
        How the Jacobian is computed when the problem has no ``jac``.

    References
    ----------
    E. Hairer, G. Wanner, Solving Ordinary Differential Equations II, 2nd ed., Springer
    (1996), Sec. IV.7 (code RODAS).
    """

    tableau = _TABLEAU
    order = 4
    error_order = 3
