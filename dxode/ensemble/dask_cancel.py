"""Cancelling Dask tasks: return once no worker still runs them, or say how many still may."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["STOP_WAIT_S", "cancel_and_wait"]

STOP_WAIT_S = 60.0  # how long a cancelled solve waits for its tasks still running to end
_POLL_S = 0.02


def cancel_and_wait(client: Any, futures: list[Any], timeout: float = STOP_WAIT_S) -> int:
    """Cancel ``futures`` and wait, at most ``timeout`` seconds, until no worker is computing
    any of their tasks; return how many may still be then (0 once all have stopped).

    A worker cannot interrupt a task it is already computing: the cancelled task keeps its
    thread until it ends. Returning only then keeps the cluster free for what comes next,
    no result (a Zarr chunk, say) is written after the caller has moved on, and a cluster
    closed right afterwards does not interrupt those tasks (which ``distributed`` reports
    with a warning per task). Workers whose question fails are skipped. A worker that does
    not answer at all (hung, or stuck in a task that holds the GIL) holds up every worker's
    answer, so the count is then the last one known: at first, every task not finished (or
    already cancelled) when this is called.
    """
    from distributed import TimeoutError

    keys = [future.key for future in futures]
    running = sum(not future.done() or future.cancelled() for future in futures)
    client.cancel(futures)
    deadline = time.monotonic() + timeout
    while running:
        left = max(0.0, deadline - time.monotonic())
        try:
            answers = client.run(_computing, keys, on_error="ignore", callback_timeout=left)
        except TimeoutError:
            break
        running = sum(answers.values())
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    return running


# Worker task states of a task whose function is (or may still be) running in a thread.
_RUNNING = frozenset({"executing", "long-running", "cancelled", "resumed"})


def _computing(keys: list[Any], dask_worker: Any = None) -> int:
    """On a worker: how many of the tasks ``keys`` it is still computing."""
    tasks = dask_worker.state.tasks
    return sum(1 for key in keys if key in tasks and tasks[key].state in _RUNNING)
