"""The lane integrator: the one stepping loop of dxode.

It advances a working set of independent trajectories (lanes) stored lanes-last — states
``(*shape, L)``, per-lane scalars ``(L,)`` — where each lane has its own time, step size,
controller memory, accept/reject decision, save pointer and return code. Lanes that finish
or fail are retired (their results recorded) and, once enough have gone, dropped from the
working set, so late lanes do not drag finished ones through every step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from .._norms import initial_step, rms_norm
from .._options import SolverOptions
from .._retcode import ReturnCode
from ..events.lanes import EventHandler, LaneEvents
from ..solvers import LaneRHS
from .lanes import LaneRecords, LaneResult, Trial, WorkingSet

Array = Any

# Drop retired lanes from the working set once they are this fraction of it.
_COMPACT_FRACTION = 0.25


@dataclasses.dataclass
class LaneProblem:
    """What the integrator needs for one batch of ``L`` lanes, all on one backend.

    Attributes
    ----------
    rhs_for : callable
        ``rhs_for(params) -> rhs``: the lane RHS ``rhs(u, t)`` for lanes holding the per-lane
        parameter arrays ``params`` (each ``(..., L)``, compacted with the lanes).
    u0 : (*shape, L) array
    t0, t1 : (L,) arrays
        Per-lane time spans; every lane runs in the same direction.
    params : tuple of arrays
        Per-lane parameters, lanes last.
    save_times : (nsave, L) array or None
        Per-lane save times, ordered in the direction of integration, inside each span.
    record_steps : {"", "states", "dense", "trials"}
        Record every accepted step: ``"states"`` keeps its times and end states (for
        save-everything output), ``"dense"`` also its stages (for dense output). ``"trials"``
        keeps every iteration's trial steps as they are, rejected ones included (for the
        discrete adjoint's replay): with their stage inputs, or, with ``checkpoint_every``,
        the working set's state and RHS before every ``checkpoint_every``-th iteration.
    tstops : (K,) array or None
        Times every lane must step to exactly, ordered in the direction of integration.
    f0 : (*shape, L) array, optional
        ``f(u0, t0)`` if the caller already evaluated it.
    events : LaneEvents, optional
        Callbacks, run per lane (see ``dxode.events.lanes``).
    """

    rhs_for: Callable[[tuple[Array, ...]], LaneRHS]
    u0: Array
    t0: Array
    t1: Array
    params: tuple[Array, ...] = ()
    save_times: Array | None = None
    record_steps: str = ""
    tstops: Array | None = None
    f0: Array | None = None
    checkpoint_every: int = 0
    events: LaneEvents | None = None


def integrate(
    problem: LaneProblem, options: SolverOptions, backend: Any, lockstep: bool = False
) -> LaneResult:
    """Integrate every lane of ``problem`` to its end time (or failure).

    Floating-point warnings are silenced inside: a lane that overflows gets a return code.
    With ``lockstep`` all lanes share one step size, controlled by the RMS of their error
    norms (the behaviour of array-based ensembles elsewhere, kept for comparison): a lane
    then no longer controls its own error.
    """
    with backend.ignore_fp_errors():
        return _integrate(problem, options, backend, lockstep)


def _integrate(
    problem: LaneProblem, options: SolverOptions, backend: Any, lockstep: bool
) -> LaneResult:
    xp = backend.xp
    stepper = options.alg
    u0 = problem.u0
    n_lanes = u0.shape[-1]
    dtype = u0.dtype
    t0 = xp.astype(problem.t0, dtype)
    t1 = xp.astype(problem.t1, dtype)
    direction = 1.0 if bool(xp.all(t1 > t0)) else -1.0
    eps = float(xp.finfo(dtype).eps)
    atol = options.atol if isinstance(options.atol, float) else _lanes_last(xp, options.atol, u0)
    stepper = stepper.configure(options.rtol, atol)

    rhs = problem.rhs_for(problem.params)
    f0 = problem.f0 if problem.f0 is not None else rhs(u0, t0)
    nf_start = 1
    if options.dt is not None:
        h = xp.full(n_lanes, options.dt, dtype=dtype)
    else:
        h = initial_step(xp, rhs, t0, u0, f0, direction, t1, stepper.order, options.rtol, atol)
        nf_start += 1
        if lockstep:
            h = xp.zeros_like(h) + xp.min(h)
    if options.dtmax is not None:
        h = xp.minimum(h, options.dtmax)
    # Without a user dtmin, a lane fails once its step no longer moves its own time by more
    # than a few ulps (relative to where it is now, so long spans can start with tiny steps).
    tiny = float(xp.finfo(dtype).smallest_normal)

    lanes = WorkingSet(xp)
    lanes.put(
        lane=xp.arange(n_lanes, dtype=xp.int64),
        t=t0,
        t1=t1,
        h=h,
        u=u0,
        f=f0,
        naccept=xp.zeros(n_lanes, dtype=xp.int64),
        active=xp.ones(n_lanes, dtype=xp.bool),
    )
    lanes.put_group("ctrl", options.controller.init(xp, t0) if options.adaptive else ())
    lanes.put_group("p", problem.params)

    evals_per_step = stepper.rhs_per_step + (0 if stepper.fsal else 1)
    n_save = 0 if problem.save_times is None else problem.save_times.shape[0]
    save_grid = None
    records = LaneRecords(xp, backend, n_lanes, n_save, u0.shape[:-1])
    if problem.save_times is not None:
        first = problem.save_times[0, ...] == t0
        records.save(lanes["lane"], xp.zeros(n_lanes, dtype=xp.int64), u0, first)
        # A sentinel row past the last save time: a lane that saved everything never saves again.
        sentinel = xp.full((1, n_lanes), direction * math.inf, dtype=dtype)
        ts = xp.concat([problem.save_times, sentinel])
        save_idx = xp.astype(first, xp.int64)
        next_save = _save_time(xp, ts, save_idx)
        if bool(xp.all(ts == ts[:, :1])):
            save_grid = ts[:, 0]  # one grid for all lanes: look it up without per-lane copies
        else:
            lanes.put(ts=ts)
        lanes.put(save_idx=save_idx, next_save=next_save)
    if stepper.variable_rhs_evals or (n_save and stepper.interpolation_rhs_evals):
        # Per-lane RHS evaluations beyond the fixed count per step (Jacobians, Newton
        # iterations, interpolation stages for saves).
        lanes.put(nf_extra=xp.zeros(n_lanes, dtype=xp.int64))
    tstops = problem.tstops
    handler = None
    if problem.events is not None:
        handler = EventHandler(problem.events, backend, stepper, problem.rhs_for, direction, u0)
        tstops = handler.tstops(tstops)
        stop = handler.start(lanes, rhs)
        if stop is not None and bool(xp.any(stop)):
            records.retire(lanes, stop, ReturnCode.Terminated, 0, nf_start, evals_per_step)
            lanes.compact(~stop)
            lanes.put(active=xp.ones(lanes.size, dtype=xp.bool))
            rhs = problem.rhs_for(lanes.group("p"))
    if tstops is not None:
        before = direction * (xp.reshape(tstops, (-1, 1)) - lanes["t"]) <= 0
        lanes.put(stop_idx=xp.sum(xp.astype(before, xp.int64), axis=0))

    all_active = True  # no retired lane waits in the working set for compaction
    iteration = 0
    while lanes.size:
        if iteration >= options.maxiters:
            records.retire(
                lanes, lanes["active"], ReturnCode.MaxIters, iteration, nf_start, evals_per_step
            )
            break
        iteration += 1
        t, u = lanes["t"], lanes["u"]

        # Step sizes: the controller's proposal, clipped to land exactly on the lane's target.
        target = lanes["t1"]
        if tstops is not None:
            stop_idx = lanes["stop_idx"]
            next_stop = xp.take(tstops, xp.clip(stop_idx, max=tstops.shape[0] - 1))
            use_stop = (stop_idx < tstops.shape[0]) & (direction * (next_stop - target) < 0)
            target = xp.where(use_stop, next_stop, target)
        remaining = direction * (target - t)
        habs = (
            xp.abs(lanes["h"]) if all_active else xp.where(lanes["active"], xp.abs(lanes["h"]), 0.0)
        )
        # Land on the target when less than 0.1% of a step would remain: a fixed step that
        # divides the span (up to round-off in t) must not leave a sliver of a last step.
        hit = habs >= remaining * (1.0 - 1e-3)
        habs = xp.where(hit, remaining, habs)
        hs = direction * habs

        result = stepper.step(backend, rhs, t, u, lanes["f"], hs)
        if stepper.variable_rhs_evals:
            lanes.put(nf_extra=lanes["nf_extra"] + result.nf_extra)
        t_new = xp.where(hit, target, t + hs)

        # Accept or reject each lane; propose its next step.
        if options.adaptive:
            scale = options.rtol * xp.maximum(xp.abs(u), xp.abs(result.u1)) + atol
            err = rms_norm(xp, result.error / scale)
            if result.failed is not None:  # no solution to the implicit stages: shrink h most
                err = xp.where(result.failed, math.inf, err)
            if lockstep:
                err = _shared_error(xp, err, None if all_active else lanes["active"])
            finite = xp.isfinite(err) if result.failed is None else xp.isfinite(err) | result.failed
            accept, h_next, ctrl = options.controller.adapt(
                xp, xp.where(finite, err, math.inf), habs, lanes.group("ctrl"), stepper.error_order
            )
            lanes.put_group("ctrl", ctrl)
        else:
            finite = xp.all(xp.isfinite(result.u1), axis=tuple(range(u.ndim - 1)))
            if result.failed is not None:
                finite = finite & ~result.failed
            accept = finite
            h_next = xp.full_like(habs, options.dt)
        if not all_active:
            accept = accept & lanes["active"]
        if options.dtmax is not None:
            h_next = xp.minimum(h_next, options.dtmax)

        # Continuous events cut lanes' steps short: outputs stop at the event.
        t_end, u_end, which, cut = t_new, result.u1, None, None
        if handler is not None:
            t_end, u_end, which, cut = handler.locate(lanes, rhs, accept, t, hs, u, result, t_new)

        # Outputs from the accepted steps, then advance.
        saves: tuple = ()
        if n_save:
            saves = _save_passed_points(
                backend,
                stepper,
                lanes,
                records,
                problem,
                save_grid,
                accept,
                t,
                hs,
                u,
                result,
                t_end,
                direction,
            )
        if problem.record_steps == "trials":
            every = problem.checkpoint_every
            records.trial(
                Trial(
                    lanes["lane"],
                    t,
                    hs,
                    t_end,
                    accept,
                    saves,
                    None if every else result.inputs,
                    (u, lanes["f"]) if every and (iteration - 1) % every == 0 else None,
                )
            )
        elif problem.record_steps:
            stages = result.stages if problem.record_steps == "dense" else None
            records.step(lanes["lane"], t, hs, t_end, u, u_end, stages, accept)
        accept_u = _expand(xp, accept, u)
        u = xp.where(accept_u, u_end, u)
        t = xp.where(accept, t_end, t)
        lanes.put(
            u=u, t=t, h=direction * h_next, naccept=lanes["naccept"] + xp.astype(accept, xp.int64)
        )
        if stepper.fsal:
            lanes.put(f=xp.where(accept_u, result.f1, lanes["f"]))
        else:
            lanes.put(f=rhs(u, t))
        if tstops is not None:
            landed = accept & hit & use_stop
            if cut is not None:
                landed = landed & ~cut
            lanes.put(stop_idx=stop_idx + xp.astype(landed, xp.int64))
        stop = None if handler is None else handler.apply(lanes, rhs, accept, which)

        # Retire lanes that finished or failed; drop them once enough have gone.
        done = accept & (t == lanes["t1"])
        if options.adaptive:
            # Written so that a NaN step size fails too.
            dtmin = options.dtmin if options.dtmin is not None else 16 * eps * xp.abs(t) + tiny
            failed = ~accept & ~(h_next >= dtmin)
        else:
            failed = ~finite
        if not all_active:
            failed = failed & lanes["active"]
        if stop is not None:  # lanes a callback ended, whether or not they reached the end
            done = done & ~stop
        ended = done | failed if stop is None else done | failed | stop
        if bool(xp.any(ended)):
            for mask, code in (
                (done, ReturnCode.Success),
                (failed & finite, ReturnCode.DtLessThanMin),
                (failed & ~finite, ReturnCode.Unstable),
                *(() if stop is None else ((stop, ReturnCode.Terminated),)),
            ):
                records.retire(lanes, mask, code, iteration, nf_start, evals_per_step)
            active = lanes["active"] & ~ended
            n_active = int(xp.sum(xp.astype(active, xp.int64)))
            if n_active <= (1 - _COMPACT_FRACTION) * lanes.size:
                lanes.compact(active)
                lanes.put(active=xp.ones(n_active, dtype=xp.bool))
                rhs = problem.rhs_for(lanes.group("p"))
                all_active = True
            else:
                lanes.put(active=active)
                all_active = False

    result = records.result()
    if handler is not None:
        result.events = handler.log()
    return result


def _save_time(xp: Any, ts: Array, save_idx: Array) -> Array:
    """Each lane's save time number ``save_idx`` from a shared ``(nsave,)`` or per-lane grid."""
    if ts.ndim == 1:
        return xp.take(ts, save_idx)
    return xp.squeeze(xp.take_along_axis(ts, save_idx[None, ...], axis=0), axis=0)


def _shared_error(xp: Any, err: Array, active: Array | None) -> Array:
    """Every lane gets the RMS of the (active) lanes' error norms."""
    squares = err * err if active is None else xp.where(active, err * err, 0.0)
    count = err.shape[0] if active is None else xp.sum(xp.astype(active, err.dtype))
    return xp.zeros_like(err) + xp.sqrt(xp.sum(squares) / count)


def _expand(xp: Any, mask: Array, like: Array) -> Array:
    """A per-lane mask ``(L,)`` shaped to broadcast against ``like`` ``(*shape, L)``."""
    return xp.reshape(mask, (1,) * (like.ndim - 1) + (mask.shape[0],))


def _lanes_last(xp: Any, atol: Any, u0: Array) -> Array:
    """Per-component ``atol`` (state-shaped) reshaped to broadcast over lanes."""
    array = xp.asarray(atol, dtype=u0.dtype)
    return xp.reshape(array, (*array.shape, 1))


def _save_passed_points(
    backend: Any,
    stepper: Any,
    lanes: WorkingSet,
    records: LaneRecords,
    problem: LaneProblem,
    save_grid: Array | None,
    accept: Array,
    t: Array,
    hs: Array,
    u: Array,
    result: Any,
    t_new: Array,
    direction: float,
) -> tuple[tuple[Array, Array, Array], ...]:
    """Fill the save points each accepted lane stepped over, from the step's dense output.

    ``save_grid`` holds the save times all lanes share (``None``: per-lane times are in the
    working set). Each lane keeps its next save time (``inf`` past the last), so a step that
    passes no save point costs three elementwise operations.

    Returns the rounds of saving, each ``(idx, save_idx, theta)``: the saving lanes'
    positions in the working set, their save point numbers and where in the step they are.
    """
    xp = backend.xp
    next_save = lanes["next_save"]
    due = accept & (direction * (next_save - t_new) <= 0)
    if not bool(xp.any(due)):
        return ()
    save_idx = lanes["save_idx"]
    rounds = []
    while True:
        idx = xp.nonzero(due)[0]

        def sub(x: Array, idx: Array = idx) -> Array:
            return xp.take(x, idx, axis=-1)

        theta = (sub(next_save) - sub(t)) / sub(hs)
        # Only interpolants with extra stages evaluate the RHS (on the saving lanes alone).
        sub_rhs = (
            problem.rhs_for(tuple(sub(p) for p in lanes.group("p")))
            if stepper.interpolation_rhs_evals
            else None
        )
        values = stepper.interpolate(
            backend, sub_rhs, sub(t), sub(hs), sub(u), sub(result.u1), sub(result.stages), theta
        )
        records.save(sub(lanes["lane"]), sub(save_idx), values, None)
        rounds.append((idx, sub(save_idx), theta))
        if stepper.interpolation_rhs_evals:
            extra = stepper.interpolation_rhs_evals * xp.astype(due, xp.int64)
            lanes.put(nf_extra=lanes["nf_extra"] + extra)
        save_idx = save_idx + xp.astype(due, xp.int64)
        following = _save_time(xp, lanes["ts"] if save_grid is None else save_grid, save_idx)
        next_save = xp.where(due, following, next_save)
        due = due & (direction * (next_save - t_new) <= 0)
        if not bool(xp.any(due)):
            break
    lanes.put(save_idx=save_idx, next_save=next_save)
    return tuple(rounds)
