"""EnsembleDask: batches of an ensemble as Dask tasks, from a laptop to an HPC cluster.

Each batch is one task that runs the same function a local ``EnsembleArray`` batch runs
(``finish_batch``), on the worker's backend. Batches are independent, so the scheduler
balances them freely; when a worker dies, Dask recomputes its tasks elsewhere and the result
is the same. A solve that fails cancels all its tasks and releases their results before the
error reaches the caller. Dask is imported only here, when an ``EnsembleDask`` runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._error_context import add_note, describe_trajectories
from .._validation import check_backend_name, check_flag, positive_int
from ..backends import host_dtype, to_host
from ..events.record import record_to_host
from .algorithms import (
    AbstractEnsembleAlgorithm,
    EnsembleArray,
    batch_size_limit,
    finish_batch,
)
from .assemble import _stack_values, assemble, batch_summary
from .batch import TRAJECTORY_COUNTS, BatchResult, BatchSpec, check_save_count
from .dask_cancel import STOP_WAIT_S, cancel_and_wait
from .problem import EnsembleProblem
from .solution import EnsembleSolution, EnsembleStats

if TYPE_CHECKING:
    from ..kernels.ensemble import EnsembleKernel

__all__ = ["EnsembleDask"]

_BATCHES_PER_WORKER = 4


@dataclasses.dataclass(frozen=True)
class EnsembleDask(AbstractEnsembleAlgorithm):
    """Solve the batches of an ensemble as tasks on a Dask cluster.

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster to use. By default the current Dask client; if there is none, a
        ``LocalCluster`` of worker processes is started for the call and closed afterwards.
        ``solve(eprob, alg, client, ...)`` is shorthand for ``EnsembleDask(client)``.
    backend : {"numpy", "cupy"}, optional
        The backend each worker computes on (``"cupy"`` on a dask-cuda cluster uses each
        worker's own GPU). By default the array library of ``prob.u0``.
    batch_size : int, optional
        Trajectories per task. By default about four tasks per worker thread (so the
        scheduler can balance uneven batches), at most 10,000 per task on NumPy.
    output : {"memory", "dask", "zarr"}
        Where the saved states go. ``"memory"``: gathered into host memory (``sim.u`` a
        NumPy array). ``"dask"``: kept on the workers as a ``dask.array`` with one chunk per
        batch, for further Dask work (compute it with the cluster's client, e.g.
        ``sim.u.mean(axis=0).compute(scheduler=client)``, or with that client as default;
        ``sim.to_host()``, ``sim[i]`` and the summaries compute with it themselves).
        ``"zarr"``: written by the workers into a Zarr array at ``store``, for ensembles
        larger than the driver's memory (``sim.u`` then reads it lazily as a
        ``dask.array``). Return codes and statistics always come back.
    store : str or zarr store, optional
        Where ``output="zarr"`` writes (a path every worker can reach).
    progress : bool, optional
        Show a progress bar over batches (needs ``tqdm``). By default only when standard
        error is a terminal.
    kernel : EnsembleKernel, optional
        Solve each batch on its worker with this compiled kernel instead of the array path
        (e.g. ``EnsembleKernel(threads=1)`` for one kernel thread per worker thread); the
        results are those of the same ``EnsembleKernel`` run locally, bitwise.

    Notes
    -----
    ``output_func`` runs on the workers. A ``reduction`` runs on the workers too when the
    EnsembleProblem has a ``combine``: each task reduces its own batch and the partial
    results are combined pairwise on the workers, as a tree in batch order, so only reduced
    values travel and the result does not depend on the number of workers. Without
    ``combine``, batch values travel to the driver, which folds them in order and stops early
    once the reduction reports convergence.
    """

    client: Any = None
    backend: str | None = None
    batch_size: int | None = None
    output: Literal["memory", "dask", "zarr"] = "memory"
    store: Any = None
    progress: bool | None = None
    kernel: EnsembleKernel | None = None

    def __post_init__(self) -> None:
        self._check_fields()
        if self.kernel is not None:
            from ..kernels.ensemble import EnsembleKernel

            if not isinstance(self.kernel, EnsembleKernel):
                raise TypeError(f"kernel must be an EnsembleKernel, got {self.kernel!r}")
            if self.backend is not None:
                raise ValueError(
                    f"backend={self.backend!r} is for the array path; with kernel=... the "
                    f"kernel's device decides where batches run: give one of them, not both"
                )
        if self.output not in ("memory", "dask", "zarr"):
            raise ValueError(f"output must be 'memory', 'dask' or 'zarr', got {self.output!r}")
        if self.output == "zarr" and self.store is None:
            raise ValueError(
                "output='zarr' needs store=<path or zarr store> that workers can reach"
            )

    def _check_fields(self) -> None:
        """Refuse a wrong ``client``, ``backend``, ``batch_size`` or ``progress`` now, not
        inside the solve (``batch_size=0`` failed in ``range``, a string client in Dask)."""
        if self.client is not None and not callable(getattr(self.client, "submit", None)):
            raise TypeError(
                f"client must be a distributed.Client (or None), got {self.client!r}; for a "
                f"scheduler address, pass distributed.Client({self.client!r})"
            )
        check_backend_name(self.backend)
        object.__setattr__(
            self, "batch_size", positive_int("batch_size", self.batch_size, allow_none=True)
        )
        check_flag("progress", self.progress, allow_none=True)

    def backend_name(self) -> str | None:
        return self.backend

    def batch_size_for(self, trajectories: int) -> int:
        if self.batch_size is not None:
            return self.batch_size
        threads = _thread_count(self.client)
        cap = (
            batch_size_limit(self.backend)
            if self.kernel is None
            else self.kernel.default_batch_size
        )
        return max(1, min(cap, math.ceil(trajectories / (_BATCHES_PER_WORKER * threads))))

    def map_batches(
        self,
        func: Callable[..., Any],
        batch_args: Sequence[tuple],
        *,
        label: str = "batch",
        send_back: Callable[[Any], Any] | None = None,
    ) -> Iterator[Any]:
        """``func(*args)`` for each batch's ``args`` as keyed Dask tasks (``dxode-{label}-
        {token}-{k}``) with retries, gathered in batch order with the progress bar; a failure
        cancels every task of the call. With ``send_back`` the full results stay on the
        workers, only ``send_back(result)`` travels, and the handles are the tasks' futures
        (a later call's tasks that take them run where those results are, and the scheduler
        recomputes a result whose worker died). The cluster must outlive the call (handles
        point into it), so it is ``client`` or the running default client."""
        tasks = _Tasks(self._lasting_client(), self._progress())
        self._keep_sources(batch_args)
        return tasks.map(func, batch_args, label, send_back)

    def _lasting_client(self) -> Any:
        client = _client_or_default(self.client)
        if client is None:
            raise ValueError(
                "a differentiated EnsembleDask solve needs a running cluster (its backward "
                "pass runs later on the workers that hold the forward pass's steps): pass "
                "EnsembleDask(client) or start a default client, e.g. with dxode.local_cluster()"
            )
        return client

    def _keep_sources(self, sent: Any) -> None:
        """With a kernel: the source text of the functions in ``sent`` goes with them, for the
        workers' kernels to rewrite as this process's do (``rhs_source.keep_sources``)."""
        if self.kernel is not None:
            from ..kernels.rhs_source import keep_sources

            keep_sources(sent)

    def _progress(self) -> bool:
        return self.progress if self.progress is not None else sys.stderr.isatty()

    def run_batch(
        self,
        eprob: EnsembleProblem,
        indices: np.ndarray | range,
        spec: BatchSpec,
        repeat: np.ndarray,
    ) -> BatchResult:
        return self.batch_algorithm(spec).run_batch(eprob, indices, spec, repeat)

    def batch_algorithm(self, spec: BatchSpec) -> AbstractEnsembleAlgorithm:
        """What solves each batch on its worker: the kernel, or the array path."""
        return (
            self.kernel if self.kernel is not None else EnsembleArray(self.backend, spec.lockstep)
        )

    def lanes_for_gradients(self, batch_size: int) -> int:
        if self.kernel is not None:
            return self.kernel.lanes_for_gradients(batch_size)
        return super().lanes_for_gradients(batch_size)

    def gradient_sensealg(self, sensealg: Any) -> Any:
        if self.kernel is not None:
            return self.kernel.gradient_sensealg(sensealg)
        return super().gradient_sensealg(sensealg)

    def run(self, eprob: EnsembleProblem, batches: list[range], spec: BatchSpec) -> Any:
        if spec.dense:
            raise ValueError("dense output is not kept by EnsembleDask; use EnsembleArray")
        if self.output != "memory" and (eprob.output_func or eprob.reduction) is not None:
            func = "output_func" if eprob.output_func is not None else "reduction"
            raise ValueError(
                f"output={self.output!r} is where saved states go, but this ensemble keeps its "
                f"{func}'s values instead, which come back to the driver: use output='memory' "
                f"(the default), or no {func} to keep the states on the workers or in Zarr"
            )
        if self.output == "dask" and self.client is None and _default_client() is None:
            raise ValueError(
                "output='dask' keeps the saved states on the workers, but without a client "
                "EnsembleDask starts a LocalCluster for the call and closes it afterwards, with "
                "them: pass EnsembleDask(client, output='dask') or start a default client (e.g. "
                "in dxode.local_cluster()), or use output='memory' or 'zarr'"
            )
        self._keep_sources(eprob)
        with _client_for(self.client) as client:
            return _Run(self, client, eprob, batches, spec).solve()


class _Tasks:
    """The tasks of one scheduling call on ``client``: submitted under one token, gathered in
    order, and all cancelled (their results released) when the call fails."""

    def __init__(self, client: Any, progress: bool) -> None:
        self.client, self.progress = client, progress
        self.token = uuid.uuid4().hex[:12]
        # Every future of the call, in the lists that hold them (``None`` once released),
        # so that a failure can cancel them all.
        self._groups: list[list[Any]] = []

    def submit(self, func: Callable[..., Any], batch_args: Sequence[tuple], label: str) -> list:
        """One keyed task with retries per batch, tracked for ``abandon``; earlier batches
        first (Dask's own order is arbitrary), so that results, gathered in batch order, come
        back while later batches run."""
        return self.track(
            [
                self.client.submit(
                    func,
                    *args,
                    key=f"dxode-{label}-{self.token}-{k}",
                    retries=2,
                    priority=len(batch_args) - k,
                )
                for k, args in enumerate(batch_args)
            ]
        )

    def track(self, futures: list[Any]) -> list[Any]:
        """Remember ``futures`` (the list itself, which its users may clear) for ``abandon``."""
        self._groups.append(futures)
        return futures

    def in_order(self, futures: list[Any], batches: Sequence[Any]) -> Iterator[Any]:
        return _in_order(self.client, futures, batches, self.progress)

    def map(
        self,
        func: Callable[..., Any],
        batch_args: Sequence[tuple],
        label: str,
        send_back: Callable[[Any], Any] | None,
    ) -> Iterator[Any]:
        """``AbstractEnsembleAlgorithm.map_batches`` on Dask."""
        try:
            futures = self.submit(func, batch_args, label)
            if send_back is None:
                yield from self.in_order(futures, [None] * len(futures))
                return
            handles = list(futures)
            back = self.track(
                [
                    self.client.submit(send_back, f, key=f"dxode-{label}-back-{self.token}-{k}")
                    for k, f in enumerate(futures)
                ]
            )
            yield from zip(self.in_order(back, [None] * len(back)), handles, strict=True)
        except BaseException as err:
            self.abandon(err)
            raise

    def abandon(self, err: BaseException) -> None:
        """After a failure: cancel every task of the call, which also releases the results
        the workers hold; after an error (not an interrupt) wait until none runs any more."""
        futures = [f for group in self._groups for f in group if f is not None]
        self._groups.clear()
        if not futures or self.client.status in _CLOSED:  # its tasks were released with it
            return
        try:
            if not isinstance(err, (Exception, GeneratorExit)):  # an interrupt: reach the
                self.client.cancel(futures)  # caller now, not once every running task ends
                return
            running = cancel_and_wait(self.client, futures)
            if running:
                add_note(
                    err,
                    f"{running} tasks of this EnsembleDask solve may still run on the "
                    f"workers {STOP_WAIT_S:.0f} s later (Dask cannot interrupt a running task, "
                    f"and a worker stuck in one may not answer); they finish in the background "
                    f"and their results are dropped",
                )
        except Exception as cleanup_err:  # never hide the error that ended the solve
            add_note(err, f"cancelling the EnsembleDask solve's tasks failed: {cleanup_err!r}")


class _Run:
    """One EnsembleDask solve: submit the batch tasks, then collect in the requested form."""

    def __init__(
        self,
        alg: EnsembleDask,
        client: Any,
        eprob: EnsembleProblem,
        batches: list[range],
        spec: BatchSpec,
    ) -> None:
        self.alg, self.client, self.eprob, self.batches, self.spec = (
            alg,
            client,
            eprob,
            batches,
            spec,
        )
        self.tasks = _Tasks(client, alg._progress())
        self.token = self.tasks.token
        self._n = sum(len(b) for b in batches)

    def solve(self) -> EnsembleSolution:
        try:
            return self._solve()
        except BaseException as err:
            self.tasks.abandon(err)
            raise

    def _solve(self) -> EnsembleSolution:
        problem = self._problem_task()
        target = self._zarr_target() if self.alg.output == "zarr" else None
        reduce_on_workers = self.eprob.reduction is not None and self.eprob.combine is not None
        futures = self.tasks.submit(
            _dask_task,
            [
                (
                    problem,
                    indices,
                    self.spec,
                    self.alg.batch_algorithm(self.spec),
                    target,
                    reduce_on_workers,
                )
                for indices in self.batches
            ],
            "batch",
        )
        if reduce_on_workers:
            return self._tree_reduce(futures)
        if self.alg.output == "memory":
            results = self._in_order(futures)
            return assemble(self.eprob, results, self.spec.options.alg, self.spec.seed, self._n)
        return self._distributed(futures, target)

    def _problem_task(self) -> Any:
        """The EnsembleProblem as a task every batch depends on. Unlike scattered data, which
        is lost for good when every worker holding it dies, the scheduler can recompute it."""
        import dask

        # Sent through the scheduler once, deliberately: no "large graph" warning for it.
        with dask.config.set({"distributed.admin.large-graph-warning-threshold": sys.maxsize}):
            try:
                future = self.client.submit(_problem, self.eprob, key=f"dxode-problem-{self.token}")
            except Exception as err:  # Dask's error says only that its graph did not serialize
                part = _unpicklable_part(self.eprob)
                if part is None:
                    raise
                raise TypeError(
                    f"EnsembleDask sends the EnsembleProblem to its workers, but its {part[0]} "
                    f"cannot be pickled ({part[1]}); define functions at module level (or as "
                    f"closures over picklable values) and create locks, open files, "
                    f"connections and generators on the workers, not in the problem, or solve "
                    f"in this process with EnsembleArray()"
                ) from err
        return self._track([future])[0]

    def _track(self, futures: list[Any]) -> list[Any]:
        return self.tasks.track(futures)

    def _in_order(self, futures: list[Any]) -> Iterator[Any]:
        return self.tasks.in_order(futures, self.batches)

    def _zarr_target(self) -> dict[str, Any]:
        """A Zarr group: ``u`` and each trajectory's return code and statistics."""
        import zarr

        shape, dtype = _output_layout(self.eprob, self.spec, self._n)
        chunk = len(self.batches[0])
        group = zarr.open_group(self.alg.store, mode="w")
        group.create_array(
            "u", shape=shape, dtype=dtype, chunks=(chunk, *shape[1:]), fill_value=float("nan")
        )
        for name in TRAJECTORY_COUNTS:
            group.create_array(
                name, shape=(self._n,), dtype=np.int64, chunks=(chunk,), fill_value=-1
            )
        if self.spec.saveat is None:  # each trajectory's own start and end: they may differ
            group.create_array(
                "t", shape=shape[:2], dtype=dtype, chunks=(chunk, 2), fill_value=float("nan")
            )
        return {"store": self.alg.store, "n_save": shape[1]}

    def _distributed(self, futures: list[Any], target: dict[str, Any] | None) -> EnsembleSolution:
        """Outputs stay on the workers (a dask.array) or in Zarr; metadata comes back."""
        import dask
        import dask.array as da

        if target is not None:
            return self._zarr_solution(futures, target)
        metas = self._track(
            [
                self.client.submit(_metadata, f, key=f"dxode-meta-{self.token}-{k}")
                for k, f in enumerate(futures)
            ]
        )
        done = list(self._in_order(metas))
        shape, dtype = _output_layout(self.eprob, self.spec, self._n)
        for meta in done:  # the dask.array's chunks must have the shape it declares
            check_save_count(meta, shape[1], "trajectory 0")
        u = da.concatenate(
            [
                da.from_delayed(
                    dask.delayed(_saved_states)(f), shape=(len(b), *shape[1:]), dtype=dtype
                )
                for f, b in zip(futures, self.batches, strict=True)
            ]
        )
        sim = assemble(self.eprob, done, self.spec.options.alg, self.spec.seed, self._n)
        sim.u = u
        sim._futures = futures  # keep the workers' results alive as long as the solution
        sim._scheduler = self.client  # sim.to_host(), sim[i], summaries: computed there
        return sim

    def _tree_reduce(self, futures: list[Any]) -> EnsembleSolution:
        """Combine per-batch partial reductions pairwise on the workers, in batch order."""
        combine = self.eprob.combine
        level = self._track(
            [
                self.client.submit(_partial, f, key=f"dxode-partial-{self.token}-{k}")
                for k, f in enumerate(futures)
            ]
        )
        depth = 0
        while len(level) > 1:
            pairs = [level[i : i + 2] for i in range(0, len(level), 2)]
            level = self._track(
                [
                    self.client.submit(
                        combine, *pair, key=f"dxode-combine-{self.token}-{depth}-{i}"
                    )
                    if len(pair) == 2
                    else pair[0]
                    for i, pair in enumerate(pairs)
                ]
            )
            depth += 1
        summary = self._summaries(futures)  # raises a batch's error, noted, first
        try:
            reduced = level[0].result()
        except Exception as err:
            add_note(
                err,
                "raised by combine, merging batches' reductions on the workers of an "
                "EnsembleDask solve",
            )
            raise
        return EnsembleSolution(
            t=None if summary["own_times"] else summary["t"],  # kept only when shared
            u=reduced,
            retcodes=None,
            stats=EnsembleStats(None, None, None, totals=summary["totals"]),
            eprob=self.eprob,
            alg=self.spec.options.alg,
            converged=None,
            seed=self.spec.seed,
            counts=summary["counts"],
        )

    def _zarr_solution(self, futures: list[Any], target: dict[str, Any]) -> EnsembleSolution:
        """The results are in the Zarr group; only per-batch counts come back."""
        import dask.array as da
        import zarr

        summary = self._summaries(futures)
        group = zarr.open_group(target["store"], mode="r")
        return EnsembleSolution(
            t=group["t"] if summary["own_times"] else summary["t"],
            u=da.from_zarr(group["u"]),
            retcodes=group["retcode"],
            stats=EnsembleStats(
                group["nf"],
                group["naccept"],
                group["nreject"],
                totals=summary["totals"],
                nswitch=group["nswitch"],
            ),
            eprob=self.eprob,
            alg=self.spec.options.alg,
            seed=self.spec.seed,
            counts=summary["counts"],
        )

    def _summaries(self, futures: list[Any]) -> dict[str, Any]:
        """Return-code counts and step totals over all batches: O(1) memory on the driver."""
        small = self._track(
            [
                self.client.submit(batch_summary, f, key=f"dxode-summary-{self.token}-{k}")
                for k, f in enumerate(futures)
            ]
        )
        total: dict[str, Any] = {}
        for part in self._in_order(small):
            t = part.pop("t")
            # Batches whose trajectories share save times may still save at other times
            # than the first batch (compared with it: its times were those of the batch).
            part["own_times"] += int(not np.array_equal(t, total.setdefault("t", t)))
            for key, value in part.items():
                total[key] = total[key] + value if key in total else value
        total["totals"] = tuple(int(x) for x in total["totals"])
        return total


def _dask_task(
    eprob: EnsembleProblem,
    indices: range,
    spec: BatchSpec,
    batch_alg: AbstractEnsembleAlgorithm,
    target: dict[str, Any] | None,
    reduce_here: bool,
) -> BatchResult:
    """One batch on a worker: solve, apply output_func, then keep only what must travel."""
    result = finish_batch(batch_alg, eprob, indices, spec)
    result.t = to_host(result.t)
    result.events = record_to_host(result.events)
    if result.u is not None:
        result.u = to_host(result.u)
    if reduce_here:
        values = result.values if eprob.output_func is not None else result.u
        result.values = eprob.reduce(
            eprob.initial_accumulator(), _stack_values(values), result.indices
        )[0]
        result.u = None
    if target is not None:
        import zarr

        # Zarr would cut or repeat save times
        check_save_count(result, target["n_save"], "trajectory 0")
        group = zarr.open_group(target["store"], mode="r+")
        rows = slice(indices.start, indices.stop)
        group["u"][rows] = result.u
        for name in TRAJECTORY_COUNTS:
            group[name][rows] = result.counts(name)
        if "t" in group:
            group["t"][rows] = np.broadcast_to(result.t, (len(indices), result.t.shape[-1]))
        result.u = None
    return result


def _problem(eprob: EnsembleProblem) -> EnsembleProblem:
    return eprob


def _unpicklable_part(eprob: EnsembleProblem) -> tuple[str, Exception] | None:
    """The first part of ``eprob`` (``prob.f``, ``prob_func``, ...) that cloudpickle, as Dask
    uses it, cannot pickle, with its error; ``None`` if every part pickles."""
    import cloudpickle

    parts = [(f"prob.{name}", value) for name, value in vars(eprob.prob).items()]
    parts += [(name, value) for name, value in vars(eprob).items() if name != "prob"]
    for name, value in parts:
        try:
            cloudpickle.dumps(value)
        except Exception as err:
            return name, err
    return None


def _metadata(result: BatchResult) -> BatchResult:
    """The batch's small part: indices, times, return codes and statistics."""
    return dataclasses.replace(result, u=None, values=None)


def _saved_states(result: BatchResult) -> np.ndarray:
    return result.u


def _partial(result: BatchResult) -> Any:
    return result.values


def _output_layout(eprob: EnsembleProblem, spec: BatchSpec, n: int) -> tuple[tuple[int, ...], Any]:
    """Shape ``(N, nsave, *shape)`` and dtype of the saved states, known before solving."""
    from .._timegrid import save_times

    if spec.saveat is None:
        n_save = 2  # each trajectory's start and end
    elif np.ndim(spec.saveat) == 0:
        # An interval needs one shared tspan (checked per batch): trajectory 0's, which a
        # prob_func or batch_func may set (each batch's count is checked against it).
        tspan = (
            eprob.prob.tspan
            if eprob.prob_func is None and eprob.batch_func is None
            else eprob.trajectory_problem(0, 0, spec.seed).tspan
        )
        n_save = len(save_times(spec.saveat, *tspan))
    else:
        n_save = len(spec.saveat)
    dtype = host_dtype(eprob.prob.u0.dtype)
    return (n, n_save, *tuple(eprob.prob.u0.shape)), dtype


def _in_order(
    client: Any, futures: list[Any], batches: Sequence[range | None], progress: bool
) -> Iterator[Any]:
    """Results of the per-batch ``futures`` in batch order, as they complete; raises the
    first batch's error as soon as it arrives (its caller's ``_Tasks.abandon`` then cancels
    every task of the call), and cancels the rest if the consumer stops early."""
    from distributed import as_completed

    bar = _progress_bar(len(futures)) if progress else None
    direct = _gathers_directly(client)
    ready: dict[int, Any] = {}
    position = {f.key: k for k, f in enumerate(futures)}
    next_k = 0
    try:
        for future in as_completed(futures, loop=client.loop):
            k = position[future.key]
            if future.status != "finished":
                _check_still_open(client)
                _raise_for_batch(future, k, batches[k])
            ready[k] = future
            if bar is not None:
                bar.update(1)
            while next_k in ready:
                yield client.gather(ready.pop(next_k), direct=direct)
                futures[next_k] = None  # release the worker's copy once folded
                next_k += 1
    except GeneratorExit:  # the consumer stopped early (a converged reduction)
        pending = [f for f in futures if f is not None and not f.done()]
        running = cancel_and_wait(client, pending, STOP_WAIT_S) if pending else 0
        if running:  # no error to note it on: the solve returns its result
            warnings.warn(
                f"{running} tasks of this EnsembleDask solve may still run on the workers "
                f"{STOP_WAIT_S:g} s after its reduction stopped early (Dask cannot interrupt a "
                f"running task, and a worker stuck in one may not answer); they finish in the "
                f"background and their results are dropped",
                RuntimeWarning,
                stacklevel=2,
            )
        raise
    finally:
        if bar is not None:
            bar.close()


def _gathers_directly(client: Any) -> bool | None:
    """Whether to fetch results from the workers themselves: yes for an in-process
    ``LocalCluster``'s client (its workers run on this machine; Dask's default relays every
    result through the scheduler, which here shares the driver's process and cores), else
    the client's own setting (``direct_to_workers``, default: through the scheduler, which
    works wherever only the scheduler is reachable)."""
    if client.direct_to_workers is not None:
        return client.direct_to_workers
    from distributed import LocalCluster

    return True if isinstance(getattr(client, "cluster", None), LocalCluster) else None


def _check_still_open(client: Any) -> None:
    """Refuse to go on when ``client`` was closed during the solve: Dask then cancels its
    tasks and reports each batch as "cancelled for reason: unknown" (or "IOLoop is closed"),
    which says nothing of why."""
    if client.status in _CLOSED:
        raise RuntimeError(
            "EnsembleDask's client was closed during the solve, which cancelled its batches: "
            "keep the client (and its cluster) open until solve returns"
        )


def _raise_for_batch(future: Any, k: int, batch: range | None) -> None:
    """Raise a failed batch's error (the user's exception, or Dask's ``KilledWorker``),
    noting the batch (and its trajectories where known)."""
    try:
        future.result()
    except Exception as err:
        where = "" if batch is None else f" ({describe_trajectories(batch)})"
        add_note(err, f"in batch {k}{where} of an EnsembleDask solve")
        raise


def _progress_bar(total: int) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        print("dxode: progress needs tqdm (pip install tqdm); continuing without", file=sys.stderr)
        return None
    return tqdm(total=total, desc="dxode batches", unit="batch")


def _thread_count(client: Any) -> int:
    """Worker threads of ``client`` (or of the default client, or this machine's cores)."""
    with contextlib.suppress(ImportError):  # without Dask there is no default client
        client = _client_or_default(client)
    if client is not None:
        return max(1, sum(client.nthreads().values()))
    return os.cpu_count() or 1


def _running(client: Any) -> Any:
    """``client``, once connected; refused with a clear error when it is closed or never
    connected (Dask's own errors for a closed client say nothing of which client or what to
    do, and work sent to a client that never connected waits forever)."""
    status = _status_once_connected(client)
    if status in _CLOSED:
        raise ValueError(
            f"EnsembleDask's client is {status}: pass a running distributed.Client "
            f"(solve inside its 'with' block), or none to use the default client or a "
            f"LocalCluster started for the solve"
        )
    if status in _CONNECTING:
        address = getattr(getattr(client, "scheduler", None), "address", None)
        raise ValueError(
            f"EnsembleDask's client {getattr(client, 'id', client)!r} has not connected to "
            f"its scheduler {address!r} (Dask keeps a client that failed to connect as the "
            f"default client, still 'connecting'): close it with client.close() and pass a "
            f"running distributed.Client, or none to start a LocalCluster for the solve"
        )
    return client


_CONNECTING = ("newly-created", "connecting")
_CLOSED = ("closing", "closed")


def _status_once_connected(client: Any) -> str | None:
    """``client.status`` after at most Dask's connect timeout for a client still connecting
    (one reconnecting after a dropped connection is running or closed by then)."""
    import dask
    from dask.utils import parse_timedelta

    timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
    deadline = time.monotonic() + timeout
    while getattr(client, "status", None) in _CONNECTING and time.monotonic() < deadline:
        time.sleep(0.05)
    return getattr(client, "status", None)


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            'EnsembleDask needs Dask: pip install "dxode[dask]" (dask[array] and distributed)'
        ) from exc
    return distributed


def _default_client() -> Any:
    """The running default client, or ``None`` when there is none yet (a default client
    that never connected is refused by ``_running``)."""
    try:
        client = _import_distributed().default_client()
    except ValueError:  # no client yet
        return None
    return _running(client)


def _client_or_default(client: Any) -> Any:
    """``client`` once connected, or without one the running default client (``None`` when
    there is none); either is refused by ``_running`` when closed or never connected."""
    return _default_client() if client is None else _running(client)


@contextlib.contextmanager
def _client_for(client: Any) -> Iterator[Any]:
    """The given client, the current default client, or an embedded LocalCluster's."""
    client = _client_or_default(client)
    if client is not None:
        yield client
        return
    distributed = _import_distributed()
    from .cluster import local_cluster

    with (
        local_cluster() as cluster,
        distributed.Client(cluster, set_as_default=False) as embedded,
    ):
        yield embedded
