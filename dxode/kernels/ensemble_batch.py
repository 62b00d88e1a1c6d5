"""One ensemble batch through a compiled kernel: lanes built as the array path builds them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from array_api_compat import is_cupy_array

from .. import _pytree
from .._lane_problem import check_jac_on_host, lane_values, parameters_for
from .._timegrid import lane_save_grid, lane_stop_times, trajectory_times
from ..backends import get_backend, to_host
from ..ensemble.batch import BatchResult, BatchSpec, build_lanes, index_array
from ..ensemble.problem import EnsembleProblem
from ..events.record import EventRecord
from .batch import KernelBatch, check_parameter_dtypes, lane_params
from .errors import ARRAY_PATH, KernelUnsupportedError
from .events import run_events
from .lane_arrays import array_module

__all__ = ["MAX_COMPONENTS", "solve_kernel_batch"]

# The generated code holds each state component in a variable of its own and passes them
# to the wrappers of f (and of jac, tgrad and the callbacks) as arguments, with p and t; a
# Python call with more than 30 arguments compiles to a call with *args, which numba cannot
# inline. Larger systems are the array path's.
MAX_COMPONENTS = 28


def solve_kernel_batch(
    alg: Any,
    eprob: EnsembleProblem,
    trajectories: np.ndarray | range,
    spec: BatchSpec,
    repeat: np.ndarray,
) -> BatchResult:
    """Solve ``trajectories`` (their indices, or a range of them; attempt ``repeat``) with
    ``alg``'s kernel."""
    indices = index_array(trajectories)
    as_cupy = is_cupy_array(eprob.prob.u0)
    # a CuPy ensemble's lanes stay on the GPU for the CUDA kernel (the CPU's come to the host)
    backend = get_backend("cupy" if as_cupy and alg.device == "cuda" else "numpy")
    repeat = np.asarray(repeat, dtype=np.int64)
    lanes = build_lanes(eprob, trajectories, repeat, spec.seed, backend)
    u0 = lanes.u0
    check_state(u0[..., 0])
    t0, t1 = lanes.t0, lanes.t1
    grid = lane_save_grid(spec.saveat, t0, t1, indices)
    tstops = lane_stop_times(spec.tstops, t0, t1)
    check_parameter_dtypes(lanes.p, lanes.lane_leaf, u0.dtype)
    _check_jac_of_first_lane(eprob, lanes, spec)
    xp = array_module(u0)
    layout, params = lane_params(lanes.p, lanes.lane_leaf, u0.shape[-1], u0.dtype, xp)
    prob = eprob.prob
    batch = KernelBatch(
        prob.f,
        u0,
        params,
        layout,
        t0,
        t1,
        grid,
        tstops,
        spec.options,
        jac=prob.jac,
        tgrad=prob.tgrad,
        callbacks=spec.callback,
    )
    result, events = run_events(_runner(alg, as_cupy), batch)
    dtype = u0.dtype
    t_out = np.asarray(trajectory_times(grid), dtype=dtype)
    return BatchResult(
        indices=indices,
        t=t_out,
        u=result.saved,
        retcode=np.asarray(result.retcode, dtype=np.int64),
        nf=np.asarray(result.nf, dtype=np.int64),
        naccept=np.asarray(result.naccept, dtype=np.int64),
        nreject=np.asarray(result.nreject, dtype=np.int64),
        nswitch=None if result.switches is None else np.asarray(result.switches[:, 0]),
        events=None if events is None else _for_trajectories(events, indices, as_cupy),
    )


def _check_jac_of_first_lane(eprob: EnsembleProblem, lanes: Any, spec: BatchSpec) -> None:
    """The problem's ``jac`` checked at the batch's first trajectory's start, on the host
    (``_lane_problem.check_jac_on_host``)."""
    leaves = _pytree.leaves(lanes.p)
    first = tuple(to_host(v)[..., 0] for v in lane_values(leaves, lanes.lane_leaf))
    p = parameters_for(lanes.p, leaves, lanes.lane_leaf)(first)
    t0 = float(to_host(lanes.t0)[0])
    prob = eprob.prob
    check_jac_on_host(prob.f, prob.jac, lanes.u0[..., 0], p, t0, spec.options.alg)


def _runner(alg: Any, as_cupy: bool) -> Callable[[KernelBatch], Any]:
    """``run(batch)`` on ``alg``'s device."""
    if alg.device == "cuda":
        from .cuda import run_cuda

        return lambda batch: run_cuda(batch, as_cupy=as_cupy)
    from .cpu import run_cpu

    return lambda batch: run_cpu(batch, block=alg.block_size, threads=alg.threads)


def _for_trajectories(events: EventRecord, indices: np.ndarray, as_cupy: bool) -> EventRecord:
    """The batch's events with lane numbers turned into trajectory numbers (CuPy arrays for
    a CuPy problem)."""
    events = dataclasses.replace(events, trajectory=indices[events.trajectory])
    if not as_cupy:
        return events
    import cupy

    return dataclasses.replace(
        events,
        t=cupy.asarray(events.t),
        u_before=cupy.asarray(events.u_before),
        u_after=cupy.asarray(events.u_after),
    )


def check_state(u0: Any) -> None:
    """Kernels take 1-D float32/float64 states of at most ``MAX_COMPONENTS`` components."""
    if np.ndim(u0) != 1:
        raise KernelUnsupportedError(
            f"the compiled kernels take a 1-D state u0, got shape {np.shape(u0)}; flatten the "
            f"state (and reshape inside f), or use {ARRAY_PATH}"
        )
    if np.size(u0) > MAX_COMPONENTS:
        raise KernelUnsupportedError(
            f"the compiled kernels take states of at most {MAX_COMPONENTS} components, u0 has "
            f"{np.size(u0)}; use {ARRAY_PATH}, which serves large systems"
        )
    dtype = u0.dtype if hasattr(u0, "dtype") else np.asarray(u0).dtype
    if dtype not in (np.float32, np.float64):
        raise KernelUnsupportedError(
            f"the compiled kernels run float32 or float64 states, got {dtype}; use {ARRAY_PATH}"
        )
