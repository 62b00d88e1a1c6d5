"""The explicit Runge–Kutta engine: one implementation driven by a ``ButcherTableau``."""

from __future__ import annotations

from typing import Any, ClassVar

from .base import AbstractStepper, Array, LaneRHS, StepResult
from .step import Step
from .tableau import ButcherTableau


class ExplicitRungeKutta(AbstractStepper):
    """Base class of every explicit Runge–Kutta method; subclasses set ``tableau``.

    Stage combinations are computed as products with the coefficient vector followed by a
    sum over the stage axis, which is elementwise per lane: a lane's arithmetic is the same
    whatever the batch around it, so results are bitwise reproducible across batch sizes.
    """

    tableau: ClassVar[ButcherTableau]

    def __init__(self) -> None:
        self._coefficients: dict[tuple[Any, Any, int], _Coefficients] = {}

    def __getstate__(self) -> dict[str, Any]:
        # The coefficient cache is keyed by array namespaces (modules): rebuilt on first use.
        return {**self.__dict__, "_coefficients": {}}

    @property
    def order(self) -> int:  # type: ignore[override]
        return self.tableau.order

    @property
    def error_order(self) -> int | None:  # type: ignore[override]
        return self.tableau.error_order

    @property
    def fsal(self) -> bool:  # type: ignore[override]
        return self.tableau.fsal

    @property
    def rhs_per_step(self) -> int:  # type: ignore[override]
        return self.tableau.stages - 1

    @property
    def interpolation_rhs_evals(self) -> int:  # type: ignore[override]
        return 0 if self.tableau.c_extra is None else self.tableau.c_extra.shape[0]

    def _coefs(self, xp: Any, like: Array) -> _Coefficients:
        key = (xp, like.dtype, like.ndim)
        coefs = self._coefficients.get(key)
        if coefs is None:
            coefs = self._coefficients[key] = _Coefficients(self.tableau, xp, like)
        return coefs

    def step(
        self, backend: Any, rhs: LaneRHS, t: Array, u: Array, f0: Array, h: Array
    ) -> StepResult:
        tab = self.tableau
        xp = backend.xp
        co = self._coefs(xp, u)
        stages = xp.empty((tab.stages, *u.shape), dtype=u.dtype, device=_device(xp, u))
        stages[0, ...] = f0
        y = u
        inputs = [u]  # references only: a discrete adjoint keeps them, others drop them
        stage_times = t + co.c * h  # (s, L): every stage's time in two operations
        for i in range(1, tab.stages):
            y = backend.combine(u, h, co.a[i], stages)
            inputs.append(y)
            _evaluate_into(rhs, y, stage_times[i, ...], stages, i)
        if tab.fsal:
            u1, f1 = y, stages[-1, ...]
        else:
            u1, f1 = backend.combine(u, h, co.b, stages), None
        error = None if co.e is None else backend.combine(None, h, co.e, stages)
        return StepResult(u1, error, stages, f1, inputs=tuple(inputs))

    def interpolate(self, step: Step, theta: Array) -> Array:
        backend, u0, h, stages = step.backend, step.u0, step.h, step.stages
        xp = backend.xp
        co = self._coefs(xp, u0)
        if self.tableau.c_extra is not None:
            stages = self._with_extra_stages(backend, step.rhs, co, step.t, h, u0, stages)
        weights = self.interpolation_weights(xp, u0, theta)
        return xp.where(theta == 1, step.u1, backend.combine(u0, h, weights, stages))

    def interpolation_weights(self, xp: Any, like: Array, theta: Array) -> Array:
        """The dense output's stage weights ``w_i(theta)``, ``(s + e, 1, ..., 1, L)``, so that
        ``u(t0 + theta h) = u0 + h sum_i w_i(theta) k_i`` (``theta`` is ``(L,)``; ``like`` a
        state ``(*shape, L)`` giving the dtype and rank)."""
        narrow = like.dtype != xp.float64 and xp.isdtype(like.dtype, "real floating")
        coefficients_like = like
        if narrow:
            # A float32 state's weights are evaluated in float64 and rounded once: the
            # coefficients are large and of both signs (up to 88 for Tsit5, 1207 for Vern7),
            # and Horner's rule in float32 lost ~eps * sum |P| in the weights (6e-6 for
            # Tsit5, 3e-4 for Vern7), times h |k| in the dense output, saves and events.
            theta = xp.astype(theta, xp.float64)
            coefficients_like = xp.zeros(
                (1,) * like.ndim, dtype=xp.float64, device=_device(xp, like)
            )
        co = self._coefs(xp, coefficients_like)
        # w_i(theta) = sum_j P[i, j] theta^(j+1), by Horner's rule: (s + e, L), in place.
        weights = co.p[-1] * theta
        for column in reversed(co.p[:-1]):
            weights += column
            weights *= theta
        if narrow:
            weights = xp.astype(weights, like.dtype)
        return xp.reshape(weights, (weights.shape[0],) + (1,) * (like.ndim - 1) + (-1,))

    def _with_extra_stages(
        self,
        backend: Any,
        rhs: LaneRHS,
        co: _Coefficients,
        t0: Array,
        h: Array,
        u0: Array,
        stages: Array,
    ) -> Array:
        tab = self.tableau
        xp = backend.xp
        assert tab.c_extra is not None
        s, e = tab.stages, tab.c_extra.shape[0]
        full = xp.empty((s + e, *u0.shape), dtype=u0.dtype, device=_device(xp, u0))
        full[:s, ...] = stages
        for i in range(e):
            y = backend.combine(u0, h, co.a_extra[i], full)
            _evaluate_into(rhs, y, t0 + float(tab.c_extra[i]) * h, full, s + i)
        return full


def _evaluate_into(rhs: LaneRHS, u: Array, t: Array, stages: Array, i: int) -> None:
    """``stages[i] = rhs(u, t)``, letting the RHS write in place when it can."""
    view = stages[i, ...]
    value = rhs(u, t, out=view)
    if value is not view:
        stages[i, ...] = value


def _device(xp: Any, x: Array) -> Any:
    return getattr(x, "device", None)


class _Coefficients:
    """A tableau's coefficients as arrays of the problem's namespace, dtype and rank.

    Each coefficient vector has shape ``(m, 1, ..., 1)`` so it broadcasts against a stage
    stack ``(m, *shape, L)``.
    """

    def __init__(self, tab: ButcherTableau, xp: Any, like: Array) -> None:
        dev = _device(xp, like)
        trailing = (1,) * like.ndim

        def column(values: Any) -> Array:
            arr = xp.asarray([float(v) for v in values], dtype=like.dtype, device=dev)
            return xp.reshape(arr, (len(values), *trailing))

        s = tab.stages
        self.c = xp.reshape(
            xp.asarray([float(v) for v in tab.c], dtype=like.dtype, device=dev), (-1, 1)
        )
        self.a = [None] + [column(tab.a[i, :i]) for i in range(1, s)]
        self.b = column(tab.b)
        self.e = None if tab.b_error is None else column(tab.b_error)
        self.a_extra = (
            []
            if tab.a_extra is None
            else [column(tab.a_extra[i, : s + i]) for i in range(tab.a_extra.shape[0])]
        )
        # The interpolant's coefficient columns, (s + e, 1) each, lowest power first.
        self.p = [
            xp.reshape(xp.asarray([float(v) for v in col], dtype=like.dtype, device=dev), (-1, 1))
            for col in tab.interpolant.T
        ]
