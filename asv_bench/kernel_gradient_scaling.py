"""Kernel gradients against the number of parameters: forward sensitivities or the adjoint.

A damped oscillator driven by a K-term sine series, ``x'' = -x - 0.1 x' + 0.05 Σ_k w_k
sin((k+1) t / 10)``, 100 trajectories (per-trajectory ``u0``, the weights ``w`` shared), saved
at 10 times on [0, 10], rtol 1e-8; loss ``Σ u²``. For each K: the forward solve alone
(``EnsembleKernel``), and ``autograd.value_and_grad`` of the loss with the kernel's forward
sensitivities (``ForwardSensitivity()``: ``2 (1 + K)`` components integrated), the kernel's
discrete adjoint (``DiscreteAdjoint()``) and the array path's discrete adjoint
(``EnsembleArray``, autograd-traced f). Compilation is excluded (one warm-up call each);
best of ``--repeats``. Prints a Markdown table of times and of ratios to the forward solve.

    python asv_bench/kernel_gradient_scaling.py [--terms 2 4 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from datetime import date

import autograd
import autograd.numpy as anp
import numpy as np

import dxode

TRAJECTORIES = 100
SAVE = np.linspace(1.0, 10.0, 10)

SOURCE = """import numpy as np


def forced(u, p, t):
    x, v = u
    w = p[0]
    force = 0.0
    for k in range({K}):
        force = force + w[k] * np.sin((k + 1) * 0.1 * t)
    return [v, -x - 0.1 * v + 0.05 * force]
"""


def forced_rhs(terms: int):
    """The right-hand side with ``terms`` weights, from a file of its own (the kernels read
    ``f``'s source)."""
    path = os.path.join(tempfile.gettempdir(), f"dxode_forced_{terms}.py")
    with open(path, "w") as handle:
        handle.write(SOURCE.format(K=terms))
    spec = importlib.util.spec_from_file_location(f"dxode_forced_{terms}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # importable: numba's cache imports f's module
    spec.loader.exec_module(module)
    return module.forced


def make_loss(f, ensemble_alg, sensealg):
    u0s = np.stack([np.linspace(-1.0, 1.0, TRAJECTORIES), np.zeros(TRAJECTORIES)], axis=1)

    def loss(w):
        prob = dxode.ODEProblem(f, u0s[0], (0.0, 10.0), (w,))
        eprob = dxode.EnsembleProblem(prob, u0=u0s)
        sim = dxode.solve(
            eprob,
            dxode.Tsit5(),
            ensemble_alg,
            trajectories=TRAJECTORIES,
            saveat=SAVE,
            rtol=1e-8,
            atol=1e-8,
            sensealg=sensealg,
        )
        return anp.sum(sim.u**2)

    return loss


def best(func, repeats: int) -> float:
    func()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(
        f"{date.today()}, {platform.processor() or platform.machine()}, "
        f"dxode {dxode.__version__}, load average {load:.2f}"
    )
    print(
        "| K | forward solve | kernel ForwardSensitivity | kernel DiscreteAdjoint | "
        "array DiscreteAdjoint | gradients (kernel adjoint) agree |"
    )
    print("|---|---|---|---|---|---|")
    kernel, array = dxode.EnsembleKernel(), dxode.EnsembleArray()
    for terms in args.terms:
        f = forced_rhs(terms)
        w = np.linspace(-1.0, 1.0, terms)
        plain = best(lambda f=f, w=w: make_loss(f, kernel, None)(w), args.repeats)
        runs = {}
        grads = {}
        for name, alg, sensealg in (
            ("forward", kernel, dxode.ForwardSensitivity()),
            ("adjoint", kernel, dxode.DiscreteAdjoint()),
            ("array", array, dxode.DiscreteAdjoint()),
        ):
            value_and_grad = autograd.value_and_grad(make_loss(f, alg, sensealg))
            runs[name] = best(lambda vg=value_and_grad, w=w: vg(w), args.repeats)
            grads[name] = value_and_grad(w)[1]
        agree = max(
            float(np.max(np.abs(grads[k] - grads["adjoint"]) / np.max(np.abs(grads[k]))))
            for k in ("forward", "array")
        )
        cells = [
            f"{runs[k]:.3f} s ({runs[k] / plain:.1f}x)" for k in ("forward", "adjoint", "array")
        ]
        print(f"| {terms} | {plain:.3f} s | {' | '.join(cells)} | {agree:.0e} |", flush=True)


if __name__ == "__main__":
    main()
