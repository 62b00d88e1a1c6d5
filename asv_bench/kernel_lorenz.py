"""Lorenz ensemble: EnsembleKernel (CPU) vs a hand-written scalar numba Tsit5 vs EnsembleArray.

The issue-17 benchmark: 10^4 trajectories, t in [0, 10], saveat every 1.0, rtol = atol = 1e-6,
float64, per-trajectory p; one thread (``NUMBA_NUM_THREADS=1``); compile times reported apart.

    NUMBA_NUM_THREADS=1 python asv_bench/kernel_lorenz.py [trajectories]

The hand-written peer is what a numba user writes: one trajectory at a time, Tsit5 with a PI
controller and the free interpolant for the save points, stage arrays of length 3.
"""

from __future__ import annotations

import sys
import time

import numba
import numpy as np

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
    while t < t1:
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
    return t


@numba.njit
def hand_ensemble(u0, ps, t1, saveat, rtol, atol, out):
    for i in range(ps.shape[0]):
        hand_tsit5(u0, ps[i], t1, saveat, rtol, atol, out[i])


def main(n: int) -> None:
    rng = np.random.default_rng(0)
    ps = np.column_stack([np.full(n, 10.0), rng.uniform(20, 30, n), np.full(n, 8 / 3)])
    u0 = np.array([1.0, 0.0, 0.0])
    out = np.empty((n, 11, 3))
    start = time.perf_counter()
    hand_ensemble(u0, ps[:2], 10.0, 1.0, 1e-6, 1e-6, out[:2])
    print(f"hand numba compile: {time.perf_counter() - start:.2f} s")
    best = min(_timed(lambda: hand_ensemble(u0, ps, 10.0, 1.0, 1e-6, 1e-6, out)) for _ in range(3))
    print(f"hand numba scalar Tsit5: {best:.3f} s ({best / n * 1e6:.1f} us/trajectory)")

    prob = dxode.ODEProblem(lorenz, u0, (0.0, 10.0), (10.0, 28.0, 8 / 3))
    eprob = dxode.EnsembleProblem(prob, p=ps)
    opts = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}
    alg = dxode.EnsembleKernel()
    start = time.perf_counter()
    dxode.solve(dxode.EnsembleProblem(prob, p=ps[:2]), "tsit5", alg, **opts)
    print(f"kernel first call (compile or cache load): {time.perf_counter() - start:.2f} s")
    kernel = min(_timed(lambda: dxode.solve(eprob, "tsit5", alg, **opts)) for _ in range(3))
    print(f"EnsembleKernel cpu: {kernel:.3f} s ({kernel / n * 1e6:.1f} us/trajectory)")
    sim = dxode.solve(eprob, "tsit5", alg, **opts)
    print(
        f"  max |kernel - hand| at the save points: {np.max(np.abs(np.asarray(sim.u) - out)):.2e}"
    )
    array = _timed(lambda: dxode.solve(eprob, "tsit5", dxode.EnsembleArray(), **opts))
    print(f"EnsembleArray: {array:.3f} s ({array / n * 1e6:.1f} us/trajectory)")
    print(f"hand / kernel = {best / kernel:.2f}; array / kernel = {array / kernel:.2f}")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
