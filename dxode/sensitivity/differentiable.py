"""``solve`` as an autograd primitive: the forward pass records its steps, the VJP replays them.

When a problem's ``u0`` or parameters carry autograd values (the user differentiates a loss
built from them), ``solve`` routes here. Traced inputs are split off as the primitive's
arguments; everything else (the RHS, the untraced parameter leaves, the options) is static.
The primitive returns the saved states, so the loss traces through ``sol.u`` / ``sim.u``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import _pytree
from .._derivatives import Derivatives
from .._lane_problem import lane_problem, lane_rhs_for, lane_values, parameters_for
from .._options import SolverOptions
from .._retcode import ReturnCode
from .._traced_rhs import TracedRHS
from ..backends import get_backend, to_host
from ..integrator.loop import LaneProblem, integrate
from ..solvers import ExplicitRungeKutta
from . import continuous_adjoint, forward_sensitivity, stability
from .algorithms import (
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardSensitivity,
    InterpolatingAdjoint,
)
from .augmented_jacobians import is_stiff
from .discrete_adjoint import backward

Array = Any


@dataclasses.dataclass
class _Static:
    """What the primitive needs besides its traced arguments (never differentiated)."""

    f: Any
    vjp: Any  # the problem's hand-written VJP, or None for autograd
    p_template: Any
    leaves: list[Any]  # untraced leaf values; traced positions are filled per call
    lane_leaf: list[bool]
    diff_leaf: list[bool]
    single_lane: bool
    t0: np.ndarray  # (L,)
    t1: np.ndarray
    save_grid: np.ndarray  # (nsave,)
    tstops: np.ndarray | None
    options: SolverOptions
    batch_size: int
    dtype: Any
    sensealg: Any = dataclasses.field(default_factory=DiscreteAdjoint)
    # Whether sensealg is dxode's default: a stability-limited explicit solve then switches
    # from DiscreteAdjoint to InterpolatingAdjoint instead of refusing (see _stability).
    default_sensealg: bool = False
    jac: Any = None  # the problem's jac and tgrad (stiff methods)
    tgrad: Any = None
    paramjac: Any = None  # with jac: the derivatives of f without autograd
    u0_diff: bool = True  # whether u0 is differentiated (forward sensitivities skip it if not)
    client: Any = None  # a Dask client: batches run as tasks on its workers
    backend: Any = "numpy"  # where batches compute: a backend or its name
    outcome: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def traced_solve(static: _Static, u0_lanes: Any, diff_values: list[Any]) -> Any:
    """The saved states ``(L, nsave, *shape)`` as an autograd-traced function of its inputs."""
    from autograd.tracer import isbox

    static.u0_diff = isbox(u0_lanes)
    return _solve_primitive(u0_lanes, *diff_values, static=static)


def _make_primitive() -> Any:
    from autograd.extend import defvjp_argnums, primitive

    @primitive
    def solve_primitive(u0_lanes: Array, *diff_values: Any, static: _Static) -> Array:
        saved, records = _forward(static, np.asarray(u0_lanes), list(diff_values))
        _PENDING[id(saved)] = records
        return saved

    def vjp_maker(argnums: tuple[int, ...], ans: Array, args: tuple, kwargs: dict) -> Any:
        records = _PENDING.pop(id(ans))
        static = kwargs["static"]

        def vjp(g: Array) -> tuple[Any, ...]:
            u0_bar, leaf_bars = _backward(static, records, list(args[1:]), np.asarray(g))
            grads = [u0_bar, *leaf_bars]
            return tuple(_like(grads[i], args[i]) for i in argnums)

        return vjp

    defvjp_argnums(solve_primitive, vjp_maker)
    return solve_primitive


_PENDING: dict[int, Any] = {}  # forward records, handed to the VJP made right after the forward


def _solve_primitive(*args: Any, static: _Static) -> Any:
    global _PRIMITIVE
    if _PRIMITIVE is None:
        _PRIMITIVE = _make_primitive()
    return _PRIMITIVE(*args, static=static)


_PRIMITIVE: Any = None


def _leaves_with(static: _Static, diff_values: list[Any]) -> list[Any]:
    it = iter(diff_values)
    return [
        next(it) if d else leaf for leaf, d in zip(static.leaves, static.diff_leaf, strict=True)
    ]


def _forward(
    static: _Static, u0_lanes: np.ndarray, diff_values: list[Any]
) -> tuple[np.ndarray, list]:
    """Solve batch by batch; keep each batch's accepted steps for the backward pass.

    With a Dask client the batches are tasks and their steps stay in the workers' memory:
    only the saved states and statistics travel, and each batch's backward pass later runs
    where its steps are.
    """
    leaves = _leaves_with(static, [np.asarray(v) if np.ndim(v) else v for v in diff_values])
    n_lanes = u0_lanes.shape[-1]
    stops = _stops(static)
    task = _without_client(static)
    batches = []
    for start in range(0, n_lanes, static.batch_size):
        lanes = slice(start, min(start + static.batch_size, n_lanes))
        batch_leaves = [
            leaf[..., lanes] if lane else leaf
            for leaf, lane in zip(leaves, static.lane_leaf, strict=True)
        ]
        args = (task, u0_lanes[..., lanes], batch_leaves, static.t0[lanes], static.t1[lanes], stops)
        if static.client is None:
            batches.append((lanes, batch_leaves, _forward_batch(*args)))
        else:
            batches.append((lanes, batch_leaves, static.client.submit(_forward_batch, *args)))
    if static.client is None:
        small = [(result[0], result[2]) for _, _, result in batches]
    else:  # one round trip for all batches' saved states and statistics
        small = static.client.gather(
            [static.client.submit(_small_part, result) for _, _, result in batches]
        )
    records, saved_parts, outcomes = [], [], []
    for (lanes, batch_leaves, result), (saved, outcome) in zip(batches, small, strict=True):
        saved_parts.append(saved)
        outcomes.append(outcome)
        records.append((lanes, result, outcome["retcode"], batch_leaves))
    static.outcome.update({k: np.concatenate([o[k] for o in outcomes]) for k in outcomes[0]})
    return np.concatenate(saved_parts), records


def _stops(static: _Static) -> np.ndarray | None:
    """Times every lane steps to exactly: the problem's ``tstops`` and the save times, except
    where the discrete adjoint differentiates the dense output that fills them (methods whose
    interpolant needs no extra stages), so the steps are those of a solve without gradients."""
    parts = [] if static.tstops is None else [static.tstops]
    if (
        not isinstance(static.sensealg, DiscreteAdjoint)
        or static.options.alg.interpolation_rhs_evals
    ):
        parts.append(static.save_grid)
    if not parts:
        return None
    stops = np.unique(np.concatenate(parts))
    return stops[::-1] if static.t1[0] < static.t0[0] else stops  # in the direction of time


def _without_client(static: _Static) -> _Static:
    """The static data a batch task needs: no client, and a parameter template without
    autograd boxes (those would travel with every task)."""
    from autograd.tracer import getval

    template = _pytree.map_leaves(getval, static.p_template)
    return dataclasses.replace(static, client=None, outcome={}, p_template=template)


def _small_part(result: tuple) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """What a forward task sends back: the saved states and the statistics, not the steps."""
    return result[0], result[2]


def _forward_batch(
    static: _Static,
    u0: np.ndarray,
    leaves: list[Any],
    t0: np.ndarray,
    t1: np.ndarray,
    stops: np.ndarray | None,
) -> tuple[np.ndarray, Any, dict[str, np.ndarray]]:
    """One batch's forward pass (here or as a Dask task): saved states, what the backward
    pass needs (the method's record), statistics."""
    backend = get_backend(static.backend)
    u0 = backend.asarray(u0)
    leaves = _on_backend(backend, static, leaves)
    n = u0.shape[-1]
    problem = lane_problem(
        backend,
        _functions(static),
        parameters_for(static.p_template, leaves, static.lane_leaf),
        lane_values(leaves, static.lane_leaf),
        u0,
        t0,
        t1,
        stepper=static.options.alg,
        save_grid=np.repeat(to_host(static.save_grid)[:, None], n, axis=1),
        record_steps="",
        tstops=stops,
    )
    batch = BatchRHS.of(problem, static, leaves)
    dtype = u0.dtype
    save_times = problem.save_times
    alg = static.sensealg
    if isinstance(alg, ForwardSensitivity):
        saved, payload, result = forward_sensitivity.forward(
            static, batch, u0, t0, t1, save_times, stops.astype(dtype)
        )
    else:
        if isinstance(alg, DiscreteAdjoint):
            record = "trials"  # the backward pass replays every iteration
        else:
            record = "dense" if isinstance(alg, InterpolatingAdjoint) else ""
        checkpoint_every = getattr(alg, "checkpoint_every", None) or 0
        problem = dataclasses.replace(
            problem, record_steps=record, checkpoint_every=checkpoint_every
        )
        result = integrate(problem, static.options, batch.backend)
        saved = to_host(result.saved)
        if isinstance(alg, DiscreteAdjoint) and static.options.adaptive:
            # Fixed steps are not controlled: their derivative is that of the loss.
            alg = _trusted_or_switched(static, backend, batch, result, n)
            if isinstance(alg, InterpolatingAdjoint):  # the same steps again, with stages
                dense = dataclasses.replace(problem, record_steps="dense")
                result = integrate(dense, static.options, batch.backend)
        if isinstance(alg, BacksolveAdjoint):
            payload = saved
        elif isinstance(alg, InterpolatingAdjoint):
            payload = result.steps or _no_steps(backend, u0)
        else:
            payload = result.trials or []
    outcome = {k: to_host(getattr(result, k)) for k in ("retcode", "nf", "naccept", "nreject")}
    return saved, payload, outcome, alg


_SUCCEEDED = (int(ReturnCode.Success), int(ReturnCode.Terminated))


def _trusted_or_switched(
    static: _Static, backend: Any, batch: BatchRHS, result: Any, n_lanes: int
) -> Any:
    """``static.sensealg`` (a ``DiscreteAdjoint``) if no successful lane's steps were limited
    by stability (failed lanes get NaN gradients anyway); otherwise ``InterpolatingAdjoint()``
    for the default sensealg where it can run, else a ``ValueError`` naming the fixes (see
    ``_stability``)."""
    alg = static.options.alg
    interval = alg.tableau.real_stability_interval
    succeeded = np.isin(to_host(result.retcode), _SUCCEEDED)
    limited, rho = stability.stability_limited(
        backend, batch.rhs_for, batch.params, result.trials or [], succeeded, interval
    )
    if not limited.any():
        return static.sensealg
    shared_span = bool(np.all(static.t0 == static.t0[0]) and np.all(static.t1 == static.t1[0]))
    if static.default_sensealg and backend.name == "numpy" and shared_span:
        return InterpolatingAdjoint()
    if not static.default_sensealg:
        why = (
            "Use sensealg=InterpolatingAdjoint() or ForwardSensitivity() (accurate to the "
            "tolerance)."
        )
    elif backend.name != "numpy":
        why = "The default would switch to InterpolatingAdjoint(), which runs on NumPy only."
    else:
        why = (
            "The default would switch to InterpolatingAdjoint(), which needs one tspan for all "
            "trajectories: use sensealg=ForwardSensitivity() (accurate to the tolerance)."
        )
    n_limited = int(limited.sum())
    raise stability.refusal(static.sensealg, alg, n_limited, n_lanes, interval, rho, why)


def _on_backend(backend: Any, static: _Static, leaves: list[Any]) -> list[Any]:
    """A batch's parameter leaves where it computes: per-lane and differentiated array leaves
    move to the backend; other leaves stay as the user gave them."""
    if backend.name == "numpy":
        return leaves
    return [
        backend.asarray(leaf) if (lane or diff) and np.ndim(leaf) else leaf
        for leaf, lane, diff in zip(leaves, static.lane_leaf, static.diff_leaf, strict=True)
    ]


@dataclasses.dataclass
class BatchRHS:
    """A batch's plain (untraced) lane RHS: ``rhs_for(params)`` for the per-lane leaves."""

    backend: Any
    rhs_for: Any
    params: tuple
    lane_positions: list[int]
    f0: np.ndarray
    leaves: list[Any]  # the batch's parameter leaf values (per-lane ones lanes-last)

    @classmethod
    def of(cls, problem: LaneProblem, static: _Static, leaves: list[Any]) -> BatchRHS:
        """The plain RHS of a batch's lane problem (its parameter leaves ``leaves``)."""
        lane_positions = [i for i, lane in enumerate(static.lane_leaf) if lane]
        backend = get_backend(static.backend)
        return cls(backend, problem.rhs_for, problem.params, lane_positions, problem.f0, leaves)


def plain_rhs_for(static: _Static, leaves: list[Any]) -> Any:
    """``rhs_for(params)``: the untraced lane RHS for the per-lane leaf values ``params``.

    For a stiff method the RHS carries the problem's derivatives (``jac``, ``tgrad``, ``vjp``),
    so its Jacobians are computed as in a solve without gradients.
    """
    return lane_rhs_for(
        get_backend(static.backend),
        _functions(static),
        parameters_for(static.p_template, leaves, static.lane_leaf),
        is_stiff(static.options.alg),
    )


def _functions(static: _Static) -> Derivatives:
    """The problem's ``f`` and derivative functions, as a batch's lanes call them."""
    return Derivatives(
        static.f, static.jac, static.tgrad, static.vjp, single_lane=static.single_lane
    )


def _no_steps(backend: Any, u0: Array) -> dict[str, Array]:
    xp = backend.xp
    empty = xp.zeros(0, dtype=u0.dtype)
    return {
        "lane": xp.zeros(0, dtype=xp.int64),
        "t": empty,
        "h": empty,
        "t_end": empty,
        "u0": xp.zeros((*u0.shape[:-1], 0), dtype=u0.dtype),
    }


def _backward(
    static: _Static, records: list, diff_values: list[Any], g: np.ndarray
) -> tuple[np.ndarray, list[Any]]:
    task = _without_client(static)
    results = []
    for lanes, forward, retcode, batch_leaves in records:
        args = (task, forward, batch_leaves, retcode, lanes, g[lanes])
        if static.client is None:
            results.append(_backward_task(*args))
        else:  # runs where the batch's steps are; only cotangents travel
            results.append(static.client.submit(_backward_task, *args))
    if static.client is not None:
        results = static.client.gather(results)
    u0_bar = np.concatenate([u0 for u0, _ in results], axis=-1)
    diff_positions = [i for i, d in enumerate(static.diff_leaf) if d]
    leaf_bars = []
    for j, i in enumerate(diff_positions):
        parts = [bars[j] for _, bars in results]
        # Per-lane leaves: the batches' pieces side by side; shared ones: summed in batch order.
        leaf_bars.append(np.concatenate(parts, axis=-1) if static.lane_leaf[i] else sum(parts))
    return u0_bar, leaf_bars


def _backward_task(
    static: _Static,
    forward: tuple,
    batch_leaves: list[Any],
    retcode: np.ndarray,
    lanes: slice,
    g: np.ndarray,
) -> tuple[np.ndarray, list[Any]]:
    """One batch's backward pass."""
    rhs = traced_rhs(static)
    alg = forward[3]  # the batch's sensitivity algorithm (the default may have switched)
    if alg is not static.sensealg:
        static = dataclasses.replace(static, sensealg=alg)
    save_grid = static.save_grid.astype(g.dtype)
    if isinstance(alg, ForwardSensitivity):
        return forward_sensitivity.contract(static, forward[1], retcode, g)
    if isinstance(alg, (InterpolatingAdjoint, BacksolveAdjoint)):
        return continuous_adjoint.backward(
            static,
            rhs,
            plain_rhs_for(static, batch_leaves),
            forward[1],
            batch_leaves,
            save_grid,
            static.t0[lanes],
            retcode,
            g,
        )
    backend = get_backend(static.backend)
    batch_leaves = _on_backend(backend, static, batch_leaves)
    u0_bar, leaf_bars = backward(
        backend,
        static.options.alg,
        rhs,
        forward[1],
        batch_leaves,
        save_grid,
        static.t0[lanes],
        retcode,
        backend.asarray(g),
        rhs_for=plain_rhs_for(static, batch_leaves) if alg.checkpoint_every else None,
    )
    return to_host(u0_bar), [to_host(bar) for bar in leaf_bars]


def traced_rhs(static: _Static) -> TracedRHS:
    """The batch RHS with its derivatives (autograd, or the problem's ``vjp``)."""
    return TracedRHS(
        static.f,
        static.p_template,
        static.lane_leaf,
        static.diff_leaf,
        static.single_lane,
        vjp=static.vjp,
        backend=get_backend(static.backend),
        jac=static.jac,
        paramjac=static.paramjac,
    )


def _like(grad: Any, arg: Any) -> Any:
    """A cotangent shaped and typed like the argument it belongs to."""
    if np.ndim(arg) == 0:
        return np.asarray(grad, dtype=np.result_type(arg, np.float32)).reshape(())
    return np.asarray(grad).reshape(np.shape(arg)).astype(np.result_type(arg), copy=False)


def default_sensealg(alg: Any) -> Any:
    """The sensitivity algorithm used when none is given: the discrete adjoint for explicit
    methods (the interpolating adjoint for a batch whose steps were limited by stability,
    see ``_stability``), the interpolating adjoint for stiff ones."""
    return InterpolatingAdjoint() if is_stiff(alg) else DiscreteAdjoint()


def check_differentiable(
    options: SolverOptions,
    backend_name: str,
    sensealg: Any,
    vjp: Any = None,
    has_jacobians: bool = False,
) -> None:
    """Clear errors for combinations the sensitivity algorithms do not support."""
    alg = options.alg
    if is_stiff(alg):
        if isinstance(sensealg, DiscreteAdjoint):
            raise NotImplementedError(
                f"DiscreteAdjoint() cannot differentiate through {alg!r}: replaying its steps "
                "backward would need the derivative of the Jacobian inside every step; use "
                "sensealg=InterpolatingAdjoint() (the default for stiff methods) or "
                "ForwardSensitivity()"
            )
        if isinstance(sensealg, BacksolveAdjoint):
            raise NotImplementedError(
                f"BacksolveAdjoint() cannot differentiate through {alg!r}: integrating a stiff "
                "problem's state backward in time is unstable (its fast decaying modes grow "
                "backward), so the recomputed states and the gradient are wrong; use "
                "sensealg=InterpolatingAdjoint() (the default for stiff methods) or "
                "ForwardSensitivity()"
            )
    elif not isinstance(alg, ExplicitRungeKutta):
        raise NotImplementedError(f"gradients through {alg!r} are not supported yet")
    if backend_name == "numpy":
        return
    if not isinstance(sensealg, DiscreteAdjoint) or is_stiff(alg):
        raise NotImplementedError(
            f"on the {backend_name} backend gradients are computed with DiscreteAdjoint() "
            f"through an explicit method; {sensealg!r} with {alg!r} runs on NumPy only"
        )
    if vjp is None and not has_jacobians:
        raise NotImplementedError(
            f"on the {backend_name} backend autograd cannot trace f: give the problem its "
            "vector-Jacobian product, ODEProblem(..., vjp=vjp) with vjp(u, p, t, v) -> "
            "(u_bar, p_bar), or its jac and paramjac, written with the arrays' own namespace "
            "(see the gradients guide)"
        )
