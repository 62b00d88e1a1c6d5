"""Dask settings for the worker processes that run dxode batches."""

from __future__ import annotations

from typing import Any

__all__ = ["worker_config"]


def worker_config() -> dict[str, Any]:
    """Dask configuration for worker processes that run dxode batches.

    Two Dask defaults slow dxode's batches, whose steps are many small array operations
    driven from Python: the nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which
    makes glibc hand every large temporary array back to the system and map it again on the
    next step (several times slower), and each worker samples its threads' stacks every
    10 ms for the dashboard's profile (about 25 % slower). dxode's workers keep the glibc
    default and do not profile. Use it for clusters you start yourself too::

        with dask.config.set(dxode.worker_config()):
            cluster = SLURMCluster(...)
    """
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    environ.pop("MALLOC-TRIM-THRESHOLD-", None)
    return {
        "distributed.nanny.pre-spawn-environ": environ,
        "distributed.worker.profile.enabled": False,
    }
