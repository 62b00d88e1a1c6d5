"""How much array work one evaluation of ``f`` does per lane, counted (not timed).

The bulk linearization (``bulk_linearization``) pays ``f``'s arithmetic up to ``n + 1`` times
per column to save autograd's fixed cost per traced call; whether that pays depends on how
many operations ``f`` makes and how many elements they produce per lane. ``probe`` evaluates
``f`` once on a working set whose state is a counting ``ndarray`` subclass: every NumPy call
on it (ufuncs, array functions, indexing) adds one call and its output's elements. Shapes
alone decide the counts, so the choice they feed is the same on every run (no timing, the
same bits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Array = Any


def probe(f: Callable[[Array], Any], y: np.ndarray) -> tuple[int, int]:
    """``(calls, elements)``: the NumPy operations ``f(y)`` applied to values derived from
    ``y`` and the elements they produced (``f``'s own stacking of a list of rows aside)."""
    tally = [0, 0]

    def counted(out: Any) -> Any:
        if isinstance(out, np.ndarray):
            tally[0] += 1
            tally[1] += int(out.size)
            return out.view(Counted)
        return out

    class Counted(np.ndarray):
        """An array that counts the operations made on it."""

        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
            return counted(getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs)))

        def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
            return counted(func(*_plain(args), **_plain(kwargs)))

        def __getitem__(self, idx: Any) -> Any:
            return counted(np.asarray(self)[idx])

    with np.errstate(all="ignore"):
        f(np.asarray(y).view(Counted))
    return tally[0], tally[1]


def _plain(x: Any) -> Any:
    """``x`` with every counting array inside (lists, tuples, dicts) as a plain ``ndarray``."""
    if isinstance(x, np.ndarray):
        return np.asarray(x)
    if type(x) in (list, tuple):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x
