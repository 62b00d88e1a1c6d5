"""What retiring finished lanes buys: a heterogeneous ensemble with and without compaction.

Lanes that reach their end (or fail) are dropped from the working set once they are a quarter
of it (``dxode.integrator.loop._COMPACT_FRACTION``). This script times a batch whose trajectories
need very different numbers of steps with that default and with compaction switched off
(retired lanes then ride along, masked, until the whole batch ends)::

    python asv_bench/lane_compaction.py
"""

from __future__ import annotations

import time

import numpy as np

import dxode
import dxode.integrator.loop as integrator


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def main(n: int = 10_000, repeat: int = 3) -> None:
    rng = np.random.default_rng(0)
    params = np.column_stack(
        [
            np.full(n, 10.0),
            rng.uniform(0.5, 42.0, n),  # quiet (rho < 1) to strongly chaotic trajectories
            np.full(n, 8.0 / 3.0),
        ]
    )
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 10.0), (10.0, 28.0, 8.0 / 3.0))
    eprob = dxode.EnsembleProblem(prob, p=params)
    options = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}
    rows = []
    default = integrator._COMPACT_FRACTION
    for label, fraction in (("compaction (default)", default), ("no compaction", 1.0)):
        integrator._COMPACT_FRACTION = fraction
        best = np.inf
        for _ in range(repeat):
            start = time.perf_counter()
            sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=n, batch_size=n, **options)
            best = min(best, time.perf_counter() - start)
        rows.append((label, best, sim))
    integrator._COMPACT_FRACTION = default
    steps = rows[0][2].stats.naccept + rows[0][2].stats.nreject
    np.testing.assert_array_equal(rows[0][2].u, rows[1][2].u)  # same answers either way
    print(
        f"{n:,} Lorenz trajectories, rho ~ U(0.5, 42); steps per trajectory: "
        f"min {steps.min()}, median {int(np.median(steps))}, max {steps.max()}"
    )
    print("| working set | time (s) | speedup |\n|---|---|---|")
    for label, best, _ in rows:
        print(f"| {label} | {best:.2f} | {rows[1][1] / best:.2f} |")


if __name__ == "__main__":
    main()
