"""Gradients through the compiled kernels (``solve(kernel=True)``, ``EnsembleKernel``).

The kernel's forward sensitivities (complex-step JVPs of ``f``, or the problem's ``jac`` and
``paramjac``, compiled with the kernel) against the array path's gradients (autograd through
the discrete adjoint, an independent implementation) and central differences.
"""

from __future__ import annotations

import math
import textwrap
import types
from math import exp

import numpy as np
import pytest

pytest.importorskip("numba")
autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")

from scripts import assert_runs_under_cuda_simulator  # noqa: E402

import dxode  # noqa: E402
from dxode.demo.lorenz import lorenz, lorenz_jac, lorenz_paramjac  # noqa: E402
from dxode.kernels.errors import KernelUnsupportedError  # noqa: E402

TIMES = np.linspace(0.0, 5.0, 11)


def damped(u, p, t):
    x, v = u
    omega, zeta = p
    return [v, -omega * omega * x - 2.0 * zeta * omega * v]


def _oscillator_loss(theta, kernel, dtype=np.float64, rtol=1e-10):
    u0 = theta[:2] if dtype == np.float64 else anp.array(theta[:2], dtype=dtype)
    prob = dxode.ODEProblem(damped, u0, (0.0, 5.0), (theta[2], theta[3]))
    sol = dxode.solve(prob, dxode.Tsit5(), saveat=TIMES, rtol=rtol, atol=rtol, kernel=kernel)
    return anp.sum(sol.u**2)


def _central_differences(func, x, eps=1e-6):
    return np.array([(func(x + eps * e) - func(x - eps * e)) / (2 * eps) for e in np.eye(x.size)])


def test_single_solve_gradient_matches_the_array_path_and_central_differences():
    theta = np.array([1.0, 0.5, 1.6, 0.3])  # u0 (x, v) and p (omega, zeta)
    kernel = autograd.grad(lambda th: _oscillator_loss(th, True))(theta)
    array = autograd.grad(lambda th: _oscillator_loss(th, False))(theta)
    differences = _central_differences(lambda th: _oscillator_loss(th, True), theta)
    np.testing.assert_allclose(kernel, array, rtol=1e-7)
    np.testing.assert_allclose(kernel, differences, rtol=1e-6)


def test_differentiated_solve_steps_as_the_plain_kernel_solve():
    """Sensitivities stay out of the error norm: ``sol.u`` and the statistics are those of the
    solve without gradients, bit for bit."""
    prob = dxode.ODEProblem(damped, np.array([1.0, 0.5]), (0.0, 5.0), (1.6, 0.3))
    options = {"saveat": TIMES, "rtol": 1e-8, "atol": 1e-8, "kernel": True}
    plain = dxode.solve(prob, dxode.Tsit5(), **options)
    seen = {}

    def loss(p):
        sol = dxode.solve(prob.remake(p=(p[0], p[1])), dxode.Tsit5(), **options)
        seen["u"], seen["stats"] = autograd.tracer.getval(sol.u), sol.stats
        return anp.sum(sol.u)

    autograd.grad(loss)(np.array([1.6, 0.3]))
    assert np.array_equal(seen["u"], plain.u)
    assert seen["stats"] == plain.stats


def test_without_saveat_every_step_is_saved_and_differentiated_as_without_gradients():
    prob = dxode.ODEProblem(damped, np.array([1.0, 0.5]), (0.0, 5.0), (1.6, 0.3))
    options = {"rtol": 1e-8, "atol": 1e-8, "kernel": True}
    steps = dxode.solve(prob, **options).t

    def loss(p, **saving):
        sol = dxode.solve(prob.remake(p=(p[0], p[1])), **saving, **options)
        return anp.sum(sol.u**2 * np.arange(len(sol.t))[:, None])

    value, grad = autograd.value_and_grad(loss)(np.array([1.6, 0.3]))
    assert value == pytest.approx(loss(np.array([1.6, 0.3])), rel=1e-14)
    np.testing.assert_allclose(grad, autograd.grad(loss)(np.array([1.6, 0.3]), saveat=steps))


def _bounce(u, p, t, fired):
    return [u[0], -p[1] * u[1]]


@pytest.mark.parametrize("differentiated", [False, True])
def test_an_ensemble_with_callbacks_and_a_stiff_method_is_refused_with_or_without_gradients(
    differentiated,
):
    # The kernels locate events in the explicit methods' dense output only: a differentiated
    # solve must refuse like the plain one (it used to find the events on the array path).
    ball = dxode.ContinuousCallback(lambda u, p, t: u[0], _bounce, direction="down")

    def loss(e):
        prob = dxode.ODEProblem(damped, [1.0, 0.0], (0.0, 1.0), (1.0, e))
        eprob = dxode.EnsembleProblem(prob)
        sim = dxode.solve(
            eprob,
            dxode.Rodas5P(),
            dxode.EnsembleKernel(),
            trajectories=2,
            saveat=[1.0],
            callback=ball,
        )
        return anp.sum(sim.u)

    with pytest.raises(KernelUnsupportedError, match=r"explicit Runge–Kutta.*EnsembleArray"):
        autograd.grad(loss)(0.8) if differentiated else loss(0.8)


def test_float32_gradient_agrees_with_float64():
    theta = np.array([1.0, 0.5, 1.6, 0.3])
    single = autograd.grad(lambda th: _oscillator_loss(th, True, np.float32, 1e-6))(theta)
    double = autograd.grad(lambda th: _oscillator_loss(th, True))(theta)
    np.testing.assert_allclose(single, double, rtol=1e-4)


U0S = np.array([[1.0, 0.0, 0.0], [0.5, 1.0, 2.0], [-1.0, 2.0, 20.0], [3.0, -2.0, 10.0]])
SCALES = np.array([1.0, 0.95, 1.05, 1.1])


def _lorenz_loss(p, ensemble_alg, shared, batch_size=None, **problem):
    base = dxode.ODEProblem(lorenz, U0S[0], (0.0, 1.0), (10.0, 28.0, 8 / 3), **problem)
    if shared:  # one parameter vector for every trajectory: its cotangents are summed
        eprob = dxode.EnsembleProblem(base.remake(p=p), u0=U0S)
    else:  # per-trajectory parameters (4, 3)
        eprob = dxode.EnsembleProblem(base, u0=U0S, p=p)
    options = {"saveat": [0.25, 0.5, 1.0], "rtol": 1e-10, "atol": 1e-10}
    sim = dxode.solve(
        eprob, dxode.Tsit5(), ensemble_alg, trajectories=4, batch_size=batch_size, **options
    )
    return anp.sum(sim.u**2)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-p", "per-lane-p"])
def test_ensemble_gradient_matches_the_array_path(shared):
    theta = np.array([10.0, 28.0, 8 / 3])
    p = theta if shared else theta * SCALES[:, None]
    kernel = autograd.grad(lambda q: _lorenz_loss(q, dxode.EnsembleKernel(), shared))(p)
    array = autograd.grad(lambda q: _lorenz_loss(q, dxode.EnsembleArray(), shared))(p)
    assert kernel.shape == p.shape
    np.testing.assert_allclose(kernel, array, rtol=1e-6)


def test_user_jacobians_replace_complex_step():
    """With ``jac`` and ``paramjac`` the kernel contracts them instead of stepping ``f``; the
    steps are the same, so the gradients agree to rounding."""
    p = np.array([10.0, 28.0, 8 / 3]) * SCALES[:, None]
    alg = dxode.EnsembleKernel()
    stepped = autograd.grad(lambda q: _lorenz_loss(q, alg, False))(p)
    hand = autograd.grad(
        lambda q: _lorenz_loss(q, alg, False, jac=lorenz_jac, paramjac=lorenz_paramjac)
    )(p)
    np.testing.assert_allclose(hand, stepped, rtol=1e-11)


def _with_abs(u, p, t):
    x, v = u
    return [v, -p[0] * x - p[1] * v * abs(v)]


def _with_branch(u, p, t):
    x, v = u
    if x > 0.0:
        return [v, -p[0] * x]
    return [v, -p[1] * x]


def _time_switch(u, p, t):
    x, v = u
    k = p[0] if t < 1.0 else p[1]  # a comparison on t alone: complex step is fine
    return [v, -k * x - 0.1 * math.sin(x) * exp(-x * t)]  # math.sin, and exp from math


def _time_switch_traced(u, p, t):  # the same for autograd (which cannot trace math)
    x, v = u
    k = p[0] if t < 1.0 else p[1]
    return [v, -k * x - 0.1 * anp.sin(x) * anp.exp(-x * t)]


def _loss_wrt_p(f, kernel=True, **problem):
    prob = dxode.ODEProblem(f, np.array([1.0, 0.0]), (0.0, 2.0), (1.0, 0.5), **problem)

    def loss(p):
        options = {"saveat": [2.0], "rtol": 1e-10, "atol": 1e-10, "kernel": kernel}
        options["tstops"] = [1.0]  # where _time_switch jumps
        sol = dxode.solve(prob.remake(p=(p[0], p[1])), "tsit5", **options)
        return anp.sum(sol.u**2)

    return loss


def _grad_wrt_p(f, kernel=True, **problem):
    return autograd.grad(_loss_wrt_p(f, kernel, **problem))(np.array([1.0, 0.5]))


def test_non_analytic_f_is_refused_by_name():
    with pytest.raises(KernelUnsupportedError, match=r"abs \(line") as err:
        _grad_wrt_p(_with_abs)
    assert "jac=" in str(err.value) and "kernel=False" in str(err.value)


def test_comparison_on_the_state_is_refused():
    with pytest.raises(KernelUnsupportedError, match="comparisons"):
        _grad_wrt_p(_with_branch)


def _fills_a_real_array(u, p, t):
    du = np.empty(2)
    du[0] = u[1]
    du[1] = -p[0] * u[0] - p[1] * u[1]
    return du


def test_an_f_filling_a_real_array_is_told_to_return_a_list():
    # The plain kernel takes this f; its complex copy cannot store complex values in the
    # float array, and the error blamed comparisons ("as in 'if x > 0:'"), which f has none of.
    with pytest.raises(KernelUnsupportedError, match=r"real array.*np\.empty.*as a list") as err:
        _grad_wrt_p(_fills_a_real_array)
    assert "if x > 0" not in str(err.value).split("numba says")[0]


def _helper_decay(v):
    return v * math.exp(-v)


def _with_cbrt(u, p, t):
    x, v = u
    return [v, -p[0] * np.cbrt(x) - p[1] * v]


@pytest.mark.parametrize(
    ("helper", "told"),
    [(None, r"no complex version of np\.cbrt"), (_helper_decay, r"math\.exp .*NumPy's twin")],
    ids=["np.cbrt", "math.exp-in-a-helper"],
)
def test_an_f_using_a_function_without_a_complex_version_is_told_which(helper, told):
    # analytic, but numba defines these for real numbers only; the error blamed comparisons
    import numba

    f = _with_cbrt if helper is None else _calling_helper(numba.njit(helper))
    with pytest.raises(KernelUnsupportedError, match=told) as err:
        _grad_wrt_p(f)
    assert "if x > 0" not in str(err.value).split("numba says")[0]


def test_comparison_on_time_and_math_functions_are_differentiated():
    """``math.sin`` runs as ``cmath.sin`` in the complex copy; the array path differentiates
    the same f written with ``autograd.numpy``."""
    kernel = _grad_wrt_p(_time_switch)
    array = _grad_wrt_p(_time_switch_traced, kernel=False)
    np.testing.assert_allclose(kernel, array, rtol=1e-7)


def _with_fixed_leaves(u, p, t):
    x, v = u
    k, terms, switch = p  # terms (an integer) and switch are not differentiated
    series = 0.0
    for _ in range(terms):
        series = series * x + 1.0
    drive = 0.5 if t > switch else 0.0
    return [v, -k * x + 0.01 * series - drive * v]


@pytest.mark.parametrize(
    "sensealg",
    [dxode.ForwardSensitivity(), dxode.DiscreteAdjoint(), "complex-step-parameter-pass"],
)
def test_leaves_that_are_not_differentiated_stay_real_in_the_complex_copy(sensealg, monkeypatch):
    # f counts with one leaf and compares t with another; neither is differentiated, so
    # complex step needs neither complex. The complex copy took every leaf as complex and
    # refused f as not real-analytic, though the plain kernel and the array path take it.
    if sensealg == "complex-step-parameter-pass":  # the adjoint's fallback to autograd
        monkeypatch.setattr("dxode.kernels.adjoint_backward.autograd_rows", lambda *a: None)
        sensealg = dxode.DiscreteAdjoint()

    _assert_kernel_gradient_is_the_array_paths(_with_fixed_leaves, (3, 1.0), sensealg, [1.0])


def _assert_kernel_gradient_is_the_array_paths(f, fixed_leaves, sensealg, tstops=None):
    """The kernel's gradient (``sensealg``) of ``sum(u**2)`` at ``t = 1, 2`` with respect to
    ``u0`` (2 components) and the first leaf of ``p = (leaf, *fixed_leaves)``, against the
    array path's."""

    def loss(theta, kernel):
        prob = dxode.ODEProblem(f, theta[:2], (0.0, 2.0), (theta[2], *fixed_leaves))
        options = {"saveat": [1.0, 2.0], "tstops": tstops, "rtol": 1e-10, "atol": 1e-10}
        sensealg_of = sensealg if kernel else None
        sol = dxode.solve(prob, "tsit5", kernel=kernel, sensealg=sensealg_of, **options)
        return anp.sum(sol.u**2)

    theta = np.array([0.7, 0.2, 1.3])
    kernel = autograd.grad(loss)(theta, True)
    np.testing.assert_allclose(kernel, autograd.grad(loss)(theta, False), rtol=1e-7)


def test_a_comparison_on_a_differentiated_leaf_is_still_refused():
    def loss(p):
        prob = dxode.ODEProblem(_with_fixed_leaves, [0.7, 0.2], (0.0, 2.0), (1.3, 3, p))
        return anp.sum(dxode.solve(prob, "tsit5", saveat=[2.0], kernel=True).u ** 2)

    with pytest.raises(KernelUnsupportedError, match="comparisons"):
        autograd.grad(loss)(1.0)


def _duffing(u, p, t):
    x, v = u
    k, n = p  # n: an integer power, as an argument
    return [v, -k * x - x**3 - 0.1 * v + 0.2 * x**n + pow(x, 5.0) * np.power(x, -1)]


@pytest.mark.parametrize("sensealg", [dxode.ForwardSensitivity(), dxode.DiscreteAdjoint()])
def test_powers_of_a_negative_base_are_differentiated(sensealg):
    # numba raises a complex number to a power through its polar form; for a negative base
    # its angle (about pi) rounds by 1e-16, which swamped complex step's 1e-30: the gradient
    # came out 1e10 times too large, silently, once x went negative
    _assert_kernel_gradient_is_the_array_paths(_duffing, (2,), sensealg)


def test_the_power_by_parts_is_the_real_power_and_its_derivative():
    from dxode.kernels.complex_step import complex_copy, complex_power

    h = 2.0**-100
    for x in (-2.0, -0.3, 0.3):
        for e in (1, 3, -1, 3.0):
            z = complex_power(complex(x, h), e)
            assert z.real == x**e and z.imag / h == pytest.approx(e * x ** (e - 1), rel=1e-14)
    assert complex_power(0.5, 3) == 0.125  # real arguments: the real power

    import numba

    copy = numba.njit(complex_copy(_duffing))
    for x in (-2.0, -0.3, 0.3):
        c = copy((complex(x, h), 0.0j), (1.3, 2), 0.0)
        slope = -1.3 - 3 * x**2 + 0.4 * x + 4 * x**3  # pow(x, 5.0) * x**-1 is x**4
        assert c[1].imag / h == pytest.approx(slope, rel=1e-13)


@pytest.mark.parametrize(
    "f",
    [lambda u, p, t: [u[1], -p[0] * u[0] ** 3 - p[1] * u[1]], "helper"],
    ids=["lambda", "compiled-helper"],
)
def test_powers_complex_step_cannot_rewrite_are_refused(f):
    import numba

    if f == "helper":
        f = _calling_helper(numba.njit(_helper_cube))
    with pytest.raises(KernelUnsupportedError, match=r"\*\*"):
        _grad_wrt_p(f)


def _helper_cube(v):
    return v**3


def test_an_f_written_with_autograd_numpy_is_compiled_and_differentiated():
    """The array path's differentiable f (``anp.sin``, ``anp.exp``) runs in the kernel as
    NumPy, and complex step differentiates it."""
    kernel = _grad_wrt_p(_time_switch_traced)
    array = _grad_wrt_p(_time_switch_traced, kernel=False)
    np.testing.assert_allclose(kernel, array, rtol=1e-7)


def _with_anp_abs(u, p, t):
    x, v = u
    return [v, -p[0] * x - p[1] * v * anp.abs(v)]


def test_abs_from_autograd_numpy_is_refused_by_name_at_its_line():
    import inspect

    line = inspect.getsourcelines(_with_anp_abs)[1] + 2
    with pytest.raises(KernelUnsupportedError, match=rf"np\.abs \(line {line}\)"):
        _grad_wrt_p(_with_anp_abs)


def _with_norm(u, p, t):
    return -p[0] * np.linalg.norm(u) * u - p[1] * u


def _with_vdot(u, p, t):
    return -p[0] * np.vdot(u, u) * u - p[1] * u


def _with_conj(u, p, t):
    return -p[0] * np.conj(u) - p[1] * u


def _with_real_attribute(u, p, t):
    x, v = u
    return [v, -p[0] * x.real - p[1] * v]


def _with_conjugate_method(u, p, t):
    x, v = u
    return [v, -p[0] * x.conjugate() - p[1] * v]


_norm = np.linalg.norm  # as `from numpy.linalg import norm` binds it


def _with_imported_norm(u, p, t):
    x, v = u
    return [v, -p[0] * x * _norm(np.array([x, v])) - p[1] * v]


@pytest.mark.parametrize(
    ("f", "named"),
    [
        (_with_norm, "np.linalg.norm"),
        (_with_vdot, "np.vdot"),
        (_with_conj, "np.conj"),
        (_with_real_attribute, ".real"),
        (_with_conjugate_method, ".conjugate"),
        (lambda u, p, t: -p[0] * np.linalg.norm(u) * u - p[1] * u, "np.linalg.norm"),
        (_with_imported_norm, "_norm (np.linalg.norm"),
    ],
    ids=["norm", "vdot", "conj", "real", "conjugate", "lambda-norm", "imported-norm"],
)
def test_what_takes_a_complex_number_apart_is_refused_by_name(f, named):
    """On the complex copy these are the modulus, a conjugate or the real part: the kernel
    gave d loss / dp = -0.65 where central differences give -0.49 for np.linalg.norm, and
    wrong numbers as silently for the others, before they were refused."""
    with pytest.raises(KernelUnsupportedError, match="cannot differentiate") as err:
        _grad_wrt_p(f)
    assert named in str(err.value) and "kernel=False" in str(err.value)


def test_the_norm_is_refused_by_the_discrete_adjoint_too():
    prob = dxode.ODEProblem(_with_norm, np.array([1.0, 0.5]), (0.0, 1.0), (0.7, 0.1))

    def loss(p):
        sol = dxode.solve(
            prob.remake(p=(p[0], p[1])),
            "tsit5",
            saveat=[1.0],
            kernel=True,
            sensealg=dxode.DiscreteAdjoint(),
        )
        return anp.sum(sol.u**2)

    with pytest.raises(KernelUnsupportedError, match=r"np\.linalg\.norm"):
        autograd.grad(loss)(np.array([0.7, 0.1]))


def test_analytic_linear_algebra_is_still_differentiated_by_complex_step():
    def f(u, p, t):
        return -np.linalg.det(np.array([[p[0], 0.0 * p[0]], [0.0 * p[1], p[1]]])) * u

    kernel = _grad_wrt_p(f)
    array = _grad_wrt_p(lambda u, p, t: -p[0] * p[1] * u, kernel=False)
    np.testing.assert_allclose(kernel, array, rtol=1e-7)


def _helper_damping(v):
    return v * abs(v)


def _helper_square(v):
    return v * v


def _calling_helper(helper):
    def f(u, p, t):
        x, v = u
        return [v, -p[0] * x - p[1] * helper(v)]

    return f


def test_abs_in_a_compiled_helper_is_refused_by_name():
    """The complex copy of f calls an @numba.njit helper with complex numbers, where its
    abs is the modulus: d loss / dp came out 0.70 and -0.68 where central differences give
    0.63 and -0.64, silently, before the helpers f calls were read too."""
    import numba

    f = _calling_helper(numba.njit(_helper_damping))
    with pytest.raises(KernelUnsupportedError, match=r"abs \(line \d+\) in the compiled helper"):
        _grad_wrt_p(f)


_HELPERS = types.ModuleType("helpers")  # a module of the user's, holding compiled helpers


def _calling_module_helper(u, p, t):
    x, v = u
    return [v, -p[0] * x - p[1] * _HELPERS.damping(v)]


def test_abs_in_a_compiled_helper_read_off_a_module_is_refused_by_name(monkeypatch):
    """A helper called as ``helpers.damping(v)`` was not read: its abs ran as the complex
    modulus, and d loss / dp came out 26 % off central differences, silently."""
    import numba

    monkeypatch.setattr(_HELPERS, "damping", numba.njit(_helper_damping), raising=False)
    with pytest.raises(KernelUnsupportedError, match=r"abs \(line \d+\) in the compiled helper"):
        _grad_wrt_p(_calling_module_helper)


def test_an_analytic_compiled_helper_is_still_differentiated_by_complex_step():
    import numba

    kernel = _grad_wrt_p(_calling_helper(numba.njit(_helper_square)))
    array = _grad_wrt_p(_calling_helper(_helper_square), kernel=False)
    np.testing.assert_allclose(kernel, array, rtol=1e-7)


def _without_source(text):
    """A function compiled from ``text`` (no file: ``inspect.getsource`` fails, as for one
    that Dask sent by value), with NumPy and math as globals."""
    import math

    namespace = {"np": np, "math": math}
    exec(compile(text, "<sent by value>", "exec"), namespace)
    return namespace["f"]


@pytest.mark.parametrize(
    ("f", "named"),
    [
        (lambda u, p, t: [u[1], -p[0] * u[0] - p[1] * u[1] * abs(u[1])], "abs"),
        (
            _without_source(
                "def f(u, p, t):\n    x, v = u\n    return [v, -p[0] * x - p[1] * np.fabs(v)]\n"
            ),
            "np.fabs",
        ),
        (
            _without_source("def f(u, p, t):\n    return [u[1], -p[0] * math.sin(u[0]) - p[1]]\n"),
            "math.sin",
        ),
    ],
    ids=["lambda-abs", "no-source-np.fabs", "no-source-math.sin"],
)
def test_an_f_without_source_is_refused_by_the_names_its_bytecode_uses(f, named):
    # a lambda's abs ran as the complex modulus: d/dp of the loss came out -0.72 where central
    # differences give -0.50, silently
    with pytest.raises(KernelUnsupportedError, match=r"read off the names") as err:
        _grad_wrt_p(f)
    assert named in str(err.value)
    assert "the source of a def in a module is read" in str(err.value)  # the way out


def test_a_plain_lambda_is_still_differentiated_by_complex_step():
    f = lambda u, p, t: [u[1], -p[0] * u[0] - p[1] * u[1]]
    kernel = _grad_wrt_p(f)
    array = _grad_wrt_p(f, kernel=False)
    np.testing.assert_allclose(kernel, array, rtol=1e-7)


def _abs_jac(u, p, t):
    _, v = u
    return [[0.0, 1.0], [-p[0], -2.0 * p[1] * abs(v)]]


def _abs_paramjac(u, p, t):
    x, v = u
    return [[0.0, 0.0], [-x, -v * abs(v)]]


def _damped_jac(u, p, t):
    omega, zeta = p
    return [[0.0, 1.0], [-omega * omega, -2.0 * zeta * omega]]


def _short_paramjac(u, p, t):
    x, _ = u
    return [[0.0], [-x]]  # one column where p has two scalars


def _long_paramjac(u, p, t):
    x, v = u
    return [[0.0, 0.0, 0.0], [-v, -x, 0.0]]  # three columns, the first two swapped


@pytest.mark.parametrize("paramjac", [_short_paramjac, _long_paramjac], ids=["short", "long"])
@pytest.mark.parametrize("sensealg", [None, dxode.DiscreteAdjoint()], ids=["forward", "adjoint"])
def test_a_paramjac_of_the_wrong_width_is_refused_naming_the_shape(paramjac, sensealg):
    """A short row failed inside numba (the forward kernel blamed ``f`` at a line of the
    generated source, the adjoint raised numba's TypingError); extra columns were read as if
    the first ones were p's, a silently wrong gradient. The array path refuses both."""

    def loss(p):
        problem = dxode.ODEProblem(
            damped,
            np.array([1.0, 0.5]),
            (0.0, 1.0),
            (p[0], p[1]),
            jac=_damped_jac,
            paramjac=paramjac,
        )
        options = {"saveat": [1.0], "kernel": True, "sensealg": sensealg}
        return anp.sum(dxode.solve(problem, "tsit5", **options).u ** 2)

    with pytest.raises(ValueError, match=r"paramjac.*2 rows of 2 entries"):
        autograd.grad(loss)(np.array([1.6, 0.3]))


def test_user_jacobians_differentiate_a_non_analytic_f():
    kernel = _grad_wrt_p(_with_abs, jac=_abs_jac, paramjac=_abs_paramjac)
    array = _grad_wrt_p(_with_abs, kernel=False)
    np.testing.assert_allclose(kernel, array, rtol=1e-5)


def test_continuous_adjoints_are_refused_on_the_kernel_path():
    prob = dxode.ODEProblem(damped, np.array([1.0, 0.5]), (0.0, 1.0), (1.6, 0.3))
    with pytest.raises(KernelUnsupportedError, match="ForwardSensitivity"):
        dxode.solve(prob, "tsit5", kernel=True, sensealg=dxode.InterpolatingAdjoint())
    # Nothing differentiated: ForwardSensitivity() is accepted and changes nothing.
    plain = dxode.solve(prob, "tsit5", kernel=True, saveat=[0.5, 1.0])
    forward = dxode.ForwardSensitivity()
    checked = dxode.solve(prob, "tsit5", kernel=True, saveat=[0.5, 1.0], sensealg=forward)
    assert np.array_equal(checked.u, plain.u)


def test_the_discrete_adjoint_through_a_stiff_method_names_what_the_kernels_take():
    # It named the internal KernelDiscreteAdjoint() and told to use InterpolatingAdjoint(),
    # which the kernels refuse in turn.
    def loss(p):
        prob = dxode.ODEProblem(damped, np.array([1.0, 0.5]), (0.0, 1.0), (p[0], p[1]))
        options = {"saveat": [1.0], "sensealg": dxode.DiscreteAdjoint(), "kernel": True}
        return anp.sum(dxode.solve(prob, dxode.Rodas5P(), **options).u)

    told = r"^DiscreteAdjoint\(\) cannot .* sensealg=ForwardSensitivity\(\) \(the compiled"
    with pytest.raises(NotImplementedError, match=told):
        autograd.grad(loss)(np.array([1.6, 0.3]))


SIMULATOR_SCRIPT = textwrap.dedent(
    """
    import autograd, autograd.numpy as anp, numpy as np
    import dxode
    from test_kernel_gradients import damped

    prob = dxode.ODEProblem(damped, np.array([1.0, 0.5]), (0.0, 2.0), (1.6, 0.3))
    u0s = np.array([[1.0, 0.5], [0.2, -0.3], [2.0, 0.0]])

    def loss(p, device):
        eprob = dxode.EnsembleProblem(prob, u0=u0s, p=p)
        sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device=device),
                          saveat=[0.5, 2.0], rtol=1e-8, atol=1e-8)
        return anp.sum(sim.u ** 2)

    p = np.array([[1.6, 0.3], [1.2, 0.1], [2.0, 0.5]])
    gpu = autograd.grad(lambda q: loss(q, "cuda"))(p)
    cpu = autograd.grad(lambda q: loss(q, "cpu"))(p)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-12)
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_simulator_gradients_match_the_cpu_kernel():
    pytest.importorskip("numba.cuda")
    assert_runs_under_cuda_simulator(SIMULATOR_SCRIPT)


@pytest.mark.slow
def test_dask_workers_differentiate_kernel_batches(client):
    """``EnsembleDask(kernel=...)``: each batch's sensitivities on its worker; per-lane
    cotangents are the local kernel's bit for bit, shared ones their sums over batches."""
    pytest.importorskip("distributed")
    theta = np.array([10.0, 28.0, 8 / 3])
    dask = dxode.EnsembleDask(client, kernel=dxode.EnsembleKernel(threads=1))
    local = dxode.EnsembleKernel(threads=1)
    for shared, p in ((False, theta * SCALES[:, None]), (True, theta)):
        here = autograd.grad(lambda q, s=shared: _lorenz_loss(q, local, s))(p)
        there = autograd.grad(lambda q, s=shared: _lorenz_loss(q, dask, s, batch_size=2))(p)
        if shared:
            np.testing.assert_allclose(there, here, rtol=1e-12)
        else:
            np.testing.assert_array_equal(there, here)


def _blowup(u, p, t):
    (x,) = u
    return [p[0] * x * x]  # x(t) = 1 / (1 - p t): infinite at t = 1 / p


def test_a_failed_lane_gets_nan_gradients_the_others_exact_ones():
    prob = dxode.ODEProblem(_blowup, np.array([1.0]), (0.0, 2.0), (0.1,))

    def loss(p):
        eprob = dxode.EnsembleProblem(prob, p=p)
        options = {"saveat": [2.0], "rtol": 1e-10, "atol": 1e-10}
        sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), trajectories=3, **options)
        return anp.sum(anp.where(np.isfinite(autograd.tracer.getval(sim.u)), sim.u, 0.0) ** 2)

    p = np.array([[0.1], [0.2], [1.0]])  # the last lane blows up at t = 1
    grad = autograd.grad(loss)(p)[:, 0]
    exact = 4.0 / (1.0 - 2.0 * p[:2, 0]) ** 3  # d/dp x(2)^2 = 4 / (1 - 2p)^3
    np.testing.assert_allclose(grad[:2], exact, rtol=1e-8)
    assert np.isnan(grad[2])


def _decay_array(u, p, t):
    return -p[0] * u  # needs u as an array: the kernel passes one (slower, but it works)


def test_f_taking_u_as_an_array_gets_exact_gradients():
    """``u(T) = u0 exp(-k T)``: loss ``Σ u(T)²`` has ``d/dk = -2 T loss`` and
    ``d/du0_i = 2 u0_i exp(-2 k T)``."""
    T, k = 1.5, 0.7
    u0 = np.array([1.0, -2.0, 0.5])

    def loss(theta):
        prob = dxode.ODEProblem(_decay_array, theta[:3], (0.0, T), (theta[3],))
        sol = dxode.solve(prob, "tsit5", saveat=[T], rtol=1e-11, atol=1e-11, kernel=True)
        return anp.sum(sol.u**2)

    grad = autograd.grad(loss)(np.append(u0, k))
    value = np.sum(u0**2) * np.exp(-2 * k * T)
    np.testing.assert_allclose(grad[:3], 2 * u0 * np.exp(-2 * k * T), rtol=1e-8)
    np.testing.assert_allclose(grad[3], -2 * T * value, rtol=1e-8)


def test_parameter_rows_map_to_the_scalars_of_a_nested_p():
    """Row r of the kernel's parameter array is the r-th scalar of p in leaf order; the
    complex p steps exactly that one (checked in Python, no compile)."""
    from dxode.kernels.rhs_source import ParamLayout
    from dxode.kernels.sensitivity_rhs import _complex_params, param_paths

    p = (np.array([1.0, 2.0]), 3.0, (4.0, np.array([5.0])))
    layout = ParamLayout.of(p, [False] * 4)
    paths = param_paths(layout.structure)
    assert layout.leaf_rows == [2, 1, 1, 1]
    lane_p = eval(layout.expression("0"), {"P": np.arange(1.0, 6.0)[:, None]})
    assert [eval(path, {"p": lane_p}) for path in paths] == [1.0, 2.0, 3.0, 4.0, 5.0]
    for row in range(5):
        text = _complex_params(layout.structure, paths, row, range(5))
        flat = [eval(path, {"p": eval(text, {"p": lane_p, "H": 1.0})}) for path in paths]
        assert [z.imag for z in flat] == [1.0 if k == row else 0.0 for k in range(5)]
        assert [z.real for z in flat] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # only the leaves holding a differentiated row are complex: here the first array
    text = _complex_params(layout.structure, paths, 1, [0, 1])
    flat = [eval(path, {"p": eval(text, {"p": lane_p, "H": 1.0})}) for path in paths]
    assert [isinstance(z, complex) for z in flat] == [True, True, False, False, False]


def _shifted_start(theta):
    return lambda prob, i, repeat: prob.remake(u0=[0.5 + (i + 1) / 100 * theta[0]])


def _flux(u, p, t):
    return [1.01 * u[0] * p[0]]


@pytest.mark.slow
def test_diffeqflux_data_parallel_training_matches_the_array_path():
    """DiffEqFlux's data-parallel tutorial (du/dt = 1.01 u p, u0_i = 0.5 + i/100 theta[0]):
    five Adam steps through EnsembleKernel give EnsembleArray's loss history to rounding
    (not bitwise: the controller's factor and the derivative's order of operations differ;
    see the ensembles tutorial)."""
    from autograd.misc.optimizers import adam

    def history(alg):
        def loss(theta):
            prob = dxode.ODEProblem(_flux, [theta[0]], (0.0, 1.0), [theta[1]])
            eprob = dxode.EnsembleProblem(prob, prob_func=_shifted_start(theta))
            options = {"trajectories": 100, "batch_size": 50, "saveat": 0.1}
            return anp.sum((1.0 - dxode.solve(eprob, dxode.Tsit5(), alg, **options).u) ** 2)

        values = []
        adam(
            lambda theta, i: autograd.grad(loss)(theta),
            np.array([3.0, 1.0]),
            step_size=0.1,
            num_iters=5,
            callback=lambda theta, i, g: values.append(loss(theta)),
        )
        return np.array(values)

    kernel, array = history(dxode.EnsembleKernel()), history(dxode.EnsembleArray())
    np.testing.assert_allclose(kernel, array, rtol=1e-13)
    assert kernel[-1] < kernel[0]


def _decay_with_rate(rate):
    def decay(u, p, t):
        (x,) = u
        (scale,) = p
        return [-rate * scale * x]

    return decay


def test_the_augmented_rhs_is_built_once_per_f_and_again_when_its_closure_changes(monkeypatch):
    """``u(T) = u0 exp(-rate s T)``: ``d/ds Σ u(T)² = -2 rate T u(T)²``; the second gradient
    reuses the augmented RHS, one of a closure with another ``rate`` builds its own."""
    from dxode.kernels import gradients

    built = []
    build = gradients._build_augmented
    monkeypatch.setattr(
        gradients, "_build_augmented", lambda *args: built.append(args[0].f) or build(*args)
    )
    T, s = 0.8, 1.3

    def grad(f):
        def loss(theta):
            prob = dxode.ODEProblem(f, [2.0], (0.0, T), (theta[0],))
            sol = dxode.solve(prob, "tsit5", saveat=[T], rtol=1e-11, atol=1e-11, kernel=True)
            return anp.sum(sol.u**2)

        return autograd.grad(loss)(np.array([s]))[0]

    for rate in (0.5, 0.5, 0.25):
        expected = -2 * rate * T * 4.0 * np.exp(-2 * rate * s * T)
        np.testing.assert_allclose(grad(_decay_with_rate(rate)), expected, rtol=1e-8)
    assert len(built) == 2  # rate 0.5 once (two closures, one source and value), 0.25 once


def _heat(u, p, t):  # four cells of a rod heated at p[1]: eigenvalues -190 to -1310
    a, b, c, d = u
    k, s = 500.0 * p[0], 500.0 * p[1]
    return [
        k * (b - 2.0 * a) + s,
        k * (a - 2.0 * b + c) + s,
        k * (b - 2.0 * c + d) + s,
        k * (c - 2.0 * d) + s,
    ]


def test_the_kernel_adjoint_refuses_steps_beyond_the_stability_interval():
    """Started from its steady state (2, 3, 3, 2) plus its slowest mode, the rod's fast modes
    sit at round-off, and Tsit5's controller takes steps beyond its stability interval;
    frozen, those steps amplify the fast modes: the kernel's discrete adjoint gave
    d loss / d u0 = (330, -535, 535, -330) where the closed form gives (2.7, 4.4, 4.4, 2.7)
    1e-4, silently (the array path's default switches to InterpolatingAdjoint and agrees
    with the closed form). It now refuses as the array path's DiscreteAdjoint() does; with
    a dtmax inside the interval the gradient is the closed form's."""
    from scipy.linalg import expm

    slowest = np.sin(np.pi * np.arange(1, 5) / 5)
    u0 = np.array([2.0, 3.0, 3.0, 2.0]) + 0.5 * slowest

    def loss(theta, **options):
        prob = dxode.ODEProblem(_heat, theta[:4], (0.0, 0.05), (theta[4], 1.0))
        options.update(saveat=[0.05], rtol=1e-6, atol=1e-6, kernel=True)
        sol = dxode.solve(prob, "tsit5", sensealg=dxode.DiscreteAdjoint(), **options)
        return anp.sum(sol.u**2)

    theta = np.concatenate([u0, [1.0]])
    with pytest.raises(ValueError, match=r"stability interval.*ForwardSensitivity.*kernel=False"):
        autograd.grad(loss)(theta)
    a = 500.0 * (np.diag([-2.0] * 4) + np.diag([1.0] * 3, 1) + np.diag([1.0] * 3, -1))
    decay = expm(0.05 * a)
    expected = 2.0 * decay.T @ (np.array([2.0, 3.0, 3.0, 2.0]) + decay @ (0.5 * slowest))
    stable = autograd.grad(lambda th: loss(th, dtmax=1.5e-3))(theta)
    np.testing.assert_allclose(stable[:4], expected, rtol=1e-4)


@pytest.mark.parametrize("sensealg", [None, dxode.ForwardSensitivity()], ids=["default", "FS"])
def test_forward_sensitivities_beyond_the_stability_interval_join_the_error_norm(sensealg):
    """The rod above through the kernel's forward sensitivities (the default up to 8 inputs):
    outside the error norm they hold Tsit5's stability-limited steps fixed and gave the
    discrete adjoint's (330, -535, 535, -330), silently. Found limited (the plain recording
    kernel's steps, power iterations of f), the batch is solved again with the sensitivities
    in the error norm, as the array path's ForwardSensitivity does: the closed form to the
    tolerance, and the array path's numbers."""
    from scipy.linalg import expm

    slowest = np.sin(np.pi * np.arange(1, 5) / 5)
    u0 = np.array([2.0, 3.0, 3.0, 2.0]) + 0.5 * slowest

    def loss(theta, kernel):
        prob = dxode.ODEProblem(_heat, theta[:4], (0.0, 0.05), (theta[4], 1.0))
        options = {"saveat": [0.05], "rtol": 1e-6, "atol": 1e-6, "kernel": kernel}
        chosen = sensealg if kernel else dxode.ForwardSensitivity()
        sol = dxode.solve(prob, "tsit5", sensealg=chosen, **options)
        return anp.sum(sol.u**2)

    theta = np.concatenate([u0, [1.0]])
    a = 500.0 * (np.diag([-2.0] * 4) + np.diag([1.0] * 3, 1) + np.diag([1.0] * 3, -1))
    decay = expm(0.05 * a)
    expected = 2.0 * decay.T @ (np.array([2.0, 3.0, 3.0, 2.0]) + decay @ (0.5 * slowest))
    kernel = autograd.grad(lambda th: loss(th, True))(theta)
    np.testing.assert_allclose(kernel[:4], expected, rtol=1e-4)
    array = autograd.grad(lambda th: loss(th, False))(theta)
    np.testing.assert_allclose(kernel, array, rtol=1e-6)


def _ensemble_batch_of(monkeypatch, eprob, **options):
    """The ``KernelBatch`` an ``EnsembleKernel`` solve of ``eprob`` runs (one batch)."""
    from dxode.kernels import ensemble_batch

    seen = []
    run = ensemble_batch.run_events
    monkeypatch.setattr(ensemble_batch, "run_events", lambda r, b: seen.append(b) or run(r, b))
    dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **options)
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_the_screen_run_returns_each_lanes_largest_step_and_probed_states(monkeypatch, backward):
    """The stability check's screen runs the plain kernel with ``screen_steps``: each lane's
    largest accepted ``|h|``, and its states and times after the probed step counts, are
    those of the steps the recording kernel takes (per-lane spans, two blocks and a part);
    the saves and outcomes are the run's without the screen, bit for bit."""
    import dataclasses

    from dxode.kernels.adjoint_record import recorded_lanes
    from dxode.kernels.cpu import run_cpu
    from dxode.kernels.stability_check import probe_steps

    lanes = 70
    ends = np.linspace(0.02, 3.0, lanes)  # the first lanes take fewer steps than probes
    spans = np.column_stack([ends, np.zeros(lanes)] if backward else [np.zeros(lanes), ends])
    rho = np.linspace(20.0, 30.0, lanes)
    p = np.column_stack([np.full(lanes, 10.0), rho, np.full(lanes, 8 / 3)])
    prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 1.0), (10.0, 28.0, 8 / 3))
    eprob = dxode.EnsembleProblem(prob, p=p, tspan=spans)
    batch = _ensemble_batch_of(monkeypatch, eprob, trajectories=lanes, rtol=1e-6, atol=1e-6)
    plain = run_cpu(batch)
    probes = probe_steps(plain.naccept)
    screen = run_cpu(dataclasses.replace(batch, screen_steps=probes))
    for name in ("saved", "u", "t", "retcode", "naccept", "nreject", "nf"):
        np.testing.assert_array_equal(getattr(screen, name), getattr(plain, name), err_msg=name)
    largest, states, times = screen.screen
    steps, _, _ = recorded_lanes(batch, "cpu")
    assert (probes[:, 0] == [0, 1, -1, -1, -1, -1, -1, -1]).all()  # one step only
    for lane, (t, u) in enumerate(steps):
        taken = probes[probes[:, lane] >= 0, lane]
        assert len(taken) == min(8, len(t) - 1) and np.all(np.diff(taken) > 0)
        np.testing.assert_array_equal(states[lane, : len(taken)], u[taken])
        np.testing.assert_array_equal(times[lane, : len(taken)], t[taken])
        assert np.isnan(states[lane, len(taken) :]).all()
        # |(t + h) - t| is h to the last bit of t
        assert abs(largest[lane] - np.max(np.abs(np.diff(t)))) <= 1e-15


def test_a_non_stiff_batch_is_cleared_without_recording_its_steps(monkeypatch):
    """The screen (one vectorized plain run, probes at eight states per lane) clears an
    explicit method's non-stiff batch: its steps are never recorded one lane at a time,
    which cost about 30 µs a lane and made a 100-trajectory gradient 11 forward passes."""
    from dxode.kernels import adjoint_record

    monkeypatch.setattr(adjoint_record, "recorded_lanes", lambda *a: pytest.fail("recorded"))
    u0s = np.column_stack([np.linspace(0.5, 1.5, 40), np.zeros(40)])

    def loss(theta, kernel):
        prob = dxode.ODEProblem(damped, u0s[0], (0.0, 5.0), (theta[0], theta[1]))
        eprob = dxode.EnsembleProblem(prob, u0=u0s)
        algorithm = dxode.EnsembleKernel() if kernel else dxode.EnsembleArray()
        options = {"saveat": TIMES, "rtol": 1e-9, "atol": 1e-9, "trajectories": 40}
        return anp.sum(dxode.solve(eprob, "tsit5", algorithm, **options).u ** 2)

    theta = np.array([1.3, 0.2])
    kernel = autograd.grad(lambda th: loss(th, True))(theta)
    np.testing.assert_allclose(kernel, autograd.grad(lambda th: loss(th, False))(theta), rtol=1e-6)


def _pulsed_rod(u, p, t):  # the rod's conductivity 200 times higher for about 0.1 around t = 1
    a, b, c, d = u
    k = 5.0 * p[0] * (1.0 + 200.0 * math.exp(-(((t - 1.0) / 0.05) ** 2)))
    s = 5.0 * p[1]
    return [
        k * (b - 2.0 * a) + s,
        k * (a - 2.0 * b + c) + s,
        k * (b - 2.0 * c + d) + s,
        k * (c - 2.0 * d) + s,
    ]


def test_the_screen_does_not_clear_a_short_stiff_stretch(monkeypatch):
    """Tsit5's steps are stability-limited only while the conductivity pulses (a twentieth of
    the span, most of the steps). Probed at eight times spread over the span, the screen
    missed it and cleared the batch; probed after step counts spread over the steps, it
    sends the batch to the step-by-step check, which finds it limited."""
    from dxode.kernels import stability_check

    decisions = []
    for name in ("screen_clears", "limited_lanes"):
        real = getattr(stability_check, name)

        def spy(*args, real=real, name=name):
            decisions.append((name, real(*args)))
            return decisions[-1][1]

        monkeypatch.setattr(stability_check, name, spy)

    def loss(theta, kernel):
        prob = dxode.ODEProblem(_pulsed_rod, theta[:4], (0.0, 2.0), (theta[4], 1.0))
        options = {"saveat": [1.5, 2.0], "rtol": 1e-6, "atol": 1e-6, "kernel": kernel}
        sensealg = None if kernel else dxode.ForwardSensitivity()
        return anp.sum(dxode.solve(prob, "tsit5", sensealg=sensealg, **options).u ** 2)

    theta = np.array([0.5, 1.0, 1.5, 0.7, 1.0])
    kernel = autograd.grad(lambda th: loss(th, True))(theta)
    assert decisions[0] == ("screen_clears", False)
    assert decisions[1][0] == "limited_lanes" and decisions[1][1][0] == 1
    array = autograd.grad(lambda th: loss(th, False))(theta)
    np.testing.assert_allclose(kernel, array, rtol=1e-6, atol=1e-12)


def _short_array_later(u, p, t):
    if t > 0.5:
        return np.array([-p[0] * u[0]])
    return np.array([-p[0] * u[0], -u[1]])


@pytest.mark.parametrize("with_jacobians", [False, True], ids=["complex-step", "jac"])
def test_a_gradient_through_an_f_returning_a_short_array_later_names_f(with_jacobians):
    """The forward sensitivities' augmented RHS read f's rows unchecked: an array short of
    a row after the compile-time count was read past its end, a gradient from whatever
    memory held there (the plain kernel's ``rhs`` checks them: ``returned_rows``)."""
    jac = (lambda u, p, t: np.array([[-p[0], 0.0], [0.0, -1.0]])) if with_jacobians else None
    paramjac = (lambda u, p, t: np.array([[-u[0]], [0.0]])) if with_jacobians else None

    def loss(theta):
        prob = dxode.ODEProblem(
            _short_array_later,
            np.array([1.0, 2.0]),
            (0.0, 1.0),
            (theta[0],),
            jac=jac,
            paramjac=paramjac,
        )
        # fixed steps: no stability check, whose plain solve checks f's rows on its own
        sol = dxode.solve(prob, dxode.RK4(), dt=0.1, adaptive=False, saveat=[1.0], kernel=True)
        return anp.sum(sol.u**2)

    with pytest.raises(ValueError, match=r"read past its end.*fewer rows") as info:
        autograd.grad(loss)(np.array([0.7]))
    assert "test_kernel_gradients.py" in str(info.value)
