"""A 2-parameter fit of a damped oscillator: kernel gradients vs SciPy + finite differences
vs the array path + autograd, in one run, to the same optimum (issue 18).

``x'' = -k x - c x'`` from ``(x, x') = (1, 0)`` on t in [0, 10]; 40 noisy observations of
``x`` (true ``(k, c) = (2.0, 0.2)``, Gaussian noise 0.02, seed 0); loss = mean squared misfit;
L-BFGS-B from ``(k, c) = (1.6, 0.3)``; every solve at ``rtol = atol = 1e-8`` with Tsit5
(SciPy: ``solve_ivp``'s RK45, its gradient by L-BFGS-B's own 2-point finite differences).
The kernel's compile time (first call; cached on disk afterwards) is reported apart.

    python asv_bench/fit_kernel.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

TRUE = np.array([2.0, 0.2])
START = np.array([1.6, 0.3])
TIMES = np.linspace(0.25, 10.0, 40)
TOL = 1e-8


def damped(u: Any, p: Any, t: Any) -> list[Any]:
    x, v = u
    k, c = p
    return [v, -k * x - c * v]


def data(seed: int = 0) -> np.ndarray:
    """The 40 noisy observations of ``x``."""
    from scipy.integrate import solve_ivp

    exact = solve_ivp(
        lambda t, u: damped(u, TRUE, t),
        (0.0, 10.0),
        [1.0, 0.0],
        t_eval=TIMES,
        rtol=1e-12,
        atol=1e-12,
    ).y[0]
    return exact + np.random.default_rng(seed).normal(0.0, 0.02, TIMES.size)


def dxode_loss(observed: np.ndarray, kernel: bool) -> Any:
    """``value_and_grad`` of the loss through dxode (kernel or array path)."""
    import autograd
    import autograd.numpy as anp

    import dxode

    prob = dxode.ODEProblem(damped, np.array([1.0, 0.0]), (0.0, 10.0), (2.0, 0.2))

    def loss(theta: Any) -> Any:
        sol = dxode.solve(
            prob.remake(p=(theta[0], theta[1])),
            dxode.Tsit5(),
            saveat=TIMES,
            rtol=TOL,
            atol=TOL,
            kernel=kernel,
        )
        return anp.mean((sol.u[:, 0] - observed) ** 2)

    value_and_grad = autograd.value_and_grad(loss)
    return lambda theta: tuple(np.asarray(v, dtype=float) for v in value_and_grad(theta))


def scipy_loss(observed: np.ndarray) -> Any:
    from scipy.integrate import solve_ivp

    def loss(theta: np.ndarray) -> float:
        sol = solve_ivp(
            lambda t, u: damped(u, theta, t),
            (0.0, 10.0),
            [1.0, 0.0],
            t_eval=TIMES,
            rtol=TOL,
            atol=TOL,
        )
        return float(np.mean((sol.y[0] - observed) ** 2))

    return loss


def fit(objective: Any, jac: bool) -> tuple[float, Any]:
    from scipy.optimize import minimize

    start = time.perf_counter()
    result = minimize(objective, START, jac=jac, method="L-BFGS-B")
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="fits per code (best is shown)")
    args = parser.parse_args()
    observed = data()
    kernel = dxode_loss(observed, kernel=True)
    start = time.perf_counter()
    kernel(START)
    print(f"kernel compile + first gradient: {time.perf_counter() - start:.2f} s")
    codes = {
        "dxode kernel=True, autograd.grad (compiled forward sensitivities)": (kernel, True),
        "SciPy solve_ivp RK45 + L-BFGS-B finite differences": (scipy_loss(observed), False),
        "dxode array path + autograd.value_and_grad (discrete adjoint)": (
            dxode_loss(observed, kernel=False),
            True,
        ),
    }
    rows = []
    for name, (objective, jac) in codes.items():
        runs = [fit(objective, jac) for _ in range(args.repeat)]
        wall, result = min(runs, key=lambda r: r[0])
        rows.append((name, wall, result))
    print(
        f"| code | fit (s), best of {args.repeat} | vs SciPy | loss evaluations | "
        "optimum (k, c) | loss |"
    )
    print("|---|---:|---:|---:|---|---:|")
    scipy_wall = rows[1][1]
    for name, wall, result in rows:
        k, c = result.x
        print(
            f"| {name} | {wall:.3f} | {wall / scipy_wall:.2f} | {result.nfev} | "
            f"({k:.6f}, {c:.6f}) | {result.fun:.6e} |"
        )
    spread = max(np.max(np.abs(r.x - rows[0][2].x)) for _, _, r in rows)
    print(f"largest difference between the optima: {spread:.2e}")


if __name__ == "__main__":
    main()
