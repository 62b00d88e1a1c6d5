"""Cancelling Dask batches: return only once no worker still runs them."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["cancel_and_wait"]

_POLL_S = 0.02


def cancel_and_wait(client: Any, futures: list[Any]) -> None:
    """Cancel ``futures`` and wait until no worker is computing any of their tasks.

    A worker cannot interrupt a batch it is already computing: the cancelled task keeps its
    thread until the batch ends. Returning only then keeps the cluster free for what comes
    next, and a cluster closed right afterwards does not interrupt those tasks (which
    ``distributed`` reports with a warning per task).
    """
    keys = [future.key for future in futures]
    client.cancel(futures)
    while any(client.run(_computing_any, keys, on_error="ignore").values()):
        time.sleep(_POLL_S)


# Worker task states of a task whose function is (or may still be) running in a thread.
_RUNNING = frozenset({"executing", "long-running", "cancelled", "resumed"})


def _computing_any(keys: list[Any], dask_worker: Any = None) -> bool:
    """On a worker: whether it is still computing any of the tasks ``keys``."""
    tasks = dask_worker.state.tasks
    return any(key in tasks and tasks[key].state in _RUNNING for key in keys)
