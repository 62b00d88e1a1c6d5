"""Gradients through solve on inputs at the edges: right-hand sides that ignore the state,
lanes that fail, ... each checked against a closed form or central differences."""

from __future__ import annotations

import dataclasses

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode


def _drift(u, p, t):  # u(t) = u0 + (p0 t, p1 t^2 / 2): f does not depend on u
    return anp.array([p[0] + 0.0 * t, p[1] * t])


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Rodas5P()], ids=["Tsit5", "Rodas5P"])
def test_forward_sensitivity_of_a_state_independent_rhs_warns_nothing(alg):
    """autograd warns "Output seems independent of input" for a forward-mode product of an
    ``f`` that ignores ``u``; the gradient is right and the warning (an error under
    ``filterwarnings = error``) must not reach the user."""

    def loss(theta):
        prob = dxode.ODEProblem(_drift, theta[:2], (0.0, 1.0), (theta[2], theta[3]))
        sol = dxode.solve(
            prob, alg, saveat=[1.0], rtol=1e-10, atol=1e-10, sensealg=dxode.ForwardSensitivity()
        )
        return anp.sum(sol.u**2)

    theta = np.array([1.0, 0.5, 0.3, 0.7])
    end = theta[:2] + np.array([theta[2], theta[3] / 2])
    expected = np.concatenate([2 * end, 2 * end * np.array([1.0, 0.5])])
    np.testing.assert_allclose(autograd.grad(loss)(theta), expected, rtol=1e-8)


@pytest.mark.parametrize("sensealg", [None, dxode.ForwardSensitivity()], ids=["default", "forward"])
def test_ensemble_with_per_trajectory_tspans_and_no_saveat_differentiates_its_ends(sensealg):
    """Without gradients such an ensemble saves each trajectory's ends (``t`` is
    ``(trajectories, 2)``); a differentiated one saves the same, as it does with callbacks."""

    def decay(u, p, t):
        return -p[0] * u

    def solve(theta):
        prob = dxode.ODEProblem(decay, [theta[1]], (0.0, 1.0), (theta[0],))
        eprob = dxode.EnsembleProblem(
            prob, prob_func=lambda prob, i, repeat: prob.remake(tspan=(0.1 * i, 1.0 + 0.2 * i))
        )
        return dxode.solve(
            eprob, dxode.Tsit5(), trajectories=3, rtol=1e-10, atol=1e-12, sensealg=sensealg
        )

    theta = np.array([0.7, 1.3])
    plain = solve(theta)
    spans = np.array([[0.1 * i, 1.0 + 0.2 * i] for i in range(3)])
    gradient = autograd.grad(lambda th: anp.sum(solve(th).u[:, -1, 0]))(theta)
    lengths = spans[:, 1] - spans[:, 0]
    ends = theta[1] * np.exp(-theta[0] * lengths)
    np.testing.assert_array_equal(plain.t, spans)
    np.testing.assert_allclose(plain.u[:, -1, 0], ends, rtol=1e-8)
    np.testing.assert_allclose(
        gradient, [np.sum(-lengths * ends), np.sum(ends) / theta[1]], rtol=1e-8
    )


def _oscillator(u, p, t):
    return [u[1], -p[0] * u[0]]


def _vjp_without_p_bar(u, p, t, v):  # forgot p_bar: its two rows unpack as (u_bar, p_bar)
    return np.array([-p[0] * v[1], v[0]])


def _vjp_wrong_shape(u, p, t, v):
    return np.array([-p[0] * v[1], v[0], 0.0]), (np.sum(-u[0] * v[1]),)


@pytest.mark.parametrize("vjp", [_vjp_without_p_bar, _vjp_wrong_shape])
@pytest.mark.parametrize(
    "sensealg",
    [None, dxode.DiscreteAdjoint(checkpoint_every=2), dxode.InterpolatingAdjoint()],
    ids=["default", "checkpointed", "interpolating"],
)
def test_a_user_vjp_that_does_not_return_u_bar_shaped_like_u_is_refused(vjp, sensealg):
    """A ``vjp`` must return ``(u_bar, p_bar)`` with ``u_bar`` shaped like ``u``; one that
    returned the state's rows alone gave a silently wrong gradient."""

    def loss(theta):
        prob = dxode.ODEProblem(_oscillator, [theta[0], 0.0], (0.0, 1.0), (theta[1],), vjp=vjp)
        sol = dxode.solve(prob, saveat=[1.0], rtol=1e-8, atol=1e-8, sensealg=sensealg)
        return anp.sum(sol.u**2)

    with pytest.raises(ValueError, match=r"vjp\(u, p, t, v\) must return \(u_bar, p_bar\)"):
        autograd.grad(loss)(np.array([1.0, 2.0]))


def test_a_user_vjp_ensemble_u_bar_is_checked_against_the_lanes():
    def vjp(u, p, t, v):  # per-lane p: one cotangent per lane; u_bar lacks the lane axis
        return np.array([-p[0] * v[1], v[0]])[:, 0], np.array([-u[0] * v[1]])

    def loss(theta):
        prob = dxode.ODEProblem(_oscillator, [1.0, 0.0], (0.0, 1.0), (2.0,), vjp=vjp)
        eprob = dxode.EnsembleProblem(prob, p=theta[:, None])
        sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=2, saveat=[1.0])
        return anp.sum(sim.u**2)

    with pytest.raises(ValueError, match=r"u_bar shaped like u"):
        autograd.grad(loss)(np.array([1.0, 2.0]))


@pytest.mark.parametrize(
    "sensealg", [None, dxode.InterpolatingAdjoint()], ids=["default", "interpolating"]
)
def test_a_user_vjp_p_bar_for_per_trajectory_p_must_keep_the_lanes(sensealg):
    """Per-trajectory parameters need one cotangent per lane; a ``p_bar`` summed over the
    lanes (the form for a shared ``p``) was broadcast to every lane: a wrong gradient."""

    def summed(u, p, t, v):
        return [-p[0] * v[1], v[0]], (np.sum(-u[0] * v[1]),)

    def loss(theta):
        prob = dxode.ODEProblem(_oscillator, [1.0, 0.0], (0.0, 1.0), (2.0,), vjp=summed)
        eprob = dxode.EnsembleProblem(prob, p=theta[:, None])
        sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=3, saveat=[1.0], sensealg=sensealg)
        return anp.sum(sim.u**2)

    with pytest.raises(ValueError, match=r"p_bar.* one cotangent per trajectory"):
        autograd.grad(loss)(np.array([1.0, 2.0, 3.0]))


def test_a_user_vjp_p_bar_with_too_few_leaves_is_refused():
    def short(u, p, t, v):
        return [-p[0] * v[1], v[0]], ()

    def loss(theta):
        prob = dxode.ODEProblem(_oscillator, [1.0, 0.0], (0.0, 1.0), (theta[0],), vjp=short)
        return anp.sum(dxode.solve(prob, saveat=[1.0]).u ** 2)

    with pytest.raises(ValueError, match=r"p holds 1 items here, its p_bar a tuple of 0 items"):
        autograd.grad(loss)(np.array([2.0]))


def _lorenz(u, p, t):
    x, y, z = u
    return [p[0] * (y - x), x * (p[1] - z) - y, x * y - p[2] * z]


def _lorenz_vjp_tuple(u, p, t, v):  # p an array (3,) shared by the lanes: a tuple of sums
    x, y, z = u
    vx, vy, vz = v
    u_bar = [-p[0] * vx + (p[1] - z) * vy + y * vz, p[0] * vx - vy + x * vz, -x * vy - p[2] * vz]
    return u_bar, (np.sum((y - x) * vx), np.sum(x * vy), np.sum(-z * vz))


@pytest.mark.parametrize("ensemble", [False, True], ids=["single", "ensemble"])
def test_a_user_vjp_may_give_an_array_leaf_cotangent_as_a_tuple_of_rows(ensemble):
    """``p`` an array ``(3,)``, ``p_bar`` a tuple of its three entries' cotangents: each is
    its own entry's (only sigma's was used, broadcast to all three: a wrong gradient)."""

    def loss(theta, vjp=None):
        prob = dxode.ODEProblem(_lorenz, [1.0, 0.0, 0.0], (0.0, 0.5), theta, vjp=vjp)
        if not ensemble:
            return anp.sum(dxode.solve(prob, saveat=[0.5], rtol=1e-10, atol=1e-10).u ** 2)
        eprob = dxode.EnsembleProblem(prob, u0=np.array([[1.0, 0.0, 0.0], [1.1, 0.0, 0.0]]))
        sim = dxode.solve(
            eprob, dxode.Tsit5(), trajectories=2, saveat=[0.5], rtol=1e-10, atol=1e-10
        )
        return anp.sum(sim.u**2)

    theta = np.array([10.0, 28.0, 8.0 / 3.0])
    by_hand = autograd.grad(lambda th: loss(th, _lorenz_vjp_tuple))(theta)
    np.testing.assert_allclose(by_hand, autograd.grad(loss)(theta), rtol=1e-10)


def test_a_user_vjp_p_bar_summed_for_a_shared_array_leaf_is_refused():
    def vjp(u, p, t, v):  # p an array (3,): one scalar instead of three
        return _lorenz_vjp_tuple(u, p, t, v)[0], np.sum(v)

    def loss(theta):
        prob = dxode.ODEProblem(_lorenz, [1.0, 0.0, 0.0], (0.0, 0.5), theta, vjp=vjp)
        return anp.sum(dxode.solve(prob, saveat=[0.5]).u ** 2)

    with pytest.raises(ValueError, match=r"leaf 0 of p has shape \(3,\)"):
        autograd.grad(loss)(np.array([10.0, 28.0, 8.0 / 3.0]))


def test_a_user_vjp_may_return_no_p_bar_when_only_u0_is_differentiated():
    def vjp(u, p, t, v):
        return [-p[0] * v[1], v[0]], None

    def loss(theta):
        prob = dxode.ODEProblem(_oscillator, [theta[0], 0.0], (0.0, 1.0), (4.0, 1.0), vjp=vjp)
        return dxode.solve(prob, saveat=[1.0], rtol=1e-10, atol=1e-10).u[-1, 0]

    np.testing.assert_allclose(autograd.grad(loss)(np.array([1.5])), [np.cos(2.0)], rtol=1e-8)


def _decay_pair(u, p, t):
    return anp.array([-p[0] * u[0], -p[1] * u[1]])


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Rodas5P()], ids=["Tsit5", "Rodas5P"])
@pytest.mark.parametrize("ensemble", [False, True], ids=["single", "ensemble"])
def test_forward_sensitivity_takes_a_per_component_atol(alg, ensemble):
    """A state-shaped ``atol`` did not broadcast to the augmented state ``[u, S_1, ...]``:
    ``ValueError: operands could not be broadcast together with shapes (2,1) (14,1)`` from
    the integrator's first step. Each sensitivity now takes its state component's atol."""
    atol = np.array([1e-10, 1e-12])

    def loss(theta):
        prob = dxode.ODEProblem(_decay_pair, theta[:2], (0.0, 1.5), (theta[2], theta[3]))
        if ensemble:
            prob = dxode.EnsembleProblem(prob, u0=anp.stack([theta[:2], 2.0 * theta[:2]]))
        options = {"saveat": [1.5], "rtol": 1e-10, "atol": atol}
        sol = dxode.solve(prob, alg, sensealg=dxode.ForwardSensitivity(), **options)
        return anp.sum(sol.u**2)

    theta = np.array([1.0, 0.5, 0.7, 0.3])
    u0, k = theta[:2], theta[2:]
    scale = 5.0 if ensemble else 1.0  # the second trajectory starts at 2 u0
    decay = np.exp(-2 * k * 1.5)
    expected = scale * np.concatenate([2 * u0 * decay, -2 * 1.5 * u0**2 * decay])
    np.testing.assert_allclose(autograd.grad(loss)(theta), expected, rtol=1e-8)


def _decay(u, p, t):
    return -p[0] * u


@pytest.mark.parametrize("with_dose", [False, True], ids=["plain", "dose"])
def test_float32_every_step_output_ends_at_a_t1_float32_cannot_hold(with_dose):
    """Without ``saveat`` a differentiated solve saves the steps of the solve without
    gradients, whose times are float32: float32(1.1) lies past t1 = 1.1, and was refused as
    a save time "outside tspan (0.1, 1.1)" the user never gave."""
    dose = dxode.PresetTimeCallback([1.1], lambda u, p, t, fired: u + 1.0)
    callback = dose if with_dose else None

    def solve(theta):
        prob = dxode.ODEProblem(_decay, theta[:1], (0.1, 1.1), theta[1:])
        return dxode.solve(prob, callback=callback, rtol=1e-6, atol=1e-7)

    theta = np.array([1.0, 0.5], dtype=np.float32)
    plain = solve(theta)
    kept = []
    gradient = autograd.grad(lambda x: kept.append(solve(x)) or kept[-1].u[-1, 0])(theta)
    np.testing.assert_array_equal(kept[0].t, plain.t)
    np.testing.assert_allclose(autograd.tracer.getval(kept[0].u), plain.u, rtol=1e-6)
    np.testing.assert_allclose(gradient, [np.exp(-0.5), -np.exp(-0.5)], rtol=1e-5)


@dataclasses.dataclass
class _Rates:
    k: object


def test_a_differentiated_value_inside_an_object_in_p_is_named():
    # dxode looks into tuples, lists and dicts of p only: a dataclass holding the traced rate
    # was refused as "a closure; pass it in p", although it was passed in p.
    def loss(k):
        prob = dxode.ODEProblem(lambda u, p, t: -p.k * u, np.array([1.0]), (0.0, 1.0), _Rates(k))
        return anp.sum(dxode.solve(prob, saveat=[1.0]).u)

    with pytest.raises(TypeError, match=r"dataclass.*tuple, list or dict"):
        autograd.grad(loss)(0.5)
