"""The discrete adjoint's bulk linearization of an autograd-traced f against the per-step sweep.

Both evaluate the same discrete adjoint (the bulk one linearizes f at every recorded stage
input at once), so they agree to rounding; finite differences check the bulk gradient itself.
``MAX_STATE = 0`` forces the per-step sweep.
"""

from __future__ import annotations

import math

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode
from dxode._traced_rhs import TracedRHS
from dxode.sensitivity import bulk_linearization

from problems import lorenz

SCALE = np.linspace(0.8, 1.2, 6)[:, None]
U0 = np.array([1.0, 0.5, 0.2])
THETA = np.array([10.0, 28.0, 8.0 / 3.0])


def lorenz_loss(dtype=np.float64, tol=1e-7, sensealg=None, saveat=0.37, t1=1.0):
    """u0 (3 entries) and a shared parameter vector scaled per trajectory (per-lane leaf)."""

    def loss(theta):
        prob = dxode.ODEProblem(lorenz, theta[:3], (0.0, t1), (10.0, 28.0, 8 / 3))
        eprob = dxode.EnsembleProblem(prob, p=theta[None, 3:] * SCALE.astype(dtype))
        sim = dxode.solve(
            eprob, trajectories=6, saveat=saveat, rtol=tol, atol=tol, sensealg=sensealg
        )
        return anp.sum(sim.u**2 * np.array([1.0, 2.0, 3.0], dtype=dtype))

    return loss


def forced(u, p, t):
    """A non-autonomous linear system with a parameter vector shared by the lanes."""
    a, b = p[0], p[1]
    return anp.stack([-a * u[0] + anp.sin(3.0 * t) * u[1], -b * u[1] + anp.cos(t)])


def forced_loss(theta, tol=1e-11):
    """The shared parameters ``theta[:2]`` and the start state's scale ``theta[2]``."""
    u0 = theta[2] * np.linspace(0.5, 1.5, 5)[:, None] * np.array([1.0, -1.0])
    prob = dxode.ODEProblem(forced, np.array([1.0, -1.0]), (0.0, 2.0), theta[:2])
    eprob = dxode.EnsembleProblem(prob, u0=u0)
    sim = dxode.solve(eprob, trajectories=5, saveat=0.25, rtol=tol, atol=tol)
    return anp.sum(sim.u**3)


def per_step(monkeypatch, func, x):
    """``autograd.grad(func)(x)`` with the per-step sweep."""
    with monkeypatch.context() as m:
        m.setattr(bulk_linearization, "MAX_STATE", 0)
        return autograd.grad(func)(x)


@pytest.fixture
def traces(monkeypatch):
    """Records the traces of f the backward pass makes: ``True`` for a bulk linearization's
    (``linearize`` over a chunk's columns), ``False`` for a per-stage VJP's
    (``TracedRHS.pullback``)."""
    calls = []
    pullback, jacobian = TracedRHS.pullback, bulk_linearization.linearize

    def per_stage(self, *args, **kwargs):
        calls.append(False)
        return pullback(self, *args, **kwargs)

    def bulk(*args, **kwargs):
        calls.append(True)
        return jacobian(*args, **kwargs)

    monkeypatch.setattr(TracedRHS, "pullback", per_stage)
    monkeypatch.setattr(bulk_linearization, "linearize", bulk)
    return calls


def central_difference(func, x, eps):
    return np.array([(func(x + eps * e) - func(x - eps * e)) / (2 * eps) for e in np.eye(len(x))])


@pytest.mark.parametrize("sensealg", [None, dxode.DiscreteAdjoint(checkpoint_every=4)], ids=repr)
def test_lorenz_per_lane_parameters_agree_with_the_per_step_sweep(monkeypatch, traces, sensealg):
    theta = np.concatenate([U0, THETA])
    loss = lorenz_loss(sensealg=sensealg)
    bulk = autograd.grad(loss)(theta)
    n_bulk = len(traces)
    assert n_bulk and all(traces)  # the backward pass traced columns in bulk, only
    traces.clear()
    reference = per_step(monkeypatch, loss, theta)
    assert len(traces) > 20 * n_bulk and not any(traces)  # one trace per stage and step
    np.testing.assert_allclose(bulk, reference, rtol=1e-12)


def test_per_lane_leaves_from_their_jacobian_columns_or_one_vjp(monkeypatch):
    """Per-lane parameter rows up to ``MAX_LANE_ROWS`` are traced with the state (their
    cotangents from the chunk's Jacobian columns); above it one VJP per chunk gives them.
    The same gradient to rounding either way."""
    theta = np.concatenate([U0, THETA])
    loss = lorenz_loss()
    vjps = []
    parameter_vjp = bulk_linearization.parameter_vjp

    def counted(*args, **kwargs):
        vjps.append(args[4])
        return parameter_vjp(*args, **kwargs)

    monkeypatch.setattr(bulk_linearization, "parameter_vjp", counted)
    with_state = autograd.grad(loss)(theta)
    assert not vjps
    monkeypatch.setattr(bulk_linearization, "MAX_LANE_ROWS", 2)  # Lorenz's p: 3 rows per lane
    one_vjp = autograd.grad(loss)(theta)
    assert vjps and all(wrt == [0] for wrt in vjps)
    np.testing.assert_allclose(with_state, one_vjp, rtol=1e-13)


def test_a_matrix_parameter_per_lane(monkeypatch, traces):
    """A ``(2, 2)`` matrix per trajectory (four Jacobian columns each) in ``u' = A u``."""

    def loss(theta):
        a = anp.reshape(theta, (1, 2, 2)) * np.array([1.0, 0.7, 1.3])[:, None, None]
        prob = dxode.ODEProblem(
            lambda u, p, t: anp.einsum("ij...,j...->i...", p, u), U0[:2], (0.0, 1.0), np.eye(2)
        )
        sim = dxode.solve(dxode.EnsembleProblem(prob, p=a), trajectories=3, saveat=0.5, rtol=1e-9)
        return anp.sum(sim.u**2)

    theta = np.array([-0.5, 0.3, -0.2, -0.8])
    bulk = autograd.grad(loss)(theta)
    assert traces and all(traces)
    np.testing.assert_allclose(bulk, per_step(monkeypatch, loss, theta), rtol=1e-12)
    np.testing.assert_allclose(bulk, central_difference(loss, theta, 1e-6), rtol=1e-6)


def test_chunks_of_many_iterations_and_of_one_agree(monkeypatch):
    """Chunk size changes only the grouping of the sums (and saves lie inside steps)."""
    theta = np.concatenate([U0, THETA])
    loss = lorenz_loss()
    small = autograd.grad(loss)(theta)
    monkeypatch.setattr(bulk_linearization, "CHUNK_BYTES", 2**30)  # one chunk in all
    np.testing.assert_allclose(autograd.grad(loss)(theta), small, rtol=1e-13)


def test_lorenz_gradient_against_central_differences():
    theta = np.concatenate([U0, THETA])
    loss = lorenz_loss(tol=1e-10, saveat=0.25, t1=0.5)
    g = autograd.grad(loss)(theta)
    np.testing.assert_allclose(g, central_difference(loss, theta, 1e-6), rtol=1e-6)


def test_non_autonomous_f_with_shared_parameters(monkeypatch, traces):
    theta = np.array([0.7, 1.3, 0.9])
    bulk = autograd.grad(forced_loss)(theta)
    assert all(traces)
    np.testing.assert_allclose(bulk, per_step(monkeypatch, forced_loss, theta), rtol=1e-12)
    np.testing.assert_allclose(bulk, central_difference(forced_loss, theta, 1e-6), rtol=1e-6)


def test_shared_and_per_lane_leaves_together(monkeypatch):
    """A pytree ``(shared, per-lane)``: one leaf's cotangent summed, the other's per lane."""

    def f(u, p, t):
        shared, lanes = p
        return anp.stack([-shared[0] * u[0] + lanes[0] * u[1], -shared[1] * u[1] * u[0]])

    def loss(theta):
        prob = dxode.ODEProblem(f, np.array([1.0, 0.5]), (0.0, 1.0), (theta[:2], theta[2:3]))

        def remake(prob_, i, repeat):
            return prob_.remake(p=(theta[:2], theta[2:3] * (0.5 + i / 4)))

        eprob = dxode.EnsembleProblem(prob, prob_func=remake)
        sim = dxode.solve(eprob, trajectories=4, saveat=0.5, rtol=1e-8)
        return anp.sum(sim.u**2)

    theta = np.array([0.4, 1.1, 0.8])
    bulk = autograd.grad(loss)(theta)
    np.testing.assert_allclose(bulk, per_step(monkeypatch, loss, theta), rtol=1e-12)


def test_float32(monkeypatch):
    theta = np.concatenate([U0, THETA]).astype(np.float32)
    loss = lorenz_loss(dtype=np.float32, tol=1e-5, saveat=0.5)
    bulk = autograd.grad(loss)(theta)
    assert bulk.dtype == np.float32
    reference = per_step(monkeypatch, loss, theta)
    np.testing.assert_allclose(bulk, reference, rtol=1e-4)


def test_larger_states_use_the_per_step_sweep(monkeypatch, traces):
    """Above ``MAX_STATE`` components the per-step sweep runs; below it the bulk one."""
    a = np.array([[-1.0, 0.3, 0.0, 0.1], [0.0, -0.5, 0.2, 0.0], [0.1, 0.0, -0.7, 0.3]])
    a = np.vstack([a, [0.0, 0.2, 0.0, -0.4]])

    def loss(theta):
        prob = dxode.ODEProblem(lambda u, p, t: p * anp.dot(a, u), U0[[0, 1, 2, 0]], (0, 1), theta)
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, u0=np.linspace(0.5, 1.5, 3)[:, None] * np.ones(4)),
            trajectories=3,
            saveat=0.5,
            rtol=1e-8,
        )
        return anp.sum(sim.u**2)

    theta = np.array(1.3)
    monkeypatch.setattr(bulk_linearization, "MAX_STATE", 3)
    g = autograd.grad(loss)(theta)
    assert traces and not any(traces)
    traces.clear()
    monkeypatch.setattr(bulk_linearization, "MAX_STATE", 4)
    bulk = autograd.grad(loss)(theta)
    assert traces and all(traces)
    np.testing.assert_allclose(bulk, g, rtol=1e-12)


def single_loss(f, tol=1e-9, sensealg=None):
    """One trajectory: its start state ``theta[:2]`` and parameters ``theta[2:]``."""

    def loss(theta):
        prob = dxode.ODEProblem(f, theta[:2], (0.0, 3.0), (theta[2], theta[3]))
        sol = dxode.solve(prob, saveat=0.25, rtol=tol, atol=tol, sensealg=sensealg)
        return anp.sum(sol.u[:, 0] ** 2) + anp.sum(sol.u[-1])

    return loss


def forced_oscillator(u, p, t):
    x, v = u
    k, c = p
    return [v, -k * x - c * v + anp.sin(2.0 * t)]


def rotated(u, p, t):
    """``A(p) @ u`` written for one state: also right on columns."""
    a = anp.array([[0.0, 1.0], [-p[0], -p[1]]])
    return a @ u + anp.stack([0.0 * t, anp.cos(t)])


SINGLE = np.array([1.0, 0.0, 2.0, 0.3])


@pytest.mark.parametrize("f", [forced_oscillator, rotated])
@pytest.mark.parametrize("sensealg", [None, dxode.DiscreteAdjoint(checkpoint_every=3)], ids=repr)
def test_a_single_trajectory_is_linearized_in_bulk_where_f_takes_columns(
    monkeypatch, traces, f, sensealg
):
    """f written for one state takes the bulk sweep where it computes columns one by one."""
    loss = single_loss(f, sensealg=sensealg)
    bulk = autograd.grad(loss)(SINGLE)
    assert traces and all(traces)
    traces.clear()
    reference = per_step(monkeypatch, loss, SINGLE)
    assert traces and not any(traces)
    np.testing.assert_allclose(bulk, reference, rtol=1e-12)
    np.testing.assert_allclose(bulk, central_difference(loss, SINGLE, 1e-6), rtol=1e-6)


def branchy(u, p, t):
    """A branch on a value (never taken here: the gradient stays that of a smooth f)."""
    x, v = u
    return [v, -p[0] * x - (p[1] * v if x > -100.0 else 0.0)]


def mixing(u, p, t):
    """``anp.sum(u)`` sums one state, but all columns at once: not one by one."""
    x, v = u
    return [v, -p[0] * x - p[1] * v - 0.1 * anp.sum(u)]


def scalar_time(u, p, t):
    x, v = u
    return [v, -p[0] * x - p[1] * v + math.sin(float(t))]


@pytest.mark.parametrize("f", [branchy, mixing, scalar_time])
def test_a_single_trajectory_whose_f_takes_one_state_keeps_the_per_step_sweep(traces, f):
    """A branch on a value, a sum over the state, a scalar-only time: the per-step sweep
    runs (each of these fails or mixes columns when handed many), and its gradient is right."""
    loss = single_loss(f)
    gradient = autograd.grad(loss)(SINGLE)
    assert False in traces  # stage by stage
    np.testing.assert_allclose(gradient, central_difference(loss, SINGLE, 1e-6), rtol=1e-6)


def regime(u, p, t):
    """Decay whose law changes inside the unit circle, read off a sum over the state: on
    columns the sum covers all of them, so one branch for all."""
    r2 = anp.sum(u**2)
    return -p[0] * u if r2 > 1.0 else -p[0] * u * r2


@pytest.mark.parametrize("sensealg", [None, dxode.DiscreteAdjoint(checkpoint_every=3)], ids=repr)
def test_an_f_whose_branch_changes_late_in_the_trajectory_keeps_the_per_step_sweep(
    monkeypatch, traces, sensealg
):
    # The trajectory starts outside the circle and ends inside. The check of f on columns
    # took the first iterations' stage inputs only, all outside, so it passed, and the bulk
    # chunks (sums over all their columns, > 1) took the outer branch for every column: the
    # gradient of the outer decay alone, 5x off, silently.
    def loss(theta):
        prob = dxode.ODEProblem(regime, theta[:2], (0.0, 3.0), (theta[2],))
        sol = dxode.solve(prob, saveat=[3.0], rtol=1e-10, atol=1e-10, sensealg=sensealg)
        return anp.sum(sol.u)

    theta = np.array([1.5, 1.0, 1.0])
    gradient = autograd.grad(loss)(theta)
    assert False in traces  # stage by stage
    np.testing.assert_allclose(gradient, per_step(monkeypatch, loss, theta), rtol=1e-12)
    # f's Jacobian jumps at the circle: the steps across it keep the discrete derivative
    # 5e-4 (relative) from central differences
    np.testing.assert_allclose(gradient, central_difference(loss, theta, 1e-6), rtol=2e-3)


def spike(u, p, t):
    """An oscillator pushed back only above ``x = 0.95``, read off a maximum over the state:
    on columns the maximum covers all of them, so one branch for all."""
    x, v = u[0], u[1]
    push = p[1] * (x - 0.95) ** 3 if anp.max(x) > 0.95 else 0.0 * x
    return anp.stack([v, -p[0] * x - push])


@pytest.mark.parametrize("sensealg", [None, dxode.DiscreteAdjoint(checkpoint_every=3)], ids=repr)
@pytest.mark.parametrize("method", [dxode.Tsit5, dxode.BS3])
def test_an_f_whose_branch_changes_briefly_keeps_the_per_step_sweep(
    monkeypatch, traces, sensealg, method
):
    # The peak (x = 0.951 near t = 1.8) lies above 0.95 for a few steps between the stage
    # inputs the probe of f on columns samples, so the probe passed, and the bulk chunk
    # holding the peak took the pushed branch for all its columns: a gradient 40x off,
    # silently. The chunk's values of f now rebuild the recorded stage inputs only where
    # they are the forward pass's.
    def loss(theta):
        prob = dxode.ODEProblem(spike, theta[:2], (0.0, 4.0), (theta[2], theta[3]))
        sol = dxode.solve(prob, method(), saveat=[4.0], rtol=1e-10, atol=1e-10, sensealg=sensealg)
        return anp.sum(sol.u)

    theta = np.array([-0.2168, 0.926, 1.0, 3.0])
    gradient = autograd.grad(loss)(theta)
    assert False in traces  # stage by stage
    np.testing.assert_allclose(gradient, per_step(monkeypatch, loss, theta), rtol=1e-12)
    difference = central_difference(loss, theta, 1e-6)
    np.testing.assert_allclose(gradient[:3], difference[:3], rtol=1e-6)
    assert abs(gradient[3]) < 1e-9  # the push (cubed) moves the end state by ~1e-11 only


def test_matrix_state_and_lanes_that_end_at_different_times(monkeypatch):
    """A ``(2, 2)`` state per lane, and spans that retire lanes early (the working set
    shrinks between iterations of one chunk)."""

    def f(u, p, t):
        return -p[0] * u + p[1] * anp.sin(u[::-1, ...])

    def loss(theta):
        prob = dxode.ODEProblem(f, np.array([[1.0, 0.5], [-0.3, 0.8]]), (0.0, 1.0), theta)
        tspan = np.stack([np.zeros(4), np.array([0.4, 1.0, 0.7, 1.2])], axis=1)
        eprob = dxode.EnsembleProblem(prob, tspan=tspan)
        sim = dxode.solve(eprob, trajectories=4, saveat=[0.2, 0.4], rtol=1e-9, atol=1e-9)
        return anp.sum(sim.u**2)

    theta = np.array([0.6, 0.9])
    bulk = autograd.grad(loss)(theta)
    np.testing.assert_allclose(bulk, per_step(monkeypatch, loss, theta), rtol=1e-12)
    np.testing.assert_allclose(bulk, central_difference(loss, theta, 1e-6), rtol=1e-6)


def test_the_per_step_sweep_where_f_is_wide_and_lanes_many(monkeypatch, traces):
    """A wide hidden layer over many lanes costs more as ``n + 1`` copies per column than
    autograd's per-call overhead saves (``bulk_linearization.pays``): the per-step sweep runs;
    with two lanes the bulk one does. Either way the same gradient to rounding."""
    weights = np.random.default_rng(0).standard_normal((64, 2)) * 0.3

    def f(u, p, t):
        return anp.dot(weights.T, anp.tanh(anp.dot(weights, u))) * p[0] - p[1] * u

    def loss(theta, lanes):
        prob = dxode.ODEProblem(f, np.array([1.0, -0.5]), (0.0, 0.5), theta)
        u0 = np.linspace(0.5, 1.5, lanes)[:, None] * np.array([1.0, -0.5])
        sim = dxode.solve(dxode.EnsembleProblem(prob, u0=u0), trajectories=lanes, saveat=0.25)
        return anp.sum(sim.u**2)

    theta = np.array([0.4, 0.8])
    for lanes, bulk in ((400, False), (2, True)):
        traces.clear()
        g = autograd.grad(loss)(theta, lanes)
        assert traces and all(traces) == bulk and any(traces) == bulk
        reference = per_step(monkeypatch, lambda th, n=lanes: loss(th, n), theta)
        np.testing.assert_allclose(g, reference, rtol=1e-12)


def test_rows_that_are_constant_or_depend_on_parameters_only(monkeypatch, traces):
    """``f`` returns a list of rows: one a Python number, one the (per-lane) parameter alone
    (no state in either, so zero rows of the state Jacobian). A projectile's height
    ``x0 + v0 t - g t² / 2``: the gradient in closed form."""

    def f(u, p, t):
        return [u[1], -p[0], 0.0]

    times = np.array([0.25, 0.5, 1.0])

    def loss(theta):
        prob = dxode.ODEProblem(f, anp.array([theta[0], theta[1], 1.0]), (0.0, 1.0), theta[2:])
        eprob = dxode.EnsembleProblem(prob, p=theta[None, 2:] * np.array([[1.0], [2.0]]))
        sim = dxode.solve(eprob, trajectories=2, saveat=times, rtol=1e-8)
        return anp.sum(sim.u[:, :, 0] * np.array([[1.0], [3.0]]))

    theta = np.array([0.3, 2.0, 9.81])
    bulk = autograd.grad(loss)(theta)
    assert traces and all(traces)
    exact = np.array([4 * 3, 4 * np.sum(times), -np.sum(times**2) / 2 * (1 + 3 * 2)])
    np.testing.assert_allclose(bulk, exact, rtol=1e-12)
    np.testing.assert_allclose(bulk, per_step(monkeypatch, loss, theta), rtol=1e-12)


def test_a_plain_numpy_function_in_f_names_the_fix(traces):
    """``np.stack`` (not ``anp.stack``) hides the state from autograd: the bulk linearization
    says so, as the per-step sweep does, instead of returning a wrong gradient."""

    def f(u, p, t):
        return np.stack([u[1], -p[0] * u[0]])

    def loss(theta):
        prob = dxode.ODEProblem(f, np.array([1.0, 0.0]), (0.0, 1.0), theta)
        eprob = dxode.EnsembleProblem(prob, p=theta[None, :] * np.array([[1.0], [2.0]]))
        return anp.sum(dxode.solve(eprob, trajectories=2, saveat=0.5).u)

    with pytest.raises(TypeError, match="plain `numpy` function"):
        autograd.grad(loss)(np.array([1.5]))
    assert traces and all(traces)


def _fills_an_array(u, p, t):
    du = np.empty(2)
    du[0] = u[1]
    du[1] = -p[0] * u[0]
    return du


def test_an_f_writing_traced_values_into_an_array_names_the_fix():
    # NumPy's own "setting an array element with a sequence" came out of the traced f.
    def loss(theta):
        prob = dxode.ODEProblem(_fills_an_array, np.array([1.0, 0.0]), (0.0, 1.0), theta)
        return anp.sum(dxode.solve(prob, saveat=[1.0]).u)

    with pytest.raises(TypeError, match=r"wrote one into a NumPy array \(du\[0\] = \.\.\.\)"):
        autograd.grad(loss)(np.array([2.0]))


@pytest.mark.parametrize("per_lane", [False, True], ids=["shared", "per-trajectory"])
def test_an_f_converting_a_traced_parameter_to_a_number_names_the_fix(per_lane):
    # np.float64(p[0]) on a traced parameter: the bulk linearization let NumPy's own
    # "setting an array element with a sequence" out, where the per-step sweep names the fix.
    def f(u, p, t):
        return [u[1], -np.float64(p[0]) * u[0]]

    def loss(theta):
        prob = dxode.ODEProblem(f, np.array([1.0, 0.0]), (0.0, 1.0), theta)
        per_trajectory = {"p": theta[None, :] * np.array([[1.0], [2.0]])} if per_lane else {}
        eprob = dxode.EnsembleProblem(prob, **per_trajectory)
        return anp.sum(dxode.solve(eprob, trajectories=2, saveat=0.5).u)

    with pytest.raises(TypeError, match="plain `numpy` function"):
        autograd.grad(loss)(np.array([1.5]))
