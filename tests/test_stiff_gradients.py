"""Gradients through stiff solves (Rodas5P, Rodas4, Rosenbrock23, TRBDF2).

InterpolatingAdjoint (the default for stiff methods) and ForwardSensitivity integrate their
augmented systems with the same stiff method and exact Jacobians; both are checked against
central differences of tight plain solves on Robertson (rate constants in log space) and
Van der Pol (mu = 100 ... 1000), against each other, in float32, in ensembles with per-lane
stiffness, and the unsupported sensealgs raise clearly.
"""

from __future__ import annotations

import functools

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode

from matrix import STIFF

SUPPORTED = [dxode.InterpolatingAdjoint(), dxode.ForwardSensitivity()]


def central_difference(func, x, eps):
    return np.array([(func(x + eps * e) - func(x - eps * e)) / (2 * eps) for e in np.eye(len(x))])


def robertson(u, p, t):
    """Robertson's kinetics with log rate constants ``p = log(k1, k2, k3)``."""
    y1, y2, y3 = u
    k1, k2, k3 = anp.exp(p[0]), anp.exp(p[1]), anp.exp(p[2])
    return [-k1 * y1 + k3 * y2 * y3, k1 * y1 - k3 * y2 * y3 - k2 * y2 * y2, k2 * y2 * y2]


def robertson_jac(u, p, t):
    y1, y2, y3 = u
    k1, k2, k3 = np.exp(p[0]), np.exp(p[1]), np.exp(p[2])
    zero = 0.0 * y1
    return [
        [-k1 + zero, k3 * y3, k3 * y2],
        [k1 + zero, -k3 * y3 - 2 * k2 * y2, -k3 * y2],
        [zero, 2 * k2 * y2, zero],
    ]


def robertson_paramjac(u, p, t):
    """df/d(log k): one column per log rate constant."""
    y1, y2, y3 = u
    k1, k2, k3 = np.exp(p[0]), np.exp(p[1]), np.exp(p[2])
    zero = 0.0 * y1
    return [
        [-k1 * y1, zero, k3 * y2 * y3],
        [k1 * y1, -k2 * y2 * y2, -k3 * y2 * y3],
        [zero, k2 * y2 * y2, zero],
    ]


def vdp(u, p, t):
    x, y = u
    return [y, p[0] * ((1 - x * x) * y - x)]


LOG_K = np.log([0.04, 3e7, 1e4])


def robertson_loss(alg, sensealg, rtol, jac=None, paramjac=None):
    # d/d(log k) of a weighted sum of y1 and y2 (y2 ~ 3e-5 is scaled up) at two times.
    def loss(theta):
        prob = dxode.ODEProblem(
            robertson, [1.0, 0.0, 0.0], (0.0, 0.3), theta, jac=jac, paramjac=paramjac
        )
        sol = dxode.solve(prob, alg, saveat=[0.1, 0.3], rtol=rtol, atol=1e-12, sensealg=sensealg)
        return anp.sum(sol.u[:, 0]) + 1e4 * anp.sum(sol.u[:, 1])

    return loss


def vdp_loss(alg, sensealg, rtol, dtype=np.float64):
    # d/d(x0, y0, mu) of x and y at two times; log mu is differentiated.
    def loss(theta):
        prob = dxode.ODEProblem(vdp, theta[:2], (0.0, 0.4), anp.exp(theta[2:]))
        sol = dxode.solve(
            prob, alg, saveat=[0.2, 0.4], rtol=rtol, atol=rtol * 1e-2, sensealg=sensealg
        )
        return anp.sum(sol.u[:, 0] ** 2) + anp.sum(sol.u[:, 1] * np.array([1e-3, 2e-3], dtype))

    return loss


VDP_THETA = np.array([2.0, -0.5, np.log(300.0)])
ENSEMBLE_THETA = np.array([1.0, *np.log([10.0, 100.0, 1000.0])])


@functools.cache
def reference(name):
    """Central differences of tight plain solves (computed once per module)."""
    if name == "robertson":
        return central_difference(robertson_loss(dxode.Rodas5P(), None, 1e-11), LOG_K, 1e-5)
    if name == "vdp":
        return central_difference(vdp_loss(dxode.Rodas5P(), None, 1e-10), VDP_THETA, 1e-6)
    loss = _ensemble_loss(dxode.EnsembleArray(), None, 1e-9)
    return central_difference(loss, ENSEMBLE_THETA, 1e-6)


@pytest.mark.parametrize("sensealg", SUPPORTED, ids=repr)
def test_robertson_gradients_match_central_differences(sensealg):
    grad = autograd.grad(robertson_loss(dxode.Rodas5P(), sensealg, 1e-6))(LOG_K)
    np.testing.assert_allclose(grad, reference("robertson"), rtol=1e-3)


@pytest.mark.parametrize(
    "alg",
    [
        alg() if alg is dxode.Rodas5P else pytest.param(alg(), marks=pytest.mark.slow)
        for alg in STIFF
    ],
    ids=repr,
)
def test_van_der_pol_gradients_match_central_differences(alg):
    # To the tolerance: the small d/d(log mu) is the least accurate component (the adjoint's
    # quadrature of g), a 2nd-order method's global error is several times its rtol.
    second_order = isinstance(alg, (dxode.Rosenbrock23, dxode.TRBDF2))
    rtol = 1e-5 if second_order else 1e-6
    scale = np.max(np.abs(reference("vdp")))
    for sensealg in SUPPORTED:
        grad = autograd.grad(vdp_loss(alg, sensealg, rtol))(VDP_THETA)
        np.testing.assert_allclose(
            grad, reference("vdp"), rtol=1e-3, atol=1e-4 * scale * second_order
        )


def test_interpolating_adjoint_is_the_default_for_stiff_methods():
    loss = vdp_loss(dxode.Rodas4(), None, 1e-6)
    explicit = vdp_loss(dxode.Rodas4(), dxode.InterpolatingAdjoint(), 1e-6)
    np.testing.assert_array_equal(
        autograd.grad(loss)(VDP_THETA), autograd.grad(explicit)(VDP_THETA)
    )


def test_jacobian_sources_agree():
    # The problem's jac, autograd and difference Jacobians in the forward pass (and in J of
    # the sensitivity system), and jac with paramjac in place of autograd's derivatives of
    # f, give the same gradient to the tolerance.
    base = reference("robertson")
    for alg, jac, paramjac in (
        (dxode.Rodas5P(), robertson_jac, None),
        (dxode.Rodas5P(), robertson_jac, robertson_paramjac),
        (dxode.Rodas5P(autodiff="finite_difference"), None, None),
    ):
        for sensealg in SUPPORTED:
            grad = autograd.grad(robertson_loss(alg, sensealg, 1e-5, jac, paramjac))(LOG_K)
            np.testing.assert_allclose(grad, base, rtol=1e-3)


def test_float32_gradients():
    # To the solve's rtol (1e-4) of the gradient's scale: d/d(log mu) is 2,600x smaller than
    # d/dx0, and InterpolatingAdjoint's quadrature misses it by 5-8 % in float32 and by 12 %
    # in float64 at the same rtol: the tolerance, not the precision, sets that error.
    theta = VDP_THETA.astype(np.float32)
    rtol = 1e-4
    scale = np.max(np.abs(reference("vdp")))
    for sensealg in SUPPORTED:
        grad = autograd.grad(vdp_loss(dxode.Rodas5P(), sensealg, rtol, np.float32))(theta)
        assert grad.dtype == np.float32
        np.testing.assert_allclose(grad, reference("vdp"), rtol=2e-2, atol=rtol * scale)


def _ensemble_loss(ensemble_alg, sensealg, rtol=1e-6):
    # Van der Pol with mu = 10, 100, 1000 (per-lane stiffness), a shared u0 scale and per-lane
    # log mu: theta = [scale, log mu_1, log mu_2, log mu_3].
    def loss(theta):
        prob = dxode.ODEProblem(vdp, [2.0, 0.0], (0.0, 0.4), [1.0])
        eprob = dxode.EnsembleProblem(
            prob,
            u0=anp.outer(np.array([1.0, 0.9, 1.1]), anp.array([1.0, -0.2]) * theta[0]),
            p=anp.exp(theta[1:])[:, None],
        )
        sim = dxode.solve(
            eprob,
            dxode.Rodas5P(),
            ensemble_alg,
            trajectories=3,
            batch_size=2,
            saveat=[0.2, 0.4],
            rtol=rtol,
            atol=rtol * 1e-2,
            sensealg=sensealg,
        )
        return anp.sum(sim.u[:, :, 0] ** 2) + 1e-3 * anp.sum(sim.u[:, -1, 1])

    return loss


@pytest.mark.parametrize("sensealg", SUPPORTED, ids=repr)
def test_ensemble_with_per_lane_stiffness(sensealg):
    theta = ENSEMBLE_THETA
    array = autograd.grad(_ensemble_loss(dxode.EnsembleArray(), sensealg))(theta)
    serial = autograd.grad(_ensemble_loss(dxode.EnsembleSerial(), sensealg))(theta)
    # Lane by lane the same arithmetic: per-lane inputs bitwise, the shared one summed in
    # another order (last bits).
    np.testing.assert_array_equal(serial[1:], array[1:])
    np.testing.assert_allclose(serial[0], array[0], rtol=1e-13)
    np.testing.assert_allclose(array, reference("ensemble"), rtol=1e-3)


@pytest.mark.parametrize(
    ("sensealg", "match"),
    [
        (dxode.DiscreteAdjoint(), "derivative of the Jacobian inside every step"),
        (dxode.DiscreteAdjoint(checkpoint_every=4), "InterpolatingAdjoint"),
        (dxode.BacksolveAdjoint(), "backward in time is unstable"),
    ],
    ids=repr,
)
def test_unsupported_sensealgs_raise_clearly(sensealg, match):
    with pytest.raises(NotImplementedError, match=match):
        autograd.grad(vdp_loss(dxode.Rodas5P(), sensealg, 1e-6))(VDP_THETA)
    # Ensembles too.
    with pytest.raises(NotImplementedError, match=match):
        autograd.grad(_ensemble_loss(dxode.EnsembleArray(), sensealg))(np.zeros(4))


@pytest.mark.parametrize("events", [False, True], ids=["tspans", "events"])
def test_per_trajectory_spans_name_only_a_sensealg_that_takes_stiff_methods(events):
    # The default InterpolatingAdjoint needs one span for all trajectories (with events:
    # segments on one span); the refusal named DiscreteAdjoint() too, which refuses Rodas5P.
    drop = dxode.ContinuousCallback(lambda u, p, t: u[0] - 1.9, lambda u, p, t, fired: u)

    def loss(theta, sensealg=None):
        prob = dxode.ODEProblem(vdp, theta[:2], (0.0, 0.4), (300.0,))
        if events:  # the lanes cross x = 1.9 at different times
            eprob = dxode.EnsembleProblem(prob, u0=anp.stack([theta, theta * np.array([0.99, 1])]))
        else:
            eprob = dxode.EnsembleProblem(prob, tspan=np.array([[0.0, 0.4], [0.0, 0.3]]))
        sim = dxode.solve(
            eprob,
            dxode.Rodas5P(),
            trajectories=2,
            callback=drop if events else None,
            sensealg=sensealg,
        )
        return anp.sum(sim.u)

    with pytest.raises(NotImplementedError, match=r"ForwardSensitivity\(\) \(DiscreteAdjoint"):
        autograd.grad(loss)(VDP_THETA[:2])
    fixed = autograd.grad(lambda theta: loss(theta, dxode.ForwardSensitivity()))(VDP_THETA[:2])
    assert np.all(np.isfinite(fixed))


def test_solves_without_gradients_are_unchanged():
    # Only traced solves take the sensitivity path: a plain stiff solve is untouched.
    prob = dxode.ODEProblem(vdp, VDP_THETA[:2], (0.0, 0.4), [300.0])
    sol = dxode.solve(prob, dxode.Rodas5P(), saveat=[0.4], sensealg=dxode.DiscreteAdjoint())
    assert sol.retcode == dxode.ReturnCode.Success


def test_augmented_systems_keep_the_method_settings():
    # The augmented systems take the assembled Jacobian (autodiff "auto"); every other setting
    # of the user's method (here TRBDF2's Newton tolerance and iteration limit) is kept.
    from dxode._options import SolverOptions
    from dxode.sensitivity.augmented_jacobians import augmented_options

    method = dxode.TRBDF2(autodiff="finite_difference", kappa=0.05, max_iters=7)
    alg = augmented_options(SolverOptions.from_user(method)).alg
    assert isinstance(alg, dxode.TRBDF2) and alg is not method
    assert (alg.autodiff, alg.kappa, alg.max_iters) == ("auto", 0.05, 7)
    assert method.autodiff == "finite_difference"  # the user's instance is unchanged
