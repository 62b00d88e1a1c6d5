"""Adapters between the user's ``f(u, p, t)`` and the integrator's lane RHS ``rhs(u, t)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import array_api_compat

from ._error_context import add_note

Array = Any

SCIPY_ORDER = (
    "f seems to take its arguments in SciPy's order f(t, u, p): called as f(t, u, p) it "
    "returns du/dt, called as dxode calls it, f(u, p, t), it fails; reorder f's parameters "
    "to f(u, p, t)"
)

TRACED_CLOSURE = (
    "f(u, p, t) returned a value autograd is tracing although u and p are plain: f uses a "
    "variable being differentiated from outside (a closure), or from inside an object in p "
    "that dxode does not look into (a dataclass or other class instance; dxode looks into "
    "tuples, lists and dicts); pass it in p, ODEProblem(f, u0, tspan, p), as an array or a "
    "number, or in a tuple, list or dict of them, so that dxode differentiates the solve with "
    "respect to it"
)

RAGGED_ROWS = (
    "f(u, p, t) built an array from rows of different shapes: in an ensemble f receives "
    "the states lanes last, so a state row (u[1]) holds one value per trajectory, while a "
    "parameter shared by all trajectories (p[0]) is one number. Return the rows as a list, "
    "[u[1], -p[0]], which dxode broadcasts, instead of np.array([...])"
)

FILLED_ARRAY = (
    "f(u, p, t) wrote a value holding many trajectories into one element of an array: in an "
    "ensemble f receives the states lanes last, u of shape {shape} here, one column per "
    "trajectory, so a state row (u[1]) holds a value per trajectory. Allocate what f fills "
    "like u (du = np.empty_like(u)), or return the rows as a list, [u[1], -p[0] * u[0]]"
)


def as_array(
    backend: Any,
    value: Any,
    out: Array | None = None,
    shape: tuple[int, ...] | None = None,
    dtype: Any = None,
) -> Any:
    """The RHS output as an array: a list or tuple of rows is stacked along axis 0.

    Rows are broadcast to the state's rows (``shape``, the state's shape, or ``out``'s), so
    constant rows (``[u[1], -9.81]``) work for one trajectory and for a batch of lanes alike;
    rows that are all Python numbers take ``dtype`` (the state's) when given.
    Stacked rows go straight into ``out`` when given (saving a copy); an array is returned
    as it is, and the caller copies it where it belongs.
    """
    if type(value) in (list, tuple):
        return backend.stack_rows(value, out=out, shape=shape, dtype=dtype)
    return value


def checked_first_call(backend: Any, f: Callable[..., Any], u: Array, p: Any, t: Array) -> Array:
    """Call ``f(u, p, t)`` once and check what it returns before any integration work."""
    try:
        raw = f(u, p, t)
        traced = is_traced_result(raw)
        out = raw if traced else as_array(backend, raw, shape=tuple(u.shape), dtype=u.dtype)
    except Exception as exc:
        if _takes_scipy_order(backend, f, u, p, t):
            raise TypeError(SCIPY_ORDER) from exc
        if isinstance(exc, ValueError) and "inhomogeneous" in str(exc):
            raise ValueError(f"{RAGGED_ROWS} (NumPy says: {exc})") from exc
        filled = isinstance(exc, ValueError) and "array element with a sequence" in str(exc)
        if filled and getattr(u, "ndim", 0) > 1:  # a batch of lanes
            add_note(exc, FILLED_ARRAY.format(shape=tuple(u.shape)))
        raise
    if traced:
        raise TypeError(TRACED_CLOSURE)
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        if _takes_scipy_order(backend, f, u, p, t):
            raise TypeError(SCIPY_ORDER)
        raise TypeError(
            f"f(u, p, t) must return an array (du/dt), got {type(out).__name__}; did it forget "
            f"to return?"
        )
    if tuple(out.shape) != tuple(u.shape):
        if _takes_scipy_order(backend, f, u, p, t):
            raise TypeError(SCIPY_ORDER)
        raise ValueError(
            f"f(u, p, t) returned shape {tuple(out.shape)} for a state of shape "
            f"{tuple(u.shape)}; it must return du/dt with u's shape"
        )
    foreign = foreign_array(out, u, "f(u, p, t)")
    if foreign is not None:
        raise foreign
    if str(out.dtype) == "object":
        raise TypeError(
            "f(u, p, t) returned an object array: a plain `numpy` function was applied to a "
            "traced autograd value; use `autograd.numpy` in f instead"
        )
    if out.dtype != u.dtype:
        raise wrong_dtype(out.dtype, u.dtype)
    return out


def wrong_dtype(returned: Any, state: Any, who: str = "f(u, p, t)") -> TypeError:
    """The error for an ``f`` (or ``who``: a callback's affect) whose result is not in the
    state's dtype (the compiled kernels' too, for an integer or bool array)."""
    return TypeError(
        f"{who} returned dtype {returned} for a {state} state; keep it in u's dtype "
        f"(use Python floats for constants, cast parameters to {state}, and build arrays "
        f"as np.array([...], dtype=u.dtype): a list holding a Python float makes float64)"
    )


def foreign_array(value: Any, u: Array, who: str) -> TypeError | None:
    """The error for ``who`` returning ``value``, an array of another library than the state
    ``u``'s (a NumPy array for an ``array_api_strict`` or CuPy state), else None.

    Checked before the dtypes: those of two libraries need not compare (``array_api_strict``
    warns and calls its ``float64`` unequal to NumPy's), and CuPy would copy between host and
    device or refuse deep inside a step."""
    if type(value) is type(u) or not array_api_compat.is_array_api_obj(value):
        return None  # (the common case, per Jacobian evaluation, in one comparison)
    ours, theirs = _library(u), _library(value)
    if ours == theirs:
        return None
    return TypeError(
        f"{who} returned an array of {theirs} for a state of {ours}; build it with the "
        f"state's own library, xp = array_api_compat.array_namespace(u) (xp.stack, "
        f"xp.zeros_like(u), ...), or return a list of rows, which dxode stacks"
    )


def _library(x: Any) -> str:
    """The name of the array library of ``x`` (``"numpy"``, ``"cupy"``, ...)."""
    try:
        namespace = array_api_compat.array_namespace(x)
    except TypeError:
        return type(x).__module__.split(".")[0]
    return namespace.__name__.removeprefix("array_api_compat.")


def is_traced_result(value: Any) -> bool:
    """Whether a user function returned values autograd is tracing (a value, or a list or
    tuple of rows)."""
    from autograd.tracer import isbox

    if type(value) in (list, tuple):
        return any(isbox(row) for row in value)
    return isbox(value)


def _takes_scipy_order(backend: Any, f: Callable[..., Any], u: Array, p: Any, t: Array) -> bool:
    """Whether ``f(t, u, p)`` (SciPy's order) works where ``f(u, p, t)`` did not.

    Called only once ``f(u, p, t)`` has failed; it returns du/dt of ``u``'s shape exactly
    when ``f`` was written in SciPy's order. An ``f`` whose parameters are named in dxode's
    order (``t`` third) is not: called as ``f(t, u, p)`` it receives ``p`` as its time and
    ``u`` as its parameters, and can still return ``u``'s shape (``-p * u`` does whatever
    ``p`` is; ``-u * p / t`` does for a number or bool ``p``), hiding f's real error.
    """
    if _names_time_third(f):
        return False
    # One time as a scalar, as SciPy passes it: with the lanes' times (L,) an f(u, p, t) that
    # merely failed on u (say, u[1] on array_api_strict lanes) could index t and pass.
    scalar_t = t[0] if getattr(t, "ndim", 0) == 1 else t
    try:
        value = as_array(backend, f(scalar_t, u, p), shape=tuple(u.shape))
    except Exception:
        return False
    return hasattr(value, "shape") and tuple(value.shape) == tuple(u.shape)


def _names_time_third(f: Callable[..., Any]) -> bool:
    """Whether ``f``'s third positional parameter is named ``t``, as in dxode's ``f(u, p, t)``
    (``False`` for a callable without a signature, or with ``*args``)."""
    try:
        parameters = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [q.name for q in parameters if q.kind in positional]
    return len(names) >= 3 and names[2] == "t"


def _changed(value: Any, u: Array) -> bool:
    """Whether an RHS result is not of ``u``'s shape and dtype (two comparisons a call)."""
    return getattr(value, "shape", None) != u.shape or getattr(value, "dtype", None) != u.dtype


def _changed_result(value: Any, u: Array) -> Exception:
    """The error for a result that no longer has the state's shape or dtype (as at first)."""
    if hasattr(value, "shape") and tuple(value.shape) == tuple(u.shape):
        return TypeError(
            f"f(u, p, t) returned dtype {value.dtype} for a {u.dtype} state after returning "
            f"{u.dtype} before; f must return du/dt in u's dtype on every call"
        )
    got = f"shape {tuple(value.shape)}" if hasattr(value, "shape") else type(value).__name__
    return ValueError(
        f"f(u, p, t) returned {got} for a state of shape {tuple(u.shape)} after returning "
        f"u's shape before; f must return du/dt with u's shape on every call"
    )


def lane_rhs(backend: Any, f: Callable[..., Any], p: Any) -> Callable[..., Array]:
    """Lane RHS for a batch of lanes: ``f`` sees the lanes-last batch ``u`` ``(*shape, L)``.

    Every call's result is checked against ``u``'s shape and dtype (two comparisons), so an
    ``f`` whose result changes fails instead of being broadcast or cast into a wrong answer.
    """

    def rhs(u: Array, t: Array, out: Array | None = None) -> Array:
        value = as_array(backend, f(u, p, t), out=out, shape=u.shape, dtype=u.dtype)
        if _changed(value, u):
            raise _changed_result(value, u)
        return value

    return rhs


class SingleLaneRHS:
    """Lane RHS for one trajectory: ``f`` sees the state without the lane axis.

    With more than one lane (dense output evaluated at several times of a method whose
    interpolant needs extra stages) ``f`` is called once per lane. Every result is checked
    against the state's shape and dtype, as in ``lane_rhs``. A class, not a closure, so that a
    solution's dense output, which keeps it, pickles (when ``f`` and ``p`` do).
    """

    def __init__(self, backend: Any, f: Callable[..., Any], p: Any) -> None:
        self.backend = backend
        self.f = f
        self.p = p

    def __call__(self, u: Array, t: Array, out: Array | None = None) -> Array:
        backend, f, p = self.backend, self.f, self.p
        if u.shape[-1] == 1:
            view = None if out is None else out[..., 0]
            state = u[..., 0]
            value = as_array(backend, f(state, p, t[0]), out=view, shape=state.shape, dtype=u.dtype)
            if value is view and out is not None:
                return out
            if _changed(value, state):
                raise _changed_result(value, state)
            return value[..., None]
        columns = []
        for i in range(u.shape[-1]):
            state = u[..., i]
            value = as_array(backend, f(state, p, t[i]), shape=state.shape, dtype=u.dtype)
            if _changed(value, state):
                raise _changed_result(value, state)
            columns.append(value)
        return backend.xp.stack(columns, axis=-1)
