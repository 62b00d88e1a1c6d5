"""Rosenbrock methods of the Rodas family: a validated tableau and one stepper for all of them.

In the transformed form of Hairer & Wanner (Solving ODEs II, IV.7), with ``W = I/(h gamma) - J``
factored once per step attempt, each stage ``i`` solves

    W k_i = f(t + c_i h, u + sum_j a_ij k_j) + d_i h df/dt + sum_j (C_ij / h) k_j,

and ``u1 = u + sum_j b_j k_j``, ``error = sum_j e_j k_j``. The dense output is
``(1 - theta) u + theta (u1 + (1 - theta)(q_1 + theta (q_2 + theta q_3 ...)))`` with
``q_m = sum_j H_mj k_j``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .base import AbstractStepper, LaneRHS, StepResult
from .step import Step
from .stiff import StiffMethod, linear_combination, shifted_jacobian

Array = Any


@dataclasses.dataclass(frozen=True)
class RosenbrockTableau:
    """Coefficients of an ``s``-stage Rosenbrock method in transformed form.

    Attributes
    ----------
    gamma : float
        The diagonal coefficient.
    a : (s, s) array
        Stage arguments (strictly lower triangular).
    C : (s, s) array
        Couplings of earlier stages into the linear systems (strictly lower triangular).
    c : (s,) array
        Stage times as fractions of the step.
    d : (s,) array
        Weights of ``h df/dt`` in each stage (the row sums of the original ``Gamma``).
    b : (s,) array
        Solution weights.
    e : (s,) array
        Error-estimate weights (``b`` minus the embedded method's weights).
    H : (m, s) array
        Dense-output coefficients.
    """

    gamma: float
    a: np.ndarray
    C: np.ndarray
    c: np.ndarray
    d: np.ndarray
    b: np.ndarray
    e: np.ndarray
    H: np.ndarray

    def __post_init__(self) -> None:
        s = self.b.shape[0]
        shapes = {"a": (s, s), "C": (s, s), "c": (s,), "d": (s,), "e": (s,)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {getattr(self, name).shape}")
        if self.H.ndim != 2 or self.H.shape[1] != s:
            raise ValueError(f"H must have shape (m, {s}), got {self.H.shape}")
        for name in ("a", "C"):
            if np.any(np.triu(getattr(self, name)) != 0):
                raise ValueError(f"{name} must be strictly lower triangular")
        if not self.gamma > 0:
            raise ValueError("gamma must be positive")
        if self.c[0] != 0 or np.any(self.a[0] != 0):
            raise ValueError("the first stage must be at (t, u)")
        arrays = (self.a, self.C, self.c, self.d, self.b, self.e, self.H)
        if not all(np.all(np.isfinite(x)) for x in arrays):
            raise ValueError("tableau coefficients must be finite")

    @property
    def stages(self) -> int:
        return int(self.b.shape[0])

    @property
    def stiffly_accurate(self) -> bool:
        """Whether ``u1`` is the last stage's argument plus its increment (``b = a_s + e_s``)."""
        last = np.zeros(self.stages)
        last[-1] = 1.0
        return bool(np.array_equal(self.b, self.a[-1] + last))

    @classmethod
    def stiffly_accurate_from(
        cls,
        gamma: float,
        a: list[list[float]],
        C: list[list[float]],
        c: list[float],
        d: list[float],
        H: list[list[float]],
    ) -> RosenbrockTableau:
        """A Rodas-type tableau from its published rows.

        ``a`` gives the stage arguments of the stages that evaluate ``f`` at a new point (rows
        2 to ``r``); every later stage adds the previous increment (``u <- u + k``) and is
        evaluated at ``t + h``, and ``u1`` adds the last increment, which is also the error
        estimate. ``C`` gives rows 2 to ``s``, ``c`` and ``d`` the values of the first stages
        (the rest are 1 and 0).
        """
        s = len(C) + 1
        full_a = np.zeros((s + 1, s))
        for i, row in enumerate(a, start=1):
            full_a[i, : len(row)] = row
        for i in range(len(a) + 1, s + 1):
            full_a[i] = full_a[i - 1]
            full_a[i, i - 1] += 1.0
        full_c = np.ones(s)
        full_c[: len(c)] = c
        full_d = np.zeros(s)
        full_d[: len(d)] = d
        full_C = np.zeros((s, s))
        for i, row in enumerate(C, start=1):
            full_C[i, : len(row)] = row
        e = np.zeros(s)
        e[-1] = 1.0
        dense = np.array([row + [0.0] * (s - len(row)) for row in H])
        return cls(gamma, full_a[:s], full_C, full_c, full_d, full_a[s], e, dense)


class Rosenbrock(StiffMethod, AbstractStepper):
    """A Rosenbrock method given by a :class:`RosenbrockTableau` (subclasses set ``tableau``)."""

    tableau: RosenbrockTableau
    fsal = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if hasattr(cls, "tableau"):
            cls.rhs_per_step = cls.tableau.stages - 1
            cls.dense_stages = cls.tableau.H.shape[0]

    def step(
        self, backend: Any, rhs: LaneRHS, t: Array, u: Array, f0: Array, h: Array
    ) -> StepResult:
        xp, tab = backend.xp, self.tableau
        need_tgrad = bool(np.any(tab.d != 0))
        jac, tgrad, nf = self.derivatives(backend, rhs, t, u, f0, need_tgrad)
        factors = backend.lu_factor(shifted_jacobian(xp, 1.0 / (h * tab.gamma), 1.0, jac))
        ks: list[Array] = []
        for i in range(tab.stages):
            if i == 0:
                g = f0
            else:
                stage_u = u + linear_combination(tab.a[i, :i], ks)
                g = rhs(stage_u, t + float(tab.c[i]) * h)
            if tab.d[i] != 0:
                g = g + (float(tab.d[i]) * h) * tgrad
            coupling = linear_combination(tab.C[i, :i], ks)
            if coupling is not None:
                g = g + coupling / h
            ks.append(backend.lu_solve(factors, g))
        u1 = u + linear_combination(tab.b, ks)
        error = linear_combination(tab.e, ks)
        dense = xp.stack([linear_combination(row, ks) for row in tab.H])
        return StepResult(
            u1=u1, error=error, stages=dense, f1=None, nf_extra=nf, rho=self.stiffness(xp, jac)
        )

    def interpolate(self, step: Step, theta: Array) -> Array:
        stages = step.stages
        poly = stages[-1, ...]
        for m in range(stages.shape[0] - 2, -1, -1):
            poly = stages[m, ...] + theta * poly
        return (1.0 - theta) * step.u0 + theta * (step.u1 + (1.0 - theta) * poly)
