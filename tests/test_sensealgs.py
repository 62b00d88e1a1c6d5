"""Every sensitivity algorithm against finite differences, against each other, in ensembles."""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode

from problems import lorenz, lorenz_jac, lorenz_paramjac, lorenz_vjp

SENSEALGS = [
    dxode.DiscreteAdjoint(),
    dxode.DiscreteAdjoint(checkpoint_every=3),
    dxode.InterpolatingAdjoint(),
    dxode.BacksolveAdjoint(),
    dxode.ForwardSensitivity(),
]
CONTINUOUS = [dxode.InterpolatingAdjoint(), dxode.BacksolveAdjoint(), dxode.ForwardSensitivity()]


def central_difference(func, x, eps=1e-6):
    return np.array([(func(x + eps * e) - func(x - eps * e)) / (2 * eps) for e in np.eye(len(x))])


def forced_decay(u, p, t):
    return -p * u + anp.sin(t)


def decay_loss(sensealg, dtype=np.float64, tol=1e-10, alg=None):
    def loss(theta):
        prob = dxode.ODEProblem(forced_decay, theta[:2], (0.0, 2.0), theta[2:])
        sol = dxode.solve(prob, alg, saveat=0.5, rtol=tol, atol=tol, sensealg=sensealg)
        return anp.sum(sol.u[1:] ** 3) + anp.sum(sol.u[0])

    return loss


THETA = np.array([1.0, -0.5, 0.7, 1.3])


@pytest.mark.parametrize("sensealg", SENSEALGS, ids=repr)
def test_every_sensealg_matches_finite_differences(sensealg):
    # u0 and an array parameter, through every save point (t0 included).
    loss = decay_loss(sensealg)
    np.testing.assert_allclose(
        autograd.grad(loss)(THETA), central_difference(loss, THETA), rtol=1e-6
    )


@pytest.mark.parametrize("sensealg", CONTINUOUS, ids=repr)
def test_lorenz_gradients_agree_across_sensealgs(sensealg):
    # Continuous methods are accurate to the tolerance; the discrete adjoint at a tight one
    # is the reference. Shared scalar leaves of a tuple parameter.
    def make(alg, tol):
        def loss(theta):
            prob = dxode.ODEProblem(lorenz, theta[:3], (0.0, 1.0), (theta[3], theta[4], theta[5]))
            sol = dxode.solve(prob, saveat=[0.0, 0.5, 1.0], rtol=tol, atol=tol, sensealg=alg)
            return anp.sum(sol.u**2 * np.array([1.0, 2.0, 3.0]))

        return loss

    theta = np.array([1.0, 0.5, 0.2, 10.0, 28.0, 8.0 / 3.0])
    reference = autograd.grad(make(dxode.DiscreteAdjoint(), 1e-11))(theta)
    g = autograd.grad(make(sensealg, 1e-8))(theta)
    np.testing.assert_allclose(g, reference, rtol=1e-4)


def test_checkpointed_discrete_adjoint_is_bitwise_the_uncheckpointed_one():
    def make(alg, build_ensemble):
        def loss(theta):
            prob = dxode.ODEProblem(lorenz, theta[:3], (0.0, 1.5), (10.0, 28.0, 8 / 3))
            if not build_ensemble:
                sol = dxode.solve(prob, saveat=0.5, rtol=1e-7, atol=1e-7, sensealg=alg)
                return anp.sum(sol.u**2)
            scale = np.linspace(0.8, 1.2, 5)[:, None]
            eprob = dxode.EnsembleProblem(prob, p=theta[None, 3:] * scale)
            sim = dxode.solve(eprob, trajectories=5, saveat=0.5, rtol=1e-7, atol=1e-7, sensealg=alg)
            return anp.sum(sim.u**2)

        return loss

    theta = np.array([1.0, 0.5, 0.2, 10.0, 28.0, 8.0 / 3.0])
    for ensemble in (False, True):
        full = autograd.grad(make(dxode.DiscreteAdjoint(), ensemble))(theta)
        for every in (1, 4, 7):
            alg = dxode.DiscreteAdjoint(checkpoint_every=every)
            checkpointed = autograd.grad(make(alg, ensemble))(theta)
            np.testing.assert_array_equal(checkpointed, full)


@pytest.mark.parametrize("sensealg", SENSEALGS, ids=repr)
def test_float32_gradients(sensealg):
    loss = decay_loss(sensealg, tol=1e-5)
    theta = THETA.astype(np.float32)
    g = autograd.grad(loss)(theta)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, autograd.grad(decay_loss(None, tol=1e-10))(THETA), rtol=2e-3)


@pytest.mark.parametrize("sensealg", [dxode.DiscreteAdjoint(checkpoint_every=2), *CONTINUOUS])
def test_fixed_step_and_other_methods(sensealg):
    loss = decay_loss(sensealg, alg=dxode.RK4(), tol=1e-3)
    g = autograd.grad(lambda th: loss(th))
    with pytest.raises(ValueError, match="needs a step size"):
        g(THETA)
    fixed = dxode.ODEProblem(forced_decay, THETA[:2], (0.0, 2.0), THETA[2:])

    def rk4_loss(theta):
        prob = fixed.remake(u0=theta[:2], p=theta[2:])
        sol = dxode.solve(prob, dxode.RK4(), saveat=0.5, dt=0.01, sensealg=sensealg)
        return anp.sum(sol.u[1:] ** 3) + anp.sum(sol.u[0])

    np.testing.assert_allclose(
        autograd.grad(rk4_loss)(THETA), central_difference(rk4_loss, THETA), rtol=1e-6
    )
    vern7 = decay_loss(sensealg, alg=dxode.Vern7())  # an interpolant with extra stages
    np.testing.assert_allclose(
        autograd.grad(vern7)(THETA), central_difference(vern7, THETA), rtol=1e-6
    )


def _ensemble_loss(ensemble_alg, build, sensealg, tol=1e-8):
    def loss(theta):
        sim = dxode.solve(
            build(theta),
            dxode.Tsit5(),
            ensemble_alg,
            trajectories=3,
            batch_size=2,
            saveat=0.25,
            rtol=tol,
            atol=tol,
            sensealg=sensealg,
        )
        return anp.sum(sim.u[:, -1, :] ** 2) + anp.sum(sim.u[:, 1, 0])

    return loss


def _per_trajectory_arrays(theta):
    scale = 1 + 0.1 * (np.random.default_rng(0).random((3, 3)) - 0.5)
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 0.5), (10.0, 28.0, 8 / 3))
    return dxode.EnsembleProblem(
        prob, p=theta[None, :3] * scale, u0=anp.outer(np.linspace(0.5, 1.5, 3), theta[3:])
    )


def _shared_parameters(theta):
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 0.5), (theta[0], theta[1], theta[2]))
    return dxode.EnsembleProblem(
        prob, prob_func=lambda prob, i, repeat: prob.remake(u0=theta[3:] * (0.5 + i / 3))
    )


@pytest.mark.parametrize("sensealg", SENSEALGS[1:], ids=repr)
@pytest.mark.parametrize(
    "build", [_per_trajectory_arrays, _shared_parameters], ids=["arrays", "shared"]
)
def test_ensemble_gradients_for_every_sensealg(sensealg, build):
    theta = np.array([10.0, 28.0, 8.0 / 3.0, 1.0, 0.5, 0.2])
    reference = autograd.grad(_ensemble_loss(dxode.EnsembleArray(), build, None, 1e-11))(theta)
    array = autograd.grad(_ensemble_loss(dxode.EnsembleArray(), build, sensealg))(theta)
    exact = isinstance(sensealg, dxode.DiscreteAdjoint)  # else accurate to the tolerance
    if exact:
        np.testing.assert_allclose(array, reference, rtol=1e-6)
    else:  # to the tolerance, relative to the gradient's size
        np.testing.assert_allclose(array, reference, atol=1e-5 * np.max(np.abs(reference)))
    serial = autograd.grad(_ensemble_loss(dxode.EnsembleSerial(), build, sensealg))(theta)
    # Lane by lane the same arithmetic: per-lane inputs bitwise, shared ones summed in another
    # order (last bits).
    np.testing.assert_allclose(serial, array, rtol=1e-12)


@pytest.mark.parametrize("sensealg", SENSEALGS, ids=repr)
def test_failed_lanes_give_nan_gradients(sensealg):
    def loss(theta):
        prob = dxode.ODEProblem(lambda u, p, t: u * u * p[0], [1.0], (0.0, 2.0), [1.0])
        eprob = dxode.EnsembleProblem(prob, p=theta[:, None], u0=np.ones((3, 1)))
        sim = dxode.solve(eprob, trajectories=3, saveat=[0.5, 2.0], sensealg=sensealg)
        return anp.sum(sim.u[:, 0])  # only the first save point, which every lane reaches

    g = autograd.grad(loss)(np.array([-1.0, 1.0, -2.0]))  # the middle lane blows up at t = 1
    assert np.isnan(g[1])
    assert np.all(np.isfinite(g[[0, 2]]))


def test_backsolve_caveat_on_a_chaotic_horizon():
    # Integrating Lorenz backward amplifies the forward error along the contracting
    # direction (about e^(14 t)): already on [0, 1.5] the backsolved gradient is off by
    # about 200 %, while the interpolating adjoint agrees with forward sensitivities to 1e-6
    # (on [0, 2] backsolve is off 700x; from t = 4 it returns NaN). The docs say to trust
    # InterpolatingAdjoint or DiscreteAdjoint on such problems.
    def make(alg):
        def loss(theta):
            prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.5), (theta[0], 28.0, 8 / 3))
            sol = dxode.solve(prob, saveat=0.5, rtol=1e-6, atol=1e-6, sensealg=alg)
            return anp.sum(sol.u**2)

        return loss

    theta = np.array([10.0])
    reference = autograd.grad(make(dxode.ForwardSensitivity()))(theta)
    interpolating = autograd.grad(make(dxode.InterpolatingAdjoint()))(theta)
    np.testing.assert_allclose(interpolating, reference, rtol=1e-4)
    backsolve = autograd.grad(make(dxode.BacksolveAdjoint()))(theta)
    assert np.abs(backsolve - reference) / np.abs(reference) > 0.2


def test_a_hand_written_vjp_serves_the_adjoints():
    def loss(theta, vjp, alg):
        prob = dxode.ODEProblem(
            lorenz, theta[:3], (0.0, 1.0), (theta[3], theta[4], theta[5]), vjp=vjp
        )
        sol = dxode.solve(prob, saveat=[0.5, 1.0], rtol=1e-8, atol=1e-8, sensealg=alg)
        return anp.sum(sol.u**2)

    theta = np.array([1.0, 0.5, 0.2, 10.0, 28.0, 8.0 / 3.0])
    for alg in (dxode.InterpolatingAdjoint(), dxode.BacksolveAdjoint()):
        by_hand = autograd.grad(lambda th, alg=alg: loss(th, lorenz_vjp, alg))(theta)
        traced = autograd.grad(lambda th, alg=alg: loss(th, None, alg))(theta)
        # The same derivatives with different rounding steer the adaptive backward solve
        # differently within its tolerance (1e-8): agreement to ~1e-10, not to the last bit.
        np.testing.assert_allclose(by_hand, traced, rtol=1e-8)


def test_a_vjp_may_return_the_state_cotangent_as_rows():
    def rows_vjp(u, p, t, v):
        u_bar, p_bar = lorenz_vjp(u, p, t, v)
        return list(u_bar), p_bar

    def loss(theta, vjp):
        prob = dxode.ODEProblem(lorenz, theta[:3], (0.0, 1.0), tuple(theta[3:]), vjp=vjp)
        eprob = dxode.EnsembleProblem(prob, u0=theta[:3, None] * np.array([1.0, 1.1, 0.9]))
        return anp.sum(dxode.solve(eprob, trajectories=3, saveat=[0.3, 1.0]).u ** 2)

    theta = np.array([1.0, 0.5, 0.2, 10.0, 28.0, 8.0 / 3.0])
    by_rows = autograd.grad(lambda th: loss(th, rows_vjp))(theta)
    np.testing.assert_array_equal(by_rows, autograd.grad(lambda th: loss(th, lorenz_vjp))(theta))


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.DP5(), dxode.BS3()], ids=repr)
def test_the_discrete_adjoint_differentiates_the_plain_solve(alg):
    """Save points inside steps come from the dense output, so a differentiated solve takes
    the steps of a plain one and returns its numbers; its gradient runs through the
    interpolant: with fixed steps (so that the computed solution is smooth in u0) it is the
    central difference of the plain solve to 1e-8."""
    p = np.array([10.0, 28.0, 8.0 / 3.0])
    saveat = [0.05, 0.31, 0.5, 0.77, 1.0]

    def solve(u0, **step):
        prob = dxode.ODEProblem(lorenz, u0, (0.0, 1.0), p)
        return dxode.solve(prob, alg, saveat=saveat, **step)

    u0 = np.array([1.0, 0.5, 0.2])
    plain = solve(u0, rtol=1e-6, atol=1e-6)
    traced = []

    def loss(x, **step):
        traced.append(solve(x, **step))
        return anp.sum(traced[-1].u ** 2)

    autograd.grad(lambda x: loss(x, rtol=1e-6, atol=1e-6))(u0)
    np.testing.assert_array_equal(autograd.tracer.getval(traced[0].u), plain.u)
    np.testing.assert_array_equal(traced[0].stats.naccept, plain.stats.naccept)
    fixed = {"dt": 0.02, "adaptive": False}
    g = autograd.grad(lambda x: loss(x, **fixed))(u0)
    eps = 1e-6
    fd = [
        (np.sum(solve(u0 + eps * e, **fixed).u ** 2) - np.sum(solve(u0 - eps * e, **fixed).u ** 2))
        / (2 * eps)
        for e in np.eye(3)
    ]
    np.testing.assert_allclose(g, fd, rtol=1e-8)


@pytest.mark.parametrize(
    "sensealg",
    [dxode.DiscreteAdjoint(), dxode.InterpolatingAdjoint(), dxode.ForwardSensitivity()],
    ids=repr,
)
def test_jac_and_paramjac_stand_in_for_autograd(sensealg):
    # A single problem (u0 and shared scalar leaves), and ensembles with per-lane parameters
    # and with a parameter tuple shared by the lanes: the same gradients as autograd's.
    scale = 1 + 0.1 * (np.random.default_rng(2).random((6, 3)) - 0.5)

    def single(theta, **derivatives):
        prob = dxode.ODEProblem(lorenz, theta[:3], (0.0, 1.0), tuple(theta[3:]), **derivatives)
        sol = dxode.solve(prob, saveat=[0.5, 1.0], rtol=1e-8, atol=1e-8, sensealg=sensealg)
        return anp.sum(sol.u**2)

    def ensemble(theta, shared, **derivatives):
        p = (theta[3], theta[4], theta[5]) if shared else (10.0, 28.0, 8.0 / 3.0)
        prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), p, **derivatives)
        if shared:
            eprob = dxode.EnsembleProblem(prob, u0=theta[None, :3] * scale)
        else:
            eprob = dxode.EnsembleProblem(prob, p=theta[None, 3:] * scale)
        sim = dxode.solve(
            eprob, trajectories=6, saveat=0.5, rtol=1e-8, atol=1e-8, sensealg=sensealg
        )
        return anp.sum(sim.u**2)

    theta = np.array([1.0, 0.5, 0.2, 10.0, 28.0, 8.0 / 3.0])
    derivatives = {"jac": lorenz_jac, "paramjac": lorenz_paramjac}
    for loss in (
        single,
        lambda th, **d: ensemble(th, True, **d),
        lambda th, **d: ensemble(th, False, **d),
    ):
        by_jacobians = autograd.grad(lambda th, loss=loss: loss(th, **derivatives))(theta)
        traced = autograd.grad(loss)(theta)
        np.testing.assert_allclose(by_jacobians, traced, rtol=1e-10)


def test_paramjac_of_the_wrong_shape_is_named():
    def loss(theta):
        prob = dxode.ODEProblem(
            lorenz,
            theta,
            (0.0, 1.0),
            (10.0, 28.0, 8.0 / 3.0),
            jac=lorenz_jac,
            paramjac=lambda u, p, t: [[1.0, 0.0]] * 3,
        )
        return anp.sum(dxode.solve(prob, saveat=[1.0]).u)

    with pytest.raises(ValueError, match=r"paramjac.*rows of 3 entries"):
        autograd.grad(loss)(np.array([1.0, 0.0, 0.0]))


def test_bad_sensealgs_raise_clearly():
    prob = dxode.ODEProblem(forced_decay, [1.0, 2.0], (0.0, 1.0), np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="sensealg must be DiscreteAdjoint"):
        dxode.solve(prob, sensealg="adjoint")
    for bad in (0, 2.0, True, np.int64(-3)):
        with pytest.raises(ValueError, match="checkpoint_every must be a positive integer"):
            dxode.DiscreteAdjoint(checkpoint_every=bad)
    # a NumPy integer (e.g. from np.sqrt(steps).astype(int)) is taken, as an int
    assert dxode.DiscreteAdjoint(checkpoint_every=np.int64(4)).checkpoint_every == 4
    assert type(dxode.DiscreteAdjoint(checkpoint_every=np.int64(4)).checkpoint_every) is int

    def loss(theta):
        eprob = dxode.EnsembleProblem(
            prob, tspan=np.array([[0.0, 1.0], [0.0, 2.0]]), p=anp.outer([1.0, 2.0], theta)
        )
        sim = dxode.solve(
            eprob, trajectories=2, saveat=[0.5], sensealg=dxode.InterpolatingAdjoint()
        )
        return anp.sum(sim.u)

    with pytest.raises(NotImplementedError, match="one tspan shared by all trajectories"):
        autograd.grad(loss)(np.array([1.0, 1.0]))

    def plain_numpy_loss(theta):
        eprob = dxode.EnsembleProblem(prob, p=np.outer([1.0, 2.0], theta))
        return anp.sum(dxode.solve(eprob, trajectories=2, saveat=[0.5]).u)

    with pytest.raises(TypeError, match="plain `numpy` function"):
        autograd.grad(plain_numpy_loss)(np.array([1.0, 1.0]))


def test_a_save_point_that_ends_some_steps_and_lies_inside_others(monkeypatch):
    # Trajectories ending at t = 1 save t = 1 at the end of their last step (θ = 1); those
    # running to t = 2 pass it inside a step, often in the same iteration: one save round
    # mixing both, whose cotangents split between u_{n+1} and the dense output.
    from dxode.sensitivity import discrete_adjoint

    mixed = []
    save_cotangents = discrete_adjoint._Sweep._save_cotangents

    def spy(self, j):
        for _, _, weights, at_end in self.rounds.get(j, ()):
            mixed.append(weights is not None and at_end.any() and not at_end.all())
        return save_cotangents(self, j)

    monkeypatch.setattr(discrete_adjoint._Sweep, "_save_cotangents", spy)
    n = 16
    spans = np.stack([np.zeros(n), np.where(np.arange(n) % 2 == 0, 1.0, 2.0)], axis=1)

    def loss(theta, sensealg):
        prob = dxode.ODEProblem(forced_decay, np.array([1.0, 2.0]), (0.0, 2.0), theta)
        eprob = dxode.EnsembleProblem(prob, tspan=spans, p=anp.outer(1 + 0.1 * np.arange(n), theta))
        sim = dxode.solve(
            eprob, trajectories=n, saveat=[0.25, 0.5, 1.0], rtol=1e-9, atol=1e-9, sensealg=sensealg
        )
        return anp.sum(sim.u**2)

    theta = np.array([1.0, 0.5])
    discrete = autograd.grad(lambda th: loss(th, dxode.DiscreteAdjoint()))(theta)
    assert any(mixed)
    forward = autograd.grad(lambda th: loss(th, dxode.ForwardSensitivity()))(theta)
    np.testing.assert_allclose(discrete, forward, rtol=1e-8)
