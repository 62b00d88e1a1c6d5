"""Gradients of stability-limited explicit solves: stiff problems solved with Tsit5, DP5, BS3.

The discrete adjoint's frozen-step derivative is wrong where adaptive steps exceeded the
method's stability interval for a mode the solution does not contain (issue 15, section 2):
the default then switches to ``InterpolatingAdjoint`` and an explicit ``DiscreteAdjoint``
refuses. References are central differences of tight solves.
"""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode

# The distributed L-BFGS tutorial's model: heat conduction with conductivity
# exp(θ0 + θ1 x + θ2 x² + θ3 x³), N interior points.
N = 24
X = np.linspace(0.0, 1.0, N + 2)
DX = X[1] - X[0]
FACES = 0.5 * (X[1:] + X[:-1])
BASIS = np.stack([FACES**k for k in range(4)])
TIMES = np.linspace(0.1, 0.5, 5)
THETA0 = np.array([np.log(0.1), 0.0, 0.0, 0.0])  # constant conductivity: the tutorial's start


def heat(u, theta, t):
    """du/dt for u (N,) or (N, B), theta (4,) or per trajectory (4, B)."""
    kappa = anp.exp(anp.dot(BASIS.T, theta))  # (N + 1,) or (N + 1, B)
    if u.ndim == 2 and kappa.ndim == 1:
        kappa = kappa[:, None]
    zero = 0.0 * u[:1]
    padded = anp.concatenate([zero, u, zero])
    flux = kappa * (padded[1:] - padded[:-1]) / DX
    return (flux[1:] - flux[:-1]) / DX


# A problem of the same kind, not the tutorial's: Allen–Cahn reaction–diffusion with a
# conductivity exp(p0 + p1 x) on 40 points, from an antisymmetric profile. At p1 = 0 the
# solution has no symmetric modes, and the steps are beyond the stability interval for the
# fastest of them.
M = 40
DXM = 1.0 / (M + 1)
XM = np.linspace(0.0, 1.0, M + 2)[1:-1]
FACES_M = np.linspace(0.0, 1.0, M + 1)


def allen_cahn(u, p, t):
    conductivity = anp.exp(p[0] + p[1] * FACES_M)
    padded = anp.concatenate([0.0 * u[:1], u, 0.0 * u[:1]])
    flux = conductivity * (padded[1:] - padded[:-1]) / DXM
    return (flux[1:] - flux[:-1]) / DXM + u - u**3


def squares_loss(f, u0, tspan, alg, saveat, sensealg=None, rtol=1e-6, atol=1e-8, **kwargs):
    def loss(theta):
        prob = dxode.ODEProblem(f, u0, tspan, theta)
        sol = dxode.solve(
            prob, alg, saveat=saveat, rtol=rtol, atol=atol, sensealg=sensealg, **kwargs
        )
        return anp.sum(sol.u**2)

    return loss


def central_differences(loss, theta, eps=1e-5):
    out = []
    for i in range(theta.shape[0]):
        e = np.zeros_like(theta)
        e[i] = eps
        out.append((loss(theta + e) - loss(theta - e)) / (2 * eps))
    return np.array(out)


def relative_error(g, ref):
    return np.max(np.abs(g - ref)) / np.max(np.abs(ref))


def heat_loss(**kwargs):
    u0 = 1.2 * np.sin(np.pi * X[1:-1])
    return squares_loss(heat, u0, (0.0, 0.5), dxode.Tsit5(), TIMES, **kwargs)


def test_the_default_gradient_of_the_tutorial_problem_agrees_with_central_differences():
    # Was [-23.9, -17.7, -16.0, -18.0] (the frozen-step derivative) against the reference
    # [-23.9, -12.0, -9.2, -7.8].
    ref = central_differences(heat_loss(rtol=1e-10, atol=1e-12), THETA0)
    g = autograd.grad(heat_loss())(THETA0)
    assert relative_error(g, ref) < 1e-6


def test_an_explicit_discrete_adjoint_refuses_and_the_dtmax_it_names_works():
    with pytest.raises(ValueError, match="stability interval") as raised:
        autograd.grad(heat_loss(sensealg=dxode.DiscreteAdjoint()))(THETA0)
    message = str(raised.value)
    assert "InterpolatingAdjoint()" in message and "ForwardSensitivity()" in message
    assert "Rodas5P()" in message
    dtmax = float(message.split("dtmax=")[1].split(" ")[0])
    assert 0.01 < dtmax < 0.0141  # 0.9 * 3.506 / |λ|max, |λ|max = 0.4 / dx² sin²(...) ≈ 249
    ref = central_differences(heat_loss(rtol=1e-10, atol=1e-12), THETA0)
    g = autograd.grad(heat_loss(sensealg=dxode.DiscreteAdjoint(), dtmax=dtmax))(THETA0)
    assert relative_error(g, ref) < 1e-6


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.DP5(), dxode.BS3()], ids=repr)
def test_an_unseen_stability_limited_problem_gets_the_gradient_of_its_loss(alg):
    # Frozen steps were off by 1.3e-2 (Tsit5), 1.4e-3 (DP5), 4.7e-5 (BS3).
    u0 = 0.5 * np.sin(2 * np.pi * XM)
    p = np.array([np.log(0.02), 0.0])
    saveat = [0.25, 0.5, 0.75, 1.0]
    ref = central_differences(
        squares_loss(allen_cahn, u0, (0.0, 1.0), alg, saveat, rtol=1e-10, atol=1e-12), p
    )
    g = autograd.grad(squares_loss(allen_cahn, u0, (0.0, 1.0), alg, saveat))(p)
    assert relative_error(g, ref) < 1e-6


def test_an_ensemble_with_one_stability_limited_trajectory():
    # Lane 0 starts on an eigenvector at constant conductivity (stability-limited, its
    # symmetric modes unexcited), lane 1 from a generic profile with a slower conductivity.
    u0s = np.stack([1.2 * np.sin(np.pi * X[1:-1]), X[1:-1] * (1 - X[1:-1])])

    def make(rtol, atol):
        def loss(theta):
            thetas = anp.stack([theta, theta + np.array([-2.0, 0.3, 0.0, 0.0])], axis=-1)
            prob = dxode.ODEProblem(heat, u0s[0], (0.0, 0.5), theta)
            eprob = dxode.EnsembleProblem(prob, u0=u0s, p=thetas.T)
            sim = dxode.solve(
                eprob, dxode.Tsit5(), trajectories=2, saveat=TIMES, rtol=rtol, atol=atol
            )
            return anp.sum(sim.u**2)

        return loss

    ref = central_differences(make(1e-10, 1e-12), THETA0)
    g = autograd.grad(make(1e-6, 1e-8))(THETA0)
    assert relative_error(g, ref) < 1e-6


def test_probes_side_by_side_are_bitwise_those_taken_one_at_a_time(monkeypatch):
    # The power iterations of a batch's probes share calls of f; each lane's rate must be
    # that of its probe alone. Three lanes with different conductivities and tspans, so the
    # working sets shrink and the probes differ in width.
    from dxode.sensitivity import stability

    probe, iterate = stability._probe_rates, stability._power_iteration
    compared, iterations = [], []

    def counted(*args):
        iterations[-1] += 1
        return iterate(*args)

    def both(backend, rhs_for, params, trials, n_lanes, estimate):
        # (the norm bound tried first is compared too, but only the power iterations counted)
        counting = estimate is counted
        iterations.append(0)
        together = probe(backend, rhs_for, params, trials, n_lanes, estimate)
        iterations.append(0)
        with monkeypatch.context() as one_at_a_time:
            one_at_a_time.setattr(stability, "_SIDE_BY_SIDE", 0)
            alone = probe(backend, rhs_for, params, trials, n_lanes, estimate)
        np.testing.assert_array_equal(together[0], alone[0])
        np.testing.assert_array_equal(together[1], alone[1])
        if counting:
            compared.append(np.count_nonzero(together[1], axis=1))
        else:
            del iterations[-2:]
        return together

    monkeypatch.setattr(stability, "_probe_rates", both)
    monkeypatch.setattr(stability, "_power_iteration", counted)
    shifts = np.array([[0.0, 0.0, 0.0, 0.0], [-1.0, 0.2, 0.0, 0.0], [-2.0, 0.3, 0.1, 0.0]])

    def loss(theta):
        thetas = anp.stack([theta + shift for shift in shifts], axis=-1)
        prob = dxode.ODEProblem(heat, X[1:-1] * (1 - X[1:-1]), (0.0, 0.5), theta)
        spans = np.array([[0.0, 0.5], [0.0, 0.3], [0.0, 0.4]])
        eprob = dxode.EnsembleProblem(prob, p=thetas.T, tspan=spans)
        sim = dxode.solve(
            eprob, dxode.Tsit5(), trajectories=3, saveat=[0.1, 0.2, 0.3], rtol=1e-4, atol=1e-6
        )
        return anp.sum(sim.u**2)

    with pytest.raises(ValueError, match="one tspan"):
        autograd.grad(loss)(THETA0)
    widths = compared[0]
    assert widths[0] == 3 and widths[-1] == 1  # probes of three lanes and of one
    assert iterations[:2] == [1, len(widths)]  # all probes in one working set, or one each


def test_per_trajectory_tspans_refuse_with_forward_sensitivities_named():
    def loss(theta):
        prob = dxode.ODEProblem(heat, 1.2 * np.sin(np.pi * X[1:-1]), (0.0, 0.5), theta)
        spans = np.array([[0.0, 0.5], [0.0, 0.4]])
        eprob = dxode.EnsembleProblem(prob, tspan=spans)
        sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=2, saveat=[0.2, 0.4])
        return anp.sum(sim.u**2)

    with pytest.raises(ValueError, match=r"one tspan.*ForwardSensitivity\(\)"):
        autograd.grad(loss)(THETA0)


def test_a_non_stiff_problem_keeps_the_discrete_adjoint():
    # Lorenz at a loose tolerance: accuracy-limited steps, so the default is the discrete
    # adjoint, bit for bit.
    def lorenz(u, p, t):
        x, y, z = u
        return [p[0] * (y - x), x * (p[1] - z) - y, x * y - p[2] * z]

    p = np.array([10.0, 28.0, 8 / 3])
    u0 = np.array([1.0, 0.0, 0.0])
    saveat = [1.0, 2.0]
    default = autograd.grad(
        squares_loss(lorenz, u0, (0.0, 2.0), dxode.Tsit5(), saveat, rtol=1e-3, atol=1e-3)
    )(p)
    discrete = autograd.grad(
        squares_loss(
            lorenz,
            u0,
            (0.0, 2.0),
            dxode.Tsit5(),
            saveat,
            sensealg=dxode.DiscreteAdjoint(),
            rtol=1e-3,
            atol=1e-3,
        )
    )(p)
    np.testing.assert_array_equal(default, discrete)


@pytest.mark.parametrize(
    ("alg", "interval"), [(dxode.RK4(), 2.785), (dxode.DP5(), 3.306), (dxode.BS3(), 2.512)]
)
def test_real_stability_intervals(alg, interval):
    # RK4: 2.7853; DP5: 3.3066 (Hairer & Wanner, Solving ODEs II, IV.2); BS3: 2.5127.
    assert alg.tableau.real_stability_interval == pytest.approx(interval, abs=1e-3)


@pytest.mark.slow
def test_the_tutorial_fit_reaches_its_documented_optimum():
    """docs/tutorials/distributed-lbfgs.md, the two shards summed here instead of on Dask
    workers (the same sum in the same order)."""
    theta_true = np.array([np.log(0.05), 0.8, -0.5, 0.3])
    rng = np.random.default_rng(0)
    u0s = np.array([rng.uniform(0.5, 1.5) * np.sin(np.pi * k * X[1:-1]) for k in range(1, 9)])

    def experiments(theta, u0s):
        return dxode.EnsembleProblem(dxode.ODEProblem(heat, u0s[0], (0.0, 0.5), theta), u0=u0s)

    data = dxode.solve(
        experiments(theta_true, u0s),
        dxode.Tsit5(),
        trajectories=len(u0s),
        saveat=TIMES,
        rtol=1e-8,
        atol=1e-10,
    ).u
    data = data + rng.normal(0.0, 1e-3, size=data.shape)
    shards = [(u0s[i::2], data[i::2]) for i in range(2)]

    def shard_loss(theta, u0s, observed):
        sim = dxode.solve(
            experiments(theta, u0s),
            dxode.Tsit5(),
            trajectories=len(u0s),
            saveat=TIMES,
            rtol=1e-6,
            atol=1e-8,
        )
        return anp.sum((sim.u - observed) ** 2)

    def loss_and_gradient(theta):
        parts = [autograd.value_and_grad(shard_loss)(theta, *shard) for shard in shards]
        return sum(float(v) for v, _ in parts), sum(g for _, g in parts)

    optimize = pytest.importorskip("scipy.optimize", reason="SciPy is not installed (extra 'test')")
    result = optimize.minimize(
        loss_and_gradient, THETA0, jac=True, method="L-BFGS-B", options={"maxiter": 30}
    )
    assert result.success
    assert result.nit > 10  # no stop at the start (a wrong gradient stopped it after one)
    np.testing.assert_allclose(result.x, [-2.995, 0.792, -0.484, 0.291], atol=1.5e-3)
    assert result.fun == pytest.approx(9.15e-4, rel=1e-2)


def test_fixed_steps_beyond_the_interval_keep_the_discrete_adjoint():
    # Without a controller the frozen steps are the computation: their derivative is the
    # gradient of the loss (here hλ ≈ 5 for the fastest mode, five steps).
    u0 = 1.2 * np.sin(np.pi * X[1:-1])
    loss = squares_loss(
        heat,
        u0,
        (0.0, 0.1),
        dxode.Tsit5(),
        [0.1],
        sensealg=dxode.DiscreteAdjoint(),
        adaptive=False,
        dt=0.02,
    )
    g = autograd.grad(loss)(THETA0)
    assert relative_error(g, central_differences(loss, THETA0, 1e-6)) < 1e-7


def test_on_another_backend_the_default_refuses_with_dtmax_named():
    xps = pytest.importorskip("array_api_strict")

    def decay(u, p, t):  # u' = -λ u per component, λ = (1, 1000); computed by array_api_strict
        return -p * u

    def decay_vjp(u, p, t, v):
        return -p * v, -u * v

    def loss(rates):
        prob = dxode.ODEProblem(decay, xps.asarray([1.0, 1.0]), (0.0, 1.0), None, vjp=decay_vjp)
        eprob = dxode.EnsembleProblem(prob, p=anp.stack([rates, rates]))
        sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=2, saveat=[1.0])
        return anp.sum(sim.u**2)

    with pytest.raises(ValueError, match=r"NumPy only.*dtmax="):
        autograd.grad(loss)(np.array([1.0, 1000.0]))


def _trial(lane, h, accept):
    from dxode.integrator.lanes import Trial

    t = np.zeros(len(h))
    return Trial(np.asarray(lane), t, np.asarray(h), t, np.asarray(accept), (), None, None)


@pytest.mark.parametrize("group", [1, 3, 8_192])
def test_the_largest_accepted_step_is_that_of_all_steps_at_once(monkeypatch, group):
    # Taken over groups of trials (no array of every step): the same number, rejected steps
    # left out, a NaN kept, for groups of one trial, of several and of all.
    from dxode.sensitivity import stability

    monkeypatch.setattr(stability, "_STEP_GROUP", group)
    rng = np.random.default_rng(3)
    trials = [
        _trial(np.arange(w), rng.uniform(-0.5, 0.5, w), rng.random(w) < 0.7) for w in (4, 2, 5, 1)
    ]
    trials.append(_trial([0, 1], [-9.0, 0.1], [False, True]))  # the largest step rejected
    everything = np.concatenate([tr.h for tr in trials])
    accepted = np.concatenate([tr.accept for tr in trials])
    assert stability._largest_step(np, trials) == np.max(np.abs(everything[accepted]))
    trials.append(_trial([0], [np.nan], [True]))
    assert np.isnan(stability._largest_step(np, trials))


def test_the_norm_bound_is_at_least_every_power_iteration_estimate():
    """The screen tried before the power iterations must never clear a limited batch: for a
    non-normal J (||J||_2 well above its spectral radius) the bound holds ||J||_2 and the
    power iterations' rate, lane by lane."""
    from dxode.backends import get_backend
    from dxode.sensitivity import stability

    backend = get_backend("numpy")
    rng = np.random.default_rng(3)
    jacobians = rng.standard_normal((4, 4, 5)) * np.array([1.0, 10.0, 100.0, 1e3, 1e4])
    jacobians[0, 3] *= 50.0  # strongly non-normal in every lane

    def rhs(u, t):
        return np.einsum("ijl,jl->il", jacobians, u)

    u = rng.standard_normal((4, 5))
    start = rng.standard_normal((4, 5))
    t = np.zeros(5)
    bound = stability._norm_bound(backend, rhs, u, t, start)
    rate = stability._power_iteration(backend, rhs, u, t, start)
    two_norms = np.array([np.linalg.norm(jacobians[..., lane], 2) for lane in range(5)])
    assert np.all(bound >= two_norms * (1 - 1e-6))
    assert np.all(bound >= rate)


def test_a_non_stiff_batch_is_cleared_without_power_iterations(monkeypatch):
    from dxode.sensitivity import stability

    calls = []
    monkeypatch.setattr(stability, "_power_iteration", lambda *a: calls.append(1) or None)

    def lorenz(u, p, t):
        x, y, z = u
        return [p[0] * (y - x), x * (p[1] - z) - y, x * y - p[2] * z]

    loss = squares_loss(
        lorenz,
        np.array([1.0, 0.0, 0.0]),
        (0.0, 2.0),
        dxode.Tsit5(),
        [1.0, 2.0],
        sensealg=dxode.DiscreteAdjoint(),
        rtol=1e-8,
        atol=1e-8,
    )
    assert np.all(np.isfinite(autograd.grad(loss)(np.array([10.0, 28.0, 8 / 3]))))
    assert calls == []  # (at rtol 1e-3 the larger steps leave it to the power iterations)
