"""Callbacks on the kernel path: the user's functions checked and compiled, the event arrays
the generated ``block`` takes, and its event log turned into an ``EventRecord``.

The functions are the array path's, called for one trajectory at a time as for a single
``ODEProblem``: ``condition(u, p, t)`` returns a number (a bool for a ``DiscreteCallback``),
``affect(u, p, t, fired)`` the new state (``fired`` is ``True``), ``terminate(u, p, t)`` a
bool. ``u`` is a tuple of numbers, or a small array for a function that needs one (as for
``f``, see ``rhs_source``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..events.callbacks import (
    CallbackSet,
    ContinuousCallback,
    DiscreteCallback,
    nan_condition_error,
)
from ..events.record import EventRecord
from .cache import check_float_array, probed_mode, returned_shape
from .errors import ARRAY_PATH, KernelCompileError
from .events_codegen import NAN_CONDITION, CallbackLayout, EventLayout, functions
from .rhs_source import check_plain_function, function_key, numba_ready, where_defined

__all__ = ["EVENT_CAPACITY", "bind_callbacks", "event_layout", "merged_tstops", "run_events"]

# Events each lane can log in one run; lanes with more run again with room for all of them.
EVENT_CAPACITY = 8

_ROLES = ("condition", "affect", "terminate")


def event_layout(callbacks: CallbackSet, n: int, dtype: str, p_example: Any) -> EventLayout:
    """The callbacks as the generator takes them; raises ``KernelCompileError`` for a
    function numba cannot compile or one that returns the wrong kind of value."""
    layouts = []
    presets = 0
    for k, cb in enumerate(callbacks):
        kind = (
            "continuous"
            if isinstance(cb, ContinuousCallback)
            else "discrete"
            if isinstance(cb, DiscreteCallback)
            else "preset"
        )
        fns = _functions(cb)
        modes = tuple(
            False if fn is None else _mode(k, cb, role, fn, n, dtype, p_example)
            for role, fn in enumerate(fns)
        )
        layouts.append(
            CallbackLayout(
                kind=kind,
                direction=getattr(cb, "direction", "both"),
                affect=cb.affect is not None,
                terminate=fns[2] is not None,
                terminate_always=cb.terminate is True,
                save_before=cb.save_positions[0],
                save_after=cb.save_positions[1],
                abstol=None if kind != "continuous" or cb.abstol is None else float(cb.abstol),
                as_array=modes,  # type: ignore[arg-type]
                keys=tuple("" if fn is None else function_key(fn) for fn in fns),  # type: ignore[arg-type]
                preset=presets if kind == "preset" else -1,
            )
        )
        presets += kind == "preset"
    points = max(
        (cb.interp_points for cb in callbacks if isinstance(cb, ContinuousCallback)), default=0
    )
    return EventLayout(tuple(layouts), points)


def _functions(cb: Any) -> tuple[Any, Any, Any]:
    """A callback's condition, affect and terminate functions (``None`` where it has none)."""
    condition = getattr(cb, "condition", None)
    terminate = cb.terminate if callable(cb.terminate) else None
    return condition, cb.affect, terminate


def bind_callbacks(
    module: Any, callbacks: CallbackSet, events: EventLayout, wrap: Any
) -> list[str]:
    """Bind the compiled user functions into the generated ``module``; the wrappers' names."""
    wrappers = []
    for wrapper, user, k, role in functions(events):
        fn = _functions(callbacks.callbacks[k])[role]
        setattr(module, user, wrap(numba_ready(fn)))
        wrappers.append(wrapper)
    return wrappers


def _mode(k: int, cb: Any, role: int, fn: Any, n: int, dtype: str, p_example: Any) -> bool:
    """Whether ``fn`` takes ``u`` as an array (``True``) or a tuple; checks what it returns."""
    import numba
    from numba.core import types

    check_plain_function(fn, _name(k, cb, role), "u, p, t, fired" if role == 1 else "u, p, t")
    p_type = numba.typeof(p_example)
    dt = getattr(types, dtype)
    rest = (p_type, dt, types.boolean) if role == 1 else (p_type, dt)

    def check(dispatcher: Any) -> None:
        _check_returns(k, cb, role, fn, dispatcher.nopython_signatures[0].return_type, n)
        fired = (True,) if role == 1 else ()  # a condition's call checks its indexing only
        if role == 1:
            check_float_array(dispatcher, n, dtype, p_example, *fired, who=f"callback {k}: affect")
        shape = returned_shape(dispatcher, n, dtype, p_example, *fired)
        if role == 1 and shape is not None and shape != (n,):  # the kernel reads n numbers
            raise KernelCompileError(
                f"{_name(k, cb, role)} defined at {where_defined(fn)} returns shape {shape}; "
                f"it must return the new state: {n} numbers"
            )

    # "rows, in range, floats, state dtype": answers remembered before the affect's rows were
    # checked (or before u[9] of 2 components, an affect's integer array, or its float64
    # result for a float32 state, was refused) are not reused
    key = (
        "callback",
        function_key(fn),
        type(cb).__name__,
        role,
        n,
        dtype,
        str(p_type),
        "rows, in range, floats, state dtype",
    )
    error = lambda err: _uncompilable(k, cb, role, fn, err)
    return probed_mode(key, fn, n, dtype, rest, error, check)  # remembered on disk too


def _uncompilable(k: int, cb: Any, role: int, fn: Any, first_error: Any) -> KernelCompileError:
    """The error for a callback function numba compiles neither way."""
    reason = re.sub(r"\x1b\[[0-9;]*m", "", str(first_error)).split("During: ")[0].strip()
    return KernelCompileError(
        f"{_name(k, cb, role)} defined at {where_defined(fn)} cannot be compiled by numba for "
        f"the kernel path; numba says:\n{reason}\nWrite it like f (arithmetic, math/NumPy "
        f"scalar functions, a tuple or list of rows returned; see the kernels guide), or use "
        f"{ARRAY_PATH}, which runs any callback."
    )


def _name(k: int, cb: Any, role: int) -> str:
    return f"callback {k}: the {type(cb).__name__} {_ROLES[role]}"


def _check_returns(k: int, cb: Any, role: int, fn: Any, returned: Any, n: int) -> None:
    """Raise ``KernelCompileError`` unless ``fn`` returns what its role needs."""
    from numba.core import types

    where = f"{_name(k, cb, role)} defined at {where_defined(fn)}"
    if isinstance(returned, types.NoneType):
        raise KernelCompileError(f"{where} returns None; did it forget to return?")
    number = (types.Float, types.Integer)
    if role == 1:
        rows = isinstance(returned, types.BaseTuple) and len(returned) == n
        if rows and all(isinstance(x, number) for x in returned):  # type: ignore[attr-defined]
            return
        if isinstance(returned, types.Array) and returned.ndim == 1:
            return
        if isinstance(returned, types.List) and isinstance(returned.dtype, number):
            return  # a list not written in the return statement (its length checked after)
        raise KernelCompileError(
            f"{where} returns {returned}; it must return the new state: {n} numbers as a list "
            f"or tuple (or a 1-D array)"
        )
    wants_bool = role == 2 or isinstance(cb, DiscreteCallback)
    if wants_bool and not isinstance(returned, types.Boolean):
        raise KernelCompileError(f"{where} returns {returned}; it must return a bool")
    if not wants_bool and not isinstance(returned, number):
        hint = " (use DiscreteCallback for a test)" if isinstance(returned, types.Boolean) else ""
        raise KernelCompileError(
            f"{where} returns {returned}; it must return a real number whose zero crossings "
            f"are the events{hint}"
        )


def merged_tstops(
    tstops: np.ndarray | None, callbacks: CallbackSet | None, dtype: Any, direction: float
) -> np.ndarray | None:
    """``tstops`` with every preset time added (ordered in the direction of time, in
    ``dtype``, no repeats), as the array path's ``EventHandler.tstops``; ``tstops`` itself
    without preset-time callbacks."""
    presets = [cb.times.astype(dtype) for cb in _presets(callbacks)]
    if not presets:
        return tstops
    parts = presets if tstops is None else [np.asarray(tstops, dtype=dtype), *presets]
    merged = np.unique(np.concatenate(parts))
    return merged if direction > 0 else merged[::-1].copy()


def _presets(callbacks: CallbackSet | None) -> list[Any]:
    return [cb for cb in callbacks or () if hasattr(cb, "times")]


def event_arrays(
    callbacks: CallbackSet, lanes: int, n: int, dtype: Any, direction: float, capacity: int
) -> tuple[np.ndarray, ...]:
    """``EVTIMES, EVOFF`` (each preset callback's times in the direction of time, and their
    offsets) and fresh log outputs ``EVT, EVK, EVUB, EVUA, EVN`` for ``lanes`` lanes."""
    times = [cb.times.astype(dtype) for cb in _presets(callbacks)]
    times = [t if direction > 0 else t[::-1] for t in times]
    offsets = np.concatenate([[0], np.cumsum([t.shape[0] for t in times])]).astype(np.int64)
    flat = np.ascontiguousarray(np.concatenate(times) if times else np.zeros(0), dtype=dtype)
    return (
        flat,
        offsets,
        np.full((lanes, capacity), np.nan, dtype=dtype),
        np.full((lanes, capacity), -1, dtype=np.int64),
        np.full((lanes, capacity, n), np.nan, dtype=dtype),
        np.full((lanes, capacity, n), np.nan, dtype=dtype),
        np.zeros(lanes, dtype=np.int64),
    )


def run_events(run: Callable[[Any], Any], batch: Any) -> tuple[Any, EventRecord | None]:
    """``run(batch)``, and its events as an ``EventRecord`` (``trajectory`` = lane number).

    A lane that met more events than the log holds runs again alone (lanes are independent
    and deterministic, so it meets the same events) with room for all of them. A lane whose
    continuous condition returned NaN for a finite state raises the array path's
    ``ValueError`` (the first such lane's callback and time).
    """
    result = run(batch)
    if batch.callbacks is None:
        return result, None
    log = result.events
    counts = np.asarray(log[4])
    over = np.nonzero(counts > log[0].shape[1])[0]
    rows = _rows(log, np.arange(counts.shape[0]), exclude=over)
    if over.size:
        again = run(batch.select(over, int(counts[over].max())))
        rows = [
            np.concatenate([a, b]) for a, b in zip(rows, _rows(again.events, over), strict=True)
        ]
        order = np.argsort(rows[0], kind="stable")
        rows = [r[order] for r in rows]
    lane, t, which, before, after = rows
    _raise_nan_condition(t, which)
    return result, EventRecord(t, which, lane, before, after)


def _raise_nan_condition(t: np.ndarray, which: np.ndarray) -> None:
    """Raise for the first logged NaN condition (callback ``NAN_CONDITION - k``), if any."""
    bad = np.nonzero(which <= NAN_CONDITION)[0]
    if bad.size:
        raise nan_condition_error(int(NAN_CONDITION - which[bad[0]]), float(t[bad[0]]))


def _rows(log: Any, lanes: np.ndarray, exclude: np.ndarray | None = None) -> list[np.ndarray]:
    """The log's events ordered by lane then time: lane numbers ``lanes[i]`` for row ``i``."""
    evt, evk, evub, evua, evn = (np.asarray(x) for x in log)
    keep = np.arange(evt.shape[1])[None, :] < np.minimum(evn, evt.shape[1])[:, None]
    if exclude is not None and exclude.size:
        keep[exclude] = False
    lane = np.broadcast_to(lanes[:, None], keep.shape)[keep]
    return [lane.astype(np.int64), evt[keep], evk[keep], evub[keep], evua[keep]]
