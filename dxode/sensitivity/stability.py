"""When the discrete adjoint's frozen steps are not the gradient: stability-limited steps.

The discrete adjoint differentiates the computed solution with the step sizes held fixed.
Where an explicit method's adaptive steps are limited by stability rather than accuracy (a
stiff problem: diffusion, fast decay), that derivative can be far from the gradient of the
loss. A fast decaying mode that the solution barely contains (unexcited, at round-off level)
lets the controller take steps beyond the method's stability interval, which multiply that
mode by ``|R(hλ)| >> 1``; once it has grown to the error tolerance, the controller shrinks the
steps and holds it there. The computed solution, and the loss, stay accurate, but the
frozen-step linearization keeps the amplification without the controller's answer to it: on
the heat-conduction tutorial at a constant conductivity it made a gradient 500 times too large.
Differentiating through the controller does not help: the loss is then not differentiable on
any useful scale (where the amplified mode sits depends on round-off), while its central
differences agree with the continuous sensitivities.

So the forward pass estimates the Jacobian's dominant eigenvalue modulus ``ρ`` by power
iterations at a few states along the solve (forward differences of ``f``: they also see the
modes the solution does not contain), and a lane with an accepted step ``|h| ρ`` beyond the
method's real stability interval is "stability-limited". For those solves the default
sensitivity algorithm switches to ``InterpolatingAdjoint`` (accurate to the tolerance; the
adjoint equation is integrated with the same method and controller), and an explicitly
requested ``DiscreteAdjoint`` refuses with an error naming the fixes. (An estimate from the
steps' own stages, as in Hairer's stiffness detection, sees only the modes the solution
contains, and missed an Allen–Cahn problem whose symmetric modes are unexcited.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backends import to_host
from ..backends._base import ordered_sum
from ..integrator.lanes import Trial

# Power iterations for the Jacobian's dominant eigenvalue: at most this many states along
# each batch's solve, this many iterations each.
PROBES = 8
_ITERATIONS = 12
# Probes of a batch run side by side up to this many state elements (their Python cost per
# call dominates for small working sets; large ones gain nothing from sharing a call).
_SIDE_BY_SIDE = 1 << 18
# A norm bound on the Jacobian (n + 1 evaluations of f per probe) is tried before the power
# iterations (13) up to this many components, and clears a batch when its largest step times
# the bound, with this margin for the forward differences, is within the stability interval.
_BOUND_COMPONENTS = 11
_BOUND_MARGIN = 2.0
# Steps per group when looking for the largest accepted step (64 KiB of float64).
_STEP_GROUP = 8_192


def stability_limited(
    backend: Any,
    rhs_for: Any,
    params: tuple,
    trials: list[Trial],
    succeeded: np.ndarray,
    interval: float,
) -> tuple[np.ndarray, float]:
    """Lanes (among the ``succeeded`` ones, an ``(L,)`` host mask) with an accepted step
    ``h`` beyond the stability interval, ``|h| ρ > interval``, and the largest such ``ρ``.

    ``ρ`` comes from power iterations on the Jacobian at up to ``PROBES`` states along the
    solve (so it also sees the modes the solution does not contain, which frozen steps
    amplify unseen): for a step, the larger of the probes before and after it.
    ``rhs_for(params)`` is the batch's lane RHS (``params`` its per-lane parameters).
    """
    xp = backend.xp
    limited = np.zeros(succeeded.shape[0], dtype=bool)
    largest = _largest_step(xp, trials)
    n_lanes = succeeded.shape[0]
    if _components(trials) <= _BOUND_COMPONENTS:
        # the common, non-stiff case for a few components: a norm bound on every probe's
        # Jacobian (n + 1 evaluations of f, against 13 for the power iterations) clears it
        bounds = _probe_rates(backend, rhs_for, params, trials, n_lanes, _norm_bound)
        if bounds is None:
            return limited, 0.0
        if largest * _BOUND_MARGIN * float(np.max(bounds[1])) <= interval:
            return limited, 0.0
    probes = _probe_rates(backend, rhs_for, params, trials, n_lanes, _power_iteration)
    if probes is None:
        return limited, 0.0
    at, rates = probes
    if largest * float(np.max(rates)) <= interval:
        return limited, 0.0  # no step can be beyond (the common, non-stiff case)
    h = xp.abs(xp.concat([trial.h for trial in trials]))
    accept = xp.concat([trial.accept for trial in trials])
    lanes = np.asarray(to_host(xp.concat([trial.lane for trial in trials])))
    h, accept = np.asarray(to_host(h)), np.asarray(to_host(accept), dtype=bool)
    which = np.repeat(np.arange(len(trials)), [int(trial.lane.shape[0]) for trial in trials])
    before = np.clip(np.searchsorted(at, which, side="right") - 1, 0, len(at) - 1)
    after = np.minimum(before + 1, len(at) - 1)
    rho = np.maximum(rates[before, lanes], rates[after, lanes])
    over = accept & (h * rho > interval) & succeeded[lanes]
    if not over.any():
        return limited, 0.0
    limited[lanes[over]] = True
    return limited, float(np.max(rho[over]))


def _probe_rates(
    backend: Any,
    rhs_for: Any,
    params: tuple,
    trials: list[Trial],
    n_lanes: int,
    estimate: Any,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``estimate``'s rates (power iterations: ``|λ|max``; ``_norm_bound``: a bound on it)
    at up to ``PROBES`` trials' start states: the trials' indices ``(P,)`` and the rates
    ``(P, L)`` (zero for lanes not in a trial's working set), or ``None`` when no trial kept
    its start state.

    Small working sets' probes run side by side as one working set: each lane's rate has
    the bits of its probe on its own, as ``f`` computes each lane on its own and the norms
    add in order. A batch of one lane probes one state after another (a single trajectory's
    ``f`` sees no lane axis)."""
    xp = backend.xp
    kept = [j for j, trial in enumerate(trials) if _start_state(trial) is not None]
    if not kept:
        return None
    every = max(1, -(-len(kept) // PROBES))
    chosen = kept[::every]
    probes = [trials[j] for j in chosen]
    states = [_start_state(trial) for trial in probes]
    rng = np.random.default_rng(0)
    starts = [rng.standard_normal(tuple(u.shape)) for u in states]
    budget = 0 if n_lanes == 1 else _SIDE_BY_SIDE
    rates = np.zeros((len(chosen), n_lanes))
    for group in _side_by_side([math.prod(u.shape) for u in states], budget):
        lanes = xp.concat([probes[k].lane for k in group])
        u = xp.concat([states[k] for k in group], axis=-1)
        start = backend.asarray(np.concatenate([starts[k] for k in group], axis=-1), u.dtype)
        t = xp.concat([probes[k].t for k in group])
        rhs = rhs_for(tuple(xp.take(p, lanes, axis=-1) for p in params))
        rate = np.asarray(to_host(estimate(backend, rhs, u, t, start)))
        ends = np.cumsum([int(probes[k].lane.shape[0]) for k in group])
        for k, part in zip(group, np.split(rate, ends[:-1]), strict=True):
            rates[k, np.asarray(to_host(probes[k].lane))] = part
    return np.asarray(chosen), rates


def _components(trials: list[Trial]) -> int:
    """The state's components (``n``), from the first trial that kept its start state (a
    large number when none did: no bound is tried)."""
    for trial in trials:
        state = _start_state(trial)
        if state is not None:
            return math.prod(state.shape[:-1])
    return _BOUND_COMPONENTS + 1


def _largest_step(xp: Any, trials: list[Trial]) -> float:
    """The largest accepted ``|h|`` of the ``trials`` (NaN if one is NaN), taken over groups
    of up to ``_STEP_GROUP`` steps: one array of every step would take megabytes of fresh
    memory, which the kernel pages in again on every gradient (2 ms of the 1,000-trajectory
    Lorenz gradient's 80)."""
    sizes = [int(trial.h.shape[0]) for trial in trials]
    largest = []
    for group in _side_by_side(sizes, _STEP_GROUP):
        h = xp.concat([trials[k].h for k in group])
        accept = xp.concat([trials[k].accept for k in group])
        largest.append(xp.max(xp.where(accept, xp.abs(h), 0.0)))
    return float(xp.max(xp.stack(largest)))


def _side_by_side(sizes: list[int], budget: int) -> list[list[int]]:
    """The positions of items of ``sizes`` elements cut into consecutive groups of at most
    ``budget`` elements in all (a larger item alone)."""
    groups: list[list[int]] = []
    total = 0
    for k, size in enumerate(sizes):
        if not groups or total + size > budget:
            groups.append([])
            total = 0
        groups[-1].append(k)
        total += size
    return groups


def _start_state(trial: Trial) -> Any:
    """The state a trial stepped from, if it was kept (stage inputs or a checkpoint)."""
    if trial.inputs is not None:
        return trial.inputs[0]
    return None if trial.start is None else trial.start[0]


def _power_iteration(backend: Any, rhs: Any, u: Any, t: Any, v: Any) -> Any:
    """``||J v|| / ||v||`` per lane after ``_ITERATIONS`` power iterations from ``v``, with
    ``J v`` the forward difference ``(f(u + ε v) - f(u)) / ε``."""
    xp = backend.xp
    with backend.ignore_fp_errors():
        f0 = rhs(u, t)
        step = _difference_step(xp, u)
        rate = xp.zeros_like(step)
        for _ in range(_ITERATIONS):
            size = _lane_norm(xp, v)
            v = v / xp.where(size > 0, size, 1.0)
            jv = (rhs(u + step * v, t) - f0) / step
            rate = _lane_norm(xp, jv)
            v = jv
        return xp.where(xp.isfinite(rate), rate, 0.0)


def _lane_norm(xp: Any, x: Any) -> Any:
    """Each lane's 2-norm of ``x`` ``(*shape, L)``, added in order: the same bits for any
    number of lanes."""
    return xp.sqrt(ordered_sum(xp, xp.reshape(x * x, (math.prod(x.shape[:-1]), x.shape[-1]))))


def _difference_step(xp: Any, u: Any) -> Any:
    """Each lane's forward-difference step at ``u``: ``sqrt(ε) (1 + ||u||)``."""
    return float(np.sqrt(xp.finfo(u.dtype).eps)) * (1.0 + _lane_norm(xp, u))


def _norm_bound(backend: Any, rhs: Any, u: Any, t: Any, v: Any) -> Any:
    """``sqrt(||J||_1 ||J||_inf)`` per lane, at least ``||J||_2`` and so at least every power
    iteration's ``||J v|| / ||v||``; ``J`` by forward differences of ``f`` (the step of
    ``_power_iteration``), one component at a time; ``inf`` where not finite. (``v`` unused.)"""
    xp = backend.xp
    n, lanes = math.prod(u.shape[:-1]), u.shape[-1]
    flat = xp.reshape(u, (n, lanes))
    with backend.ignore_fp_errors():
        f0 = xp.reshape(rhs(u, t), (n, lanes))
        step = _difference_step(xp, u)
        rows = xp.zeros((n, lanes), dtype=u.dtype)  # ||J||_inf: the largest row sum
        columns = xp.zeros((lanes,), dtype=u.dtype)  # ||J||_1: the largest column sum
        for k in range(n):
            unit = xp.asarray([[1.0] if i == k else [0.0] for i in range(n)], dtype=u.dtype)
            moved = xp.reshape(flat + step * unit, u.shape)
            column = xp.abs((xp.reshape(rhs(moved, t), (n, lanes)) - f0) / step)
            rows = rows + column
            columns = xp.maximum(columns, ordered_sum(xp, column))
        bound = xp.sqrt(xp.max(rows, axis=0) * columns)
        return xp.where(xp.isfinite(bound), bound, xp.inf)


def refusal(
    sensealg: Any, alg: Any, n_limited: int, n_lanes: int, interval: float, rho: float, why: str
) -> ValueError:
    """The error for a stability-limited solve whose gradient cannot switch algorithm."""
    dtmax = 0.9 * interval / rho
    return ValueError(
        f"{sensealg!r}: {n_limited} of {n_lanes} trajectories took steps of {alg!r} beyond "
        f"its stability interval (|h λ| > {interval:.3g} for the Jacobian's dominant "
        f"eigenvalue λ, estimated |λ| up to {rho:.3g}): the problem is stiff for this method, "
        "and the derivative of its frozen steps is not the gradient of the loss (the step-size "
        f"controller keeps the solution stable, frozen steps do not). {why} Or pass "
        f"dtmax={dtmax:.3g} (or less) so that every step is stable, or use a stiff method "
        "such as Rodas5P()"
    )
