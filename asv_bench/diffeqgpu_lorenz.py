"""DiffEqGPU's Lorenz benchmark on this machine: dxode against Diffrax in one process.

The problem of DiffEqGPU's paper and benchmark repository: Lorenz with ``sigma = 10``,
``beta = 8/3`` and ``rho = linspace(0, 21, N)`` across the trajectories, ``u0 = (1, 0, 0)``,
``t in [0, 1]``, float32, Tsit5 with a fixed step ``dt = 0.001`` (1,000 steps) and adaptive
with ``rtol = atol = 1e-8``, only the final state kept. That ``rtol`` is below float32's machine
epsilon, which dxode refuses (an error estimate in float32 cannot resolve it), so the adaptive
rows run both codes at ``rtol`` = float32's epsilon and ``atol = 1e-8``. DiffEqGPU measured
it on GPUs; without one here this compares the two array-program codes on one CPU core (the GPU rows
of the benchmarks page come from a GPU run when one is available).

    python asv_bench/diffeqgpu_lorenz.py [--sizes 100 1000 10000 100000] [--no-diffrax]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
).strip()
os.environ["OMP_NUM_THREADS"] = "1"

import argparse
import datetime
import platform
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_timing import best_of
from diffeqgpu_problem import (
    ADAPTIVE_RTOL,
    ADAPTIVE_TOL,
    DTYPE,
    FIXED_DT,
    diffrax_solver,
    lorenz,
    parameters,
)

import dxode


def dxode_solver(n: int, adaptive: bool) -> Callable[[], Any]:
    prob = dxode.ODEProblem(
        lorenz, np.array([1.0, 0.0, 0.0], dtype=DTYPE), (0.0, 1.0), (10.0, 28.0, 8 / 3)
    )
    eprob = dxode.EnsembleProblem(prob, p=parameters(n))
    options = (
        {"rtol": ADAPTIVE_RTOL, "atol": ADAPTIVE_TOL}
        if adaptive
        else {"dt": FIXED_DT, "adaptive": False}
    )
    return lambda: (
        dxode.solve(eprob, dxode.Tsit5(), trajectories=n, batch_size=n, saveat=[1.0], **options).u
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-diffrax", action="store_true")
    args = parser.parse_args()
    print(
        f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, NumPy {np.__version__}, dxode {dxode.__version__}"
    )
    print(
        "| N | mode | dxode (s) | Diffrax (s) | Diffrax compile (s) | Diffrax / dxode | "
        "max difference |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for adaptive in (False, True):
            mode = (
                f"adaptive {ADAPTIVE_RTOL:.3g}/{ADAPTIVE_TOL:g}"
                if adaptive
                else f"fixed dt {FIXED_DT:g}"
            )
            ours, u = best_of(dxode_solver(n, adaptive), args.repeats, warm_up=True)
            theirs = compile_s = diff = None
            if not args.no_diffrax:
                run, compile_s = diffrax_solver(n, adaptive)
                theirs, ys = best_of(run, args.repeats, warm_up=True)
                diff = float(np.max(np.abs(np.asarray(ys)[:, -1, :] - u[:, -1, :])))
            cells = [f"{n:,}", mode, f"{ours:.3f}"]
            if theirs is None:
                cells += ["-", "-", "-", "-"]
            else:
                cells += [
                    f"{theirs:.3f}",
                    f"{compile_s:.1f}",
                    f"{theirs / ours:.2f}",
                    f"{diff:.1e}",
                ]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
