"""The discrete adjoint's dense-only FSAL stage, pulled back with the lanes' next first stages
(``dxode.sensitivity.fsal_carry``), against pulling it back in place.

Both are the same discrete adjoint, so they agree to rounding; ``applies`` patched to return
``False`` pulls the stage back in place at every step with a save inside, as before. The
lanes run to t = 1.03 with saves every 0.05, three within 0.001 (inside one step) and at
1.0299 (inside the lanes' last steps, where the stage stays in place).
"""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode
from dxode.sensitivity import bulk_linearization, fsal_carry

from problems import lorenz, lorenz_vjp, lorenz_vjp_lanes

SCALE = np.linspace(0.7, 1.3, 7)[:, None]
THETA = np.array([1.0, 0.5, 0.2, 10.0, 28.0, 8.0 / 3.0])
# Saves every 0.05, three within 0.001 (inside one step), and just before the end (inside the
# lanes' last steps).
SAVES = np.sort([*np.arange(0.0, 1.0, 0.05), 0.5005, 0.501, 1.0299, 1.03])
SOLVE = {"saveat": SAVES, "rtol": 1e-6, "atol": 1e-6}


def lorenz_loss(alg=dxode.Tsit5, vjp=None, shared=False, sensealg=None, batch_size=None):
    """u0 (3 entries) and the parameters: shared by the lanes, or scaled per lane."""

    def loss(theta):
        p = (theta[3], theta[4], theta[5]) if shared else (10.0, 28.0, 8 / 3)
        prob = dxode.ODEProblem(lorenz, theta[:3], (0.0, 1.03), p, vjp=vjp)
        if shared:
            eprob = dxode.EnsembleProblem(prob, u0=theta[None, :3] * SCALE)
        else:
            eprob = dxode.EnsembleProblem(prob, p=theta[None, 3:] * SCALE)
        sim = dxode.solve(
            eprob, alg(), trajectories=7, batch_size=batch_size, sensealg=sensealg, **SOLVE
        )
        return anp.sum(sim.u**2 * np.array([1.0, 2.0, 3.0]))

    return loss


def in_place(monkeypatch, loss, theta):
    """``autograd.grad(loss)(theta)`` with the dense-only stage pulled back in place."""
    with monkeypatch.context() as m:
        m.setattr(fsal_carry, "applies", lambda *args: False)
        return autograd.grad(loss)(theta)


@pytest.fixture
def plans(monkeypatch):
    """The carries and in-place iterations each sweep planned."""
    found = []
    plan = fsal_carry.plan

    def recording(*args, **kwargs):
        result = plan(*args, **kwargs)
        found.append(result[1:])
        return result

    monkeypatch.setattr(fsal_carry, "plan", recording)
    return found


@pytest.mark.parametrize("alg", [dxode.Tsit5, dxode.BS3, dxode.DP5], ids=lambda a: a.__name__)
def test_a_hand_vjp_with_per_lane_parameters_agrees_with_the_stage_in_place(
    monkeypatch, plans, alg
):
    loss = lorenz_loss(alg, lorenz_vjp_lanes)
    g = autograd.grad(loss)(THETA)
    ((carries, kept),) = plans
    assert carries and kept  # both ways ran: carried, and in place at lanes' last steps
    assert any(len(pairs) > 1 for pairs in carries.values())  # two saves inside one step
    np.testing.assert_allclose(g, in_place(monkeypatch, loss, THETA), rtol=1e-12)


@pytest.mark.parametrize(
    "vjp, shared, sensealg, max_state",
    [
        (lorenz_vjp, True, None, None),
        (lorenz_vjp_lanes, False, dxode.DiscreteAdjoint(checkpoint_every=3), None),
        (None, False, None, None),  # autograd, linearized in bulk
        (None, False, dxode.DiscreteAdjoint(checkpoint_every=3), None),
        (None, True, None, 0),  # autograd, one traced VJP per stage and step
    ],
    ids=["hand-shared", "hand-checkpointed", "bulk", "bulk-checkpointed", "traced-shared"],
)
def test_every_sweep_agrees_with_the_stage_in_place(
    monkeypatch, plans, vjp, shared, sensealg, max_state
):
    if max_state is not None:
        monkeypatch.setattr(bulk_linearization, "MAX_STATE", max_state)
    loss = lorenz_loss(vjp=vjp, shared=shared, sensealg=sensealg)
    g = autograd.grad(loss)(THETA)
    assert plans and plans[0][0]
    np.testing.assert_allclose(g, in_place(monkeypatch, loss, THETA), rtol=1e-12)


def test_the_carry_saves_stage_vjps():
    calls = []

    def counting(u, p, t, v):
        calls.append(1)
        return lorenz_vjp_lanes(u, p, t, v)

    autograd.grad(lorenz_loss(vjp=counting))(THETA)
    carried = len(calls)
    calls.clear()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fsal_carry, "applies", lambda *args: False)
        autograd.grad(lorenz_loss(vjp=counting))(THETA)
    assert carried < 0.9 * len(calls)  # Tsit5: 6 VJPs per step instead of 7 with saves


def test_checkpointed_is_bitwise_the_uncheckpointed_one():
    every = dxode.DiscreteAdjoint(checkpoint_every=3)
    for vjp in (lorenz_vjp_lanes, None):
        g = autograd.grad(lorenz_loss(vjp=vjp))(THETA)
        np.testing.assert_array_equal(autograd.grad(lorenz_loss(vjp=vjp, sensealg=every))(THETA), g)


def test_per_lane_cotangents_do_not_depend_on_the_batch_size():
    """Each lane's u0 cotangent, bit for bit, in batches of 7 and of 3 lanes."""

    def loss(u0, batch_size):
        prob = dxode.ODEProblem(
            lorenz, [1.0, 0.0, 0.0], (0.0, 1.03), (10.0, 28.0, 8 / 3), vjp=lorenz_vjp_lanes
        )
        eprob = dxode.EnsembleProblem(prob, u0=u0, p=THETA[None, 3:] * SCALE)
        sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=7, batch_size=batch_size, **SOLVE)
        return anp.sum(sim.u**2)

    u0 = np.outer(np.linspace(0.5, 1.5, 7), THETA[:3])
    whole = autograd.grad(loss)(u0, 7)
    np.testing.assert_array_equal(autograd.grad(loss)(u0, 3), whole)


def blow_up(u, p, t):
    """``u' = p u²``: finite-time blow-up at ``t = 1 / (p u0)``."""
    return p * u * u


def blow_up_vjp(u, p, t, v):
    return 2.0 * p * u * v, (u * u * v)[0]  # p: one scalar per lane, (L,)


def test_failing_lanes_get_nan_and_the_others_agree(monkeypatch):
    """Lanes whose solution blows up before t = 1.03 fail (NaN cotangents); the others'
    agree with the stage pulled back in place."""

    def loss(theta):
        prob = dxode.ODEProblem(blow_up, np.array([1.0]), (0.0, 1.03), 0.1, vjp=blow_up_vjp)
        eprob = dxode.EnsembleProblem(prob, p=theta, u0=np.ones((6, 1)))
        sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=6, **SOLVE)
        return sim.u

    theta = np.array([0.2, 0.5, 0.9, 1.2, 0.4, 2.0])
    jac = autograd.jacobian(lambda th: anp.sum(loss(th), axis=(1, 2)))
    g = jac(theta)
    with monkeypatch.context() as m:
        m.setattr(fsal_carry, "applies", lambda *args: False)
        reference = jac(theta)
    failed = np.diag(np.isnan(g))
    assert failed.any() and not failed.all()
    np.testing.assert_array_equal(np.isnan(g), np.isnan(reference))
    np.testing.assert_allclose(g[~failed][:, ~failed], reference[~failed][:, ~failed], rtol=1e-12)


def test_the_carried_step_sizes_are_taken_trial_by_trial():
    # fsal_carry gathers h at (iteration, position) pairs from each trial in turn: the same
    # values, in the pairs' order, as from one array of every trial's steps.
    from types import SimpleNamespace

    from dxode.integrator.lanes import Trial

    rng = np.random.default_rng(5)
    widths = [5, 5, 3, 4]
    trials = [Trial(np.arange(w), None, rng.random(w), None, None, (), None, None) for w in widths]
    sweep = SimpleNamespace(
        xp=np, trials=trials, _device_index=lambda host: np.asarray(host, dtype=np.int64)
    )
    iteration = np.array([2, 0, 3, 0, 2, 1, 3])
    positions = np.array([1, 4, 0, 2, 2, 3, 3])
    every = np.concatenate([tr.h for tr in trials])
    offsets = np.concatenate([[0], np.cumsum(widths)])
    expected = every[offsets[iteration] + positions]
    np.testing.assert_array_equal(fsal_carry._steps_at(sweep, iteration, positions), expected)
