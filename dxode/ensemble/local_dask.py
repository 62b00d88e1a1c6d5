"""The local Dask clusters of ``local_cluster``: once closed, they put back this process's
environment, which Dask's nannies change to start their worker processes."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

__all__ = ["restoring_environ"]


class _Environ:
    """This process's environment as it was before the first of the open clusters started:
    put back when the last of them closes (clusters may close in any order, and a cluster
    started while another is open finds that one's changes already made)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._saved: dict[str, str] = {}

    def hold(self) -> None:
        with self._lock:
            if not self._open:
                self._saved = dict(os.environ)
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


def _restore_environ(saved: dict[str, str]) -> None:
    """Put this process's environment back as ``saved``."""
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
