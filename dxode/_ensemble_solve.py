"""``solve`` for ensembles: validate, split into batches, run an ensemble algorithm, assemble."""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from ._ensemble_algorithms import AbstractEnsembleAlgorithm, EnsembleArray
from ._ensemble_batch import BatchResult, BatchSpec
from ._ensemble_problem import EnsembleProblem
from ._ensemble_solution import EnsembleSolution, EnsembleStats
from ._options import SolverOptions
from ._timegrid import save_times, stop_times

__all__ = ["solve_ensemble"]


def solve_ensemble(
    eprob: EnsembleProblem,
    alg: Any,
    ensemble_alg: Any,
    *,
    trajectories: Any,
    batch_size: Any,
    saveat: Any,
    dense: bool | None,
    tstops: Any,
    seed: Any,
    options: dict[str, Any],
) -> EnsembleSolution:
    """Solve ``trajectories`` trajectories of ``eprob`` (see ``solve``)."""
    if isinstance(alg, AbstractEnsembleAlgorithm) and ensemble_alg is None:
        alg, ensemble_alg = None, alg  # solve(eprob, EnsembleSerial(), ...) is unambiguous
    ensemble_alg = _ensemble_algorithm(ensemble_alg)
    n = _positive_int("trajectories", trajectories)
    if eprob.n_arrays is not None and n > eprob.n_arrays:
        raise ValueError(
            f"trajectories={n} but the per-trajectory arrays hold only {eprob.n_arrays}"
        )
    size = (
        ensemble_alg.default_batch_size
        if batch_size is None
        else _positive_int("batch_size", batch_size)
    )
    opts = SolverOptions.from_user(alg, **options)
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**63)
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if "tspan" not in eprob.arrays and eprob.batch_func is None:
        # Validate the grids now, before any work (per-trajectory spans are checked per batch).
        save_times(saveat, *eprob.prob.tspan)
        stop_times(tstops, *eprob.prob.tspan)
    spec = BatchSpec(
        options=opts,
        saveat=saveat,
        dense=bool(dense),
        tstops=tstops,
        backend=ensemble_alg.backend_name(),
        seed=int(seed),
        lockstep=bool(getattr(ensemble_alg, "lockstep", False)),
    )
    batches = [
        np.arange(start, min(start + size, n), dtype=np.int64) for start in range(0, n, size)
    ]
    return assemble(eprob, ensemble_alg.solve_batches(eprob, batches, spec), opts.alg, int(seed))


def assemble(eprob: EnsembleProblem, results: Any, alg: Any, seed: int) -> EnsembleSolution:
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
    else:
        u = _concat([b.u for b in done])
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


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _ensemble_algorithm(value: Any) -> AbstractEnsembleAlgorithm:
    if value is None:
        return EnsembleArray()
    if isinstance(value, AbstractEnsembleAlgorithm):
        return value
    raise TypeError(
        f"ensemble_alg must be EnsembleArray(), EnsembleSerial() or another ensemble algorithm, "
        f"got {value!r}"
    )
