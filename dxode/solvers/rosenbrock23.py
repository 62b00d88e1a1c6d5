"""Rosenbrock23: the order-2(3) Rosenbrock pair of Shampine & Reichelt (MATLAB's ode23s)."""

from __future__ import annotations

import math
from typing import Any

from .base import AbstractStepper, LaneRHS, StepResult
from .step import Step
from .stiff import StiffMethod, shifted_jacobian

Array = Any

_D = 1.0 / (2.0 + math.sqrt(2.0))
_E32 = 6.0 + math.sqrt(2.0)


class Rosenbrock23(StiffMethod, AbstractStepper):
    """Rosenbrock23: an L-stable order-2 Rosenbrock method with an order-3 error estimate.

    The method of MATLAB's ``ode23s``: with ``W = I - d h J`` (``d = 1/(2 + sqrt 2)``)
    factored once per step attempt, three linear solves per step, two new RHS evaluations
    (the third is reused by the next step) and a dense output built from the stages, which
    stays accurate on stiff problems. Cheap per step: a good choice at loose tolerances
    (``rtol`` about ``1e-2`` to ``1e-4``) and for problems whose Jacobian is expensive.

    Parameters
    ----------
    autodiff : {"auto", "autograd", "finite_difference"}
        How the Jacobian is computed when the problem has no ``jac``.

    References
    ----------
    L. F. Shampine, M. W. Reichelt, "The MATLAB ODE Suite", SIAM J. Sci. Comput. 18 (1997).
    """

    order = 2
    error_order = 2
    fsal = True
    rhs_per_step = 2
    dense_stages = 2

    def step(
        self, backend: Any, rhs: LaneRHS, t: Array, u: Array, f0: Array, h: Array
    ) -> StepResult:
        xp = backend.xp
        jac, tgrad, nf = self.derivatives(backend, rhs, t, u, f0, need_tgrad=True)
        dh = _D * h
        factors = backend.lu_factor(shifted_jacobian(xp, 1.0, dh, jac))
        dt_term = dh * tgrad
        k1 = backend.lu_solve(factors, f0 + dt_term)
        f1 = rhs(u + (0.5 * h) * k1, t + 0.5 * h)
        k2 = backend.lu_solve(factors, f1 - k1) + k1
        u1 = u + h * k2
        f2 = rhs(u1, t + h)
        k3 = backend.lu_solve(factors, f2 - _E32 * (k2 - f1) - 2.0 * (k1 - f0) + dt_term)
        error = (h / 6.0) * (k1 - 2.0 * k2 + k3)
        return StepResult(
            u1=u1,
            error=error,
            stages=xp.stack([k1, k2]),
            f1=f2,
            nf_extra=nf,
            rho=self.stiffness(xp, jac),
        )

    def interpolate(self, step: Step, theta: Array) -> Array:
        scale = 1.0 / (1.0 - 2.0 * _D)
        w1 = theta * (1.0 - theta) * scale
        w2 = theta * (theta - 2.0 * _D) * scale
        stages = step.stages
        value = step.u0 + step.h * (w1 * stages[0, ...] + w2 * stages[1, ...])
        # End exactly on u1 at theta = 1 (the formula does up to round-off).
        return step.backend.xp.where(theta == 1.0, step.u1, value)
