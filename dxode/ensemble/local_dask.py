"""The local Dask clusters of ``local_cluster``: closed, they put back this process's
environment, which Dask's nannies change to start their worker processes."""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["restoring_environ"]


class _RestoresEnviron:
    """Mixin for a ``distributed.SpecCluster`` class: closing the cluster puts this process's
    environment back as it was when the cluster was created.

    Before it starts a worker process (also one added by ``cluster.scale`` or restarted after
    a crash), each nanny sets the variables of ``distributed.nanny.pre-spawn-environ``
    (``OMP_NUM_THREADS=1``, ...), ``PYTHONHASHSEED`` and ``__DASK_PARENT_PID`` in the
    environment of the process that runs it, this one, and leaves them there, where later
    child processes and libraries read them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._environ_before = dict(os.environ)
        super().__init__(*args, **kwargs)

    async def _close(self) -> None:
        # Every way of closing ends here: close(), both context managers, a failed start
        # and the interpreter's exit.
        try:
            await super()._close()  # type: ignore[misc]
        finally:
            _restore_environ(self._environ_before)


@functools.cache
def restoring_environ(cluster_class: type) -> type:
    """``cluster_class`` (a local ``SpecCluster``, e.g. ``distributed.LocalCluster``) as a
    subclass of the same name whose instances put this process's environment back when
    closed."""
    return type(cluster_class.__name__, (_RestoresEnviron, cluster_class), {})


def _restore_environ(saved: dict[str, str]) -> None:
    """Put this process's environment back as ``saved``."""
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
