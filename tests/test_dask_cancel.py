"""An early-stopped reduction on Dask: cancelled batches end before ``solve`` returns."""

from __future__ import annotations

import textwrap

import pytest
from scripts import run_script

# Batches 0 and 1 are quick and make the reduction converge; batches 2 and 3, which the two
# workers have started by then, take a second. The cluster closes as soon as solve returns.
SCRIPT = textwrap.dedent(
    """
    import time

    import distributed

    import dxode


    def decay(u, p, t):
        return -u


    def slow_after_the_first_two(prob, ctx):
        if ctx.indices[0] >= 20:
            time.sleep(1.0)
        return {}


    def two_batches(acc, u, indices):
        return acc + len(indices), acc + len(indices) >= 20


    if __name__ == "__main__":
        prob = dxode.ODEProblem(decay, [1.0], (0.0, 1.0))
        eprob = dxode.EnsembleProblem(
            prob, batch_func=slow_after_the_first_two, reduction=two_batches, u_init=0
        )
        with dxode.local_cluster(n_workers=2) as cluster, distributed.Client(cluster) as client:
            sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=80, batch_size=10)
            print(sim.converged, sim.u)
    """
)


def test_early_stop_waits_for_cancelled_batches_so_closing_the_cluster_is_quiet(tmp_path):
    pytest.importorskip("distributed")
    script = tmp_path / "early_stop.py"
    script.write_text(SCRIPT, encoding="utf-8")
    result = run_script(script, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "20"]
    assert result.stderr == ""  # no "... ended with CancelledError" from the workers
