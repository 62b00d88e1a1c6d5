"""Dask clusters for dxode: a local one (CPU worker processes, or one per GPU), or batch jobs."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from .local_dask import restoring_environ
from .worker_settings import worker_config

__all__ = ["local_cluster"]

# Loopback only (Dask's ":port" listens on every interface), on any free port, so that
# clusters can run side by side.
_DASHBOARD_ADDRESS = "127.0.0.1:0"


def local_cluster(gpus: bool | str = False, n_workers: int | None = None, **kwargs: Any) -> Any:
    """Start a local Dask cluster suited to dxode ensembles (use it as a context manager).

    Parameters
    ----------
    gpus : bool or "auto"
        ``False``: CPU worker processes with one thread each (NumPy batches are single
        threaded, so processes, not threads, use the cores). ``True``: dask-cuda's
        ``LocalCUDACluster``, one worker per GPU, each pinned to its GPU through
        ``CUDA_VISIBLE_DEVICES``. ``"auto"``: GPUs when CuPy sees any, else CPUs.
    n_workers : int, optional
        Worker count; by default one per core (CPU) or per GPU.
    **kwargs
        Passed on to ``LocalCluster`` / ``LocalCUDACluster``. The dashboard listens on
        this machine only (``dashboard_address="127.0.0.1:0"``, a free port; see
        ``cluster.dashboard_link``), also on a TLS cluster, whose dashboard is plain HTTP
        unless Dask's ``distributed.scheduler.dashboard.tls`` settings give it a
        certificate. Reach it from elsewhere through an SSH tunnel, or expose it on purpose
        with e.g. ``dashboard_address="0.0.0.0:8787"``.

    Returns
    -------
    distributed.LocalCluster or dask_cuda.LocalCUDACluster
        Once closed (the last of several open ones), it puts back this process's environment
        as it was before: Dask's nannies set ``OMP_NUM_THREADS=1``, ``PYTHONHASHSEED``, ...
        there to start their workers.

    Examples
    --------
    >>> with dxode.local_cluster() as cluster, distributed.Client(cluster) as client:
    ...     sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=10**6, saveat=1.0)

    On several nodes, start ``dask scheduler`` on one and ``dask worker`` (CPU) or
    ``dask cuda worker`` (GPU) on the others, and pass ``Client("tcp://scheduler:8786")``;
    on a batch system use dask-jobqueue (see the HPC guide).
    """
    try:
        import distributed
    except ImportError as exc:
        raise ImportError('local_cluster needs Dask: pip install "dxode[dask]"') from exc
    import dask

    if gpus == "auto":
        from ..backends import cupy_available

        gpus = cupy_available()
    with dask.config.set(worker_config()):
        if gpus:
            return _cuda_cluster(n_workers, kwargs)
        kwargs.setdefault("threads_per_worker", 1)
        kwargs.setdefault("processes", True)
        kwargs.setdefault("dashboard_address", _DASHBOARD_ADDRESS)
        if kwargs["processes"]:  # also for workers added later (cluster.scale, adapt)
            from .nanny import DxodeNanny

            kwargs.setdefault("worker_class", DxodeNanny)
        n_workers = n_workers or os.cpu_count() or 1
        return restoring_environ(distributed.LocalCluster)(n_workers=n_workers, **kwargs)


def _cuda_cluster(n_workers: int | None, kwargs: dict[str, Any]) -> Any:
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as exc:
        raise ImportError(
            "a GPU cluster needs dask-cuda with its CUDA extra: pip install "
            '"dask-cuda[cu12]" (or [cu13]); it pins its own Dask version, so install it '
            'together with dxode: pip install "dxode[gpu]"'
        ) from exc
    if n_workers is not None:
        kwargs.setdefault("n_workers", n_workers)
    kwargs.setdefault("dashboard_address", _DASHBOARD_ADDRESS)
    try:
        return restoring_environ(LocalCUDACluster)(**kwargs)
    except Exception as exc:  # NVML and CUDA errors come in many types
        if "nvml" in repr(exc).lower() or "cuda" in repr(exc).lower():
            raise RuntimeError(
                f"no usable NVIDIA GPU for a CUDA cluster ({exc}); use local_cluster(gpus=False) "
                f"for CPU workers, or run on a machine with GPUs and drivers"
            ) from exc
        raise


JOBQUEUE_SYSTEMS = ("slurm", "pbs", "sge", "lsf", "htcondor", "oar", "moab")


def jobqueue_cluster(system: str, jobs: int) -> Any:
    """A context manager: ``jobs`` batch jobs of the batch ``system`` running Dask workers.

    The jobs (queue, cores, memory, walltime, ...) are configured by Dask's ``jobqueue``
    settings, e.g. ``~/.config/dask/jobqueue.yaml``; dxode's ``worker_config()`` is applied.

    Raises
    ------
    ImportError
        Without dask-jobqueue.
    ValueError
        For a batch system dask-jobqueue does not support.
    """
    if system not in JOBQUEUE_SYSTEMS:
        raise ValueError(f"unknown batch system {system!r}; choose one of {JOBQUEUE_SYSTEMS}")
    try:
        import dask_jobqueue
    except ImportError:
        raise ImportError(
            'batch-system clusters need dask-jobqueue: pip install "dxode[hpc]"'
        ) from None
    name = {"htcondor": "HTCondorCluster"}.get(system, f"{system.upper()}Cluster")
    return _scaled(getattr(dask_jobqueue, name), jobs)


@contextlib.contextmanager
def _scaled(cluster_class: Any, jobs: int) -> Any:
    import dask

    with dask.config.set(worker_config()), cluster_class() as cluster:
        cluster.scale(jobs=jobs)
        yield cluster
