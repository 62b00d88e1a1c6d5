"""Bouncing balls with per-trajectory restitution: callbacks on the kernel path vs the array path.

10^4 trajectories (by default), t in [0, 3], a ContinuousCallback that reverses and damps the
velocity at the floor (4 to 6 impacts per ball), saveat every 0.5, rtol = 1e-8, atol = 1e-10,
float64, one thread. Reports EnsembleKernel with the callback (compile apart), the same kernel
without it (what the events cost), and EnsembleArray with the callback; checks that the two
paths find the same events.

    NUMBA_NUM_THREADS=1 python asv_bench/kernel_events.py [trajectories]
"""

from __future__ import annotations

import sys
import time

import numpy as np

import dxode

GRAVITY = 9.81


def fall(u, p, t):
    return [u[1], -GRAVITY + 0.0 * u[0]]


def height(u, p, t):
    return u[0]


def bounce(u, p, t, fired):
    return [u[0], -p[0] * u[1]]


def _timed(run, repeats=3):
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(trajectories: int) -> None:
    prob = dxode.ODEProblem(fall, np.array([1.0, 0.0]), (0.0, 3.0), (0.8,))
    eprob = dxode.EnsembleProblem(prob, p=np.linspace(0.8, 0.9, trajectories)[:, None])
    floor = dxode.ContinuousCallback(height, bounce, direction="down")
    opts = {"saveat": 0.5, "rtol": 1e-8, "atol": 1e-10}

    def solve(alg, callback=floor, n=trajectories):
        return dxode.solve(eprob, "tsit5", alg, trajectories=n, callback=callback, **opts)

    kernel = dxode.EnsembleKernel(threads=1)
    start = time.perf_counter()
    solve(kernel, callback=None, n=2)  # first: numba's start-up is charged to this one
    compile_plain_s = time.perf_counter() - start
    start = time.perf_counter()
    solve(kernel, n=2)
    compile_s = time.perf_counter() - start
    t_kernel, sim_kernel = _timed(lambda: solve(kernel))
    t_plain, _ = _timed(lambda: solve(kernel, callback=None))
    t_array, sim_array = _timed(lambda: solve(dxode.EnsembleArray()), repeats=1)
    same = np.array_equal(sim_kernel.events.callback, sim_array.events.callback) and np.allclose(
        sim_kernel.events.t, sim_array.events.t, rtol=0, atol=1e-10
    )
    print(f"trajectories: {trajectories}, events: {len(sim_kernel.events)}, same events: {same}")
    print(f"compile: with callback {compile_s:.1f} s, without {compile_plain_s:.1f} s")
    print(f"EnsembleKernel, callback:    {t_kernel * 1e3:8.1f} ms")
    print(f"EnsembleKernel, no callback: {t_plain * 1e3:8.1f} ms")
    print(f"EnsembleArray, callback:     {t_array * 1e3:8.1f} ms")
    print(f"array / kernel: {t_array / t_kernel:.1f}x")
    print("(without the callback a free fall is a parabola: a few steps per ball, no events)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
