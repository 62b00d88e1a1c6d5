"""Per-trajectory parameter arrays checked against the form of ``prob.p`` that ``f`` uses."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_p_rows"]


def check_p_rows(p: Any, base: Any) -> None:
    """Raise if the per-trajectory parameters ``p`` (each leaf trajectories first) give each
    trajectory one number, or a row of another shape, where ``prob.p`` (``base``) holds a
    sequence or an array.

    ``f`` was written for ``prob.p``'s form, so it indexes or unpacks that leaf (``p[0]``,
    ``a, b = p``). A batch passes a per-trajectory number to ``f`` as the lanes' ``(B,)``
    row, on which ``p[0]`` is the batch's first trajectory's value: every lane would
    silently take it. A row of another shape (parameters ``(3, N)`` for a ``prob.p`` of 3,
    read as 3 trajectories of ``N`` numbers) is as silently misread. Leaves that ``prob.p``
    does not describe (``None``, other nesting) are left to the structure checks and to ``f``.
    """
    if base is None:
        return
    if isinstance(p, dict):
        if isinstance(base, dict):
            for key in p.keys() & base.keys():
                check_p_rows(p[key], base[key])
        return
    if isinstance(p, (list, tuple)):
        if isinstance(base, (list, tuple)):
            if len(p) != len(base):
                raise ValueError(
                    f"per-trajectory p is a {type(p).__name__} of {len(p)}, but prob.p, the "
                    f"form f unpacks or indexes, a {type(base).__name__} of {len(base)}: give "
                    f"one per-trajectory array (trajectories first) for each of prob.p's "
                    f"{len(base)} entries, or p as one array (trajectories, {len(base)})"
                )
            for leaf, base_leaf in zip(p, base, strict=True):
                check_p_rows(leaf, base_leaf)
        return
    if np.ndim(p) == 0 or isinstance(base, dict):
        return
    form = _array_shape(base)
    size = len(base) if isinstance(base, (list, tuple)) else form[0] if form else None
    if np.ndim(p) == 1 and size is not None:
        raise ValueError(
            f"per-trajectory p gives each trajectory one number (an array of shape "
            f"({np.shape(p)[0]},)), but prob.p is a {type(base).__name__} of {size} that f "
            f"indexes or unpacks, and p[0] of a batch's row of numbers would be its first "
            f"trajectory's for every trajectory; give p the shape (trajectories, {size}) "
            f"(e.g. rates[:, None]) to match prob.p, or make prob.p a number"
        )
    if not form:  # a number, or not one array of numbers: f's use of it is unknown
        return
    shape = tuple(np.shape(p))
    if shape[1:] != form:
        # e.g. (3, N) parameters for prob.p of 3, read as 3 trajectories of N numbers each
        flipped = (
            "; p looks transposed (one column per trajectory): give p.T"
            if len(shape) == 2 and shape[:1] == form
            else ""
        )
        raise ValueError(
            f"per-trajectory p of shape {shape} gives each trajectory a row of shape "
            f"{shape[1:]}, but prob.p, the form f indexes, has shape {form}; give p the shape "
            f"(trajectories, {', '.join(str(k) for k in form)}), trajectories first{flipped}"
        )


def _array_shape(base: Any) -> tuple[int, ...] | None:
    """The shape of ``prob.p``'s leaf ``base`` where it is an array of numbers (or a sequence
    of numbers, as an array), else ``None``."""
    if isinstance(base, (list, tuple)):
        try:
            arr = np.asarray(base)
        except (TypeError, ValueError):  # ragged, or holding other arrays
            return None
        return arr.shape if arr.dtype.kind in "biufc" else None
    return tuple(np.shape(base)) if np.ndim(base) >= 1 else None
