"""Adapters between the user's ``f(u, p, t)`` and the integrator's lane RHS ``rhs(u, t)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the solvers import this module (through the Jacobians)
    from ._solvers import LaneRHS

Array = Any


def as_array(backend: Any, value: Any, out: Array | None = None) -> Any:
    """The RHS output as an array: a list or tuple of rows is stacked along axis 0.

    Stacked rows go straight into ``out`` when given (saving a copy); an array is returned
    as it is, and the caller copies it where it belongs.
    """
    if type(value) in (list, tuple):
        return backend.stack_rows(value, out=out)
    return value


def checked_first_call(backend: Any, f: Callable[..., Any], u: Array, p: Any, t: Array) -> Array:
    """Call ``f(u, p, t)`` once and check what it returns before any integration work."""
    out = as_array(backend, f(u, p, t))
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise TypeError(
            f"f(u, p, t) must return an array (du/dt), got {type(out).__name__}; did it forget "
            f"to return?"
        )
    if tuple(out.shape) != tuple(u.shape):
        raise ValueError(
            f"f(u, p, t) returned shape {tuple(out.shape)} for a state of shape "
            f"{tuple(u.shape)}; it must return du/dt with u's shape"
        )
    if str(out.dtype) == "object":
        raise TypeError(
            "f(u, p, t) returned an object array: a plain `numpy` function was applied to a "
            "traced autograd value; use `autograd.numpy` in f instead"
        )
    if out.dtype != u.dtype:
        raise TypeError(
            f"f(u, p, t) returned dtype {out.dtype} for a {u.dtype} state; keep it in u's "
            f"dtype (use Python floats for constants, or cast parameters to {u.dtype})"
        )
    return out


def single_lane_rhs(backend: Any, f: Callable[..., Any], p: Any) -> LaneRHS:
    """Lane RHS for one trajectory: ``f`` sees the state without the lane axis.

    With more than one lane (dense output evaluated at several times of a method whose
    interpolant needs extra stages) ``f`` is called once per lane.
    """

    xp = backend.xp

    def rhs(u: Array, t: Array, out: Array | None = None) -> Array:
        if u.shape[-1] == 1:
            view = None if out is None else out[..., 0]
            value = as_array(backend, f(u[..., 0], p, t[0]), out=view)
            return out if value is view and out is not None else value[..., None]
        columns = [as_array(backend, f(u[..., i], p, t[i])) for i in range(u.shape[-1])]
        return xp.stack(columns, axis=-1)

    return rhs
