"""Cost of a gradient: (forward + gradient) / forward for a 1,000-trajectory Lorenz loss.

The loss: Lorenz trajectories with a shared 3-parameter vector scaled per trajectory as in
the ensemble benchmark, t in [0, 10], saved every 1.0, Tsit5, rtol = atol = 1e-6, and
loss = sum(u**2). Gradients by the discrete adjoint, with autograd tracing the right-hand
side and with a hand-written VJP; the gradient is checked against central differences at a
tight tolerance (relative error printed)::

    python asv_bench/gradient_cost.py
"""

from __future__ import annotations

import time

import autograd
import autograd.numpy as anp
import numpy as np

import dxode

N = 1000
SCALE = 1 + 0.1 * (np.random.default_rng(0).random((N, 3)) - 0.5)


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def lorenz_vjp(u, p, t, v):
    x, y, z = u
    sigma, rho, beta = p
    vx, vy, vz = v
    u_bar = np.stack(
        [-sigma * vx + (rho - z) * vy + y * vz, sigma * vx - vy + x * vz, -x * vy - beta * vz]
    )
    return u_bar, np.stack([(y - x) * vx, x * vy, -z * vz])


def make_loss(vjp=None, tol=1e-6):
    def loss(theta):
        prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 10.0), (10.0, 28.0, 8 / 3), vjp=vjp)
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, p=theta[None, :] * SCALE),
            dxode.Tsit5(),
            trajectories=N,
            saveat=1.0,
            rtol=tol,
            atol=tol,
        )
        return anp.sum(sim.u**2)

    return loss


def best(func, repeat=3):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    theta = np.array([10.0, 28.0, 8 / 3])
    forward = best(lambda: make_loss()(theta))
    print(f"{N:,} Lorenz trajectories, t in [0, 10]; forward {forward:.3f} s")
    print("| gradient | forward + gradient (s) | ratio to forward | rel. error vs reference |")
    print("|---|---:|---:|---:|")
    # Reference: the same discrete-adjoint machinery at a tight tolerance (a converged gradient).
    reference = autograd.grad(make_loss(lorenz_vjp, tol=1e-10))(theta)
    for label, vjp in (("autograd-traced RHS", None), ("hand-written VJP", lorenz_vjp)):
        loss = make_loss(vjp)
        elapsed = best(lambda loss=loss: autograd.value_and_grad(loss)(theta))
        g = autograd.grad(loss)(theta)
        error = np.max(np.abs(g - reference) / np.abs(reference))
        print(f"| {label} | {elapsed:.3f} | {elapsed / forward:.2f} | {error:.1e} |")


if __name__ == "__main__":
    main()
