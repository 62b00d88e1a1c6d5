"""The lane integrator: the one stepping loop of dxode.

It advances a working set of independent trajectories (lanes) stored lanes-last — states
``(*shape, L)``, per-lane scalars ``(L,)`` — where each lane has its own time, step size,
controller memory, accept/reject decision, save pointer and return code. Lanes that finish
or fail are retired (their results recorded) and, once enough have gone, dropped from the
working set, so late lanes do not drag finished ones through every step.

Each iteration the loop proposes every lane's step (clipped onto its target), takes it with
the method, accepts or rejects it by the controller, hands the iteration's steps (an
``Attempt`` holding the ``Step`` value and its interpolant) to its observers — events, save
points, step and trial records, ``tstops``; see ``dxode.integrator.observers`` for the
protocol and the order of its hooks — advances the accepting lanes, then retires and
compacts. ``dxode.integrator.replay`` re-takes recorded iterations for the discrete adjoint.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

from .._derivatives import LaneFunction
from .._jacobian import time_scale as span_time_scale
from .._norms import initial_step, rms_norm
from .._options import SolverOptions
from .._retcode import ReturnCode
from ..events.lanes import EventHandler, LaneEvents
from ..solvers import AutoSwitch, LaneRHS, Step, StepResult
from .lanes import LaneRecords, LaneResult, WorkingSet, advance
from .observers import Attempt, Events, Observer, Saving, StepRecorder, StopTimes, TrialRecorder

Array = Any

# Drop retired lanes from the working set once they are this fraction of it.
_COMPACT_FRACTION = 0.25
# A step clipped onto a target to below this fraction of the lane's proposal keeps the proposal.
SLIVER = 1e-6


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
    time_scale : (L,) array, optional
        The lanes' time scales, on which a stiff method differences ``df/dt``: by default
        ``|t1 - t0|`` of each lane's span (``dxode._jacobian.time_scale``); a pass
        over part of a longer trajectory (an adjoint's segment) gives the trajectory's.
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
    time_scale: Array | None = None


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
        return _Loop(problem, options, backend, lockstep).run()


class _Loop:
    """The step loop over one batch: propose, step, control the error, hand the steps to the
    observers, advance, retire and compact (see ``dxode.integrator.observers``)."""

    def __init__(
        self, problem: LaneProblem, options: SolverOptions, backend: Any, lockstep: bool
    ) -> None:
        xp = self.xp = backend.xp
        self.problem, self.options = problem, options
        self.backend, self.lockstep = backend, lockstep
        u0 = problem.u0
        self.dtype = u0.dtype
        t0 = xp.astype(problem.t0, self.dtype)
        t1 = xp.astype(problem.t1, self.dtype)
        self.direction = 1.0 if bool(xp.all(t1 > t0)) else -1.0
        self.eps = float(xp.finfo(self.dtype).eps)
        # Without a user dtmin, a lane fails once its step no longer moves its own time by more
        # than a few ulps (relative to where it is now, so long spans can start with tiny steps).
        self.tiny = float(xp.finfo(self.dtype).smallest_normal)
        self.atol = (
            options.atol if isinstance(options.atol, float) else _lanes_last(xp, options.atol, u0)
        )
        self.stepper = options.alg.configure(options.rtol, self.atol)
        self.switching = isinstance(self.stepper, AutoSwitch)
        scale = span_time_scale(xp, t0, t1) if problem.time_scale is None else problem.time_scale
        self.rhs = self._lane_rhs(problem.params, scale)
        f0 = problem.f0 if problem.f0 is not None else self.rhs(u0, t0)
        self.nf_start = 1
        self.lanes = self._working_set(t0, t1, self._initial_step(t0, t1, u0, f0), u0, f0)
        self.lanes.put(time_scale=scale)
        self.evals_per_step = self.stepper.rhs_per_step + (0 if self.stepper.fsal else 1)
        n_save = 0 if problem.save_times is None else problem.save_times.shape[0]
        self.records = LaneRecords(
            xp, backend, u0.shape[-1], n_save, u0.shape[:-1], getattr(self.stepper, "counters", ())
        )
        if self.stepper.variable_rhs_evals or (n_save and self.stepper.interpolation_rhs_evals):
            # Per-lane RHS evaluations beyond the fixed count per step (Jacobians, Newton
            # iterations, interpolation stages for saves).
            self.lanes.put(nf_extra=xp.zeros(u0.shape[-1], dtype=xp.int64))
        self.observers = self._observers()
        self.all_active = True  # no retired lane waits in the working set for compaction

    def _initial_step(self, t0: Array, t1: Array, u0: Array, f0: Array) -> Array:
        """Every lane's first step size (``(L,)``, unsigned)."""
        xp, options = self.xp, self.options
        if options.dt is not None:
            h = xp.full(u0.shape[-1], options.dt, dtype=self.dtype)
        else:
            h = initial_step(
                xp,
                self.rhs,
                t0,
                u0,
                f0,
                self.direction,
                t1,
                self.stepper.order,
                options.rtol,
                self.atol,
            )
            self.nf_start += 1
            if self.lockstep:
                h = xp.zeros_like(h) + xp.min(h)
            if options.dtmin is not None:  # (a given dt is at least dtmin: SolverOptions)
                h = xp.maximum(h, options.dtmin)
        if options.dtmax is not None:
            h = xp.minimum(h, options.dtmax)
        return h

    def _working_set(self, t0: Array, t1: Array, h: Array, u0: Array, f0: Array) -> WorkingSet:
        xp, n_lanes = self.xp, u0.shape[-1]
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
        options = self.options
        lanes.put_group("ctrl", options.controller.init(xp, t0) if options.adaptive else ())
        lanes.put_group("p", self.problem.params)
        if self.switching:
            lanes.put(**self.stepper.lane_memory(xp, u0))
        return lanes

    def _observers(self) -> list[Observer]:
        """The observers in the order the loop calls them (see ``observers``'s docstring)."""
        problem, backend, direction = self.problem, self.backend, self.direction
        observers: list[Observer] = []
        if problem.save_times is not None:
            trials = problem.record_steps == "trials"  # the discrete adjoint's replay
            saving = Saving(
                backend, self.records, problem.save_times, problem.rhs_for, direction, trials
            )
            observers.append(saving)
        if problem.record_steps == "trials":
            observers.append(TrialRecorder(self.records, problem.checkpoint_every))
        elif problem.record_steps:
            dense, cuts = problem.record_steps == "dense", problem.events is not None
            observers.append(StepRecorder(self.records, dense, cuts))
        tstops, events = problem.tstops, None
        if problem.events is not None:
            handler = EventHandler(
                problem.events, backend, self.stepper, problem.rhs_for, direction, problem.u0
            )
            tstops, events = handler.tstops(tstops), Events(handler)
        if tstops is not None:
            observers.append(StopTimes(self.xp, tstops, direction))
        if events is not None:
            observers.append(events)
        return observers

    def run(self) -> LaneResult:
        """Step until every lane has retired; the lanes' results."""
        lanes, observers = self.lanes, self.observers
        stop = _stops(obs.start(lanes, self.rhs) for obs in observers)
        if stop is not None and bool(self.xp.any(stop)):
            self._retire(stop, ReturnCode.Terminated, 0)
            self._compact(~stop)
        iteration = 0
        while lanes.size:
            if iteration >= self.options.maxiters:
                self._retire(lanes["active"], ReturnCode.MaxIters, iteration)
                break
            iteration += 1
            attempt = self._attempt(iteration)
            for obs in observers:
                obs.cut(lanes, attempt)
            for obs in observers:
                obs.accepted(lanes, attempt)
            self._advance(attempt)
            self._retire_ended(attempt, _stops(obs.advanced(lanes, attempt) for obs in observers))
        result = self.records.result()
        for obs in observers:
            obs.finish(result)
        return result

    def _attempt(self, iteration: int) -> Attempt:
        """Every lane's trial step: the controller's proposal, clipped to land exactly on the
        lane's target, then accepted or rejected."""
        xp, lanes = self.xp, self.lanes
        t, u = lanes["t"], lanes["u"]
        target = self._targets()
        remaining = self.direction * (target - t)
        habs = (
            xp.abs(lanes["h"])
            if self.all_active
            else xp.where(lanes["active"], xp.abs(lanes["h"]), 0.0)
        )
        # Land on the target when less than 0.1% of a step would remain: a fixed step that
        # divides the span (up to round-off in t) must not leave a sliver of a last step.
        habs = _representable(xp, t, self.direction, habs, self.eps)
        hit = habs >= remaining * (1.0 - 1e-3)
        habs = xp.where(hit, remaining, habs)
        hs = self.direction * habs

        if self.switching:
            # Retired lanes awaiting compaction step (by zero) with the cheaper method.
            stiff = lanes["stiff"] if self.all_active else lanes["stiff"] & lanes["active"]
            result = self.stepper.attempt(self.backend, self._rhs_of, t, u, lanes["f"], hs, stiff)
        else:
            result = self.stepper.step(self.backend, self.rhs, t, u, lanes["f"], hs)
        if self.stepper.variable_rhs_evals:
            lanes.put(nf_extra=lanes["nf_extra"] + result.nf_extra)
        t_new = xp.where(hit, target, t + hs)
        accept, h_next, finite = self._control(u, result, habs)
        step = Step(self.stepper, self.backend, self.rhs, t, hs, u, result.u1, result.stages)
        return Attempt(
            iteration,
            step,
            result,
            lanes["f"],
            accept,
            hit,
            t_new,
            h_next,
            finite,
            t_new,
            result.u1,
        )

    def _targets(self) -> Array:
        """Every lane's next target (``(L,)``): its end, or the next stop before it."""
        target = self.lanes["t1"]
        for obs in self.observers:
            target = obs.target(self.lanes, target)
        return target

    def _control(self, u: Array, result: StepResult, habs: Array) -> tuple[Array, Array, Array]:
        """Accept or reject each lane's step; propose its next step size.

        Returns ``(accept, h_next, finite)``: ``finite`` marks the lanes whose error (or, for
        fixed steps, new state) is finite.
        """
        xp, options, lanes = self.xp, self.options, self.lanes
        if options.adaptive:
            scale = options.rtol * xp.maximum(xp.abs(u), xp.abs(result.u1)) + self.atol
            err = rms_norm(xp, result.error / scale)
            if result.failed is not None:  # no solution to the implicit stages: shrink h most
                err = xp.where(result.failed, math.inf, err)
            if self.lockstep:
                err = _shared_error(xp, err, None if self.all_active else lanes["active"])
            finite = xp.isfinite(err)
            if result.failed is not None:
                # A failed implicit stage counts as finite unless its iterate is not: a
                # NaN/inf from f (or its Jacobian) ends the lane Unstable, a Newton iteration
                # that merely did not converge ends it DtLessThanMin.
                finite = xp.where(result.failed, _all_finite(xp, result.u1), finite)
            error_order = (
                self.stepper.lane_error_order(xp, lanes["stiff"], habs)
                if self.switching
                else self.stepper.error_order
            )
            accept, h_next, ctrl = options.controller.adapt(
                xp, xp.where(finite, err, math.inf), habs, lanes.group("ctrl"), error_order
            )
            lanes.put_group("ctrl", ctrl)
        else:
            finite = _all_finite(xp, result.u1)
            if result.failed is not None:
                finite = finite & ~result.failed
            accept = finite
            h_next = xp.full_like(habs, options.dt)
        if not self.all_active:
            accept = accept & lanes["active"]
        if self.switching:
            h_next = self._switch(result, habs, accept, h_next)
        if options.dtmax is not None:
            h_next = xp.minimum(h_next, options.dtmax)
        # A lane already on its target (an event's root placed exactly on a stop) steps by
        # zero onto it, and one whose event placed it a few ulps before a stop steps by a
        # sliver: it keeps its step size, which the controller would otherwise grow back
        # from zero (for good) or from the sliver (over some twenty steps). Steps that the
        # 0.1 % landing rule let reach a target are never this short (factor_max is 10).
        sliver = habs < SLIVER * xp.abs(lanes["h"])
        h_next = xp.where(sliver, xp.abs(lanes["h"]), h_next)
        return accept, h_next, finite

    def _rhs_of(self, idx: Array | None) -> LaneRHS:
        """The lane RHS of the working set's lanes at positions ``idx`` (``None``: all)."""
        if idx is None:
            return self.rhs
        xp, lanes = self.xp, self.lanes
        params = tuple(xp.take(p, idx, axis=-1) for p in lanes.group("p"))
        return self._lane_rhs(params, xp.take(lanes["time_scale"], idx, axis=-1))

    def _lane_rhs(self, params: tuple[Array, ...], scale: Array) -> LaneRHS:
        """The lane RHS for lanes with per-lane parameters ``params`` and time scales
        ``scale`` (``(L,)``; a stiff method's ``df/dt`` is differenced on them)."""
        rhs = self.problem.rhs_for(params)
        return rhs.on_lanes(scale) if isinstance(rhs, LaneFunction) else rhs

    def _switch(self, result: StepResult, habs: Array, accept: Array, h_next: Array) -> Array:
        """AutoSwitch: count the lanes' stiffness votes, switch the lanes that reached their
        count (their controller memory starts afresh); the next step sizes."""
        xp, lanes, stepper = self.xp, self.lanes, self.stepper
        memory = {name: lanes[name] for name in stepper.memory_names}
        memory, switched, h_next = stepper.decide(xp, memory, result.rho, habs, accept, h_next)
        lanes.put(**memory)
        if self.options.adaptive and bool(xp.any(switched)):
            fresh = self.options.controller.init(xp, habs)
            ctrl = lanes.group("ctrl")
            lanes.put_group(
                "ctrl", tuple(xp.where(switched, a, b) for a, b in zip(fresh, ctrl, strict=True))
            )
        return h_next

    def _advance(self, attempt: Attempt) -> None:
        """Move the accepting lanes to their step's (possibly cut) end."""
        xp, lanes = self.xp, self.lanes
        t, u, f = advance(
            attempt.step,
            attempt.accept,
            attempt.f0,
            attempt.t_end,
            attempt.u_end,
            attempt.result.f1,
        )
        lanes.put(
            u=u,
            t=t,
            h=self.direction * attempt.h_next,
            naccept=lanes["naccept"] + xp.astype(attempt.accept, xp.int64),
            f=f,
        )

    def _retire_ended(self, attempt: Attempt, stop: Array | None) -> None:
        """Retire the lanes that finished or failed; drop them once enough have gone."""
        xp, lanes, options = self.xp, self.lanes, self.options
        accept, t = attempt.accept, lanes["t"]
        done = accept & (t == lanes["t1"])
        if options.adaptive:
            failed = self._below_dtmin(accept, attempt.h_next)
        else:
            failed = ~attempt.finite
        if not self.all_active:
            failed = failed & lanes["active"]
        if stop is not None:  # lanes a callback ended, whether or not they reached the end
            done = done & ~stop
        ended = done | failed if stop is None else done | failed | stop
        if not bool(xp.any(ended)):
            return
        finite = attempt.finite
        for mask, code in (
            (done, ReturnCode.Success),
            (failed & finite, ReturnCode.DtLessThanMin),
            (failed & ~finite, ReturnCode.Unstable),
            *(() if stop is None else ((stop, ReturnCode.Terminated),)),
        ):
            self._retire(mask, code, attempt.iteration)
        active = lanes["active"] & ~ended
        n_active = int(xp.sum(xp.astype(active, xp.int64)))
        if n_active <= (1 - _COMPACT_FRACTION) * lanes.size:
            self._compact(active)
        else:
            lanes.put(active=active)
            self.all_active = False

    def _below_dtmin(self, accept: Array, h_next: Array) -> Array:
        """The lanes whose next step would fall below ``dtmin`` (they fail).

        A user's ``dtmin`` is a floor under every step but the one that lands on the lane's
        next target (its end or a stop) after an accepted step: a lane whose target lies
        within ``dtmin`` steps onto it (its next step is raised to ``dtmin``, which lands).
        Without ``dtmin``, a lane fails when a rejection proposes a step too small to move
        its time (``16 * eps * |t|``). Written so that a NaN step size fails too.
        """
        xp, lanes, dtmin = self.xp, self.lanes, self.options.dtmin
        if dtmin is None:
            floor = 16 * self.eps * xp.abs(lanes["t"]) + self.tiny
            return ~accept & ~(h_next >= floor)
        small = ~(h_next >= dtmin)
        lands = accept & (self.direction * (self._targets() - lanes["t"]) <= dtmin)
        lanes.put(h=self.direction * xp.maximum(h_next, dtmin))
        return small & ~lands

    def _retire(self, mask: Array, code: ReturnCode, iteration: int) -> None:
        self.records.retire(self.lanes, mask, code, iteration, self.nf_start, self.evals_per_step)

    def _compact(self, keep: Array) -> None:
        """Keep only the lanes where ``keep`` holds; all of them are active then."""
        lanes = self.lanes
        lanes.compact(keep)
        lanes.put(active=self.xp.ones(lanes.size, dtype=self.xp.bool))
        self.rhs = self._lane_rhs(lanes.group("p"), lanes["time_scale"])
        self.all_active = True


def _representable(xp: Any, t: Array, direction: float, habs: Array, eps: float) -> Array:
    """The step sizes ``habs`` (``(L,)``, unsigned) rounded to what they move the times ``t``
    by: ``|(t + hs) - t|`` in ``t``'s dtype, at least one or two ulps of ``t`` (zero stays
    zero). Stepping the state by exactly how far its time moves keeps the two together: far
    from ``t = 0`` (in float32 from ``|t| ~ 1e3``) the rounding of ``t + hs`` is not small
    against ``hs``, and a state advanced by ``hs`` itself drifted off its time every step
    (float32 decay from ``t0 = 1e4``: a relative error of 7e-4 at ``rtol = 1e-5``); a step
    under half an ulp of ``t`` would not move it at all."""
    moved = xp.abs((t + direction * habs) - t)
    least = xp.abs((t + direction * eps * xp.abs(t)) - t)
    return xp.where(habs > 0, xp.maximum(moved, least), habs)


def _stops(stops: Iterable[Array | None]) -> Array | None:
    """The lanes any observer terminated (``None``: none asked)."""
    out = None
    for stop in stops:
        if stop is not None:
            out = stop if out is None else out | stop
    return out


def _shared_error(xp: Any, err: Array, active: Array | None) -> Array:
    """Every lane gets the RMS of the (active) lanes' error norms."""
    squares = err * err if active is None else xp.where(active, err * err, 0.0)
    count = err.shape[0] if active is None else xp.sum(xp.astype(active, err.dtype))
    return xp.zeros_like(err) + xp.sqrt(xp.sum(squares) / count)


def _lanes_last(xp: Any, atol: Any, u0: Array) -> Array:
    """Per-component ``atol`` (state-shaped) reshaped to broadcast over lanes."""
    array = xp.asarray(atol, dtype=u0.dtype)
    return xp.reshape(array, (*array.shape, 1))


def _all_finite(xp: Any, u: Array) -> Array:
    """``(L,)``: whether every component of each lane's state ``u`` (``(*shape, L)``) is finite."""
    return xp.all(xp.isfinite(u), axis=tuple(range(u.ndim - 1)))
