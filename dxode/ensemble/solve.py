"""``solve`` for ensembles: validate, split into batches, run an ensemble algorithm, assemble."""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from .._options import SolverOptions
from .._timegrid import save_times, stop_times
from ..backends import to_host
from ..events.callbacks import check_preset_times
from .algorithms import AbstractEnsembleAlgorithm, EnsembleArray
from .batch import BatchSpec
from .problem import EnsembleProblem
from .solution import EnsembleSolution

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
    sensealg: Any = None,
    callback: Any = None,
) -> EnsembleSolution:
    """Solve ``trajectories`` trajectories of ``eprob`` (see ``solve``)."""
    if (
        isinstance(alg, AbstractEnsembleAlgorithm) or _is_dask_client(alg)
    ) and ensemble_alg is None:
        alg, ensemble_alg = None, alg  # solve(eprob, EnsembleSerial(), ...) is unambiguous
    ensemble_alg = _ensemble_algorithm(ensemble_alg)
    if trajectories is None:
        if eprob.n_arrays is None:
            raise TypeError(
                "solving an EnsembleProblem needs trajectories=N (unless per-trajectory arrays "
                "fix N)"
            )
        trajectories = eprob.n_arrays
    n = _positive_int("trajectories", trajectories)
    if eprob.n_arrays is not None and n > eprob.n_arrays:
        raise ValueError(
            f"trajectories={n} but the per-trajectory arrays hold only {eprob.n_arrays}"
        )
    size = (
        ensemble_alg.batch_size_for(n)
        if batch_size is None
        else _positive_int("batch_size", batch_size)
    )
    opts = SolverOptions.from_user(alg, **options)
    opts.check_state(eprob.prob.u0)
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**63)
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer with 0 <= seed < 2**64, got {seed!r}")
    if "tspan" not in eprob.arrays and eprob.batch_func is None:
        # Validate the grids now, before any work (per-trajectory spans are checked per batch).
        save_times(saveat, *eprob.prob.tspan)
        stop_times(tstops, *eprob.prob.tspan)
        check_preset_times(callback, *sorted(eprob.prob.tspan))
    elif "tspan" in eprob.arrays:
        spans = eprob.arrays["tspan"]
        spans = to_host(spans) if array_api_compat.is_array_api_obj(spans) else np.asarray(spans)
        check_preset_times(callback, float(np.min(spans)), float(np.max(spans)))
    from ..sensitivity.entry import ensemble_is_traced, solve_ensemble_traced

    if ensemble_is_traced(eprob, int(seed)):
        if callback is not None:
            from .._solve import CALLBACK_GRADIENTS

            raise NotImplementedError(CALLBACK_GRADIENTS)
        if getattr(ensemble_alg, "lockstep", False):
            raise NotImplementedError(
                "lock-step ensembles are not differentiable: use EnsembleArray() (per-lane "
                "steps), or stack the trajectories into one ODEProblem with a (n, B) u0"
            )
        return solve_ensemble_traced(
            eprob,
            opts,
            n,
            size,
            saveat,
            tstops,
            int(seed),
            ensemble_alg.lanes_for_gradients(size),
            ensemble_alg.gradient_client(),
            sensealg,
            ensemble_alg.backend_name(),
        )
    spec = BatchSpec(
        options=opts,
        saveat=saveat,
        dense=bool(dense),
        tstops=tstops,
        backend=ensemble_alg.backend_name(),
        seed=int(seed),
        lockstep=bool(getattr(ensemble_alg, "lockstep", False)),
        callback=callback,
    )
    # Trajectory ranges, not index arrays: the driver holds O(batches), never O(trajectories).
    batches = [range(start, min(start + size, n)) for start in range(0, n, size)]
    return ensemble_alg.run(eprob, batches, spec)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _ensemble_algorithm(value: Any) -> AbstractEnsembleAlgorithm:
    if value is None:
        return EnsembleArray()
    if isinstance(value, AbstractEnsembleAlgorithm):
        return value
    if _is_dask_client(value):
        from .dask_ensemble import EnsembleDask

        return EnsembleDask(client=value)
    raise TypeError(
        "ensemble_alg must be EnsembleArray(), EnsembleSerial(), EnsembleKernel(), EnsembleDask() "
        f"(or a distributed.Client), got {value!r}"
    )


def _is_dask_client(value: Any) -> bool:
    """A ``distributed.Client``, recognized without importing distributed."""
    return any(
        cls.__name__ == "Client" and cls.__module__.startswith("distributed")
        for cls in type(value).__mro__
    )
