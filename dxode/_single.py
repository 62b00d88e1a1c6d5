"""One problem, solved without gradients, on options already parsed: the single-solve layer.

``solve`` (the front door) comes here for an ``ODEProblem`` nothing differentiates, and
``EnsembleSerial`` for each of its trajectories.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._derivatives import Derivatives
from ._lane_problem import lane_problem
from ._options import SolverOptions
from ._problem import ODEProblem
from ._retcode import ReturnCode
from ._solution import ODESolution, SolverStats
from ._timegrid import save_times, stop_times
from .backends import backend_for
from .events.callbacks import CallbackSet
from .events.record import record_from_lanes, with_points_after
from .integrator.interpolation import DenseOutput
from .integrator.loop import integrate

__all__ = ["solve_problem"]


def solve_problem(
    prob: ODEProblem,
    opts: SolverOptions,
    *,
    saveat: Any = None,
    dense: bool | None = None,
    tstops: Any = None,
    callbacks: CallbackSet | None = None,
) -> ODESolution:
    """Solve ``prob`` (see ``solve``); ``callbacks`` is a ``CallbackSet`` or ``None``."""
    backend = backend_for(prob.u0)
    xp = backend.xp
    t0, t1 = prob.tspan
    grid = save_times(saveat, t0, t1)
    keep_dense = grid is None if dense is None else bool(dense)
    problem = lane_problem(
        backend,
        Derivatives.of(prob, single_lane=True),
        lambda params: prob.p,
        (),
        xp.expand_dims(prob.u0, axis=-1),
        np.array([t0]),
        np.array([t1]),
        stepper=opts.alg,
        save_grid=None if grid is None else grid[:, None],
        record_steps="dense" if keep_dense else ("states" if grid is None else ""),
        tstops=stop_times(tstops, t0, t1),
        callbacks=callbacks,
    )
    result = integrate(problem, opts, backend)
    t, u = _saved_points(backend, problem, result, grid, prob.u0)
    events = None
    if callbacks is not None:
        events = record_from_lanes(backend, result.events, None)
        if grid is None:
            t, u = with_points_after(t, u, events, callbacks)
    steps = result.steps
    dense_output = None
    if keep_dense and steps is not None and steps["t"].shape[0] > 0:
        direction = 1.0 if t1 > t0 else -1.0
        rhs = problem.rhs_for(())
        end = None if callbacks is None else result.u[0, ...]  # after the events at t_end
        dense_output = DenseOutput(backend, opts.alg, rhs, steps, direction, end)
    retcode = ReturnCode(int(result.retcode[0]))
    return ODESolution(t, u, retcode, _stats(opts, result), prob, opts.alg, dense_output, events)


def _saved_points(
    backend: Any, problem: Any, result: Any, grid: np.ndarray | None, u0: Any
) -> tuple[Any, Any]:
    """The saved times and states: the save grid's, or every accepted step's."""
    xp = backend.xp
    if grid is not None:
        return backend.asarray(grid, dtype=u0.dtype), result.saved[0, ...]
    steps = result.steps
    if steps is None:  # no step taken: a callback terminated the solve at t0
        return problem.t0, xp.expand_dims(u0, axis=0)
    t = xp.concat([problem.t0, steps["t_end"]])
    u = xp.concat([xp.expand_dims(u0, axis=0), xp.moveaxis(steps["u_end"], -1, 0)])
    return t, u


def _stats(opts: SolverOptions, result: Any) -> SolverStats:
    naccept, nreject = int(result.naccept[0]), int(result.nreject[0])
    counters = {name: int(values[0]) for name, values in result.counters.items()}
    # Jacobians and factorizations come from the attempts with a stiff method: every attempt,
    # or with AutoSwitch those its stiff method made.
    stiff_attempts = counters.get("nstiff", naccept + nreject)
    return SolverStats(
        nf=int(result.nf[0]),
        naccept=naccept,
        nreject=nreject,
        njac=opts.alg.jacobians_per_step * stiff_attempts,
        nlu=opts.alg.factorizations_per_step * stiff_attempts,
        nswitch=counters.get("nswitch", 0),
    )
