"""Ensemble algorithms: how the batches of an ensemble are computed.

Every algorithm splits the trajectories into batches and turns each batch into a
``BatchResult``; ``output_func`` (with reruns) runs per batch,
``reduction`` folds batch results in order and may stop early. ``EnsembleArray`` solves a
batch as one vectorized lane program; ``EnsembleSerial`` solves its trajectories one by one
(the reference every other algorithm must agree with).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import _pytree
from .._error_context import describe_trajectories
from .._problem import ODEProblem
from .._retcode import ReturnCode
from .._single import solve_problem
from .._solution import ODESolution, SolverStats
from .._timegrid import lane_save_grid, lane_stop_times
from .._validation import check_backend_name, check_flag
from ..backends import backend_for, get_backend
from ..events.record import concat_records, replace_trajectories
from .batch import (
    TRAJECTORY_COUNTS,
    BatchResult,
    BatchSpec,
    check_arrays,
    check_direction,
    check_save_count,
    index_array,
    solve_batch,
)
from .problem import EnsembleProblem
from .scheduling import map_batches_here
from .solution import dense_output_for_lane

__all__ = ["AbstractEnsembleAlgorithm", "EnsembleArray", "EnsembleSerial"]

_MAX_RERUNS = 100


def batch_size_limit(backend: str | None) -> int:
    """The default, and the largest automatic, number of trajectories per batch on
    ``backend`` (a name, ``None`` for that of ``prob.u0``): 10^6 on CuPy, 10^4 elsewhere."""
    return 1_000_000 if backend == "cupy" else 10_000


class AbstractEnsembleAlgorithm(abc.ABC):
    """How to compute the batches of an ensemble. Subclasses implement ``run_batch``; those
    that schedule batches elsewhere (``EnsembleDask``) override ``map_batches`` (the one way
    batches are scheduled: plain solves and both passes of a gradient) and ``run``."""

    @property
    def default_batch_size(self) -> int:
        """Trajectories per batch when the caller gives none (see ``batch_size_limit``)."""
        return batch_size_limit(self.backend_name())

    def batch_size_for(self, trajectories: int) -> int:
        """The batch size used when the caller gives none."""
        return min(trajectories, self.default_batch_size)

    def run(self, eprob: EnsembleProblem, batches: list[range], spec: BatchSpec) -> Any:
        """Solve all batches and assemble the EnsembleSolution."""
        from .assemble import assemble

        results = self.solve_batches(eprob, batches, spec)
        return assemble(eprob, results, spec.options.alg, spec.seed, sum(len(b) for b in batches))

    @abc.abstractmethod
    def run_batch(
        self,
        eprob: EnsembleProblem,
        indices: np.ndarray | range,
        spec: BatchSpec,
        repeat: np.ndarray,
    ) -> BatchResult:
        """Solve the trajectories ``indices`` (an array, or a range of them) at attempt
        ``repeat`` of each, as one batch."""

    def backend_name(self) -> str | None:
        """The backend batches compute on (``None``: that of ``prob.u0``)."""
        return None

    def lanes_for_gradients(self, batch_size: int) -> int:
        """Lanes per batch when the ensemble is differentiated (see the gradients guide)."""
        return batch_size

    def gradient_sensealg(self, sensealg: Any) -> Any:
        """The sensitivity algorithm that differentiates this ensemble (the user's, or
        ``None`` for the default; compiled kernels have their own)."""
        return sensealg

    def map_batches(
        self,
        func: Callable[..., Any],
        batch_args: Sequence[tuple],
        *,
        label: str = "batch",
        send_back: Callable[[Any], Any] | None = None,
    ) -> Iterator[Any]:
        """``func(*args)`` for each batch's ``args``, in batch order (lazily, so a caller that
        stops early stops the work). Here: a loop.

        Parameters
        ----------
        func : callable
            One batch's work.
        batch_args : sequence of tuple
            Each batch's arguments; they may hold handles from an earlier ``map_batches``.
        label : str
            What the batches are (names the tasks where they are scheduled elsewhere).
        send_back : callable, optional
            If given, each batch's full result stays where it was computed and the iterator
            yields ``(send_back(result), handle)``: the handle stands for the result as an
            argument of a later ``map_batches`` (here it is the result itself).
        """
        return map_batches_here(func, batch_args, send_back)

    def solve_batches(
        self, eprob: EnsembleProblem, batches: list[range], spec: BatchSpec
    ) -> Iterator[BatchResult]:
        """Batch results in order (lazily, so a converged reduction stops the work)."""
        return self.map_batches(finish_batch, [(self, eprob, b, spec) for b in batches])


def finish_batch(
    alg: AbstractEnsembleAlgorithm,
    eprob: EnsembleProblem,
    indices: np.ndarray | range,
    spec: BatchSpec,
) -> BatchResult:
    """Solve a batch (trajectory indices, or a range of them), then apply ``output_func``
    with its reruns. Each trajectory keeps its last attempt's save times, return code and
    statistics; the saved states and dense output, which only ``output_func`` reads, are
    dropped."""
    first_attempt = np.broadcast_to(np.int64(0), (len(indices),))
    result = alg.run_batch(eprob, indices, spec, first_attempt)  # a range stays one
    if eprob.output_func is None:
        return result
    indices = index_array(indices)
    values: list[Any] = [None] * len(indices)
    pending = np.arange(len(indices))
    repeat = np.zeros(len(indices), dtype=np.int64)
    current, rerun_times = result, {}
    for _ in range(_MAX_RERUNS):
        rerun = []
        for pos_in_current, pos in enumerate(pending):
            sol = _trajectory_solution(current, pos_in_current, eprob, spec, int(repeat[pos]))
            value, again = eprob.output(sol, int(indices[pos]))
            values[pos] = value
            if again:
                rerun.append(pos)
            elif current is not result:
                _copy_lane(result, pos, current, pos_in_current)
                rerun_times[pos] = _lane_times(current.t, pos_in_current)
        if not rerun:
            result.values, result.u, result.dense = values, None, None
            result.t = _with_rerun_times(result.t, rerun_times, len(indices))
            return result
        pending = np.asarray(rerun)
        repeat[pending] += 1
        current = alg.run_batch(eprob, indices[pending], spec, repeat[pending])
        check_save_count(current, result.t.shape[-1], "their first attempt")
        if spec.callback is not None:
            result.events = replace_trajectories(result.events, current.events, indices[pending])
    raise RuntimeError(
        f"output_func asked for more than {_MAX_RERUNS} reruns of "
        f"{describe_trajectories(indices[pending])}; it must return rerun=False in the end "
        f"(for instance once it has counted enough attempts of a trajectory)"
    )


def _copy_lane(into: BatchResult, pos: int, source: BatchResult, source_pos: int) -> None:
    """Trajectory ``pos`` of ``into`` takes its return code and statistics from its attempt
    at ``source_pos`` of ``source`` (a rerun)."""
    for name in TRAJECTORY_COUNTS:
        if getattr(into, name) is not None and getattr(source, name) is not None:
            getattr(into, name)[pos] = getattr(source, name)[source_pos]


def _lane_times(t: Any, pos: int) -> Any:
    """The save times ``(nsave,)`` of the trajectory at ``pos`` of a batch whose save times
    are ``t`` (``(nsave,)`` shared by its trajectories, or ``(B, nsave)``)."""
    return t if t.ndim == 1 else t[pos, ...]


def _with_rerun_times(t: Any, reruns: dict[int, Any], lanes: int) -> Any:
    """The save times ``t`` of a batch of ``lanes`` trajectories with those at the positions
    of ``reruns`` replaced by their last attempt's ``(nsave,)``: ``(lanes, nsave)``, or
    ``(nsave,)`` when all are the same (a batch's shape is decided by its times alone)."""
    if not reruns:
        return t
    xp = _namespace(t)
    t = xp.asarray(xp.broadcast_to(t, (lanes, t.shape[-1])), copy=True)
    for pos, lane_t in reruns.items():
        t[pos, ...] = lane_t
    return t[0, ...] if bool(xp.all(t == t[:1, ...])) else t


def _trajectory_solution(
    batch: BatchResult, pos: int, eprob: EnsembleProblem, spec: BatchSpec, repeat: int
) -> ODESolution:
    t = _lane_times(batch.t, pos)
    stats = SolverStats(
        int(batch.nf[pos]),
        int(batch.naccept[pos]),
        int(batch.nreject[pos]),
        nswitch=0 if batch.nswitch is None else int(batch.nswitch[pos]),
    )
    events = batch.events
    return ODESolution(
        t,
        batch.u[pos, ...],
        ReturnCode(int(batch.retcode[pos])),
        stats,
        None,
        spec.options.alg,
        None if batch.dense is None else dense_output_for_lane(batch.dense, pos),
        None if events is None else events.for_trajectory(int(batch.indices[pos])),
        problem_of=functools.partial(
            eprob.trajectory_problem, int(batch.indices[pos]), repeat, spec.seed
        ),
    )


@dataclasses.dataclass(frozen=True)
class EnsembleArray(AbstractEnsembleAlgorithm):
    """Each batch is one vectorized array program; every trajectory keeps its own step size.

    The counterpart of DiffEqGPU's EnsembleCPUArray/EnsembleGPUArray, without lock-step: each
    lane has its own time, step, error control and return code, and finished lanes leave the
    working set.

    Parameters
    ----------
    backend : {"numpy", "cupy"}, optional
        Where batches compute; by default the array library of ``prob.u0``.
    lockstep : bool
        Share one step size across a batch (controlled by the RMS of the lanes' errors), as
        array ensembles elsewhere do. Only for comparison: single trajectories then no longer
        control their own error.
    """

    backend: str | None = None
    lockstep: bool = False

    def __post_init__(self) -> None:
        check_backend_name(self.backend)
        check_flag("lockstep", self.lockstep)

    def backend_name(self) -> str | None:
        return self.backend

    def run_batch(
        self,
        eprob: EnsembleProblem,
        indices: np.ndarray | range,
        spec: BatchSpec,
        repeat: np.ndarray,
    ) -> BatchResult:
        return solve_batch(eprob, indices, spec, repeat)


@dataclasses.dataclass(frozen=True)
class EnsembleSerial(AbstractEnsembleAlgorithm):
    """One single solve per trajectory: slow, simple, and the reference for the others."""

    def lanes_for_gradients(self, batch_size: int) -> int:
        return 1  # one trajectory at a time, as without gradients

    def run_batch(
        self,
        eprob: EnsembleProblem,
        indices: np.ndarray | range,
        spec: BatchSpec,
        repeat: np.ndarray,
    ) -> BatchResult:
        if spec.dense:
            raise ValueError(
                "EnsembleSerial keeps no dense output; use EnsembleArray for dense=True"
            )
        indices = index_array(indices)
        problems = trajectory_problems(eprob, indices, repeat, spec)
        # As in an EnsembleArray batch: tstops must lie in the span covering the batch's
        # trajectories, each of which steps onto those inside its own span; preset times
        # (checked against all spans by solve) are passed by where a trajectory's span misses.
        spans = np.array([prob.tspan for prob in problems])
        lane_save_grid(spec.saveat, spans[:, 0], spans[:, 1], indices)  # names a bad span
        stops = lane_stop_times(spec.tstops, spans[:, 0], spans[:, 1])
        sols = []
        for prob in problems:
            spec.options.check_state(prob.u0, prob.tspan)
            saveat = spec.saveat if spec.saveat is not None else list(prob.tspan)
            lo, hi = sorted(prob.tspan)
            inside = None if stops is None else stops[(stops >= lo) & (stops <= hi)]
            sols.append(
                solve_problem(
                    prob,
                    spec.options,
                    saveat=saveat,
                    tstops=None if inside is None or not inside.size else inside,
                    callbacks=spec.callback,
                )
            )
        xp = _namespace(sols[0].u)
        times = [s.t for s in sols]
        shared = all(bool(xp.all(t == times[0])) for t in times)
        return BatchResult(
            indices=indices,
            t=times[0] if shared else xp.stack(times),
            u=xp.stack([s.u for s in sols]),
            retcode=np.array([int(s.retcode) for s in sols], dtype=np.int64),
            nf=np.array([s.stats.nf for s in sols], dtype=np.int64),
            naccept=np.array([s.stats.naccept for s in sols], dtype=np.int64),
            nreject=np.array([s.stats.nreject for s in sols], dtype=np.int64),
            nswitch=np.array([s.stats.nswitch for s in sols], dtype=np.int64),
            events=concat_records(
                [
                    None if s.events is None else _renumbered(s.events, int(i))
                    for s, i in zip(sols, indices, strict=True)
                ]
            ),
        )


def trajectory_problems(
    eprob: EnsembleProblem, indices: np.ndarray, repeat: np.ndarray, spec: BatchSpec
) -> list[ODEProblem]:
    """Trajectories ``indices`` (attempt ``repeat``) of any ensemble, each as its own
    ODEProblem, refused where an ``EnsembleArray`` batch of them would be (the same checks,
    the same messages).

    Their initial states take the ensemble's state dtype (``prob.u0``'s), and their
    per-trajectory parameters (from ``prob_func``, ``batch_func`` or arrays) too where they
    are floating, as in an ``EnsembleArray`` batch.
    """
    prob = eprob.prob
    dtype = prob.u0.dtype
    if eprob.prob_func is not None:
        problems = []
        for i, r in zip(indices, repeat, strict=True):
            traj = eprob.trajectory(int(i), int(r), spec.seed)  # checked as it is built
            u0 = _in_state_dtype(traj.u0, dtype)
            problems.append(traj.remake(u0=u0, p=_in_state_dtype(traj.p, dtype)))
        check_direction(*np.array([traj.tspan for traj in problems]).T)
        return problems
    if not (eprob.arrays or eprob.batch_func):
        return [prob] * len(indices)
    if eprob.batch_func is not None:
        data, rows = eprob.batch(indices, repeat, spec.seed), range(len(indices))
    else:
        data, rows = eprob.arrays, indices
    backend = get_backend(spec.backend) if spec.backend else backend_for(prob.u0)
    check_arrays(data, prob, len(indices), None if eprob.batch_func else indices, backend)
    problems = []
    for row in rows:
        changes = {}
        if "u0" in data:
            changes["u0"] = _in_state_dtype(data["u0"][row, ...], dtype)
        if "tspan" in data:
            changes["tspan"] = tuple(float(x) for x in np.asarray(data["tspan"][row]))
        if "p" in data:
            p_row = _pytree.map_leaves(lambda leaf, row=row: leaf[row, ...], data["p"])
            changes["p"] = _in_state_dtype(p_row, dtype)
        problems.append(prob.remake(**changes))
    return problems


def _in_state_dtype(p: Any, dtype: Any) -> Any:
    """``p`` with its floating NumPy and array-API leaves cast to ``dtype`` (others as they
    are: Python numbers adapt by themselves, integers stay integers, traced values stay)."""
    import array_api_compat

    from .._tracing import is_traced

    def cast(leaf: Any) -> Any:
        if isinstance(leaf, np.generic) and leaf.dtype.kind == "f":
            return leaf.astype(dtype)
        if is_traced(leaf) or not array_api_compat.is_array_api_obj(leaf) or np.isscalar(leaf):
            return leaf
        xp = array_api_compat.array_namespace(leaf)
        return xp.astype(leaf, dtype) if xp.isdtype(leaf.dtype, "real floating") else leaf

    return _pytree.map_leaves(cast, p)


def _renumbered(events: Any, trajectory: int) -> Any:
    """A single solve's events as those of ``trajectory``."""
    return dataclasses.replace(events, trajectory=np.full_like(events.trajectory, trajectory))


def _namespace(x: Any) -> Any:
    import array_api_compat

    return array_api_compat.array_namespace(x)
