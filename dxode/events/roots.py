"""Per-lane root bracketing for continuous events: the Illinois method, vectorized over lanes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Array = Any

# Every fourth iteration bisects, so a bracket at least halves every four iterations
# whatever the function: 4 * 64 iterations shrink any bracket in [0, 1] below float64's
# resolution.
_BISECT_EVERY = 4
_MAX_ITERATIONS = 4 * 64


def bracket_root(
    xp: Any,
    g: Callable[[Array], Array],
    a: Array,
    b: Array,
    ga: Array,
    gb: Array,
    tol: Array,
) -> tuple[Array, Array, Array]:
    """Narrow each lane's bracket ``[a, b]`` around a sign change of ``g`` to width ``tol``.

    ``ga = g(a)`` is nonzero or zero (then ``a`` is the root); ``gb = g(b)`` is zero or of
    the other sign. ``g(x)`` evaluates all lanes at the points ``x`` (``(k,)``). Lanes are
    independent: a lane's iterates depend only on its own values, and a converged lane is
    frozen. A zero of ``g`` becomes the bracket's end ``b``, and the next iterate probes
    ``tol`` before it: where ``g`` is zero there too (zero over an interval) the bracket
    narrows on to where ``g`` first reaches zero, not to whichever of its zeros an iterate
    hit. Returns ``(a, b, evaluations)``: the final bracket — ``g`` keeps ``ga``'s sign at
    ``a``, or ``a`` is the zero found — and how many times each lane's ``g`` was evaluated.
    """
    b = xp.where(ga == 0, a, b)
    done = (b - a <= tol) | (ga == 0)
    evaluations = xp.zeros(a.shape, dtype=xp.int64)
    last = xp.zeros(a.shape, dtype=xp.int64)  # which end the last iterate replaced: -1 a, +1 b
    probed = xp.zeros(a.shape, dtype=xp.bool)  # lanes whose zero at b has been probed before
    iteration = 0
    while not bool(xp.all(done)) and iteration < _MAX_ITERATIONS:
        iteration += 1
        mid = 0.5 * (a + b)
        if iteration % _BISECT_EVERY == 0:
            x = mid
        else:
            x = b - gb * (b - a) / (gb - ga)  # regula falsi
            x = xp.where((x > a) & (x < b), x, mid)  # also catches NaN
        probe = (gb == 0) & ~probed
        x = xp.where(probe, xp.maximum(a, b - tol), x)
        probed = probed | probe
        gx = g(x)
        active = ~done
        evaluations = evaluations + xp.astype(active, xp.int64)
        to_a = active & (gx != 0) & (xp.sign(gx) == xp.sign(ga))
        to_b = active & ~to_a
        # Illinois: an end kept twice in a row has its value halved, so both ends converge.
        ga = xp.where(to_b & (last == 1), 0.5 * ga, ga)
        gb = xp.where(to_a & (last == -1), 0.5 * gb, gb)
        a = xp.where(to_a, x, a)
        b = xp.where(to_b, x, b)
        ga = xp.where(to_a, gx, ga)
        gb = xp.where(to_b, gx, gb)
        last = xp.where(to_a, -1, xp.where(to_b, 1, last))
        done = done | (b - a <= tol) | (probe & to_a)
    return xp.where(gb == 0, b, a), b, evaluations
