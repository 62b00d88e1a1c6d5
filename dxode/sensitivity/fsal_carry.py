"""The discrete adjoint's dense-only FSAL stage, pulled back with the next step's first stage.

An FSAL method's last stage (Tsit5, DP5, BS3: its row of ``a`` is ``b`` and ``c = 1``)
evaluates ``f`` at the step's end state ``u_{n+1}``. The end state does not use it; only the
dense output does, so only a save point inside step ``n`` gives it a cotangent,
``k̄_d = h_n Σ_s w_d(θ_s) ḡ_s``, known before the sweep. Its ``ȳ_d = J(u_{n+1})ᵀ k̄_d`` enters
the step's recursion exactly as a cotangent of the end state: ``a_di = b_i``, so it adds
``b_i ȳ_d`` to every ``k̄_i / h`` and ``ȳ_d`` to ``ū_n``, as ``ū_{n+1}`` does. The lane's next
accepted step starts from that same ``u_{n+1}``, and its first stage takes the VJP there, so by
linearity ``k̄_d`` is added to that stage's cotangent (``ȳ_0 + ȳ_d`` from one VJP), and the
sweep skips the dense-only stage, which it would otherwise pull back over the whole working
set at every iteration where any lane saves inside a step (most of them in an ensemble:
lanes reach a save time at different iterations). A lane with no later accepted step (its
last step) keeps the dense-only stage at its own iteration.

It is the same discrete adjoint: the gradient agrees with pulling the stage back in place to
rounding (the merged VJP rounds once; the next step's stage time ``t_{n+1}`` may differ from
``t_n + h_n`` in the last bit). Every lane's carry follows from its own steps and saves, so
its bits do not depend on its batch, and a checkpointed sweep gets the same carries.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

Array = Any


def applies(stepper: Any, dense_stage: int, used_first: bool) -> bool:
    """Whether the method's dense-only stage ``dense_stage`` is an FSAL stage evaluated at
    the step's end state (its row of ``a`` equals ``b``, ``c = 1``, ``b`` zero there), and
    the first stage is pulled back at every step (``used_first``)."""
    tab = stepper.tableau
    a, b = np.asarray(tab.a, dtype=np.float64), np.asarray(tab.b, dtype=np.float64)
    c = np.asarray(tab.c, dtype=np.float64)
    if not used_first or dense_stage != tab.stages - 1 or dense_stage == 0:
        return False
    end_state = np.array_equal(a[dense_stage, :dense_stage], b[:dense_stage])
    return end_state and c[dense_stage] == 1.0 and b[dense_stage] == 0.0


def plan(
    sweep: Any,
    iteration: np.ndarray,
    positions: np.ndarray,
    lanes: np.ndarray,
    at_end: np.ndarray,
    g: Array,
    weights: Array,
) -> tuple[Array, dict[int, list[tuple[Array, Array]]], set[int]]:
    """Move the dense-only stage's share of the save cotangents to the lanes' next accepted
    steps, for all save columns at once (``discrete_adjoint._Sweep._gather_saves``).

    Parameters
    ----------
    iteration, positions, lanes, at_end : (total,) host arrays
        Per save column: its iteration, its place in that iteration's working set, its
        lane, and whether it lies at the step's end (``θ = 1``).
    g : (*shape, total) array
        The save cotangents ``ḡ``.
    weights : (stages, 1, ..., total) array
        The dense output's weights ``w(θ)``.

    Returns
    -------
    weights : array
        ``weights`` with the dense-only row zero in the carried columns.
    carries : dict
        Per iteration ``j2``, pairs ``(positions in its working set, k̄_d (*shape, k))``, with
        distinct positions in each pair, to add to its first stage's cotangent.
    in_place : set of int
        The iterations whose dense-only stage is still pulled back in place (a save inside
        a lane's last accepted step).
    """
    xp, d = sweep.xp, sweep.coefficients.last
    target, where = _next_accepted(sweep, iteration, positions, at_end)
    carried = target >= 0
    in_place = set(np.unique(iteration[~at_end & ~carried]).tolist())
    if not carried.any():
        return weights, {}, in_place
    columns, groups = _grouped(np.nonzero(carried)[0], target, lanes)
    index = sweep._device_index(columns)
    h = _steps_at(sweep, iteration[columns], positions[columns])
    w_d = xp.take(weights[d, ...], index, axis=-1)
    k_bar = h * w_d * xp.take(g, index, axis=-1)  # k̄_d of the carried columns, (*shape, C)
    at = sweep._device_index(where[columns])
    carries: dict[int, list[tuple[Array, Array]]] = {}
    for a, b in itertools.pairwise(groups):
        carries.setdefault(int(target[columns[a]]), []).append((at[a:b], k_bar[..., a:b]))
    keep = np.ones((weights.shape[0], iteration.shape[0]))
    keep[d, columns] = 0.0
    keep_w = xp.reshape(sweep.backend.asarray(keep, dtype=weights.dtype), tuple(weights.shape))
    return weights * keep_w, carries, in_place


def _steps_at(sweep: Any, iteration: np.ndarray, positions: np.ndarray) -> Array:
    """The step sizes ``h`` of trial ``iteration[k]`` at ``positions[k]`` of its working set,
    per ``k``, taken trial by trial (one array of every trial's steps would take megabytes of
    fresh memory, which the kernel pages in again on every gradient)."""
    xp = sweep.xp
    order = np.argsort(iteration, kind="stable")
    ordered = iteration[order]
    bounds = [0, *(np.nonzero(ordered[1:] != ordered[:-1])[0] + 1).tolist(), len(order)]
    pieces = [
        xp.take(sweep.trials[int(ordered[a])].h, sweep._device_index(positions[order[a:b]]))
        for a, b in itertools.pairwise(bounds)
    ]
    return xp.take(xp.concat(pieces), sweep._device_index(np.argsort(order, kind="stable")))


def _grouped(
    columns: np.ndarray, target: np.ndarray, lanes: np.ndarray
) -> tuple[np.ndarray, list[int]]:
    """``columns`` ordered by target iteration, then by how many columns before them carry
    the same lane to it (two saves inside one step), then lane; and the bounds of the groups
    of equal target and count (distinct lanes within each)."""
    key = target[columns] * np.int64(lanes.max(initial=0) + 1) + lanes[columns]
    order = np.argsort(key, kind="stable")
    columns, key = columns[order], key[order]
    first = np.concatenate([[True], key[1:] != key[:-1]])
    t = target[columns]
    if first.all():  # one column per lane and target (the common case)
        change = np.nonzero(t[1:] != t[:-1])[0] + 1
        return columns, [0, *change.tolist(), int(columns.shape[0])]
    index = np.arange(columns.shape[0])
    repeat = index - np.maximum.accumulate(np.where(first, index, 0))
    order = np.lexsort((repeat, t))  # stable: lanes stay in order within a group
    t, repeat, columns = t[order], repeat[order], columns[order]
    change = np.nonzero((t[1:] != t[:-1]) | (repeat[1:] != repeat[:-1]))[0] + 1
    return columns, [0, *change.tolist(), int(columns.shape[0])]


def _next_accepted(
    sweep: Any, iteration: np.ndarray, positions: np.ndarray, at_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each save column inside a step (not ``at_end``): the next later iteration at which
    its lane accepted a step (``-1``: none, or a column at a step's end) and the lane's place
    in that iteration's working set. Working sets are sorted and only lose lanes (retired),
    so two of one size are the same and a lane keeps its place between them."""
    count, offsets = len(sweep.trials), sweep.offsets
    sizes = np.diff(offsets)
    accepted = np.concatenate(sweep.accept) if count else np.zeros(0, dtype=bool)
    target = np.full(iteration.shape, -1, dtype=np.int64)
    where = np.zeros(iteration.shape, dtype=np.int64)
    pending = np.nonzero(~at_end)[0]
    step = iteration[pending].astype(np.int64) + 1
    place = positions[pending].astype(np.int64)
    while pending.shape[0]:
        live = step < count
        pending, step, place = pending[live], step[live], place[live]
        for j in np.unique(step[sizes[np.minimum(step, count - 1)] != sizes[step - 1]]).tolist():
            moved = step == j  # the working set lost lanes: find them in the new one
            lanes = sweep.lane[j - 1][place[moved]]
            found = np.minimum(np.searchsorted(sweep.lane[j], lanes), sizes[j] - 1)
            place[moved] = np.where(sweep.lane[j][found] == lanes, found, -1)
        present = place >= 0
        hit = present & accepted[offsets[step] + np.maximum(place, 0)]
        target[pending[hit]], where[pending[hit]] = step[hit], place[hit]
        carry_on = present & ~hit
        pending, step, place = pending[carry_on], step[carry_on] + 1, place[carry_on]
    return target, where
