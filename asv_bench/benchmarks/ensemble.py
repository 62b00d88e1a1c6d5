"""A Lorenz ensemble in dxode (``EnsembleArray``) against SciPy's "stacked" ``solve_ivp``.

Every trajectory integrates the Lorenz system from ``u0 = (1, 0, 0)`` over ``t in [0, 10]``,
saving at ``t = 0, 1, ..., 10``, with Tsit5 (dxode) or RK45 (SciPy), ``rtol = atol = 1e-6``,
float64. Trajectory ``i`` has its own parameters ``p · (1 + 0.1 · (U_i − 0.5))``, ``U_i``
uniform per component from a fixed seed (the same first rows for every ``N``).

``dxode``
    ``solve(EnsembleProblem(prob, p=P), Tsit5(), EnsembleArray(), trajectories=N,
    saveat=1.0)``: one vectorized batch of lanes, each with its own step size.
``scipy_stacked``
    ONE ``solve_ivp(method="RK45")`` on the ``(3N,)`` system: all trajectories share one step
    size, controlled by the RMS error over all ``3N`` components, so a single trajectory's
    own error is not controlled.

``dxode_prob_func``
    The same ensemble built DiffEq style, ``EnsembleProblem(prob, prob_func=lambda prob, i,
    repeat: prob.remake(p=P[i]))``: one Python call and one ``remake`` per trajectory, which
    should cost at most 1.25x the arrays above (``EnsembleConstruction``).

``compare_ensemble.py`` next to this folder imports these definitions and adds the peers
that are not in the benchmark extra (a SciPy loop, Diffrax, torchode).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

import dxode

U0 = (1.0, 0.0, 0.0)
P = (10.0, 28.0, 8 / 3)
T_SPAN = (0.0, 10.0)
SAVE_GRID = np.linspace(0.0, 10.0, 11)
TOL = 1e-6
SEED = 20261120


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


PROBLEM = dxode.ODEProblem(lorenz, list(U0), T_SPAN, P)


def parameters(n: int, seed: int = SEED) -> np.ndarray:
    """Per-trajectory parameters ``(n, 3)``; row ``i`` is the same for every ``n > i``."""
    u = np.random.default_rng(seed).random((n, 3))
    return np.asarray(P) * (1.0 + 0.1 * (u - 0.5))


def run_dxode(
    params: np.ndarray,
    batch_size: int | None = None,
    lockstep: bool = False,
    tol: float = TOL,
):
    """The ensemble in dxode; returns the ``EnsembleSolution``."""
    n = params.shape[0]
    return dxode.solve(
        dxode.EnsembleProblem(PROBLEM, p=params),
        dxode.Tsit5(),
        dxode.EnsembleArray(lockstep=lockstep),
        trajectories=n,
        batch_size=batch_size,
        saveat=1.0,
        rtol=tol,
        atol=tol,
    )


def run_dxode_prob_func(params: np.ndarray, tol: float = TOL):
    """The ensemble built with ``prob_func`` and ``remake(p=params[i])``; the same bits as
    ``run_dxode(params)``."""
    eprob = dxode.EnsembleProblem(
        PROBLEM.remake(p=np.asarray(P)),  # an array p, so that each trajectory's row fits it
        prob_func=lambda prob, i, repeat: prob.remake(p=params[i]),
    )
    return dxode.solve(
        eprob,
        dxode.Tsit5(),
        dxode.EnsembleArray(),
        trajectories=params.shape[0],
        saveat=1.0,
        rtol=tol,
        atol=tol,
    )


def run_scipy_stacked(params: np.ndarray, tol: float = TOL):
    """ONE ``solve_ivp(RK45)`` on the ``(3N,)`` system; ``sol.y`` is ``(3N, 11)``.

    The state is stored component-major, ``(x_1..x_N, y_1..y_N, z_1..z_N)``, so the RHS is the
    same ``lorenz`` applied to ``(N,)`` rows.
    """
    from scipy.integrate import solve_ivp

    n = params.shape[0]
    rows = tuple(np.ascontiguousarray(params.T))

    def fun(t, y):
        return np.concatenate(lorenz(y.reshape(3, n), rows, t))

    y0 = np.repeat(np.asarray(U0), n)
    return solve_ivp(fun, T_SPAN, y0, method="RK45", t_eval=SAVE_GRID, rtol=tol, atol=tol)


def stacked_final_states(sol, n: int) -> np.ndarray:
    """States at ``t = 10`` of a stacked solve, ``(n, 3)``."""
    return sol.y[:, -1].reshape(3, n).T


class LorenzEnsemble:
    """Wall time and RHS evaluations of an N-trajectory Lorenz ensemble."""

    params: ClassVar[list[int]] = [1_000, 10_000]
    param_names: ClassVar[list[str]] = ["trajectories"]
    timeout = 300

    def setup(self, n):
        try:
            import scipy.integrate  # noqa: F401
        except ImportError as exc:  # asv skips a benchmark whose setup raises NotImplementedError
            raise NotImplementedError("SciPy is not installed") from exc
        self.p = parameters(n)
        run_dxode(self.p[:10])  # warm caches (coefficient arrays, imports)

    def time_dxode_ensemble_array(self, n):
        run_dxode(self.p)

    def time_scipy_stacked_rk45(self, n):
        run_scipy_stacked(self.p)

    def track_rhs_evals_dxode(self, n):
        """Trajectory RHS evaluations, summed over trajectories."""
        return run_dxode(self.p).stats.total_nf

    track_rhs_evals_dxode.unit = "RHS evaluations"

    def track_rhs_evals_scipy_stacked(self, n):
        """Trajectory RHS evaluations: every call of the stacked RHS evaluates all N."""
        return run_scipy_stacked(self.p).nfev * n

    track_rhs_evals_scipy_stacked.unit = "RHS evaluations"


class EnsembleConstruction:
    """The same ensemble from per-trajectory arrays (``p=P``) and from ``prob_func`` +
    ``remake`` (DiffEq style), whose extra cost is one Python call per trajectory."""

    params: ClassVar[list[int]] = [10_000]
    param_names: ClassVar[list[str]] = ["trajectories"]
    timeout = 300

    def setup(self, n):
        self.p = parameters(n)
        run_dxode_prob_func(self.p[:10])  # warm caches

    def time_p_arrays(self, n):
        run_dxode(self.p)

    def time_prob_func_remake(self, n):
        run_dxode_prob_func(self.p)
