"""The local Dask clusters of ``local_cluster``: once closed, they put back this process's
environment, which Dask's nannies change to start their worker processes."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

__all__ = ["restoring_environ"]


class _Environ:
    """The variables Dask's nannies set in this process, as they were before the first of
    the open clusters started: put back when the last of them closes (clusters may close in
    any order, and a cluster started while another is open finds that one's changes already
    made). Other variables, the user's own changes meanwhile included, are left alone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._saved: dict[str, str | None] = {}

    def hold(self) -> None:
        with self._lock:
            if not self._open:
                self._saved = {name: os.environ.get(name) for name in _nanny_variables()}
            self._open += 1

    def release(self) -> None:
        with self._lock:
            self._open -= 1
            if not self._open:
                _restore_environ(self._saved)


_ENVIRON = _Environ()


class _RestoresEnviron:
    """Mixin for a ``distributed.SpecCluster`` class: closing the last open such cluster puts
    this process's environment back as it was before the first one started.

    Before it starts a worker process (also one added by ``cluster.scale`` or restarted after
    a crash), each nanny sets the variables of ``distributed.nanny.pre-spawn-environ``
    (``OMP_NUM_THREADS=1``, ...), ``PYTHONHASHSEED`` and ``__DASK_PARENT_PID`` in the
    environment of the process that runs it, this one, and leaves them there, where later
    child processes and libraries read them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _ENVIRON.hold()
        self._holds_environ = True
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._release_environ()  # a failed start that did not close the cluster
            raise

    async def _close(self) -> None:
        # Every way of closing ends here: close(), both context managers, a failed start
        # and the interpreter's exit (some more than once).
        try:
            await super()._close()  # type: ignore[misc]
        finally:
            self._release_environ()

    def _release_environ(self) -> None:
        if self._holds_environ:
            self._holds_environ = False
            _ENVIRON.release()


@functools.cache
def restoring_environ(cluster_class: type) -> type:
    """``cluster_class`` (a local ``SpecCluster``, e.g. ``distributed.LocalCluster``) as a
    subclass of the same name whose clusters put this process's environment back once the
    last of them is closed."""
    return type(cluster_class.__name__, (_RestoresEnviron, cluster_class), {})


def _nanny_variables() -> set[str]:
    """The variables a nanny sets in the process that starts it: those of
    ``distributed.nanny.pre-spawn-environ`` (``worker_config`` only removes some),
    ``PYTHONHASHSEED`` and ``__DASK_PARENT_PID``."""
    import dask

    configured = dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}
    return {"PYTHONHASHSEED", "__DASK_PARENT_PID", *configured}


def _restore_environ(saved: dict[str, str | None]) -> None:
    """Put the variables ``saved`` back as they were (``None``: not set)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        elif os.environ.get(name) != value:
            os.environ[name] = value
