"""EnsembleProblem: one model, many trajectories (initial conditions, parameters, time spans)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import threading
from collections.abc import Callable
from typing import Any

import array_api_compat
import numpy as np

from .._error_context import add_note, describe_trajectories
from .._problem import ODEProblem
from .._validation import check_arguments
from .random import counter_uniform, trajectory_rng
from .snapshot import snapshot

__all__ = [
    "BatchContext",
    "EnsembleProblem",
    "TrajectoryContext",
    "check_p_structure",
    "check_trajectory",
    "per_trajectory_leaves",
]

_PROB_FUNC_LOCK = threading.RLock()


@dataclasses.dataclass(frozen=True)
class TrajectoryContext:
    """What the context form ``prob_func(prob, ctx)`` learns about its trajectory.

    Attributes
    ----------
    index : int
        Trajectory index, ``0 <= index < trajectories``.
    repeat : int
        How many times this trajectory was solved before (reruns from ``output_func``).
    rng : numpy.random.Generator
        A random stream that depends only on ``(seed, index, repeat)``, never on batching.
    """

    index: int
    repeat: int
    rng: np.random.Generator


@dataclasses.dataclass(frozen=True)
class BatchContext:
    """What a vectorized ``batch_func(prob, ctx)`` learns about its batch of trajectories.

    Attributes
    ----------
    indices : (B,) int array
        The trajectory indices of the batch.
    repeat : (B,) int array
        Reruns so far of each trajectory.
    seed : int
        The ensemble's master seed.
    """

    indices: np.ndarray
    repeat: np.ndarray
    seed: int

    def uniform(self, *shape: int) -> np.ndarray:
        """Uniform ``[0, 1)`` draws of shape ``(B, *shape)``; row ``i`` depends only on
        ``(seed, indices[i], repeat[i])``, so results never depend on how trajectories are
        batched."""
        n_draws = int(np.prod(shape, dtype=np.int64)) if shape else 1
        draws = counter_uniform(self.seed, self.indices, self.repeat, n_draws)
        return draws.reshape((len(self.indices), *shape))


class EnsembleProblem:
    """Many trajectories of one model: ``solve(eprob, alg, ensemble_alg, trajectories=N)``.

    Trajectory ``i`` is described, in order of preference for speed, by

    * arrays (no Python call per trajectory): ``u0`` of shape ``(N, *prob.u0.shape)``, ``p``
      a pytree whose leaves have a leading axis ``N``, and/or ``tspan`` of shape ``(N, 2)``;
    * ``batch_func(prob, ctx) -> dict``: given a ``BatchContext``, returns any of
      ``u0``, ``p``, ``tspan`` for the batch's trajectories, trajectories first;
    * ``prob_func``: either the classic ``prob_func(prob, i, repeat) -> ODEProblem`` of
      DifferentialEquations.jl or the context form ``prob_func(prob, ctx)`` with a
      ``TrajectoryContext`` (index, repeat, per-trajectory random generator);
    * nothing: every trajectory is ``prob`` itself.

    Inside a batch the right-hand side sees lanes last: states ``(n, B)``, per-trajectory
    parameters with a trailing ``B`` axis (a tuple of scalars becomes a tuple of ``(B,)``
    rows), times ``(B,)``. Parameters every trajectory shares (the same object: ``prob.p``'s,
    or one a ``prob_func`` gives them all) are passed unchanged, e.g. neural-network weights.

    Parameters
    ----------
    prob : ODEProblem
        The model and the default trajectory.
    prob_func : callable, optional
        Builds one trajectory (see above).
    batch_func : callable, optional
        Builds a batch of trajectories (see above); give at most one way to build them.
    output_func : callable, optional
        ``output_func(sol, i) -> (value, rerun)`` turns trajectory ``i``'s ODESolution into
        the value kept; ``rerun=True`` solves the trajectory again with ``repeat + 1``.
    reduction : callable, optional
        ``reduction(acc, batch_values, batch_indices) -> (acc, converged)`` folds each batch's
        values (outputs, or saved states ``(B, nsave, *shape)``) into ``acc``; once
        ``converged`` is true no further batches are solved.
    u_init : any, optional
        The initial accumulator of ``reduction``; each reduction starts from a copy of it,
        so ``reduction`` may update ``acc`` in place.
    combine : callable, optional
        ``combine(acc_a, acc_b) -> acc`` merges two accumulators (associative). With it,
        ``EnsembleDask`` reduces each batch on its worker and combines the partial results on
        the workers, so only reduced values travel.
    u0 : array, optional
        Per-trajectory initial states ``(N, *prob.u0.shape)``.
    p : pytree of arrays, optional
        Per-trajectory parameters, each leaf with a leading axis ``N``.
    tspan : array, optional
        Per-trajectory time spans ``(N, 2)``.
    """

    def __init__(
        self,
        prob: ODEProblem,
        prob_func: Callable[..., ODEProblem] | None = None,
        output_func: Callable[[Any, int], tuple[Any, bool]] | None = None,
        reduction: Callable[[Any, Any, np.ndarray], tuple[Any, bool]] | None = None,
        u_init: Any = None,
        *,
        combine: Callable[[Any, Any], Any] | None = None,
        batch_func: Callable[[ODEProblem, BatchContext], dict[str, Any]] | None = None,
        u0: Any = None,
        p: Any = None,
        tspan: Any = None,
    ) -> None:
        if not isinstance(prob, ODEProblem):
            raise TypeError(f"EnsembleProblem needs an ODEProblem, got {type(prob).__name__}")
        for name, func in (
            ("combine", combine),
            ("prob_func", prob_func),
            ("output_func", output_func),
            ("reduction", reduction),
            ("batch_func", batch_func),
        ):
            if func is not None and not callable(func):
                raise TypeError(f"{name} must be callable, got {type(func).__name__}")
        for name, func, arguments in (
            ("combine", combine, "acc_a, acc_b"),
            ("output_func", output_func, "sol, i"),
            ("reduction", reduction, "acc, batch_values, batch_indices"),
            ("batch_func", batch_func, "prob, ctx"),
        ):
            if func is not None:
                check_arguments(name, func, arguments)
        given = [
            name
            for name, v in (
                ("prob_func", prob_func),
                ("batch_func", batch_func),
                ("arrays (u0/p/tspan)", _any_given(u0, p, tspan)),
            )
            if v
        ]
        if len(given) > 1:
            raise ValueError(
                f"give at most one way to build trajectories, got {' and '.join(given)}"
            )
        self.prob = prob
        self.prob_func = prob_func
        self.output_func = output_func
        self.reduction = reduction
        self.u_init = u_init
        if combine is not None and reduction is None:
            raise ValueError("combine merges reduction results: give a reduction too")
        if u_init is not None and reduction is None:  # it would be ignored
            raise ValueError("u_init is the reduction's starting value: give a reduction too")
        self.combine = combine
        self.batch_func = batch_func
        self.arrays = {
            k: _as_rows(v) if k != "p" else v
            for k, v in (("u0", u0), ("p", p), ("tspan", tspan))
            if v is not None
        }
        spans_shape = tuple(getattr(tspan, "shape", np.shape(self.arrays.get("tspan", 0))))
        if tspan is not None and len(spans_shape) != 2:
            raise ValueError(
                f"EnsembleProblem's tspan gives each trajectory its span, shape "
                f"(trajectories, 2), got shape {spans_shape}; for one span shared by all, "
                f"set it on the problem: EnsembleProblem(prob.remake(tspan=...))"
            )
        self._context_form = prob_func is not None and _takes_context(prob_func)
        self.n_arrays = _leading_length(self.arrays)
        # What prob_func or batch_func already built (see ``remembering``), by its arguments.
        self._built_trajectory: tuple[tuple[int, int, int], ODEProblem] | None = None
        self._built_batch: tuple[BatchContext, dict[str, Any]] | None = None
        # Set in a copy unpickled from one that remembered trajectory 0: it builds its own
        # trajectory 0 once and remembers it (see ``__getstate__``).
        self._own_first = False
        # Set where a solve autograd traces found trajectory 0 plain (``remembering``): it
        # runs without gradients, so a later trajectory holding traced values is refused.
        self._solved_plain_under_trace = False

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for Dask workers) without the trajectory 0 built here. Its snapshot holds
        the objects ``prob_func`` returned in this process, with which every trajectory's
        parameter leaves are compared by identity (see ``per_trajectory_leaves``); unpickled
        elsewhere they are copies, never the objects that process's ``prob_func`` returns, so
        a leaf every trajectory shares (a module's weight matrix) became a lane-stacked array
        there. The copy builds trajectory 0 itself, once, and remembers it instead."""
        state = self.__dict__.copy()
        if state["_built_trajectory"] is not None:
            state["_built_trajectory"] = None
            state["_own_first"] = True
        return state

    def remembering(
        self,
        trajectory: tuple[tuple[int, int, int], ODEProblem] | None = None,
        batch: tuple[BatchContext, dict[str, Any]] | None = None,
        plain_under_trace: bool = False,
    ) -> EnsembleProblem:
        """A copy that hands out what ``prob_func`` or ``batch_func`` already built instead of
        calling them again: ``trajectory`` is ``((index, repeat, seed), problem)``, ``batch``
        ``(context, data)``. ``plain_under_trace``: the copy is solved without gradients
        although autograd traces the solve (its trajectory 0 holds no traced value), so a
        trajectory ``prob_func`` builds with traced values is refused by name."""
        new = copy.copy(self)
        new._own_first = self._own_first  # (copy.copy goes through __getstate__)
        new._built_trajectory = trajectory
        new._built_batch = batch
        new._solved_plain_under_trace = plain_under_trace
        return new

    def trajectory(self, index: int, repeat: int, seed: int) -> ODEProblem:
        """Trajectory ``index`` as its own ODEProblem (the per-trajectory path)."""
        if self.prob_func is None:
            return self.prob
        built = self._built_trajectory
        if built is not None and built[0] == (index, repeat, seed):
            return built[1]
        # Trajectory 0 first: the snapshot below reuses its values where nothing changed.
        first = None if (index, repeat) == (0, 0) else self.trajectory(0, 0, seed)
        # One prob_func call and its snapshot at a time in this process: a prob_func that
        # changes prob in place must not interleave with another thread's batch (Dask workers
        # run several batches on one copy of the problem).
        with _PROB_FUNC_LOCK:
            remember = first is None and self._own_first
            built = self._built_trajectory
            if remember and built is not None and built[0] == (index, repeat, seed):
                return built[1]  # another thread built it meanwhile
            prob = self._call_prob_func(index, repeat, seed)
            check_trajectory(index, prob, self.prob)
            if self._solved_plain_under_trace:
                _refuse_traced_later_trajectory(index, prob)
            frozen = snapshot(prob, first)
            if remember:
                self._built_trajectory = ((index, repeat, seed), frozen)
            return frozen

    def trajectory_again(self, seed: int) -> ODEProblem:
        """Trajectory 0 built once more, snapshotted against the one ``trajectory`` gives: its
        parameter leaves are that one's objects exactly where ``prob_func`` hands every call
        the same object (a leaf the trajectories share), and new ones elsewhere."""
        first = self.trajectory(0, 0, seed)
        with _PROB_FUNC_LOCK:
            prob = self._call_prob_func(0, 0, seed)
            check_trajectory(0, prob, self.prob)
            return snapshot(prob, first)

    def trajectory_problem(self, index: int, repeat: int, seed: int) -> ODEProblem:
        """Trajectory ``index`` (attempt ``repeat``) as the ODEProblem it solves, however the
        ensemble describes it: ``prob_func``'s problem, or ``prob`` remade with row ``index``
        of the per-trajectory arrays (or of ``batch_func``'s rows for it alone); ``u0`` and
        the parameters as the lanes get them (real ones in the state's dtype)."""
        if self.prob_func is not None:
            return self.trajectory(index, repeat, seed)
        if self.batch_func is not None:
            data, row = self.batch(np.array([index]), np.array([repeat]), seed), 0
        else:
            data, row = self.arrays, index
        changes: dict[str, Any] = {}
        u0 = self.prob.u0
        if "u0" in data:
            changes["u0"] = _lane_value(_row_of(data["u0"], row), u0)
        if "tspan" in data:
            span = _row_of(data["tspan"], row)
            changes["tspan"] = (span[0], span[1])
        if "p" in data:
            from .. import _pytree

            changes["p"] = _pytree.map_leaves(
                lambda leaf: _lane_value(_row_of(leaf, row), u0), data["p"]
            )
        return self.prob.remake(**changes) if changes else self.prob

    def _call_prob_func(self, index: int, repeat: int, seed: int) -> ODEProblem:
        """``prob_func`` for trajectory ``index``, checked to return an ODEProblem; an
        exception it raises names the trajectory."""
        assert self.prob_func is not None
        try:
            if self._context_form:
                ctx = TrajectoryContext(index, repeat, trajectory_rng(seed, index, repeat))
                prob = self.prob_func(self.prob, ctx)
            else:
                prob = self.prob_func(self.prob, index, repeat)
        except Exception as err:
            rerun = f" (rerun {repeat})" if repeat else ""
            add_note(err, f"raised by prob_func for trajectory {index}{rerun}")
            raise
        if not isinstance(prob, ODEProblem):
            raise TypeError(
                f"prob_func must return an ODEProblem (e.g. prob.remake(p=...)), got "
                f"{type(prob).__name__} for trajectory {index}"
            )
        return prob

    def batch(self, indices: np.ndarray, repeat: np.ndarray, seed: int) -> dict[str, Any]:
        """``batch_func(prob, ctx)`` for the trajectories ``indices``, checked to be a dict of
        ``u0``, ``p``, ``tspan``; an exception it raises names the trajectories."""
        assert self.batch_func is not None
        built = self._built_batch
        if built is not None and _same_context(built[0], indices, repeat, seed):
            return built[1]
        try:
            data = self.batch_func(self.prob, BatchContext(indices, repeat, seed))
        except Exception as err:
            add_note(err, f"raised by batch_func for {describe_trajectories(indices)}")
            raise
        if not isinstance(data, dict) or not set(data) <= {"u0", "p", "tspan"}:
            raise TypeError("batch_func must return a dict with any of the keys 'u0', 'p', 'tspan'")
        return data

    def output(self, sol: Any, index: int) -> tuple[Any, bool]:
        """``output_func(sol, index)``, checked to be a pair ``(value, rerun)``; an exception it
        raises names the trajectory."""
        assert self.output_func is not None
        try:
            result = self.output_func(sol, index)
        except Exception as err:
            add_note(err, f"raised by output_func for trajectory {index}")
            raise
        value, rerun = _pair("output_func", "(value, rerun)", result, "rerun=False")
        if not _is_bool(rerun):
            raise TypeError(
                f"output_func must return (value, rerun) with rerun a bool (True to solve "
                f"trajectory {index} again), got rerun={rerun!r}"
            )
        return value, bool(rerun)

    def initial_accumulator(self) -> Any:
        """A fresh copy of ``u_init`` for one reduction to start from, so that a reduction
        updating ``acc`` in place changes neither ``u_init`` nor the next solve's start (nor,
        on a Dask worker, the start of the next batch that worker reduces)."""
        from .._tracing import is_traced

        return self.u_init if is_traced(self.u_init) else copy.deepcopy(self.u_init)

    def reduce(self, acc: Any, values: Any, indices: np.ndarray) -> tuple[Any, bool]:
        """``reduction(acc, values, indices)``, checked to be a pair ``(acc, converged)``; an
        exception it raises names the trajectories it was folding."""
        assert self.reduction is not None
        try:
            result = self.reduction(acc, values, indices)
        except Exception as err:
            add_note(err, f"raised by reduction for {describe_trajectories(indices)}")
            raise
        acc, converged = _pair("reduction", "(acc, converged)", result, "False")
        if not _is_bool(converged):
            raise TypeError(
                f"reduction must return (acc, converged) with converged a bool (True once acc "
                f"has enough: no further batch is solved), got converged={converged!r} for "
                f"{describe_trajectories(indices)}"
            )
        return acc, bool(converged)

    def __repr__(self) -> str:
        how = (
            "prob_func"
            if self.prob_func
            else "batch_func"
            if self.batch_func
            else f"arrays {sorted(self.arrays)}"
            if self.arrays
            else "identical trajectories"
        )
        return f"EnsembleProblem({self.prob!r}, built from {how})"


def _pair(name: str, pair: str, result: Any, example: str) -> tuple[Any, Any]:
    """``result`` as the pair a user function must return, or a clear error."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        sequence = isinstance(result, (tuple, list))
        got = f"{len(result)} values" if sequence else type(result).__name__
        raise TypeError(
            f"{name} must return a pair {pair}, got {got}; e.g. return value, {example}"
        )
    return result[0], result[1]


def _is_bool(value: Any) -> bool:
    """A Python or NumPy bool, or a 0-d boolean array of any array library (a string, a
    number or None would count as true or false unnoticed)."""
    if isinstance(value, (bool, np.bool_)):
        return True
    if not array_api_compat.is_array_api_obj(value) or value.shape != ():
        return False
    return bool(array_api_compat.array_namespace(value).isdtype(value.dtype, "bool"))


def check_trajectory(index: int, traj: ODEProblem, prob: ODEProblem) -> None:
    """Raise unless ``prob_func``'s trajectory ``index`` (``traj``) fits in a batch with the
    ensemble's ``prob``: the same ``f``, ``jac`` and ``tgrad``, ``u0`` of the same shape, ``p``
    nested alike. Checked as each trajectory is built, so every ensemble algorithm refuses
    the same trajectories with the same message."""
    for name in ("f", "jac", "tgrad"):
        if getattr(traj, name) is not getattr(prob, name):
            raise ValueError(
                f"prob_func changed {name} for trajectory {index}; a batch shares one "
                f"right-hand side and its derivatives (put the differences in p or u0)"
            )
    if tuple(traj.u0.shape) != tuple(prob.u0.shape):
        raise ValueError(
            f"trajectory {index} has u0 shape {tuple(traj.u0.shape)}, expected "
            f"{tuple(prob.u0.shape)} (prob.u0's shape): prob_func must keep u0's shape"
        )
    check_p_structure(index, traj.p, prob.p)


def _refuse_traced_later_trajectory(index: int, traj: ODEProblem) -> None:
    """Raise where trajectory ``index`` holds values autograd is differentiating in an
    ensemble solved without gradients (its trajectory 0 held none)."""
    from .._tracing import is_traced

    if is_traced(traj.u0, traj.p):
        raise ValueError(
            f"prob_func's trajectory {index} holds values autograd is differentiating (in its "
            f"u0 or p) but its trajectory 0 holds none, and dxode tells from trajectory 0 "
            f"whether an ensemble is differentiated: make trajectory 0's u0 or p come from "
            f"the differentiated values too (one that does not vary with them is fine), or "
            f"give the per-trajectory values as arrays built with autograd.numpy, "
            f"EnsembleProblem(prob, u0=..., p=...)"
        )


def check_p_structure(i: int, p: Any, base: Any) -> None:
    """Raise if trajectory ``i``'s parameters ``p`` are not nested as ``prob.p`` (``base``)."""
    from .. import _pytree

    if _pytree.structure(p) != _pytree.structure(base):
        raise ValueError(
            f"trajectory {i}'s p has a different structure than prob.p: prob_func must return "
            f"a p nested as prob.p (the same lists, tuples and dicts around its arrays and "
            f"numbers); give prob.p the form the trajectories use, e.g. an array for an array"
        )
    for leaf, base_leaf in zip(_pytree.leaves(p), _pytree.leaves(base), strict=True):
        # f indexes prob.p's array leaf; a batch stacks the trajectories' numbers into one
        # (B,) row, whose p[0] would be the first trajectory's for every trajectory
        if np.ndim(leaf) == 0 and base_leaf is not None and np.ndim(base_leaf) >= 1:
            raise ValueError(
                f"trajectory {i}'s p holds a number where prob.p holds an array of shape "
                f"{np.shape(base_leaf)}, which f indexes: prob_func must keep the leaf an "
                f"array (e.g. np.array([rate])), or make prob.p's leaf a number"
            )
        # a batch stacks the trajectories' arrays, f indexes them as prob.p's
        if (
            np.ndim(leaf) >= 1
            and base_leaf is not None
            and np.ndim(base_leaf) >= 1
            and np.shape(leaf) != np.shape(base_leaf)
        ):
            raise ValueError(
                f"trajectory {i}'s p holds an array of shape {np.shape(leaf)} where prob.p "
                f"holds one of shape {np.shape(base_leaf)}, the form f indexes: prob_func "
                f"must keep the shapes of p's arrays"
            )


def per_trajectory_leaves(first: list[Any], trajectories: list[list[Any]]) -> list[bool]:
    """Which leaves of ``p`` are per trajectory, given the leaves of the ensemble's trajectory
    0 (``first``) and of some trajectories: those a trajectory does not share with trajectory
    0 (the same object). A leaf every trajectory shares (``prob.p``'s, or a fitted parameter
    vector a ``prob_func`` gives them all) stays one leaf: passed to ``f`` unchanged, and
    when differentiated its cotangent is summed over the trajectories. The rule depends on
    no batching: a batch compares its trajectories with trajectory 0, not with each other."""
    return [any(leaves[k] is not leaf for leaves in trajectories) for k, leaf in enumerate(first)]


def _same_context(ctx: BatchContext, indices: np.ndarray, repeat: np.ndarray, seed: int) -> bool:
    return (
        ctx.seed == seed
        and np.array_equal(ctx.indices, indices)
        and np.array_equal(ctx.repeat, repeat)
    )


def _row_of(x: Any, row: int) -> Any:
    """Row ``row`` of a per-trajectory array (of any array library: the array API indexes
    an array of two or more dimensions with ``[row, ...]`` only)."""
    return x[row, ...] if getattr(x, "ndim", 1) > 1 else x[row]


def _lane_value(value: Any, u0: Any) -> Any:
    """One trajectory's row of a per-trajectory ``u0`` or parameter leaf, cast as the lanes
    cast it: real numbers to the state's floating dtype (and, from another array library, to
    the state's: NumPy rows of an ``array_api_strict`` state), others (complex, traced) as
    they are."""
    from ..backends import backend_for, host_dtype

    dtype = getattr(value, "dtype", None)
    if dtype is None or host_dtype(dtype).kind not in "biuf":
        return value
    if isinstance(dtype, np.dtype) and isinstance(u0.dtype, np.dtype):
        return value.astype(u0.dtype)  # NumPy values (and traced ones) as before
    return backend_for(u0).asarray(value, dtype=u0.dtype)


def _any_given(*values: Any) -> bool:
    return any(v is not None for v in values)


def _as_rows(value: Any) -> Any:
    """A per-trajectory ``u0`` or ``tspan`` given as nested lists, as an array (it is one
    array, not a tree of parameters); arrays as they are."""
    from .._tracing import is_traced

    if isinstance(value, (list, tuple)) and not is_traced(value):
        return np.asarray(value)
    return value


def _scalar_leaf(name: str, value: Any) -> ValueError:
    """The error for a per-trajectory ``name`` (``u0``, ``p``, ``tspan``) holding a number
    where an array with a leading trajectory axis belongs."""
    message = (
        f"EnsembleProblem's {name} gives each trajectory its own value: every array in it needs "
        f"a leading trajectory axis, got a number"
    )
    if name == "p" and isinstance(value, (list, tuple)):
        # not taken as one array, as u0's nested lists are: p is a tree of parameters, so
        # [[a1, a2], [b1, b2]] could as well be two parameters' rows as two trajectories'
        message += (
            " (p as lists of numbers is a tree of scalar parameters, not an array); pass "
            "np.array(p) for one row of parameters per trajectory, trajectories first, or a "
            "tuple of arrays, one (trajectories,) array per parameter"
        )
    return ValueError(message)


def _takes_context(func: Callable[..., Any]) -> bool:
    """True for ``prob_func(prob, ctx)``, false for the classic ``prob_func(prob, i, repeat)``."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return False
    if len(positional) not in (2, 3):
        raise TypeError("prob_func must take (prob, i, repeat) or (prob, ctx)")
    return len(positional) == 2


def _leading_length(arrays: dict[str, Any]) -> int | None:
    """The number of trajectories the per-trajectory arrays describe (all must agree)."""
    from .._pytree import leaves

    lengths = {
        name: {int(np.shape(leaf)[0]) if np.ndim(leaf) else -1 for leaf in leaves(value)}
        for name, value in arrays.items()
    }
    for name, found in lengths.items():
        if -1 in found:
            raise _scalar_leaf(name, arrays[name])
    found = set().union(*lengths.values()) if lengths else set()
    if len(found) > 1:
        raise ValueError(f"per-trajectory arrays disagree on the number of trajectories: {lengths}")
    return found.pop() if found else None
