"""Callbacks: events that change or stop a trajectory, written once for every lane.

A callback's functions see the state the way ``f`` does: lanes last in ensembles (``u`` is
``(*shape, L)``, a condition returns ``(L,)``), and without the lane axis for a single
``ODEProblem`` (``u`` has ``u0``'s shape, a condition returns a scalar). The integrator does
the per-lane work: it locates each lane's events, applies ``affect`` only where an event
fired, and ends only the lanes a callback terminates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np

from .._timegrid import host_times
from .._validation import check_arguments, positive_float, positive_int

__all__ = [
    "CallbackSet",
    "ContinuousCallback",
    "DiscreteCallback",
    "PresetTimeCallback",
    "nan_condition_error",
]

_DIRECTIONS = ("both", "up", "down")


def _check_common(name: str, affect: Any, terminate: Any, save_positions: Any) -> tuple[bool, bool]:
    if affect is not None and not callable(affect):
        raise TypeError(f"{name}: affect must be a function affect(u, p, t, fired) or None")
    if affect is not None:
        check_arguments("affect", affect, "u, p, t, fired", owner=f"{name}: ")
    if not (isinstance(terminate, bool) or callable(terminate)):
        raise TypeError(f"{name}: terminate must be True, False or a function terminate(u, p, t)")
    if not isinstance(terminate, bool):
        check_arguments("terminate", terminate, "u, p, t", owner=f"{name}: ")
    try:
        if isinstance(save_positions, (str, bytes)):  # "ab" unpacks into two true strings
            raise TypeError
        before, after = save_positions
        if not all(isinstance(x, (bool, np.bool_)) for x in (before, after)):
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(
            f"{name}: save_positions must be a pair of bools (before, after), got "
            f"{save_positions!r}"
        ) from None
    return bool(before), bool(after)


@dataclasses.dataclass(frozen=True)
class ContinuousCallback:
    """An event where ``condition(u, p, t)`` crosses zero, located per lane by root finding.

    Each accepted step is sampled at ``interp_points`` evenly spaced points of its dense
    output; in the first interval where a lane's condition changes sign (in ``direction``),
    the crossing is bracketed by the Illinois method until the bracket is at most ``abstol``
    wide in time. The lane's step is cut at the event — at the bracket's end *before* the
    crossing, so the condition still has its old sign there — saves up to the event are made,
    ``affect`` is applied, ``f`` is evaluated afresh at the new state and the lane continues
    from the event with the step size its controller proposed.

    Parameters
    ----------
    condition : callable
        ``condition(u, p, t) -> (L,)`` values (a scalar for a single problem); events are
        its zero crossings. A zero at the start of a step never fires: after an event whose
        affects left the condition's value unchanged the lane sits on the crossing, and
        fires again only once the condition has taken a nonzero sign and changed it; after
        one that moved it, the next crossing counts from the new value.
    affect : callable, optional
        ``affect(u, p, t, fired) -> new u`` (or a list of rows, like ``f``); ``fired`` is an
        ``(L,)`` bool mask of the lanes where the event fired (``True`` for a single problem).
        Lanes where ``fired`` is false keep their state whatever ``affect`` returns there.
        ``None`` leaves the state unchanged (to record or terminate only).
    direction : {"both", "up", "down"}
        Which crossings fire: negative to non-negative (``"up"``), positive to non-positive
        (``"down"``) or both.
    terminate : bool or callable
        ``True`` ends the lane at every event (return code ``Terminated``); a function
        ``terminate(u, p, t) -> (L,) bool`` (a bool for a single problem) of the state after
        ``affect`` ends only the lanes where it returns true.
    save_positions : (bool, bool)
        Keep the state just before and just after each event in ``sol.events``; with the
        second, every-step output also gets a point just after the event.
    interp_points : int
        Points per step at which the condition is sampled; two crossings between the same
        two samples cancel and are missed, so raise it for conditions that oscillate within
        a step.
    abstol : float, optional
        Width, in time, to which an event is bracketed; by default ``8 * eps * max(|t|, |h|)``
        (a few units in the last place of the event time).
    """

    condition: Callable[..., Any]
    affect: Callable[..., Any] | None = None
    direction: Literal["both", "up", "down"] = "both"
    terminate: bool | Callable[..., Any] = False
    save_positions: tuple[bool, bool] = (True, True)
    interp_points: int = 10
    abstol: float | None = None

    def __post_init__(self) -> None:
        name = "ContinuousCallback"
        if not callable(self.condition):
            raise TypeError(f"{name}: condition must be a function condition(u, p, t)")
        check_arguments("condition", self.condition, "u, p, t", owner=f"{name}: ")
        if self.direction not in _DIRECTIONS:
            raise ValueError(
                f"{name}: direction must be 'both', 'up' or 'down', got {self.direction!r}"
            )
        positions = _check_common(name, self.affect, self.terminate, self.save_positions)
        object.__setattr__(self, "save_positions", positions)
        points = positive_int(f"{name}: interp_points", self.interp_points)
        object.__setattr__(self, "interp_points", points)
        abstol = positive_float(f"{name}: abstol", self.abstol, allow_none=True)
        object.__setattr__(self, "abstol", abstol)


@dataclasses.dataclass(frozen=True)
class DiscreteCallback:
    """An event checked at the end of every accepted step: where ``condition`` is true.

    Parameters
    ----------
    condition : callable
        ``condition(u, p, t) -> (L,)`` bools (a bool for a single problem), evaluated at the
        end of each accepted step (after any continuous event in that step).
    affect, terminate, save_positions
        As for ``ContinuousCallback``.
    """

    condition: Callable[..., Any]
    affect: Callable[..., Any] | None = None
    terminate: bool | Callable[..., Any] = False
    save_positions: tuple[bool, bool] = (True, True)

    def __post_init__(self) -> None:
        if not callable(self.condition):
            raise TypeError("DiscreteCallback: condition must be a function condition(u, p, t)")
        check_arguments("condition", self.condition, "u, p, t", owner="DiscreteCallback: ")
        positions = _check_common(
            "DiscreteCallback", self.affect, self.terminate, self.save_positions
        )
        object.__setattr__(self, "save_positions", positions)


@dataclasses.dataclass(frozen=True)
class PresetTimeCallback:
    """An event at given times (doses, switches), which every lane steps to exactly.

    The times are added to the integrator's ``tstops``; ``affect`` applies when a lane's
    accepted step ends on one of them, and at the start when one equals ``t0``. ``solve``
    rejects times outside the time span (with per-trajectory spans: outside all of them);
    a lane ignores times outside its own span.

    Parameters
    ----------
    times : array_like
        The event times, a 1-D sequence of finite numbers (any order; duplicates count once).
    affect, terminate, save_positions
        As for ``ContinuousCallback``.
    """

    times: Any
    affect: Callable[..., Any] | None = None
    terminate: bool | Callable[..., Any] = False
    save_positions: tuple[bool, bool] = (True, True)

    def __post_init__(self) -> None:
        times = host_times("PresetTimeCallback: times", self.times)
        if times.ndim != 1 or times.size == 0 or not np.all(np.isfinite(times)):
            raise ValueError(
                "PresetTimeCallback: times must be a non-empty 1-D sequence of finite numbers"
            )
        object.__setattr__(self, "times", np.unique(times))
        positions = _check_common(
            "PresetTimeCallback", self.affect, self.terminate, self.save_positions
        )
        object.__setattr__(self, "save_positions", positions)


Callback = ContinuousCallback | DiscreteCallback | PresetTimeCallback


class CallbackSet:
    """Several callbacks applied together (nested sets are flattened).

    A callback's index in ``sol.events.callback`` is its position in the flattened set. In
    each accepted step of a lane: first the earliest continuous event (ties go to the
    callback listed first) cuts the step and applies; then, at the end of the (possibly cut)
    step, the discrete and preset-time callbacks are checked in the order listed, each seeing
    the state left by the one before. Later crossings in a cut step are found when the lane
    steps on from the event.
    """

    def __init__(self, *callbacks: Any) -> None:
        flat: list[Callback] = []
        for cb in callbacks:
            if isinstance(cb, CallbackSet):
                flat.extend(cb.callbacks)
            elif isinstance(cb, (ContinuousCallback, DiscreteCallback, PresetTimeCallback)):
                flat.append(cb)
            else:
                raise TypeError(
                    "CallbackSet takes ContinuousCallback, DiscreteCallback, PresetTimeCallback "
                    f"or CallbackSet objects, got {type(cb).__name__}"
                )
        self.callbacks: tuple[Callback, ...] = tuple(flat)

    def __iter__(self) -> Iterator[Callback]:
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    def __repr__(self) -> str:
        return f"CallbackSet({', '.join(type(cb).__name__ for cb in self.callbacks)})"


def as_callback_set(callback: Any) -> CallbackSet | None:
    """``solve``'s ``callback`` argument as a CallbackSet (``None`` or an empty set: ``None``)."""
    if callback is None:
        return None
    if isinstance(callback, (list, tuple)):
        callback = CallbackSet(*callback)
    elif not isinstance(callback, CallbackSet):
        if not isinstance(callback, (ContinuousCallback, DiscreteCallback, PresetTimeCallback)):
            raise TypeError(
                "callback must be a ContinuousCallback, DiscreteCallback, PresetTimeCallback, "
                f"CallbackSet or a list of them, got {type(callback).__name__}"
            )
        callback = CallbackSet(callback)
    return callback if len(callback) else None


def check_preset_times(callbacks: CallbackSet | None, lo: float, hi: float) -> None:
    """Raise if a ``PresetTimeCallback`` time lies outside ``[lo, hi]``, where no trajectory
    could ever reach it (so the callback would silently never fire)."""
    for k, cb in enumerate(() if callbacks is None else callbacks):
        if isinstance(cb, PresetTimeCallback):
            outside = cb.times[(cb.times < lo) | (cb.times > hi)]
            if outside.size:
                raise ValueError(
                    f"PresetTimeCallback (callback {k}): time {float(outside[0])} is outside the "
                    f"time span [{lo}, {hi}], so it would never fire; drop it or widen tspan"
                )


def nan_condition_error(k: int, at: float) -> ValueError:
    """The error for continuous callback ``k``'s condition returning NaN at time ``at`` for a
    finite state (on the array path and, after the kernel returns, on the kernel path)."""
    return ValueError(
        f"callback {k}: the ContinuousCallback condition returned NaN at t = {at:g} for a "
        f"finite state; it must return real numbers whose zero crossings are the events"
    )
