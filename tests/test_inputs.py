"""Inputs that used to misbehave (a silent wrong answer, a crawl, an internal traceback) now
fail at once with a message naming the argument, or just work."""

from __future__ import annotations

import numpy as np
import pytest

import dxode
from dxode import ContinuousCallback, DiscreteCallback, EnsembleProblem, PresetTimeCallback

from conftest import to_numpy
from problems import decay, oscillator


def _decay(u0=(1.0, 2.0), tspan=(0.0, 1.0)):
    return dxode.ODEProblem(decay, list(u0), tspan, 1.0)


# ---- f's result: checked on every call, constant rows broadcast -----------------------------


def test_f_changing_shape_after_the_first_call_fails():
    # -u[:1] broadcast into both components used to give u(1) = [0.368, 0.985] with Success.
    f = lambda u, p, t: -u if np.all(t < 0.5) else -u[:1]
    with pytest.raises(ValueError, match=r"returned shape \(1,\) .* on every call"):
        dxode.solve(dxode.ODEProblem(f, [1.0, 2.0], (0.0, 1.0)))
    with pytest.raises(ValueError, match=r"returned shape \(1, 4\) .* on every call"):
        dxode.solve(EnsembleProblem(dxode.ODEProblem(f, [1.0, 2.0], (0.0, 1.0))), trajectories=4)


def _falling(u, p, t):
    return [u[1, ...], -9.81]


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Rodas5P()], ids=["Tsit5", "Rodas5P"])
def test_constant_rows_broadcast_in_ensembles(xp, dtype_name, alg):
    dtype = getattr(xp, dtype_name)
    prob = dxode.ODEProblem(_falling, xp.asarray([0.0, 1.0], dtype=dtype), (0.0, 1.0))
    single = dxode.solve(prob, alg, saveat=[1.0])
    sim = dxode.solve(EnsembleProblem(prob), alg, trajectories=3, saveat=[1.0])
    assert sim.u.dtype == dtype
    expected = np.broadcast_to(to_numpy(single.u), (3, 1, 2))
    np.testing.assert_array_equal(to_numpy(sim.u), expected)
    np.testing.assert_allclose(expected[0, -1], [1.0 - 9.81 / 2, 1.0 - 9.81], rtol=1e-5)


def test_all_constant_rows_broadcast_in_ensembles():
    prob = dxode.ODEProblem(lambda u, p, t: [1.0, -2.0], [0.0, 0.0], (0.0, 1.0))
    sim = dxode.solve(EnsembleProblem(prob), trajectories=2, saveat=[1.0])
    np.testing.assert_allclose(sim.u[:, -1], [[1.0, -2.0], [1.0, -2.0]], rtol=1e-12)


def _constant_rate(u, p, t):
    return [0, 1]  # Python ints: they adapt to the state's dtype (they were stacked as int64)


def test_rows_of_python_numbers_alone_take_the_state_dtype(xp, dtype_name):
    dtype = getattr(xp, dtype_name)
    prob = dxode.ODEProblem(_constant_rate, xp.asarray([0.0, 1.0], dtype=dtype), (0.0, 1.0))
    for sol in (
        dxode.solve(prob, saveat=[1.0]),
        dxode.solve(prob.remake(f=lambda u, p, t: (0.5, 1.0)), saveat=[1.0]),
        dxode.solve(EnsembleProblem(prob), trajectories=2, saveat=[1.0]),
    ):
        assert sol.u.dtype == dtype
        np.testing.assert_allclose(to_numpy(sol.u)[..., -1, 1], 2.0, rtol=1e-6)


def test_affect_with_a_constant_row_in_ensembles():
    bounce = ContinuousCallback(
        lambda u, p, t: u[0], lambda u, p, t, fired: [0.0, -0.5 * u[1]], direction="down"
    )
    prob = dxode.ODEProblem(_falling, [1.0, 0.0], (0.0, 1.0))
    sim = dxode.solve(EnsembleProblem(prob), trajectories=2, callback=bounce, saveat=[1.0])
    single = dxode.solve(prob, callback=bounce, saveat=[1.0])
    assert len(single.events) == 2 and len(sim.events) == 4
    np.testing.assert_allclose(sim.u[:, -1], np.repeat(single.u[-1:], 2, axis=0), rtol=1e-12)


# ---- callbacks: results and signatures ---------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "error", "match"),
    [
        (lambda u, p, t: None, TypeError, "condition returned None"),
        (lambda u, p, t: "x", TypeError, "condition returned <U1 values; it must return real"),
        (lambda u, p, t: u, ValueError, r"condition returned shape \(1,\)"),
    ],
)
def test_bad_condition_results_fail_at_once(condition, error, match):
    prob = dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0)
    with pytest.raises(error, match=match):
        dxode.solve(prob, callback=ContinuousCallback(condition))


def test_bad_condition_results_fail_in_ensembles():
    eprob = EnsembleProblem(dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0))
    with pytest.raises(TypeError, match="condition returned None"):
        dxode.solve(eprob, trajectories=2, callback=ContinuousCallback(lambda u, p, t: None))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: ContinuousCallback(lambda u, t: u[0]),
            r"ContinuousCallback: condition must take 3",
        ),
        (lambda: DiscreteCallback(lambda u: True), r"DiscreteCallback: condition must take 3"),
        (
            lambda: ContinuousCallback(lambda u, p, t: u[0], lambda u, p, t: u),
            r"affect must take 4 positional arguments, affect\(u, p, t, fired\), but its "
            r"signature is \(u, p, t\)",
        ),
        (
            lambda: PresetTimeCallback([0.5], terminate=lambda u: True),
            r"PresetTimeCallback: terminate must take 3",
        ),
    ],
)
def test_callback_functions_with_the_wrong_arguments(make, match):
    with pytest.raises(TypeError, match=match):
        make()


def test_callables_without_a_fixed_signature_are_accepted():
    class Field:
        def __call__(self, *args):
            return -args[0]

    prob = dxode.ODEProblem(Field(), [1.0], (0.0, 1.0))
    assert dxode.solve(prob).retcode == dxode.ReturnCode.Success
    ContinuousCallback(lambda *args: args[0][0], lambda u, p, t, fired=None, extra=1: u)
    dxode.ODEProblem(np.add, [1.0], (0.0, 1.0))  # np.add(u, p, t) binds: out=t


# ---- f's signature and SciPy's argument order --------------------------------------------


@pytest.mark.parametrize(
    ("f", "match"),
    [
        (lambda u, p: -u, r"f must take 3 positional arguments, f\(u, p, t\), .* \(u, p\)$"),
        (lambda t, y: -y, r"signature is \(t, y\) \(dxode's order is f\(u, p, t\), not SciPy's"),
        (lambda u, p, t, k: -u, r"signature is \(u, p, t, k\)"),
    ],
)
def test_f_with_the_wrong_number_of_arguments(f, match):
    with pytest.raises(TypeError, match=match):
        dxode.ODEProblem(f, [1.0], (0.0, 1.0))


def test_derivative_functions_with_the_wrong_arguments():
    with pytest.raises(TypeError, match=r"jac must take 3 positional arguments"):
        dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0, jac=lambda u, p: u)
    with pytest.raises(TypeError, match=r"vjp must take 4 positional arguments"):
        dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0, vjp=lambda u, p, t: u)


def _scipy_order_with_parameters(t, u, p):
    k, c = p
    return -k * u + c


def _scipy_order_indexing(t, y, p):
    return [y[1], -y[0]]


@pytest.mark.parametrize(
    ("f", "p"), [(_scipy_order_with_parameters, (1.0, 0.0)), (_scipy_order_indexing, None)]
)
def test_f_in_scipys_argument_order_is_recognised(f, p):
    prob = dxode.ODEProblem(f, [1.0, 0.0], (0.0, 1.0), p)
    with pytest.raises(TypeError, match=r"SciPy's order f\(t, u, p\).*f\(u, p, t\)"):
        dxode.solve(prob)
    with pytest.raises(TypeError, match=r"SciPy's order"):
        dxode.solve(EnsembleProblem(prob), trajectories=2)


def _negates_p(u, p, t):
    return -p * u


def _divides_by_t(u, p, t):
    with np.errstate(divide="raise"):
        return -u * p / t


@pytest.mark.parametrize(
    ("f", "p", "error", "match"),
    [
        (_negates_p, np.array([True, False]), TypeError, "numpy boolean negative"),
        (_negates_p, (np.True_, 1.0), TypeError, "bad operand type for unary -"),
        (_divides_by_t, True, FloatingPointError, "divide by zero"),
    ],
    ids=["bool-array", "tuple-with-bool", "bool-as-time"],
)
def test_an_f_named_in_dxodes_order_keeps_its_own_error(f, p, error, match):
    # Called as f(t, u, p), these return u's shape (p lands in f's t: True divides like 1),
    # and the SciPy-order diagnosis hid the real error.
    prob = dxode.ODEProblem(f, [1.0, 2.0], (0.0, 1.0), p)
    with pytest.raises(error, match=match):
        dxode.solve(prob)
    with pytest.raises(error, match=match):
        dxode.solve(EnsembleProblem(prob), trajectories=2)


def test_a_failing_f_that_is_not_in_scipys_order_keeps_its_own_error():
    def f(u, p, t):
        raise KeyError("from f")

    with pytest.raises(KeyError, match="from f"):
        dxode.solve(dxode.ODEProblem(f, [1.0], (0.0, 1.0)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "RK45"}, r"method= is the algorithm, solve's second argument"),
        ({"t_eval": [0.5]}, r"t_eval= is saveat="),
        ({"reltol": 1e-6, "abstol": 1e-8}, r"abstol= is atol=; reltol= is rtol="),
        ({"max_step": 0.1}, r"max_step= is dtmax="),
    ],
)
def test_scipy_and_julia_keywords_get_dxodes_names(kwargs, match):
    with pytest.raises(TypeError, match=match):
        dxode.solve(_decay(), **kwargs)


# ---- state, tolerances, step limits, save grid -------------------------------------------


@pytest.mark.parametrize(
    ("u0", "error", "match"),
    [
        (np.array([1.0], dtype=np.float16), TypeError, "u0 has dtype float16; .* float32 or"),
        (np.zeros(0), ValueError, r"u0 is empty \(shape \(0,\)\)"),
        (np.zeros((2, 0)), ValueError, r"u0 is empty \(shape \(2, 0\)\)"),
    ],
)
def test_unsupported_states_are_rejected(u0, error, match):
    with pytest.raises(error, match=match):
        dxode.ODEProblem(decay, u0, (0.0, 1.0), 1.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_state_in_the_other_byte_order_is_solved_like_a_native_one(dtype):
    # Byte-swapped arrays (big-endian data read from a file, say) were refused: "u0 has dtype
    # >f8; dxode computes in float32 or float64 only".
    native = np.array([1.0, 2.0], dtype=dtype)
    swapped = native.astype(native.dtype.newbyteorder("S"))
    a = dxode.solve(dxode.ODEProblem(decay, native, (0.0, 1.0), 1.0), rtol=1e-6, atol=1e-6)
    b = dxode.solve(dxode.ODEProblem(decay, swapped, (0.0, 1.0), 1.0), rtol=1e-6, atol=1e-6)
    assert b.u.dtype == native.dtype
    np.testing.assert_array_equal(b.u, a.u)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtmin": 0.5, "dtmax": 0.1}, r"dtmin=0.5 is larger than dtmax=0.1"),
        ({"dtmin": 0.5, "dt": 0.1}, r"first step dt=0.1 is below dtmin=0.5"),
        # fixed steps: were shortened to dtmax, and dtmin was ignored, without a word
        ({"adaptive": False, "dt": 0.1, "dtmax": 0.05}, r"dt=0.1 are larger than dtmax=0.05"),
        ({"adaptive": False, "dt": 0.1, "dtmin": 0.5}, r"dt=0.1 are smaller than dtmin=0.5"),
        ({"atol": [1e-6, 1e-6, 1e-6]}, r"atol has shape \(3,\), .* state's shape \(2,\)"),
        ({"atol": np.ones((2, 2))}, r"atol has shape \(2, 2\)"),
        ({"rtol": 1e-30, "atol": 1e-30}, r"rtol=1e-30 is below what float64 resolves.*2.22e-16"),
        ({"atol": 1e-320}, r"atol=9.99989e-321 is below what float64 resolves.*2.23e-308"),
        ({"atol": [1e-6, 1e-320]}, r"atol=9.99989e-321 is below what float64 resolves"),
        ({"saveat": 1e-9}, r"would save 1,000,000,001 points, more than the limit of 10,000,000"),
    ],
)
def test_options_that_cannot_work_for_the_state(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dxode.solve(_decay(), **kwargs)
    with pytest.raises(ValueError, match=match):
        dxode.solve(EnsembleProblem(_decay()), trajectories=2, **kwargs)


def test_a_span_that_float32_cannot_resolve_is_refused():
    # t0 and t1 are one float32 number: the solve failed Unstable after saving u0 at t1's place.
    prob = dxode.ODEProblem(decay, np.array([1.0], dtype=np.float32), (1e8, 1e8 + 1.0), 1.0)
    for solve in (
        lambda: dxode.solve(prob),
        lambda: dxode.solve(EnsembleProblem(prob), trajectories=2),
        lambda: dxode.solve(EnsembleProblem(prob), dxode.EnsembleSerial(), trajectories=2),
    ):
        with pytest.raises(ValueError, match=r"tspan \(100000000.0, 100000001.0\) is one time in"):
            solve()
    spans = np.array([[0.0, 1.0], [1e8, 1e8 + 1.0]])
    with pytest.raises(ValueError, match="also in float32 for a float32 state"):
        dxode.solve(EnsembleProblem(prob.remake(tspan=(0.0, 1.0)), tspan=spans))
    assert (
        dxode.solve(prob.remake(u0=[1.0]), saveat=[1e8 + 1.0]).retcode == dxode.ReturnCode.Success
    )


@pytest.mark.parametrize(
    ("dtype", "tspan", "width"),
    [
        (np.float64, (-1e308, 1e308), "inf"),
        (np.float64, (1e308, -1e308), "inf"),
        (np.float32, (0.0, 1e39), "1e[+]39"),
        (np.float32, (-3e38, 3e38), "6e[+]38"),
    ],
)
@pytest.mark.parametrize("alg", ["tsit5", "rodas5p"])
def test_a_span_wider_than_the_dtype_is_refused(dtype, tspan, width, alg):
    # float64: Rodas5P's 1.3e308 step overflowed d_i h to inf (inf * df/dt = NaN) and crawled
    # to MaxIters; float32: t1 cast to inf with an overflow warning, then MaxIters.
    prob = dxode.ODEProblem(decay, np.ones(1, dtype=dtype), tspan, 0.0)
    match = rf"tspan .* does not fit in {np.dtype(dtype)}.*\|t1 - t0\| = {width} exceeds"
    with pytest.raises(ValueError, match=match):
        dxode.solve(prob, alg)


@pytest.mark.parametrize(
    ("dtype", "wide", "width"),
    [(np.float64, (-1e308, 1e308), "inf"), (np.float32, (0.0, 1e39), "1e[+]39")],
)
@pytest.mark.parametrize("given", ["arrays", "prob_func"])
@pytest.mark.parametrize(
    "ensemble_alg",
    [dxode.EnsembleArray(), dxode.EnsembleSerial(), dxode.EnsembleKernel()],
    ids=["array", "serial", "kernel"],
)
def test_a_trajectory_s_span_wider_than_the_dtype_is_refused(
    ensemble_alg, given, dtype, wide, width
):
    # A single solve refused it; a trajectory of an ensemble crawled to MaxIters.
    if isinstance(ensemble_alg, dxode.EnsembleKernel):
        pytest.importorskip("numba")
    spans = np.array([(0.0, 1.0), wide])
    prob = dxode.ODEProblem(decay, np.ones(1, dtype=dtype), (0.0, 1.0), 0.0)
    if given == "arrays":
        eprob = dxode.EnsembleProblem(prob, tspan=spans)
    else:
        eprob = dxode.EnsembleProblem(
            prob, prob_func=lambda prob, i, repeat: prob.remake(tspan=tuple(spans[i]))
        )
    match = rf"tspan .* does not fit in {np.dtype(dtype)}.*\|t1 - t0\| = {width} exceeds"
    with pytest.raises(ValueError, match=match):
        dxode.solve(eprob, "tsit5", ensemble_alg, trajectories=2)


def test_tolerance_limits_follow_the_dtype():
    prob32 = dxode.ODEProblem(decay, np.ones(2, dtype=np.float32), (0.0, 1.0), 1.0)
    with pytest.raises(ValueError, match=r"rtol=1e-10 is below what float32 resolves.*1.19e-07"):
        dxode.solve(prob32, rtol=1e-10)
    with pytest.raises(ValueError, match=r"atol=1e-40 is below what float32 resolves.*1.18e-38"):
        dxode.solve(prob32, atol=1e-40)
    # At the limits the solve works: rtol = eps, and a tiny atol beside a sane rtol.
    eps = float(np.finfo(np.float64).eps)
    for kwargs in ({"rtol": eps, "atol": eps}, {"rtol": 1e-6, "atol": 1e-300}):
        sol = dxode.solve(_decay(), dxode.Vern7(), saveat=[1.0], **kwargs)
        assert sol.retcode == dxode.ReturnCode.Success
        np.testing.assert_allclose(sol.u[-1], [np.exp(-1.0), 2 * np.exp(-1.0)], rtol=1e-5)


def test_save_grid_limit_is_exact():
    from dxode._timegrid import MAX_SAVE_POINTS, save_times

    span = float(MAX_SAVE_POINTS - 2)  # t0, t0 + 1, ..., t1: MAX_SAVE_POINTS - 1 points
    assert save_times(1.0, 0.0, span).shape == (MAX_SAVE_POINTS - 1,)
    with pytest.raises(ValueError, match="more than the limit"):
        save_times(1.0, 0.0, span + 1.0)


# ---- preset times, seeds, ensemble user functions, trajectories --------------------------


def test_preset_times_outside_tspan_are_rejected():
    dose = PresetTimeCallback([0.5, 2.0], lambda u, p, t, fired: u + 1.0)
    match = r"callback 0\): time 2.0 is outside the time span \[0.0, 1.0\]"
    with pytest.raises(ValueError, match=match):
        dxode.solve(_decay(), callback=dose)
    with pytest.raises(ValueError, match=match):
        dxode.solve(EnsembleProblem(_decay()), trajectories=2, callback=dose)
    backwards = r"time 2.0 is outside the time span \[0.0, 1.0\]"
    with pytest.raises(ValueError, match=backwards):
        dxode.solve(_decay(tspan=(1.0, 0.0)), callback=dose)
    spans = np.array([[0.0, 1.0], [0.0, 1.5]])
    with pytest.raises(ValueError, match=r"outside the time span \[0.0, 1.5\]"):
        dxode.solve(EnsembleProblem(_decay(), tspan=spans), callback=dose)
    # Inside some trajectory's span: allowed; lanes whose span misses it ignore it.
    spans = np.array([[0.0, 1.0], [0.0, 2.5]])
    sim = dxode.solve(EnsembleProblem(_decay(), tspan=spans), callback=dose)
    assert sorted(np.asarray(sim.events.t).tolist()) == [0.5, 0.5, 2.0]


@pytest.mark.parametrize("seed", [2**64, 2**70, -1])
def test_seeds_outside_64_bits_are_rejected(seed):
    eprob = EnsembleProblem(_decay(), batch_func=lambda prob, ctx: {"p": ctx.uniform()})
    with pytest.raises(ValueError, match=r"seed must be an integer with 0 <= seed < 2\*\*64"):
        dxode.solve(eprob, trajectories=2, seed=seed)


def test_largest_seed_is_accepted():
    eprob = EnsembleProblem(_decay(), batch_func=lambda prob, ctx: {"p": ctx.uniform()})
    sim = dxode.solve(eprob, trajectories=2, seed=2**64 - 1, saveat=[1.0])
    assert sim.seed == 2**64 - 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"output_func": lambda sol, i: sol.u[-1]},
            r"output_func must return a pair \(value, rerun\), got ndarray; e.g. return value, "
            r"rerun=False",
        ),
        (
            {"reduction": lambda acc, u, i: acc, "u_init": 0.0},
            r"reduction must return a pair \(acc, converged\), got float",
        ),
        (
            {"reduction": lambda acc, u, i: (acc, False, 1), "u_init": 0.0},
            r"reduction must return a pair \(acc, converged\), got 3 values",
        ),
    ],
)
def test_ensemble_functions_must_return_pairs(kwargs, match):
    with pytest.raises(TypeError, match=match):
        dxode.solve(EnsembleProblem(_decay(), **kwargs), trajectories=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"output_func": lambda sol: (sol, False)}, r"output_func\(sol, i\), but its signature"),
        ({"reduction": lambda acc, u: (acc, False)}, r"reduction\(acc, batch_values, batch_"),
        ({"batch_func": lambda ctx: {}}, r"batch_func must take 2 .* batch_func\(prob, ctx\)"),
        (
            {"reduction": lambda acc, u, i: (acc, False), "combine": lambda a: a},
            r"combine\(acc_a, acc_b\)",
        ),
    ],
)
def test_ensemble_functions_with_the_wrong_arguments_fail_at_construction(kwargs, match):
    # They used to fail inside the first batch ("<lambda>() takes 1 positional argument").
    with pytest.raises(TypeError, match=match):
        EnsembleProblem(_decay(), **kwargs)


def test_trajectories_default_to_the_per_trajectory_arrays():
    p = np.linspace(0.5, 1.5, 5)
    eprob = EnsembleProblem(_decay(), p=p)
    sim = dxode.solve(eprob, saveat=[1.0])
    explicit = dxode.solve(eprob, trajectories=5, saveat=[1.0])
    assert len(sim) == 5
    np.testing.assert_array_equal(sim.u, explicit.u)
    with pytest.raises(ValueError, match="trajectories=6 but the per-trajectory arrays hold only"):
        dxode.solve(eprob, trajectories=6)
    with pytest.raises(TypeError, match="needs trajectories=N"):
        dxode.solve(EnsembleProblem(_decay()))


def test_oscillator_lists_still_work_on_one_trajectory():
    sol = dxode.solve(dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 1.0)), saveat=[1.0])
    np.testing.assert_allclose(sol.u[-1], [np.cos(1.0), -np.sin(1.0)], rtol=1e-3)


# ---- found by a second round of outside-style testing -----------------------------------------


def _switching(first, later, calls=2):
    """An f returning ``first(u)`` for its first ``calls`` calls, then ``later(u)``."""
    count = [0]

    def f(u, p, t):
        count[0] += 1
        return first(u) if count[0] <= calls else later(u)

    return f


def test_a_one_element_row_is_not_stretched_across_lanes():
    # -u[0][:1] has shape (1,): broadcasting it would give every trajectory the first one's value.
    prob = dxode.ODEProblem(lambda u, p, t: [u[1], -u[0][:1]], [1.0, 0.0], (0.0, 1.0))
    eprob = EnsembleProblem(prob, u0=np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]))
    with pytest.raises(ValueError, match=r"row 1 .* shape \(1,\).*a number for a constant row"):
        dxode.solve(eprob, saveat=[1.0])
    matrix = dxode.ODEProblem(lambda u, p, t: [u[1], -u[0][:1]], np.ones((2, 3)), (0.0, 1.0))
    with pytest.raises(ValueError, match=r"row 1 .* shape \(1,\)"):
        dxode.solve(matrix)


def test_a_one_element_parameter_row_still_fills_a_scalar_row():
    prob = dxode.ODEProblem(lambda u, p, t: [u[1], -p], [0.0, 0.0], (0.0, 1.0), np.array([2.0]))
    sol = dxode.solve(prob, saveat=[1.0])
    np.testing.assert_allclose(sol.u[-1], [-1.0, -2.0], rtol=1e-6)


@pytest.mark.parametrize("row", [None, "a"], ids=["None", "str"])
@pytest.mark.parametrize("later", [False, True], ids=["first-call", "later-call"])
def test_a_row_that_is_not_a_number_fails(row, later):
    first = (lambda u: [u[1], -u[0]]) if later else (lambda u: [u[1], row])
    f = _switching(first, lambda u: [u[1], row])
    with pytest.raises(TypeError, match=f"row 1 .* is {type(row).__name__}"):
        dxode.solve(dxode.ODEProblem(f, [1.0, 0.0], (0.0, 1.0)))


@pytest.mark.parametrize("ensemble", [False, True], ids=["single", "ensemble"])
def test_f_changing_dtype_after_the_first_call_fails(ensemble):
    f = _switching(lambda u: -u, lambda u: np.ones(u.shape, dtype=np.int64))
    prob = dxode.ODEProblem(f, [1.0, 1.0], (0.0, 1.0))
    target = EnsembleProblem(prob, u0=np.ones((3, 2))) if ensemble else prob
    with pytest.raises(TypeError, match="returned dtype int64 for a float64 state after"):
        dxode.solve(target)


def test_a_nan_condition_fails_at_once_instead_of_crawling():
    cb = ContinuousCallback(lambda u, p, t: u[0] * np.nan, lambda u, p, t, f: u)
    with pytest.raises(ValueError, match="condition returned NaN at t = 0"):
        dxode.solve(dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 1.0)), callback=cb)
    later = ContinuousCallback(lambda u, p, t: np.where(t > 0.5, np.nan, u[0]), lambda *a: a[0])
    eprob = EnsembleProblem(
        dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 1.0)), u0=np.ones((3, 2))
    )
    with pytest.raises(ValueError, match="condition returned NaN"):
        dxode.solve(eprob, callback=later)


def test_a_nan_condition_on_a_diverged_lane_leaves_that_lane_its_own_retcode():
    # u' = u^2 blows up before t = 1 for u0 = 2 only; the condition is NaN once u is.
    cb = ContinuousCallback(lambda u, p, t: u[0] - 100.0, lambda u, p, t, f: u)
    eprob = EnsembleProblem(
        dxode.ODEProblem(lambda u, p, t: u * u, [0.1], (0.0, 1.0)), u0=np.array([[0.1], [2.0]])
    )
    sim = dxode.solve(eprob, callback=cb, saveat=[1.0])
    assert sim[0].retcode == dxode.ReturnCode.Success
    assert sim[1].retcode != dxode.ReturnCode.Success


def test_an_array_api_index_error_is_not_blamed_on_argument_order():
    xps = pytest.importorskip("array_api_strict")
    prob = dxode.ODEProblem(lambda u, p, t: [u[1], -9.81], xps.asarray([1.0, 0.0]), (0.0, 1.0))
    with pytest.raises(IndexError):
        dxode.solve(EnsembleProblem(prob, u0=xps.ones((3, 2))))


def test_scipy_argument_order_is_still_recognised_in_ensembles():
    prob = dxode.ODEProblem(lambda t, y, p: [y[1], -y[0]], [1.0, 0.0], (0.0, 1.0))
    with pytest.raises(TypeError, match="SciPy's order"):
        dxode.solve(EnsembleProblem(prob, u0=np.ones((3, 2))))


def test_an_f_closing_over_a_differentiated_variable_says_to_use_p():
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")

    def loss(k):
        prob = dxode.ODEProblem(lambda u, p, t: [u[1], -k * u[0]], np.array([1.0, 0.0]), (0, 1))
        return anp.sum(dxode.solve(prob, saveat=[1.0]).u)

    with pytest.raises(TypeError, match="pass it in p"):
        autograd.grad(loss)(1.0)


def test_output_func_rerun_must_be_a_bool():
    eprob = EnsembleProblem(
        dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 1.0)),
        output_func=lambda sol, i: (sol.u[-1], "no"),
    )
    with pytest.raises(TypeError, match="rerun a bool"):
        dxode.solve(eprob, trajectories=2)


def test_interpolating_at_nan_fails():
    sol = dxode.solve(dxode.ODEProblem(oscillator, [1.0, 0.0], (0.0, 1.0)))
    with pytest.raises(ValueError, match="nan"):
        sol(np.nan)


@pytest.mark.parametrize("what", ["saveat", "tspan", "tstops"])
def test_differentiating_with_respect_to_times_says_what_dxode_differentiates(what):
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")

    def loss(T):
        tspan = (0.0, T) if what == "tspan" else (0.0, 2.0)
        prob = dxode.ODEProblem(oscillator, np.array([1.0, 0.0]), tspan)
        times = {"saveat": anp.array([T]), "tstops": [T]}.get(what)
        options = {what: times} if what != "tspan" else {}
        return anp.sum(dxode.solve(prob, **{"saveat": [1.0], **options}).u)

    with pytest.raises(TypeError, match=rf"{what} is being differentiated.*u0 and p only"):
        autograd.grad(loss)(1.0)


def test_dense_output_of_a_differentiated_solve_points_to_saveat():
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")

    def loss(k):
        prob = dxode.ODEProblem(lambda u, p, t: [u[1], -p * u[0]], np.array([1.0, 0.0]), (0, 1), k)
        return anp.sum(dxode.solve(prob)(0.5))

    with pytest.raises(ValueError, match=r"differentiated solve and a compiled.*saveat"):
        autograd.grad(loss)(1.0)


# ---- per-trajectory arrays ---------------------------------------------------------------


def test_per_trajectory_u0_and_tspan_may_be_nested_lists():
    # A list of lists was taken for a tree of scalar leaves ("need a leading trajectory axis").
    as_lists = EnsembleProblem(_decay(), u0=[[1.0, 2.0], [3.0, 4.0]], tspan=[(0, 1), (0, 2)])
    as_arrays = EnsembleProblem(
        _decay(), u0=np.array([[1.0, 2.0], [3.0, 4.0]]), tspan=np.array([[0.0, 1.0], [0.0, 2.0]])
    )
    lists = dxode.solve(as_lists, saveat=[0.5])
    np.testing.assert_array_equal(lists.u, dxode.solve(as_arrays, saveat=[0.5]).u)


def test_per_trajectory_p_as_nested_lists_is_refused_suggesting_an_array():
    # said "per-trajectory arrays need a leading trajectory axis; got a scalar leaf"; not taken
    # as an array (as u0's lists are): p is a tree, whose lists may be parameters' rows
    prob = dxode.ODEProblem(lambda u, p, t: -p[0] * u + p[1], np.array([1.0]), (0.0, 1.0))
    told = r"EnsembleProblem's p .* got a number \(p as lists .*\); pass np\.array\(p\) for"
    with pytest.raises(ValueError, match=told):
        EnsembleProblem(prob, p=[[1.0, 2.0], [3.0, 4.0]])
    rows = EnsembleProblem(prob, p=np.array([[1.0, 2.0], [3.0, 4.0]]))
    second = dxode.solve(prob.remake(p=np.array([3.0, 4.0])), saveat=[1.0])
    np.testing.assert_allclose(dxode.solve(rows, saveat=[1.0]).u[1], second.u, rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"u0": np.array([[1.0, 0.0], [2.0, 0.0]]) + 1j},
            "u0 must hold real numbers, got dtype complex128",
        ),
        ({"u0": np.array([["a", "b"], ["c", "d"]])}, "u0 must hold real numbers, got dtype <U1"),
        ({"p": np.array(["a", "b"])}, "p must hold numbers, got dtype <U1"),
    ],
    ids=["complex-u0", "str-u0", "str-p"],
)
def test_per_trajectory_arrays_must_hold_numbers(kwargs, match):
    # A complex u0 lost its imaginary part with a ComplexWarning, strings failed inside NumPy.
    with pytest.raises(TypeError, match=f"per-trajectory {match}"):
        dxode.solve(EnsembleProblem(_decay(), **kwargs), trajectories=2)


def test_serial_steps_onto_the_tstops_inside_each_trajectorys_span_like_array():
    # EnsembleSerial refused a stop outside one trajectory's span, which EnsembleArray passes by.
    eprob = EnsembleProblem(_decay(), tspan=np.array([[0.0, 0.5], [0.0, 1.0]]))
    serial = dxode.solve(eprob, dxode.Tsit5(), dxode.EnsembleSerial(), tstops=[0.75])
    array = dxode.solve(eprob, dxode.Tsit5(), dxode.EnsembleArray(), tstops=[0.75])
    plain = dxode.solve(eprob, dxode.Tsit5(), dxode.EnsembleSerial())
    np.testing.assert_array_equal(serial.u, array.u)
    assert [s.stats for s in serial] == [s.stats for s in array]
    assert serial[0].stats == plain[0].stats and serial[1].stats != plain[1].stats
    with pytest.raises(ValueError, match=r"tstops time 1\.5 is outside tspan"):
        dxode.solve(eprob, dxode.Tsit5(), dxode.EnsembleSerial(), tstops=[1.5])
