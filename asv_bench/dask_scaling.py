"""Dask measurements for dxode ensembles: strong scaling, batch overhead, uneven batches, memory.

Run from the repository root, on an otherwise idle machine::

    python asv_bench/dask_scaling.py --scaling --kernel-scaling --overhead --uneven --memory \
        --out results.md

Each section prints a markdown table (and appends it to ``--out``). Times are wall-clock seconds
(best of ``--repeat``); memory is the driver's peak resident set, measured in a fresh process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
from bench_timing import best_of

import dxode

P0 = np.array([10.0, 28.0, 8.0 / 3.0])


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def lorenz_ensemble(n: int, t1: float = 10.0, seed: int = 0, **kwargs) -> dxode.EnsembleProblem:
    rng = np.random.default_rng(seed)
    params = P0 * (1 + 0.1 * (rng.random((n, 3)) - 0.5))
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, t1), tuple(P0))
    return dxode.EnsembleProblem(prob, p=params, **kwargs)


SOLVE = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def section_scaling(n: int, repeat: int, record: dict) -> str:
    """One process (EnsembleArray) vs LocalCluster with 1 and 2 worker processes.

    The times also go into ``record["scaling"]`` (workers 0 = this process).
    """
    eprob = lorenz_ensemble(n)
    rows = _strong_scaling(
        eprob,
        n,
        repeat,
        here=("EnsembleArray (this process)", None),
        on_cluster=("EnsembleDask", dxode.EnsembleDask),
        record=record.setdefault("scaling", {"n": n}),
    )
    return f"### Strong scaling, {n:,} Lorenz trajectories\n\n" + table(
        ["run", "workers", "time (s)", "speedup vs 1 worker"], rows
    )


def section_kernel_scaling(n: int, repeat: int, record: dict) -> str:
    """The compiled kernel, one thread: in this process vs ``EnsembleDask(kernel=...)`` on
    LocalClusters of 1 and 2 single-threaded worker processes (each worker compiles, or
    loads from numba's disk cache, during the warm-up solves, which are not timed).

    The times also go into ``record["kernel_scaling"]`` (workers 0 = this process).
    """
    kernel = dxode.EnsembleKernel(threads=1)
    rows = _strong_scaling(
        lorenz_ensemble(n),
        n,
        repeat,
        here=("EnsembleKernel(threads=1) (this process)", kernel),
        on_cluster=("EnsembleDask(kernel=...)", lambda c: dxode.EnsembleDask(c, kernel=kernel)),
        record=record.setdefault("kernel_scaling", {"n": n}),
    )
    return f"### Strong scaling with kernel batches, {n:,} Lorenz trajectories\n\n" + table(
        ["run", "workers", "time (s)", "speedup vs 1 worker"], rows
    )


def _strong_scaling(
    eprob: dxode.EnsembleProblem,
    n: int,
    repeat: int,
    here: tuple[str, object],
    on_cluster: tuple[str, object],
    record: dict,
) -> list[list[object]]:
    """Best-of-``repeat`` times of ``eprob`` solved in this process with ``here``'s ensemble
    algorithm, then with ``on_cluster``'s (made from a client) on LocalClusters of 1 and 2
    worker processes, after an untimed warm-up solve each; the times go into
    ``record["seconds"]`` by worker count (0: this process)."""
    import distributed

    def solve(algorithm: object) -> object:
        return dxode.solve(eprob, dxode.Tsit5(), algorithm, trajectories=n, **SOLVE)

    label, algorithm = here
    solve(algorithm)
    single, _ = best_of(lambda: solve(algorithm), repeat)
    rows: list[list[object]] = [[label, "-", f"{single:.3f}", "-"]]
    record["seconds"] = {0: single}
    label, make = on_cluster
    base = None
    for workers in (1, 2):
        with (
            dxode.local_cluster(n_workers=workers) as cluster,
            distributed.Client(cluster) as client,
        ):
            client.wait_for_workers(workers)
            ensemble = make(client)
            solve(ensemble)  # untimed: the workers import dxode, load or compile kernels
            elapsed, _ = best_of(lambda e=ensemble: solve(e), repeat)
        base = base or elapsed
        record["seconds"][workers] = elapsed
        rows.append(
            [
                f"{label}, LocalCluster({workers} workers)",
                workers,
                f"{elapsed:.3f}",
                f"{base / elapsed:.2f}",
            ]
        )
    return rows


def section_overhead(n: int, repeat: int) -> str:
    """Per-batch cost: the same ensemble split into more and more batches, 2 workers."""
    import distributed

    eprob = lorenz_ensemble(n, t1=1.0)
    rows = []
    with dxode.local_cluster(n_workers=2) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        for batch_size in (n // 4, n // 16, n // 64, n // 256, n // 1024):
            batches = -(-n // batch_size)
            elapsed, _ = best_of(
                lambda b=batch_size: dxode.solve(
                    eprob, dxode.Tsit5(), client, trajectories=n, batch_size=b, **SOLVE
                ),
                repeat,
            )
            rows.append([batch_size, batches, f"{elapsed:.3f}", f"{1e3 * elapsed / batches:.2f}"])
    # The slope of time against the number of batches is the per-batch overhead.
    counts = np.array([r[1] for r in rows], dtype=float)
    times = np.array([float(r[2]) for r in rows])
    slope = np.polyfit(counts, times, 1)[0]
    return (
        f"### Batch size vs scheduling overhead, {n:,} trajectories (t in [0, 1]), 2 workers\n\n"
        + table(["batch size", "batches", "time (s)", "ms per batch"], rows)
        + f"\n\nFitted overhead per extra batch: {1e3 * slope:.2f} ms."
    )


def section_uneven(n: int, repeat: int) -> str:
    """Uneven batches: a quarter of the trajectories need 10x the time span (far more steps)."""
    import distributed

    spans = np.zeros((n, 2))
    spans[:, 1] = 2.0
    spans[: n // 4, 1] = 20.0  # the first batches are the expensive ones
    rng = np.random.default_rng(1)
    params = P0 * (1 + 0.1 * (rng.random((n, 3)) - 0.5))
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 2.0), tuple(P0))
    eprob = dxode.EnsembleProblem(prob, p=params, tspan=spans)
    options = {"rtol": 1e-6, "atol": 1e-6}
    batch_size = n // 32
    work = 0.0
    for start in range(0, n, batch_size):  # each batch alone, in this process: the total work
        sub = dxode.EnsembleProblem(
            prob, p=params[start : start + batch_size], tspan=spans[start : start + batch_size]
        )
        t0 = time.perf_counter()
        dxode.solve(sub, dxode.Tsit5(), trajectories=min(batch_size, n - start), **options)
        work += time.perf_counter() - t0
    with dxode.local_cluster(n_workers=2) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        elapsed, _ = best_of(
            lambda: dxode.solve(
                eprob, dxode.Tsit5(), client, trajectories=n, batch_size=batch_size, **options
            ),
            repeat,
        )
    rows = [
        [n, 32, f"{work:.2f}", f"{work / 2:.2f}", f"{elapsed:.2f}", f"{elapsed / (work / 2):.2f}"]
    ]
    return (
        "### Uneven batches (a quarter of the trajectories integrate 10x longer), 2 workers\n\n"
        + table(
            [
                "trajectories",
                "batches",
                "total work (s)",
                "work / 2 workers (s)",
                "wall time (s)",
                "wall / ideal",
            ],
            rows,
        )
    )


_MEMORY_CHILD = r"""
import json, resource, sys, tempfile, numpy as np, distributed, dxode
sys.path.insert(0, {here!r})
from dask_scaling import P0, lorenz, lorenz_ensemble
n, mode = {n}, {mode!r}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def reduction(acc, values, indices):
    return acc + values[:, -1, :].sum(axis=0), False
def combine(a, b):
    return a + b
kwargs = {{}}
if mode == "reduction":
    kwargs = dict(reduction=reduction, combine=combine, u_init=np.zeros(3))
if mode == "memory":
    eprob = lorenz_ensemble(n, t1=1.0)
else:  # parameters drawn on the workers: the driver holds nothing per trajectory
    def batch_func(prob, ctx):
        return {{"p": P0 * (1 + 0.1 * (ctx.uniform(3) - 0.5))}}
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), tuple(P0))
    eprob = dxode.EnsembleProblem(prob, batch_func=batch_func, **kwargs)
opts = dict(saveat=0.1, rtol=1e-6, atol=1e-6, seed=0)
if mode == "memory":
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=n, **opts)
else:
    with dxode.local_cluster(n_workers=2) as cluster, distributed.Client(cluster) as client:
        store = tempfile.mkdtemp() + "/out.zarr"
        alg = dxode.EnsembleDask(client, output="zarr", store=store) if mode == "zarr" else client
        sim = dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=n, **opts)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"n": n, "mode": mode, "peak_mb": peak / 1024, "baseline_mb": before / 1024}}))
"""


def section_memory(sizes: list[int]) -> str:
    """Peak driver memory: in-memory output vs Dask with a reduction or Zarr output.

    The Dask runs draw parameters on the workers (``batch_func``), so the driver holds nothing
    per trajectory; the in-memory run gathers ``(N, 11, 3)`` saved states.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    rows = []
    for mode in ("memory", "reduction", "zarr"):
        for n in sizes:
            if mode == "memory" and n > 1_000_000:
                continue
            code = _MEMORY_CHILD.format(here=here, n=n, mode=mode)
            out = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            output_mb = n * 11 * 3 * 8 / 2**20
            rows.append([mode, f"{n:,}", f"{output_mb:.0f}", f"{result['peak_mb']:.0f}"])
    return "### Peak driver memory (Lorenz, 11 save points, float64)\n\n" + table(
        ["output", "trajectories", "output size (MiB)", "driver peak RSS (MiB)"], rows
    )


def machine() -> str:
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in subprocess.run(
                ["lscpu"], capture_output=True, text=True
            ).stdout.splitlines()
            if line.startswith("Model name")
        )
    except (StopIteration, FileNotFoundError):
        model = platform.processor()
    import dask
    import distributed

    return (
        f"{datetime.date.today()}, {model}, {os.cpu_count()} cores; Python "
        f"{platform.python_version()}, NumPy {np.__version__}, Dask {dask.__version__}, "
        f"distributed {distributed.__version__}, dxode {dxode.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--kernel-scaling", action="store_true")
    parser.add_argument("--overhead", action="store_true")
    parser.add_argument("--uneven", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--memory-sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None, help="write the scaling times to this file")
    args = parser.parse_args()
    record: dict = {"machine": machine()}
    parts = [f"Machine: {record['machine']}"]
    if args.scaling:
        parts.append(section_scaling(args.n, args.repeat, record))
    if args.kernel_scaling:
        parts.append(section_kernel_scaling(args.n, args.repeat, record))
    if args.overhead:
        parts.append(section_overhead(args.n // 4, args.repeat))
    if args.uneven:
        parts.append(section_uneven(args.n // 4, args.repeat))
    if args.memory:
        parts.append(section_memory(args.memory_sizes))
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()
