"""EventRecord: the events a solve met (times, callbacks, trajectories, states around them)."""

from __future__ import annotations

import dataclasses
from typing import Any

import array_api_compat
import numpy as np

from ..backends import to_host

__all__ = ["EventRecord"]

Array = Any


@dataclasses.dataclass(frozen=True)
class EventRecord:
    """Every event that fired, ordered by trajectory and then by time.

    Attributes
    ----------
    t : (k,) array
        Event times, in the problem's array library and dtype.
    callback : (k,) NumPy int64 array
        Which callback fired: its position in the (flattened) ``CallbackSet``, ``0`` for a
        single callback.
    trajectory : (k,) NumPy int64 array
        The trajectory (``0`` for a single problem).
    u_before, u_after : (k, *u0.shape) arrays
        The state just before and just after the callback's ``affect``; NaN where the
        callback's ``save_positions`` did not ask for it.
    """

    t: Array
    callback: np.ndarray
    trajectory: np.ndarray
    u_before: Array
    u_after: Array

    def __len__(self) -> int:
        return int(self.callback.shape[0])

    def select(self, rows: np.ndarray) -> EventRecord:
        """The events at positions ``rows`` (a host integer array)."""
        return EventRecord(
            t=take_rows(self.t, rows),
            callback=self.callback[rows],
            trajectory=self.trajectory[rows],
            u_before=take_rows(self.u_before, rows),
            u_after=take_rows(self.u_after, rows),
        )

    def for_trajectory(self, i: int) -> EventRecord:
        """Trajectory ``i``'s events (its ``trajectory`` column then reads ``0``)."""
        own = self.select(np.nonzero(self.trajectory == i)[0])
        return dataclasses.replace(own, trajectory=np.zeros_like(own.trajectory))

    def __repr__(self) -> str:
        return f"EventRecord({len(self)} events)"


def _numpy_like(xp: Any) -> bool:
    """Whether ``xp`` is NumPy, or autograd's wrapper of it (for a differentiated solve's
    traced states, whose ``concat`` and ``take`` autograd does not differentiate)."""
    return xp.__name__.split(".")[0] in ("numpy", "autograd")


def take_rows(x: Array, rows: np.ndarray) -> Array:
    """``x[rows]`` along the first axis, ``rows`` a host integer array."""
    xp = array_api_compat.array_namespace(x)
    return x[rows] if _numpy_like(xp) else xp.take(x, xp.asarray(rows), axis=0)


def concat_rows(parts: list[Array]) -> Array:
    """``parts`` joined along the first axis."""
    xp = array_api_compat.array_namespace(*parts)
    return xp.concatenate(parts) if _numpy_like(xp) else xp.concat(parts)


def record_from_lanes(
    backend: Any, events: dict[str, Array], trajectories: np.ndarray | None
) -> EventRecord:
    """An EventRecord from the integrator's event log (lane ``j`` is ``trajectories[j]``)."""
    xp = backend.xp
    lane = backend.to_host(events["lane"]).astype(np.int64)
    return EventRecord(
        t=events["t"],
        callback=backend.to_host(events["callback"]).astype(np.int64),
        trajectory=lane if trajectories is None else trajectories[lane],
        u_before=xp.moveaxis(events["u_before"], -1, 0),
        u_after=xp.moveaxis(events["u_after"], -1, 0),
    )


def concat_records(records: list[EventRecord | None]) -> EventRecord | None:
    """Records one after another (``None`` entries skipped; ``None`` if there are none)."""
    present = [r for r in records if r is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    xp = array_api_compat.array_namespace(present[0].t)
    return EventRecord(
        t=xp.concat([r.t for r in present]),
        callback=np.concatenate([r.callback for r in present]),
        trajectory=np.concatenate([r.trajectory for r in present]),
        u_before=xp.concat([r.u_before for r in present]),
        u_after=xp.concat([r.u_after for r in present]),
    )


def record_to_host(record: EventRecord | None) -> EventRecord | None:
    """The record with its arrays copied to host NumPy (for results that travel)."""
    if record is None:
        return None
    return dataclasses.replace(
        record,
        t=to_host(record.t),
        u_before=to_host(record.u_before),
        u_after=to_host(record.u_after),
    )


def replace_trajectories(
    record: EventRecord | None, rerun: EventRecord | None, trajectories: np.ndarray
) -> EventRecord | None:
    """``record`` with the events of ``trajectories`` replaced by those in ``rerun``."""
    keep = None
    if record is not None:
        keep = record.select(np.nonzero(~np.isin(record.trajectory, trajectories))[0])
    merged = concat_records([keep, rerun])
    if merged is None:
        return None
    order = np.argsort(merged.trajectory, kind="stable")
    return merged.select(order)


def with_points_after(t: Array, u: Array, record: EventRecord, callbacks: Any) -> tuple:
    """Every-step output ``(t, u)`` with the after-state of each event whose callback (in the
    ``CallbackSet`` ``callbacks``) saves it inserted after its time. Rows at the same time
    keep their order: the step's end (the state before), then the events in the order they
    fired. ``u`` may be traced by autograd (``t`` and ``record.t`` then hold values)."""
    keep_after = np.array([cb.save_positions[1] for cb in callbacks], dtype=bool)
    rows = np.nonzero(keep_after[record.callback])[0]
    if rows.size == 0:
        return t, u
    chosen = record.select(rows)
    t_host, te_host = to_host(t), to_host(chosen.t)
    direction = 1.0 if t_host[-1] >= t_host[0] else -1.0
    # Event j goes after the last output row at its time.
    at = np.searchsorted(direction * t_host, direction * te_host, side="right") - 1
    keys = np.concatenate([2 * np.arange(t_host.shape[0]), 2 * at + 1])
    order = np.argsort(keys, kind="stable")
    return (
        take_rows(concat_rows([t, chosen.t]), order),
        take_rows(concat_rows([u, chosen.u_after]), order),
    )
