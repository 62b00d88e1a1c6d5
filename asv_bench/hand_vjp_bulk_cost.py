"""Would a bulk linearization pay for a hand-written VJP? Per stage, by working-set size.

The discrete adjoint's per-step sweep calls the user's ``vjp`` once per stage and step over the
working set's lanes. A bulk linearization (as ``dxode.sensitivity.bulk_linearization`` does for
an autograd-traced ``f``) would instead build the state Jacobian at every recorded stage input
from ``n`` calls of the ``vjp`` with basis cotangents over a chunk of columns, and then take
each stage's ``Jᵀ k̄`` as a product with it (its parameter cotangents need one more VJP over the
chunk, not timed here). This script times, for the Lorenz VJP of ``gradient_cost.py`` and
``L`` lanes (process CPU time, best of 5):

* per step: one ``vjp`` call through dxode's wrapper (``TracedRHS.vjp_for``);
* bulk: one ``Jᵀ k̄`` product ``(3, 3, L)`` plus the Jacobian's share for ``L`` columns, built
  in chunks of 6,000 and of 60,000 columns::

    python asv_bench/hand_vjp_bulk_cost.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import time
from collections.abc import Callable

import numpy as np
from gradient_cost import lorenz, lorenz_vjp

from dxode._traced_rhs import TracedRHS

RNG = np.random.default_rng(0)


def best(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    """Seconds per call of ``fn``, best of ``repeat`` rounds of ``number`` calls."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            fn()
        times.append(time.process_time() - start)
    return min(times) / number


def jacobian_per_column(columns: int) -> float:
    """Seconds per column of the 3 basis-cotangent VJPs over ``columns`` columns."""
    u, p, t = RNG.random((3, columns)), RNG.random((3, columns)), np.zeros(columns)
    basis = [np.zeros((3, columns)) for _ in range(3)]
    for r in range(3):
        basis[r][r] = 1.0

    def jacobian() -> None:
        for v in basis:
            lorenz_vjp(u, p, t, v)

    return best(jacobian, 5) / columns


def stage_costs(lanes: int, per_column: dict[int, float]) -> list[float]:
    """Seconds per stage over ``lanes`` lanes: the per-step VJP, ``Jᵀ k̄``, and the bulk
    total (``Jᵀ k̄`` plus the Jacobian's share) for each chunk size of ``per_column``."""
    u, p, t = RNG.random((3, lanes)), RNG.random((3, lanes)), np.zeros(lanes)
    v, out = RNG.random((3, lanes)), np.empty((3, lanes))
    vjp = TracedRHS(lorenz, 0.0, [True], [True], False, vjp=lorenz_vjp).vjp_for([p])
    per_step = best(lambda: vjp(u, t, v, out=out), 2_000)
    jac, product = RNG.random((3, 3, lanes)), np.empty((3, lanes))
    jtk = best(lambda: np.add.reduce(jac * v[:, None, :], axis=0, out=product), 2_000)
    return [per_step, jtk, *(jtk + cost * lanes for cost in per_column.values())]


def main() -> None:
    print("| lanes | per-step VJP | bulk: Jᵀ k̄ | + Jacobian, chunks of 6,000 | of 60,000 |")
    print("|---:|---:|---:|---:|---:|")
    per_column = {k: jacobian_per_column(k) for k in (6_000, 60_000)}
    for lanes in (10, 100, 300, 1_000):
        costs = " | ".join(f"{c * 1e6:.1f} µs" for c in stage_costs(lanes, per_column))
        print(f"| {lanes:,} | {costs} |")


if __name__ == "__main__":
    main()
