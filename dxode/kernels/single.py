"""``solve(prob, alg, kernel=True)``: one trajectory through the compiled kernel.

The everyday single solve and the inner loop of fits: the kernel is compiled once per
(f, method, option signature) and reused for every new ``u0`` and ``p``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _pytree
from .._lane_problem import check_jac_on_host
from .._options import SolverOptions
from .._problem import ODEProblem
from .._retcode import ReturnCode
from .._solution import ODESolution, SolverStats
from .._timegrid import save_times, stop_times
from ..backends import to_host
from ..events.callbacks import check_preset_times
from ..events.record import with_points_after
from .batch import KernelBatch, check_callback_method, check_parameter_dtypes, lane_params
from .cpu import run_cpu
from .ensemble_batch import check_state
from .errors import ARRAY_PATH, KernelUnsupportedError
from .events import run_events

__all__ = ["solve_kernel"]


def solve_kernel(
    prob: ODEProblem,
    alg: Any,
    *,
    saveat: Any,
    dense: bool | None,
    tstops: Any,
    callback: Any,
    sensealg: Any,
    options: dict[str, Any],
) -> ODESolution:
    """Solve ``prob`` with the compiled kernel on the CPU (see ``solve``).

    Without ``saveat`` every accepted step is saved (and, with callbacks, the state just after
    each event, as on the array path). No dense output: ``dense=True`` raises.
    """
    if dense:
        raise KernelUnsupportedError(
            f"the compiled kernels keep no dense output (sol(t)); use saveat=..., or {ARRAY_PATH}"
        )
    from .._tracing import is_traced

    opts = SolverOptions.from_user(alg, **options)
    opts.check_state(prob.u0, prob.tspan)
    opts.check_step_budget(prob.tspan, callback)
    check_preset_times(callback, *sorted(float(t) for t in prob.tspan))
    if is_traced(prob.u0, prob.p):
        check_callback_method(callback, opts.alg)
        return _solve_traced(prob, opts, saveat, tstops, sensealg, callback)
    if sensealg is not None:  # nothing to differentiate: only checked
        from .gradients import kernel_sensealg

        kernel_sensealg(sensealg)
    leaves = len(_pytree.leaves(prob.p))
    check_parameter_dtypes(prob.p, [False] * leaves, to_host(prob.u0).dtype)
    check_jac_on_host(prob.f, prob.jac, prob.u0, prob.p, float(prob.tspan[0]), opts.alg)
    return _solve_plain(prob, opts, saveat, tstops, callback)


def _solve_plain(
    prob: ODEProblem, opts: SolverOptions, saveat: Any, tstops: Any, callback: Any
) -> ODESolution:
    """The kernel solve of a problem nothing differentiates (see ``solve_kernel``): on the
    CPU, so a CuPy state is brought to the host (one trajectory would be one GPU thread)."""
    u0 = to_host(prob.u0)
    check_state(u0)
    t0, t1 = (float(t) for t in prob.tspan)
    grid = save_times(saveat, t0, t1)
    stops = stop_times(tstops, t0, t1)
    layout, params = lane_params(prob.p, [False] * len(_pytree.leaves(prob.p)), 1, u0.dtype)
    batch = KernelBatch(
        prob.f,
        np.ascontiguousarray(u0[:, None]),
        params,
        layout,
        np.array([t0]),
        np.array([t1]),
        None if grid is None else grid[:, None],
        stops,
        opts,
        jac=prob.jac,
        tgrad=prob.tgrad,
        callbacks=callback,
    )
    result, events = run_events(lambda b: run_cpu(b, record=grid is None), batch)
    if grid is None:
        assert result.steps is not None
        t, u = result.steps
        if events is not None:
            t, u = with_points_after(t, u, events, callback)
    else:
        t, u = grid.astype(u0.dtype), result.saved[0]
    naccept, nreject = int(result.naccept[0]), int(result.nreject[0])
    # AutoSwitch: Jacobians and factorizations in its attempts with the stiff method.
    nswitch, attempts = (
        (0, naccept + nreject) if result.switches is None else map(int, result.switches[0])
    )
    stats = SolverStats(
        nf=int(result.nf[0]),
        naccept=naccept,
        nreject=nreject,
        njac=getattr(opts.alg, "jacobians_per_step", 0) * attempts,
        nlu=getattr(opts.alg, "factorizations_per_step", 0) * attempts,
        nswitch=nswitch,
    )
    retcode = ReturnCode(int(result.retcode[0]))
    return ODESolution(t, u, retcode, stats, prob, opts.alg, None, events)


def _solve_traced(
    prob: ODEProblem,
    opts: SolverOptions,
    saveat: Any,
    tstops: Any,
    sensealg: Any,
    callbacks: Any,
) -> ODESolution:
    """A differentiated kernel solve: forward sensitivities compiled with the kernel, or its
    discrete adjoint (see ``gradients``); with ``callbacks`` (a ``CallbackSet``) event to event,
    each segment through them (``sensitivity.event_segments``). Without ``saveat`` it saves
    what the solve without gradients saves (every step, and the events' after-states)."""
    from autograd.tracer import getval

    from ..sensitivity.entry import solve_single_traced
    from .gradients import kernel_sensealg

    check_state(np.asarray(getval(prob.u0)))
    return solve_single_traced(
        prob,
        opts,
        saveat,
        tstops,
        kernel_sensealg(sensealg),
        callbacks,
        lambda plain, cbs: _solve_plain(plain, opts, None, tstops, cbs).t,
    )
