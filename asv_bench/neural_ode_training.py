"""Data-parallel neural-ODE training: workers, lock-step vs per-lane steps, adaptive vs fixed.

A 2 -> 50 -> 2 tanh MLP right-hand side (written with ``autograd.numpy``) is fitted to
trajectories of the cubic spiral of torchdiffeq's ``ode_demo``,

    du/dt = A^T u**3,   A = [[-0.1, 2.0], [-2.0, -0.1]],

started from initial states drawn uniformly in [-1.5, 1.5]^2, over t in [0, 1], saved every
0.1 (11 points); the loss is the mean squared error of the saved states. Every epoch is one
full-batch gradient (discrete adjoint, Tsit5) and one Adam step. Measured for each
configuration:

- workers: 0 (``EnsembleArray`` in this process) or a ``LocalCluster`` with 1 or 2 worker
  processes (``EnsembleDask``); the trajectories are split into one batch per worker;
- mode: ``per-lane`` (every trajectory its own step size; lanes that finish leave the batch)
  or ``lock-step`` (a batch is solved as one ODE system whose state stacks its trajectories,
  so they share one step size, controlled by the RMS error over all of them);
- controller: ``adaptive`` (``PIDController``, rtol/atol below; a differentiated solve also
  steps onto every save time) or ``fixed`` (``dt=0.1, adaptive=False``: one step per save
  interval);
- in process only, mode ``kernel``: ``EnsembleKernel`` (per-lane, compiled with numba), the
  same MLP written for one trajectory with loops over its weights (``mlp_kernel``), its
  gradient the kernel's discrete adjoint (252 parameters: the default); the first epoch
  compiles or loads the kernels (excluded from the epoch time, not from the runtime).

Then the in-process epoch time against the number of trajectories, and weak scaling
(trajectories per worker fixed) and strong scaling (total fixed) from one to two workers, at
the main size and at ``--large`` trajectories (fewer epochs). Run from the repository root::

    python asv_bench/neural_ode_training.py             # full run, 4-8 min on 2 cores
    python asv_bench/neural_ode_training.py --quick     # a smoke test, ~1 min

Epoch time is the mean wall time of epochs 2..E (the first epoch ships the functions to the
workers and warms caches); runtime is the wall time of all E epochs (cluster start excluded);
CPU s / epoch is the CPU time of the driver (with a LocalCluster's scheduler) and the worker
processes over epochs 2..E per epoch, which a busy machine inflates less than wall time;
steps / trajectory is the mean number of accepted steps of a trajectory's forward pass (in
lock-step, of its group), averaged over the epochs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import autograd
import autograd.numpy as anp
import numpy as np

import dxode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dask_scaling import machine, table

HIDDEN = 50
SAVE_DT = 0.1
T1 = 1.0
SPIRAL = np.array([[-0.1, 2.0], [-2.0, -0.1]])


def spiral(u: Any, p: Any, t: Any) -> Any:
    """The true dynamics, lanes-last: ``u`` is ``(2, ...)``."""
    return anp.tensordot(SPIRAL.T, u**3, axes=1)


def training_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Initial states ``(n, 2)`` and the true saved states ``(n, 11, 2)``."""
    u0 = np.random.default_rng(seed).uniform(-1.5, 1.5, size=(n, 2))
    prob = dxode.ODEProblem(spiral, u0[0], (0.0, T1))
    sim = dxode.solve(
        dxode.EnsembleProblem(prob, u0=u0),
        dxode.Tsit5(),
        trajectories=n,
        saveat=SAVE_DT,
        rtol=1e-10,
        atol=1e-10,
    )
    return u0, sim.u


def init_theta(seed: int = 1) -> np.ndarray:
    """Flat MLP parameters: W1 (50, 2), b1 (50,), W2 (2, 50), b2 (2,): 252 numbers."""
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [
            rng.normal(0.0, 0.5, 2 * HIDDEN),
            np.zeros(HIDDEN),
            rng.normal(0.0, 0.1, 2 * HIDDEN),
            np.zeros(2),
        ]
    )


def unpack(theta: Any) -> tuple[Any, Any, Any, Any]:
    """``(W1, b1, W2, b2)`` from the flat parameter vector (traced or not)."""
    h = HIDDEN
    return (
        anp.reshape(theta[: 2 * h], (h, 2)),
        theta[2 * h : 3 * h],
        anp.reshape(theta[3 * h : 5 * h], (2, h)),
        theta[5 * h : 5 * h + 2],
    )


def mlp(u: Any, theta: Any, t: Any) -> Any:
    """The neural vector field on a state ``(2, ...)`` (any trailing lane axes).

    The parameter is the flat vector itself, unpacked here: a tuple of arrays derived from a
    traced vector would carry autograd's trace graph into every Dask task (~120 kB each).
    """
    w1, b1, w2, b2 = unpack(theta)
    x = anp.reshape(u, (2, -1))
    hidden = anp.tanh(anp.dot(w1, x) + b1[:, None])
    return anp.reshape(anp.dot(w2, hidden) + b2[:, None], anp.shape(u))


KERNEL_HALF = 25  # hidden units per parameter leaf of mlp_kernel (the kernels' tuples: <= 30)


def mlp_kernel(u: Any, p: Any, t: Any) -> Any:
    """The same MLP for one trajectory, as the compiled kernels take it: loops over the
    weights of ``kernel_params(theta)``."""
    x, y = u
    w1x, w1y, b1, w2x, w2y, b2 = p
    o0 = b2[0]
    o1 = b2[1]
    for half in range(2):
        for j in range(KERNEL_HALF):
            h = math.tanh(w1x[half][j] * x + w1y[half][j] * y + b1[half][j])
            o0 = o0 + w2x[half][j] * h
            o1 = o1 + w2y[half][j] * h
    return [o0, o1]


def kernel_params(theta: Any) -> tuple[Any, ...]:
    """``mlp_kernel``'s ``p`` from the flat parameters: ``W1[:, 0]``, ``W1[:, 1]``, ``b1``,
    ``W2[0]``, ``W2[1]`` in halves of 25 hidden units, and ``b2``."""

    def halves(v: Any) -> tuple[Any, Any]:
        return (v[:KERNEL_HALF], v[KERNEL_HALF:])

    h = HIDDEN
    return (
        halves(theta[0 : 2 * h : 2]),
        halves(theta[1 : 2 * h : 2]),
        halves(theta[2 * h : 3 * h]),
        halves(theta[3 * h : 4 * h]),
        halves(theta[4 * h : 5 * h]),
        theta[5 * h : 5 * h + 2],
    )


def make_loss(
    u0: np.ndarray,
    data: np.ndarray,
    groups: int,
    lockstep: bool,
    alg: Any,
    solve_kw: dict,
    kernel: bool = False,
) -> Callable[[Any], Any]:
    """Mean squared error of the model's saved states, the trajectories split in ``groups``.

    Per-lane: an ensemble of ``n`` lanes in batches of ``n / groups``. Lock-step: an ensemble
    of ``groups`` lanes, each one ODE system stacking ``n / groups`` trajectories (state
    ``(2, n / groups)``), so a group shares its steps. ``kernel``: ``mlp_kernel`` (per-lane).
    """
    n = len(u0)
    size = n // groups
    if lockstep:
        # (groups, 2, size): each group's trajectories side by side in one state.
        chunks = np.moveaxis(u0.reshape(groups, size, 2), 1, 2)
        first, trajectories, batch = chunks[0], groups, 1
        arrays = {"u0": chunks}
    else:
        first, trajectories, batch = u0[0], n, size
        arrays = {"u0": u0}

    def loss(theta: Any) -> Any:
        f, p = (mlp_kernel, kernel_params(theta)) if kernel else (mlp, theta)
        prob = dxode.ODEProblem(f, first, (0.0, T1), p)
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, **arrays),
            dxode.Tsit5(),
            alg,
            trajectories=trajectories,
            batch_size=batch,
            saveat=SAVE_DT,
            **solve_kw,
        )
        loss.steps = float(np.mean(sim.stats.naccept))  # type: ignore[attr-defined]
        saved = sim.u
        if lockstep:  # (groups, nsave, 2, size) -> (n, nsave, 2)
            saved = anp.reshape(anp.transpose(saved, (0, 3, 1, 2)), (n, -1, 2))
        return anp.mean((saved - data) ** 2)

    return loss


def adam_train(
    loss: Callable[[Any], Any],
    theta: np.ndarray,
    epochs: int,
    lr: float,
    cpu_clock: Callable[[], float],
) -> dict[str, Any]:
    """Full-batch Adam (Kingma & Ba's defaults besides the rate); times every epoch.

    ``cpu_clock()`` is the CPU time used so far by the driver and the workers, read after the
    first epoch and at the end.
    """
    value_and_grad = autograd.value_and_grad(loss)
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    b1, b2, eps = 0.9, 0.999, 1e-8
    times, losses, cpu, steps = [], [], [], []
    for k in range(1, epochs + 1):
        start = time.perf_counter()
        value, g = value_and_grad(theta)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        theta = theta - lr * (m / (1 - b1**k)) / (np.sqrt(v / (1 - b2**k)) + eps)
        times.append(time.perf_counter() - start)
        losses.append(float(value))
        steps.append(loss.steps)  # type: ignore[attr-defined]
        if k == 1 or k == epochs:
            cpu.append(cpu_clock())
    return {
        "times": times,
        "losses": losses,
        "theta": theta,
        "steps": float(np.mean(steps)),
        "cpu": (cpu[-1] - cpu[0]) / (epochs - 1) if epochs > 1 else float("nan"),
    }


CONTROLLERS = {
    "adaptive": lambda rtol: {
        "rtol": rtol,
        "atol": rtol * 1e-2,
        "controller": dxode.PIDController(),
    },
    "fixed": lambda rtol: {"dt": SAVE_DT, "adaptive": False},
}


def run_config(
    workers: int, client: Any, job: tuple[str, str, int, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Train from scratch for one job ``(mode, controller, trajectories, epochs)``."""
    mode, controller, n, epochs = job
    u0, data = training_data(n)
    groups = max(workers, 1)
    alg = dxode.EnsembleArray() if client is None else dxode.EnsembleDask(client)
    if mode == "kernel":
        alg = dxode.EnsembleKernel()
    options = CONTROLLERS[controller](args.rtol)
    loss = make_loss(u0, data, groups, mode == "lock-step", alg, options, mode == "kernel")
    result = adam_train(loss, init_theta(), epochs, args.lr, lambda: cpu_seconds(client))
    times = result["times"]
    return {
        "workers": workers,
        "mode": mode,
        "controller": controller,
        "n": n,
        "epochs": epochs,
        "runtime": sum(times),
        "epoch": float(np.mean(times[1:])) if len(times) > 1 else times[0],
        "first_loss": result["losses"][0],
        "final_loss": result["losses"][-1],
        "steps": result["steps"],
        "cpu": result["cpu"],
    }


def find(results: list[dict[str, Any]], workers: int, controller: str, n: int) -> dict[str, Any]:
    """The per-lane result for ``workers``, ``controller`` and ``n`` trajectories."""
    return next(
        r
        for r in results
        if (r["workers"], r["mode"], r["controller"], r["n"])
        == (workers, "per-lane", controller, n)
    )


def cpu_seconds(client: Any) -> float:
    """CPU time of this process (driver and, for a LocalCluster, scheduler) and the workers."""
    workers = 0.0 if client is None else sum(client.run(time.process_time).values())
    return time.process_time() + workers


def with_cluster(
    workers: int, jobs: list[tuple[str, str, int, int]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Run ``jobs`` in this process (``workers == 0``) or on a fresh local cluster."""
    if workers == 0:
        return [run_config(0, None, job, args) for job in jobs]
    import distributed

    with (
        dxode.local_cluster(n_workers=workers) as cluster,
        distributed.Client(cluster) as client,
    ):
        client.wait_for_workers(workers)
        return [run_config(workers, client, job, args) for job in jobs]


def main_table(results: list[dict[str, Any]]) -> str:
    rows = [
        [
            "in process" if r["workers"] == 0 else r["workers"],
            r["mode"],
            r["controller"],
            f"{r['steps']:.1f}",
            f"{r['runtime']:.1f}",
            f"{r['epoch']:.3f}",
            f"{r['cpu']:.3f}",
            f"{r['first_loss']:.4f}",
            f"{r['final_loss']:.4f}",
        ]
        for r in results
    ]
    header = [
        "workers",
        "mode",
        "controller",
        "steps / trajectory",
        "runtime (s)",
        "epoch time (s)",
        "CPU s / epoch",
        "loss, epoch 1",
        "final loss",
    ]
    return table(header, rows)


def size_table(results: list[dict[str, Any]], sizes: list[int]) -> str:
    """In-process epoch time against the number of trajectories (per-lane mode)."""
    rows = []
    for controller in CONTROLLERS:
        for n in sizes:
            r = find(results, 0, controller, n)
            rows.append(
                [
                    controller,
                    n,
                    r["epochs"],
                    f"{r['steps']:.1f}",
                    f"{r['epoch']:.3f}",
                    f"{r['cpu']:.3f}",
                    f"{1e3 * r['cpu'] / n:.2f}",
                ]
            )
    header = [
        "controller",
        "trajectories",
        "epochs",
        "steps / trajectory",
        "epoch time (s)",
        "CPU s / epoch",
        "CPU ms per trajectory",
    ]
    return table(header, rows)


def scaling_table(results: list[dict[str, Any]], sizes: list[int]) -> str:
    """Strong: n trajectories on 1 and 2 workers. Weak: n / 2 per worker on 1 and 2."""
    rows = []
    for n in sizes:
        for controller in CONTROLLERS:
            one, two = find(results, 1, controller, n), find(results, 2, controller, n)
            half = find(results, 1, controller, n // 2)
            for kind, base, ideal in (("strong", one, 2.0), ("weak", half, 1.0)):
                rows.append(
                    [
                        kind,
                        controller,
                        f"{base['n']} / {n}",
                        two["epochs"],
                        f"{base['epoch']:.3f}",
                        f"{two['epoch']:.3f}",
                        f"{base['epoch'] / two['epoch']:.2f}",
                        f"{base['epoch'] / (ideal * two['epoch']):.0%}",
                    ]
                )
    header = [
        "scaling",
        "controller",
        "trajectories (1 / 2 workers)",
        "epochs",
        "epoch, 1 worker (s)",
        "epoch, 2 workers (s)",
        "speedup",
        "efficiency",
    ]
    return table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--trajectories", type=int, default=512)
    parser.add_argument("--large", type=int, default=4096, help="trajectories, size/scaling runs")
    parser.add_argument("--large-epochs", type=int, default=6, help="epochs of those runs")
    parser.add_argument("--rtol", type=float, default=1e-6, help="adaptive runs; atol = rtol/100")
    parser.add_argument("--lr", type=float, default=0.02, help="Adam step size")
    parser.add_argument("--quick", action="store_true", help="a smoke test: small and short")
    parser.add_argument("--out", default=None, help="append the tables to this file")
    parser.add_argument(
        "--in-process", action="store_true", help="only the in-process rows of the main table"
    )
    args = parser.parse_args()
    if args.quick:
        args.trajectories, args.epochs, args.large, args.large_epochs = 64, 4, 256, 3
    n, large = args.trajectories, args.large
    if n % 16 or large % 4 or large <= n:
        parser.error("--trajectories must be a multiple of 16, --large one of 4 and larger")
    main_jobs = [
        (mode, c, n, args.epochs) for mode in ("per-lane", "lock-step") for c in CONTROLLERS
    ]

    def per_lane(*sizes: int, epochs: int = args.large_epochs) -> list[tuple[str, str, int, int]]:
        return [("per-lane", c, size, epochs) for size in sizes for c in CONTROLLERS]

    sweep = sorted({n // 8, n // 2, large} - {n})
    kernel_jobs = [("kernel", c, n, args.epochs) for c in CONTROLLERS]
    jobs = {
        0: main_jobs + kernel_jobs + per_lane(*sweep),
        1: main_jobs + per_lane(n // 2, epochs=args.epochs) + per_lane(large // 2, large),
        2: main_jobs + per_lane(large),
    }
    if args.in_process:
        jobs = {0: main_jobs + kernel_jobs}
    results = []
    for workers, worker_jobs in jobs.items():
        results += with_cluster(workers, worker_jobs, args)
        print(f"done: {workers} workers", file=sys.stderr, flush=True)
    main_rows = [r for r in results if r["n"] == n and r["epochs"] == args.epochs]
    parts = [
        f"Machine: {machine()}, autograd {importlib.metadata.version('autograd')}",
        f"Command: python {' '.join(sys.argv)}",
        f"### Neural ODE training, {n} trajectories, {args.epochs} epochs "
        f"(adaptive: rtol={args.rtol:g}, atol={args.rtol * 1e-2:g})",
        main_table(main_rows),
    ]
    if not args.in_process:
        parts += [
            "### Epoch time against batch size, in one process (per-lane)",
            size_table(results, sorted({*sweep, n})),
            "### Weak and strong scaling, 1 -> 2 workers (per-lane; weak: half the "
            "trajectories on 1 worker)",
            scaling_table(results, [n, large]),
        ]
    text = "\n\n".join(parts)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
