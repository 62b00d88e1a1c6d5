"""The lane integrator: a lane's result never depends on the batch around it.

These tests drive the integrator directly with batches of lanes (states ``(n, L)``), the way
the ensemble layer does, and compare every lane with the same trajectory solved alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import dxode
from dxode._options import SolverOptions
from dxode.backends import backend_for
from dxode.integrator.loop import LaneProblem, integrate

from conftest import to_numpy


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def lane_lorenz(u, t, params):
    # Indexing rather than `x, y, z = u`: array_api_strict forbids iterating 2-D arrays.
    sigma, rho, beta = (params[0][i, ...] for i in range(3))
    x, y, z = (u[i, ...] for i in range(3))
    xp = backend_for(u).xp
    return xp.stack([sigma * (y - x), x * (rho - z) - y, x * y - beta * z])


def _params(n_lanes, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([10.0, 28.0, 8 / 3])[:, None] * (1 + 0.2 * (rng.random((3, n_lanes)) - 0.5))


def _solve_batch(xp, params, t1, saveat, **options):
    n = params.shape[1]
    backend = backend_for(xp.asarray([0.0]))
    u0 = xp.asarray(np.tile([[1.0], [0.0], [0.0]], (1, n)))
    lanes = LaneProblem(
        rhs_for=lambda p: lambda u, t, out=None: lane_lorenz(u, t, p),
        u0=u0,
        t0=xp.zeros(n, dtype=xp.float64),
        t1=xp.asarray(t1, dtype=xp.float64),
        params=(xp.asarray(params),),
        save_times=xp.asarray(np.tile(np.asarray(saveat)[:, None], (1, n))),
    )
    return integrate(lanes, SolverOptions.from_user(dxode.Tsit5(), **options), backend)


def _solve_alone(params, t1, saveat, xp=np, **options):
    """One trajectory solved on its own, on ``xp`` (a GPU's arithmetic differs from the CPU's
    in the last bits: CuPy's kernels contract ``a * b + c`` into FMAs)."""
    p = tuple(float(v) for v in params)
    prob = dxode.ODEProblem(lorenz, xp.asarray([1.0, 0.0, 0.0]), (0.0, t1), p)
    return dxode.solve(prob, dxode.Tsit5(), saveat=saveat, **options)


def test_each_lane_equals_its_trajectory_solved_alone_bitwise(xp):
    params = _params(24)
    saveat = np.linspace(0, 10, 11)
    batch = _solve_batch(xp, params, np.full(24, 10.0), saveat, rtol=1e-6, atol=1e-6)
    saved = to_numpy(batch.saved)
    for lane in [0, 5, 23]:
        alone = _solve_alone(params[:, lane], 10.0, saveat, xp, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(saved[lane], to_numpy(alone.u))
        assert int(batch.naccept[lane]) == alone.stats.naccept
        assert int(batch.nreject[lane]) == alone.stats.nreject
        assert int(batch.nf[lane]) == alone.stats.nf


def test_results_do_not_depend_on_batch_size_or_order():
    params = _params(40, seed=1)
    saveat = np.linspace(0, 5, 6)
    full = _solve_batch(np, params, np.full(40, 5.0), saveat, rtol=1e-7, atol=1e-7)
    order = np.random.default_rng(2).permutation(40)
    shuffled = _solve_batch(np, params[:, order], np.full(40, 5.0), saveat, rtol=1e-7, atol=1e-7)
    np.testing.assert_array_equal(shuffled.saved, full.saved[order])
    half = _solve_batch(np, params[:, :7], np.full(7, 5.0), saveat, rtol=1e-7, atol=1e-7)
    np.testing.assert_array_equal(half.saved, full.saved[:7])


def test_lanes_keep_their_own_step_sizes():
    params = _params(8, seed=3)
    params[1, 0] = 0.5  # rho = 0.5: a quiet, non-chaotic lane that needs few steps
    batch = _solve_batch(np, params, np.full(8, 10.0), np.array([10.0]), rtol=1e-6, atol=1e-6)
    assert int(batch.naccept[0]) < int(np.min(batch.naccept[1:])) / 3


def test_per_lane_end_times_and_retirement():
    params = _params(16, seed=4)
    t1 = np.linspace(1.0, 8.0, 16)
    batch = _solve_batch(np, params, t1, np.array([0.0, 1.0]), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(batch.t, t1)
    for lane in [0, 9, 15]:
        alone = _solve_alone(params[:, lane], float(t1[lane]), [0.0, 1.0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(batch.saved[lane], alone.u)


def test_a_failing_lane_does_not_stop_the_others():
    params = _params(6, seed=5)
    params[0, 2] = np.nan  # sigma = NaN: this lane's RHS is NaN from the first stage on
    batch = _solve_batch(
        np, params, np.full(6, 2.0), np.array([0.0, 1.0, 2.0]), rtol=1e-6, atol=1e-6
    )
    codes = [dxode.ReturnCode(int(c)) for c in batch.retcode]
    assert codes[2] == dxode.ReturnCode.Unstable
    assert all(c == dxode.ReturnCode.Success for i, c in enumerate(codes) if i != 2)
    assert np.all(np.isnan(batch.saved[2, 1:]))
    alone = _solve_alone(params[:, 3], 2.0, [0.0, 1.0, 2.0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(batch.saved[3], alone.u)


@pytest.mark.parametrize("n_lanes", [1, 3, 300])
def test_maxiters_is_per_lane(n_lanes):
    params = _params(n_lanes, seed=6)
    batch = _solve_batch(np, params, np.full(n_lanes, 50.0), np.array([50.0]), maxiters=20)
    assert np.all(batch.retcode == int(dxode.ReturnCode.MaxIters))
    assert np.all(batch.naccept + batch.nreject == 20)
