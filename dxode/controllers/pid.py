"""I, PI and PID step-size controllers (Söderlind's digital-filter form)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .base import AbstractController, Array

__all__ = ["IController", "PIController", "PIDController"]


@dataclasses.dataclass(frozen=True)
class PIDController(AbstractController):
    r"""The general PID step-size controller.

    With $e_n$ the tolerance-scaled error norm of the current step, $e_{n-1}$,
    $e_{n-2}$ those of the last accepted steps and $k$ the error estimate's
    order plus one, the next step is

    $$
    h_{n+1} = h_n \cdot \mathrm{clip}\big(s\, e_n^{-\beta_1/k}\, e_{n-1}^{-\beta_2/k}\,
    e_{n-2}^{-\beta_3/k},\ f_{\min},\ f_{\max}\big)
    $$

    A step is accepted when $e_n \le 1$; after a rejection the factor is at most $s$ and
    the history is left unchanged.

    Parameters
    ----------
    beta1 : float
        Weight of the current error (default 0.7). Presets from the literature (as tabulated
        in OrdinaryDiffEq.jl), as ``(beta1, beta2, beta3)``: integral ``(1, 0, 0)``; PI34
        ``(0.7, -0.4, 0)`` (the default, Gustafsson's PI); PI42 ``(0.6, -0.2, 0)``; PI33
        ``(2/3, -1/3, 0)``.
    beta2 : float
        Weight of the previous accepted step's error (default -0.4).
    beta3 : float
        Weight of the error two accepted steps back (default 0.0).
    safety : float
        Safety factor $s$ in ``(0, 1]``, default 0.9.
    factor_min : float
        Smallest step-size ratio per step (default 0.2: shrink at most 5×).
    factor_max : float
        Largest step-size ratio per step (default 10: grow at most 10×).

    References
    ----------
    G. Söderlind, "Digital filters in adaptive time-stepping", ACM TOMS 29 (2003) 1–26.
    """

    beta1: float = 0.7
    beta2: float = -0.4
    beta3: float = 0.0
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 10.0

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2", "beta3", "safety", "factor_min", "factor_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"controller parameter {name!r} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"controller parameter {name!r} must be finite")
        if not 0.0 < self.safety <= 1.0:
            raise ValueError(f"safety must be in (0, 1], got {self.safety}")
        if not 0.0 < self.factor_min < 1.0 < self.factor_max:
            raise ValueError(
                f"need 0 < factor_min < 1 < factor_max, got {self.factor_min}, {self.factor_max}"
            )
        if self.beta1 <= 0.0:
            raise ValueError(f"beta1 must be positive, got {self.beta1}")

    def init(self, xp: Any, like: Array) -> tuple[Array, ...]:
        one = xp.ones_like(like)
        return (one, one)

    def adapt(
        self, xp: Any, error_norm: Array, h: Array, memory: tuple[Array, ...], error_order: int
    ) -> tuple[Array, Array, tuple[Array, ...]]:
        k = error_order + 1
        prev1, prev2 = memory
        # Guard the powers: a zero error means "grow as much as allowed".
        e = xp.maximum(error_norm, 1e-10)
        factor = self.safety * e ** (-self.beta1 / k)
        if self.beta2 != 0.0:
            factor = factor * prev1 ** (-self.beta2 / k)
        if self.beta3 != 0.0:
            factor = factor * prev2 ** (-self.beta3 / k)
        accept = error_norm <= 1.0
        # After a rejection the step must shrink: cap the factor at the safety factor.
        factor = xp.clip(factor, min=self.factor_min, max=self.factor_max)
        factor = xp.where(accept, factor, xp.minimum(factor, self.safety))
        if self.beta2 != 0.0 or self.beta3 != 0.0:
            memory = (xp.where(accept, e, prev1), xp.where(accept, prev1, prev2))
        return accept, h * factor, memory


@dataclasses.dataclass(frozen=True)
class IController(PIDController):
    """The integral (I) controller, ``h * safety * e**(-1/k)``: simple, but oscillates more."""

    beta1: float = 1.0
    beta2: float = 0.0
    beta3: float = 0.0


@dataclasses.dataclass(frozen=True)
class PIController(PIDController):
    """A proportional–integral controller; its default ``(0.7, -0.4)`` (PI34) is dxode's default."""

    beta3: float = 0.0
