"""Stiff problems through the compiled kernels: Rosenbrock kernels vs SciPy and the array path.

Two comparisons, every code in the same process and run (one thread: run with
``NUMBA_NUM_THREADS=1``; pin with ``taskset -c 1`` where the machine allows):

1. **Van der Pol, mu = 1000** (``u0 = (2, 0)``, ``t in [0, 3000]``, ``rtol = 1e-6``,
   ``atol = 1e-8``, float64, the analytic Jacobian everywhere, 31 save points): dxode
   ``solve(prob, Rodas5P(), kernel=True)`` (and Rodas4, Rosenbrock23, TRBDF2), against SciPy
   ``solve_ivp`` with ``LSODA`` and ``Radau``. Accuracy: the worst relative error (2-norm)
   over the save points, and at ``t = 3000``, against SciPy Radau at ``rtol = 1e-12``,
   ``atol = 1e-14``.
2. **Robertson, N trajectories** (``benchmarks/stiff.py``'s problem: per-trajectory ``k1``,
   ``t in [0, 1e5]``, 10 log-spaced saves, ``rtol = 1e-6``, ``atol = 1e-10``, analytic
   Jacobian): ``EnsembleKernel()`` against ``EnsembleArray()``, Rodas5P, and their largest
   difference; and Diffrax ``Kvaerno5`` (PID controller, same tolerances, x64) under
   ``jax.jit(jax.vmap(...))``, timed in steady state after an ahead-of-time compile, its saves
   compared with the kernel's (skipped, with the reason, where JAX or Diffrax is missing).

Compile times are reported apart; times are the best of ``--repeats``.

    NUMBA_NUM_THREADS=1 python asv_bench/kernel_stiff.py [--n 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
from bench_timing import best_of
from benchmarks.stiff import ATOL, RTOL, SAVE_TIMES, T_SPAN, U0, parameters

import dxode

MU = 1000.0
VDP_SPAN = (0.0, 3000.0)
VDP_SAVES = np.linspace(*VDP_SPAN, 31)
VDP_RTOL, VDP_ATOL = 1e-6, 1e-8


def vdp(u, p, t):
    """Van der Pol, ``x'' = mu (1 - x^2) x' - x`` as a first-order system."""
    mu = p[0]
    return [u[1], mu * (1.0 - u[0] * u[0]) * u[1] - u[0]]


def vdp_jac(u, p, t):
    mu = p[0]
    return [[0.0, 1.0], [-2.0 * mu * u[0] * u[1] - 1.0, mu * (1.0 - u[0] * u[0])]]


def robertson(u, p, t):
    k1, k2, k3 = p
    return [
        -k1 * u[0] + k3 * u[1] * u[2],
        k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] * u[1],
        k2 * u[1] * u[1],
    ]


def robertson_jac(u, p, t):
    k1, k2, k3 = p
    return [
        [-k1, k3 * u[2], k3 * u[1]],
        [k1, -k3 * u[2] - 2.0 * k2 * u[1], -k3 * u[1]],
        [0.0, 2.0 * k2 * u[1], 0.0],
    ]


def scipy_vdp(method: str, rtol: float, atol: float) -> tuple[np.ndarray, int]:
    """``(states (31, 2), RHS evaluations)`` from ``solve_ivp``."""
    from scipy.integrate import solve_ivp

    sol = solve_ivp(
        lambda t, u: vdp(u, (MU,), t),
        VDP_SPAN,
        [2.0, 0.0],
        method=method,
        t_eval=VDP_SAVES,
        rtol=rtol,
        atol=atol,
        jac=lambda t, u: np.array(vdp_jac(u, (MU,), t)),
    )
    assert sol.success, sol.message
    return sol.y.T, int(sol.nfev)


def errors(u: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Worst relative 2-norm error over the save points, and at the last one."""
    rel = np.linalg.norm(u - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return float(rel.max()), float(rel[-1])


def van_der_pol(repeats: int) -> None:
    print("## Van der Pol, mu = 1000, t in [0, 3000], rtol 1e-6, atol 1e-8, analytic Jacobian\n")
    ref, _ = scipy_vdp("Radau", 1e-12, 1e-14)
    prob = dxode.ODEProblem(vdp, np.array([2.0, 0.0]), VDP_SPAN, (MU,), jac=vdp_jac)
    rows = []
    opts = {"rtol": VDP_RTOL, "atol": VDP_ATOL, "saveat": VDP_SAVES}
    for method in ("Rodas5P", "Rodas4", "Rosenbrock23", "TRBDF2"):
        alg = getattr(dxode, method)()
        start = time.perf_counter()
        dxode.solve(prob, alg, kernel=True, **opts)
        first = time.perf_counter() - start
        seconds, sol = best_of(lambda alg=alg: dxode.solve(prob, alg, kernel=True, **opts), repeats)
        worst, last = errors(np.asarray(sol.u), ref)
        rows.append((f"dxode {method}, kernel", seconds, sol.stats.naccept, sol.stats.nf))
        rows[-1] += (worst, last, f"first call {first:.1f} s")
    seconds, sol = best_of(lambda: dxode.solve(prob, dxode.Rodas5P(), **opts), 1)
    worst, last = errors(np.asarray(sol.u), ref)
    rows.append(("dxode Rodas5P, array path", seconds, sol.stats.naccept, sol.stats.nf))
    rows[-1] += (worst, last, "one run")
    for method in ("LSODA", "Radau"):
        seconds, (u, nfev) = best_of(lambda m=method: scipy_vdp(m, VDP_RTOL, VDP_ATOL), repeats)
        worst, last = errors(u, ref)
        rows.append((f"SciPy {method}", seconds, None, nfev, worst, last, ""))
    kernel = rows[0][1]
    print("| code | time (s) | vs Rodas5P kernel | steps | nf | worst rel. error | at t=3000 | |")
    print("|---|---|---|---|---|---|---|---|")
    for name, seconds, steps, nf, worst, last, note in rows:
        steps_text = "" if steps is None else str(steps)
        print(
            f"| {name} | {seconds:.4f} | {seconds / kernel:.1f}× | {steps_text} | {nf} | "
            f"{worst:.1e} | {last:.1e} | {note} |"
        )
    print()


def robertson_ensemble(n: int, repeats: int) -> None:
    print(f"## Robertson, {n} trajectories, Rodas5P, rtol 1e-6, atol 1e-10, analytic Jacobian\n")
    prob = dxode.ODEProblem(robertson, np.array(U0), T_SPAN, (0.04, 3e7, 1e4), jac=robertson_jac)
    eprob = dxode.EnsembleProblem(prob, p=parameters(n))
    opts = {"saveat": SAVE_TIMES, "rtol": RTOL, "atol": ATOL}

    def kernel() -> Any:
        return dxode.solve(eprob, dxode.Rodas5P(), dxode.EnsembleKernel(), **opts)

    def array() -> Any:
        return dxode.solve(eprob, dxode.Rodas5P(), dxode.EnsembleArray(), **opts)

    start = time.perf_counter()
    kernel()
    first = time.perf_counter() - start
    t_kernel, k = best_of(kernel, repeats)
    t_array, a = best_of(array, max(1, repeats - 2))
    uk, ua = np.asarray(k.u), np.asarray(a.u)
    diff = float(np.max(np.abs(uk - ua) / (np.abs(ua) + ATOL)))
    steps_k = np.array([s.stats.naccept for s in k])
    steps_a = np.array([s.stats.naccept for s in a])
    print("| code | time (s) | per trajectory (ms) | time / kernel | steps per trajectory |")
    print("|---|---|---|---|---|")
    print(
        f"| EnsembleKernel (CPU) | {t_kernel:.3f} | {t_kernel / n * 1e3:.3f} | 1.0× | "
        f"{steps_k.mean():.1f} |"
    )
    print(
        f"| EnsembleArray | {t_array:.3f} | {t_array / n * 1e3:.3f} | "
        f"{t_array / t_kernel:.1f}× | {steps_a.mean():.1f} |"
    )
    peer = diffrax_kvaerno5(n, repeats, uk)
    if peer is not None:
        seconds, steps, note = peer
        print(
            f"| Diffrax Kvaerno5 jit(vmap) | {seconds:.3f} | {seconds / n * 1e3:.3f} | "
            f"{seconds / t_kernel:.1f}× | {steps:.1f} |"
        )
    print(
        f"\nkernel first call (compile) {first:.1f} s; steps per trajectory kernel "
        f"{steps_k.mean():.1f}, array {steps_a.mean():.1f} (largest difference "
        f"{int(np.abs(steps_k - steps_a).max())}); largest relative difference of the saves "
        f"kernel vs array {diff:.1e}"
    )
    if peer is not None:
        print(note)


def diffrax_kvaerno5(n: int, repeats: int, u_kernel: np.ndarray) -> tuple[float, float, str] | None:
    """Diffrax's Kvaerno5 on the same ensemble: ``(best time, mean steps, a note comparing
    its saves with the kernel's)``, or ``None`` (the reason printed) without JAX/Diffrax."""
    import compare_ensemble as common  # its one-thread XLA flags, set before JAX loads

    try:
        peer = common.Diffrax(
            robertson, "Kvaerno5", U0, SAVE_TIMES, T_SPAN, RTOL, ATOL, max_steps=1_000_000
        )
    except ImportError as exc:
        print(f"| Diffrax Kvaerno5 jit(vmap) | skipped: cannot import ({exc}) | | | |")
        return None
    run, compile_s = peer.compile(parameters(n))
    seconds, (ys, steps, result) = best_of(run, max(1, repeats - 2))
    ys = np.asarray(ys)
    failed = int(np.sum(np.asarray(result) != 0))
    rel = np.linalg.norm(ys - u_kernel, axis=-1) / np.linalg.norm(u_kernel, axis=-1)
    y2 = np.abs(ys[..., 1] - u_kernel[..., 1]) / np.abs(u_kernel[..., 1])
    note = (
        f"Diffrax: compile {compile_s:.1f} s, {failed} trajectories failed; its saves against "
        f"the kernel's: largest relative difference {rel.max():.1e} (state, 2-norm), "
        f"{y2.max():.1e} (y2)"
    )
    return seconds, float(np.mean(np.asarray(steps))), note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="Robertson trajectories")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    van_der_pol(args.repeats)
    robertson_ensemble(args.n, args.repeats)


if __name__ == "__main__":
    main()
