"""The ``dxode demo`` command: solve the Lorenz system, print a summary, plot it."""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Any

import numpy as np

from . import ODEProblem, Tsit5, solve

PLOT_EXTRA_HINT = 'plotting needs matplotlib: install it with  pip install "dxode[plot]"'


def lorenz(u: Any, p: Any, t: Any) -> list[Any]:
    """The Lorenz system, written once for any array library (a list of rows is stacked)."""
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def run_demo(output: pathlib.Path) -> int:
    """Solve Lorenz on ``[0, 100]`` with Tsit5 (``rtol = atol = 1e-8``), report and plot it.

    Returns the process exit status: 0 on success, 1 when matplotlib is missing or the
    integration failed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(f"dxode demo: {PLOT_EXTRA_HINT}", file=sys.stderr)
        return 1

    prob = ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 100.0), (10.0, 28.0, 8 / 3))
    start = time.perf_counter()
    sol = solve(prob, Tsit5(), rtol=1e-8, atol=1e-8)
    wall = time.perf_counter() - start
    stats = sol.stats
    u5 = np.asarray(sol(5.0))
    print("Lorenz system, sigma=10, rho=28, beta=8/3, u0=(1, 0, 0), t in [0, 100]")
    print("method Tsit5, rtol=1e-8, atol=1e-8")
    print(f"retcode      {sol.retcode.name} ({sol.retcode.message})")
    print(f"steps        {stats.naccept} accepted, {stats.nreject} rejected")
    print(f"RHS evals    {stats.nf}")
    print(f"wall time    {wall:.3f} s")
    print(f"sol(5.0)     [{u5[0]:.8f}, {u5[1]:.8f}, {u5[2]:.8f}]")
    if not sol.success:
        return 1

    # Plot from the dense output on a fine grid (every step's own interpolant).
    t = np.linspace(0.0, 100.0, 20_001)
    u = np.asarray(sol(t))
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_xz, ax_xt = fig.subplots(1, 2, width_ratios=(1, 1.6))
    ax_xz.plot(u[:, 0], u[:, 2], lw=0.4)
    ax_xz.set(xlabel="x", ylabel="z", title="Lorenz attractor (x–z projection)")
    ax_xt.plot(t, u[:, 0], lw=0.6)
    ax_xt.set(xlabel="t", ylabel="x", title=f"x(t), Tsit5, {stats.naccept} steps")
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    print(f"plot         {output}")
    return 0
