"""Checks shared by problems and solver options; every message names the argument and the fix."""

from __future__ import annotations

import contextlib
import inspect
import math
import weakref
from collections.abc import Callable
from typing import Any

import array_api_compat
import numpy as np

from ._tracing import is_traced

Array = Any


def as_state_array(name: str, value: Any) -> Array:
    """``value`` as a real floating-point array of its own library (lists become NumPy).

    Values traced by autograd (a loss being differentiated) stay traced: their underlying
    values are checked.
    """
    if is_traced(value):
        import autograd.numpy as anp
        from autograd.tracer import getval

        traced = anp.array(value) if isinstance(value, (list, tuple)) else value
        if getval(traced).dtype.kind in "biu":
            traced = traced * 1.0
        as_state_array(name, getval(traced))
        return traced
    if array_api_compat.is_array_api_obj(value) and not isinstance(value, (int, float, complex)):
        array = value
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be an array or a nested sequence of numbers") from exc
    if isinstance(array, np.ndarray) and not array.dtype.isnative:  # read from a file, say
        array = array.astype(array.dtype.newbyteorder("="))
    xp = array_api_compat.array_namespace(array)
    if xp.isdtype(array.dtype, ("bool", "integral")):  # as for a list of integers
        array = xp.astype(array, xp.float64)
    if not xp.isdtype(array.dtype, "real floating"):
        raise TypeError(
            f"{name} must have a real floating dtype (float32 or float64), got {array.dtype}; "
            f"convert it, e.g. {name}.astype(float64)"
        )
    if array.dtype not in (xp.float32, xp.float64):
        raise TypeError(
            f"{name} has dtype {array.dtype}; dxode computes in float32 or float64 only: "
            f"convert it, e.g. {name}.astype(float32)"
        )
    if math.prod(array.shape) == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(array.shape)}); the state needs at least one component"
        )
    if array.ndim == 0:
        raise ValueError(
            f"{name} is a scalar (shape ()); give the state as a one-element array, e.g. "
            f"[{float(array)!r}], and write f for a state of shape (1,) (x = u[0])"
        )
    check_finite(name, array)
    return array


def holds_real_numbers(values: Any) -> bool:
    """Whether ``values`` holds real numbers (integers or floats; not booleans, strings or
    complex numbers): an array of any array-API library by its dtype, a number or a sequence
    of them as NumPy reads it (``ValueError`` for a ragged one)."""
    if array_api_compat.is_array_api_obj(values) and hasattr(values, "dtype"):
        xp = array_api_compat.array_namespace(values)
        return bool(xp.isdtype(values.dtype, ("real floating", "integral")))
    return np.asarray(values).dtype.kind in "fiu"


def check_finite(name: str, array: Array) -> None:
    """Raise if a floating array holds NaN or inf."""
    if isinstance(array, np.ndarray):  # directly: the namespace lookup costs more than the check
        finite = bool(np.isfinite(array).all())
    else:
        xp = array_api_compat.array_namespace(array)
        finite = bool(xp.all(xp.isfinite(array)))
    if not finite:
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")


def check_parameters_finite(p: Any) -> None:
    """Raise if any numeric leaf of the parameter pytree ``p`` is non-finite."""
    from autograd.tracer import getval

    for path, leaf in leaf_paths("p", p):
        leaf = getval(leaf)
        if isinstance(leaf, (bool, int)):
            continue
        if isinstance(leaf, float):
            if not math.isfinite(leaf):
                raise ValueError(f"{path} is not finite ({leaf})")
        elif isinstance(leaf, np.ndarray):  # the common case, without the namespace lookup
            if leaf.dtype.kind in "fc":
                check_finite(path, leaf)
        elif array_api_compat.is_array_api_obj(leaf):
            xp = array_api_compat.array_namespace(leaf)
            if xp.isdtype(leaf.dtype, ("real floating", "complex floating")):
                check_finite(path, leaf)


def leaf_paths(path: str, tree: Any) -> list[tuple[str, Any]]:
    """``(name, leaf)`` for the leaves of the pytree ``tree`` named ``path``, in
    ``_pytree.leaves`` order (e.g. ``("p[0]['k']", leaf)``)."""
    if isinstance(tree, dict):
        return [
            leaf for key, value in tree.items() for leaf in leaf_paths(f"{path}[{key!r}]", value)
        ]
    if isinstance(tree, (list, tuple)):
        return [leaf for i, value in enumerate(tree) for leaf in leaf_paths(f"{path}[{i}]", value)]
    return [(path, tree)]


TIME_FIX = "to fit a time scale, put it in p and rescale time inside f"


def refuse_traced(name: str, value: Any, fix: str = TIME_FIX) -> None:
    """Raise if autograd is differentiating ``value`` (a time, or a sequence of times; else
    ``fix`` says what to do instead)."""
    from autograd.tracer import isbox

    items = value if type(value) in (list, tuple) else (value,)
    if any(isbox(item) for item in items):
        raise TypeError(
            f"{name} is being differentiated by autograd, but dxode differentiates solves "
            f"with respect to u0 and p only: pass {name} as plain numbers ({fix})"
        )


OPTION_FIX = "a solver setting: a constant, or autograd.tracer.getval(x) of a traced x"


def as_tspan(tspan: Any) -> tuple[float, float]:
    """``(t0, t1)`` as finite floats with ``t0 != t1``. Strings and booleans are refused,
    though ``float`` would take them (``"0"``, ``True``)."""
    try:
        if isinstance(tspan, (str, bytes)):
            raise TypeError
        times = tuple(tspan)
        if any(isinstance(t, (str, bytes, bool, np.bool_)) for t in times):
            raise TypeError
        t0, t1 = (float(t) for t in times)
    except (TypeError, ValueError) as exc:
        refuse_traced("tspan", tspan)
        raise ValueError(f"tspan must be a pair (t0, t1) of numbers, got {tspan!r}") from exc
    if not (math.isfinite(t0) and math.isfinite(t1)):
        raise ValueError(f"tspan must be finite, got {(t0, t1)}")
    if t0 == t1:
        raise ValueError(f"tspan is empty: t0 == t1 == {t0}; give distinct start and end times")
    return t0, t1


def check_span_fits(tspan: tuple[float, float], dtype: Any, largest: float) -> None:
    """Raise where ``tspan``'s times or its width ``|t1 - t0|`` exceed ``largest``, the
    largest number of the state's ``dtype``, in which time is kept: times and steps would
    overflow to inf (a float32 state's ``(0, 1e39)``, a float64 ``(-1e308, 1e308)``)."""
    t0, t1 = (float(t) for t in tspan)
    width = abs(t1 - t0)  # inf where it overflows float64
    if max(abs(t0), abs(t1), width) > largest:
        raise ValueError(
            f"tspan {(t0, t1)} does not fit in {dtype}, the dtype of the state's time: "
            f"its width |t1 - t0| = {width:g} exceeds {dtype}'s largest number {largest:.4g}, "
            f"so times and steps overflow; rescale time: solve in s = t / T (T in p) with f "
            f"returning T * du/dt"
        )


def positive_float(name: str, value: Any, allow_none: bool = False) -> float | None:
    """``value`` as a positive finite float."""
    if value is None and allow_none:
        return None
    try:
        if isinstance(value, (bool, np.bool_, str, bytes)):  # float(True) is 1.0, "1e-3" 0.001
            raise TypeError
        number = float(value)
    except (TypeError, ValueError) as exc:
        refuse_traced(name, value, OPTION_FIX)
        raise TypeError(f"{name} must be a positive number, got {value!r}") from exc
    if not (math.isfinite(number) and number > 0.0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return number


def check_flag(name: str, value: Any, allow_none: bool = False) -> None:
    """Raise a TypeError unless ``value`` is ``True`` or ``False`` (or ``None`` where
    ``allow_none``): a string such as ``"no"`` would otherwise count as true."""
    if value not in (True, False) and not (allow_none and value is None):
        choices = "True, False or None" if allow_none else "True or False"
        raise TypeError(f"{name} must be {choices}, got {value!r}")


def check_backend_name(value: Any) -> None:
    """Raise unless ``value`` names an array backend an ensemble algorithm takes."""
    if value not in (None, "numpy", "cupy"):
        raise ValueError(f"backend must be 'numpy', 'cupy' or None, got {value!r}")


def positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    """``value`` as a positive int (a Python or NumPy integer, not a bool)."""
    if value is None and allow_none:
        return None
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not integer or value <= 0:
        choices = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a positive integer{choices}, got {value!r}")
    return int(value)


# (callable, argument count) pairs already checked: ``remake`` builds problems in loops.
_CALLABLE_OK: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()


def check_arguments(
    name: str, fn: Callable[..., Any], arguments: str, *, hint: str = "", owner: str = ""
) -> None:
    """Raise if ``fn`` cannot be called with the positional ``arguments`` (e.g. ``"u, p, t"``).

    Callables without a signature (builtins, NumPy ufuncs) are not checked; ``*args`` and
    defaults are honoured. The message names ``fn`` as ``name`` (prefixed by ``owner``, e.g.
    ``"ContinuousCallback: "``); ``hint`` is added when the first parameter is named ``t``
    (a function written for SciPy's ``f(t, y)``).
    """
    count = len(arguments.split(","))
    with contextlib.suppress(TypeError):  # unhashable callables are checked every time
        if count in _CALLABLE_OK.get(fn, ()):
            return
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(count))
    except TypeError:
        first = next(iter(signature.parameters), "")
        extra = f" {hint}" if hint and first == "t" else ""
        raise TypeError(
            f"{owner}{name} must take {count} positional arguments, {name}({arguments}), but its "
            f"signature is {signature}{extra}"
        ) from None
    with contextlib.suppress(TypeError):  # unhashable callables are checked every time
        _CALLABLE_OK.setdefault(fn, set()).add(count)


def user_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` for the innermost caller outside dxode (and
    autograd, which a differentiated solve runs under), so that a warning names the user's
    line (Python 3.11 has no ``skip_file_prefixes``)."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in (
        "dxode",
        "autograd",
    ):
        frame, level = frame.f_back, level + 1
    return level
