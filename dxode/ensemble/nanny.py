"""The Dask nanny of ``local_cluster``'s CPU workers: it starts them with ``worker_config``."""

from __future__ import annotations

import copy
from typing import Any

import dask
import distributed

from .worker_settings import worker_config

__all__ = ["DxodeNanny"]


class DxodeNanny(distributed.Nanny):
    """A ``distributed.Nanny`` built under dxode's ``worker_config()``.

    Settings that held only while the cluster was created miss the workers that
    ``cluster.scale(n)`` or adaptive scaling adds later: a nanny reads the workers'
    environment when it is built, and their configuration when it starts them (the copy it
    makes when built shares nested settings with the global configuration). Each of this
    class's nannies keeps its own copy of both.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with dask.config.set(worker_config()):
            super().__init__(*args, **kwargs)
            self.config = copy.deepcopy(self.config)
