"""Per-trajectory parameter arrays checked against the form of ``prob.p`` that ``f`` uses."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_p_rows"]


def check_p_rows(p: Any, base: Any) -> None:
    """Raise if the per-trajectory parameters ``p`` (each leaf trajectories first) give each
    trajectory one number where ``prob.p`` (``base``) holds a sequence or an array.

    ``f`` was written for ``prob.p``'s form, so it indexes or unpacks that leaf (``p[0]``,
    ``a, b = p``). A batch passes a per-trajectory number to ``f`` as the lanes' ``(B,)``
    row, on which ``p[0]`` is the batch's first trajectory's value: every lane would
    silently take it. Leaves that ``prob.p`` does not describe (``None``, other nesting)
    are left to the structure checks and to ``f``.
    """
    if base is None:
        return
    if isinstance(p, dict):
        if isinstance(base, dict):
            for key in p.keys() & base.keys():
                check_p_rows(p[key], base[key])
        return
    if isinstance(p, (list, tuple)):
        if isinstance(base, (list, tuple)) and len(p) == len(base):
            for leaf, base_leaf in zip(p, base, strict=True):
                check_p_rows(leaf, base_leaf)
        return
    if np.ndim(p) != 1 or isinstance(base, dict):
        return
    if isinstance(base, (list, tuple)):
        size = len(base)
    elif np.ndim(base) >= 1:
        size = int(np.shape(base)[0])
    else:
        return
    raise ValueError(
        f"per-trajectory p gives each trajectory one number (an array of shape "
        f"({np.shape(p)[0]},)), but prob.p is a {type(base).__name__} of {size} that f "
        f"indexes or unpacks, and p[0] of a batch's row of numbers would be its first "
        f"trajectory's for every trajectory; give p the shape (trajectories, {size}) "
        f"(e.g. rates[:, None]) to match prob.p, or make prob.p a number"
    )
