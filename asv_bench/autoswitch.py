"""A mixed-stiffness Van der Pol sweep: AutoSwitch against all-Tsit5 and all-Rodas5P.

The problem (issue 19): ``x' = y``, ``y' = mu (1 - x^2) y - x`` with ``u0 = (2, 0)`` over
``t in [0, 50]``, trajectory ``i`` with ``mu_i = 1000^U_i`` (``U_i`` uniform from a fixed seed,
so ``mu`` is log-uniform in ``[1, 1000]``), ``rtol = 1e-6``, ``atol = 1e-8``, float64, saved at
``t = 25, 50``, no Jacobian given (Rodas5P takes its default, ``autodiff="auto"``). Lanes with
``mu`` above about 20 are stiff on their slow branches; the mildest ones are not stiff at all.
Every code runs in the array path, ``EnsembleArray()`` with the default batch size, and in
the compiled kernels, ``EnsembleKernel()`` on the CPU (one thread, finite-difference
Jacobians; ``--path`` picks either or both):

- ``AutoSwitch()`` (Tsit5 and Rodas5P, each lane switching on its own);
- ``Tsit5()`` on every lane (``maxiters = 10^6``: stiff lanes need tens of thousands of steps);
- ``Rodas5P()`` on every lane.

Timings are the best of ``--repeats`` calls (one call for all-Tsit5, which takes the longest),
after one small warm-up solve of each (which compiles the kernels), in one process pinned to
one core with one thread; ratios compare each path's AutoSwitch with the faster of its
all-Tsit5 and all-Rodas5P.
Accuracy: the worst relative error of the state (2-norm) at ``t = 50`` over ``--error-sample``
trajectories against SciPy's Radau at ``rtol = 1e-10``, ``atol = 1e-11`` with the analytic
Jacobian. Usage:
``python asv_bench/autoswitch.py [--n 1000] [--repeats 3] [--path both] [--out table.md]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import compare_ensemble as common  # sets the one-thread environment before NumPy loads
import numpy as np

import dxode

T_SPAN = (0.0, 50.0)
U0 = (2.0, 0.0)
SAVEAT = [25.0, 50.0]
RTOL, ATOL = 1e-6, 1e-8
SEED = 20261123


def vdp(u: Any, p: Any, t: Any) -> list[Any]:
    """Van der Pol for a state ``(2,)`` or lanes ``(2, L)`` and stiffness ``mu``."""
    x, y = u
    return [y, p * (1 - x * x) * y - x]


def mus(n: int) -> np.ndarray:
    """``mu`` log-uniform in ``[1, 1000]``, the same first values for every ``n``."""
    return 1000.0 ** np.random.default_rng(SEED).uniform(0.0, 1.0, n)


def ensemble_algorithm(path: str) -> Any:
    """``EnsembleArray()``, or ``EnsembleKernel()`` on one CPU thread."""
    return dxode.EnsembleArray() if path == "array" else dxode.EnsembleKernel(threads=1)


def solve(alg: Any, mu: np.ndarray, path: str = "array") -> dxode.EnsembleSolution:
    prob = dxode.ODEProblem(vdp, np.array(U0), T_SPAN, 1.0)
    eprob = dxode.EnsembleProblem(prob, p=mu)
    return dxode.solve(
        eprob,
        alg,
        ensemble_algorithm(path),
        trajectories=len(mu),
        saveat=SAVEAT,
        rtol=RTOL,
        atol=ATOL,
        maxiters=10**6,
    )


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """The best wall time and the best CPU time of this process over ``repeats`` calls, and
    the last call's result (the CPU time is the steadier one on a shared machine)."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu, result


def radau(mu: float) -> np.ndarray:
    """The tight reference state at ``t = 50``."""
    from scipy.integrate import solve_ivp

    def jac(t: float, u: np.ndarray) -> list[list[float]]:
        return [[0.0, 1.0], [-2.0 * mu * u[0] * u[1] - 1.0, mu * (1.0 - u[0] ** 2)]]

    sol = solve_ivp(
        lambda t, u: vdp(u, mu, t), T_SPAN, list(U0), "Radau", rtol=1e-10, atol=1e-11, jac=jac
    )
    return sol.y[:, -1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--error-sample", type=int, default=20)
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--path", choices=("array", "kernel", "both"), default="both")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    pinning = common.pin_process(args.cpu)
    mu = mus(args.n)
    paths = ("array", "kernel") if args.path == "both" else (args.path,)
    codes = {"AutoSwitch": dxode.AutoSwitch(), "Tsit5": dxode.Tsit5(), "Rodas5P": dxode.Rodas5P()}
    for path in paths:
        for alg in codes.values():
            # warm-up; the kernels' compilation (more lanes than a block: the threaded driver)
            solve(alg, mus(4 if path == "array" else 40), path)
    sample = common.error_sample(args.n, args.error_sample)
    reference = np.array([radau(float(m)) for m in mu[sample]])
    rows = []
    for path in paths:
        rows += _timed_rows(path, codes, mu, sample, reference, args)
    lines = [
        *common.header(pinning),
        "",
        f"{args.n} Van der Pol lanes, mu log-uniform in [1, 1000], t in [0, 50], rtol {RTOL}, "
        f"atol {ATOL}, no Jacobian; best of {args.repeats} (all-Tsit5: 1 call).",
        "",
        "| path | method | wall (s) | CPU (s) | wall (CPU) vs faster of all-Tsit5 / all-Rodas5P "
        "| Success | steps (accepted + rejected) | lanes that switched | most switches in a "
        f"lane | worst rel. error at t = 50 ({len(sample)} lanes vs Radau 1e-10) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


def _timed_rows(
    path: str,
    codes: dict[str, Any],
    mu: np.ndarray,
    sample: np.ndarray,
    reference: np.ndarray,
    args: argparse.Namespace,
) -> list[str]:
    """One path's table rows: every method timed, its ratio to the faster single method."""
    label = "EnsembleArray" if path == "array" else "EnsembleKernel (CPU)"
    rows, times, cpu = [], {}, {}
    for name, alg in codes.items():
        common.log(f"timing {name} on the {path} path ...")
        repeats = 1 if name == "Tsit5" else args.repeats
        times[name], cpu[name], sim = best_of(lambda alg=alg: solve(alg, mu, path), repeats)
        stats = sim.stats
        success = int(np.sum(sim.retcodes == int(dxode.ReturnCode.Success)))
        nswitch = np.zeros(args.n, dtype=np.int64) if stats.nswitch is None else stats.nswitch
        err = common.worst_error(sim.u[sample, -1, :], reference)
        rows.append(
            f"| {label} | {name} | {times[name]:.3f} | {cpu[name]:.3f} | {{ratio_{name}}} | "
            f"{success}/{args.n} | "
            f"{stats.total_steps:,} | {int(np.sum(nswitch > 0))} | {int(nswitch.max())} | "
            f"{err:.1e} |"
        )
    best_wall = min(times["Tsit5"], times["Rodas5P"])
    best_cpu = min(cpu["Tsit5"], cpu["Rodas5P"])
    ratios = {
        f"ratio_{k}": f"{times[k] / best_wall:.2f}× ({cpu[k] / best_cpu:.2f}×)" for k in times
    }
    return [row.format(**ratios) for row in rows]


if __name__ == "__main__":
    sys.exit(main())
