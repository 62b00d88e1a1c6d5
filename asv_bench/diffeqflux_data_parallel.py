"""DiffEqFlux's data-parallel training tutorial, reproduced with dxode three ways.

``du/dt = 1.01 u p``, theta = [u0; p] = [3.0, 1.0], 100 trajectories with
``u0_i = 0.5 + i/100 * theta[0]`` (i = 1..100), t in [0, 1], saveat 0.1, loss
``sum((1 - sim)^2)``, Adam with step 0.1 for 100 iterations — with EnsembleSerial,
EnsembleArray, EnsembleKernel (compiled forward sensitivities, numba) and EnsembleDask (a
local cluster of 2 worker processes, 2 batches of 50), printing the final theta and loss of
each and how far their loss histories are apart.

    python asv_bench/diffeqflux_data_parallel.py [--iterations 100] [--algorithms array kernel]
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import date

import autograd
import autograd.numpy as anp
import numpy as np
from autograd.misc.optimizers import adam

import dxode

TRAJECTORIES = 100
BATCH_SIZE = 50


def f(u, p, t):
    return 1.01 * u * p[0]


class ShiftedStart:
    """``prob_func``: trajectory i (0-based) starts at 0.5 + (i + 1)/100 * theta[0]."""

    def __init__(self, theta):
        self.theta = theta

    def __call__(self, prob, i, repeat):
        return prob.remake(u0=[0.5 + (i + 1) / 100 * self.theta[0]])


def make_loss(ensemble_alg):
    def loss(theta, iteration=0):
        prob = dxode.ODEProblem(f, [theta[0]], (0.0, 1.0), [theta[1]])
        eprob = dxode.EnsembleProblem(prob, prob_func=ShiftedStart(theta))
        sim = dxode.solve(
            eprob,
            dxode.Tsit5(),
            ensemble_alg,
            trajectories=TRAJECTORIES,
            batch_size=BATCH_SIZE,
            saveat=0.1,
        )
        return anp.sum((1.0 - sim.u) ** 2)

    return loss


def train(ensemble_alg, iterations):
    """Adam from theta = [3, 1]; returns (theta, loss history, seconds)."""
    history = []
    value_and_grad = autograd.value_and_grad(make_loss(ensemble_alg))

    def gradient(theta, i):
        value, g = value_and_grad(theta, i)
        history.append(float(value))
        return g

    start = time.perf_counter()
    theta = adam(gradient, np.array([3.0, 1.0]), step_size=0.1, num_iters=iterations)
    seconds = time.perf_counter() - start
    history.append(float(make_loss(ensemble_alg)(theta)))
    return theta, np.array(history), seconds


def main() -> None:
    import distributed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument(
        "--algorithms",
        nargs="+",
        choices=["serial", "array", "kernel", "dask"],
        default=["serial", "array", "kernel", "dask"],
        help="which to train (the reference, EnsembleArray, always runs)",
    )
    args = parser.parse_args()
    print(
        f"{date.today()}, {platform.processor() or platform.machine()}, dxode {dxode.__version__}"
    )
    runs = {
        "serial": ("EnsembleSerial", dxode.EnsembleSerial),
        "array": ("EnsembleArray", dxode.EnsembleArray),
        "kernel": ("EnsembleKernel (compiled forward sensitivities)", dxode.EnsembleKernel),
    }
    results = {}
    for key in sorted(set(args.algorithms) - {"dask"} | {"array"}, key=list(runs).index):
        name, make = runs[key]
        if key == "kernel":  # compile (or load the cached kernel) outside the timing
            train(make(), 1)
        results[name] = train(make(), args.iterations)
    if "dask" in args.algorithms:
        with (
            dxode.local_cluster(n_workers=2) as cluster,
            distributed.Client(cluster) as client,
        ):
            dask = dxode.EnsembleDask(client)
            results["EnsembleDask (2 workers)"] = train(dask, args.iterations)
    reference = results["EnsembleArray"][1]
    print("| algorithm | final theta | final loss | time | max relative history difference |")
    print("|---|---|---|---|---|")
    for name, (theta, history, seconds) in results.items():
        diff = np.max(np.abs(history - reference) / np.abs(reference))
        print(
            f"| {name} | [{theta[0]:.6f}, {theta[1]:.6f}] | {history[-1]:.6g} | "
            f"{seconds:.1f} s | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
