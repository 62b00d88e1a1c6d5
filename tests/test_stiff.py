"""Stiff methods: batched LU, Jacobians, Rosenbrock23 / Rodas4 / Rodas5P (and TRBDF2).

Accuracy against analytic solutions and SciPy's Radau, observed convergence orders, per-lane
independence in ensembles of very different stiffness, and clear errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from stiff_problems import rober, rober_jac

import dxode
from dxode._derivatives import Derivatives, LaneFunction
from dxode._jacobian import difference_increment, lane_jacobian, lane_tgrad
from dxode.backends import _lu, backend_for, get_backend

from conftest import to_numpy
from matrix import STIFF, method_id
from problems import lorenz, lorenz_jac

STIFF_NAMES = [method_id(alg) for alg in STIFF]
ORDERS = {"Rosenbrock23": 2, "Rodas4": 4, "Rodas5P": 5, "TRBDF2": 2}


def method(name, **kwargs):
    return getattr(dxode, name)(**kwargs)


# ---------------------------------------------------------------- problems


def prothero_robinson(u, p, t):
    """``u0' = lam (u0 - sin t) + cos t`` (solution ``sin t`` from 0), coupled to a decay."""
    x, y = u
    return [p * (x - np.sin(t)) + np.cos(t), -y * x]


def pr_jac(u, p, t):
    x, y = u
    zero = 0.0 * x
    return [[p + zero, zero], [-y, -x]]


def pr_tgrad(u, p, t):
    y = u[1]
    return [-p * np.cos(t) - np.sin(t), 0.0 * y]


def vdp(u, p, t):
    x, y = u
    return [y, p * ((1 - x * x) * y - x)]


def robertson(u, p, t):
    y1, y2, y3 = u
    return [
        -0.04 * y1 + 1e4 * y2 * y3,
        0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2 * y2,
        3e7 * y2 * y2,
    ]


def lorenz_tgrad(u, p, t):
    return [0.0 * u[0]] * 3


# ---------------------------------------------------------------- linear algebra


@pytest.mark.parametrize("n", [1, 2, 3, 8, 20])
def test_generic_lu_solves_like_lapack(xp, n):
    rng = np.random.default_rng(n)
    a = rng.normal(size=(n, n, 7))
    b = rng.normal(size=(n, 7))
    x = to_numpy(_lu.lu_solve(xp, _lu.lu_factor(xp, xp.asarray(a)), xp.asarray(b)))
    ref = np.linalg.solve(np.moveaxis(a, -1, 0), np.moveaxis(b, -1, 0)[..., None])[..., 0].T
    np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend_name", ["generic", "numpy"])
def test_lu_lanes_are_independent_bitwise(backend_name):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 5, 50))
    b = rng.normal(size=(5, 50))
    if backend_name == "numpy":
        backend = get_backend("numpy")
        factor, solve = backend.lu_factor, backend.lu_solve
    else:
        factor, solve = (lambda m: _lu.lu_factor(np, m)), (lambda f, v: _lu.lu_solve(np, f, v))
    x = solve(factor(a), b)
    for lane in (0, 17, 49):
        alone = solve(factor(a[..., lane : lane + 1]), b[:, lane : lane + 1])
        np.testing.assert_array_equal(alone[:, 0], x[:, lane])


def test_a_singular_lane_does_not_stop_the_others():
    a = np.stack([np.eye(3) * 2.0, np.zeros((3, 3))], axis=-1)
    b = np.ones((3, 2))
    backend = get_backend("numpy")
    with backend.ignore_fp_errors():
        x = backend.lu_solve(backend.lu_factor(a), b)
    np.testing.assert_array_equal(x[:, 0], 0.5)
    assert not np.all(np.isfinite(x[:, 1]))


def test_lu_shape_errors():
    with pytest.raises(ValueError, match=r"\(n, n, L\)"):
        _lu.lu_factor(np, np.ones((3, 2, 4)))
    factors = _lu.lu_factor(np, np.ones((2, 2, 4)) + np.eye(2)[..., None])
    with pytest.raises(ValueError, match="lu_solve expects b"):
        _lu.lu_solve(np, factors, np.ones((3, 4)))


# ---------------------------------------------------------------- Jacobians


def _lane_function(prob, lanes=1):
    backend = backend_for(prob.u0)
    p = prob.p if lanes == 1 else np.full(lanes, prob.p)

    def rhs(u, t, out=None):
        if lanes == 1:
            return np.asarray(prob.f(u[:, 0], p, t[0]))[:, None]
        return np.asarray(prob.f(u, p, t))

    single = lanes == 1
    return backend, LaneFunction(rhs, p, Derivatives.of(prob, single_lane=single))


@pytest.mark.parametrize("lanes", [1, 4])
def test_jacobians_from_jac_autograd_and_differences_agree(lanes):
    prob = dxode.ODEProblem(
        prothero_robinson, [0.3, 1.2], (0.0, 1.0), -50.0, jac=pr_jac, tgrad=pr_tgrad
    )
    backend, rhs = _lane_function(prob, lanes)
    u = np.tile(np.array([[0.3], [1.2]]), (1, lanes)) * np.linspace(1, 2, lanes)
    t = np.linspace(0.1, 0.5, lanes)
    f_u = rhs(u, t)
    user, nf_user = lane_jacobian(backend, rhs, u, t, f_u, "auto")
    traced, nf_traced = lane_jacobian(backend, rhs, u, t, f_u, "autograd")
    diff, nf_diff = lane_jacobian(backend, rhs, u, t, f_u, "finite_difference")
    assert user.shape == (2, 2, lanes)
    assert (nf_user, nf_traced, nf_diff) == (0, 1, 2)
    np.testing.assert_allclose(traced, user, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(diff, user, rtol=1e-6, atol=1e-6)
    tgrad_user, _ = lane_tgrad(backend, rhs, u, t, f_u)
    no_tgrad = prob.remake(tgrad=None)
    _, rhs_plain = _lane_function(no_tgrad, lanes)
    tgrad_diff, nf = lane_tgrad(backend, rhs_plain, u, t, f_u)
    assert nf == 1
    np.testing.assert_allclose(tgrad_diff, tgrad_user, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_difference_jacobian_of_a_small_component_is_accurate(dtype):
    # Robertson at t ~ 1e4: y2 ~ 5e-7 enters as 3e7 y2^2 (d/dy2 = 27). Perturbed by
    # sqrt(eps) * max(|y2|, 1) (1.5e-8 in float64, 3% of y2), that entry came out 27.45 in
    # float64 and 10385 in float32 (errors 5e-5 and 1.1 of the column's largest entry); a
    # perturbation to the component's own scale gives 2e-7 and 4e-3.
    u = np.array([[0.1], [4.5e-7], [0.9]], dtype=dtype)
    t = np.zeros(1, dtype=dtype)

    def rhs(v, t):
        return np.asarray(rober(v, None, t), dtype=dtype)

    diff, _ = lane_jacobian(get_backend("numpy"), rhs, u, t, rhs(u, t), "finite_difference")
    exact = np.asarray(rober_jac(u.astype(np.float64), None, 0.0), dtype=np.float64)
    scale = np.abs(exact).max(axis=0, keepdims=True)  # each column's largest entry
    error = np.abs(diff.astype(np.float64) - exact) / scale
    assert error.max() < (1e-6 if dtype == np.float64 else 1e-2)


def test_robertson_with_a_difference_jacobian_takes_the_steps_of_an_exact_one():
    # The difference Jacobian (the kernels' without a jac) cost Rodas5P 348 steps against 148
    # with autograd's at rtol=1e-6 (3032 against 342 at 1e-8), 4 times autograd's error.
    prob = dxode.ODEProblem(rober, np.array([1.0, 0.0, 0.0]), (0.0, 1e5))
    opts = {"rtol": 1e-6, "atol": 1e-10, "saveat": [1e5]}
    fd = dxode.solve(prob, dxode.Rodas5P(autodiff="finite_difference"), **opts)
    exact = dxode.solve(prob.remake(jac=rober_jac), dxode.Rodas5P(), **opts)
    assert fd.retcode == exact.retcode == dxode.ReturnCode.Success
    assert abs(fd.stats.naccept - exact.stats.naccept) <= 0.05 * exact.stats.naccept
    np.testing.assert_allclose(fd.u, exact.u, rtol=1e-7, atol=1e-12)


def number_densities(u, p, t):
    """Robertson with every concentration in units ``1/S`` (``S = p[0]``: number densities)."""
    y1, y2, y3 = u
    s = p[0]
    fast = 1e4 * y2 * y3 / s
    slow = 3e7 * y2 * y2 / s
    return [-0.04 * y1 + fast, 0.04 * y1 - fast - slow, slow]


@pytest.mark.parametrize("scale", [1e12, 1e16])
@pytest.mark.parametrize("kernel", [False, True], ids=["array", "kernel"])
def test_a_difference_jacobian_of_large_components_takes_the_steps_of_an_exact_one(scale, kernel):
    # RADAU5's increment sqrt(eps |u_j|) alone is sqrt(eps / |u_j|) relative: a few ulps of
    # a component of 1e12 (Rodas5P 968 steps at rtol=1e-8 against 270 with autograd's
    # Jacobian), below one ulp at 1e16 (13048 steps).
    if kernel:
        pytest.importorskip("numba")
    prob = dxode.ODEProblem(number_densities, np.array([scale, 0.0, 0.0]), (0.0, 1e5), (scale,))
    opts = {"rtol": 1e-8, "atol": 1e-10 * scale, "saveat": [1e5]}
    exact = dxode.solve(prob, dxode.Rodas5P(autodiff="autograd"), **opts)
    fd_alg = dxode.Rodas5P() if kernel else dxode.Rodas5P(autodiff="finite_difference")
    fd = dxode.solve(prob, fd_alg, kernel=kernel, **opts)
    assert fd.retcode == exact.retcode == dxode.ReturnCode.Success
    assert abs(fd.stats.naccept - exact.stats.naccept) <= 0.05 * exact.stats.naccept
    np.testing.assert_allclose(fd.u, exact.u, rtol=1e-6)


def test_the_difference_increment_is_radau5_s_up_to_one_and_relative_above():
    eps = np.finfo(np.float64).eps
    u = np.array([0.0, 1e-7, 0.3, 1.0, 3.0, 1e12, -1e16])
    step = difference_increment(np, u, eps)
    small = np.abs(u) <= 1.0
    radau5 = np.sqrt(eps * np.maximum(np.abs(u), 1e-5))
    np.testing.assert_array_equal(step[small], radau5[small])  # bit for bit as before
    np.testing.assert_allclose(step[~small], np.sqrt(eps) * np.abs(u[~small]), rtol=1e-15)
    assert np.all(u + step != u)


@pytest.mark.parametrize("name", STIFF_NAMES)
def test_autodiff_choices_give_the_same_solution(name):
    prob = dxode.ODEProblem(prothero_robinson, [0.0, 1.0], (0.0, 2.0), -1e4)
    with_jac = prob.remake(jac=pr_jac, tgrad=pr_tgrad)
    opts = {"rtol": 1e-7, "atol": 1e-9, "saveat": [2.0]}
    results = {
        "jac": dxode.solve(with_jac, method(name), **opts),
        "autograd": dxode.solve(prob, method(name, autodiff="autograd"), **opts),
        "fd": dxode.solve(prob, method(name, autodiff="finite_difference"), **opts),
    }
    exact = np.sin(2.0)
    for sol in results.values():
        assert sol.retcode == dxode.ReturnCode.Success
        assert abs(float(sol.u[-1, 0]) - exact) < 1e-5
    np.testing.assert_allclose(results["autograd"].u, results["jac"].u, rtol=1e-7)
    # Differences cost n RHS evaluations per attempt, autograd one, a user jac none.
    attempts = results["fd"].stats.naccept + results["fd"].stats.nreject
    assert results["fd"].stats.njac == attempts
    assert results["jac"].stats.nf < results["autograd"].stats.nf < results["fd"].stats.nf


def test_plain_numpy_rhs_falls_back_to_differences():
    def f(u, p, t):  # np.array of traced values: autograd cannot follow it
        return np.array([-p * np.exp(u[0]), -p * np.exp(u[1])])

    prob = dxode.ODEProblem(f, [0.0, 0.5], (0.0, 1.0), 100.0)
    sol = dxode.solve(prob, dxode.Rodas5P(), rtol=1e-8, atol=1e-10, saveat=[1.0])
    exact = -np.log(np.exp(-np.array([0.0, 0.5])) + 100.0)
    np.testing.assert_allclose(sol.u[-1], exact, rtol=1e-6)
    with pytest.raises(TypeError, match="autograd"):
        dxode.solve(prob, dxode.Rodas5P(autodiff="autograd"), saveat=[1.0])


# ---------------------------------------------------------------- accuracy and order


@pytest.mark.parametrize("name", STIFF_NAMES)
def test_observed_order_of_convergence(name):
    prob = dxode.ODEProblem(prothero_robinson, [0.0, 1.0], (0.0, 2.0), -2.0)
    ref = dxode.solve(prob, dxode.Vern7(), rtol=1e-13, atol=1e-13, saveat=[2.0]).u[-1]
    steps = [40, 80] if name == "Rodas5P" else [20, 40]
    errors = [
        np.abs(dxode.solve(prob, name, adaptive=False, dt=2.0 / n, saveat=[2.0]).u[-1] - ref).max()
        for n in steps
    ]
    order = np.log2(errors[0] / errors[1])
    assert ORDERS[name] - 0.3 < order < ORDERS[name] + 0.5


@pytest.mark.parametrize("name", STIFF_NAMES)
def test_van_der_pol_mu_1000_against_radau(name, radau_vdp):
    t1, ref = radau_vdp
    prob = dxode.ODEProblem(vdp, [2.0, 0.0], (0.0, t1), 1000.0)
    sol = dxode.solve(prob, name, rtol=1e-6, atol=1e-6, saveat=[t1])
    assert sol.retcode == dxode.ReturnCode.Success
    np.testing.assert_allclose(sol.u[-1], ref, rtol=1e-3)


@pytest.fixture(scope="module")
def radau_vdp():
    integrate = pytest.importorskip("scipy.integrate")
    t1 = 3.0  # the initial layer and the start of the slow branch (stiffness ratio ~3000)
    ref = integrate.solve_ivp(
        lambda t, u: vdp(u, 1000.0, t), (0, t1), [2.0, 0.0], "Radau", rtol=1e-11, atol=1e-11
    )
    return t1, ref.y[:, -1]


@pytest.mark.parametrize("name", STIFF_NAMES)
def test_robertson_against_radau(name):
    integrate = pytest.importorskip("scipy.integrate")
    t1 = 100.0
    ref = integrate.solve_ivp(
        lambda t, u: robertson(u, None, t), (0, t1), [1.0, 0, 0], "Radau", rtol=1e-12, atol=1e-16
    ).y[:, -1]
    prob = dxode.ODEProblem(robertson, [1.0, 0.0, 0.0], (0.0, t1))
    sol = dxode.solve(prob, name, rtol=1e-7, atol=1e-12, saveat=[t1])
    assert sol.retcode == dxode.ReturnCode.Success
    np.testing.assert_allclose(sol.u[-1], ref, rtol=1e-4)


@pytest.mark.parametrize("name", STIFF_NAMES)
def test_dense_output_follows_the_solution(name):
    prob = dxode.ODEProblem(prothero_robinson, [0.0, 1.0], (0.0, 3.0), -1e5)
    sol = dxode.solve(prob, name, rtol=1e-6, atol=1e-8)
    times = np.linspace(0.0, 3.0, 301)
    np.testing.assert_allclose(sol(times)[:, 0], np.sin(times), atol=2e-5)
    np.testing.assert_array_equal(sol(sol.t[-1]), sol.u[-1])


@pytest.mark.parametrize("name", STIFF_NAMES)
def test_float32(name):
    u0 = np.array([0.0, 1.0], dtype=np.float32)
    prob = dxode.ODEProblem(prothero_robinson, u0, (0.0, 2.0), np.float32(-1e4))
    sol = dxode.solve(prob, name, rtol=1e-4, atol=1e-5, saveat=[2.0])
    assert sol.u.dtype == np.float32
    assert sol.retcode == dxode.ReturnCode.Success
    assert abs(float(sol.u[-1, 0]) - np.sin(2.0)) < 1e-3


def _slow_forcing(u, p, t):
    a, t0 = p  # 1 / the time scale, and the start
    return [-a * u[0] + a * np.cos(a * (t - t0))]


@pytest.mark.parametrize("name", STIFF_NAMES)
@pytest.mark.parametrize("kernel", [False, True], ids=["array", "kernel"])
def test_a_span_far_from_zero_is_solved(kernel, name):
    # df/dt's difference increment was sqrt(eps) * sqrt(|t| c), c the span's width here:
    # |t| c overflowed to inf, f was evaluated at t = inf, df/dt was NaN and every step was
    # rejected (Unstable). In s = (t - t0) / scale: du/ds = -u + cos(s), u(0) = 1.
    t0, scale = 1e160, 1e150  # |t| scale beyond float64's largest, the width resolved
    prob = dxode.ODEProblem(_slow_forcing, [1.0], (t0, t0 + scale), (1 / scale, t0))
    sol = dxode.solve(prob, name, kernel=kernel, rtol=1e-8, atol=1e-8, saveat=[t0 + scale])
    assert sol.retcode == dxode.ReturnCode.Success
    s1 = (t0 + scale - t0) / scale
    exact = np.exp(-s1) / 2 + (np.cos(s1) + np.sin(s1)) / 2
    np.testing.assert_allclose(sol.u[-1, 0], exact, rtol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "t", "scale"), [(np.float64, 1e160, 1e150), (np.float32, 1e21, 5e18)]
)
def test_the_time_derivative_s_increment_stays_finite_far_from_zero(dtype, t, scale):
    from dxode._jacobian import time_increment

    t = np.array([t, -t], dtype=dtype)
    with np.errstate(over="ignore"):  # |t| scale overflows: the fallback takes over
        increment = time_increment(np, t, np.full_like(t, scale))
    root_eps = np.sqrt(np.finfo(dtype).eps)
    np.testing.assert_allclose(
        increment, root_eps * np.sqrt(np.abs(t.astype(np.float64))) * np.sqrt(scale), rtol=1e-5
    )
    assert np.all(t + increment != t)


def test_array_api_backends(xp):
    def linear(u, p, t):
        return xp.stack([-1000.0 * u[0, ...] + u[1, ...], -0.5 * u[1, ...]])

    def linear_one(u, p, t):
        return linear(u[:, None], p, t)[:, 0]

    prob = dxode.ODEProblem(linear_one, xp.asarray([1.0, 1.0]), (0.0, 2.0))
    sol = dxode.solve(prob, dxode.Rodas5P(), rtol=1e-8, atol=1e-10, saveat=[2.0])
    c = 1.0 / 999.5
    exact = [(1 - c) * np.exp(-2000.0) + c * np.exp(-1.0), np.exp(-1.0)]
    np.testing.assert_allclose(to_numpy(sol.u)[-1], exact, rtol=1e-6)


# ---------------------------------------------------------------- ensembles


@pytest.mark.parametrize("name", STIFF_NAMES)
def test_lanes_of_very_different_stiffness_equal_their_solo_runs(name):
    lambdas = -np.logspace(0, 6, 12)
    prob = dxode.ODEProblem(prothero_robinson, [0.0, 1.0], (0.0, 2.0), -1.0)
    eprob = dxode.EnsembleProblem(prob, p=lambdas)
    opts = {"rtol": 1e-6, "atol": 1e-8, "saveat": [0.5, 2.0]}
    sim = dxode.solve(eprob, name, trajectories=12, **opts)
    assert np.all(sim.retcodes == int(dxode.ReturnCode.Success))
    np.testing.assert_allclose(sim.u[:, :, 0], np.sin([[0.5, 2.0]] * 12), atol=1e-4)
    for i in (0, 5, 11):
        alone = dxode.solve(
            dxode.EnsembleProblem(prob, p=lambdas[i : i + 1]), name, trajectories=1, **opts
        )
        np.testing.assert_array_equal(alone.u[0], sim.u[i])
        assert alone.stats.nf[0] == sim.stats.nf[i]
    # The stiffest lanes take more steps than the mild ones: each controls its own step.
    assert sim.stats.naccept[-1] != sim.stats.naccept[0]


def test_diffeqgpu_lorenz_with_jac_and_tgrad():
    """DiffEqGPU's stiff ensemble example: Lorenz with jac and tgrad, random parameters."""
    p0 = np.array([10.0, 28.0, 8 / 3])
    prob = dxode.ODEProblem(
        lorenz, [1.0, 0.0, 0.0], (0.0, 10.0), tuple(p0), jac=lorenz_jac, tgrad=lorenz_tgrad
    )
    rng = np.random.default_rng(0)
    scales = rng.random((1000, 3))

    def prob_func(prob, i, repeat):
        return prob.remake(p=tuple(p0 * scales[i]))

    eprob = dxode.EnsembleProblem(prob, prob_func=prob_func)
    sim = dxode.solve(eprob, dxode.Rosenbrock23(), trajectories=1000, saveat=1.0)
    assert np.all(sim.retcodes == int(dxode.ReturnCode.Success))
    assert sim.u.shape == (1000, 11, 3)
    for i in (0, 999):
        alone = dxode.solve(
            prob.remake(p=tuple(p0 * scales[i]), tspan=(0.0, 1.0)),
            dxode.Tsit5(),
            rtol=1e-10,
            atol=1e-10,
            saveat=1.0,
        )
        np.testing.assert_allclose(sim.u[i, 1], alone.u[-1], rtol=2e-2, atol=2e-2)


def test_a_failing_lane_gets_its_own_retcode():
    def blowup(u, p, t):  # u' = p u^2 - 1000 (u - 1): finite-time blow-up for large p
        return [p * u[0] * u[0] - 1000.0 * (u[0] - 1.0)]

    prob = dxode.ODEProblem(blowup, [1.0], (0.0, 1.0), 0.0)
    eprob = dxode.EnsembleProblem(prob, p=np.array([0.0, 2000.0, 1.0]))
    sim = dxode.solve(eprob, dxode.Rodas5P(), trajectories=3, saveat=[1.0])
    codes = [dxode.ReturnCode(int(c)) for c in sim.retcodes]
    assert codes[0] == codes[2] == dxode.ReturnCode.Success
    assert not codes[1].successful


# ---------------------------------------------------------------- errors


def test_bad_jacobian_shape_is_reported():
    prob = dxode.ODEProblem(
        prothero_robinson, [0.0, 1.0], (0.0, 1.0), -1.0, jac=lambda u, p, t: np.eye(3)
    )
    with pytest.raises(ValueError, match=r"jac\(u, p, t\) returned shape \(3, 3\)"):
        dxode.solve(prob, dxode.Rodas5P())
    eprob = dxode.EnsembleProblem(prob.remake(jac=lambda u, p, t: np.eye(2)), p=np.ones(4))
    with pytest.raises(ValueError, match=r"\(2, 2, 4\) \(lanes last\)"):
        dxode.solve(eprob, dxode.Rodas5P(), trajectories=4)


def test_a_tgrad_of_nested_lists_of_the_wrong_shape_is_reported():
    # rows of lists (a 2x2 for a 2-component state) failed in broadcasting: "cannot broadcast
    # a non-scalar to a scalar array" (an ensemble: "operands could not be broadcast ...")
    def tgrad(u, p, t):
        return [[1.0, 0.0], [0.0, 1.0]]

    prob = dxode.ODEProblem(prothero_robinson, [0.0, 1.0], (0.0, 1.0), -1.0, tgrad=tgrad)
    told = r"tgrad\(u, p, t\) returned shape \(2, 2\) for a state of shape \(2,\); it must "
    with pytest.raises(ValueError, match=told + r"return df/dt of shape \(2,\)$"):
        dxode.solve(prob, dxode.Rodas5P())
    eprob = dxode.EnsembleProblem(prob, p=-np.ones(3))
    with pytest.raises(ValueError, match=r"returned shape \(2, 2\) .* \(2, 3\) \(lanes last\)"):
        dxode.solve(eprob, dxode.Rodas5P(), trajectories=3)


def _negated(jac):
    return lambda u, p, t: [[-x for x in row] for row in jac(u, p, t)]


@pytest.mark.parametrize("alg", [dxode.Rodas5P(), dxode.TRBDF2(), dxode.AutoSwitch()], ids=repr)
@pytest.mark.parametrize("how", ["single", "ensemble"])
def test_a_jac_with_its_sign_flipped_is_refused_before_the_first_step(alg, how):
    # Robertson with -jac ran Rodas5P and TRBDF2 to MaxIters (100,000 steps, minutes).
    prob = dxode.ODEProblem(rober, [1.0, 0.0, 0.0], (0.0, 1e5), jac=_negated(rober_jac))
    with pytest.raises(ValueError, match=r"jac\(u, p, t\) disagrees with f at the initial"):
        if how == "ensemble":
            eprob = dxode.EnsembleProblem(prob, u0=np.array([[1.0, 0.0, 0.0], [0.5, 1e-5, 0.5]]))
            dxode.solve(eprob, alg, trajectories=2, maxiters=1000)
        else:
            dxode.solve(prob, alg, maxiters=1000)


def test_the_refusal_names_the_lane_and_the_component():
    u0 = np.array([[1.0, 0.0, 0.0], [0.5, 1e-5, 0.5]])
    eprob = dxode.EnsembleProblem(
        dxode.ODEProblem(rober, u0[0], (0.0, 1.0), jac=_negated(rober_jac)), u0=u0
    )
    told = r"\(lane 0 of the batch\).*cosine .* -1\.00; component \d: jac · w gives"
    with pytest.raises(ValueError, match=told):
        dxode.solve(eprob, dxode.Rodas5P(), trajectories=2, maxiters=1000)


def _kink(u, p, t):
    """``-1e3 |u0|`` at ``u0 = 0`` (a kink), and a decay."""
    return [-1e3 * np.abs(u[0]), -u[1]]


@pytest.mark.parametrize(
    ("f", "u0", "jac"),
    [
        # missing the coupling terms (a Jacobian approximation TRBDF2's Newton tolerates)
        (
            rober,
            [1.0, 1e-5, 0.0],
            lambda u, p, t: np.diag(np.diagonal(np.asarray(rober_jac(u, p, t)))),
        ),
        # three times too large
        (rober, [1.0, 1e-5, 0.0], lambda u, p, t: [[3 * x for x in r] for r in rober_jac(u, p, t)]),
        # the one-sided derivative of f's kink at u0 that forward differences do not see
        (_kink, [0.0, 1.0], lambda u, p, t: [[1e3, 0.0], [0.0, -1.0]]),
    ],
    ids=["missing-terms", "scaled", "kink"],
)
def test_approximate_jacobians_are_not_refused(f, u0, jac):
    prob = dxode.ODEProblem(f, u0, (0.0, 1.0), jac=jac)
    assert dxode.solve(prob, dxode.TRBDF2(), rtol=1e-4, saveat=[1.0]).success


def test_a_jac_that_is_not_used_is_not_checked():
    prob = dxode.ODEProblem(rober, [1.0, 0.0, 0.0], (0.0, 1.0), jac=_negated(rober_jac))
    sol = dxode.solve(prob, dxode.Rodas5P(autodiff="finite_difference"), saveat=[1.0])
    assert sol.success


@pytest.mark.parametrize("alg", [dxode.Rodas5P(), dxode.TRBDF2(), dxode.AutoSwitch()])
@pytest.mark.parametrize("how", ["single", "ensemble", "kernel"])
def test_stiff_methods_need_a_1d_state_refused_when_the_solve_is_set_up(alg, how):
    calls = []

    def decay(u, p, t):
        calls.append(t)
        return -u

    prob = dxode.ODEProblem(decay, np.ones((2, 2)), (0.0, 1.0))
    # The method named is the one passed (AutoSwitch's used to say "Rodas5P needs...").
    match = rf"^{type(alg).__name__} needs a 1-D state u0 of shape \(n,\), got shape \(2, 2\)"
    with pytest.raises(ValueError, match=match):
        if how == "ensemble":
            dxode.solve(dxode.EnsembleProblem(prob), alg, trajectories=2)
        else:
            dxode.solve(prob, alg, kernel=how == "kernel")
    assert calls == []  # not at the first step, after f ran


def test_bad_options():
    with pytest.raises(ValueError, match="autodiff must be one of"):
        dxode.Rodas5P(autodiff="forward")
    with pytest.raises(TypeError, match="jac must be callable"):
        dxode.ODEProblem(prothero_robinson, [0.0, 1.0], (0.0, 1.0), jac=np.eye(2))
    assert (
        repr(dxode.Rodas4(autodiff="finite_difference")) == "Rodas4(autodiff='finite_difference')"
    )


def test_autograd_on_another_backend_is_refused():
    xs = pytest.importorskip("array_api_strict")
    prob = dxode.ODEProblem(lambda u, p, t: -u, xs.asarray([1.0, 2.0]), (0.0, 1.0))
    with pytest.raises(ValueError, match="needs NumPy arrays"):
        dxode.solve(prob, dxode.Rodas5P(autodiff="autograd"))


def test_dask_batches_equal_the_local_ensemble():
    distributed = pytest.importorskip("distributed")
    prob = dxode.ODEProblem(prothero_robinson, [0.0, 1.0], (0.0, 2.0), -1.0)
    eprob = dxode.EnsembleProblem(prob, p=-np.logspace(0, 6, 16))
    local = dxode.solve(eprob, dxode.Rodas5P(), trajectories=16, saveat=[2.0])
    with (
        dxode.local_cluster(n_workers=1) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        sim = dxode.solve(
            eprob,
            dxode.Rodas5P(),
            dxode.EnsembleDask(client),
            trajectories=16,
            batch_size=5,
            saveat=[2.0],
        )
    np.testing.assert_array_equal(sim.u, local.u)
    np.testing.assert_array_equal(sim.stats.nf, local.stats.nf)


def _decay_jac(u, p, t):
    minus_one = -np.eye(u.shape[0])
    return minus_one if u.ndim == 1 else minus_one[:, :, None] * np.ones(u.shape[1])


@pytest.mark.parametrize("method", [dxode.Rodas5P(), dxode.AutoSwitch()], ids=repr)
def test_a_large_state_warns_once_of_its_dense_linear_algebra(method):
    # A stiff solve of n components builds and factors n x n matrices at every step: at 10^4
    # components 800 MB and 2e12 operations each, a crawl that said nothing.
    n = dxode.solvers.stiff.LARGE_STATE
    prob = dxode.ODEProblem(lambda u, p, t: -u, np.ones(n), (0.0, 1e-3), None, jac=_decay_jac)
    eprob = dxode.EnsembleProblem(prob, u0=np.ones((2, n)))
    with pytest.warns(dxode.LargeStiffSystemWarning, match=r"1,000 components .* O\(n\^3\)") as w:
        sim = dxode.solve(eprob, method, trajectories=2, batch_size=1, saveat=[1e-3])
    assert len(w) == 1 and w[0].filename == __file__  # once, at the user's line
    np.testing.assert_allclose(sim.u[:, -1], np.exp(-1e-3), rtol=1e-6)
    smaller = prob.remake(u0=np.ones(n - 1))
    dxode.solve(smaller, method, saveat=[1e-3])  # filterwarnings = error: none below
