"""The step value and the integrator's replay mode (what the discrete adjoint re-takes)."""

from __future__ import annotations

import numpy as np
import pytest

import dxode
from dxode._options import SolverOptions
from dxode.backends import backend_for
from dxode.integrator.loop import LaneProblem, integrate
from dxode.integrator.replay import replay
from dxode.solvers import ALGORITHMS, Step

N_LANES = 8


def forced_lorenz(u, t, params):
    # Forced (time-dependent), so a replay that evaluated f at the wrong times would show.
    sigma, rho, beta = (params[0][i, ...] for i in range(3))
    x, y, z = (u[i, ...] for i in range(3))
    return np.stack([sigma * (y - x) + np.sin(t), x * (rho - z) - y, x * y - beta * z])


def _rhs_for(params):
    return lambda u, t, out=None: forced_lorenz(u, t, params)


def _params():
    rng = np.random.default_rng(4)
    scale = 1 + 0.2 * (rng.random((3, N_LANES)) - 0.5)
    return np.array([10.0, 28.0, 8 / 3])[:, None] * scale


def _trials(alg, checkpoint_every):
    """Every iteration's trial steps of a batch whose lanes end at very different times (so
    the loop retires and compacts lanes between iterations)."""
    backend = backend_for(np.asarray([0.0]))
    problem = LaneProblem(
        rhs_for=_rhs_for,
        u0=np.tile([[1.0], [0.0], [0.0]], (1, N_LANES)),
        t0=np.zeros(N_LANES),
        t1=np.linspace(0.5, 4.0, N_LANES),
        params=(_params(),),
        record_steps="trials",
        checkpoint_every=checkpoint_every,
    )
    options = SolverOptions.from_user(alg, rtol=1e-6, atol=1e-6)
    return backend, options, integrate(problem, options, backend).trials


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.BS3(), dxode.Vern7()], ids=repr)
def test_replay_retakes_every_recorded_iteration_bitwise(alg):
    backend, options, kept = _trials(alg, checkpoint_every=0)  # stage inputs kept
    _, _, checkpointed = _trials(alg, checkpoint_every=1)  # only (u, f) before each iteration
    assert len(kept) == len(checkpointed)
    sizes = [int(trial.lane.shape[0]) for trial in checkpointed]
    assert len(set(sizes)) > 2, "the batch must be compacted during the run"
    params = _params()

    def rhs_at(i):
        return _rhs_for((params[:, checkpointed[i].lane],))

    def keep_at(i):
        before, now = checkpointed[i - 1].lane, checkpointed[i].lane
        return None if before.shape == now.shape else np.searchsorted(before, now)

    stepper = options.alg.configure(options.rtol, options.atol)
    inputs = replay(backend, stepper, checkpointed, rhs_at, keep_at)
    assert len(inputs) == len(kept)
    for replayed, trial in zip(inputs, kept, strict=True):
        for a, b in zip(replayed, trial.inputs, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_step_interpolates_from_its_start_to_its_end_and_its_lanes_can_be_taken(name):
    stepper = ALGORITHMS[name]().configure(1e-6, 1e-6)
    backend = backend_for(np.asarray([0.0]))
    params = _params()
    rhs = _rhs_for((params,))
    u0 = np.tile([[1.0], [2.0], [3.0]], (1, N_LANES))
    t = np.zeros(N_LANES)
    h = np.linspace(0.01, 0.02, N_LANES)
    result = stepper.step(backend, rhs, t, u0, rhs(u0, t), h)
    step = Step(stepper, backend, rhs, t, h, u0, result.u1, result.stages)
    np.testing.assert_array_equal(step.interpolate(np.zeros(N_LANES)), u0)
    np.testing.assert_array_equal(step.interpolate(np.ones(N_LANES)), result.u1)
    idx = np.array([1, 4, 6])
    theta = np.full(N_LANES, 0.375)
    some = step.take(idx, _rhs_for((params[:, idx],)))
    np.testing.assert_array_equal(some.u0, u0[:, idx])
    np.testing.assert_array_equal(some.interpolate(theta[idx]), step.interpolate(theta)[:, idx])
