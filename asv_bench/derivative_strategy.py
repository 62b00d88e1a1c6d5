"""Which sensitivity algorithm is cheapest for which shape: few or many parameters per lane.

Two losses, each timed as forward alone and as forward + gradient with ForwardSensitivity,
DiscreteAdjoint and InterpolatingAdjoint (every RHS derivative traced by autograd, no
hand-written products, so the algorithms are compared on equal terms):

* ``lorenz``: the 1,000-trajectory Lorenz loss of ``gradient_cost.py`` (3 states, 3 shared
  parameters scaled per trajectory), t in [0, T1], saveat 1.0, Tsit5, rtol = atol = 1e-6;
* ``mlp``: a neural ODE ``u' = W2 tanh(W1 u + b1) + b2`` (2-50-2, 252 parameters shared by
  every trajectory), 100 trajectories from a ring of start points, t in [0, 1], saveat 0.25.

Also the stiff case: Van der Pol (mu = 1000 per lane, 2 states, 1 per-lane parameter plus
u0), Rodas5P, ForwardSensitivity vs InterpolatingAdjoint (DiscreteAdjoint is unsupported for
stiff methods). Forward-mode cost grows with (states + 1) * inputs per lane, reverse-mode cost
does not::

    python asv_bench/derivative_strategy.py [--quick] [--repeat 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import sys
import time
from pathlib import Path

import autograd
import autograd.numpy as anp
import numpy as np

import dxode

sys.path.insert(0, str(Path(__file__).parent))
from gradient_cost import SCALE, THETA, U0, best, lorenz

ALGS = (dxode.ForwardSensitivity(), dxode.DiscreteAdjoint(), dxode.InterpolatingAdjoint())


def lorenz_loss(sensealg, n: int, t1: float):
    def loss(theta):
        prob = dxode.ODEProblem(lorenz, U0, (0.0, t1), (10.0, 28.0, 8 / 3))
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, p=theta[None, :] * SCALE[:n]),
            dxode.Tsit5(),
            trajectories=n,
            saveat=1.0,
            rtol=1e-6,
            atol=1e-6,
            sensealg=sensealg,
        )
        return anp.sum(sim.u**2)

    return loss, THETA


HIDDEN = 50


def mlp(u, p, t):
    w1 = anp.reshape(p[: 2 * HIDDEN], (HIDDEN, 2))
    b1 = p[2 * HIDDEN : 3 * HIDDEN]
    w2 = anp.reshape(p[3 * HIDDEN : 5 * HIDDEN], (2, HIDDEN))
    b2 = p[5 * HIDDEN :]
    hidden = anp.tanh(anp.dot(w1, u) + (b1[:, None] if anp.ndim(u) == 2 else b1))
    return anp.dot(w2, hidden) + (b2[:, None] if anp.ndim(u) == 2 else b2)


def mlp_loss(sensealg, n: int):
    angles = np.linspace(0.0, 2 * np.pi, n, endpoint=False)
    u0 = np.stack([np.cos(angles), np.sin(angles)], axis=1)

    def loss(theta):
        prob = dxode.ODEProblem(mlp, u0[0], (0.0, 1.0), theta)
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, u0=u0),
            dxode.Tsit5(),
            trajectories=n,
            saveat=0.25,
            rtol=1e-6,
            atol=1e-6,
            sensealg=sensealg,
        )
        return anp.sum(sim.u**2)

    theta = 0.3 * np.random.default_rng(1).standard_normal(5 * HIDDEN + 2)
    return loss, theta


def vdp(u, p, t):
    x, y = u
    return [y, p * ((1 - x * x) * y - x)]


def vdp_loss(sensealg, n: int):
    def loss(theta):
        prob = dxode.ODEProblem(vdp, [2.0, 0.0], (0.0, 1.0), 1000.0)
        eprob = dxode.EnsembleProblem(
            prob, u0=anp.outer(np.linspace(0.9, 1.1, n), theta[:2]), p=theta[2] * np.ones(n)
        )
        sim = dxode.solve(
            eprob,
            dxode.Rodas5P(),
            trajectories=n,
            saveat=[0.5, 1.0],
            rtol=1e-6,
            atol=1e-8,
            sensealg=sensealg,
        )
        return anp.sum(sim.u[:, :, 0] ** 2)

    return loss, np.array([2.0, 0.0, 1000.0])


def table(title: str, make, algs, repeat: int) -> None:
    print(f"\n{title}")
    print("| sensealg | forward (s) | forward + gradient (s) | ratio | max rel. diff vs first |")
    print("|---|---:|---:|---:|---:|")
    loss, theta = make(None)
    forward, _ = best(lambda: loss(theta), repeat)
    first = None
    for alg in algs:
        loss, _ = make(alg)
        elapsed, (_, g) = best(lambda loss=loss: autograd.value_and_grad(loss)(theta), repeat)
        first = g if first is None else first
        diff = float(np.max(np.abs(g - first)) / np.max(np.abs(first)))
        print(
            f"| `{alg!r}` | {forward:.3f} | {elapsed:.3f} | {elapsed / forward:.1f} | {diff:.1e} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller problems, one repeat")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    n_lorenz, t1 = (100, 2.0) if args.quick else (1000, 10.0)
    n_mlp = 10 if args.quick else 100
    n_vdp = 10 if args.quick else 100
    table(
        f"Lorenz, {n_lorenz} trajectories, t in [0, {t1:g}]: 3 states, 3 parameters per lane",
        lambda alg: lorenz_loss(alg, n_lorenz, t1),
        ALGS,
        repeat,
    )
    table(
        f"2-50-2 MLP neural ODE, {n_mlp} trajectories: 2 states, 252 shared parameters",
        lambda alg: mlp_loss(alg, n_mlp),
        ALGS,
        repeat,
    )
    table(
        f"Van der Pol mu = 1000, Rodas5P, {n_vdp} trajectories: 2 states, u0 and mu per lane",
        lambda alg: vdp_loss(alg, n_vdp),
        (dxode.ForwardSensitivity(), dxode.InterpolatingAdjoint()),
        repeat,
    )


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
