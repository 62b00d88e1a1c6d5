"""Batched LU factorization with partial pivoting, lanes last, through the array API alone.

Every lane (the last axis) is factored on its own: pivots are chosen per lane and all
arithmetic is elementwise across lanes, in a fixed order, so a lane's factors and solutions
have the same bits whatever the batch it sits in. The work is ``O(n)`` array operations of
size up to ``n * n * L``, which suits the small systems of stiff ODEs solved for many lanes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

Array = Any


class LUFactors(NamedTuple):
    """The factors of ``P A = L U`` for each lane.

    Attributes
    ----------
    lu : (n, n, L) array
        ``U`` on and above the diagonal, the multipliers of ``L`` (unit diagonal) below.
    pivots : tuple of (L,) int arrays
        ``pivots[k]``: the row swapped with row ``k`` at elimination step ``k``.
    """

    lu: Array
    pivots: tuple[Array, ...]


def _check_square(a: Array) -> int:
    if a.ndim != 3 or a.shape[0] != a.shape[1]:
        raise ValueError(f"lu_factor expects lanes-last square matrices (n, n, L), got {a.shape}")
    return int(a.shape[0])


def lu_factor(xp: Any, a: Array) -> LUFactors:
    """Factor each lane's matrix ``a[..., l]`` (``a`` is ``(n, n, L)``)."""
    n = _check_square(a)
    lu = xp.asarray(a, copy=True)
    pivots = []
    for k in range(n):
        column = xp.abs(lu[k:, k, :])  # (n - k, L)
        p = xp.argmax(column, axis=0) + k  # (L,) first maximum: deterministic
        pivots.append(p)
        if k + 1 < n:
            _swap_rows(xp, lu, k, p)
            pivot = lu[k, k, :]
            multipliers = lu[k + 1 :, k, :] / pivot
            lu[k + 1 :, k, :] = multipliers
            lu[k + 1 :, k + 1 :, :] = (
                lu[k + 1 :, k + 1 :, :] - multipliers[:, None, :] * lu[k, None, k + 1 :, :]
            )
    return LUFactors(lu, tuple(pivots))


def lu_solve(xp: Any, factors: LUFactors, b: Array) -> Array:
    """Solve ``A x = b`` for each lane (``b`` and ``x`` are ``(n, L)``)."""
    lu, pivots = factors
    n = lu.shape[0]
    if tuple(b.shape) != (n, lu.shape[2]):
        raise ValueError(f"lu_solve expects b of shape {(n, lu.shape[2])}, got {tuple(b.shape)}")
    x = xp.asarray(b, copy=True)
    for k in range(n - 1):  # the row swaps, in order (they moved whole rows of lu too)
        _swap_rows(xp, x, k, pivots[k])
    for k in range(n - 1):  # forward: L, column by column
        x[k + 1 :, :] = x[k + 1 :, :] - lu[k + 1 :, k, :] * x[k, None, :]
    for k in range(n - 1, -1, -1):  # backward: U, column by column
        x[k, :] = x[k, :] / lu[k, k, :]
        if k:
            x[:k, :] = x[:k, :] - lu[:k, k, :] * x[k, None, :]
    return x


def _swap_rows(xp: Any, a: Array, k: int, p: Array) -> None:
    """Swap row ``k`` with row ``p[l]`` in each lane ``l`` of ``a`` (``(n, ..., L)``), in place."""
    rows = a[k:, ...]
    index = xp.reshape(p, (1,) * (a.ndim - 1) + (p.shape[0],))
    chosen = xp.take_along_axis(rows, xp.broadcast_to(index - k, (1, *rows.shape[1:])), axis=0)
    at_p = xp.reshape(xp.arange(k, a.shape[0], dtype=p.dtype), (-1,) + (1,) * (a.ndim - 1))
    a[k:, ...] = xp.where(at_p == index, a[k, None, ...], rows)
    a[k, ...] = chosen[0, ...]
