"""One Lorenz solve in dxode (Tsit5) against SciPy's ``solve_ivp(method="RK45")``.

Both integrate the same Lorenz system on ``t in [0, 100]`` with ``rtol = atol = 1e-6`` in two
output configurations:

``every_step``
    dxode's default (every accepted step saved, dense output kept) against SciPy with every
    step saved and ``dense_output=True``.
``saveat_1``
    dxode with ``saveat=1.0, dense=False`` against SciPy with ``t_eval`` on the same grid.

Tsit5 and RK45 (Dormand–Prince) are both FSAL 5(4) pairs costing six RHS evaluations per
step, so time per step compares the per-step overhead of the two codes. ``compare_single.py``
next to this folder imports the runners below and prints the same comparison as a table.
The compiled path (``kernel=True``, numba) runs both configurations without dense output
(the kernels keep none): every accepted step saved, or the ``saveat`` grid.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np

import dxode

T_SPAN = (0.0, 100.0)
U0 = [1.0, 0.0, 0.0]
P = (10.0, 28.0, 8 / 3)
TOL = 1e-6
OUTPUTS = ("every_step", "saveat_1")
SAVE_GRID = np.linspace(0.0, 100.0, 101)


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def lorenz_scipy(t, u):
    return lorenz(u, P, t)


PROBLEM = dxode.ODEProblem(lorenz, U0, T_SPAN, P)


def run_dxode(output: str) -> dxode.ODESolution:
    """One dxode solve in the given output configuration."""
    if output == "every_step":
        return dxode.solve(PROBLEM, dxode.Tsit5(), rtol=TOL, atol=TOL)
    return dxode.solve(PROBLEM, dxode.Tsit5(), rtol=TOL, atol=TOL, saveat=1.0, dense=False)


def run_dxode_kernel(output: str) -> dxode.ODESolution:
    """One compiled dxode solve (``kernel=True``; needs numba) in the given configuration."""
    saves = {} if output == "every_step" else {"saveat": 1.0}
    return dxode.solve(
        PROBLEM, dxode.Tsit5(), rtol=TOL, atol=TOL, dense=False, kernel=True, **saves
    )


def run_scipy(output: str):
    """One ``scipy.integrate.solve_ivp(method="RK45")`` solve in the given configuration."""
    from scipy.integrate import solve_ivp

    if output == "every_step":
        return solve_ivp(
            lorenz_scipy, T_SPAN, U0, method="RK45", rtol=TOL, atol=TOL, dense_output=True
        )
    return solve_ivp(lorenz_scipy, T_SPAN, U0, method="RK45", rtol=TOL, atol=TOL, t_eval=SAVE_GRID)


def dxode_steps(sol: dxode.ODESolution) -> int:
    """Step attempts, accepted and rejected."""
    return sol.stats.naccept + sol.stats.nreject


def scipy_steps(sol) -> float:
    """Step attempts estimated from the RHS count (six evaluations per RK45 step)."""
    return sol.nfev / 6


def best_time(fn, output: str, repeats: int) -> float:
    """The best wall time of ``repeats`` calls of ``fn(output)``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(output)
        best = min(best, time.perf_counter() - start)
    return best


class LorenzSingleSolve:
    """Wall time, step counts and per-step cost of one Lorenz solve."""

    params: ClassVar[list[str]] = list(OUTPUTS)
    param_names: ClassVar[list[str]] = ["output"]
    timeout = 120

    def setup(self, output):
        try:
            import scipy.integrate  # noqa: F401
        except ImportError as exc:  # asv skips a benchmark whose setup raises NotImplementedError
            raise NotImplementedError("SciPy is not installed") from exc
        run_dxode(output)  # warm caches (coefficient arrays, imports)

    def time_dxode_tsit5(self, output):
        run_dxode(output)

    def time_scipy_rk45(self, output):
        run_scipy(output)

    def track_steps_dxode_tsit5(self, output):
        return dxode_steps(run_dxode(output))

    track_steps_dxode_tsit5.unit = "steps"

    def track_steps_scipy_rk45(self, output):
        return scipy_steps(run_scipy(output))

    track_steps_scipy_rk45.unit = "steps"

    def track_per_step_ratio(self, output):
        """(dxode time / dxode steps) / (SciPy time / SciPy steps); below 1 means dxode wins."""
        ours = best_time(run_dxode, output, 3) / dxode_steps(run_dxode(output))
        theirs = best_time(run_scipy, output, 3) / scipy_steps(run_scipy(output))
        return ours / theirs

    track_per_step_ratio.unit = "ratio"


class LorenzSingleSolveKernel:
    """Wall time of one compiled (``kernel=True``) Lorenz solve, compile excluded."""

    params: ClassVar[list[str]] = list(OUTPUTS)
    param_names: ClassVar[list[str]] = ["output"]
    timeout = 300

    def setup(self, output):
        try:
            import numba  # noqa: F401
        except ImportError as exc:
            raise NotImplementedError("numba is not installed") from exc
        run_dxode_kernel(output)  # compile (or load from the disk cache)

    def time_dxode_tsit5_kernel(self, output):
        run_dxode_kernel(output)
