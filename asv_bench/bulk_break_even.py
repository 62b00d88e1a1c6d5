"""Where the bulk linearization stops paying: ``bulk_linearization.CALL_ELEMENTS``.

For an autograd-traced ``f`` the discrete adjoint's backward sweep either traces ``f`` once
per stage and step (the per-step sweep: autograd's fixed cost per traced operation, every
time) or linearizes it in bulk over the whole record (extra arithmetic per column, no
per-call cost). ``bulk_linearization.pays`` chooses by ``extra_per_call``: the bulk sweep's
extra elements per traced operation saved, against ``CALL_ELEMENTS``. This script times the
gradient both ways (the choice forced, thread CPU time, best of ``--rounds`` interleaved
rounds of two runs each) and prints
``extra_per_call`` beside the time ratio, for three systems over batch sizes:

* ``lorenz``: 3 states, 3 shared parameters, t in [0, 1];
* ``tanh8``: ``u' = tanh(W u + b) - u / 2``, 8 states, 72 shared parameters, t in [0, 2];
* ``mlp``: ``u' = W2 tanh(W1 u + b1) - u / 10``, 2-32-2, 160 shared parameters, t in [0, 2].

The break-even is where ``bulk / per-step`` crosses 1::

    python asv_bench/bulk_break_even.py [--systems lorenz,tanh8,mlp] [--lanes 1,30,300,3000]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import autograd
import autograd.numpy as anp
import numpy as np

import dxode
from dxode.sensitivity import bulk_linearization

RNG = np.random.default_rng(0)
HIDDEN = 32
W8 = RNG.normal(size=(8, 8)) / 3
W1, W2 = RNG.normal(size=(HIDDEN, 2)) / 2, RNG.normal(size=(2, HIDDEN)) / math.sqrt(HIDDEN)


def lorenz(u, p, t):
    x, y, z = u
    s, r, b = p
    return [s * (y - x), x * (r - z) - y, x * y - b * z]


def tanh8(u, p, t):
    return anp.tanh(anp.dot(p[0], u) + p[1][:, None]) - 0.5 * u


def mlp(u, p, t):
    return anp.dot(p[2], anp.tanh(anp.dot(p[0], u) + p[1][:, None])) - 0.1 * u


# name: (f, u0, t1, theta, p from theta)
SYSTEMS: dict[str, tuple[Callable[..., Any], np.ndarray, float, np.ndarray, Callable]] = {
    "lorenz": (
        lorenz,
        np.array([1.0, 0.0, 0.0]),
        1.0,
        np.array([10.0, 28.0, 8 / 3]),
        lambda th: th,
    ),
    "tanh8": (
        tanh8,
        np.linspace(-1.0, 1.0, 8),
        2.0,
        np.concatenate([W8.ravel(), np.zeros(8)]),
        lambda th: (th[:64].reshape(8, 8), th[64:]),
    ),
    "mlp": (
        mlp,
        np.array([1.0, 0.5]),
        2.0,
        np.concatenate([W1.ravel(), np.zeros(HIDDEN), W2.ravel()]),
        lambda th: (
            th[: 2 * HIDDEN].reshape(HIDDEN, 2),
            th[2 * HIDDEN : 3 * HIDDEN],
            th[3 * HIDDEN :].reshape(2, HIDDEN),
        ),
    ),
}


class Forced:
    """``bulk_linearization.pays`` replaced: the sweep chosen by ``bulk``, and the real
    ``extra_per_call`` kept."""

    def __init__(self) -> None:
        self.bulk = True
        self.extra: float | None = None

    def __call__(self, sweep: Any) -> bool:
        self.extra = bulk_linearization.extra_per_call(sweep)
        return self.bulk


def loss_for(name: str, lanes: int) -> tuple[Callable[[np.ndarray], Any], np.ndarray]:
    f, u0, t1, theta, params = SYSTEMS[name]
    starts = u0[None] * (1 + 0.01 * np.arange(lanes))[:, None]

    def loss(th: np.ndarray) -> Any:
        prob = dxode.ODEProblem(f, u0, (0.0, t1), params(th))
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, u0=starts),
            "tsit5",
            trajectories=lanes,
            saveat=[t1],
            rtol=1e-6,
            atol=1e-6,
        )
        return anp.sum(sim.u**2)

    return loss, theta


def cpu_time(fn: Callable[[], Any], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def measure(name: str, lanes: int, forced: Forced, rounds: int) -> str:
    loss, theta = loss_for(name, lanes)
    grad = autograd.grad(loss)
    times = {True: math.inf, False: math.inf}
    gradients = {}
    for bulk in (True, False) * rounds:
        forced.bulk = bulk
        gradients[bulk] = grad(theta)  # and a warm-up
        times[bulk] = min(times[bulk], cpu_time(lambda: grad(theta), 2))
    differ = np.max(np.abs(gradients[True] - gradients[False])) / np.max(np.abs(gradients[False]))
    extra = forced.extra or math.nan
    chosen = "bulk" if extra <= bulk_linearization.CALL_ELEMENTS else "per-step"
    return (
        f"{name:7s} {lanes:6d} lanes  extra/call {extra:9.0f}  bulk {times[True]:.3f} s  "
        f"per-step {times[False]:.3f} s  bulk/per-step {times[True] / times[False]:.2f}  "
        f"chosen: {chosen}  (gradients differ by {differ:.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", default="lorenz,tanh8,mlp")
    parser.add_argument("--lanes", default="1,30,300,3000")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of 2 runs")
    args = parser.parse_args()
    forced = Forced()
    bulk_linearization.pays = forced  # the backward sweep reads it from the module
    print(f"CALL_ELEMENTS = {bulk_linearization.CALL_ELEMENTS}")
    for name in args.systems.split(","):
        for lanes in (int(x) for x in args.lanes.split(",")):
            print(measure(name, lanes, forced, args.rounds), flush=True)


if __name__ == "__main__":
    main()
