"""Snapshots of the problems a ``prob_func`` returns, so later in-place changes cannot alias.

A ``prob_func`` written in the style of DifferentialEquations.jl may change the ensemble's
problem in place and return it (``prob.u0[:] = ...; return prob``). Every trajectory then
returns the same object, and a batch built from them all would give every trajectory the
last values. So each returned problem is replaced, right after the call, by a shallow copy
whose ``u0`` and parameter leaves are frozen as they were at that moment.

Copies are made only where needed: a mutable array that is the very object trajectory 0's
problem held and still has trajectory 0's values is replaced by trajectory 0's copy (so a
leaf every trajectory shares, such as a fitted weight vector, stays one shared object and
costs one comparison per trajectory, not one copy); any other mutable array is copied.
Traced autograd values, numbers and tuples are immutable and kept as they are; other
objects (a user's class instance as ``p``) cannot be snapshotted and are kept as well.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _pytree
from .._problem import ODEProblem

__all__ = ["snapshot"]


def snapshot(prob: ODEProblem, first: ODEProblem | None) -> ODEProblem:
    """``prob`` with its ``u0`` and parameter leaves frozen (see the module docstring).

    ``first`` is trajectory 0's snapshot (``None`` while trajectory 0 itself is taken); its
    values are reused where ``prob`` still holds the same objects with the same values.
    """
    u0_origin = prob.u0
    leaf_origins = _pytree.leaves(prob.p)
    if first is None:
        u0 = _copy(u0_origin)
        leaves = [_copy(leaf) for leaf in leaf_origins]
    else:
        first_u0_origin, first_leaf_origins = first._snapshot_origins  # type: ignore[attr-defined]
        first_leaves = _pytree.leaves(first.p)
        u0 = _frozen(u0_origin, first_u0_origin, first.u0)
        leaves = [
            _frozen(leaf, origin, frozen)
            for leaf, origin, frozen in zip(
                leaf_origins, first_leaf_origins, first_leaves, strict=True
            )
        ]
    new = object.__new__(type(prob))
    new.__dict__.update(prob.__dict__)
    new.u0 = u0
    new.p = _pytree.rebuild(prob.p, leaves)  # fresh containers: a dict changed later too
    new.__dict__.pop("_snapshot_origins", None)
    if first is None:  # what later trajectories are compared with (only trajectory 0's)
        new._snapshot_origins = (u0_origin, leaf_origins)  # type: ignore[attr-defined]
    return new


def _frozen(value: Any, first_origin: Any, first_frozen: Any) -> Any:
    """``value`` frozen: trajectory 0's frozen copy where ``value`` is the same object with
    the same values, else a copy (or ``value`` itself when it is immutable)."""
    if not _mutable(value):
        return value
    if value is first_origin and _equal(value, first_frozen):
        return first_frozen
    return _copy(value)


def _mutable(value: Any) -> bool:
    """Whether ``value`` is an array that can be changed in place (NumPy, CuPy, any
    array-API array); traced autograd values are not."""
    if isinstance(value, np.ndarray):
        return value.dtype != object
    import array_api_compat
    from autograd.tracer import isbox

    return not isbox(value) and array_api_compat.is_array_api_obj(value)


def _copy(value: Any) -> Any:
    if not _mutable(value):
        return value
    if isinstance(value, np.ndarray):
        return value.copy()
    copy = getattr(value, "copy", None)  # CuPy's asarray takes no copy argument before 14
    if callable(copy):
        return copy()
    return _namespace(value).asarray(value, copy=True)


def _equal(a: Any, b: Any) -> bool:
    """Whether two arrays of one library have the same shape and values."""
    if isinstance(a, np.ndarray):
        if not isinstance(b, np.ndarray) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        return a.tobytes() == b.tobytes() if a.size <= 4096 else bool((a == b).all())
    if type(a) is not type(b) or tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    return bool(_namespace(a).all(a == b))


def _namespace(value: Any) -> Any:
    import array_api_compat

    return array_api_compat.array_namespace(value)
