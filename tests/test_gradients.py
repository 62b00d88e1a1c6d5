"""Gradients through solve (discrete adjoint under autograd) against finite differences."""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode

from problems import lorenz, lorenz_vjp, lorenz_vjp_lanes

P0 = (10.0, 28.0, 8.0 / 3.0)


def central_difference(func, x, eps=1e-6):
    return np.array([(func(x + eps * e) - func(x - eps * e)) / (2 * eps) for e in np.eye(len(x))])


def lorenz_loss(alg, **options):
    def loss(theta):
        prob = dxode.ODEProblem(lorenz, theta[:3], (0.0, 1.0), (theta[3], theta[4], theta[5]))
        sol = dxode.solve(prob, alg, saveat=[0.0, 0.5, 1.0], **options)
        return anp.sum(sol.u**2 * np.array([1.0, 2.0, 3.0]))

    return loss


THETA = np.array([1.0, 0.5, 0.2, 10.0, 28.0, 8.0 / 3.0])


@pytest.mark.parametrize(
    ("alg", "tol", "agreement"),
    [
        (dxode.Tsit5(), 1e-10, 2e-5),
        (dxode.DP5(), 1e-10, 2e-5),
        (dxode.Vern7(), 1e-10, 2e-5),
        (dxode.BS3(), 1e-8, 1e-3),
    ],  # third order: looser tolerance, looser agreement with FD
    ids=repr,
)
def test_adaptive_gradients_match_finite_differences(alg, tol, agreement):
    loss = lorenz_loss(alg, rtol=tol, atol=tol)
    np.testing.assert_allclose(
        autograd.grad(loss)(THETA), central_difference(loss, THETA), rtol=agreement
    )


@pytest.mark.parametrize("alg", [dxode.RK4(), dxode.Euler(), dxode.Tsit5()], ids=repr)
def test_fixed_step_gradient_is_exact_for_the_discrete_map(alg):
    # With fixed steps the discrete solution is a smooth map of theta, and the discrete
    # adjoint is its exact derivative: finite differences agree to their own accuracy.
    loss = lorenz_loss(alg, dt=0.01, adaptive=False)
    np.testing.assert_allclose(
        autograd.grad(loss)(THETA), central_difference(loss, THETA, 1e-5), rtol=1e-7
    )


def test_gradient_through_every_save_point_and_array_parameters():
    def loss(theta):
        prob = dxode.ODEProblem(
            lambda u, p, t: -p * u + anp.sin(t), theta[:2], (0.0, 2.0), theta[2:]
        )
        sol = dxode.solve(prob, saveat=0.25, rtol=1e-10, atol=1e-10)
        return anp.sum(sol.u[3:] ** 3)

    theta = np.array([1.0, -0.5, 0.7, 1.3])
    np.testing.assert_allclose(
        autograd.grad(loss)(theta), central_difference(loss, theta), rtol=1e-6
    )


def test_without_saveat_a_differentiated_solve_saves_every_step_like_a_plain_one():
    # A plain solve without saveat saves every accepted step; the differentiated one must save
    # the same points (the loss value_and_grad sees is the loss), differentiated with those
    # times held fixed: the gradient of the same loss with saveat=the plain solve's times.
    options = {"rtol": 1e-8, "atol": 1e-8}
    prob = dxode.ODEProblem(lorenz, THETA[:3], (0.0, 1.0), P0)
    steps = dxode.solve(prob, **options).t

    def loss(theta, **saving):
        sol = dxode.solve(prob.remake(u0=theta), **saving, **options)
        return anp.sum(sol.u**2 * np.arange(len(sol.t))[:, None])

    value, grad = autograd.value_and_grad(loss)(THETA[:3])
    assert value == pytest.approx(loss(THETA[:3]), rel=1e-12)
    np.testing.assert_allclose(grad, autograd.grad(loss)(THETA[:3], saveat=steps), rtol=1e-12)


def test_backward_in_time():
    def loss(theta):
        prob = dxode.ODEProblem(lorenz, theta[:3], (1.0, 0.0), P0)
        return anp.sum(dxode.solve(prob, saveat=[0.5, 0.0], rtol=1e-10, atol=1e-10).u)

    theta = np.array([1.0, 1.0, 20.0])
    np.testing.assert_allclose(
        autograd.grad(loss)(theta), central_difference(loss, theta), rtol=1e-5
    )


def test_float32_gradients_stay_float32():
    def loss(theta):
        prob = dxode.ODEProblem(lorenz, theta, (0.0, 0.5), P0)
        return anp.sum(dxode.solve(prob, saveat=[0.5], rtol=1e-5, atol=1e-5).u)

    theta = np.array([1.0, 0.5, 0.2], dtype=np.float32)
    g = autograd.grad(loss)(theta)
    assert g.dtype == np.float32
    reference = autograd.grad(loss)(theta.astype(np.float64))
    np.testing.assert_allclose(g, reference, rtol=2e-2)


def _ensemble_loss(ealg, build):
    def loss(theta):
        sim = dxode.solve(
            build(theta),
            dxode.Tsit5(),
            ealg,
            trajectories=12,
            batch_size=5,
            saveat=0.5,
            rtol=1e-9,
            atol=1e-9,
        )
        return anp.sum(sim.u[:, -1, :] ** 2) + anp.sum(sim.u[:, 1, 0])

    return loss


def _per_trajectory_arrays(theta):
    rng = np.random.default_rng(0)
    scale = 1 + 0.1 * (rng.random((12, 3)) - 0.5)
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0)
    return dxode.EnsembleProblem(
        prob, p=theta[None, :3] * scale, u0=anp.outer(np.linspace(0.5, 1.5, 12), theta[3:])
    )


def _prob_func(theta):
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), (theta[0], theta[1], theta[2]))
    return dxode.EnsembleProblem(
        prob, prob_func=lambda prob, i, repeat: prob.remake(u0=theta[3:] * (0.5 + i / 12))
    )


def _prob_func_sharing_p(theta):
    # Every trajectory gets the same traced parameter array (one leaf, shared by all).
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), np.array(P0))
    return dxode.EnsembleProblem(
        prob,
        prob_func=lambda prob, i, repeat: prob.remake(u0=theta[3:] * (0.5 + i / 12), p=theta[:3]),
    )


@pytest.mark.parametrize(
    "build",
    [_per_trajectory_arrays, _prob_func, _prob_func_sharing_p],
    ids=["arrays", "prob_func", "prob_func_shared_p"],
)
def test_ensemble_gradients(build):
    theta = np.array([10.0, 28.0, 8.0 / 3.0, 1.0, 0.5, 0.2])
    array_loss = _ensemble_loss(dxode.EnsembleArray(), build)
    g = autograd.grad(array_loss)(theta)
    np.testing.assert_allclose(g, central_difference(array_loss, theta), rtol=2e-5)
    serial = autograd.grad(_ensemble_loss(dxode.EnsembleSerial(), build))(theta)
    # Per-trajectory cotangents are bitwise the same lane by lane; a parameter shared by all
    # trajectories sums them in an order that follows the batching (last bits only).
    np.testing.assert_allclose(serial, g, rtol=1e-13)


def test_a_failed_trajectory_gives_nan_gradients_not_wrong_numbers():
    def loss(theta):
        prob = dxode.ODEProblem(lambda u, p, t: u * u * p[0], [1.0], (0.0, 2.0), [theta[0]])
        return anp.sum(dxode.solve(prob, saveat=[0.5]).u)

    g = autograd.grad(loss)(np.array([1.0]))
    assert np.all(np.isnan(g))


def test_optimizers_reduce_the_loss():
    from autograd.misc.optimizers import adam

    target = dxode.solve(
        dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0), saveat=0.25, rtol=1e-8, atol=1e-8
    ).u

    def loss(theta, _it=0):
        prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), (theta[0], theta[1], theta[2]))
        return anp.mean((dxode.solve(prob, saveat=0.25, rtol=1e-8, atol=1e-8).u - target) ** 2)

    start = np.array([9.0, 27.0, 3.0])
    fitted = adam(autograd.grad(loss), start, step_size=0.05, num_iters=20)
    assert loss(fitted) < 0.5 * loss(start)
    optimize = pytest.importorskip("scipy.optimize", reason="SciPy is not installed (extra 'test')")
    result = optimize.minimize(autograd.value_and_grad(loss), start, jac=True, method="L-BFGS-B")
    np.testing.assert_allclose(result.x, P0, rtol=1e-3)


def test_numpy_ufuncs_trace_and_other_numpy_functions_are_reported():
    def loss_with(rhs):
        def loss(theta):
            prob = dxode.ODEProblem(rhs, [1.0, 2.0], (0.0, 1.0), [theta[0]])
            return anp.sum(dxode.solve(prob, saveat=[1.0], rtol=1e-10, atol=1e-10).u)

        return loss

    ufunc = loss_with(lambda u, p, t: np.sin(u) * p[0])  # ufuncs dispatch to autograd
    theta = np.array([1.0])
    np.testing.assert_allclose(
        autograd.grad(ufunc)(theta), central_difference(ufunc, theta), rtol=1e-6
    )
    concatenate = loss_with(lambda u, p, t: np.concatenate([u[:1] * p[0], -u[1:]]))
    with pytest.raises(TypeError, match=r"write f with `autograd\.numpy`"):
        autograd.grad(concatenate)(theta)


def test_unsupported_combinations_raise_clearly():
    theta = np.array([1.0, 0.0, 0.0])

    def with_options(**kwargs):
        return lambda th: anp.sum(
            dxode.solve(dxode.ODEProblem(lorenz, th, (0.0, 1.0), P0), **kwargs).u
        )

    with pytest.raises(NotImplementedError, match="dense output is not differentiable"):
        autograd.grad(with_options(dense=True))(theta)

    def lockstep_loss(th):
        eprob = dxode.EnsembleProblem(dxode.ODEProblem(lorenz, th, (0.0, 1.0), P0))
        sim = dxode.solve(eprob, dxode.EnsembleArray(lockstep=True), trajectories=2, saveat=[1.0])
        return anp.sum(sim.u)

    with pytest.raises(NotImplementedError, match="lock-step ensembles are not differentiable"):
        autograd.grad(lockstep_loss)(theta)

    pytest.importorskip("distributed", reason="distributed is not installed (extra 'dask')")

    def dask_loss(th):
        eprob = dxode.EnsembleProblem(dxode.ODEProblem(lorenz, th, (0.0, 1.0), P0))
        return anp.sum(dxode.solve(eprob, dxode.EnsembleDask(), trajectories=2, saveat=[1.0]).u)

    with pytest.raises(ValueError, match="needs a running cluster"):
        autograd.grad(dask_loss)(theta)


@pytest.mark.parametrize("name", ["rtol", "atol", "dt", "dtmin", "dtmax"])
def test_a_differentiated_solver_setting_is_refused_by_name(name):
    # These are plain settings: before, a traced one failed in float() with autograd's
    # ArrayBox in the message, or as "must be a positive number, got <ArrayBox ...>".
    def loss(theta):
        prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), (theta[0], 28.0, 8 / 3))
        sol = dxode.solve(prob, saveat=[1.0], **{name: theta[0] * 1e-3})
        return anp.sum(sol.u)

    with pytest.raises(TypeError, match=f"{name} is being differentiated.*getval"):
        autograd.grad(loss)(np.array([10.0]))


def test_second_derivatives_are_refused_clearly():
    # Before: autograd.hessian failed with "'NoneType' object is not iterable" (the inner
    # level's VJP had taken the forward pass's records), and a traced cotangent with
    # "setting an array element with a sequence".
    def total(y):
        prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 0.1), (y[0], 28.0, 8 / 3))
        return anp.sum(dxode.solve(prob, saveat=[0.1]).u)

    y = np.array([10.0])
    with pytest.raises(NotImplementedError, match=r"second derivatives.*autograd\.hessian"):
        autograd.hessian(total)(y)
    with pytest.raises(NotImplementedError, match="second derivatives"):
        autograd.grad(lambda x: anp.sum(autograd.grad(lambda y: x * total(y))(y)))(2.0)


def test_forward_mode_is_refused_clearly():
    # Before: autograd.make_jvp failed with "JVP of solve_primitive wrt argnums (0, 1) not
    # defined", naming a dxode internal and no alternative.
    def total(y):
        prob = dxode.ODEProblem(lorenz, [y[0], 0.0, 0.0], (0.0, 0.1), (y[1], 28.0, 8 / 3))
        return anp.sum(dxode.solve(prob, saveat=[0.1]).u)

    y = np.array([1.0, 10.0])
    with pytest.raises(NotImplementedError, match=r"forward-mode.*make_jvp.*autograd\.grad"):
        autograd.make_jvp(total)(y)(np.array([1.0, 0.0]))


def test_a_prob_func_changing_the_structure_of_p_is_refused_with_or_without_gradients():
    # prob.p is a tuple of three numbers, each trajectory's p one array: the differentiated
    # solve failed with an IndexError inside dxode, the plain one without naming the fix.
    def loss(theta):
        eprob = dxode.EnsembleProblem(
            dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0),
            prob_func=lambda prob, i, repeat: prob.remake(p=theta * (1 + 0.1 * i)),
        )
        return anp.sum(dxode.solve(eprob, trajectories=2, saveat=[1.0]).u)

    for run in (loss, autograd.grad(loss)):
        with pytest.raises(ValueError, match=r"trajectory 0's p .* nested as prob\.p"):
            run(np.array(P0))


def _later_trajectory_loss(ensemble_alg, first_follows):
    """A loss whose prob_func puts the differentiated u0 into trajectory 1 only, or (with
    ``first_follows``) makes trajectory 0's u0 a traced value too, constant in x."""
    u0 = np.array([1.0, 0.5, 0.2])

    def loss(x):
        def prob_func(prob, i, repeat):
            if i == 1:
                return prob.remake(u0=x)
            return prob.remake(u0=u0 + 0.0 * x) if first_follows else prob

        prob = dxode.ODEProblem(lorenz, u0, (0.0, 0.3), P0)
        eprob = dxode.EnsembleProblem(prob, prob_func=prob_func)
        sim = dxode.solve(
            eprob, dxode.Tsit5(), ensemble_alg, trajectories=3, saveat=[0.3], rtol=1e-10, atol=1e-10
        )
        return anp.sum(sim.u**2)

    return loss


@pytest.mark.parametrize(
    "ensemble_alg",
    [dxode.EnsembleArray(), dxode.EnsembleSerial(), dxode.EnsembleKernel()],
    ids=["array", "serial", "kernel"],
)
def test_a_prob_func_tracing_only_a_later_trajectory_names_the_fix(ensemble_alg):
    # Whether an ensemble is differentiated is told from trajectory 0: one built plain solved
    # the ensemble without gradients, and trajectory 1's traced u0 crashed inside dxode
    # ("'ArrayBox' object has no attribute '__dlpack__'") or was called a closure.
    if isinstance(ensemble_alg, dxode.EnsembleKernel):
        pytest.importorskip("numba")
    x = np.array([0.9, 0.4, 0.3])
    with pytest.raises(
        ValueError, match=r"trajectory 1 holds values autograd is diff.*trajectory 0"
    ):
        autograd.grad(_later_trajectory_loss(ensemble_alg, first_follows=False))(x)
    # the fix the message names
    loss = _later_trajectory_loss(ensemble_alg, first_follows=True)
    np.testing.assert_allclose(autograd.grad(loss)(x), central_difference(loss, x), rtol=1e-5)


def test_a_hand_written_vjp_gives_the_same_gradients():
    def loss(theta, vjp):
        prob = dxode.ODEProblem(
            lorenz, theta[:3], (0.0, 1.0), (theta[3], theta[4], theta[5]), vjp=vjp
        )
        return anp.sum(dxode.solve(prob, saveat=[0.5, 1.0], rtol=1e-8, atol=1e-8).u ** 2)

    traced = autograd.grad(lambda th: loss(th, None))(THETA)
    by_hand = autograd.grad(lambda th: loss(th, lorenz_vjp))(THETA)
    np.testing.assert_allclose(by_hand, traced, rtol=1e-10)

    scale = 1 + 0.1 * (np.random.default_rng(0).random((20, 3)) - 0.5)

    def ensemble_loss(theta, vjp):
        prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0, vjp=vjp)
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, p=theta[None, :] * scale),
            trajectories=20,
            saveat=0.5,
            rtol=1e-8,
            atol=1e-8,
        )
        return anp.sum(sim.u**2)

    theta = np.array(P0)
    np.testing.assert_allclose(
        autograd.grad(lambda th: ensemble_loss(th, lorenz_vjp_lanes))(theta),
        autograd.grad(lambda th: ensemble_loss(th, None))(theta),
        rtol=1e-10,
    )


def test_a_failed_gradient_leaves_plain_ensemble_solves_plain():
    # autograd's trace level stays raised after an exception escapes a traced function; dxode
    # must not take that for a trace in progress (it would run prob_func on the driver first).
    def failing_loss(theta):
        dxode.solve(dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 0.1), theta), saveat=[0.1])
        raise RuntimeError("the user's loss fails after a solve")

    with pytest.raises(RuntimeError, match="the user's loss fails"):
        autograd.grad(failing_loss)(np.array(P0))
    calls = []

    def prob_func(prob, i, repeat):
        calls.append(i)
        return prob

    eprob = dxode.EnsembleProblem(
        dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 0.1), P0), prob_func=prob_func
    )
    dxode.solve(eprob, trajectories=3, saveat=[0.1])
    assert sorted(calls) == [0, 1, 2]


@pytest.mark.parametrize("ensemble", [False, True], ids=["single", "ensemble"])
def test_gradients_through_an_f_with_a_constant_row(ensemble):
    # A thrown ball, x' = v, v' = -9.81: x(t) = x0 + v0 t - 9.81 t^2 / 2, so dx(t)/dx0 = 1 and
    # dx(t)/dv0 = t, for every trajectory.
    def ball(u, p, t):
        return [u[1], -9.81]

    times = [0.5, 1.0]

    def loss(u0s):
        if ensemble:
            eprob = dxode.EnsembleProblem(dxode.ODEProblem(ball, [0.0, 1.0], (0.0, 1.0)), u0=u0s)
            return anp.sum(dxode.solve(eprob, saveat=times).u[:, :, 0])
        prob = dxode.ODEProblem(ball, u0s[0], (0.0, 1.0))
        return anp.sum(dxode.solve(prob, saveat=times).u[:, 0])

    u0s = np.array([[0.0, 1.0], [2.0, -3.0], [1.0, 5.0]])[: 3 if ensemble else 1]
    expected = np.tile([len(times), sum(times)], (len(u0s), 1))
    np.testing.assert_allclose(autograd.grad(loss)(u0s), expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("ensemble_alg", "sensealg"),
    [
        (dxode.EnsembleArray(), None),
        (dxode.EnsembleSerial(), None),
        (None, None),
        (None, dxode.InterpolatingAdjoint()),
        (None, dxode.BacksolveAdjoint()),
    ],
    ids=["array", "serial", "matrix-discrete", "matrix-interpolating", "matrix-backsolve"],
)
def test_gradients_through_a_row_that_is_a_shared_parameter(ensemble_alg, sensealg):
    # v' = -g with g shared by the lanes (or the columns of a single problem's (2, 3) state):
    # the row is a traced scalar, broadcast to the row's shape. It failed in autograd's
    # broadcast_to VJP ("Can't handle extra leading dims"). x(t) = x0 + v0 t - g t^2 / 2, so
    # d sum x(t) / dg = -sum t^2 / 2 per trajectory.
    def fall(u, p, t):
        return [u[1], -p[0]]

    times = [0.5, 1.0]
    u0s = np.array([[0.0, 1.0], [2.0, -3.0], [1.0, 5.0]])

    def loss(g):
        if ensemble_alg is None:
            prob = dxode.ODEProblem(fall, u0s.T, (0.0, 1.0), g)
            return anp.sum(dxode.solve(prob, saveat=times, sensealg=sensealg).u[:, 0])
        prob = dxode.ODEProblem(fall, [0.0, 1.0], (0.0, 1.0), g)
        eprob = dxode.EnsembleProblem(prob, u0=u0s)
        sim = dxode.solve(eprob, ensemble_alg, saveat=times)
        return anp.sum(sim.u[:, :, 0])

    expected = -3 * sum(t * t for t in times) / 2
    np.testing.assert_allclose(autograd.grad(loss)(np.array([9.81])), [expected], rtol=1e-12)


def test_an_f_that_changes_shape_fails_under_gradients_too():
    # The lane RHS of a differentiated ensemble checks every result's shape, as a plain one does.
    def f(u, p, t):
        return -p[0] * u if float(np.max(t)) < 0.5 else -p[0] * u[:1]

    def loss(theta):
        eprob = dxode.EnsembleProblem(
            dxode.ODEProblem(f, [1.0, 2.0], (0.0, 1.0), [theta[0]]), u0=np.ones((3, 2))
        )
        return anp.sum(dxode.solve(eprob, saveat=[1.0]).u)

    with pytest.raises(ValueError, match="shape"):
        autograd.grad(loss)(np.array([1.0]))
