"""Rodas5P: Steinebach's 5th-order stiffly accurate Rosenbrock method (2023)."""

from __future__ import annotations

from .rodas_coefficients import RODAS5P
from .rosenbrock import Rosenbrock, RosenbrockTableau

_TABLEAU = RosenbrockTableau.stiffly_accurate_from(**RODAS5P)


class Rodas5P(Rosenbrock):
    """Rodas5P: an L-stable, stiffly accurate Rosenbrock method of order 5 (Steinebach 2023).

    Eight stages (seven new RHS evaluations), one Jacobian and one LU factorization per step
    attempt, an embedded order-4 error estimate and an order-4 dense output that stays
    accurate on stiff problems. The first choice for stiff problems at moderate to tight
    tolerances (``rtol`` about ``1e-4`` to ``1e-10``).

    Parameters
    ----------
    autodiff : {"auto", "autograd", "finite_difference"}
        How the Jacobian is computed when the problem has no ``jac``.

    References
    ----------
    G. Steinebach, "Construction of Rosenbrock–Wanner method Rodas5P and numerical benchmarks
    within the Julia Differential Equations package", BIT Numer. Math. 63, 27 (2023).
    """

    tableau = _TABLEAU
    order = 5
    error_order = 4
