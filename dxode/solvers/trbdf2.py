"""TRBDF2: the L-stable one-step TR-BDF2 method of Hosea & Shampine (1996)."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from .base import AbstractStepper, LaneRHS, StepResult
from .newton import solve_stage
from .step import Step
from .stiff import StiffMethod, linear_combination, shifted_jacobian

Array = Any

_SQRT2 = math.sqrt(2.0)
GAMMA = 2.0 - _SQRT2
"""Where the trapezoidal stage ends, as a fraction of the step."""
D = GAMMA / 2.0
"""The diagonal coefficient: both implicit stages solve ``y = base + D h f(y)``."""
W = _SQRT2 / 4.0
"""Weight of ``h f`` at ``t`` and at ``t + GAMMA h`` in the BDF2 stage."""
ERROR = ((1.0 - _SQRT2) / 3.0, 1.0 / 3.0, (_SQRT2 - 2.0) / 3.0)
"""Weights of ``h f`` at ``t``, ``t + GAMMA h``, ``t + h`` in the local error estimate."""
DEFAULT_KAPPA = 1e-2
DEFAULT_MAX_ITERS = 10


class TRBDF2(StiffMethod, AbstractStepper):
    """TRBDF2: an L-stable, stiffly accurate implicit method of order 2 (Hosea & Shampine).

    Each step is a trapezoidal-rule stage to ``t + gamma h`` followed by a BDF2 stage to
    ``t + h`` (``gamma = 2 - sqrt 2``), so both implicit stages share one matrix
    ``W = I - (gamma/2) h J``: one Jacobian and one LU factorization per step attempt. The
    stages are solved by a simplified Newton iteration in which every lane iterates until
    its own convergence test passes (one RHS evaluation and one linear solve per
    iteration); a lane whose iteration diverges or stalls rejects its step, and the step
    size controller shrinks that lane's step as much as it can, without touching the other
    lanes. The local error estimate is the paper's third-order one filtered through ``W``
    (one more solve), and the dense output is the cubic Hermite interpolant of the step's
    ends. Its advantage over the Rosenbrock methods is robustness to an approximate
    Jacobian: the Newton iteration corrects it at the cost of a few iterations, where a
    Rosenbrock method loses its order and falls back on many small steps. With an exact
    Jacobian, ``Rodas5P`` (or ``Rosenbrock23`` at loose tolerances) is usually cheaper.

    Parameters
    ----------
    autodiff : {"auto", "autograd", "finite_difference"}
        How the Jacobian is computed when the problem has no ``jac``.
    kappa : float
        Newton stopping tolerance: a stage has converged once its estimated iteration error
        is below ``kappa`` times the error tolerance (default ``1e-2``).
    max_iters : int
        Newton iterations allowed per stage before the step is rejected (default 10).

    References
    ----------
    M. E. Hosea, L. F. Shampine, "Analysis and implementation of TR-BDF2", Appl. Numer.
    Math. 20 (1996) 21–37.
    """

    order = 2
    error_order = 2
    fsal = False
    dense_stages = 2
    rhs_per_step = 0  # every Newton iteration is counted per lane (StepResult.nf_extra)

    def __init__(
        self,
        autodiff: str = "auto",
        kappa: float = DEFAULT_KAPPA,
        max_iters: int = DEFAULT_MAX_ITERS,
    ) -> None:
        super().__init__(autodiff)
        number = isinstance(kappa, (int, float, np.number)) and not isinstance(kappa, bool)
        if not (number and 0.0 < kappa < 1.0):
            raise ValueError(f"kappa must be a number in (0, 1), got {kappa!r}")
        integer = isinstance(max_iters, (int, np.integer)) and not isinstance(max_iters, bool)
        if not integer or max_iters < 1:
            raise ValueError(f"max_iters must be a positive integer, got {max_iters!r}")
        self.kappa = float(kappa)
        self.max_iters = int(max_iters)
        self._tolerances: tuple[float, Any] | None = None

    def configure(self, rtol: float, atol: Any) -> TRBDF2:
        configured = copy.copy(self)
        configured._tolerances = (rtol, atol)
        return configured

    def step(
        self, backend: Any, rhs: LaneRHS, t: Array, u: Array, f0: Array, h: Array
    ) -> StepResult:
        if self._tolerances is None:
            raise RuntimeError(
                "TRBDF2 needs the tolerances for its Newton iteration: step with the stepper "
                "returned by configure(rtol, atol)"
            )
        xp = backend.xp
        rtol, atol = self._tolerances
        jac, _, nf = self.derivatives(backend, rhs, t, u, f0, need_tgrad=False)
        dh = D * h
        factors = backend.lu_factor(shifted_jacobian(xp, 1.0, dh, jac))
        scale = rtol * xp.abs(u) + atol
        # Below round-off relative to the tolerance the iteration cannot settle.
        kappa = max(self.kappa, 10.0 * float(xp.finfo(u.dtype).eps) / rtol)

        def stage(time: Array, base: Array, guess: Array, run: Array) -> Any:
            return solve_stage(
                backend, rhs, time, base, dh, guess, factors, scale, run, kappa, self.max_iters
            )

        z0 = h * f0
        # Trapezoidal rule to t + gamma h, started from the linearly implicit Euler step (the
        # first Newton iterate from u, free since f(u) is known): stable at any step size.
        base = u + D * z0
        guess = u + backend.lu_solve(factors, GAMMA * z0)
        tr = stage(t + GAMMA * h, base, guess, xp.ones(h.shape, dtype=xp.bool))
        z_gamma = (tr.y - base) / D
        # BDF2 through u, the trapezoidal stage and u1 (only where the first stage converged),
        # started from the trapezoidal stage: extrapolating its derivative would carry the
        # trapezoidal rule's undamped stiff components into the guess.
        base = u + W * z0 + W * z_gamma
        bdf = stage(t + h, base, tr.y, tr.converged)
        z1 = (bdf.y - base) / D
        error = backend.lu_solve(factors, linear_combination(ERROR, [z0, z_gamma, z1]))
        return StepResult(
            u1=bdf.y,
            error=error,
            stages=xp.stack([z0, z1]),
            f1=None,
            nf_extra=nf + tr.iterations + bdf.iterations,
            failed=~bdf.converged,
            rho=self.stiffness(xp, jac),
        )

    def interpolate(self, step: Step, theta: Array) -> Array:
        # Cubic Hermite through (u0, h f0) and (u1, h f1), with h f1 from the BDF2 stage.
        u0, u1 = step.u0, step.u1
        z0, z1 = step.stages[0, ...], step.stages[1, ...]
        slope = (1.0 - 2.0 * theta) * (u1 - u0) + (theta - 1.0) * z0 + theta * z1
        return (1.0 - theta) * u0 + theta * u1 + theta * (theta - 1.0) * slope

    def __repr__(self) -> str:
        args = [] if self.autodiff == "auto" else [f"autodiff={self.autodiff!r}"]
        if self.kappa != DEFAULT_KAPPA:
            args.append(f"kappa={self.kappa!r}")
        if self.max_iters != DEFAULT_MAX_ITERS:
            args.append(f"max_iters={self.max_iters!r}")
        return f"TRBDF2({', '.join(args)})"
