"""A Lorenz ensemble on a Dask ``LocalCluster`` of worker processes (``EnsembleDask``).

The cluster is started once per benchmark class (asv's ``setup_cache`` cannot hold a live
cluster, so ``setup`` starts it and ``teardown`` closes it); the timed call is one ensemble
solve, batches as tasks, with the results gathered on the driver.
"""

from __future__ import annotations

from typing import ClassVar

import dxode
from dxode.demo.lorenz import lorenz  # importable on the workers, unlike asv's benchmark package

from .ensemble import PROBLEM, parameters


class LorenzEnsembleDask:
    """10,000 Lorenz trajectories in 4 batches on 1 or 2 worker processes."""

    params: ClassVar[list[int]] = [1, 2]
    param_names: ClassVar[list[str]] = ["workers"]
    timeout = 300
    number = 1
    repeat = (1, 3, 30.0)

    def setup(self, workers):
        try:
            import distributed
        except ImportError as exc:
            raise NotImplementedError("distributed is not installed") from exc
        self.cluster = dxode.local_cluster(n_workers=workers)
        self.client = distributed.Client(self.cluster)
        self.client.wait_for_workers(workers)
        self.eprob = dxode.EnsembleProblem(PROBLEM.remake(f=lorenz), p=parameters(10_000))
        self.solve(batch_size=10_000)  # warm the workers (imports, caches)

    def teardown(self, workers):
        self.client.close()
        self.cluster.close()

    def solve(self, batch_size: int = 2_500):
        return dxode.solve(
            self.eprob,
            dxode.Tsit5(),
            self.client,
            trajectories=10_000,
            batch_size=batch_size,
            saveat=1.0,
            rtol=1e-6,
            atol=1e-6,
        )

    def time_ensemble_dask(self, workers):
        self.solve()
