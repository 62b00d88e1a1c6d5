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
is compared with ``f`` of its column alone (one plain call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def step_agrees(
    tableau: Any,
    stages: tuple[Array, ...],
    values: dict[int, Array],
    h: Array,
    next_start: Array | None,
    alone: Callable[[int], Array],
) -> bool:
    """Whether one iteration's chunk values ``values`` (stage number -> ``(n, W)``) are the
    forward pass's: its stage inputs ``stages`` (each ``n × W`` entries) and step sizes ``h``
    ``(W,)`` rebuilt from them, ``next_start`` (the next iteration's start, or ``None``) as
    ``u_{n+1}``, and ``alone(i)`` (``f`` of stage ``i``'s columns alone, ``(n, W)``) for the
    stage values no relation covers."""
    a = np.asarray(tableau.a, dtype=np.float64)
    b = np.asarray(tableau.b, dtype=np.float64)
    y0 = np.reshape(stages[0], values[next(iter(values))].shape)
    covered: set[int] = set()
    last = min(len(stages), a.shape[0])
    relations = [(stages[i], a[i, :i], True) for i in range(1, last)]
    if next_start is not None:  # an event may move the state between steps: not conclusive
        relations.append((next_start, b, False))
    for target, weights, conclusive in relations:
        terms = [(weights[i], values.get(i)) for i in np.flatnonzero(weights)]
        if any(k is None for _, k in terms):  # a stage not in the chunk
            continue
        if _rebuilt(y0, np.reshape(target, y0.shape), h, terms):
            covered.update(int(i) for i in np.flatnonzero(weights))
        elif conclusive:
            return False
    return all(same_values(values[i], alone(i)) for i in values if i not in covered)


def _rebuilt(y0: Array, target: Array, h: Array, terms: list[tuple[float, Array]]) -> bool:
    """Whether ``y0 + h Σ w k`` gives ``target`` (all ``(n, W)``) to rounding: ``ULPS`` eps of
    ``|y0| + |target| + |h| Σ |w| max|k|`` per entry."""
    rebuilt = y0 + h * sum(w * k for w, k in terms)
    size = np.abs(y0) + np.abs(target)
    size = size + np.abs(h) * sum(abs(w) * np.max(np.abs(k), axis=0) for w, k in terms)
    tolerance = ULPS * np.finfo(y0.dtype).eps * size
    return bool(np.all(np.abs(rebuilt - target) <= tolerance))
