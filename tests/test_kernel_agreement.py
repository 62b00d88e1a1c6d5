"""The compiled kernels agree with the array path: solutions, step counts, return codes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("numba")

import dxode
from dxode.kernels.errors import KernelUnsupportedError

from problems import ARENSTORF, DECAY, DETEST, lorenz

E3 = next(ref for ref in DETEST if ref.name == "E3")  # np.sin of t
LORENZ = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 3.0), (10.0, 28.0, 8 / 3))
TOL = {"rtol": 1e-6, "atol": 1e-6}


def _solve_both(prob, alg, **kwargs):
    array = dxode.solve(prob, alg, **kwargs)
    kernel = dxode.solve(prob, alg, kernel=True, **kwargs)
    return array, kernel


def _same_stats(a, b):
    return (a.stats.naccept, a.stats.nreject, a.stats.nf) == (
        b.stats.naccept,
        b.stats.nreject,
        b.stats.nf,
    )


@pytest.mark.parametrize("alg", ["tsit5", "dp5", "bs3", "vern7"])
def test_adaptive_methods_agree_with_the_array_path(alg):
    array, kernel = _solve_both(LORENZ, alg, saveat=0.25, **TOL)
    assert kernel.retcode == dxode.ReturnCode.Success
    np.testing.assert_allclose(kernel.u, np.asarray(array.u), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(kernel.t, np.asarray(array.t))
    # Same steps: the arithmetic differs only in the controller's power (the kernel's own
    # vectorized exp/log against NumPy's power).
    assert _same_stats(array, kernel)


@pytest.mark.parametrize("alg", ["rk4", "euler"])
def test_fixed_step_methods_agree_bitwise(alg):
    array, kernel = _solve_both(LORENZ, alg, dt=0.01, saveat=0.5)
    np.testing.assert_array_equal(kernel.u, np.asarray(array.u))
    assert _same_stats(array, kernel)


def test_every_step_saved_without_saveat():
    array = dxode.solve(LORENZ, "tsit5", dense=False, **TOL)
    kernel = dxode.solve(LORENZ, "tsit5", kernel=True, **TOL)
    assert kernel.t.shape == np.asarray(array.t).shape
    np.testing.assert_allclose(kernel.t, np.asarray(array.t), rtol=1e-9, atol=0)
    np.testing.assert_allclose(kernel.u, np.asarray(array.u), rtol=0, atol=1e-8)


@pytest.mark.parametrize("ref", [DECAY, ARENSTORF, E3], ids=lambda r: r.name)
def test_reference_problems(ref):
    prob = dxode.ODEProblem(ref.f, np.array(ref.u0), ref.tspan, ref.p)
    array, kernel = _solve_both(prob, "tsit5", saveat=ref.tspan[1] / 4, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(kernel.u, np.asarray(array.u), rtol=1e-9, atol=1e-9)
    assert _same_stats(array, kernel)


def test_tstops_are_stepped_onto():
    stops = [0.3337, 1.2345]
    array, kernel = _solve_both(LORENZ, "tsit5", tstops=stops, dense=False, **TOL)
    for stop in stops:
        assert stop in set(kernel.t.tolist())
    # The short step cut at a tstop has an error estimate made mostly of rounding noise, so
    # the ulp-level differences (the controller's power) grow there: times agree to 1e-7.
    np.testing.assert_allclose(kernel.t, np.asarray(array.t), rtol=1e-7, atol=0)
    assert _same_stats(array, kernel)


def test_float32_runs_in_float32():
    prob = dxode.ODEProblem(
        lorenz, np.array([1.0, 0.0, 0.0], dtype=np.float32), (0.0, 1.0), (10.0, 28.0, 8 / 3)
    )
    array, kernel = _solve_both(prob, "tsit5", saveat=0.5, rtol=1e-4, atol=1e-4)
    assert kernel.u.dtype == np.float32
    np.testing.assert_allclose(kernel.u, np.asarray(array.u), rtol=1e-3, atol=1e-3)


def _two_rates(u, p, t):
    return [-p[0] * u[0], -p[1] * u[1]]


@pytest.mark.parametrize(
    ("p", "name"),
    [
        (np.array([1.0, 2.0]), "p has dtype float64"),
        ((1.0, np.float64(2.0)), r"p\[1\] has dtype float64"),
        (np.array([1, 2]), "p has dtype int64"),
    ],
)
def test_float32_state_with_float64_parameters_is_refused_on_both_paths(p, name):
    # The array path refuses f's float64 result; the kernel computed f in float64 silently.
    prob = dxode.ODEProblem(_two_rates, np.array([1.0, 0.5], dtype=np.float32), (0.0, 1.0), p)
    with pytest.raises(TypeError, match="returned dtype float64 for a float32 state"):
        dxode.solve(prob, "tsit5")
    with pytest.raises(TypeError, match=f"{name} for a float32 state"):
        dxode.solve(prob, "tsit5", kernel=True)
    with pytest.raises(TypeError, match=f"{name} for a float32 state"):
        dxode.solve(dxode.EnsembleProblem(prob), "tsit5", dxode.EnsembleKernel(), trajectories=2)


def test_float32_state_with_integer_trajectory_parameters_is_refused_on_both_paths():
    # Floating per-trajectory parameters take the state's dtype on both paths; integer ones
    # stay integers, which the array path refuses (f returns float64).
    prob = dxode.ODEProblem(_two_rates, np.array([1.0, 0.5], dtype=np.float32), (0.0, 1.0))
    eprob = dxode.EnsembleProblem(prob, p=np.array([[1, 2], [3, 4]]))
    with pytest.raises(TypeError, match="returned dtype float64 for a float32 state"):
        dxode.solve(eprob, "tsit5", dxode.EnsembleArray())
    with pytest.raises(TypeError, match="p has dtype int64 for a float32 state"):
        dxode.solve(eprob, "tsit5", dxode.EnsembleKernel())


def _integer_array(u, p, t):
    return np.array([1, 2])


def _bool_array(u, p, t):
    return u > 0.0


def _integer_rows(u, p, t):
    return [1, 2]


_RATE64 = np.float64(2.0)


def _float64_array(u, p, t):
    du = np.zeros(2)  # float64 whatever u's dtype
    du[0] = -u[0]
    du[1] = -u[1]
    return du


def _float64_constant_row(u, p, t):
    return [-u[0], -_RATE64 * u[1]]


def _float32_array(u, p, t):
    return np.array([-u[0], -u[1]], dtype=np.float32)


@pytest.mark.parametrize(
    ("f", "returned", "state"),
    [
        (_integer_array, "int64", np.float64),
        (_bool_array, "bool", np.float64),
        (_float64_array, "float64", np.float32),
        (_float64_constant_row, "float64", np.float32),
        (_float32_array, "float32", np.float64),
    ],
)
def test_a_result_of_another_dtype_is_refused_on_both_paths(f, returned, state):
    # The array path refused it; the kernel cast it to the state's dtype silently.
    prob = dxode.ODEProblem(f, np.array([1.0, 0.5], dtype=state), (0.0, 1.0))
    message = f"returned dtype {returned} for a {np.dtype(state)} state; keep it in u's dtype"
    with pytest.raises(TypeError, match=message):
        dxode.solve(prob, "tsit5")
    with pytest.raises(TypeError, match=message):
        dxode.solve(prob, "tsit5", kernel=True)
    with pytest.raises(TypeError, match=message):
        dxode.solve(dxode.EnsembleProblem(prob), "tsit5", dxode.EnsembleKernel(), trajectories=2)


def _literal_times_float32(u, p, t):
    return np.array([-2.0 * u[0], -u[1]])


def test_an_array_of_a_literal_times_a_float32_row_is_float32_on_both_paths():
    # numba computes 2.0 * x of a float32 x in float64, NumPy in float32: the kernel judges
    # f's dtype as the array path does, and accepts it.
    prob = dxode.ODEProblem(_literal_times_float32, np.array([1.0, 0.5], np.float32), (0.0, 1.0))
    array, kernel = _solve_both(prob, "tsit5", saveat=[1.0])
    assert kernel.u.dtype == np.asarray(array.u).dtype == np.float32
    np.testing.assert_allclose(kernel.u, np.asarray(array.u), rtol=1e-5)


def _a_jacs_shape(u, p, t):
    return np.array([[u[1], 0.0], [-u[0], 0.0]])


def test_an_f_returning_a_jacs_shape_is_refused_on_both_paths():
    # The kernel's row check took (n, n) from f (it is shared with jac) and the kernel then
    # failed to compile with numba's message.
    prob = dxode.ODEProblem(_a_jacs_shape, [1.0, 0.0], (0.0, 1.0))
    with pytest.raises(ValueError, match=r"returned shape \(2, 2\) for a state of shape \(2,\)"):
        dxode.solve(prob, "tsit5")
    with pytest.raises(ValueError, match=r"the f defined at .* rows of shape \(2, 2\)"):
        dxode.solve(prob, "tsit5", kernel=True)


def test_rows_of_integers_from_f_take_the_state_dtype_on_both_paths():
    prob = dxode.ODEProblem(_integer_rows, [1.0, 2.0], (0.0, 1.0))
    array, kernel = _solve_both(prob, "tsit5", saveat=[1.0])
    np.testing.assert_array_equal(kernel.u, np.asarray(array.u))
    np.testing.assert_allclose(kernel.u[-1], [2.0, 4.0], rtol=1e-15)


@pytest.mark.parametrize(
    ("p", "named"),
    [("fast", r"p = 'fast' \(str"), ((1.0, 2 + 1j), r"p\[1\] = \(2\+1j\) \(complex")],
)
def test_a_parameter_that_is_not_a_real_number_is_refused_naming_it(p, named):
    # The kernel said "take numeric parameters, got <U4", naming neither the leaf nor its type.
    prob = dxode.ODEProblem(_two_rates, [1.0, 0.5], (0.0, 1.0), p)
    with pytest.raises(KernelUnsupportedError, match=f"real numbers as parameters, got {named}"):
        dxode.solve(prob, "tsit5", kernel=True)


def test_array_api_states_are_solved_on_the_host():
    # EnsembleKernel failed with "Cannot interpret 'array_api_strict.float64' as a data type".
    xps = pytest.importorskip("array_api_strict")
    strict = LORENZ.remake(u0=xps.asarray([1.0, 0.0, 0.0]))
    expected = dxode.solve(LORENZ, "tsit5", saveat=[1.0], kernel=True, **TOL).u
    np.testing.assert_array_equal(
        dxode.solve(strict, "tsit5", saveat=[1.0], kernel=True, **TOL).u, expected
    )
    eprob = dxode.EnsembleProblem(strict)
    sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), trajectories=2, saveat=[1.0], **TOL)
    np.testing.assert_array_equal(sim.u, np.stack([expected, expected]))
    # an array_api_strict p: "'DType' object has no attribute 'kind'"
    strict_p = strict.remake(p=xps.asarray(LORENZ.p))
    np.testing.assert_array_equal(
        dxode.solve(strict_p, "tsit5", saveat=[1.0], kernel=True, **TOL).u, expected
    )


def toss(u, p, t):
    return [u[1], -9.81 + 0.0 * u[0]]


@pytest.mark.parametrize("alg", ["tsit5", "vern7"])
def test_float32_save_points_inside_steps_are_as_accurate_as_the_steps(alg):
    """A thrown ball's height is a parabola, which both methods integrate exactly: the saves
    inside steps (the dense output) carry only float32 rounding, like the step ends. The
    interpolant's weights evaluated in float32 were off by up to 6e-6 (Tsit5) and 3e-4
    (Vern7, coefficients up to 1207): height errors of 2.1e-6 and 2.3e-5."""
    prob = dxode.ODEProblem(toss, np.array([1.0, 3.0], dtype=np.float32), (0.0, 0.6))
    kwargs = {"saveat": np.linspace(0.0, 0.6, 61), "rtol": 1e-5, "atol": 1e-6}
    paths = (
        _solve_both(prob, alg, **kwargs) if alg == "vern7" else [dxode.solve(prob, alg, **kwargs)]
    )
    for sol in paths:
        t = np.asarray(sol.t, dtype=np.float64)
        assert np.asarray(sol.u).dtype == np.float32
        np.testing.assert_allclose(sol.u[:, 0], 1 + 3 * t - 9.81 / 2 * t**2, rtol=0, atol=1.5e-6)


def test_max_iters_and_dtmin_return_codes():
    array, kernel = _solve_both(LORENZ, "tsit5", saveat=1.0, maxiters=10, **TOL)
    assert kernel.retcode == array.retcode == dxode.ReturnCode.MaxIters
    assert _same_stats(array, kernel)
    array, kernel = _solve_both(LORENZ, "tsit5", saveat=1.0, dtmin=0.05, **TOL)
    assert kernel.retcode == array.retcode == dxode.ReturnCode.DtLessThanMin
    assert _same_stats(array, kernel)
    np.testing.assert_array_equal(np.isnan(kernel.u), np.isnan(np.asarray(array.u)))


def test_dtmax_limits_the_step():
    array, kernel = _solve_both(LORENZ, "tsit5", saveat=1.0, dtmax=0.01, **TOL)
    assert kernel.stats.naccept >= 300
    assert _same_stats(array, kernel)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtmax": 1e-9}, r"dtmax=1e-09 needs 3e\+09 steps to cover tspan \(0.0, 3.0\)"),
        ({"alg": "rk4", "dt": 1e-5}, r"fixed steps of dt=1e-05 needs 3e\+05 steps"),
    ],
    ids=["dtmax", "fixed dt"],
)
def test_a_span_beyond_maxiters_steps_is_refused_before_any_work_on_both_paths(options, message):
    # Both paths crawled through 100,000 steps to MaxIters (10-20 s for Lorenz).
    options = {"alg": "tsit5", **options}
    alg = options.pop("alg")
    eprob = dxode.EnsembleProblem(LORENZ)
    match = f"{message}.*more than maxiters=100000.*raise"
    with pytest.raises(ValueError, match=match):
        dxode.solve(LORENZ, alg, **options)
    with pytest.raises(ValueError, match=match):
        dxode.solve(LORENZ, alg, kernel=True, **options)
    with pytest.raises(ValueError, match=match):
        dxode.solve(eprob, alg, dxode.EnsembleKernel(), trajectories=2, **options)


def _always(u, p, t):
    return True


def test_a_span_beyond_maxiters_steps_is_solved_where_a_callback_may_terminate():
    stop = dxode.DiscreteCallback(_always, terminate=True)
    array, kernel = _solve_both(LORENZ, "tsit5", dtmax=1e-9, callback=stop)
    assert kernel.retcode == array.retcode == dxode.ReturnCode.Terminated
    np.testing.assert_allclose(kernel.t, np.asarray(array.t), rtol=0, atol=1e-20)


def test_a_blow_up_is_unstable_like_the_array_path():
    def blowup(u, p, t):
        (x,) = u
        return [x * x]

    prob = dxode.ODEProblem(blowup, np.array([1.0]), (0.0, 2.0))
    array, kernel = _solve_both(prob, "tsit5", saveat=1.0)
    assert kernel.retcode == array.retcode
    assert kernel.retcode != dxode.ReturnCode.Success


@pytest.mark.parametrize(("dtmin", "code"), [(0.01, "DtLessThanMin"), (5e-3, "Success")])
def test_dtmin_after_accepted_steps_like_the_array_path(dtmin, code):
    # This solve's steps are 0.009 to 0.04, with one rejection early on: dtmin=0.01 must fail
    # (it ended in Success on both paths: it was checked only after rejections); dtmin=5e-3
    # is below every step but those landing on the stop at 2.9995 and on the end 5e-4 later.
    kwargs = {"saveat": 1.0, "dtmin": dtmin, "tstops": [1.5, 2.9995], **TOL}
    array, kernel = _solve_both(LORENZ, "tsit5", **kwargs)
    assert kernel.retcode == array.retcode == dxode.ReturnCode[code]
    assert _same_stats(array, kernel)
    np.testing.assert_allclose(kernel.u, np.asarray(array.u), rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "controller",
    [
        dxode.IController(),
        dxode.PIDController(beta1=0.5, beta2=-0.2, beta3=0.1),
        dxode.PIController(safety=0.5, factor_min=0.9, factor_max=1.1),
    ],
    ids=["I", "PID", "narrow"],
)
def test_controller_parameters_are_compiled_in(controller):
    array, kernel = _solve_both(LORENZ, "tsit5", saveat=1.0, controller=controller, **TOL)
    assert _same_stats(array, kernel)
    np.testing.assert_allclose(kernel.u, np.asarray(array.u), rtol=0, atol=1e-9)


@dataclasses.dataclass(frozen=True)
class _SlowGrowth(dxode.PIController):
    """PI, but a step grows by 1 % at most: a rule of its own, which the kernels cannot run."""

    def adapt(self, xp, error_norm, h, memory, error_order):
        accept, h_next, memory = super().adapt(xp, error_norm, h, memory, error_order)
        return accept, xp.minimum(h_next, 1.01 * h), memory


def test_a_controller_with_its_own_adapt_is_refused():
    # The kernel compiled in the PID rule with the subclass's constants and ignored its adapt:
    # 15 steps where the array path, running it, takes 574.
    prob = dxode.ODEProblem(lambda u, p, t: [-u[0] + np.sin(t)], np.array([1.0]), (0.0, 3.0))
    array = dxode.solve(prob, "tsit5", controller=_SlowGrowth(), dt=1e-4)
    assert array.stats.naccept > 500
    with pytest.raises(KernelUnsupportedError, match=r"_SlowGrowth.*its own.*array path"):
        dxode.solve(prob, "tsit5", controller=_SlowGrowth(), dt=1e-4, kernel=True)
    with pytest.raises(KernelUnsupportedError, match="_SlowGrowth"):
        dxode.solve(
            dxode.EnsembleProblem(prob, u0=np.array([[1.0], [2.0]])),
            "tsit5",
            dxode.EnsembleKernel(),
            controller=_SlowGrowth(),
            saveat=[3.0],
        )


class _LinearTsit5(dxode.Tsit5):
    """Tsit5 saving by linear interpolation between its step ends."""

    def interpolate(self, step, theta):
        return step.u0 + theta * (step.u1 - step.u0)


class _LaggedRodas5P(dxode.Rodas5P):
    """Rodas5P with a Jacobian computation of its own (here: the inherited one)."""

    def derivatives(self, *args, **kwargs):
        return super().derivatives(*args, **kwargs)


@pytest.mark.parametrize(
    ("alg", "name"),
    [
        (_LinearTsit5(), r"ExplicitRungeKutta\.interpolate"),
        (_LaggedRodas5P(), r"Rosenbrock\.derivatives"),
        (dxode.AutoSwitch(stiff=_LaggedRodas5P()), r"Rosenbrock\.derivatives"),
    ],
    ids=["interpolate", "derivatives", "autoswitch"],
)
def test_a_method_with_its_own_step_is_refused(alg, name):
    # The kernels generated the base method from the tableau and ignored the override: the
    # linear interpolant's saves at t = 1, 2 were 0.7049, 0.8600 on the array path and Tsit5's
    # own 0.7024, 0.8657 in the kernel.
    prob = dxode.ODEProblem(lambda u, p, t: [-u[0] + np.sin(t)], np.array([1.0]), (0.0, 3.0))
    dxode.solve(prob, alg, saveat=[1.0, 2.0])
    with pytest.raises(KernelUnsupportedError, match=rf"_\w+ overrides {name}.*array path"):
        dxode.solve(prob, alg, saveat=[1.0, 2.0], kernel=True)
