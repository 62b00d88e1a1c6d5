"""Time a Lorenz ensemble in dxode against SciPy, Diffrax and torchode in one process.

The problem is the one of the asv suite ``benchmarks/ensemble.py`` (imported from there):
Lorenz with ``(sigma, rho, beta) = (10, 28, 8/3)``, trajectory ``i`` with parameters
``p · (1 + 0.1 · (U_i − 0.5))`` (``U_i`` uniform per component, fixed seed), ``u0 = (1, 0, 0)``,
``t in [0, 10]`` saved at ``0, 1, ..., 10``, Tsit5 (RK45 for SciPy), ``rtol = atol = 1e-6``,
float64. For each ensemble size ``N`` it measures

* dxode: ``solve(EnsembleProblem(prob, p=P), Tsit5(), EnsembleArray(), trajectories=N,
  saveat=1.0)``, with the default batch size and with ``batch_size=20000`` (the faster is
  reported);
* ``loop``: one ``scipy.integrate.solve_ivp(method="RK45", t_eval=...)`` per trajectory, timed
  on ``min(N, 300)`` trajectories (its cost is linear in ``N``);
* ``stacked``: ONE ``solve_ivp(RK45)`` on the ``(3N,)`` system, where every trajectory takes
  the shared steps, at ``1e-6`` and at the tolerance whose worst sampled error matches
  dxode's ("matched accuracy");
* ``diffrax``: ``jax.jit(jax.vmap(solve_one))`` around ``diffeqsolve(..., Tsit5(),
  PIDController(rtol=1e-6, atol=1e-6))``, float64, timed after an ahead-of-time compile
  (reported separately);
* ``torchode``: ``AutoDiffAdjoint(Tsit5, IntegralController)`` on a batch of ``N``, float64,
  ``torch.compile``-d when that is faster than eager, else eager.

Accuracy is the worst relative error ``|u(10) − u_ref(10)| / |u_ref(10)|`` over a fixed sample
of 50 trajectories, against SciPy's DOP853 at ``rtol = atol = 1e-12`` per trajectory.

The whole process is pinned to one core (``--cpu``, default 0) and every library is told to
use one thread, so the columns compare single-core work. Timings are the best of
``--repeats`` calls (``--repeats-large`` for ``N > 10000``), with every code warmed up once
beforehand on a small ensemble. ``--heterogeneous`` adds a second comparison: per-lane step
sizes against lock-step on 1,000 trajectories with ``rho`` spread from 0.5 to 42.
``--construction`` adds a third: the 10,000-trajectory dxode ensemble built from arrays
(``p=P``) against the same built DiffEq style (``prob_func`` + ``remake(p=P[i])``), timed
alternately, with the ratio of their best times. Examples::

    python asv_bench/compare_ensemble.py --sizes 100 1000 --peers loop stacked
    python asv_bench/compare_ensemble.py --heterogeneous --out ensemble.md
    python asv_bench/compare_ensemble.py --sizes --heterogeneous   # only the second table
    python asv_bench/compare_ensemble.py --sizes --construction --repeats 7

The peers are benchmark-only extras, never dxode dependencies::

    pip install jax jaxlib diffrax
    pip install torch==2.13.0 && pip install torchode --no-deps && pip install torchtyping \\
        --no-deps && pip install "typeguard>=2.11.1,<3"

A peer that cannot be imported is skipped with the reason printed, never estimated.
"""

from __future__ import annotations

import os

# One thread everywhere; these must be set before NumPy, JAX or torch is imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
).strip()
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
from bench_timing import best_of
from benchmarks.ensemble import (
    SAVE_GRID,
    SEED,
    T_SPAN,
    TOL,
    U0,
    P,
    lorenz,
    parameters,
    run_dxode,
    run_dxode_prob_func,
    run_scipy_stacked,
    stacked_final_states,
)

import dxode

SIZES = (100, 1_000, 10_000, 100_000)
PEERS = ("loop", "stacked", "diffrax", "torchode")
LARGE = 10_000  # sizes above this use --repeats-large
DXODE_BATCH_SIZES = (None, 20_000)  # None: EnsembleArray's default (10,000 on the CPU)
MATCH_STEP = 10**0.25  # tolerance grid of the matched-accuracy search: quarter decades
MAX_STEPS = 100_000
HETERO_N = 1_000
CONSTRUCTION_N = 10_000


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# ---- environment ----------------------------------------------------------------------------


def pin_process(cpu: int) -> str:
    """Pin every thread of this process (and so every thread it starts later) to ``cpu``."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity)"
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), {cpu})
    return f"pinned to CPU {cpu}"


def thread_affinities() -> set[tuple[int, ...]]:
    """The CPU sets of all threads of this process (a check that pinning held)."""
    found = set()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            found.add(tuple(sorted(os.sched_getaffinity(int(tid)))))
    return found


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def git_revision() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "dxode", "backends"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + (" + uncommitted changes in dxode/ or backends/" if dirty else "")


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def header(pinning: str) -> list[str]:
    names = ("numpy", "scipy", "jax", "jaxlib", "diffrax", "torch", "torchode")
    versions = ", ".join(f"{name} {version(name)}" for name in names)
    return [
        f"Date: {datetime.date.today().isoformat()}",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores ({platform.machine()}, "
        f"{platform.system()}); this process {pinning}, one thread per library",
        f"Versions: Python {platform.python_version()}, {versions}, "
        f"dxode {dxode.__version__} at git {git_revision()}",
    ]


# ---- timing and accuracy --------------------------------------------------------------------


class Reference:
    """Tight per-trajectory solutions at ``t = 10`` (DOP853, ``rtol = atol = 1e-12``)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[float, ...], np.ndarray] = {}

    def final(self, params: np.ndarray) -> np.ndarray:
        from scipy.integrate import solve_ivp

        out = []
        for p in params:
            key = tuple(float(v) for v in p)
            if key not in self._cache:
                sol = solve_ivp(
                    lambda t, u, p=key: lorenz(u, p, t),
                    T_SPAN,
                    list(U0),
                    method="DOP853",
                    rtol=1e-12,
                    atol=1e-12,
                )
                self._cache[key] = sol.y[:, -1]
            out.append(self._cache[key])
        return np.asarray(out)


def worst_error(final: np.ndarray, reference: np.ndarray, floor: float = 0.0) -> float:
    """Worst ``|u − u_ref| / max(|u_ref|, floor)`` over the sampled trajectories."""
    diff = np.linalg.norm(np.asarray(final, dtype=np.float64) - reference, axis=1)
    return float(np.max(diff / np.maximum(np.linalg.norm(reference, axis=1), floor)))


def error_sample(n: int, size: int) -> np.ndarray:
    return np.sort(np.random.default_rng(SEED + 1).choice(n, size=min(size, n), replace=False))


# ---- the peers ------------------------------------------------------------------------------


def scipy_loop(params: np.ndarray) -> list[Any]:
    """One ``solve_ivp(RK45)`` per trajectory."""
    from scipy.integrate import solve_ivp

    return [
        solve_ivp(
            lambda t, u, p=tuple(p): lorenz(u, p, t),
            T_SPAN,
            list(U0),
            method="RK45",
            t_eval=SAVE_GRID,
            rtol=TOL,
            atol=TOL,
        )
        for p in params
    ]


class Diffrax:
    """``jax.jit(jax.vmap(solve_one))`` of a Diffrax solver with a PID controller, float64.

    By default the Lorenz ensemble of this script with Tsit5; ``compare_stiff.py`` passes
    Robertson's problem and ``"Kvaerno5"``.
    """

    def __init__(
        self,
        rhs: Callable[..., Any] = lorenz,
        solver: str = "Tsit5",
        y0: Any = U0,
        ts: Any = SAVE_GRID,
        span: tuple[float, float] = T_SPAN,
        rtol: float = TOL,
        atol: float = TOL,
        max_steps: int = MAX_STEPS,
    ) -> None:
        import diffrax
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        self.jax, self.jnp = jax, jnp
        term = diffrax.ODETerm(lambda t, u, p: jnp.stack(rhs(u, p, t)))
        y0 = jnp.asarray(y0, dtype=jnp.float64)
        ts = jnp.asarray(ts, dtype=jnp.float64)
        method = getattr(diffrax, solver)()

        def solve_one(p):
            sol = diffrax.diffeqsolve(
                term,
                method,
                t0=span[0],
                t1=span[1],
                dt0=None,
                y0=y0,
                args=p,
                saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
                max_steps=max_steps,
            )
            return sol.ys, sol.stats["num_steps"], sol.result._value

        self.fn = jax.jit(jax.vmap(solve_one))

    def compile(self, params: np.ndarray) -> tuple[Callable[[], Any], float]:
        """The compiled solve for ``params`` (a thunk) and the compile time in seconds."""
        p = self.jnp.asarray(params, dtype=self.jnp.float64)
        start = time.perf_counter()
        compiled = self.fn.lower(p).compile()
        seconds = time.perf_counter() - start
        return (lambda: self.jax.block_until_ready(compiled(p))), seconds


class Torchode:
    """torchode's Tsit5 with an integral controller on a batch of trajectories."""

    def __init__(self) -> None:
        import torch
        import torchode

        torch.set_num_threads(1)
        self.torch, self.to = torch, torchode

        def f(t, y, p):
            return torch.stack(lorenz(y.T, p.T, t), dim=-1)

        term = torchode.ODETerm(f, with_args=True)
        self.eager = torchode.AutoDiffAdjoint(
            torchode.Tsit5(term=term),
            torchode.IntegralController(atol=TOL, rtol=TOL, term=term),
            max_steps=MAX_STEPS,
        )
        self.compiled = None
        self.compile_error: str | None = None

    def thunk(self, params: np.ndarray, compiled: bool) -> Callable[[], Any]:
        torch = self.torch
        n = params.shape[0]
        y0 = torch.tensor(U0, dtype=torch.float64).repeat(n, 1)
        t_eval = torch.tensor(SAVE_GRID, dtype=torch.float64).repeat(n, 1)
        p = torch.tensor(params, dtype=torch.float64)
        if compiled and self.compiled is None:
            # torch.compile(module) would compile only forward(); the solver loop is solve().
            self.compiled = torch.compile(self.eager.solve)
        solve = self.compiled if compiled else self.eager.solve

        def run():
            with torch.inference_mode():
                return solve(self.to.InitialValueProblem(y0=y0, t_eval=t_eval), args=p)

        return run


# ---- the main table -------------------------------------------------------------------------


def fmt_us(seconds: float | None, n: int) -> str:
    return "—" if seconds is None else f"{seconds / n * 1e6:,.1f}"


def fmt_ratio(theirs: float | None, ours: float) -> str:
    """Peer time over dxode time: above 1 means dxode is faster."""
    if theirs is None:
        return "—"
    ratio = theirs / ours
    return f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.2f}×"


def fmt_err(err: float | None) -> str:
    return "—" if err is None else f"{err:.1e}"


def measure_size(
    n: int, args: argparse.Namespace, ref: Reference, peers: dict[str, Any], cache: dict
) -> dict[str, Any]:
    repeats = args.repeats if n <= LARGE else args.repeats_large
    params = parameters(n)
    sample = error_sample(n, args.error_sample)
    reference = ref.final(params[sample])
    row: dict[str, Any] = {"n": n, "repeats": repeats}

    # dxode: the default batch size and batch_size=20000 (identical when N <= 10000).
    best, seen = None, set()
    for size in DXODE_BATCH_SIZES:
        effective = min(size or dxode.EnsembleArray().default_batch_size, n)
        if effective in seen:  # one batch of all N either way
            continue
        seen.add(effective)
        seconds, sim = best_of(lambda size=size: run_dxode(params, batch_size=size), repeats)
        log(f"  N={n}: dxode batch_size={size or 'default'}: {seconds:.3f} s")
        if best is None or seconds < best[0]:
            best = (seconds, sim, size)
    row["dxode"], sim, size = best
    row["dxode_batch"] = "default" if size is None else f"{size:,}"
    assert sim.success, sim.failures()
    row["dxode_err"] = worst_error(sim.u[sample, -1, :], reference)
    row["dxode_steps"] = sim.stats.total_steps / n

    if "loop" in peers:
        m = min(n, args.loop_max)
        if m not in cache:  # the same first m trajectories for every N >= m
            seconds, sols = best_of(lambda: scipy_loop(params[:m]), repeats)
            cache[m] = (seconds / m, float(np.mean([s.nfev for s in sols])) / 6)
            log(f"  N={n}: SciPy loop over {m}: {seconds:.3f} s")
        per_traj, steps = cache[m]
        row["loop"], row["loop_m"], row["loop_steps"] = per_traj * n, m, steps

    if "stacked" in peers:
        seconds, sol = best_of(lambda: run_scipy_stacked(params), repeats)
        log(f"  N={n}: SciPy stacked: {seconds:.3f} s")
        row["stacked"] = seconds
        row["stacked_err"] = worst_error(stacked_final_states(sol, n)[sample], reference)
        row["stacked_steps"] = sol.nfev / 6
        row["matched"], row["matched_tol"], row["matched_err"] = matched_stacked(
            params, sample, reference, row["dxode_err"], repeats, (seconds, row["stacked_err"])
        )

    if "diffrax" in peers:
        run, compile_s = peers["diffrax"].compile(params)
        seconds, (ys, steps, result) = best_of(run, repeats)
        log(f"  N={n}: Diffrax: compile {compile_s:.1f} s, run {seconds:.3f} s")
        if np.any(np.asarray(result) != 0):
            log(f"  N={n}: Diffrax: {int(np.sum(np.asarray(result) != 0))} trajectories failed")
        row["diffrax"], row["diffrax_compile"] = seconds, compile_s
        row["diffrax_err"] = worst_error(np.asarray(ys)[sample, -1, :], reference)
        row["diffrax_steps"] = float(np.mean(np.asarray(steps)))

    if "torchode" in peers:
        tode = peers["torchode"]
        if args.torch_compile != "auto":
            modes = [args.torch_compile == "yes"]
        elif n > LARGE and "torch_mode" in cache:  # keep the faster mode of the smaller sizes
            modes = [cache["torch_mode"]]
        else:
            modes = [False, True]
        results = {}
        for compiled in modes:
            run = tode.thunk(params, compiled)
            try:
                start = time.perf_counter()
                run()  # warm-up; for torch.compile, the compilation
                warm = time.perf_counter() - start
                seconds, sol = best_of(run, repeats)
            except Exception as exc:  # a compile failure falls back to eager
                tode.compile_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                log(f"  N={n}: torchode compiled failed: {tode.compile_error}")
                continue
            mode = "compiled" if compiled else "eager"
            log(f"  N={n}: torchode {mode}: first call {warm:.2f} s, run {seconds:.3f} s")
            results[compiled] = (seconds, sol, warm)
        if results:
            compiled = min(results, key=lambda k: results[k][0])
            cache["torch_mode"] = compiled
            seconds, sol, warm = results[compiled]
            status = sol.status.numpy()
            if np.any(status != 0):
                log(f"  N={n}: torchode: {int(np.sum(status != 0))} trajectories failed")
            row["torchode"] = seconds
            row["torchode_mode"] = "compiled" if compiled else "eager"
            row["torchode_first"] = warm
            row["torchode_err"] = worst_error(sol.ys[:, -1, :].numpy()[sample], reference)
            row["torchode_steps"] = float(sol.stats["n_steps"].double().mean())
    return row


def matched_stacked(
    params: np.ndarray,
    sample: np.ndarray,
    reference: np.ndarray,
    target: float,
    repeats: int,
    at_tol: tuple[float, float],
) -> tuple[float, float, float]:
    """Time the stacked solve at the loosest tolerance on a quarter-decade grid whose worst
    sampled error is at most ``target`` (dxode's). Returns (seconds, tolerance, error)."""
    n = params.shape[0]

    def trial(tol: float) -> tuple[float, float]:
        seconds, sol = best_of(lambda: run_scipy_stacked(params, tol=tol), 1)
        err = worst_error(stacked_final_states(sol, n)[sample], reference)
        log(f"  N={n}: stacked at tol {tol:.1e}: worst error {err:.1e}, {seconds:.3f} s")
        return seconds, err

    tried = {TOL: at_tol}
    if at_tol[1] <= target:  # already as accurate: loosen while it stays so
        tol = TOL
        for _ in range(8):
            looser = tol * MATCH_STEP
            tried[looser] = trial(looser)
            if tried[looser][1] > target:
                break
            tol = looser
    else:  # tighten until it is as accurate
        tol = TOL
        for _ in range(16):
            tol /= MATCH_STEP
            tried[tol] = trial(tol)
            if tried[tol][1] <= target:
                break
    seconds, err = tried[tol]
    if repeats > 1:
        more, _ = best_of(lambda: run_scipy_stacked(params, tol=tol), repeats - 1)
        seconds = min(seconds, more)
    return seconds, tol, err


def main_table(rows: list[dict[str, Any]], peers: dict[str, Any]) -> list[str]:
    lines = [
        "| N | dxode µs/traj (batch size) | SciPy loop µs/traj | loop / dxode "
        "| stacked µs/traj | stacked / dxode | stacked, matched accuracy µs/traj (tol) "
        "| Diffrax µs/traj | Diffrax / dxode | Diffrax compile s | torchode µs/traj "
        "| torchode / dxode | dxode worst rel. err | stacked worst rel. err |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n, ours = r["n"], r["dxode"]
        matched = (
            f"{fmt_us(r['matched'], n)} (tol {r['matched_tol']:.1e})" if "matched" in r else "—"
        )
        compile_s = f"{r['diffrax_compile']:.1f}" if "diffrax_compile" in r else "—"
        torch_us = fmt_us(r.get("torchode"), n)
        if "torchode" in r:
            torch_us += f" ({r['torchode_mode']})"
        lines.append(
            f"| {n:,} | {fmt_us(ours, n)} ({r['dxode_batch']}) | {fmt_us(r.get('loop'), n)} "
            f"| {fmt_ratio(r.get('loop'), ours)} | {fmt_us(r.get('stacked'), n)} "
            f"| {fmt_ratio(r.get('stacked'), ours)} | {matched} "
            f"| {fmt_us(r.get('diffrax'), n)} | {fmt_ratio(r.get('diffrax'), ours)} "
            f"| {compile_s} | {torch_us} "
            f"| {fmt_ratio(r.get('torchode'), ours)} | {fmt_err(r['dxode_err'])} "
            f"| {fmt_err(r.get('stacked_err'))} |"
        )
    return lines


def work_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| N | code | steps per trajectory | worst rel. err (sample) | note |",
        "|---:|---|---:|---:|---|",
    ]
    for r in rows:
        n = r["n"]
        lines.append(
            f"| {n:,} | dxode Tsit5 | {r['dxode_steps']:.0f} | {fmt_err(r['dxode_err'])} "
            f"| best of {r['repeats']}, batch size {r['dxode_batch']} |"
        )
        if "loop" in r:
            lines.append(
                f"| {n:,} | SciPy RK45 loop | {r['loop_steps']:.0f} | | "
                f"timed on {r['loop_m']} trajectories, scaled to N |"
            )
        if "stacked" in r:
            lines.append(
                f"| {n:,} | SciPy RK45 stacked | {r['stacked_steps']:.0f} "
                f"| {fmt_err(r['stacked_err'])} | shared steps |"
            )
            lines.append(
                f"| {n:,} | SciPy RK45 stacked, matched | | {fmt_err(r['matched_err'])} "
                f"| rtol = atol = {r['matched_tol']:.1e} |"
            )
        if "diffrax" in r:
            lines.append(
                f"| {n:,} | Diffrax Tsit5 | {r['diffrax_steps']:.0f} "
                f"| {fmt_err(r['diffrax_err'])} | compile {r['diffrax_compile']:.1f} s |"
            )
        if "torchode" in r:
            lines.append(
                f"| {n:,} | torchode Tsit5 | {r['torchode_steps']:.0f} "
                f"| {fmt_err(r['torchode_err'])} | {r['torchode_mode']}, first call "
                f"{r['torchode_first']:.1f} s |"
            )
    return lines


# ---- per-lane against lock-step -------------------------------------------------------------


def heterogeneous(args: argparse.Namespace, ref: Reference) -> list[str]:
    """dxode per-lane step sizes against lock-step on an ensemble of quiet and chaotic rho."""
    rho = np.linspace(0.5, 28.0 * 1.5, HETERO_N)
    params = np.stack([np.full_like(rho, P[0]), rho, np.full_like(rho, P[2])], axis=1)
    sample = error_sample(HETERO_N, args.error_sample)
    reference = ref.final(params[sample])
    results = {}
    for lockstep in (False, True):
        seconds, sim = best_of(
            lambda lockstep=lockstep: run_dxode(params, lockstep=lockstep), args.repeats
        )
        assert sim.success, sim.failures()
        err = worst_error(sim.u[sample, -1, :], reference, floor=1.0)
        steps = sim.stats.naccept + sim.stats.nreject
        results[lockstep] = (seconds, sim.stats.total_nf, err, steps)
        log(f"  heterogeneous lockstep={lockstep}: {seconds:.3f} s, nf {sim.stats.total_nf}")
    lanes, lock = results[False], results[True]
    lines = [
        f"Lorenz, sigma = 10, beta = 8/3, rho = linspace(0.5, 42, {HETERO_N}) "
        f"(one value per trajectory), t in [0, 10], saveat = 1.0, Tsit5, rtol = atol = {TOL:g}; "
        f"best of {args.repeats}. Error: worst |u(10) − u_ref| / max(|u_ref|, 1) over "
        f"{len(sample)} sampled trajectories.",
        "",
        "| dxode EnsembleArray | total RHS evals | steps per trajectory (min–max) | time (ms) "
        "| worst error |",
        "|---|---:|---:|---:|---:|",
    ]
    for lockstep, label in ((False, "per-lane steps (default)"), (True, "lockstep=True")):
        seconds, nf, err, steps = results[lockstep]
        lines.append(
            f"| {label} | {nf:,} | {steps.min()}–{steps.max()} | {seconds * 1e3:.1f} | {err:.1e} |"
        )
    lines.append(
        f"| ratio lock-step / per-lane | {lock[1] / lanes[1]:.2f}× | | {lock[0] / lanes[0]:.2f}× "
        f"| {lock[2] / lanes[2]:.2f}× |"
    )
    return lines


# ---- arrays against prob_func + remake ------------------------------------------------------


def construction(args: argparse.Namespace) -> list[str]:
    """The same ensemble from ``p=P`` and from ``prob_func`` + ``remake``, timed alternately
    (so a slow spell of the machine hits both alike); the results must agree bit for bit."""
    params = parameters(CONSTRUCTION_N)
    run_dxode_prob_func(params[:20])  # warm up
    best = {"arrays": float("inf"), "remake": float("inf")}
    sims = {}
    for _ in range(args.repeats):
        for name, run in (("arrays", run_dxode), ("remake", run_dxode_prob_func)):
            seconds, sims[name] = best_of(lambda run=run: run(params), 1)
            best[name] = min(best[name], seconds)
    same = np.array_equal(sims["arrays"].u, sims["remake"].u) and np.array_equal(
        sims["arrays"].stats.nf, sims["remake"].stats.nf
    )
    assert same, "prob_func + remake must give the bits of p=P"
    log(f"  construction: arrays {best['arrays']:.3f} s, remake {best['remake']:.3f} s")
    return [
        f"The {CONSTRUCTION_N:,}-trajectory ensemble above built two ways, timed alternately, "
        f"best of {args.repeats} each (identical results, bit for bit):",
        "",
        "| dxode EnsembleArray, built from | time (ms) | ratio to p=P |",
        "|---|---:|---:|",
        f"| `EnsembleProblem(prob, p=P)` | {best['arrays'] * 1e3:.1f} | 1.00 |",
        f"| `prob_func=lambda prob, i, repeat: prob.remake(p=P[i])` | "
        f"{best['remake'] * 1e3:.1f} | {best['remake'] / best['arrays']:.2f} |",
    ]


# ---- driver ---------------------------------------------------------------------------------


def load_peers(names: list[str], skipped: list[str]) -> dict[str, Any]:
    peers: dict[str, Any] = {}
    for name in names:
        try:
            if name in ("loop", "stacked"):
                import scipy.integrate  # noqa: F401

                peers[name] = True
            elif name == "diffrax":
                peers[name] = Diffrax()
            elif name == "torchode":
                peers[name] = Torchode()
        except ImportError as exc:
            reason = f"{name}: skipped, cannot import ({exc})"
            skipped.append(reason)
            log(reason)
    return peers


def warm_up(peers: dict[str, Any]) -> None:
    """One small solve of every code, so no timing pays for first-call costs."""
    params = parameters(20)
    run_dxode(params)
    run_dxode(params, lockstep=True)
    if "loop" in peers or "stacked" in peers:
        scipy_loop(params[:2])
        run_scipy_stacked(params)
    if "diffrax" in peers:
        peers["diffrax"].compile(params)[0]()
    if "torchode" in peers:
        peers["torchode"].thunk(params, False)()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=list(SIZES), help="ensemble sizes (none: skip)"
    )
    parser.add_argument(
        "--peers", nargs="*", default=list(PEERS), choices=PEERS, help="peers to compare"
    )
    parser.add_argument("--heterogeneous", action="store_true", help="add per-lane vs lock-step")
    parser.add_argument("--construction", action="store_true", help="add p=P vs prob_func + remake")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls (best) for N <= 1e4")
    parser.add_argument("--repeats-large", type=int, default=1, help="timed calls for N > 1e4")
    parser.add_argument("--loop-max", type=int, default=300, help="trajectories the loop times")
    parser.add_argument("--error-sample", type=int, default=50, help="trajectories for errors")
    parser.add_argument(
        "--torch-compile", choices=("auto", "yes", "no"), default="auto", help="torch.compile"
    )
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin the process to")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one core")
    parser.add_argument("--out", help="also write the markdown to this file")
    parser.add_argument("--json", help="also write the rows (for plot_benchmarks.py) to this file")
    args = parser.parse_args(argv)

    pinning = "not pinned" if args.no_pin else pin_process(args.cpu)
    skipped: list[str] = []
    peers = load_peers(args.peers if args.sizes else [], skipped)
    start = time.perf_counter()
    log("warming up")
    warm_up(peers)
    ref = Reference()
    cache: dict[Any, Any] = {}  # measurements shared between sizes (the loop, torch's mode)
    rows: list[dict[str, Any]] = []
    for n in args.sizes:
        log(f"N = {n:,}")
        rows.append(measure_size(n, args, ref, peers, cache))
    hetero = heterogeneous(args, ref) if args.heterogeneous else []
    built = construction(args) if args.construction else []

    md = [*header(pinning), ""]
    if rows:
        md += [
            f"Lorenz ensemble, t in [0, 10], saveat = 1.0 (11 points), Tsit5 (SciPy: RK45), "
            f"rtol = atol = {TOL:g}, float64, one core. Times are per trajectory: best of "
            f"{args.repeats} calls for N ≤ {LARGE:,}, of {args.repeats_large} above. The SciPy "
            f"loop is timed on min(N, {args.loop_max}) trajectories and is linear in N. "
            f"Errors: worst |u(10) − u_ref(10)| / |u_ref(10)| over min(N, {args.error_sample}) "
            f"sampled trajectories, u_ref from DOP853 at rtol = atol = 1e-12.",
            "",
            *main_table(rows, peers),
            "",
            *work_table(rows),
            "",
        ]
        tode = peers.get("torchode")
        if tode is not None and tode.compile_error:
            md += [f"torch.compile of torchode failed: {tode.compile_error}", ""]
    md += [f"Skipped: {reason}" for reason in skipped]
    if hetero:
        md += ["", *hetero]
    if built:
        md += ["", *built]
    affinities = thread_affinities()
    md += ["", f"Total run time {time.perf_counter() - start:.0f} s; thread CPU sets {affinities}."]
    text = "\n".join(md).strip() + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"header": header(pinning), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
