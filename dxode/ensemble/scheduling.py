"""Batches run here, one after the other: the local form of ``map_batches``.

``AbstractEnsembleAlgorithm.map_batches`` is the one way batches are scheduled (plain
ensemble solves, and the forward and backward passes of a gradient); local algorithms and a
differentiated single solve run it as this loop, ``EnsembleDask`` as keyed Dask tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["map_batches_here"]


def map_batches_here(
    func: Callable[..., Any],
    batch_args: Sequence[tuple],
    send_back: Callable[[Any], Any] | None = None,
) -> Iterator[Any]:
    """``func(*args)`` for each batch's ``args``, in order and lazily; with ``send_back``,
    ``(send_back(result), result)`` (the result is its own handle here)."""
    for args in batch_args:
        result = func(*args)
        yield result if send_back is None else (send_back(result), result)
