"""Lane bookkeeping for the integrator: the working set, its advance after a step, and the records
of what lanes produced."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from .._retcode import ReturnCode
from ..solvers import Step

Array = Any


@dataclasses.dataclass
class LaneResult:
    """Per-lane outcomes in lane order, lanes first (backend arrays).

    ``retcode``, ``t``, ``naccept``, ``nreject``, ``nf`` are ``(L,)``; ``u`` is ``(L, *shape)``;
    ``saved`` is ``(L, nsave, *shape)`` (NaN at points a failed lane never reached); ``steps``
    holds the accepted steps lanes-last and grouped by lane (keys ``lane``, ``t``, ``h``,
    ``t_end``, the exact end time, ``u_end``, the state there, and for dense output ``u0``,
    ``u1`` and ``stages``, the step's own; an event cuts a step short of ``u1``: its
    ``t_end`` and ``u_end`` are the event's, and its interpolant still spans ``t + h``);
    ``trials`` every iteration's trial steps in order (see ``Trial``). ``events`` is the
    callbacks' event log (keys ``lane, t, callback, u_before, u_after``, lanes last), or
    ``None``. ``counters`` holds the stepper's per-lane counters ``(L,)`` by name (AutoSwitch:
    ``nswitch``, switches, and ``nstiff``, attempts with the stiff method).
    """

    retcode: Array
    t: Array
    u: Array
    naccept: Array
    nreject: Array
    nf: Array
    saved: Array | None
    steps: dict[str, Array] | None
    trials: list[Trial] | None = None
    events: dict[str, Array] | None = None
    counters: dict[str, Array] = dataclasses.field(default_factory=dict)


class Trial(NamedTuple):
    """One iteration's trial steps of the working set, kept by reference (no copies).

    ``lane`` (the working set's lane numbers, ascending), ``t``, ``h``, ``t_end`` and
    ``accept`` are ``(W,)``; ``saves`` the rounds of save points the accepted steps filled,
    each ``(idx, save_idx, theta)``: positions in the working set, save point numbers and
    ``theta = (t_save - t) / h``; ``inputs`` the stage inputs ``(*shape, W)`` of the step (or
    ``None``); ``start`` the state and RHS ``(u, f)`` before the step, kept as a checkpoint
    (or ``None``).
    """

    lane: Array
    t: Array
    h: Array
    t_end: Array
    accept: Array
    saves: tuple[tuple[Array, Array, Array], ...]
    inputs: tuple[Array, ...] | None
    start: tuple[Array, Array] | None


class WorkingSet:
    """Named per-lane arrays (lanes on the last axis) that are compacted together."""

    def __init__(self, xp: Any) -> None:
        self._xp = xp
        self._arrays: dict[str, Array] = {}
        self._groups: dict[str, int] = {}
        self.size = 0

    def put(self, **arrays: Array) -> None:
        for name, array in arrays.items():
            self._arrays[name] = array
            self.size = array.shape[-1] if name == "lane" else self.size

    def put_group(self, prefix: str, arrays: tuple[Array, ...]) -> None:
        self._groups[prefix] = len(arrays)
        for i, array in enumerate(arrays):
            self._arrays[f"{prefix}{i}"] = array

    def group(self, prefix: str) -> tuple[Array, ...]:
        return tuple(self._arrays[f"{prefix}{i}"] for i in range(self._groups[prefix]))

    def __getitem__(self, name: str) -> Array:
        return self._arrays[name]

    def get(self, name: str, default: Any) -> Any:
        return self._arrays.get(name, default)

    def compact(self, keep: Array) -> None:
        """Keep only the lanes where ``keep`` (``(L,)`` bool) is true."""
        xp = self._xp
        idx = xp.nonzero(keep)[0]
        self._arrays = {name: xp.take(a, idx, axis=-1) for name, a in self._arrays.items()}
        self.size = int(idx.shape[0])


class LaneRecords:
    """What lanes produce — saved points, accepted steps, final outcomes — assembled at the end.

    Records are appended as lane-indexed chunks while lanes run in any order and are placed
    into lane order once, by the backend's scatter, so the loop never writes into a big output
    array per step.
    """

    def __init__(
        self,
        xp: Any,
        backend: Any,
        n_lanes: int,
        n_save: int,
        shape: tuple[int, ...],
        counters: tuple[str, ...] = (),
    ) -> None:
        self._xp = xp
        self._backend = backend
        self._n_lanes = n_lanes
        self._n_save = n_save
        self._shape = shape
        self._saves: list[tuple[Array, Array]] = []
        self._steps: list[tuple[Array, ...]] = []
        self._step_names: tuple[str, ...] = ()
        self._trials: list[Trial] = []
        self._finals: list[tuple[Array, ...]] = []
        self._counters = counters
        self._retired = 0

    def save(self, lane: Array, save_idx: Array, values: Array, mask: Array | None) -> None:
        """Record ``values`` (``(*shape, k)``) as save point ``save_idx`` of lanes ``lane``."""
        xp = self._xp
        if mask is not None:
            if not bool(xp.any(mask)):
                return
            idx = xp.nonzero(mask)[0]
            lane, save_idx, values = (xp.take(a, idx, axis=-1) for a in (lane, save_idx, values))
        self._saves.append((lane * self._n_save + save_idx, xp.moveaxis(values, -1, 0)))

    def step(self, accept: Array, **fields: Array) -> None:
        """Record the accepted steps among the working set's trial steps: ``fields`` are the
        per-lane arrays, lanes last, by their names in ``LaneResult.steps`` (the same names
        on every call)."""
        xp = self._xp
        self._step_names = tuple(fields)
        values = tuple(fields.values())
        if not bool(xp.all(accept)):
            idx = xp.nonzero(accept)[0]
            values = tuple(xp.take(a, idx, axis=-1) for a in values)
        self._steps.append(values)

    def trial(self, trial: Trial) -> None:
        """Keep one iteration's trial steps (for the discrete adjoint)."""
        self._trials.append(trial)

    def retire(
        self,
        lanes: Any,
        mask: Array,
        code: ReturnCode,
        attempts: int,
        nf_start: int,
        nf_per_attempt: int,
    ) -> None:
        """Record the final state of the lanes where ``mask`` holds, with return code ``code``.

        Every lane of the working set has made ``attempts`` step attempts, each costing
        ``nf_per_attempt`` RHS evaluations after ``nf_start`` to start; evaluations made for
        interpolation are in the optional lane array ``nf_extra``.
        """
        xp = self._xp
        if not bool(xp.any(mask)):
            return
        idx = xp.nonzero(mask)[0]
        take = lambda a: xp.take(a, idx, axis=-1)
        lane = take(lanes["lane"])
        code_arr = xp.full(lane.shape, int(code), dtype=xp.int64)
        naccept = take(lanes["naccept"])
        nf = xp.full(lane.shape, nf_start + nf_per_attempt * attempts, dtype=xp.int64)
        extra = lanes.get("nf_extra", None)
        if extra is not None:
            nf = nf + take(extra)
        self._finals.append(
            (
                lane,
                code_arr,
                take(lanes["t"]),
                xp.moveaxis(take(lanes["u"]), -1, 0),
                naccept,
                attempts - naccept,
                nf,
                *(take(lanes[name]) for name in self._counters),
            )
        )
        self._retired += int(idx.shape[0])

    def result(self) -> LaneResult:
        xp, backend, n = self._xp, self._backend, self._n_lanes
        if self._retired != n:  # pragma: no cover - an integrator bug, never a user error
            raise AssertionError(f"{n - self._retired} lanes were never retired")
        lane, code, t, u, naccept, nreject, nf, *counts = (
            xp.concat([chunk[i] for chunk in self._finals]) for i in range(7 + len(self._counters))
        )

        def place(values: Array) -> Array:
            return backend.scatter_rows(lane, values, n, 0)

        saved = None
        if self._n_save:
            # Lanes that failed early leave some save points unwritten: those hold NaN.
            empty = xp.zeros((0, *self._shape), dtype=u.dtype)
            keys = xp.concat([k for k, _ in self._saves] or [xp.zeros(0, dtype=xp.int64)])
            values = xp.concat([v for _, v in self._saves] or [empty])
            flat = backend.scatter_rows(keys, values, n * self._n_save, float("nan"))
            saved = xp.reshape(flat, (n, self._n_save, *self._shape))
        steps = None
        if self._steps:
            n_fields = len(self._step_names)
            fields = [xp.concat([s[i] for s in self._steps], axis=-1) for i in range(n_fields)]
            order = xp.argsort(fields[0], stable=True)
            fields = [xp.take(f, order, axis=-1) for f in fields]
            steps = dict(zip(self._step_names, fields, strict=True))
            if "u_end" not in steps:  # no event cut a step: each ends at its own u1
                steps["u_end"] = steps["u1"]
        return LaneResult(
            trials=self._trials or None,
            retcode=place(code),
            t=place(t),
            u=place(u),
            naccept=place(naccept),
            nreject=place(nreject),
            nf=place(nf),
            saved=saved,
            steps=steps,
            counters={name: place(c) for name, c in zip(self._counters, counts, strict=True)},
        )


def advance(
    step: Step, accept: Array, f0: Array, t_end: Array, u_end: Array, f1: Array | None
) -> tuple[Array, Array, Array]:
    """The working set's ``(t, u, f)`` after ``step`` (whose start has RHS ``f0``): lanes that
    accept move to the step's end ``(t_end, u_end)`` and take its ``f`` (``f1`` for FSAL
    methods, else a fresh RHS evaluation on every lane); the others stay."""
    xp = step.backend.xp
    accept_u = expand(xp, accept, step.u0)
    u = xp.where(accept_u, u_end, step.u0)
    t = xp.where(accept, t_end, step.t)
    f = xp.where(accept_u, f1, f0) if step.stepper.fsal else step.rhs(u, t)
    return t, u, f


def expand(xp: Any, mask: Array, like: Array) -> Array:
    """A per-lane mask ``(L,)`` shaped to broadcast against ``like`` ``(*shape, L)``."""
    return xp.reshape(mask, (1,) * (like.ndim - 1) + (mask.shape[0],))
