"""Cost and accuracy of gradients: the 1,000-trajectory Lorenz loss, dxode and its peers.

The loss: Lorenz trajectories with a shared 3-parameter vector scaled per trajectory as in
the ensemble benchmark, t in [0, 10], saved every 1.0, Tsit5, rtol = atol = 1e-6, and
loss = sum(u**2). For every sensitivity algorithm of dxode (and for Diffrax's
RecursiveCheckpointAdjoint and BacksolveAdjoint, torchode and torchdiffeq, imported lazily
and skipped with the reason when missing) it prints the forward time, (forward + gradient)
time, their ratio and the gradient's relative error against a tight reference: dxode's
ForwardSensitivity at rtol = atol = 1e-10 (with the hand-written jac and paramjac). Then the
peak memory (tracemalloc) of the discrete adjoint against the number of steps, with and
without checkpoints. The autograd-traced discrete adjoint runs twice: as shipped (its stage
VJPs from a bulk linearization) and with one traced VJP per stage and step (as before).
Each code's forward and forward + gradient run alternately, best of ``--repeat`` (5) each::

    python asv_bench/gradient_cost.py [--quick] [--repeat N]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
).strip()

import argparse
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import autograd
import autograd.numpy as anp
import numpy as np

import dxode
from dxode.demo.lorenz import lorenz_jac, lorenz_paramjac
from dxode.sensitivity import bulk_linearization

N = 1000
T1 = 10.0
TOL = 1e-6
SCALE = 1 + 0.1 * (np.random.default_rng(0).random((N, 3)) - 0.5)
THETA = np.array([10.0, 28.0, 8 / 3])
U0 = [1.0, 0.0, 0.0]


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def lorenz_vjp(u, p, t, v):
    x, y, z = u
    sigma, rho, beta = p
    vx, vy, vz = v
    # u_bar as a list of rows, like f's output: dxode stacks them where they belong. p_bar's
    # rows through np.array: for three rows np.stack costs three times as much (2.7 µs).
    u_bar = [-sigma * vx + (rho - z) * vy + y * vz, sigma * vx - vy + x * vz, -x * vy - beta * vz]
    return u_bar, np.array([(y - x) * vx, x * vy, -z * vz])


JACOBIANS = {"jac": lorenz_jac, "paramjac": lorenz_paramjac}
PER_STEP = "dxode DiscreteAdjoint, autograd-traced RHS, per-step traced VJPs"
BULK_MAX_STATE = bulk_linearization.MAX_STATE


def make_loss(sensealg=None, vjp=None, tol=TOL, n=N, t1=T1, derivatives=None, ensemble_alg=None):
    def loss(theta):
        prob = dxode.ODEProblem(
            lorenz, U0, (0.0, t1), (10.0, 28.0, 8 / 3), vjp=vjp, **(derivatives or {})
        )
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, p=theta[None, :] * SCALE[:n]),
            dxode.Tsit5(),
            ensemble_alg,
            trajectories=n,
            saveat=1.0,
            rtol=tol,
            atol=tol,
            sensealg=sensealg,
        )
        return anp.sum(sim.u**2)

    return loss


def best_pair(
    forward: Callable[[], Any], total: Callable[[], Any], repeat: int
) -> tuple[float, float, Any]:
    """Best times of ``forward`` and of ``total`` (forward + gradient), run alternately so
    that a shared machine's slow spells hit both alike; and ``total``'s last result."""
    forward_times, total_times, out = [], [], None
    for _ in range(repeat):
        start = time.perf_counter()
        forward()
        forward_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        out = total()
        total_times.append(time.perf_counter() - start)
    return min(forward_times), min(total_times), out


def rel_error(g: Any, reference: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(g) - reference) / np.abs(reference)))


# ---- peers (imported lazily) ----------------------------------------------------------------


def diffrax_rows(reference: np.ndarray, repeat: int) -> list[tuple]:
    import diffrax
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    term = diffrax.ODETerm(lambda t, u, p: jnp.stack(lorenz(u, p, t)))
    ts = jnp.arange(0.0, T1 + 0.5, 1.0)
    scale = jnp.asarray(SCALE)
    rows = []
    for name, adjoint in (
        ("RecursiveCheckpointAdjoint", diffrax.RecursiveCheckpointAdjoint()),
        ("BacksolveAdjoint", diffrax.BacksolveAdjoint()),
    ):

        def solve_one(p, adjoint=adjoint):
            return diffrax.diffeqsolve(
                term,
                diffrax.Tsit5(),
                t0=0.0,
                t1=T1,
                dt0=None,
                y0=jnp.asarray(U0),
                args=p,
                saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=TOL, atol=TOL),
                max_steps=100_000,
                adjoint=adjoint,
            ).ys

        def loss(theta, solve_one=solve_one):
            return jnp.sum(jax.vmap(solve_one)(theta[None, :] * scale) ** 2)

        theta = jnp.asarray(THETA)
        fwd = jax.jit(loss).lower(theta).compile()
        both = jax.jit(jax.value_and_grad(loss)).lower(theta).compile()
        forward, elapsed, (_, g) = best_pair(
            lambda fwd=fwd, th=theta: jax.block_until_ready(fwd(th)),
            lambda b=both, th=theta: jax.block_until_ready(b(th)),
            repeat,
        )
        rows.append((f"Diffrax {name}", forward, elapsed, rel_error(g, reference)))
    return rows


def torch_lorenz(torch: Any):
    def f(t, y, p):
        return torch.stack(lorenz(y.T, p.T, t), dim=-1)

    return f


def torchode_rows(reference: np.ndarray, repeat: int) -> list[tuple]:
    import torch
    import torchode

    torch.set_num_threads(1)
    term = torchode.ODETerm(torch_lorenz(torch), with_args=True)
    solver = torchode.AutoDiffAdjoint(
        torchode.Tsit5(term=term),
        torchode.IntegralController(atol=TOL, rtol=TOL, term=term),
        max_steps=100_000,
    )
    y0 = torch.tensor(U0, dtype=torch.float64).repeat(N, 1)
    t_eval = torch.arange(0.0, T1 + 0.5, 1.0, dtype=torch.float64).repeat(N, 1)
    scale = torch.tensor(SCALE)

    def run(grad: bool):
        theta = torch.tensor(THETA, requires_grad=grad)
        with torch.set_grad_enabled(grad):
            sol = solver.solve(
                torchode.InitialValueProblem(y0=y0, t_eval=t_eval), args=theta * scale
            )
            loss = torch.sum(sol.ys**2)
        if grad:
            loss.backward()
            return theta.grad.numpy()
        return None

    forward, elapsed, g = best_pair(lambda: run(False), lambda: run(True), repeat)
    return [("torchode AutoDiffAdjoint (backprop)", forward, elapsed, rel_error(g, reference))]


def torchdiffeq_rows(reference: np.ndarray, repeat: int) -> list[tuple]:
    import torch
    import torchdiffeq

    torch.set_num_threads(1)
    scale = torch.tensor(SCALE)
    t = torch.arange(0.0, T1 + 0.5, 1.0, dtype=torch.float64)
    y0 = torch.tensor(U0, dtype=torch.float64).repeat(N, 1)

    class Field(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.theta = torch.nn.Parameter(torch.tensor(THETA))

        def forward(self, t, y):
            return torch.stack(lorenz(y.T, (self.theta * scale).T, t), dim=-1)

    rows = []
    for name, odeint in (
        ("odeint (backprop)", torchdiffeq.odeint),
        ("odeint_adjoint", torchdiffeq.odeint_adjoint),
    ):

        def run(grad: bool, odeint=odeint):
            field = Field()
            with torch.set_grad_enabled(grad):
                ys = odeint(field, y0, t, rtol=TOL, atol=TOL, method="dopri5")
                loss = torch.sum(ys**2)
            if grad:
                loss.backward()
                return field.theta.grad.numpy()
            return None

        forward, elapsed, g = best_pair(
            lambda run=run: run(False), lambda run=run: run(True), repeat
        )
        rows.append((f"torchdiffeq {name}", forward, elapsed, rel_error(g, reference)))
    return rows


# ---- memory ---------------------------------------------------------------------------------


def peak_memory(sensealg: Any, t1: float, n: int) -> float:
    """Peak traced memory (MiB) of one forward + gradient."""
    loss = make_loss(sensealg, lorenz_vjp, n=n, t1=t1)
    tracemalloc.start()
    autograd.grad(loss)(THETA)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def memory_table(quick: bool) -> None:
    n = 100
    spans = (10.0, 20.0) if quick else (10.0, 20.0, 40.0)
    print(f"\nPeak memory (tracemalloc) of forward + gradient, {n} trajectories, hand VJP:")
    print("| t1 | steps per trajectory | sensealg | peak MiB |")
    print("|---:|---:|---|---:|")
    for t1 in spans:
        prob = dxode.ODEProblem(lorenz, U0, (0.0, t1), tuple(THETA))
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, p=THETA[None, :] * SCALE[:n]),
            trajectories=n,
            saveat=1.0,
            rtol=TOL,
            atol=TOL,
        )
        steps = int(np.mean(sim.stats.naccept))
        every = max(1, int(np.sqrt(steps)))
        for alg in (
            dxode.DiscreteAdjoint(),
            dxode.DiscreteAdjoint(checkpoint_every=every),
            dxode.InterpolatingAdjoint(),
        ):
            print(f"| {t1:g} | {steps} | `{alg!r}` | {peak_memory(alg, t1, n):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer memory spans")
    parser.add_argument("--json", help="also write the table (for plot_benchmarks.py) here")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory table")
    parser.add_argument("--repeat", type=int, default=5, help="runs per timing (best counts)")
    parser.add_argument(
        "--only",
        action="append",
        help="only the dxode rows whose label contains this (repeatable; no peers, no memory)",
    )
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    repeat = 1 if args.quick else args.repeat
    start = time.perf_counter()
    tight = make_loss(dxode.ForwardSensitivity(), tol=1e-10, derivatives=JACOBIANS)
    reference = autograd.grad(tight)(THETA)
    print(f"reference (ForwardSensitivity, tol 1e-10): {time.perf_counter() - start:.1f} s")
    plain = make_loss()
    print(f"{N:,} Lorenz trajectories, t in [0, {T1:g}], saveat 1.0, rtol = atol = {TOL:g}")
    print("| gradient | forward (s) | forward + gradient (s) | ratio | rel. error vs reference |")
    print("|---|---:|---:|---:|---:|")
    checkpointed = dxode.DiscreteAdjoint(checkpoint_every=30)
    cases = [
        ("dxode DiscreteAdjoint, autograd-traced RHS", dxode.DiscreteAdjoint(), None, None),
        (PER_STEP, dxode.DiscreteAdjoint(), None, None),
        ("dxode DiscreteAdjoint, hand VJP", dxode.DiscreteAdjoint(), lorenz_vjp, None),
        ("dxode DiscreteAdjoint, hand jac + paramjac", dxode.DiscreteAdjoint(), None, JACOBIANS),
        ("dxode DiscreteAdjoint(checkpoint_every=30), hand VJP", checkpointed, lorenz_vjp, None),
        ("dxode InterpolatingAdjoint, hand VJP", dxode.InterpolatingAdjoint(), lorenz_vjp, None),
        ("dxode ForwardSensitivity (autograd JVPs)", dxode.ForwardSensitivity(), None, None),
        (
            "dxode ForwardSensitivity, hand jac + paramjac",
            dxode.ForwardSensitivity(),
            None,
            JACOBIANS,
        ),
    ]
    # The kernel rows' forward is the kernel's own (compiled on a first, untimed call).
    kernel = dxode.EnsembleKernel(threads=1)
    cases += [
        ("dxode EnsembleKernel, complex-step forward sensitivities", kernel, None, None),
        ("dxode EnsembleKernel, hand jac + paramjac", kernel, None, JACOBIANS),
    ]
    for label, alg, vjp, derivatives in cases:
        if args.only and not any(part in label for part in args.only):
            continue
        on_kernel = isinstance(alg, dxode.EnsembleKernel)
        if on_kernel:
            loss = make_loss(derivatives=derivatives, ensemble_alg=alg)
            plain_here = make_loss(ensemble_alg=alg)
            autograd.grad(loss)(THETA)  # compile both kernels
            plain_here(THETA)
        else:
            loss, plain_here = make_loss(alg, vjp, derivatives=derivatives), plain
        # The per-step row: one traced VJP per stage and step, as before the bulk
        # linearization (dxode.sensitivity.bulk_linearization), for comparison in one run.
        bulk_linearization.MAX_STATE = 0 if label == PER_STEP else BULK_MAX_STATE
        forward, elapsed, (_, g) = best_pair(
            lambda plain_here=plain_here: plain_here(THETA),
            lambda loss=loss: autograd.value_and_grad(loss)(THETA),
            repeat,
        )
        bulk_linearization.MAX_STATE = BULK_MAX_STATE
        err = rel_error(g, reference)
        rows.append({"code": label, "forward": forward, "total": elapsed, "error": err})
        print(
            f"| {label} | {forward:.3f} | {elapsed:.3f} | {elapsed / forward:.2f} | {err:.1e} |",
            flush=True,
        )
    # BacksolveAdjoint is left out: integrating Lorenz backward over [0, 10] diverges (off by
    # ~200 % already over [0, 1.5], NaN from t = 4: tests/test_sensealgs.py shows it).
    print("| dxode BacksolveAdjoint | | | | diverges on this horizon (not run) |")
    if args.only:
        return
    for peer in (diffrax_rows, torchode_rows, torchdiffeq_rows):
        try:
            peer_rows = peer(reference, repeat)
        except ImportError as exc:
            print(f"| {peer.__name__}: skipped ({exc}) | | | | |")
            continue
        for label, fwd, elapsed, err in peer_rows:
            rows.append({"code": label, "forward": fwd, "total": elapsed, "error": err})
            print(
                f"| {label} | {fwd:.3f} | {elapsed:.3f} | {elapsed / fwd:.2f} | {err:.1e} |",
                flush=True,
            )
    for row in rows:
        row["ratio"] = row["total"] / row["forward"]
    if args.json:
        title = f"gradient cost, {N:,} Lorenz trajectories, t in [0, {T1:g}]"
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"title": title, "rows": rows}, fh, indent=1)
    if not args.no_memory:
        memory_table(args.quick)


if __name__ == "__main__":
    main()
