"""EnsembleSolution: an ensemble's trajectories, return codes, statistics and summaries."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import numpy as np

from .._retcode import ReturnCode
from .._rhs import SingleLaneRHS
from .._solution import ODESolution, SolverStats
from ..backends import to_host
from ..integrator.interpolation import DenseOutput

__all__ = ["EnsembleSolution", "EnsembleStats", "EnsembleSummary"]

Array = Any


@dataclasses.dataclass(frozen=True)
class EnsembleStats:
    """Work per trajectory: ``nf``, ``naccept``, ``nreject`` are ``(trajectories,)`` arrays;
    ``nswitch`` too (switches between methods, nonzero only with ``AutoSwitch``), where kept.

    Reduced ensembles keep only totals (the arrays are then ``None``); those written to Zarr
    keep the arrays in the store and the totals here. ``totals`` is ``(nf, naccept, nreject,
    nswitch)`` summed over trajectories.
    """

    nf: Any
    naccept: Any
    nreject: Any
    totals: tuple[int, int, int, int] | None = None
    nswitch: Any = None

    @property
    def total_nf(self) -> int:
        """RHS evaluations summed over trajectories."""
        return self.totals[0] if self.totals else int(np.sum(self.nf))

    @property
    def total_steps(self) -> int:
        """Accepted plus rejected steps summed over trajectories."""
        if self.totals:
            return self.totals[1] + self.totals[2]
        return int(np.sum(self.naccept) + np.sum(self.nreject))

    @property
    def total_nswitch(self) -> int:
        """Switches between methods (``AutoSwitch``) summed over trajectories."""
        if self.totals:
            return self.totals[3]
        return 0 if self.nswitch is None else int(np.sum(self.nswitch))


@dataclasses.dataclass(frozen=True)
class EnsembleSummary:
    """Statistics over successful trajectories at each save time (host NumPy arrays).

    ``mean``, ``var`` are ``(nsave, *shape)``; ``quantiles`` maps each requested level to a
    ``(nsave, *shape)`` array; ``t`` is ``(nsave,)``; ``count`` is how many trajectories entered.
    """

    t: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    quantiles: dict[float, np.ndarray]
    count: int


class EnsembleSolution:
    """The result of solving an ``EnsembleProblem``.

    ``sim[i]`` is trajectory ``i`` as an ``ODESolution`` (with dense output when solved
    with ``dense=True``); ``len(sim)`` is the number of trajectories.

    Attributes
    ----------
    u : array
        Saved states ``(trajectories, nsave, *u0.shape)`` in the memory of the backend that
        computed them (NumPy on the CPU, CuPy on the GPU; ``to_host()`` copies). With an
        ``output_func``, its values instead (stacked when they are arrays of one shape); with
        a ``reduction``, the reduced value.
    t : array
        Save times ``(nsave,)``, or ``(trajectories, nsave)`` when trajectories have their own
        time spans; for a reduction, which keeps nothing per trajectory, ``None`` then.
    retcodes : (trajectories,) int array or None
        Each trajectory's ``ReturnCode``; failures never stop the others. A Zarr array for
        ``EnsembleDask(output="zarr")``; ``None`` with a reduction, which keeps nothing per
        trajectory (``len(sim)``, ``failures()`` and ``success`` still count them).
    stats : EnsembleStats
        RHS evaluations and accepted/rejected steps per trajectory.
    converged : bool or None
        Whether the reduction reported convergence (``None`` without a reduction).
    events : EventRecord or None
        The events callbacks fired, by trajectory (its ``trajectory`` column) and time;
        ``None`` without callbacks, and for reductions and Zarr output.
    """

    def __init__(
        self,
        *,
        t: Array,
        u: Any,
        retcodes: np.ndarray,
        stats: EnsembleStats,
        eprob: Any,
        alg: Any,
        converged: bool | None = None,
        dense: list[Any] | None = None,
        seed: int | None = None,
        counts: np.ndarray | None = None,
        events: Any = None,
    ) -> None:
        self.t = t
        self.u = u
        self.retcodes = retcodes
        self._counts = counts  # return-code histogram, when per-trajectory codes were not kept
        self.stats = stats
        self.eprob = eprob
        self.alg = alg
        self.converged = converged
        self.seed = seed
        self._dense = dense
        self.events = events
        # The Dask client whose workers hold an ``output="dask"`` u's chunks. ``None`` for a
        # Zarr output: this process reads its store with threads, never through the default
        # client (which may be another cluster's, or one that never connected).
        self._scheduler: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (and copied) as its attributes, unless its states stay on Dask workers."""
        if self._scheduler is not None:
            raise TypeError(
                "this ensemble's saved states stay on its Dask workers (EnsembleDask(output="
                "'dask')), held by futures of this process's client, which cannot be pickled "
                "or copied; pickle sim.to_host() (a NumPy array) instead, or solve with "
                "output='memory' or output='zarr'"
            )
        return self.__dict__

    def __len__(self) -> int:
        if self.retcodes is None:
            return int(np.sum(self._counts))
        return int(self.retcodes.shape[0])

    @property
    def success(self) -> bool:
        """Whether every trajectory succeeded."""
        return not self.failures()

    def failures(self) -> dict[str, int]:
        """How many trajectories ended with each unsuccessful return code."""
        histogram = self._histogram()
        return {
            ReturnCode(c).name: int(k)
            for c, k in enumerate(histogram)
            if k and not ReturnCode(c).successful
        }

    def _histogram(self) -> np.ndarray:
        if self._counts is not None:
            return np.asarray(self._counts)
        return np.bincount(np.asarray(self.retcodes[...]), minlength=len(ReturnCode))

    def to_host(self) -> np.ndarray:
        """``u`` as a NumPy array on the host (a ``dask.array`` of an ``EnsembleDask`` output
        computed: by the client whose workers hold it, or read from its Zarr store)."""
        return self._host(self.u)

    def _host(self, u: Any) -> Any:
        if _is_dask(u):
            return np.asarray(u.compute(scheduler=self._dask_scheduler()))
        return to_host(u)

    def _dask_scheduler(self) -> Any:
        """What computes a lazy ``u``: threads here for a Zarr output; for one on the workers
        their client, refused by name once closed (Dask's error says only "Client is
        closed"; the workers' results went with it)."""
        if self._scheduler is None:
            return "threads"
        if self._scheduler.status in ("closing", "closed"):
            raise ValueError(
                "this ensemble's saved states stayed on the workers of a Dask client that is "
                "now closed, and went with it: compute what you need (sim.to_host(), sim[i], "
                "summaries) before the client closes, or solve with output='memory' or "
                "output='zarr'"
            )
        return self._scheduler

    def __getitem__(self, i: int) -> ODESolution:
        n = len(self)
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(
                f"sim[i] takes one trajectory number (an int), got {i!r}; for several, iterate "
                f"over sim or index the arrays (sim.u[i], sim.retcodes[i])"
            )
        if self.retcodes is None:
            raise TypeError("sim[i] needs per-trajectory results; this ensemble was reduced")
        if not -n <= i < n:
            raise IndexError(f"trajectory {i} out of range for {n} trajectories")
        i %= n
        if not self._keeps_states():
            raise TypeError(
                "sim[i] needs the saved states; this ensemble kept output_func values "
                "or a reduction instead"
            )
        t = self.t if self.t.ndim == 1 else self.t[i, ...]
        nswitch = self.stats.nswitch
        stats = SolverStats(
            int(self.stats.nf[i]),
            int(self.stats.naccept[i]),
            int(self.stats.nreject[i]),
            nswitch=0 if nswitch is None else int(nswitch[i]),
        )
        dense = self._dense_output(i) if self._dense is not None else None
        u = self.u[i, ...]
        return ODESolution(
            t,
            self._host(u) if _is_dask(u) else u,
            ReturnCode(int(self.retcodes[i])),
            stats,
            None,
            self.alg,
            dense,
            None if self.events is None else self.events.for_trajectory(i),
            problem_of=functools.partial(self.eprob.trajectory_problem, i, 0, self.seed),
        )

    def _keeps_states(self) -> bool:
        """Whether ``u`` holds saved states, not ``output_func`` values (which may be arrays
        of any shape, e.g. each trajectory's final state) or a reduction's accumulator."""
        kept = self.eprob is not None and (
            self.eprob.output_func is not None or self.eprob.reduction is not None
        )
        return not kept and _is_array(self.u) and self.u.ndim >= 2

    def _dense_output(self, i: int) -> DenseOutput | None:
        for batch in self._dense:
            positions = np.nonzero(batch.indices == i)[0]
            if positions.size:
                return dense_output_for_lane(batch.dense, int(positions[0]))
        return None

    # ---- summaries over trajectories ------------------------------------------------------

    def summary(self, quantiles: tuple[float, ...] = (0.05, 0.5, 0.95)) -> EnsembleSummary:
        """Mean, variance and quantiles over the successful trajectories at each save time.

        A terminated trajectory counts at the save times before its event (its later points
        are NaN); a save time that no successful trajectory reached gets NaN. Trajectories
        that saved at their own times (their own ``tspan`` with ``saveat=None``) are refused:
        there is no shared time to summarize at.
        """
        if isinstance(quantiles, (str, bytes)) or not isinstance(quantiles, (tuple, list)):
            raise TypeError(
                f"quantiles must be a tuple of levels in [0, 1] such as (0.05, 0.5, 0.95), "
                f"got {quantiles!r}"
            )
        levels = [_quantile_level(q) for q in quantiles]
        u, t = self._successful()
        requests = [("mean", ()), ("var", ()), *(("quantile", (q,)) for q in levels)]
        mean, var, *qs = self._statistics(u, requests)
        return EnsembleSummary(
            t=t,
            mean=mean,
            var=var,
            quantiles=dict(zip(levels, qs, strict=True)),
            count=int(u.shape[0]),
        )

    def mean(self) -> np.ndarray:
        """Mean over successful trajectories, ``(nsave, *shape)`` (see ``summary``)."""
        return self._statistics(self._successful()[0], [("mean", ())])[0]

    def var(self) -> np.ndarray:
        """Variance over successful trajectories, ``(nsave, *shape)`` (see ``summary``)."""
        return self._statistics(self._successful()[0], [("var", ())])[0]

    def quantile(self, q: Any) -> np.ndarray:
        """Quantile ``q`` (in ``[0, 1]``) over successful trajectories, ``(nsave, *shape)``;
        for a sequence of levels, ``(len(q), nsave, *shape)`` (see ``summary``)."""
        u = self._successful()[0]
        if isinstance(q, (list, tuple, np.ndarray)) and np.ndim(q) == 1:
            levels = [_quantile_level(level) for level in np.asarray(q).tolist()]
            if not levels:
                return np.empty((0, *u.shape[1:]), dtype=u.dtype)
            # Levels as Python floats, one at a time: the result keeps the states' dtype
            # (NumPy computes float32 states' quantiles at an array of levels in float64).
            return np.stack(self._statistics(u, [("quantile", (level,)) for level in levels]))
        return self._statistics(u, [("quantile", (_quantile_level(q),))])[0]

    def _successful(self) -> tuple[Any, np.ndarray]:
        """The successful trajectories' states and their shared save times: states on the
        host, or, for an ``EnsembleDask`` output (on the workers or in Zarr), a lazy
        ``dask.array`` that ``_statistics`` reduces chunk by chunk."""
        if not self._keeps_states():
            raise TypeError("summaries need the saved states (no output_func or reduction)")
        retcodes = np.asarray(self.retcodes[...])  # also a Zarr output's array
        ok = (retcodes == ReturnCode.Success) | (retcodes == ReturnCode.Terminated)
        if not np.any(ok):
            raise ValueError("no trajectory succeeded, so there is nothing to summarize")
        t = to_host(self.t[...])  # also a Zarr output's array
        if t.ndim == 2:
            t = t[ok]
            if not np.array_equal(t, np.broadcast_to(t[:1], t.shape)):
                raise ValueError(
                    "summaries combine trajectories at shared save times, but these saved at "
                    "their own times (sim.t is (trajectories, nsave): their own tspan with "
                    "saveat=None); solve with a saveat array inside every span, or combine "
                    "sim.u yourself by sim.t"
                )
            t = t[0]
        if _is_dask(self.u):
            return self.u[ok], t
        return self.to_host()[ok], t

    def _statistics(self, u: Any, requests: list[tuple[str, tuple]]) -> list[np.ndarray]:
        """``_statistic(name, u, *args)`` for each ``(name, args)`` of ``requests``, over
        trajectories (axis 0). A ``dask.array`` never comes to the driver whole, so a Zarr
        output larger than its memory can be summarized: it is rechunked to hold every
        trajectory of a few save times per chunk, and each chunk reduced where it is (on the
        workers for ``output="dask"``, by threads here for Zarr)."""
        if not _is_dask(u):
            with_nan = bool(np.isnan(u).any())  # one pass over u, not one per request
            return [_statistic(name, u, *args, with_nan=with_nan) for name, args in requests]
        import dask.array as da

        scheduler = self._dask_scheduler()
        # One decision for every chunk, as for an array in memory: NaN-aware or not.
        with_nan = bool(da.isnan(u).any().compute(scheduler=scheduler))
        columns = u.rechunk({0: -1, **dict.fromkeys(range(1, u.ndim), "auto")})
        stacked = columns.map_blocks(
            _column_statistics,
            requests=requests,
            with_nan=with_nan,
            chunks=((len(requests),), *columns.chunks[1:]),
            dtype=u.dtype,
        ).compute(scheduler=scheduler)
        sample = np.zeros((2, 1), dtype=u.dtype)  # the dtype each statistic has in memory
        return [
            np.asarray(value).astype(_statistic(name, sample, *args).dtype, copy=False)
            for value, (name, args) in zip(stacked, requests, strict=True)
        ]

    def plot(
        self,
        component: int = 0,
        quantiles: tuple[float, float] = (0.05, 0.95),
        ax: Any = None,
        label: str | None = None,
    ) -> Any:
        """Draw the mean of one state component with a quantile band (needs matplotlib).

        Returns the matplotlib Axes.
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError('plotting needs matplotlib: pip install "dxode[plot]"') from exc
        s = self.summary(quantiles=quantiles)
        lo, hi = (s.quantiles[float(q)].reshape(len(s.t), -1)[:, component] for q in quantiles)
        mean = s.mean.reshape(len(s.t), -1)[:, component]
        ax = plt.gca() if ax is None else ax
        name = label or f"u[{component}]"
        ax.fill_between(
            s.t, lo, hi, alpha=0.3, label=f"{name}: {quantiles[0]:g}–{quantiles[1]:g} quantiles"
        )
        ax.plot(s.t, mean, label=f"{name}: mean of {s.count}")
        ax.set_xlabel("t")
        ax.legend()
        return ax

    def __repr__(self) -> str:
        shape = tuple(self.u.shape) if _is_array(self.u) else type(self.u).__name__
        return (
            f"EnsembleSolution({len(self)} trajectories, u: {shape}, failures={self.failures()}, "
            f"steps={self.stats.total_steps}, nf={self.stats.total_nf})"
        )


def _quantile_level(q: Any) -> float:
    """``q`` as a float in ``[0, 1]``, or a TypeError/ValueError naming it."""
    if isinstance(q, (bool, np.bool_, str, bytes)) or not isinstance(q, (int, float, np.number)):
        raise TypeError(f"a quantile level must be a number in [0, 1], got {q!r}")
    if not 0.0 <= float(q) <= 1.0:
        raise ValueError(f"a quantile level must be in [0, 1] (0.5 is the median), got {q!r}")
    return float(q)


def _statistic(name: str, u: np.ndarray, *args: Any, with_nan: bool | None = None) -> np.ndarray:
    """``np.<name>(u, *args, axis=0)``, ignoring NaN (a terminated trajectory's save points
    after its event); NaN where every trajectory is NaN. ``with_nan``: whether ``u`` (or the
    array it is a chunk of) holds NaN, when known."""
    if not (np.isnan(u).any() if with_nan is None else with_nan):
        return getattr(np, name)(u, *args, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN save times give NaN
        return getattr(np, "nan" + name)(u, *args, axis=0)


def _column_statistics(
    block: np.ndarray, requests: list[tuple[str, tuple]], with_nan: bool
) -> np.ndarray:
    """Each requested statistic of a chunk holding every trajectory, stacked on axis 0."""
    return np.stack([_statistic(name, block, *args, with_nan=with_nan) for name, args in requests])


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _is_dask(x: Any) -> bool:
    """Whether ``x`` is a ``dask.array`` (an ``EnsembleDask`` output's ``u``)."""
    return hasattr(x, "dask") and hasattr(x, "compute")


def dense_output_for_lane(data: Any, position: int) -> DenseOutput | None:
    """Dense output of the ``position``-th lane of a batch from its recorded steps."""
    steps = data.steps
    if steps is None:
        return None
    backend = data.backend
    xp = backend.xp
    lane_ids = steps["lane"]
    mask = lane_ids == position
    idx = xp.nonzero(mask)[0]
    if idx.shape[0] == 0:
        return None
    own = {key: xp.take(value, idx, axis=-1) for key, value in steps.items()}
    one = xp.asarray([position])
    p = data.p_for(tuple(xp.take(leaf, one, axis=-1)[..., 0] for leaf in data.lane_params))
    rhs = SingleLaneRHS(backend, data.f, p)
    end = None if data.end_states is None else data.end_states[position, ...]
    return DenseOutput(backend, data.stepper, rhs, own, data.direction, end)
