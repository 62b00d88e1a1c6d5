"""Rodas4: the 4th-order stiffly accurate Rosenbrock method of Hairer & Wanner."""

from __future__ import annotations

from .rodas_coefficients import RODAS4
from .rosenbrock import Rosenbrock, RosenbrockTableau

_TABLEAU = RosenbrockTableau.stiffly_accurate_from(**RODAS4)


class Rodas4(Rosenbrock):
    """Rodas4: an L-stable, stiffly accurate Rosenbrock method of order 4 (Hairer & Wanner).

    Six stages (five new RHS evaluations), one Jacobian and one LU factorization per step
    attempt, an embedded order-3 error estimate and an order-3 dense output. Like the RODAS
    code it suffers order reduction where a stiff component follows a moving target
    (Prothero-Robinson ``u' = lam (u - g(t)) + g'(t)``): its local error falls to order 1-2
    there, and at ``lam = -1e3``, ``rtol = 1e-8`` it takes 5,547 steps where Rodas5P, built
    to avoid it, takes 179. Prefer Rodas5P at tight tolerances.

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
