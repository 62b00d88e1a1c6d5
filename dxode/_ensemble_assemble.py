"""Folding batch results, in trajectory order, into an EnsembleSolution."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import array_api_compat
import numpy as np

from ._ensemble_batch import BatchResult
from ._ensemble_problem import EnsembleProblem
from ._ensemble_solution import EnsembleSolution, EnsembleStats


def assemble(
    eprob: EnsembleProblem, results: Iterable[BatchResult], alg: Any, seed: int
) -> EnsembleSolution:
    """Fold batch results, in trajectory order, into an EnsembleSolution."""
    done: list[BatchResult] = []
    acc, converged = eprob.u_init, None
    for batch in results:
        done.append(batch)
        if eprob.reduction is not None:
            values = batch.values if eprob.output_func is not None else batch.u
            acc, converged = eprob.reduction(acc, _stack_values(values), batch.indices)
            converged = bool(converged)
            if converged:
                break
    if eprob.reduction is not None:
        u: Any = acc
    elif eprob.output_func is not None:
        u = _stack_values([v for b in done for v in b.values])
    elif all(b.u is not None for b in done):
        u = _concat([b.u for b in done])
    else:
        u = None  # the saved states live elsewhere (Dask workers or Zarr); the caller sets u
    stats = EnsembleStats(
        *(np.concatenate([getattr(b, k) for b in done]) for k in ("nf", "naccept", "nreject"))
    )
    return EnsembleSolution(
        t=_times(done),
        u=u,
        retcodes=np.concatenate([b.retcode for b in done]),
        stats=stats,
        eprob=eprob,
        alg=alg,
        converged=converged,
        dense=[b for b in done if b.dense is not None] or None,
        seed=seed,
    )


def _times(done: list[BatchResult]) -> Any:
    first = done[0].t
    xp = array_api_compat.array_namespace(first)
    if all(b.t.ndim == 1 and bool(xp.all(b.t == first)) for b in done):
        return first
    per_lane = [
        b.t if b.t.ndim == 2 else xp.broadcast_to(b.t, (len(b.indices), b.t.shape[0])) for b in done
    ]
    return xp.concat(per_lane)


def _concat(arrays: list[Any]) -> Any:
    xp = array_api_compat.array_namespace(arrays[0])
    return arrays[0] if len(arrays) == 1 else xp.concat(arrays)


def _stack_values(values: Any) -> Any:
    """Batch values as one array when they are arrays (or numbers) of one shape, else a list."""
    if not isinstance(values, list):
        return values
    try:
        shapes = {np.shape(v) for v in values}
        if len(shapes) == 1 and all(np.isscalar(v) or isinstance(v, np.ndarray) for v in values):
            return np.asarray(values)
    except (TypeError, ValueError):
        pass
    return values
