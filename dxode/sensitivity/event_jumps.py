"""What an event does to the derivatives of a trajectory: the jump at one breakpoint, traced.

At a breakpoint where lanes' callbacks fired, ``u_pre`` is the segment's end state at the
event time found by the forward pass, an autograd-traced function of ``u0`` and ``p``.

- A ``ContinuousCallback``'s event time ``t*`` solves ``g(u(t*), p, t*) = 0``, so by the
  implicit function theorem ``dt*/dθ = -(∂g/∂u · du/dθ + ∂g/∂p) / (∂g/∂u · f(u⁻) + ∂g/∂t)``.
  It is traced as ``t* + δ`` with ``δ = -(g(u_pre) - value) / D``: the value is the event
  time, the derivative that one. The state at the moving event is ``u⁻ = u_pre + f(u⁻) δ``
  (the segment's end moves with ``t*``).
- Each callback that fired applies its ``affect`` ``u⁺ = a(u⁻, p, t*)``, traced by autograd
  (its derivatives in ``u``, ``p`` and ``t``).
- The next segment starts at ``t*`` too: its initial state is ``u⁺ - f(u⁺) δ``, since moving a
  start time by ``δ`` changes the later solution as moving its initial state by ``-f δ``.

Together these give the sensitivity transfer ``S⁺ = a_u S⁻ + a_p + (a_t + a_u f⁻ - f⁺) dt*/dθ``
(and, transposed by autograd, the adjoint's). ``DiscreteCallback`` and ``PresetTimeCallback``
events happen at times that do not move with ``θ`` (``δ = 0``): only the affect contributes.
A ``DiscreteCallback``'s condition is checked at step ends, which depend on ``θ`` through the
step sizes; like DiffEqSensitivity, dxode holds those times fixed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._lane_problem import lane_values, parameters_for
from .._traced_rhs import _as_traced_array, hides_the_trace
from ..events.callbacks import ContinuousCallback
from .passes import plain_rhs_for

Array = Any

_IN_PLACE = "it changes u in place (u[1] = ...), which autograd cannot trace"
_WRITTEN_INTO = (
    "it writes a traced value into a NumPy array (out[0] = ...), which autograd cannot trace"
)
_PLAIN_NUMPY = (
    "it applied a plain `numpy` function (np.array, np.stack, np.concatenate, ...) to a value "
    "autograd is tracing"
)
_FIX = "write it with `autograd.numpy` (import autograd.numpy as anp), operators and indexing"
_NEW_STATE = ", and return the new state (a new array, or a list of rows: [u[0], -e * u[1]])"


@dataclasses.dataclass
class Jump:
    """What happened at one breakpoint (lanes last; traced where the inputs were).

    ``t`` is the event time ``(L,)`` (moving with ``θ`` for continuous events), ``before[m]``
    and ``after[m]`` the states around the ``m``-th callback applied there, ``start`` the
    state the next segment starts from."""

    t: Array
    before: list[Array]
    after: list[Array]
    start: Array

    @property
    def state_before(self) -> Array:
        """The state before the first event here, at the event's (moving) time; the
        segment's end state where none fired."""
        return self.before[0] if self.before else self.start


class EventJumps:
    """The jumps of one differentiated solve: its callbacks, parameters and ``f``."""

    def __init__(self, static: Any, callbacks: Any, traced: list[Any], values: list[Any]) -> None:
        self._callbacks = tuple(callbacks)
        self._single = static.single_lane
        self._dtype = static.dtype
        lane_leaf = static.lane_leaf
        self._p = parameters_for(static.p_template, traced, lane_leaf)(
            lane_values(traced, lane_leaf)
        )
        self._p_value = parameters_for(static.p_template, values, lane_leaf)(
            lane_values(values, lane_leaf)
        )
        self._rhs = plain_rhs_for(static, values)(lane_values(values, lane_leaf))

    def at(self, u_pre: Array, t: np.ndarray, fires: np.ndarray) -> Jump:
        """The jump of lanes at ``u_pre`` ``(*shape, L)`` at times ``t`` (host ``(L,)``), where
        ``fires[m]`` names the ``m``-th callback each lane applies (``-1``: none)."""
        import autograd.numpy as anp

        t = t.astype(self._dtype)
        if fires.shape[0] == 0:
            return Jump(t, [], [], u_pre)
        delta = self._shift(u_pre, t, fires)
        moving = delta is not None
        t_event = t + delta if moving else t
        u = u_pre + self._f(u_pre, t) * delta if moving else u_pre
        before, after = [], []
        for slot in fires:
            before.append(u)
            for k in np.unique(slot[slot >= 0]):
                if self._callbacks[int(k)].affect is None:
                    continue
                fired = slot == k
                new = self._affect(int(k), u, t_event, fired)
                u = anp.where(fired, new, u)
            after.append(u)
        start = u - self._f(u, t) * delta if moving else u
        return Jump(t_event, before, after, start)

    def _shift(self, u_pre: Array, t: np.ndarray, fires: np.ndarray) -> Array | None:
        """``δ`` ``(L,)`` (value zero) whose derivative is ``dt*/dθ`` on lanes where a
        continuous callback fired: the first one each lane applied here, whose root cut the
        step (found before any affect, so ``g`` is taken at ``u_pre``); one that tied with it
        fired at the same time, which moves once. ``None`` if none fired."""
        import autograd.numpy as anp
        from autograd import elementwise_grad
        from autograd.tracer import getval

        delta = None
        u_value = getval(u_pre)
        f_value = self._f(u_value, t)
        first = np.full(fires.shape[1], -1)
        for slot in fires:
            continuous = np.array(
                [k >= 0 and isinstance(self._callbacks[int(k)], ContinuousCallback) for k in slot]
            )
            first = np.where((first < 0) & continuous, slot, first)
        for k in np.unique(first[first >= 0]):
            fired = first == k

            def along_f(eps: Array, k: int = int(k)) -> Array:
                return self._condition(k, u_value + eps * f_value, self._p_value, t + eps)

            slope = elementwise_grad(along_f)(np.zeros(t.shape, dtype=self._dtype))
            g = self._condition(int(k), u_pre, self._p, t)
            step = -(g - getval(g)) / np.where(fired, slope, 1.0)
            part = anp.where(fired, step, 0.0)
            delta = part if delta is None else delta + part
        return delta

    def _f(self, u: Array, t: np.ndarray) -> np.ndarray:
        """``f`` at the values of ``u`` (a constant of the jump)."""
        from autograd.tracer import getval

        return np.asarray(self._rhs(np.asarray(getval(u)), t))

    def _condition(self, k: int, u: Array, p: Any, t: Array) -> Array:
        import autograd.numpy as anp

        condition = self._callbacks[k].condition
        if self._single:
            return anp.reshape(_traced_call(k, "condition", condition, u[..., 0], p, t[0]), (1,))
        return anp.reshape(_traced_call(k, "condition", condition, u, p, t), (-1,))

    def _affect(self, k: int, u: Array, t: Array, fired: np.ndarray) -> Array:
        import autograd.numpy as anp

        affect = self._callbacks[k].affect
        state = u[..., 0] if self._single else u
        if self._single:
            new = _traced_call(k, "affect", affect, state, self._p, t[0], True)
        else:
            new = _traced_call(k, "affect", affect, state, self._p, t, fired)
        # A list of rows is stacked as f's are: a row that does not vary over the lanes (a
        # number, a shared parameter) is broadcast to the state's row shape.
        new = _as_traced_array(new, state)
        shape = tuple(np.shape(u)[:-1]) if self._single else tuple(np.shape(u))
        if tuple(np.shape(new)) != shape:
            raise ValueError(
                f"affect returned shape {tuple(np.shape(new))}; it must return the new state, "
                f"shape {shape}"
            )
        return anp.expand_dims(new, -1) if self._single else new


def _traced_call(k: int, what: str, fn: Any, *args: Any) -> Any:
    """Callback ``k``'s ``what`` on values autograd traces. What autograd cannot follow in it
    is refused by name: it failed further on, with autograd's own message or one about the
    right-hand side's rows (an affect's ``np.array`` of traced values made an object array,
    which the next segment's start carried into ``f``)."""
    try:
        out = fn(*args)
    except (TypeError, AttributeError, ValueError) as exc:
        if not hides_the_trace(exc):
            raise
        if isinstance(exc, ValueError):
            why = _WRITTEN_INTO
        else:
            why = _IN_PLACE if "item assignment" in str(exc) else f"autograd says: {exc}"
        raise TypeError(_refusal(k, what, why)) from exc
    rows = out if type(out) in (list, tuple) else [out]
    if any(getattr(row, "dtype", None) == np.dtype(object) for row in rows):
        raise TypeError(_refusal(k, what, _PLAIN_NUMPY))
    return out


def _refusal(k: int, what: str, why: str) -> str:
    fix = _FIX + (_NEW_STATE if what == "affect" else "")
    return f"callback {k}: {what} cannot be differentiated: {why}; {fix}"
