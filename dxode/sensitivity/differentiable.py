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
from .._options import SolverOptions
from ..backends import get_backend, to_host
from ..ensemble.scheduling import map_batches_here
from ..solvers import AutoSwitch, ExplicitRungeKutta
from .algorithms import DiscreteAdjoint, InterpolatingAdjoint
from .augmented_jacobians import is_stiff
from .passes import BatchForward, BatchInputs, BatchRHS, on_backend, small_part

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
    save_grid: np.ndarray | None  # (nsave,) shared; None: each lane saves its t0 and t1
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
    backend: Any = "numpy"  # where batches compute: a backend or its name


@dataclasses.dataclass
class _Pass:
    """One differentiated solve: where its batches run, and what its forward pass left for
    the backward pass (the batches' records) and for the solution (the statistics).

    It travels to the VJP as an argument of the autograd primitive, so the records reach
    the backward pass with no registry; the VJP takes them over.
    """

    scheduler: Any = None  # an ensemble algorithm (its ``map_batches``); None: here
    records: list[_BatchRecord] | None = None
    outcome: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def map_batches(
        self, func: Any, batch_args: list[tuple], label: str, send_back: Any = None
    ) -> list[Any]:
        """``func`` over the batches in order, through the one batch-scheduling primitive."""
        if self.scheduler is None:
            return list(map_batches_here(func, batch_args, send_back))
        return list(self.scheduler.map_batches(func, batch_args, label=label, send_back=send_back))


@dataclasses.dataclass
class _BatchRecord:
    """What one batch's forward pass leaves for its backward pass."""

    lanes: slice  # the batch's lanes
    forward: Any  # the forward task's result (where it was computed: a Dask future there)
    retcode: np.ndarray
    leaves: list[Any]  # the batch's parameter leaf values


def traced_solve(
    static: _Static, u0_lanes: Any, diff_values: list[Any], scheduler: Any = None
) -> tuple[Any, dict[str, np.ndarray]]:
    """The saved states ``(L, nsave, *shape)`` as an autograd-traced function of its inputs,
    and the forward pass's statistics. ``scheduler`` runs the batches (``None``: here)."""
    from autograd.tracer import isbox

    static = dataclasses.replace(static, u0_diff=isbox(u0_lanes))
    run = _Pass(scheduler)
    return _solve_primitive(u0_lanes, *diff_values, static=static, run=run), run.outcome


def _make_primitive() -> Any:
    from autograd.extend import defjvp_argnums, defvjp_argnums, primitive

    @primitive
    def solve_primitive(u0_lanes: Array, *diff_values: Any, static: _Static, run: _Pass) -> Array:
        return _forward(static, run, np.asarray(u0_lanes), list(diff_values))

    def vjp_maker(argnums: tuple[int, ...], ans: Array, args: tuple, kwargs: dict) -> Any:
        static, run = kwargs["static"], kwargs["run"]
        records, run.records = run.records, None

        def vjp(g: Array) -> tuple[Any, ...]:
            _first_order_only(records, g)
            u0_bar, leaf_bars = _backward(static, run, records, np.asarray(g))
            grads = [u0_bar, *leaf_bars]
            return tuple(_like(grads[i], args[i]) for i in argnums)

        return vjp

    defvjp_argnums(solve_primitive, vjp_maker)
    defjvp_argnums(solve_primitive, _no_forward_mode)
    return solve_primitive


def _no_forward_mode(*_: Any) -> Any:
    """Refuse autograd's forward mode (``make_jvp``), which named only the internal primitive."""
    raise NotImplementedError(
        "forward-mode differentiation through solve (autograd.make_jvp) is not supported: "
        "use reverse mode (autograd.grad, autograd.jacobian of sol.u); for derivatives computed "
        "forward in time, pass sensealg=ForwardSensitivity()"
    )


def _first_order_only(records: list[_BatchRecord] | None, g: Array) -> None:
    """Refuse a second derivative: the backward pass is plain NumPy, not itself traced.

    Nested differentiation shows in two ways: the solve's inputs traced at two levels (the
    innermost level's VJP took the forward pass's records, so the outer one finds none), or
    a cotangent that is itself traced (it depends on what an outer level differentiates).
    """
    from autograd.tracer import isbox

    if records is None or isbox(g):
        raise NotImplementedError(
            "second derivatives through solve (autograd.hessian, a gradient of a gradient) "
            "are not supported: its backward pass is not differentiable. Differentiate once "
            "(for curvature, take finite differences of autograd.grad, or a Gauss-Newton "
            "approximation from autograd.jacobian of sol.u)"
        )


def _solve_primitive(*args: Any, static: _Static, run: _Pass) -> Any:
    global _PRIMITIVE
    if _PRIMITIVE is None:
        _PRIMITIVE = _make_primitive()
    return _PRIMITIVE(*args, static=static, run=run)


_PRIMITIVE: Any = None


def _leaves_with(static: _Static, diff_values: list[Any]) -> list[Any]:
    it = iter(diff_values)
    return [
        next(it) if d else leaf for leaf, d in zip(static.leaves, static.diff_leaf, strict=True)
    ]


def _forward(
    static: _Static, run: _Pass, u0_lanes: np.ndarray, diff_values: list[Any]
) -> np.ndarray:
    """Solve batch by batch; keep each batch's accepted steps for the backward pass.

    Each batch's steps stay where the batch ran (on a Dask worker: in its memory): only the
    saved states and statistics come back, and each batch's backward pass later runs where
    its steps are.
    """
    leaves = _leaves_with(static, [np.asarray(v) if np.ndim(v) else v for v in diff_values])
    n_lanes = u0_lanes.shape[-1]
    stops = _stops(static)
    task = _task_static(static)
    batches, batch_args = [], []
    for start in range(0, n_lanes, static.batch_size):
        lanes = slice(start, min(start + static.batch_size, n_lanes))
        batch_leaves = [
            leaf[..., lanes] if lane else leaf
            for leaf, lane in zip(leaves, static.lane_leaf, strict=True)
        ]
        batches.append((lanes, batch_leaves))
        batch_args.append(
            (task, u0_lanes[..., lanes], batch_leaves, static.t0[lanes], static.t1[lanes], stops)
        )
    done = run.map_batches(_forward_batch, batch_args, "forward", send_back=small_part)
    records, saved_parts, outcomes = [], [], []
    for (lanes, batch_leaves), ((saved, outcome), forward) in zip(batches, done, strict=True):
        saved_parts.append(saved)
        outcomes.append(outcome)
        records.append(_BatchRecord(lanes, forward, outcome["retcode"], batch_leaves))
    run.records = records
    run.outcome.update({k: np.concatenate([o[k] for o in outcomes]) for k in outcomes[0]})
    return np.concatenate(saved_parts)


def _stops(static: _Static) -> np.ndarray | None:
    """Times every lane steps to exactly: the problem's ``tstops`` and the save times, except
    where the discrete adjoint differentiates the dense output that fills them (methods whose
    interpolant needs no extra stages), so the steps are those of a solve without gradients."""
    parts = [] if static.tstops is None else [static.tstops]
    if static.save_grid is not None and static.sensealg.steps_onto_save_times(static.options):
        parts.append(static.save_grid)
    if not parts:
        return None
    stops = np.unique(np.concatenate(parts))
    return stops[::-1] if static.t1[0] < static.t0[0] else stops  # in the direction of time


def _task_static(static: _Static) -> _Static:
    """The static data a batch task needs: the parameter template without autograd boxes
    (those would travel with every task)."""
    from autograd.tracer import getval

    template = _pytree.map_leaves(getval, static.p_template)
    return dataclasses.replace(static, p_template=template)


def _forward_batch(
    static: _Static,
    u0: np.ndarray,
    leaves: list[Any],
    t0: np.ndarray,
    t1: np.ndarray,
    stops: np.ndarray | None,
) -> BatchForward:
    """One batch's forward pass (here or as a Dask task), as its sensitivity algorithm runs
    it: saved states, statistics, and the record its backward pass needs."""
    n = np.shape(u0)[-1]
    if static.save_grid is None:  # each lane's own ends
        save_grid = np.stack([np.asarray(t0), np.asarray(t1)])
    else:
        save_grid = np.repeat(to_host(static.save_grid)[:, None], n, axis=1)
    if static.sensealg.compiled:  # a compiled kernel takes the lanes
        return static.sensealg.forward_lanes(static, u0, leaves, t0, t1, save_grid, stops)
    backend = get_backend(static.backend)
    u0 = backend.asarray(u0)
    leaves = on_backend(backend, static, leaves)
    batch = BatchRHS.of(static, leaves, u0, t0, t1, save_grid, stops)
    inputs = BatchInputs(u0, t0, t1, batch.problem.save_times, stops)
    return static.sensealg.forward(static, batch, inputs)


def _backward(
    static: _Static, run: _Pass, records: list[_BatchRecord], g: np.ndarray
) -> tuple[np.ndarray, list[Any]]:
    """Each batch's backward pass, where its forward pass ran (only cotangents travel)."""
    task = _task_static(static)
    batch_args = [(task, r.forward, r.leaves, r.retcode, r.lanes, g[r.lanes]) for r in records]
    results = run.map_batches(_backward_task, batch_args, "backward")
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
    forward: BatchForward,
    leaves: list[Any],
    retcode: np.ndarray,
    lanes: slice,
    g: np.ndarray,
) -> tuple[np.ndarray, list[Any]]:
    """One batch's backward pass, as the algorithm that ran its forward pass runs it."""
    return forward.sensealg.backward(static, forward.record, leaves, retcode, static.t0[lanes], g)


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


def per_lane_span_sensealgs(alg: Any) -> str:
    """The sensitivity algorithms to name for lanes on per-trajectory spans through ``alg``
    (the continuous adjoints need one span; the discrete adjoint takes no stiff method)."""
    if is_stiff(alg):
        return f"sensealg=ForwardSensitivity() (DiscreteAdjoint() cannot differentiate {alg!r})"
    return "sensealg=DiscreteAdjoint() or ForwardSensitivity()"


def check_differentiable(
    options: SolverOptions,
    backend_name: str,
    sensealg: Any,
    vjp: Any = None,
    has_jacobians: bool = False,
) -> None:
    """Clear errors for combinations the sensitivity algorithms do not support."""
    alg = options.alg
    if isinstance(alg, AutoSwitch):
        raise NotImplementedError(
            f"gradients do not go through {alg!r}'s switches between methods: choose one "
            f"method, alg={alg.nonstiff!r} for a nonstiff problem or alg={alg.stiff!r} for a "
            "stiff one"
        )
    if is_stiff(alg):
        if sensealg.stiff_refusal:
            # the compiled kernels' algorithms subclass the user's (KernelDiscreteAdjoint)
            name = type(sensealg).__name__.removeprefix("Kernel")
            instead = (
                "ForwardSensitivity() (the compiled kernels' only one for stiff methods), or "
                "InterpolatingAdjoint() on the array path (kernel=False)"
                if sensealg.compiled
                else "InterpolatingAdjoint() (the default for stiff methods) or "
                "ForwardSensitivity()"
            )
            raise NotImplementedError(
                f"{name}() cannot differentiate through {alg!r}: {sensealg.stiff_refusal}; "
                f"use sensealg={instead}"
            )
    elif not isinstance(alg, ExplicitRungeKutta):
        raise NotImplementedError(f"gradients through {alg!r} are not supported yet")
    if backend_name == "numpy":
        return
    if not sensealg.off_numpy or is_stiff(alg):
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
