"""Folding batch results, in trajectory order, into an EnsembleSolution."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import array_api_compat
import numpy as np

from .._retcode import ReturnCode
from ..events.record import concat_records
from .batch import TRAJECTORY_COUNTS, BatchResult, check_save_count
from .problem import EnsembleProblem
from .solution import EnsembleSolution, EnsembleStats


def assemble(
    eprob: EnsembleProblem, results: Iterable[BatchResult], alg: Any, seed: int, n_total: int
) -> EnsembleSolution:
    """Fold batch results, in trajectory order, into an EnsembleSolution.

    Saved states are copied into one preallocated ``(n_total, nsave, *shape)`` array as batches
    arrive and each batch's own copy is dropped, so peak memory is the output plus a batch.
    With a reduction, see ``reduce_batches``.
    """
    if eprob.reduction is not None:
        return reduce_batches(eprob, results, alg, seed)
    done: list[BatchResult] = []
    events: list[Any] = []
    out, offset = None, 0
    meta = {k: np.empty(n_total, dtype=np.int64) for k in TRAJECTORY_COUNTS}
    solved = 0
    for batch in results:
        done.append(batch)
        events.append(batch.events)
        batch.events = None
        size = len(batch.indices)
        for key, column in meta.items():  # into one array each, batch by batch
            counts = batch.counts(key)
            if size == n_total and isinstance(counts, np.ndarray) and counts.dtype == np.int64:
                meta[key] = counts  # one batch of all trajectories: its own arrays
            else:
                column[solved : solved + size] = counts
            setattr(batch, key, None)
        solved += size
        if eprob.output_func is None and batch.u is not None:
            if out is None and batch.u.shape[0] == n_total:
                out = batch.u  # one batch of all trajectories: its own array
            else:
                if out is None:
                    out = _empty_like_rows(batch.u, n_total)
                check_save_count(batch, out.shape[1], "earlier ones")
                out[offset : offset + batch.u.shape[0], ...] = batch.u
            offset += batch.u.shape[0]
            batch.u = None
    if eprob.output_func is not None:
        u: Any = _stack_values([v for b in done for v in b.values])
    else:
        u = out  # None when the states live elsewhere (Dask workers, Zarr): the caller sets u
    meta = {key: column[:solved] for key, column in meta.items()}
    return EnsembleSolution(
        t=_times(done),
        u=u,
        retcodes=meta["retcode"],
        stats=EnsembleStats(meta["nf"], meta["naccept"], meta["nreject"], nswitch=meta["nswitch"]),
        eprob=eprob,
        alg=alg,
        dense=[b for b in done if b.dense is not None] or None,
        seed=seed,
        events=concat_records(events),
    )


def reduce_batches(
    eprob: EnsembleProblem, results: Iterable[BatchResult], alg: Any, seed: int
) -> EnsembleSolution:
    """Fold each batch's values into ``eprob.reduction`` as it arrives, stopping once it
    reports convergence.

    Like a reduction on Dask workers, only return-code counts and step totals are kept
    (``retcodes`` is ``None``), so memory stays flat in the number of trajectories; the save
    times only when the trajectories share them (else ``t`` is ``None``).
    """
    acc, converged = eprob.initial_accumulator(), False
    t, counts, totals = None, np.zeros(len(ReturnCode), dtype=np.int64), np.zeros(4, np.int64)
    own_times = 0
    for batch in results:
        summary = batch_summary(batch)
        t = summary["t"] if t is None else t
        check_save_count(batch, t.shape[-1], "earlier ones")
        own_times += summary["own_times"] + int(not _same_times(summary["t"], t))
        counts += summary["counts"]
        totals += summary["totals"]
        values = batch.values if eprob.output_func is not None else batch.u
        acc, converged = eprob.reduce(acc, _stack_values(values), batch.indices)
        if converged:
            break
    return EnsembleSolution(
        t=None if own_times else t,
        u=acc,
        retcodes=None,
        stats=EnsembleStats(None, None, None, totals=tuple(int(x) for x in totals)),
        eprob=eprob,
        alg=alg,
        converged=converged,
        seed=seed,
        counts=counts,
    )


def batch_summary(batch: BatchResult) -> dict[str, Any]:
    """A batch's save times (its first trajectory's, and 1 in ``own_times`` when its
    trajectories save at different times), return-code counts and step totals."""
    return {
        "t": batch.t if batch.t.ndim == 1 else batch.t[0, ...],
        "own_times": int(batch.t.ndim == 2),
        "counts": np.bincount(batch.retcode, minlength=len(ReturnCode)),
        # EnsembleStats.totals: (nf, naccept, nreject, nswitch), the counts after retcode
        "totals": np.array([np.sum(batch.counts(name)) for name in TRAJECTORY_COUNTS[1:]]),
    }


def _same_times(a: Any, b: Any) -> bool:
    """Whether save times ``a`` and ``b`` (``(nsave,)`` each, on one backend) are equal."""
    return bool(array_api_compat.array_namespace(a).all(a == b))


def _times(done: list[BatchResult]) -> Any:
    """The save times: ``(nsave,)`` when all trajectories share them, else ``(N, nsave)``."""
    first = done[0].t
    for batch in done:
        check_save_count(batch, first.shape[-1], "earlier ones")
    xp = array_api_compat.array_namespace(first)
    if all(b.t.ndim == 1 and _same_times(b.t, first) for b in done):
        return first
    per_lane = [
        b.t if b.t.ndim == 2 else xp.broadcast_to(b.t, (len(b.indices), b.t.shape[0])) for b in done
    ]
    return xp.concat(per_lane)


def _empty_like_rows(rows: Any, n_total: int) -> Any:
    """An uninitialized ``(n_total, *rows.shape[1:])`` array on the rows' library and device."""
    xp = array_api_compat.array_namespace(rows)
    return xp.empty(
        (n_total, *rows.shape[1:]), dtype=rows.dtype, device=array_api_compat.device(rows)
    )


def _stack_values(values: Any) -> Any:
    """Batch values as one array when they are arrays (of one array library) or numbers of
    one shape, else a list."""
    if not isinstance(values, list):
        return values
    try:
        if _arrays_of_one_shape(values):
            return array_api_compat.array_namespace(*values).stack(values)
        shapes = {np.shape(v) for v in values}
        if len(shapes) == 1 and all(np.isscalar(v) or isinstance(v, np.ndarray) for v in values):
            return np.asarray(values)
    except (TypeError, ValueError):
        pass
    return values


def _arrays_of_one_shape(values: list[Any]) -> bool:
    """Whether ``values`` are arrays (NumPy, CuPy, any array-API library) of one shape."""
    arrays = values and all(array_api_compat.is_array_api_obj(v) for v in values)
    return bool(arrays) and len({tuple(v.shape) for v in values}) == 1
