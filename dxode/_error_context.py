"""Where in an ensemble an error happened, added to the user's own exception.

An exception raised by ``prob_func``, ``batch_func`` or ``output_func`` keeps its type (a
``ValueError`` stays a ``ValueError``, also after travelling back from a Dask worker); a
PEP 678 note names the trajectory or batch it came from.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["add_note", "describe_trajectories"]


def add_note(err: BaseException, note: str) -> None:
    """Attach ``note`` to ``err`` (``BaseException.add_note``; on Python 3.10, which lacks
    it, the note goes into ``err.__notes__`` as well, where the ``exceptiongroup`` backport's
    tracebacks show it)."""
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:  # pragma: no cover - Python 3.10
        err.__notes__ = [*getattr(err, "__notes__", ()), note]


def describe_trajectories(indices: Sequence[int]) -> str:
    """``"trajectories 16-23"`` for a contiguous run, else the (first few) indices."""
    values = [int(i) for i in indices]
    if not values:
        return "no trajectories"
    if len(values) == 1:
        return f"trajectory {values[0]}"
    if values == list(range(values[0], values[0] + len(values))):
        return f"trajectories {values[0]}-{values[-1]}"
    shown = ", ".join(str(i) for i in values[:8])
    return f"trajectories [{shown}{', ...' if len(values) > 8 else ''}]"
