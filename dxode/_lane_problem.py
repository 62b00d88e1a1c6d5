"""The one builder of a lane problem: what the integrator runs for a batch, or one trajectory.

A plain single solve, an ensemble batch and a differentiated batch all describe their lanes
the same way: the problem's functions (``Derivatives``), the parameters as ``p_for(params)``
for the per-lane leaf values ``params``, the lanes' states and spans, a save grid and stops.
``lane_problem`` turns that into the integrator's ``LaneProblem`` (evaluating and checking
``f`` once at the start), and ``lane_rhs_for`` into its ``rhs_for``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _pytree
from ._derivatives import Derivatives, LaneFunction
from ._jacobian_check import check_user_jacobian, jacobian_disagreement, uses_problem_jac
from ._rhs import SingleLaneRHS, checked_first_call, lane_rhs
from .backends import get_backend, to_host
from .events.lanes import LaneEvents
from .integrator.loop import LaneProblem

Array = Any
PFor = Callable[[tuple[Array, ...]], Any]


def parameters_for(template: Any, leaves: list[Any], lane_leaf: list[bool]) -> PFor:
    """``p_for(params)``: the pytree ``template`` with ``leaves``, its per-lane leaves (those
    marked in ``lane_leaf``, lanes last) replaced by ``params`` (after lane compaction). A
    partial of a module function, so that it pickles (an ensemble's dense output keeps it)."""
    return functools.partial(_rebuild_parameters, template, leaves, lane_leaf)


def _rebuild_parameters(
    template: Any, leaves: list[Any], lane_leaf: list[bool], params: tuple[Array, ...]
) -> Any:
    it = iter(params)
    new = [next(it) if lane else leaf for leaf, lane in zip(leaves, lane_leaf, strict=True)]
    return _pytree.rebuild(template, new)


def lane_values(leaves: list[Any], lane_leaf: list[bool]) -> tuple[Array, ...]:
    """The per-lane leaves of a parameter pytree, in order."""
    return tuple(leaf for leaf, lane in zip(leaves, lane_leaf, strict=True) if lane)


def lane_rhs_for(
    backend: Any, functions: Derivatives, p_for: PFor, with_jacobians: bool
) -> Callable[[tuple[Array, ...]], Any]:
    """``rhs_for(params)``: the lane RHS of ``functions.f`` for the per-lane values ``params``.

    For a method that needs Jacobians the RHS carries the problem's derivatives. A single
    trajectory (``functions.single_lane``) has no per-lane values: its RHS is made once.
    """
    if functions.single_lane:
        p = p_for(())
        rhs = SingleLaneRHS(backend, functions.f, p)
        if with_jacobians:
            rhs = LaneFunction(rhs, p, functions)
        return lambda params: rhs

    def rhs_for(params: tuple[Array, ...]) -> Any:
        p = p_for(params)
        rhs = lane_rhs(backend, functions.f, p)
        return LaneFunction(rhs, p, functions) if with_jacobians else rhs

    return rhs_for


def first_value(backend: Any, functions: Derivatives, p: Any, u0: Array, t0: Array) -> Array:
    """``f(u0, p, t0)`` for lanes ``u0`` ``(*shape, L)``, checked before any integration."""
    if functions.single_lane:
        return checked_first_call(backend, functions.f, u0[..., 0], p, t0[0])[..., None]
    return checked_first_call(backend, functions.f, u0, p, t0)


def check_jac_on_host(f: Any, jac: Any, u0: Any, p: Any, t0: float, method: Any) -> None:
    """``jac`` checked against ``f`` at one trajectory's start (``u0`` ``(n,)``, ``p`` its
    parameters) on the host, as ``lane_problem`` checks its lanes (``_jacobian_check``): for
    the compiled kernels, which build no lane problem. Where ``f`` or ``jac`` cannot be called
    from Python as written, or ``jac`` returns the wrong shape, nothing is checked: the
    kernel reports those itself, naming the line."""
    if not uses_problem_jac(method, jac):
        return
    backend = get_backend("numpy")
    functions = Derivatives(f, jac, single_lane=True)
    u = np.asarray(to_host(u0))[:, None]
    t = np.array([t0], dtype=u.dtype)
    rhs = lane_rhs_for(backend, functions, lambda params: p, True)(())
    try:
        f0 = first_value(backend, functions, p, u, t)
        message = jacobian_disagreement(backend, rhs, u, t, f0)
    except Exception:  # the kernel's to report (see above)
        return
    if message is not None:
        raise ValueError(message)


def lane_problem(
    backend: Any,
    functions: Derivatives,
    p_for: PFor,
    params: tuple[Array, ...],
    u0: Array,
    t0: np.ndarray,
    t1: np.ndarray,
    *,
    stepper: Any,
    save_grid: np.ndarray | None,
    record_steps: str,
    tstops: np.ndarray | None = None,
    callbacks: Any = None,
    checkpoint_every: int = 0,
    f0: Array | None = None,
) -> LaneProblem:
    """The integrator's problem for lanes ``u0`` ``(*shape, L)`` on spans ``t0``, ``t1`` (host
    ``(L,)`` arrays), saving at ``save_grid`` (host ``(nsave, L)``, or ``None``) and stepping
    to ``tstops`` (host ``(K,)``); times take the state's dtype. ``f`` is evaluated (and
    checked) once at the start unless its value ``f0`` is given; ``stepper`` says whether
    the RHS carries the derivatives, and whether the problem's ``jac`` is checked at ``u0``
    (``_jacobian_check``)."""
    dtype = u0.dtype
    t0_lanes = backend.asarray(t0, dtype=dtype)
    rhs_for = lane_rhs_for(backend, functions, p_for, bool(stepper.jacobians_per_step))
    if f0 is None:
        f0 = first_value(backend, functions, p_for(params), u0, t0_lanes)
    if uses_problem_jac(stepper, functions.jac):
        check_user_jacobian(backend, rhs_for(params), u0, t0_lanes, f0)
    return LaneProblem(
        rhs_for=rhs_for,
        u0=u0,
        t0=t0_lanes,
        t1=backend.asarray(t1, dtype=dtype),
        params=params,
        save_times=None if save_grid is None else backend.asarray(save_grid, dtype=dtype),
        record_steps=record_steps,
        tstops=None if tstops is None else backend.asarray(tstops, dtype=dtype),
        f0=f0,
        checkpoint_every=checkpoint_every,
        events=None if callbacks is None else LaneEvents(callbacks, p_for, functions.single_lane),
    )
