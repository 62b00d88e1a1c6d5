"""Whether a single trajectory's ``f``, handed a bulk chunk's stage inputs as columns, gave
each column the value it gave that stage input alone in the forward pass.

An ``f`` written for one state may mix the columns (a branch on ``anp.sum(u**2)`` or
``anp.max(u)`` reads all of them and takes one branch for all), and the chunk's Jacobians are
then silently wrong. The forward pass kept every stage input, and an explicit Runge–Kutta
step ties them to the stage values ``k_i = f(y_i)``:

    y_l = y_0 + h Σ_{i<l} a_li k_i,    u_{n+1} = y_0 + h Σ_i b_i k_i,

so the chunk's values ``k̃_i`` rebuild the recorded ``y_l`` (and the next iteration's start)
to rounding only where they are the forward pass's: a value off by ``δ`` moves the rebuilt
input by ``h |a_li| δ``. Each stage value a relation does not cover (a step's end state
moved by an event, the next iteration in another chunk, a stage only the dense output uses)
is compared with ``f`` of its column alone (one plain call). A chunk's iterations are checked
together, a few array operations per relation (a single trajectory has one column per stage).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

Array = Any

# Rounding allowance, in units of eps times the magnitudes summed: f over many columns and
# over one may differ in the last bits (NumPy's vector and scalar transcendental functions).
ULPS = 64


def same_values(together: Array, alone: Array) -> bool:
    """Whether ``together`` holds ``alone``'s values to rounding (``ULPS`` eps of the largest
    finite one) and NaN where it does."""
    together, alone = np.asarray(together), np.asarray(alone)
    if together.shape != alone.shape:
        return False
    scale = np.max(np.abs(alone), initial=0.0, where=np.isfinite(alone))
    tolerance = ULPS * np.finfo(alone.dtype).eps * scale
    same_nan = np.array_equal(np.isnan(together), np.isnan(alone))
    close = np.all(np.abs(together - alone) <= tolerance, where=~np.isnan(alone))
    return bool(same_nan and close)


class ChunkStep(NamedTuple):
    """One iteration of a single trajectory's chunk: the stages pulled back (ascending), the
    chunk column holding each one's input and value, the iteration's recorded stage inputs,
    its step size ``(1,)`` and the next iteration's start (``None`` past the chunk)."""

    pulled: tuple[int, ...]
    columns: tuple[int, ...]
    stages: tuple[Array, ...]
    h: Array
    next_start: Array | None


def chunk_agrees(
    tableau: Any,
    steps: list[ChunkStep],
    values: Array,
    y: Array,
    alone: Callable[[int], Array],
) -> bool:
    """Whether a chunk's values of ``f`` ``values`` ``(n, K)`` at its columns ``y`` ``(n, K)``
    are the forward pass's, iteration by iteration (``steps``): the recorded stage inputs
    rebuilt from them (a failure refutes them), the next start as ``u_{n+1}`` (a failure
    proves nothing: an event may move the state), and ``alone(column)`` (``f`` of that
    column alone, ``(n, 1)``) for each stage value no relation covers."""
    a = np.asarray(tableau.a, dtype=np.float64)
    b = np.asarray(tableau.b, dtype=np.float64)
    groups: dict[tuple[int, ...], list[ChunkStep]] = {}
    for step in steps:
        groups.setdefault(step.pulled, []).append(step)
    return all(_group_agrees(a, b, group, values, y, alone) for group in groups.values())


def _group_agrees(
    a: np.ndarray,
    b: np.ndarray,
    group: list[ChunkStep],
    values: Array,
    y: Array,
    alone: Callable[[int], Array],
) -> bool:
    """``chunk_agrees`` for iterations that pulled the same stages, all at once."""
    pulled = group[0].pulled
    n = values.shape[0]
    columns = np.array([step.columns for step in group])  # (J, m)
    k, y_pulled = values[:, columns], y[:, columns]  # (n, J, m)
    h = np.array([float(np.reshape(step.h, -1)[0]) for step in group])  # (J,)

    def recorded(stage: int) -> Array:  # (n, J)
        if stage in pulled:
            return y_pulled[:, :, pulled.index(stage)]
        return np.stack([np.reshape(step.stages[stage], (n,)) for step in group], axis=1)

    y0 = recorded(0)
    covered: set[int] = set()
    for stage in range(1, min(len(group[0].stages), a.shape[0])):
        weights = a[stage, :stage]
        used = np.flatnonzero(weights)
        if any(i not in pulled for i in used):  # a stage not in the chunk
            continue
        if not _rebuilt(y0, recorded(stage), h, k, pulled, used, weights).all():
            return False
        covered.update(int(i) for i in used)
    ends = np.zeros(len(group), dtype=bool)  # whether u_{n+1} rebuilds the next start
    used_b = np.flatnonzero(b)
    following = [j for j, step in enumerate(group) if step.next_start is not None]
    if following and all(i in pulled for i in used_b):
        starts = np.stack([np.reshape(group[j].next_start, (n,)) for j in following], axis=1)
        h_f, k_f = h[following], k[:, following]
        ends[following] = _rebuilt(y0[:, following], starts, h_f, k_f, pulled, used_b, b)
    for j, step in enumerate(group):
        end_covered = set(used_b.tolist()) if ends[j] else set()
        for m, stage in enumerate(pulled):
            if stage in covered or stage in end_covered:
                continue
            if not same_values(k[:, j, m : m + 1], alone(step.columns[m])):
                return False
    return True


def _rebuilt(
    y0: Array,
    target: Array,
    h: Array,
    k: Array,
    pulled: tuple[int, ...],
    used: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """Per iteration ``(J,)``: whether ``y0 + h Σ w_i k_i`` over the stages ``used`` gives
    ``target`` (``(n, J)``; ``k`` ``(n, J, m)`` by position in ``pulled``) to rounding:
    ``ULPS`` eps of ``|y0| + |target| + |h| Σ |w_i| max|k_i|`` per entry."""
    positions = [pulled.index(int(i)) for i in used]
    terms, w = k[:, :, positions], weights[used]
    rebuilt = y0 + h * np.sum(terms * w, axis=-1)
    largest = np.max(np.abs(terms), axis=0)  # (J, q)
    size = np.abs(y0) + np.abs(target) + np.abs(h) * np.sum(largest * np.abs(w), axis=-1)
    tolerance = ULPS * np.finfo(y0.dtype).eps * size
    return np.all(np.abs(rebuilt - target) <= tolerance, axis=0)
