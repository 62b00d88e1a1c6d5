"""Time one Lorenz solve in dxode (Tsit5) and SciPy (RK45) in one process; print a table.

The same solves as the asv suite ``benchmarks/single_solve.py`` (which this script imports):
``t in [0, 100]``, ``rtol = atol = 1e-6``, every step saved with dense output, or a
``saveat=1.0`` grid without it. Each timing is the best of ``--repeats`` runs after one
warm-up run. With numba installed it adds the compiled path (``kernel=True``, the same
Tsit5 without dense output; its first call, the compile or the disk-cache load, is reported
apart) and its speed-up over SciPy for the whole solve. Run from the repository root or
from ``asv_bench/``::

    python asv_bench/compare_single.py [--repeats 7] [--no-kernel]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import scipy
from benchmarks.single_solve import (
    OUTPUTS,
    P,
    best_time,
    dxode_steps,
    lorenz,
    run_dxode,
    run_dxode_kernel,
    run_scipy,
    scipy_steps,
)

import dxode

LABELS = {
    "every_step": "every step + dense output",
    "saveat_1": "saveat=1.0 grid, no dense output",
}
KERNEL_LABELS = {"every_step": "every step, no dense output", "saveat_1": LABELS["saveat_1"]}


def rhs_floor(repeats: int) -> float:
    """Seconds for six calls of the Lorenz RHS on a 3-vector (the Python cost of one step)."""
    u = np.array([1.0, 2.0, 3.0])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(1000):
            for _ in range(6):
                np.asarray(lorenz(u, P, 0.0))
        best = min(best, (time.perf_counter() - start) / 1000)
    return best


def kernel_row(output: str, repeats: int, t_scipy: float) -> str:
    """The table row of the compiled solve, its first call timed apart."""
    start = time.perf_counter()
    sol = run_dxode_kernel(output)
    first = time.perf_counter() - start
    t_kernel = best_time(run_dxode_kernel, output, repeats)
    steps = dxode_steps(sol)
    return (
        f"| {KERNEL_LABELS[output]} | dxode Tsit5 `kernel=True` (first call {first:.2f} s) "
        f"| {steps} | {sol.stats.nf} | {t_kernel * 1e3:.2f} | {t_kernel / steps * 1e6:.3f} "
        f"| SciPy / kernel, whole solve: **{t_scipy / t_kernel:.0f}×** |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per solve (best)")
    parser.add_argument("--no-kernel", action="store_true", help="skip kernel=True (numba)")
    args = parser.parse_args(argv)

    print(
        f"dxode {dxode.__version__}, NumPy {np.__version__}, SciPy {scipy.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs ({platform.machine()})"
    )
    print("Lorenz, t in [0, 100], rtol = atol = 1e-6; best of", args.repeats, "runs\n")
    print(
        "| output | code | steps | RHS evals | best time (ms) | time per step (µs) "
        "| per-step ratio dxode / SciPy |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for output in OUTPUTS:
        ours, theirs = run_dxode(output), run_scipy(output)  # warm-up, and the counts
        t_ours = best_time(run_dxode, output, args.repeats)
        t_theirs = best_time(run_scipy, output, args.repeats)
        s_ours, s_theirs = dxode_steps(ours), scipy_steps(theirs)
        ratio = (t_ours / s_ours) / (t_theirs / s_theirs)
        label = LABELS[output]
        print(
            f"| {label} | dxode Tsit5 | {s_ours} | {ours.stats.nf} | {t_ours * 1e3:.1f} "
            f"| {t_ours / s_ours * 1e6:.1f} | **{ratio:.2f}** |"
        )
        print(
            f"| {label} | SciPy RK45 | {s_theirs:.0f} | {theirs.nfev} | {t_theirs * 1e3:.1f} "
            f"| {t_theirs / s_theirs * 1e6:.1f} | |"
        )
        if not args.no_kernel:
            print(kernel_row(output, args.repeats, t_theirs))
    print(f"\nSix calls of the Lorenz RHS alone: {rhs_floor(args.repeats) * 1e6:.1f} µs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
