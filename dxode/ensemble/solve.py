"""Ensemble solves: check the request and plan the batches, then run an ensemble algorithm.

``plan_ensemble`` turns ``solve``'s arguments into an ``EnsemblePlan`` (every argument
checked before any work); ``run_ensemble`` solves a plan whose solve nothing differentiates
(the front door sends differentiated plans to ``dxode.sensitivity``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import array_api_compat
import numpy as np

from .._options import SolverOptions
from .._timegrid import lane_save_grid, stop_times
from .._validation import positive_int
from ..backends import to_host
from ..events.callbacks import CallbackSet, check_preset_times
from .algorithms import AbstractEnsembleAlgorithm, EnsembleArray
from .batch import BatchSpec, check_direction, check_span_numbers
from .param_rows import check_p_rows
from .problem import EnsembleProblem
from .solution import EnsembleSolution

__all__ = ["EnsemblePlan", "plan_ensemble", "run_ensemble"]


@dataclasses.dataclass(frozen=True)
class EnsemblePlan:
    """An ensemble solve, checked: what to solve, how, and in which batches."""

    eprob: EnsembleProblem
    ensemble_alg: AbstractEnsembleAlgorithm
    options: SolverOptions
    trajectories: int
    batch_size: int
    seed: int
    saveat: Any
    dense: bool
    tstops: Any
    callback: CallbackSet | None

    def batches(self) -> list[range]:
        """Trajectory ranges, not index arrays: the driver holds O(batches), never
        O(trajectories)."""
        n, size = self.trajectories, self.batch_size
        return [range(start, min(start + size, n)) for start in range(0, n, size)]

    def first_batch(self) -> range:
        return range(min(self.batch_size, self.trajectories))


def plan_ensemble(
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
    callback: CallbackSet | None = None,
) -> EnsemblePlan:
    """Check ``solve``'s arguments for ``eprob`` (see ``solve``) and plan its batches."""
    if (
        isinstance(alg, AbstractEnsembleAlgorithm) or _is_dask_client(alg)
    ) and ensemble_alg is None:
        alg, ensemble_alg = None, alg  # solve(eprob, EnsembleSerial(), ...) is unambiguous
    ensemble_alg = _ensemble_algorithm(ensemble_alg)
    if "p" in eprob.arrays:  # before counting: transposed rows miscount the trajectories
        check_p_rows(eprob.arrays["p"], eprob.prob.p)
    n = _trajectory_count(eprob, trajectories)
    size = (
        ensemble_alg.batch_size_for(n)
        if batch_size is None
        else positive_int("batch_size", batch_size)
    )
    _check_one_batch_size(ensemble_alg, size)
    if dense and eprob.reduction is not None and eprob.output_func is None:
        raise ValueError(
            "dense=True keeps every trajectory's steps for sol(t), but with a reduction and no "
            "output_func nothing reads them (the reduction gets the saved states) and no "
            "trajectory is kept: drop dense=True, or call sol(t) in an output_func"
        )
    opts = SolverOptions.from_user(alg, **options)
    opts.check_state(eprob.prob.u0, None if "tspan" in eprob.arrays else eprob.prob.tspan)
    seed = _master_seed(seed)
    _check_times(eprob, opts, saveat, tstops, callback)
    return EnsemblePlan(
        eprob, ensemble_alg, opts, n, size, seed, saveat, bool(dense), tstops, callback
    )


def run_ensemble(plan: EnsemblePlan) -> EnsembleSolution:
    """Solve a plan nothing differentiates, batch by batch with its ensemble algorithm."""
    spec = BatchSpec(
        options=plan.options,
        saveat=plan.saveat,
        dense=plan.dense,
        tstops=plan.tstops,
        backend=plan.ensemble_alg.backend_name(),
        seed=plan.seed,
        lockstep=bool(getattr(plan.ensemble_alg, "lockstep", False)),
        callback=plan.callback,
    )
    return plan.ensemble_alg.run(plan.eprob, plan.batches(), spec)


def _trajectory_count(eprob: EnsembleProblem, trajectories: Any) -> int:
    if trajectories is None:
        if eprob.n_arrays is None:
            raise TypeError(
                "solving an EnsembleProblem needs trajectories=N (unless per-trajectory arrays "
                "fix N)"
            )
        trajectories = eprob.n_arrays
    n = positive_int("trajectories", trajectories)
    if eprob.n_arrays is not None and n > eprob.n_arrays:
        raise ValueError(
            f"trajectories={n} but the per-trajectory arrays hold only {eprob.n_arrays}"
        )
    return n


def _check_one_batch_size(ensemble_alg: AbstractEnsembleAlgorithm, size: int) -> None:
    """Refuse ``solve(batch_size=...)`` that contradicts the ensemble algorithm's own
    (``EnsembleDask(batch_size=...)``): one of them would be ignored, and a reduction's
    batches depend on it."""
    own = getattr(ensemble_alg, "batch_size", None)
    if own is not None and own != size:
        raise ValueError(
            f"batch_size={size} for solve but {type(ensemble_alg).__name__}(batch_size={own}): "
            f"give it in one place"
        )


def _master_seed(seed: Any) -> int:
    """The ensemble's master seed: ``seed`` checked, or fresh entropy."""
    if seed is None:
        return int(np.random.SeedSequence().entropy % 2**63)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer with 0 <= seed < 2**64, got {seed!r}")
    return int(seed)


def _check_times(
    eprob: EnsembleProblem,
    opts: SolverOptions,
    saveat: Any,
    tstops: Any,
    callback: CallbackSet | None,
) -> None:
    """Check the save grid, the stops, the callbacks' preset times and (for one span shared
    by every trajectory) the step budget now, before any work (spans a ``prob_func`` or
    ``batch_func`` builds are checked batch by batch: a shared ``saveat`` must lie inside
    each, and ``tstops`` and preset times outside them all are passed by)."""
    if "tspan" not in eprob.arrays and eprob.batch_func is None:
        t0, t1 = eprob.prob.tspan
        if eprob.prob_func is None:  # else prob.tspan need not be any trajectory's
            lane_save_grid(saveat, np.array([t0]), np.array([t1]))
            stop_times(tstops, t0, t1)
            check_preset_times(callback, *sorted(eprob.prob.tspan))
            opts.check_step_budget(eprob.prob.tspan, callback)
    elif "tspan" in eprob.arrays:
        spans = eprob.arrays["tspan"]
        spans = to_host(spans) if array_api_compat.is_array_api_obj(spans) else np.asarray(spans)
        check_span_numbers(spans)
        if spans.shape[-1:] == (2,) and np.isfinite(spans).all():
            check_direction(spans[..., 0], spans[..., 1])  # all of them, not batch by batch
            t0, t1 = spans[..., 0], spans[..., 1]
            forward = bool(np.all(t1 > t0))
            lo, hi = float(np.min(np.minimum(t0, t1))), float(np.max(np.maximum(t0, t1)))
            stop_times(tstops, *((lo, hi) if forward else (hi, lo)))  # inside some span
            # (an interval's grid is a batch's if its spans agree: refuse it for all now)
            lane_save_grid(saveat, t0.ravel(), t1.ravel(), np.arange(t0.size))
        check_preset_times(callback, float(np.min(spans)), float(np.max(spans)))


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
