"""Lorenz ensemble: EnsembleKernel (CPU) against its peers, in one process.

The issue-17 benchmark: N trajectories, t in [0, 10], saveat every 1.0, rtol = atol = 1e-6,
float64, per-trajectory p; compile times reported apart. Rows (best of ``--repeats``):

* ``EnsembleKernel`` on one thread (the process pinned to one core), and on two threads
  (pinned to two cores) for the thread scaling;
* a hand-written numba scalar Tsit5 (what a numba user writes: one trajectory at a time, a PI
  controller, the free interpolant for the save points, stage arrays of length 3);
* SciPy's stacked trick: ONE ``solve_ivp(RK45)`` on the ``(3N,)`` system (shared steps), at
  the same tolerances and again at matched accuracy: the loosest tolerance on a quarter-decade
  grid whose worst error is no worse than the kernel's (the shared steps are chosen from the
  RMS error over all ``3N`` components, so at equal tolerances the stacked solve is far less
  accurate per trajectory). Errors: the worst ``|u(10) - u_ref(10)| / |u_ref(10)|`` over 50
  sampled trajectories, against SciPy's DOP853 at ``rtol = atol = 1e-12``
  (``compare_ensemble.py``'s measure);
* ``EnsembleArray`` (dxode's array path, one run; ``--no-array`` skips it);
* Diffrax ``jit(vmap(diffeqsolve))`` with Tsit5 and the same PI controller (float64, XLA on one
  thread), when ``jax`` and ``diffrax`` import (else the row says so).

GFLOP/s counts the method's arithmetic per step attempt (stage sums, ``f``, error norm; see
``flops_per_attempt``) over the attempts each code took, against the core's peak
(``--peak-flops-per-cycle``, default 16: two 256-bit FMA and two 256-bit add pipes of an AMD
Zen 4 core, times the clock in ``/proc/cpuinfo``).

    NUMBA_NUM_THREADS=2 python asv_bench/kernel_lorenz.py 10000 100000

Diffrax is a benchmark-only peer: ``pip install jax jaxlib diffrax`` in a separate environment
that also has dxode's dependencies, and run the script with that interpreter.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# One thread for BLAS (SciPy's RK45 and the array path call it: pinned to one core, a second
# BLAS thread only competes) and for XLA (the Diffrax row); read when the libraries load.
os.environ["OPENBLAS_NUM_THREADS"] = os.environ.get("OPENBLAS_NUM_THREADS", "1")
os.environ["MKL_NUM_THREADS"] = os.environ.get("MKL_NUM_THREADS", "1")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)

import numba
import numpy as np
from bench_timing import best_of
from benchmarks.ensemble import run_scipy_stacked, stacked_final_states
from compare_ensemble import Reference, error_sample, matched_stacked, worst_error

import dxode
from dxode.solvers.tsit5 import Tsit5

TAB = Tsit5.tableau
A, B, C, E, PI = (
    TAB.a.copy(),
    TAB.b.copy(),
    TAB.c.copy(),
    TAB.b_error.copy(),
    TAB.interpolant.copy(),
)


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


@numba.njit(inline="always")
def _f(u, p, out):
    out[0] = p[0] * (u[1] - u[0])
    out[1] = u[0] * (p[1] - u[2]) - u[1]
    out[2] = u[0] * u[1] - p[2] * u[2]


@numba.njit
def hand_tsit5(u0, p, t1, saveat, rtol, atol, out):
    """One trajectory; returns its step attempts."""
    n = 3
    k = np.empty((7, n))
    u = u0.copy()
    y = np.empty(n)
    t = 0.0
    h = 1e-3
    prev = 1.0
    _f(u, p, k[0])
    out[0] = u
    isave = 1
    nsave = out.shape[0]
    attempts = 0
    while t < t1:
        attempts += 1
        if t + h > t1:
            h = t1 - t
        for i in range(1, 7):
            for m in range(n):
                acc = 0.0
                for j in range(i):
                    acc += A[i, j] * k[j, m]
                y[m] = u[m] + h * acc
            _f(y, p, k[i])
        err = 0.0
        for m in range(n):
            e = 0.0
            for j in range(7):
                e += E[j] * k[j, m]
            sc = atol + rtol * max(abs(u[m]), abs(y[m]))
            err += (h * e / sc) ** 2
        err = np.sqrt(err / n)
        ee = max(err, 1e-10)
        factor = min(max(0.9 * ee**-0.14 * prev**0.08, 0.2), 10.0)
        if err <= 1.0:
            while isave < nsave and saveat * isave <= t + h:
                theta = (saveat * isave - t) / h
                for m in range(n):
                    acc = 0.0
                    for i in range(7):
                        w = 0.0
                        for d in range(PI.shape[1] - 1, -1, -1):
                            w = (w + PI[i, d]) * theta
                        acc += w * k[i, m]
                    out[isave, m] = u[m] + h * acc
                isave += 1
            t += h
            u[:] = y
            k[0] = k[6]
            prev = ee
        else:
            factor = min(factor, 0.9)
        h *= factor
    return attempts


@numba.njit
def hand_ensemble(u0, ps, t1, saveat, rtol, atol, out):
    attempts = 0
    for i in range(ps.shape[0]):
        attempts += hand_tsit5(u0, ps[i], t1, saveat, rtol, atol, out[i])
    return attempts


F_FLOPS = 8  # lorenz: 3 subtractions, 5 multiplications


def flops_per_attempt(n: int = 3, f_flops: int = F_FLOPS) -> int:
    """Floating-point operations of one Tsit5 attempt (FSAL: six ``f`` calls).

    Stage ``i`` (1..6): ``u + h * sum_j a_ij k_j`` is ``2 i + 1`` per component; the error
    estimate ``h * sum_j e_j k_j`` is 14 per component, its scaling (max, multiply, add,
    divide) 4, and the RMS norm ``2 n + 1``. Step-size control and saving are not counted.
    """
    stages = sum(n * (2 * i + 1) for i in range(1, 7))
    error = n * 14 + n * 4 + 2 * n + 1
    return stages + 6 * f_flops + error


def peak_gflops(flops_per_cycle: float) -> tuple[float, str]:
    """The core's peak (GFLOP/s) from the clock in ``/proc/cpuinfo``, and the CPU's name."""
    model, mhz = "unknown CPU", 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("cpu MHz") and not mhz:
                mhz = float(line.split(":", 1)[1])
    except OSError:
        pass
    return flops_per_cycle * mhz / 1000.0, f"{model} at {mhz:.0f} MHz"


# The cores this process may use when it starts (``pin`` narrows the affinity, so it must not
# read the narrowed set back: pinning to two cores after one kept the one).
_ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def pin(cpus: int) -> None:
    """Run this process (all its threads) on the first ``cpus`` cores it started with."""
    if _ALLOWED:
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), set(_ALLOWED[:cpus]))


def diffrax_solver(u0: np.ndarray):
    """``jit(vmap(solve_one))`` with Diffrax's Tsit5 and dxode's PI controller (``beta1 = 0.7,
    beta2 = -0.4``: ``pcoeff = 0.4, icoeff = 0.3``), or the reason it cannot run."""
    try:
        import diffrax
        import jax
        import jax.numpy as jnp
    except ImportError as err:
        return None, f"not run: {err} (install jax, jaxlib and diffrax)"
    jax.config.update("jax_enable_x64", True)
    term = diffrax.ODETerm(lambda t, u, p: jnp.stack(lorenz(u, p, t)))
    ts = jnp.linspace(0.0, 10.0, 11)
    controller = diffrax.PIDController(rtol=1e-6, atol=1e-6, pcoeff=0.4, icoeff=0.3)

    def solve_one(p):
        sol = diffrax.diffeqsolve(
            term, diffrax.Tsit5(), 0.0, 10.0, None, jnp.asarray(u0), args=p,
            saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller, max_steps=4096,
        )  # fmt: skip
        return sol.ys, sol.stats["num_steps"], sol.stats["num_rejected_steps"]

    fn = jax.jit(jax.vmap(solve_one))

    def compiled(ps: np.ndarray):
        p = jnp.asarray(ps)
        start = time.perf_counter()
        run = fn.lower(p).compile()
        return (lambda: jax.block_until_ready(run(p))), time.perf_counter() - start

    return compiled, f"jax {jax.__version__}, diffrax {diffrax.__version__}"


def kernel_row(
    eprob, ps: np.ndarray, threads: int, repeats: int, hand_out: np.ndarray
) -> tuple[tuple, np.ndarray]:
    """The ``EnsembleKernel`` row on ``threads`` threads (the process pinned to as many cores),
    and the final states ``(N, 3)``."""
    pin(threads)
    opts = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}
    alg = dxode.EnsembleKernel(threads=threads)
    start = time.perf_counter()
    dxode.solve(dxode.EnsembleProblem(eprob.prob, p=ps[:64]), "tsit5", alg, **opts)
    first = time.perf_counter() - start
    seconds, sim = best_of(lambda: dxode.solve(eprob, "tsit5", alg, **opts), repeats)
    attempts = int(np.sum(sim.stats.naccept) + np.sum(sim.stats.nreject))
    diff = np.max(np.abs(sim.u - hand_out))
    note = f"first call {first:.2f} s; largest difference from hand-written {diff:.1e}"
    pin(1)
    row = f"EnsembleKernel, {threads} thread{'s' * (threads > 1)}", seconds, attempts, note
    return row, sim.u[:, -1, :]


def run_size(n: int, repeats: int, with_array: bool, diffrax_compile) -> list[tuple]:
    """Rows ``(name, seconds, attempts, note)`` for ``n`` trajectories (two threads last, so
    that no idle worker thread shares the core of a one-thread row)."""
    rng = np.random.default_rng(0)
    ps = np.column_stack([np.full(n, 10.0), rng.uniform(20, 30, n), np.full(n, 8 / 3)])
    u0 = np.array([1.0, 0.0, 0.0])
    pin(1)
    out = np.empty((n, 11, 3))
    start = time.perf_counter()
    hand_ensemble(u0, ps[:2], 10.0, 1.0, 1e-6, 1e-6, out[:2])
    hand_compile = time.perf_counter() - start
    hand, attempts = best_of(lambda: hand_ensemble(u0, ps, 10.0, 1.0, 1e-6, 1e-6, out), repeats)
    rows = [("hand-written numba Tsit5", hand, attempts, f"compile {hand_compile:.2f} s")]
    prob = dxode.ODEProblem(lorenz, u0, (0.0, 10.0), (10.0, 28.0, 8 / 3))
    eprob = dxode.EnsembleProblem(prob, p=ps)
    row, final = kernel_row(eprob, ps, 1, repeats, out)
    sample = error_sample(n, 50)
    reference = Reference().final(ps[sample])
    kernel_err = worst_error(final[sample], reference)
    rows.append((*row[:3], f"{row[3]}; worst error {kernel_err:.1e}"))
    stacked, sol = best_of(lambda: run_scipy_stacked(ps), repeats)  # u0 = (1, 0, 0) there too
    stacked_err = worst_error(stacked_final_states(sol, n)[sample], reference)
    note = f"shared steps; worst error {stacked_err:.1e}"
    rows.append(("SciPy stacked solve_ivp(RK45)", stacked, sol.nfev // 6 * n, note))
    seconds, tol, err = matched_stacked(
        ps, sample, reference, kernel_err, repeats, (stacked, stacked_err)
    )
    matched_attempts = run_scipy_stacked(ps, tol=tol).nfev // 6 * n
    note = f"rtol = atol = {tol:.1e}; worst error {err:.1e}"
    rows.append(("SciPy stacked, matched accuracy", seconds, matched_attempts, note))
    if with_array:
        opts = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}
        array, sim = best_of(lambda: dxode.solve(eprob, "tsit5", dxode.EnsembleArray(), **opts), 1)
        attempts = int(np.sum(sim.stats.naccept) + np.sum(sim.stats.nreject))
        rows.append(("EnsembleArray", array, attempts, "one run"))
    if diffrax_compile is not None:
        run, compile_s = diffrax_compile(ps)
        seconds, (_, steps, _) = best_of(run, repeats)
        rows.append(
            ("Diffrax jit(vmap)", seconds, int(np.sum(steps)), f"compile {compile_s:.1f} s")
        )
    rows.append(kernel_row(eprob, ps, 2, repeats, out)[0])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[10_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-array", action="store_true", help="skip EnsembleArray")
    parser.add_argument("--no-diffrax", action="store_true", help="skip Diffrax")
    parser.add_argument("--peak-flops-per-cycle", type=float, default=16.0)
    args = parser.parse_args()
    peak, cpu = peak_gflops(args.peak_flops_per_cycle)
    diffrax_compile, diffrax_note = (
        (None, "skipped") if args.no_diffrax else diffrax_solver(np.array([1.0, 0.0, 0.0]))
    )
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu}; numba {numba.__version__}"
    )
    print(f"# peak {peak:.1f} GFLOP/s per core ({args.peak_flops_per_cycle:g} flop/cycle); "
          f"{flops_per_attempt()} flop per attempt; Diffrax: {diffrax_note}")  # fmt: skip
    print("| N | code | time (s) | µs / trajectory | attempts / trajectory | GFLOP/s (% of peak) "
          "| code / 1-thread kernel | notes |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for n in args.sizes:
        rows = run_size(n, args.repeats, not args.no_array, diffrax_compile)
        kernel = next(seconds for name, seconds, _, _ in rows if name.endswith("1 thread"))
        for name, seconds, attempts, note in rows:
            gflops = attempts * flops_per_attempt() / seconds / 1e9
            share = f" ({100 * gflops / peak:.1f} %)" if peak else ""
            cells = [f"{n:,}", name, f"{seconds:.4f}", f"{seconds / n * 1e6:.2f}"]
            cells += [
                f"{attempts / n:.0f}",
                f"{gflops:.2f}{share}",
                f"{seconds / kernel:.2f}",
                note,
            ]
            print("| " + " | ".join(cells) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
