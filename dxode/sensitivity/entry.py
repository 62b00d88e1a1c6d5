"""From a traced problem or ensemble to the differentiable primitive, and back to a solution."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _pytree
from .._options import SolverOptions
from .._problem import ODEProblem
from .._retcode import ReturnCode
from .._solution import ODESolution, SolverStats
from .._timegrid import lane_save_grid, lane_stop_times, stop_times
from ..backends import backend_for, get_backend, to_host
from ..ensemble.problem import EnsembleProblem, per_trajectory_leaves
from ..ensemble.solution import EnsembleSolution, EnsembleStats
from ..events.callbacks import CallbackSet
from ..events.record import with_points_after
from .differentiable import (
    _Static,
    check_differentiable,
    default_sensealg,
    per_lane_span_sensealgs,
    traced_solve,
)
from .event_segments import solve_segmented


def untraced_problem(prob: ODEProblem) -> ODEProblem:
    """``prob`` with the values autograd traces in ``u0`` and ``p`` replaced by their values."""
    from autograd.tracer import getval

    return prob.remake(u0=getval(prob.u0), p=_pytree.map_leaves(getval, prob.p))


def solve_single_traced(
    prob: ODEProblem,
    opts: SolverOptions,
    saveat: Any,
    tstops: Any,
    sensealg: Any,
    callbacks: Any,
    plain_steps: Callable[[ODEProblem, Any], Any],
) -> ODESolution:
    """``solve`` for a problem whose ``u0`` or ``p`` is being differentiated (with
    ``callbacks``, a ``CallbackSet``, or ``None``). Without ``saveat`` it saves what the solve
    without gradients saves: its times ``plain_steps(problem, callbacks)`` (every step, and
    with callbacks the events' after-states), held fixed."""
    import autograd.numpy as anp
    from autograd.tracer import getval, isbox

    by_default = sensealg is None
    sensealg = sensealg or default_sensealg(opts.alg)
    check_differentiable(opts, _backend_name(prob.u0), sensealg, prob.vjp, _has_jacobians(prob))
    t0, t1 = prob.tspan
    every_step = saveat is None
    if every_step:
        direction = 1.0 if t1 > t0 else -1.0
        steps = to_host(plain_steps(untraced_problem(prob), callbacks)).astype(np.float64)
        # The steps' times are in the state's dtype, so float32(t1) may lie past t1 (1.1):
        # clipped to the span, they round back to the same times.
        steps = np.clip(steps, min(t0, t1), max(t0, t1))
        saveat = direction * np.unique(direction * steps)  # an event's time once: its step end
    grid = lane_save_grid(saveat, np.array([t0]), np.array([t1]))[:, 0]
    leaves = _pytree.leaves(prob.p)
    diff = [isbox(leaf) for leaf in leaves]
    static = _Static(
        f=prob.f,
        vjp=prob.vjp,
        p_template=prob.p,
        leaves=[getval(leaf) for leaf in leaves],
        lane_leaf=[False] * len(leaves),
        diff_leaf=diff,
        single_lane=True,
        t0=np.array([t0]),
        t1=np.array([t1]),
        save_grid=grid,
        tstops=stop_times(tstops, t0, t1),
        options=opts,
        batch_size=1,
        dtype=_host_dtype(prob.u0),
        sensealg=sensealg,
        default_sensealg=by_default,
        jac=prob.jac,
        tgrad=prob.tgrad,
        paramjac=prob.paramjac,
    )
    u0_lanes = anp.expand_dims(prob.u0, -1)
    diff_values = [leaf for leaf, d in zip(leaves, diff, strict=True) if d]
    t, events = grid.astype(static.dtype), None
    if callbacks is None:
        saved, out = traced_solve(static, u0_lanes, diff_values)
        u = saved[0]
    else:
        run = solve_segmented(static, callbacks, u0_lanes, diff_values)
        u, out, events = run.saved[0], run.outcome, run.events
        if every_step:
            times = dataclasses.replace(events, t=getval(events.t))
            t, u = with_points_after(t, u, times, callbacks)
    stats = SolverStats(int(out["nf"][0]), int(out["naccept"][0]), int(out["nreject"][0]))
    return ODESolution(
        t,
        u,
        ReturnCode(int(out["retcode"][0])),
        stats,
        prob,
        opts.alg,
        None,
        events,
    )


def solve_ensemble_traced(
    eprob: EnsembleProblem,
    opts: SolverOptions,
    n: int,
    batch_size: int,
    saveat: Any,
    tstops: Any,
    seed: int,
    lanes_per_batch: int | None,
    scheduler: Any = None,
    sensealg: Any = None,
    backend: str | None = None,
    callbacks: Any = None,
) -> EnsembleSolution:
    """``solve`` for an ensemble whose trajectories depend on differentiated values (with
    ``callbacks``, a ``CallbackSet``, or ``None``)."""
    import autograd.numpy as anp
    from autograd.tracer import getval, isbox

    if eprob.output_func is not None or eprob.reduction is not None:
        raise NotImplementedError(
            "gradients through output_func or reduction are not supported yet: compute the "
            "loss from sim.u instead"
        )
    prob = eprob.prob
    by_default = sensealg is None
    sensealg = sensealg or default_sensealg(opts.alg)
    backend = backend or _compute_backend(prob.u0)
    check_differentiable(opts, get_backend(backend).name, sensealg, prob.vjp, _has_jacobians(prob))
    u0, p_template, p_leaves, lane_leaf, spans = _traced_trajectories(eprob, n, seed)
    t0, t1 = spans[:, 0], spans[:, 1]
    shared_span = bool(np.all(t0 == t0[0]) and np.all(t1 == t1[0]))
    ends_only = not shared_span and saveat is None and callbacks is None
    if ends_only:  # each trajectory's ends on its own times: the event path's, no events
        callbacks = CallbackSet()
    if not shared_span and sensealg.one_tspan:
        raise NotImplementedError(
            f"{sensealg!r} needs one tspan shared by all trajectories; use "
            f"{per_lane_span_sensealgs(opts.alg)} for per-trajectory tspans"
        )
    grid = (
        None
        if saveat is None and callbacks is not None
        else lane_save_grid(saveat, t0, t1, np.arange(n))[:, 0]
    )
    diff = [isbox(leaf) for leaf in p_leaves]
    static = _Static(
        f=prob.f,
        vjp=prob.vjp,
        p_template=p_template,
        leaves=[getval(leaf) for leaf in p_leaves],
        lane_leaf=lane_leaf,
        diff_leaf=diff,
        single_lane=False,
        t0=t0,
        t1=t1,
        save_grid=grid,
        tstops=lane_stop_times(tstops, t0, t1),
        options=opts,
        batch_size=lanes_per_batch or batch_size,
        backend=backend,
        dtype=_host_dtype(prob.u0),
        sensealg=sensealg,
        default_sensealg=by_default,
        jac=prob.jac,
        tgrad=prob.tgrad,
        paramjac=prob.paramjac,
    )
    u0_lanes = anp.moveaxis(u0, 0, -1)
    diff_values = [leaf for leaf, d in zip(p_leaves, diff, strict=True) if d]
    events = None
    if callbacks is None:
        saved, out = traced_solve(static, u0_lanes, diff_values, scheduler)
    else:
        run = solve_segmented(static, callbacks, u0_lanes, diff_values, scheduler)
        saved, out, grid = run.saved, run.outcome, run.t
        events = None if ends_only else run.events
    return EnsembleSolution(
        events=events,
        t=grid.astype(static.dtype),
        u=saved,
        retcodes=out["retcode"].astype(np.int64),
        stats=EnsembleStats(out["nf"], out["naccept"], out["nreject"]),
        eprob=eprob,
        alg=opts.alg,
        seed=seed,
    )


def _traced_trajectories(
    eprob: EnsembleProblem, n: int, seed: int
) -> tuple[Any, Any, list[Any], list[bool], np.ndarray]:
    """Trajectories first: u0 ``(n, *shape)``, the parameter pytree's template and leaves
    (per-lane ones lanes-last), which leaves are per lane, and the time spans ``(n, 2)``; all
    traced where they were."""
    import autograd.numpy as anp

    prob = eprob.prob
    base = _pytree.leaves(prob.p)
    if eprob.prob_func is not None:
        problems = [eprob.trajectory(i, 0, seed) for i in range(n)]
        u0 = anp.stack([_on_host(p.u0) for p in problems])
        per_trajectory = [_pytree.leaves(p.p) for p in problems]
        columns = [[leaves[k] for leaves in per_trajectory] for k in range(len(base))]
        # A leaf every trajectory shares (one object: a fitted parameter vector, say) stays
        # one leaf, so its cotangent is accumulated jointly; others become lanes-last arrays.
        lane_leaf = per_trajectory_leaves(per_trajectory[0], per_trajectory)
        leaves = [
            anp.moveaxis(anp.stack(col), 0, -1) if lane else col[0]
            for col, lane in zip(columns, lane_leaf, strict=True)
        ]
        spans = np.array([p.tspan for p in problems])
        return u0, prob.p, leaves, lane_leaf, spans
    if eprob.batch_func is not None:
        data = eprob.batch(np.arange(n), np.zeros(n, dtype=np.int64), seed)
    else:
        data = {key: _first_rows(value, n) for key, value in eprob.arrays.items()}
    if "u0" in data:
        u0 = data["u0"]
    else:  # every trajectory starts from prob.u0 (tiled: a stack of n copies is far slower)
        u0 = _on_host(prob.u0)
        u0 = anp.tile(u0, (n,) + (1,) * anp.ndim(u0))
    spans = (
        np.asarray(data["tspan"], dtype=float)
        if "tspan" in data
        else np.tile(np.asarray(prob.tspan, dtype=float), (n, 1))
    )
    if "p" in data:
        leaves = [anp.moveaxis(leaf, 0, -1) for leaf in _pytree.leaves(data["p"])]
        return u0, data["p"], leaves, [True] * len(leaves), spans
    return u0, prob.p, base, [False] * len(base), spans


def _first_rows(value: Any, n: int) -> Any:
    return _pytree.map_leaves(lambda leaf: leaf[:n], value)


def _has_jacobians(prob: ODEProblem) -> bool:
    return prob.jac is not None and prob.paramjac is not None


def _on_host(u0: Any) -> Any:
    """An untraced ``u0`` on another backend comes to the host (the primitive's inputs are
    NumPy; batches move to their backend); a traced one is NumPy already."""
    from autograd.tracer import isbox

    return u0 if isbox(u0) else to_host(u0)


def _host_dtype(u0: Any) -> Any:
    from autograd.tracer import getval

    return to_host(getval(u0)).dtype


def _backend_name(u0: Any) -> str:
    from autograd.tracer import getval

    return backend_for(getval(u0)).name


def _compute_backend(u0: Any) -> Any:
    """Where an ensemble computes by default, that of ``prob.u0``: a backend's name (it
    travels to Dask workers) or, for a generic array-API library, the backend itself."""
    from autograd.tracer import getval

    backend = backend_for(getval(u0))
    return backend.name if backend.name in ("numpy", "cupy") else backend
