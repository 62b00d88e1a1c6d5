"""A stiff Robertson ensemble: dxode's Rosenbrock/SDIRK methods against SciPy and Diffrax.

All in one process and one run, pinned to one core with one thread per library. The problem
(``benchmarks/stiff.py``): Robertson with ``k1 = 0.04, k2 = 3e7, k3 = 1e4``, ``k1`` scaled per
trajectory by ``1 + 0.1 (U − 0.5)``, ``u0 = (1, 0, 0)``, ``t in [0, 1e5]`` saved at 10 log-spaced
times (1e-4 … 1e5), ``rtol = 1e-6``, ``atol = 1e-10``, float64. The codes:

- dxode ``Rodas5P``, ``Rodas4``, ``Rosenbrock23``, ``TRBDF2`` (those this dxode has) with
  ``EnsembleArray`` and the analytic Jacobian;
- a loop of SciPy ``solve_ivp(method="BDF")`` and of ``method="Radau"``, one trajectory at a time,
  with the analytic Jacobian, timed on ``--loop-max`` trajectories and scaled to N;
- Diffrax ``Kvaerno5`` with a PID controller under ``jax.jit(jax.vmap(...))``, x64, timed in
  steady state after an ahead-of-time compile (compile time reported separately).

Accuracy: over the first ``--error-sample`` trajectories and all 10 save times, the worst
relative error of the state (2-norm) and of ``y2`` alone (the small, stiff component), against
SciPy Radau at
``rtol = 1e-12``, ``atol = 1e-20`` with the analytic Jacobian. A peer that cannot be imported is
skipped with the reason printed.

Usage: ``python asv_bench/compare_stiff.py [--n 1000] [--repeats 3] [--out table.md]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import compare_ensemble as common  # sets the one-thread environment before NumPy loads
import numpy as np
from bench_timing import best_of
from benchmarks.stiff import (
    ATOL,
    RTOL,
    SAVE_TIMES,
    T_SPAN,
    U0,
    available_methods,
    parameters,
    robertson,
    robertson_jac,
    run_dxode,
)

MAX_STEPS = 1_000_000


def scipy_solve(params: np.ndarray, method: str, rtol: float = RTOL, atol: float = ATOL):
    """One ``solve_ivp`` per trajectory; returns ``(states (m, 10, 3), mean RHS evals)``."""
    from scipy.integrate import solve_ivp

    out, nfev = [], []
    for p in params:
        k = tuple(float(v) for v in p)
        sol = solve_ivp(
            lambda t, u, k=k: robertson(u, k, t),
            T_SPAN,
            list(U0),
            method=method,
            t_eval=SAVE_TIMES,
            rtol=rtol,
            atol=atol,
            jac=lambda t, u, k=k: robertson_jac(u, k, t),
        )
        assert sol.success, sol.message
        out.append(sol.y.T)
        nfev.append(sol.nfev)
    return np.asarray(out), float(np.mean(nfev))


def worst_errors(u: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Worst relative state error (2-norm) and worst relative ``y2`` error over all saves."""
    state = np.linalg.norm(u - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    y2 = np.abs(u[..., 1] - ref[..., 1]) / np.abs(ref[..., 1])
    return float(np.max(state)), float(np.max(y2))


def kvaerno5() -> common.Diffrax:
    """Diffrax's Kvaerno5 on the Robertson ensemble, under ``jax.jit(jax.vmap(...))``."""
    return common.Diffrax(
        robertson, "Kvaerno5", U0, SAVE_TIMES, T_SPAN, RTOL, ATOL, max_steps=MAX_STEPS
    )


def measure(args: argparse.Namespace, skipped: list[str]) -> list[dict[str, Any]]:
    n = args.n
    params = parameters(n)
    sample = np.arange(min(n, args.error_sample))  # trajectories 0..k-1: the loops solve them too
    common.log("reference (SciPy Radau, rtol 1e-12, atol 1e-20)")
    ref, _ = scipy_solve(params[sample], "Radau", rtol=1e-12, atol=1e-20)
    rows: list[dict[str, Any]] = []

    for method in available_methods():
        run_dxode(params[:8], method)  # warm-up
        seconds, sim = best_of(lambda m=method: run_dxode(params, m), args.repeats)
        assert sim.success, sim.failures()
        state, y2 = worst_errors(np.asarray(sim.u)[sample], ref)
        steps = sim.stats.total_steps / n
        row = {"code": f"dxode {method}", "seconds": seconds, "state": state, "y2": y2}
        rows.append({**row, "steps": steps})
        common.log(f"  dxode {method}: {seconds:.3f} s, {steps:.0f} steps per trajectory")

    m = min(n, args.loop_max)
    for method in ("BDF", "Radau"):
        scipy_solve(params[:2], method)  # warm-up
        seconds, (u, nfev) = best_of(lambda me=method: scipy_solve(params[:m], me), 1)
        k = min(m, sample.size)
        state, y2 = worst_errors(u[:k], ref[:k])
        rows.append(
            {"code": f"SciPy {method} loop", "seconds": seconds * n / m, "state": state, "y2": y2,
                 "note": f"timed on {m} trajectories, scaled to N; {nfev:.0f} RHS evals each"}
        )  # fmt: skip
        common.log(f"  SciPy {method} loop over {m}: {seconds:.3f} s")

    try:
        kv = kvaerno5()
    except ImportError as exc:
        skipped.append(f"Diffrax Kvaerno5: cannot import ({exc})")
        common.log(skipped[-1])
    else:
        run, compile_s = kv.compile(params)
        seconds, (ys, steps, result) = best_of(run, args.repeats)
        failed = int(np.sum(np.asarray(result) != 0))
        state, y2 = worst_errors(np.asarray(ys)[sample], ref)
        rows.append(
            {"code": "Diffrax Kvaerno5 jit(vmap)", "seconds": seconds, "state": state, "y2": y2,
                 "steps": float(np.mean(np.asarray(steps))),
                 "note": f"compile {compile_s:.1f} s; {failed} trajectories failed"}
        )  # fmt: skip
        common.log(f"  Diffrax: compile {compile_s:.1f} s, run {seconds:.3f} s")
    return rows


def table(rows: list[dict[str, Any]], n: int) -> list[str]:
    ours = min((r["seconds"] for r in rows if r["code"].startswith("dxode")), default=None)
    lines = [
        "| code | time (s) | µs per trajectory | time / fastest dxode | steps per trajectory "
        "| worst rel. err (state) | worst rel. err (y2) | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = "—" if ours is None else f"{r['seconds'] / ours:,.2f}×"
        steps = f"{r['steps']:.0f}" if "steps" in r else ""
        lines.append(
            f"| {r['code']} | {r['seconds']:.3f} | {r['seconds'] / n * 1e6:,.0f} | {ratio} "
            f"| {steps} | {r['state']:.1e} | {r['y2']:.1e} | {r.get('note', '')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="trajectories")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls (best)")
    parser.add_argument("--loop-max", type=int, default=100, help="trajectories the loops time")
    parser.add_argument("--error-sample", type=int, default=50, help="trajectories for errors")
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin the process to")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one core")
    parser.add_argument("--out", help="also write the markdown to this file")
    args = parser.parse_args(argv)

    pinning = "not pinned" if args.no_pin else common.pin_process(args.cpu)
    start = time.perf_counter()
    skipped: list[str] = []
    rows = measure(args, skipped)
    md = [
        *common.header(pinning),
        "",
        f"Robertson ensemble, N = {args.n:,}, k1 scaled per trajectory, t in [0, 1e5], "
        f"10 log-spaced saves, rtol = {RTOL:g}, atol = {ATOL:g}, float64, one core; best of "
        f"{args.repeats} (loops: one pass). Ratios: time over the fastest dxode method's.",
        "",
        *table(rows, args.n),
        "",
        *[f"Skipped: {reason}" for reason in skipped],
        f"Total run time {time.perf_counter() - start:.0f} s; thread CPU sets "
        f"{common.thread_affinities()}.",
    ]
    text = "\n".join(md).strip() + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
