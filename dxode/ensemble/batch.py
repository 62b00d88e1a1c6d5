"""One batch of an ensemble: build its lanes, run the lane integrator, collect the results.

``solve_batch`` is the unit of work of every ensemble algorithm: ``EnsembleArray`` calls it
batch after batch, and a Dask task calls the very same function on a worker.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import array_api_compat
import numpy as np

from .. import _pytree
from .._derivatives import Derivatives
from .._error_context import describe_trajectories
from .._lane_problem import lane_problem, lane_values, parameters_for
from .._options import SolverOptions
from .._problem import ODEProblem
from .._timegrid import lane_save_grid, lane_stop_times, trajectory_times
from .._validation import check_span_fits
from ..backends import Backend, backend_for, get_backend, to_host
from ..events.record import EventRecord, record_from_lanes
from ..integrator.loop import integrate
from .param_rows import check_p_rows
from .problem import EnsembleProblem, per_trajectory_leaves

Array = Any


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """Everything about how to solve batches, shared by all of them (picklable).

    ``backend`` is a backend name, or ``None`` for the backend of ``prob.u0``; ``callback``
    a ``CallbackSet`` or ``None``.
    """

    options: SolverOptions
    saveat: Any = None
    dense: bool = False
    tstops: Any = None
    backend: str | None = None
    seed: int = 0
    lockstep: bool = False
    callback: Any = None


@dataclasses.dataclass
class BatchResult:
    """Per-trajectory outcomes of one batch, trajectories first.

    ``u`` ``(B, nsave, *shape)`` and ``t`` (``(nsave,)`` or ``(B, nsave)``) are backend arrays;
    ``retcode``, ``nf``, ``naccept``, ``nreject``, ``indices`` are NumPy ``(B,)`` arrays.
    ``values`` holds ``output_func``'s values (a list) when there is one; ``dense`` keeps what
    ``sim[i](t)`` needs when dense output was asked for; ``events`` the events callbacks
    fired (trajectory indices in its ``trajectory`` column), when there are callbacks;
    ``nswitch`` the switches between methods per trajectory (``AutoSwitch``; else ``None``).
    """

    indices: np.ndarray
    t: Array
    u: Array | None
    retcode: np.ndarray
    nf: np.ndarray
    naccept: np.ndarray
    nreject: np.ndarray
    values: list[Any] | None = None
    dense: Any = None
    events: EventRecord | None = None
    nswitch: np.ndarray | None = None

    def counts(self, name: str) -> np.ndarray | int:
        """The per-trajectory statistic ``name`` (one of ``TRAJECTORY_COUNTS``); ``nswitch``
        is 0 for every trajectory when the method does not switch."""
        value = getattr(self, name)
        return 0 if value is None else value


# BatchResult's per-trajectory return codes and statistics, as kept for every trajectory.
TRAJECTORY_COUNTS = ("retcode", "nf", "naccept", "nreject", "nswitch")


def check_save_count(batch: BatchResult, n_save: int, others: str) -> None:
    """Raise unless ``batch``'s trajectories saved ``n_save`` times each, as ``others`` (the
    trajectories it is compared with) did: trajectories whose spans differ save different
    numbers of times for an interval ``saveat``, found once batches (or attempts) that saw
    different spans come together."""
    saved = batch.t.shape[-1]
    if saved != n_save:
        raise ValueError(
            f"{describe_trajectories(batch.indices)} saved {saved} times, {others} {n_save}: "
            f"saveat as an interval needs one shared tspan; with per-trajectory tspans give "
            f"the save times as an array inside every trajectory's span (or saveat=None for "
            f"the ends)"
        )


@dataclasses.dataclass
class _Lanes:
    """A batch's inputs, lanes last, on the compute backend."""

    u0: Array  # (*shape, B)
    t0: np.ndarray  # (B,) float64, host
    t1: np.ndarray
    p: Any  # pytree: per-lane leaves have a trailing B axis
    lane_leaf: list[bool]  # which leaves of p are per-lane


def index_array(indices: Any) -> np.ndarray:
    """Trajectory ``indices`` (a ``range``, sequence or array) as an int64 array; a range
    without iterating it in Python (``np.asarray(range(8_000_000))`` takes 0.4 s)."""
    if isinstance(indices, range):
        return np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
    return np.asarray(indices, dtype=np.int64)


def solve_batch(
    eprob: EnsembleProblem,
    trajectories: np.ndarray | range,
    spec: BatchSpec,
    repeat: np.ndarray | None = None,
) -> BatchResult:
    """Solve ``trajectories`` (their indices, or a range of them) as one vectorized batch
    of lanes."""
    indices = index_array(trajectories)
    repeat = np.zeros_like(indices) if repeat is None else np.asarray(repeat, dtype=np.int64)
    backend = get_backend(spec.backend) if spec.backend else backend_for(eprob.prob.u0)
    lanes = build_lanes(eprob, trajectories, repeat, spec.seed, backend)
    t0, t1 = lanes.t0, lanes.t1
    grid = lane_save_grid(spec.saveat, t0, t1, indices)
    p_leaves = _pytree.leaves(lanes.p)
    p_for = parameters_for(lanes.p, p_leaves, lanes.lane_leaf)
    lane_params = lane_values(p_leaves, lanes.lane_leaf)
    problem = lane_problem(
        backend,
        Derivatives.of(eprob.prob, single_lane=False),
        p_for,
        lane_params,
        lanes.u0,
        t0,
        t1,
        stepper=spec.options.alg,
        save_grid=grid,
        record_steps="dense" if spec.dense else "",
        tstops=(lane_stop_times(spec.tstops, t0, t1) if spec.tstops is not None else None),
        callbacks=spec.callback,
    )
    result = integrate(problem, spec.options, backend, lockstep=spec.lockstep)
    dtype = lanes.u0.dtype
    t_out = backend.asarray(trajectory_times(grid), dtype=dtype)
    out = BatchResult(
        indices=indices,
        t=t_out,
        u=result.saved,
        retcode=backend.to_host(result.retcode).astype(np.int64),
        nf=backend.to_host(result.nf).astype(np.int64),
        naccept=backend.to_host(result.naccept).astype(np.int64),
        nreject=backend.to_host(result.nreject).astype(np.int64),
    )
    if "nswitch" in result.counters:
        out.nswitch = backend.to_host(result.counters["nswitch"]).astype(np.int64)
    if result.events is not None:
        out.events = record_from_lanes(backend, result.events, indices)
    if spec.dense:
        out.dense = _DenseData(
            backend,
            spec.options.alg,
            eprob.prob.f,
            result.steps,
            p_for,
            lane_params,
            1.0 if t1[0] > t0[0] else -1.0,
            None if spec.callback is None else result.u,
        )
    return out


def build_lanes(
    eprob: EnsembleProblem,
    indices: np.ndarray | range,
    repeat: np.ndarray,
    seed: int,
    backend: Backend,
) -> _Lanes:
    """The lanes of trajectories ``indices`` (an array, or a range: its rows of per-trajectory
    arrays are then a slice, not a gather) at attempt ``repeat``: states, spans and parameters
    on ``backend``, whichever way the ensemble describes its trajectories."""
    prob = eprob.prob
    n = len(indices)
    if eprob.prob_func is not None:
        problems = [
            eprob.trajectory(int(i), int(r), seed) for i, r in zip(indices, repeat, strict=True)
        ]
        first = eprob.trajectory(0, 0, seed)
        # Trajectory 0 alone has nothing to compare its leaves with: every leaf would be
        # shared (passed as it is, not cast to the state's dtype as other batches' rows are).
        # Its leaves are per trajectory where prob_func hands out a new object each call.
        again = [eprob.trajectory_again(seed)] if all(t is first for t in problems) else []
        return _lanes_from_problems(problems, prob, first, backend, again)
    if eprob.batch_func is not None:
        data = eprob.batch(index_array(indices), repeat, seed)
        return _lanes_from_arrays(data, prob, n, backend, take=None)
    return _lanes_from_arrays(eprob.arrays, prob, n, backend, take=indices)


def check_arrays(
    data: dict[str, Any],
    prob: ODEProblem,
    n: int,
    take: np.ndarray | range | None,
    backend: Backend,
) -> None:
    """Raise as an ``EnsembleArray`` batch of ``n`` trajectories would for their
    trajectories-first arrays ``data`` (rows ``take`` of them, or all rows as a
    ``batch_func`` returns them), so that ``EnsembleSerial`` refuses what a batch refuses."""
    _lanes_from_arrays(data, prob, n, backend, take)


def _lanes_from_arrays(
    data: dict[str, Any],
    prob: ODEProblem,
    n: int,
    backend: Backend,
    take: np.ndarray | range | None,
) -> _Lanes:
    """Lanes from trajectories-first arrays (rows ``take`` of them, or all rows)."""
    dtype = _state_dtype(prob, backend)
    xp = backend.xp

    def rows(x: Any, name: str) -> Array:
        arr = x if array_api_compat.is_array_api_obj(x) and not np.isscalar(x) else np.asarray(x)
        if arr.ndim == 0:
            # a batch_func's number (or a tuple of numbers for a tuple prob.p) has no rows
            form = (
                "a (B,) array per number of prob.p, or (B, k) for its k numbers"
                if name == "p"
                else f"shape (B, *prob.{name}.shape)"
            )
            raise ValueError(
                f"per-trajectory {name} needs a leading axis of {n} trajectories, got a number "
                f"({arr.item()!r}); give each trajectory its row ({form}), or leave {name} "
                f"out to share prob.{name}"
            )
        if take is not None:
            arr = _take_rows(arr, take)
        if arr.shape[0] != n:
            raise ValueError(
                f"per-trajectory {name}: expected {n} trajectories along the first axis, "
                f"got {arr.shape[0]}"
            )
        return arr

    if "u0" in data:
        u0 = rows(data["u0"], "u0")
        if tuple(u0.shape[1:]) != tuple(prob.u0.shape):
            raise ValueError(
                f"per-trajectory u0 must have shape (trajectories, *{tuple(prob.u0.shape)}), "
                f"got {tuple(u0.shape)}"
            )
        _check_real("u0", u0)
        u0 = xp.moveaxis(backend.asarray(_to_backend_input(u0, backend), dtype=dtype), 0, -1)
        _check_finite_lanes("u0", xp, u0)
    else:
        u0 = _repeated_u0(prob, n, backend)
    if "tspan" in data:
        spans = np.asarray(to_host(rows(data["tspan"], "tspan")))
        check_span_numbers(spans)
        spans = spans.astype(np.float64)
        time = np.float32 if xp.finfo(dtype).bits == 32 else np.float64  # the state's dtype
        with np.errstate(over="ignore"):  # times beyond float32: check_lane_spans_fit below
            bad = (
                spans.shape != (n, 2)
                or not np.all(np.isfinite(spans))
                or np.any(spans[:, 0].astype(time) == spans[:, 1].astype(time))
            )
        if bad:
            raise ValueError(
                "per-trajectory tspan must be a finite (trajectories, 2) array with t0 != t1 "
                "(also in float32 for a float32 state, whose time is float32)"
            )
        t0, t1 = spans[:, 0].copy(), spans[:, 1].copy()
    else:
        # the shared span as read-only views of one number each (not two (B,) arrays)
        t0, t1 = (np.broadcast_to(np.float64(t), (n,)) for t in prob.tspan)
    check_direction(t0, t1)
    check_lane_spans_fit(t0, t1, xp.finfo(dtype))
    if "p" in data:
        check_p_rows(data["p"], prob.p)
        leaves = [
            xp.moveaxis(_as_lane_param(rows(leaf, "p"), backend, dtype), 0, -1)
            for leaf in _pytree.leaves(data["p"])
        ]
        for leaf in leaves:
            _check_real("p", leaf, allow_complex=True)
            _check_finite_lanes("p", xp, leaf)
        return _Lanes(u0, t0, t1, _pytree.rebuild(data["p"], leaves), [True] * len(leaves))
    shared = _pytree.leaves(prob.p)
    return _Lanes(u0, t0, t1, prob.p, [False] * len(shared))


def _lanes_from_problems(
    problems: list[ODEProblem],
    prob: ODEProblem,
    first: ODEProblem,
    backend: Backend,
    compared: list[ODEProblem] | None = None,
) -> _Lanes:
    """Lanes from one ODEProblem per trajectory (the ``prob_func`` path, each checked by
    ``check_trajectory`` as it was built); ``first`` is the ensemble's trajectory 0, whose
    parameter leaves the others may share; ``compared`` more problems whose leaves decide
    which are shared, without a lane of their own."""
    xp = backend.xp
    dtype = _state_dtype(prob, backend)
    u0s = [t.u0 for t in problems]
    if all(u0 is first.u0 for u0 in u0s):  # (prob_func may have changed prob.u0 in place)
        u0 = _repeated_u0(first, len(problems), backend)
    elif _same_host_kind(u0s):
        u0 = backend.asarray(_host_stack(u0s), dtype=dtype)
    else:
        u0 = xp.stack(
            [backend.asarray(_to_backend_input(u0, backend), dtype=dtype) for u0 in u0s], axis=-1
        )
    t0 = np.array([t.tspan[0] for t in problems])
    t1 = np.array([t.tspan[1] for t in problems])
    check_direction(t0, t1)
    check_lane_spans_fit(t0, t1, xp.finfo(dtype))
    per_traj = [_pytree.leaves(traj.p) for traj in problems]  # checked as each was built
    shared_leaves = _pytree.leaves(first.p)
    others = [_pytree.leaves(traj.p) for traj in compared or []]
    lane_leaf = per_trajectory_leaves(shared_leaves, per_traj + others)
    new_leaves = []
    for k, shared in enumerate(shared_leaves):
        if lane_leaf[k]:
            new_leaves.append(_lane_column([leaves[k] for leaves in per_traj], backend, dtype))
        else:
            new_leaves.append(shared)
    return _Lanes(u0, t0, t1, _pytree.rebuild(prob.p, new_leaves), lane_leaf)


def _state_dtype(prob: ODEProblem, backend: Backend) -> Any:
    """``prob.u0``'s dtype in ``backend``'s library (a kernel batch is built with NumPy, also
    for a state of another array-API library, whose dtypes NumPy does not take)."""
    dtype = prob.u0.dtype
    if isinstance(prob.u0, np.ndarray) or backend_for(prob.u0) is backend:
        return dtype
    single = dtype == array_api_compat.array_namespace(prob.u0).float32
    return backend.xp.float32 if single else backend.xp.float64


def _repeated_u0(prob: ODEProblem, n: int, backend: Backend) -> Array:
    """``prob.u0`` for ``n`` lanes, ``(*shape, n)``, in the state's dtype."""
    xp = backend.xp
    base = backend.asarray(_to_backend_input(prob.u0, backend), dtype=_state_dtype(prob, backend))
    return xp.asarray(xp.broadcast_to(xp.expand_dims(base, axis=-1), (*base.shape, n)), copy=True)


def _lane_column(values: list[Any], backend: Backend, dtype: Any) -> Array:
    """One parameter leaf of every trajectory, stacked lanes last and converted as
    ``_as_lane_param`` converts each value (at once when all are alike on the host)."""
    if _same_host_kind(values):
        return _as_lane_param(_host_stack(values), backend, dtype)
    return backend.xp.stack([_as_lane_param(v, backend, dtype) for v in values], axis=-1)


def _same_host_kind(values: list[Any]) -> bool:
    """Whether ``values`` are all NumPy arrays or scalars of one dtype and shape, or all
    Python numbers of one type: then one host stack converts them as each alone would be."""
    kinds = {_host_kind(v) for v in values}
    return len(kinds) == 1 and None not in kinds


def _host_kind(value: Any) -> Any:
    """``(dtype, shape)`` of a NumPy array or scalar, the type of a Python number, else None."""
    if type(value) is np.ndarray or isinstance(value, np.generic):
        return (value.dtype, value.shape)
    return type(value) if type(value) in (float, int, bool) else None


def _host_stack(values: list[Any]) -> np.ndarray:
    """``values`` (see ``_same_host_kind``) stacked along a new last axis, C-contiguous."""
    return np.ascontiguousarray(np.moveaxis(np.array(values), 0, -1))


def _as_lane_param(value: Any, backend: Backend, dtype: Any) -> Array:
    """A per-trajectory parameter as a backend array; floating values take the state's dtype."""
    arr = _to_backend_input(value, backend)
    host_kind = np.asarray(arr).dtype.kind if isinstance(arr, (int, float, list, tuple)) else None
    if host_kind in ("i", "u", "b"):
        return backend.asarray(arr)
    out = backend.asarray(arr)
    xp = backend.xp
    if xp.isdtype(out.dtype, "real floating") or host_kind == "f":
        out = xp.astype(out, dtype)
    return out


def _to_backend_input(x: Any, backend: Backend) -> Any:
    """``x`` in a form ``backend.asarray`` accepts (other libraries' arrays go through the host)."""
    if array_api_compat.is_array_api_obj(x) and not np.isscalar(x):
        if backend_for(x) is backend:
            return x
        return backend_for(x).to_host(x)
    return x


def _take_rows(arr: Any, rows: np.ndarray | range) -> Any:
    """Rows ``rows`` of ``arr`` as a new array. A contiguous range is sliced and copied: no
    index array is built (on a GPU, building 8 million indices on the host and sending them
    over took longer than the solve)."""
    if isinstance(rows, range) and rows.step == 1:
        return array_api_compat.array_namespace(arr).asarray(
            arr[rows.start : rows.stop, ...], copy=True
        )
    rows = index_array(rows)
    if isinstance(arr, np.ndarray):
        return arr[rows]
    xp = array_api_compat.array_namespace(arr)
    return xp.take(arr, xp.asarray(rows), axis=0)


def check_span_numbers(spans: np.ndarray) -> None:
    """Raise unless per-trajectory spans (host array) hold real numbers: strings (``"0"``)
    and booleans would otherwise become times."""
    if spans.dtype.kind not in "iuf":
        raise TypeError(
            f"per-trajectory tspan must hold real numbers, got dtype {spans.dtype}; give a "
            f"(trajectories, 2) array of floats, e.g. np.array([[0.0, 1.0], [0.0, 2.0]])"
        )


def check_direction(t0: np.ndarray, t1: np.ndarray) -> None:
    """Refuse per-trajectory spans that are empty or do not all run one way in time."""
    if t0.strides == t1.strides == (0,):  # one shared span
        return
    empty = np.ravel(t0 == t1)
    if np.any(empty):  # else told "not the same time direction", which hid the cause
        i = int(np.argmax(empty))
        raise ValueError(
            f"the tspan of trajectory {i} is empty: t0 == t1 == {float(np.ravel(t0)[i])}; give "
            f"every trajectory distinct start and end times"
        )
    forward = t1 > t0
    if not (np.all(forward) or not np.any(forward)):
        raise ValueError(
            "all trajectories of an ensemble must integrate in the same time direction"
        )


def check_lane_spans_fit(t0: np.ndarray, t1: np.ndarray, finfo: Any) -> None:
    """Refuse per-trajectory spans (host arrays) whose times or width exceed the largest
    number of the state's dtype (``finfo``), in which the lanes keep time: the first such
    trajectory of the batch, as a single solve's (``check_span_fits``)."""
    largest = float(finfo.max)
    with np.errstate(over="ignore", invalid="ignore"):
        wide = np.maximum(np.maximum(np.abs(t0), np.abs(t1)), np.abs(t1 - t0)) > largest
    if np.any(wide):
        i = int(np.argmax(wide))
        check_span_fits((float(t0[i]), float(t1[i])), finfo.dtype, largest)


def _check_real(name: str, x: Array, allow_complex: bool = False) -> None:
    """Raise unless the array ``x`` holds numbers: real ones (integers and bools become the
    state's dtype), or complex ones where ``allow_complex`` (parameters; ``f`` must still
    return reals)."""
    kinds = ("real floating", "integral", "bool") + (("complex floating",) if allow_complex else ())
    if not array_api_compat.array_namespace(x).isdtype(x.dtype, kinds):
        raise TypeError(
            f"per-trajectory {name} must hold {'numbers' if allow_complex else 'real numbers'}, "
            f"got dtype {x.dtype}; convert it, e.g. {name}.astype(float64)"
        )


def _check_finite_lanes(name: str, xp: Any, x: Array) -> None:
    if not bool(xp.all(xp.isfinite(x))):
        raise ValueError(f"per-trajectory {name} contains non-finite values (NaN or inf)")


@dataclasses.dataclass
class _DenseData:
    """A batch's accepted steps, kept so that ``sim[i](t)`` can interpolate trajectory ``i``."""

    backend: Backend
    stepper: Any
    f: Any
    steps: dict[str, Array] | None
    p_for: Any
    lane_params: tuple[Array, ...]
    direction: float
    end_states: Array | None = None  # (L, *shape): after the events at each lane's end
