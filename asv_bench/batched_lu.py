"""Batched per-lane linear solves: dxode's lanes-last elimination against NumPy's LAPACK.

A Rosenbrock step factors one ``(n, n)`` matrix per lane and solves with it several times
(Rodas5P: 8 solves). This script times, per system size ``n`` and lane count ``L``:

* ``generic``: ``backends._lu`` (Gaussian elimination with partial pivoting, lanes last,
  ``O(n)`` vectorized array operations), factor once then solve;
* ``lapack-solve``: ``np.linalg.solve`` on ``(L, n, n)``, refactoring for every solve;
* ``lapack-inv``: ``np.linalg.inv`` once, then a batched matrix-vector product per solve;
* ``lapack-lu``: the NumPy backend's choice for large systems (see ``backends/_numpy.py``).

Run: ``python asv_bench/batched_lu.py [--solves 8] [--repeat 3]``; prints milliseconds per
(factor + solves) and the maximum error against the LAPACK solution.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dxode.backends import _lu
from dxode.backends._numpy import NumpyBackend


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solves", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="3,8,20,50")
    parser.add_argument("--lanes", default="1,1000,100000")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    backend = NumpyBackend()
    print(f"ms per factorization + {args.solves} solves (best of {args.repeat})")
    print(
        f"{'n':>3} {'L':>7} {'generic':>10} {'lapack-solve':>13} {'lapack-inv':>11} "
        f"{'backend':>9} {'max err':>9}"
    )
    for n in map(int, args.sizes.split(",")):
        for lanes in map(int, args.lanes.split(",")):
            if n * n * lanes > 5e7:
                continue
            a = rng.normal(size=(n, n, lanes)) + n * np.eye(n)[..., None]
            b = rng.normal(size=(n, lanes))
            a_first = np.ascontiguousarray(np.moveaxis(a, -1, 0))

            def generic(a=a, b=b):
                f = _lu.lu_factor(np, a)
                for _ in range(args.solves):
                    x = _lu.lu_solve(np, f, b)
                return x

            def lapack_solve(a_first=a_first, b=b):
                for _ in range(args.solves):
                    x = np.linalg.solve(a_first, np.moveaxis(b, -1, 0)[..., None])[..., 0].T
                return x

            def lapack_inv(a_first=a_first, b=b):
                inv = np.linalg.inv(a_first)
                for _ in range(args.solves):
                    x = np.matmul(inv, np.moveaxis(b, -1, 0)[..., None])[..., 0].T
                return x

            def chosen(a=a, b=b):
                f = backend.lu_factor(a)
                for _ in range(args.solves):
                    x = backend.lu_solve(f, b)
                return x

            ref = lapack_solve()
            err = max(np.abs(fn() - ref).max() for fn in (generic, lapack_inv, chosen))
            times = [_best(fn, args.repeat) for fn in (generic, lapack_solve, lapack_inv, chosen)]
            print(
                f"{n:>3} {lanes:>7} {times[0]:>10.3f} {times[1]:>13.3f} {times[2]:>11.3f} "
                f"{times[3]:>9.3f} {err:>9.1e}"
            )


if __name__ == "__main__":
    main()
