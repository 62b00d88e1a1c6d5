"""Bad input fails before any work with a message naming the problem; failures get retcodes."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dxode
from dxode import ReturnCode, _validation

from problems import decay, oscillator


def _prob(**overrides):
    kwargs = {"f": oscillator, "u0": [1.0, 0.0], "tspan": (0.0, 1.0), "p": None} | overrides
    return dxode.ODEProblem(**kwargs)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"u0": [1.0, math.nan]}, ValueError, "u0 contains non-finite"),
        ({"u0": [1.0, math.inf]}, ValueError, "u0 contains non-finite"),
        ({"u0": ["a", "b"]}, TypeError, "real floating dtype"),
        ({"u0": [1 + 2j]}, TypeError, "real floating dtype"),
        ({"u0": 1.0}, ValueError, r"u0 is a scalar \(shape \(\)\); give the state as .*\[1.0\]"),
        ({"u0": np.array(2.0, dtype=np.float32)}, ValueError, "u0 is a scalar"),
        ({"p": (1.0, math.nan)}, ValueError, r"p\[1\] is not finite"),
        ({"p": {"k": np.array([1.0, np.inf])}}, ValueError, r"p\['k'\] contains non-finite"),
        ({"tspan": (0.0, 0.0)}, ValueError, "tspan is empty"),
        ({"tspan": (0.0, math.inf)}, ValueError, "tspan must be finite"),
        ({"tspan": (0.0,)}, ValueError, "tspan must be a pair"),
        # float() would take these: a string pair, a string, a boolean end
        ({"tspan": ("0", "1")}, ValueError, r"tspan must be a pair \(t0, t1\) of numbers"),
        ({"tspan": "01"}, ValueError, r"tspan must be a pair \(t0, t1\) of numbers"),
        ({"tspan": (0.0, True)}, ValueError, r"tspan must be a pair \(t0, t1\) of numbers"),
        ({"f": 3.0}, TypeError, "f must be callable"),
        ({"jac": 3.0}, TypeError, "jac must be callable"),
    ],
)
@pytest.mark.parametrize("how", ["construct", "remake"])  # remake validates what it replaces
def test_problem_validation(overrides, error, match, how):
    with pytest.raises(error, match=match):
        _prob(**overrides) if how == "construct" else _prob().remake(**overrides)


def test_remake_does_not_validate_what_it_keeps(monkeypatch):
    prob = _prob(p=np.array([1.0, 2.0]))
    checked = []
    for name in ("as_state_array", "as_tspan", "check_parameters_finite"):
        original = getattr(_validation, name)
        monkeypatch.setattr(
            _validation, name, lambda *args, _f=original, _n=name: checked.append(_n) or _f(*args)
        )
    other = prob.remake(p=np.array([3.0, 4.0]))
    assert checked == ["check_parameters_finite"]
    assert other.u0 is prob.u0 and other.tspan == prob.tspan and other.f is prob.f
    assert prob.remake(tspan=(0.0, 2.0)).p is prob.p and checked[1:] == ["as_tspan"]


def test_prob_func_remake_with_a_bad_value_names_the_value_and_the_trajectory():
    params = np.ones((5, 2))
    params[3, 1] = math.nan
    eprob = dxode.EnsembleProblem(
        _prob(p=np.ones(2)), prob_func=lambda prob, i, repeat: prob.remake(p=params[i])
    )
    with pytest.raises(ValueError, match="p contains non-finite values") as info:
        dxode.solve(eprob, trajectories=5)
    assert "raised by prob_func for trajectory 3" in info.value.__notes__
    tuples = dxode.EnsembleProblem(
        _prob(p=(1.0, 1.0)), prob_func=lambda prob, i, repeat: prob.remake(p=tuple(params[i]))
    )
    with pytest.raises(ValueError, match=r"p\[1\] is not finite"):
        dxode.solve(tuples, trajectories=5)


def test_integer_u0_becomes_float64():
    assert _prob(u0=[1, 0]).u0.dtype == np.float64
    # Integer and bool arrays too (they were refused: "must have a real floating dtype").
    assert _prob(u0=np.array([1, 0])).u0.dtype == np.float64
    assert _prob().remake(u0=np.array([True, False])).u0.dtype == np.float64


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rtol": 0.0}, ValueError, "rtol must be positive"),
        ({"rtol": -1e-3}, ValueError, "rtol must be positive"),
        ({"atol": 0.0}, ValueError, "atol must be positive"),
        ({"atol": [1e-6, -1.0]}, ValueError, "atol must be positive"),
        ({"dt": -0.1}, ValueError, "dt must be positive"),
        ({"maxiters": 0}, ValueError, "maxiters must be a positive integer"),
        ({"saveat": [0.5, 2.0]}, ValueError, r"saveat time 2.0 is outside tspan"),
        ({"saveat": [0.5, 0.2]}, ValueError, "strictly increasing"),
        ({"saveat": []}, ValueError, "saveat is empty"),
        ({"saveat": -1.0}, ValueError, "saveat as an interval must be positive"),
        ({"saveat": "a"}, TypeError, "saveat must be None, a positive interval or a 1-D"),
        ({"saveat": True}, TypeError, "saveat must be None, a positive interval .* got True"),
        ({"tstops": [3.0]}, ValueError, "tstops time 3.0 is outside tspan"),
        ({"tstops": 0.5}, ValueError, r"tstops must be a 1-D sequence .* give \[0.5\]"),
        ({"maxiters": 10**20}, ValueError, r"maxiters must be a positive integer below 2\*\*63"),
        ({"adaptive": "no"}, TypeError, "adaptive must be True, False or None, got 'no'"),
        ({"dense": "yes"}, TypeError, "dense must be True, False or None, got 'yes'"),
        ({"rtol": True}, TypeError, "rtol must be a positive number, got True"),
        ({"atol": True}, TypeError, "atol must be a positive number or an array of them"),
        ({"atol": [1e-6 + 1j, 1e-6]}, TypeError, "atol must be a positive number or an array"),
        ({"bogus": 1}, TypeError, r"unknown option\(s\) \['bogus'\]"),
        ({"controller": "pi"}, TypeError, "controller must be a step-size controller"),
        # Numbers given as strings were read by float() (rtol="1e-3" solved at 1e-3).
        ({"rtol": "1e-3"}, TypeError, "rtol must be a positive number, got '1e-3'"),
        ({"dt": "0.1"}, TypeError, "dt must be a positive number, got '0.1'"),
        ({"dtmax": "1"}, TypeError, "dtmax must be a positive number, got '1'"),
        ({"saveat": "0.1"}, TypeError, "saveat must be None, a positive interval .* got '0.1'"),
        ({"saveat": ["0.5"]}, TypeError, r"saveat must be a 1-D sequence of times, got \['0.5'\]"),
        ({"saveat": [True]}, TypeError, r"saveat must be a 1-D sequence of times, got \[True\]"),
        ({"tstops": ["0.5"]}, TypeError, r"tstops must be a 1-D sequence of times, got \['0.5'\]"),
        ({"tstops": [None]}, TypeError, r"tstops must be a 1-D sequence of times, got \[None\]"),
    ],
)
def test_option_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        dxode.solve(_prob(), dxode.Tsit5(), **kwargs)


def test_numpy_integer_maxiters_is_accepted():
    # It was refused: "maxiters must be a positive integer, got np.int64(100)".
    sol = dxode.solve(_prob(), dxode.Tsit5(), maxiters=np.int64(3), saveat=[1.0])
    assert sol.retcode == ReturnCode.MaxIters and sol.stats.naccept + sol.stats.nreject == 3


def _public_methods():
    from dxode.solvers import AbstractStepper, ExplicitRungeKutta

    classes = [getattr(dxode, name) for name in dxode.__all__]
    steppers = [c for c in classes if isinstance(c, type) and issubclass(c, AbstractStepper)]
    return [c for c in steppers if c not in (AbstractStepper, ExplicitRungeKutta)]  # no defaults


@pytest.mark.parametrize("cls", _public_methods(), ids=lambda cls: cls.__name__)
def test_every_method_is_taken_by_its_lowercase_name(cls):
    # "autoswitch" was refused (unknown algorithm), though the docs name AutoSwitch() with
    # "a name such as 'tsit5'".
    from dxode.solvers import get_algorithm

    assert type(get_algorithm(cls.__name__.lower())) is cls


def test_algorithm_lookup_errors():
    with pytest.raises(ValueError, match="unknown algorithm 'rk99'"):
        dxode.solve(_prob(), "rk99")
    with pytest.raises(ValueError, match="needs a step size: pass dt"):
        dxode.solve(_prob(), dxode.RK4())
    with pytest.raises(ValueError, match="cannot take adaptive steps"):
        dxode.solve(_prob(), dxode.Euler(), dt=0.1, adaptive=True)
    assert dxode.solve(_prob(), "DP5").alg.__class__ is dxode.DP5
    assert dxode.solve(_prob(), dxode.Vern7).alg.__class__ is dxode.Vern7


@pytest.mark.parametrize(
    ("f", "error", "match"),
    [
        (lambda u, p, t: None, TypeError, "must return an array"),
        (lambda u, p, t: [u[0]], ValueError, "returned 1 rows for a state of 2"),
        (lambda u, p, t: u[:1], ValueError, r"returned shape \(1,\) for a state of shape \(2,\)"),
        (
            lambda u, p, t: np.asarray(u, dtype=np.float64),
            TypeError,
            "returned dtype float64 for a float32",
        ),
        (lambda u, p, t: np.asarray(u, dtype=object), TypeError, "use `autograd.numpy`"),
        (  # the Python float makes the array float64: the fix is to name the dtype
            lambda u, p, t: np.array([u[1], -9.81]),
            TypeError,
            r"float32 state; .* np.array\(\[...\], dtype=u.dtype\)",
        ),
    ],
)
def test_rhs_output_is_checked_before_integrating(f, error, match):
    prob = dxode.ODEProblem(f, np.array([1.0, 0.0], dtype=np.float32), (0.0, 1.0))
    with pytest.raises(error, match=match):
        dxode.solve(prob)


def test_maxiters_retcode():
    sol = dxode.solve(_prob(tspan=(0.0, 100.0)), dxode.Tsit5(), maxiters=10)
    assert sol.retcode == ReturnCode.MaxIters
    assert not sol.success
    assert sol.stats.naccept + sol.stats.nreject == 10
    assert "maxiters" in sol.retcode.message


def test_blowup_gives_dt_less_than_min():
    # u' = u^2, u(0) = 1 blows up at t = 1.
    prob = dxode.ODEProblem(lambda u, p, t: u * u, [1.0], (0.0, 2.0))
    sol = dxode.solve(prob, dxode.Tsit5(), rtol=1e-6, atol=1e-6)
    assert sol.retcode == ReturnCode.DtLessThanMin
    assert float(sol.t[-1]) == pytest.approx(1.0, abs=1e-3)


def test_default_dtmin_is_relative_to_the_current_time():
    # A fast transient at t = 0 inside a span of 1e11: steps of 1e-6 must be allowed there
    # (a floor of 16 eps |t1| = 3.6e-4 failed this), while a blow-up still fails.
    prob = dxode.ODEProblem(lambda u, p, t: -1e6 * (u - np.exp(-t * 1e-11)), [0.0], (0.0, 1e11))
    sol = dxode.solve(prob, dxode.Rodas5P(), rtol=1e-6, atol=1e-10, saveat=[1e-3, 1e11])
    assert sol.retcode == ReturnCode.Success
    np.testing.assert_allclose(np.asarray(sol.u)[:, 0], [1.0, np.exp(-1.0)], rtol=1e-5)


def test_nan_rhs_gives_unstable():
    def f(u, p, t):
        return -u + (np.nan if t > 0.5 else 0.0)

    sol = dxode.solve(dxode.ODEProblem(f, [1.0], (0.0, 1.0)), dxode.Tsit5())
    assert sol.retcode == ReturnCode.Unstable
    assert float(sol.t[-1]) <= 0.5
    assert np.all(np.isfinite(sol.u))


def _nan_after_half(u, p, t):
    # NaN for t > 0.5 on scalars and lane rows alike (and in a compiled kernel).
    return [-u[0] + 0.0 * np.sqrt(0.5 - t)]


@pytest.mark.parametrize(
    "alg",
    [
        "tsit5",
        "vern7",
        "rosenbrock23",
        "rodas5p",
        "trbdf2",
        dxode.AutoSwitch(),
    ],
    ids=str,
)
@pytest.mark.parametrize("adaptive", [True, False])
def test_nan_rhs_gives_unstable_with_every_method(alg, adaptive):
    # TRBDF2 ended DtLessThanMin here: a Newton iteration that met a
    # NaN counted as one that merely did not converge.
    opts = {} if adaptive else {"adaptive": False, "dt": 0.1}
    prob = dxode.ODEProblem(_nan_after_half, [1.0], (0.0, 1.0))
    with np.errstate(invalid="ignore"):
        sol = dxode.solve(prob, alg, **opts)
        sim = dxode.solve(dxode.EnsembleProblem(prob), alg, trajectories=2, **opts)
    assert sol.retcode == ReturnCode.Unstable
    assert 0.4 <= float(sol.t[-1]) <= 0.5
    assert np.all(np.isfinite(sol.u))
    assert [ReturnCode(int(c)) for c in sim.retcodes] == [ReturnCode.Unstable] * 2


def test_nan_in_fixed_step_gives_unstable():
    def f(u, p, t):
        return -u + (np.nan if t > 0.5 else 0.0)

    sol = dxode.solve(dxode.ODEProblem(f, [1.0], (0.0, 1.0)), dxode.RK4(), dt=0.1)
    assert sol.retcode == ReturnCode.Unstable


def test_saveat_points_after_a_failure_are_nan():
    prob = dxode.ODEProblem(lambda u, p, t: u * u, [1.0], (0.0, 2.0))
    sol = dxode.solve(prob, saveat=[0.0, 0.5, 1.5])
    assert sol.retcode == ReturnCode.DtLessThanMin
    assert np.isfinite(sol.u[1, 0]) and np.isnan(sol.u[2, 0])


def test_dense_output_errors():
    sol = dxode.solve(dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0), saveat=0.5)
    with pytest.raises(ValueError, match="no dense output"):
        sol(0.25)
    dense = dxode.solve(dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0))
    with pytest.raises(ValueError, match="outside the solved span"):
        dense(1.5)
    # Ensembles keep none by default (the message said "the default when saveat is not
    # given"), and a solve a callback ended at t0 took no step to interpolate.
    eprob = dxode.EnsembleProblem(dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0), u0=[[1.0]])
    with pytest.raises(ValueError, match=r"an ensemble keeps it only with dense=True"):
        dxode.solve(eprob)[0](0.25)
    stop = dxode.PresetTimeCallback([0.0], None, terminate=True)
    stopped = dxode.solve(dxode.ODEProblem(decay, [1.0], (0.0, 1.0), 1.0), callback=stop)
    with pytest.raises(ValueError, match=r"took no step \(retcode Terminated at t0\)"):
        stopped(0.0)
    # These failed inside NumPy ("could not convert string to float"), or were flattened.
    with pytest.raises(TypeError, match=r"sol\(t\) takes a time or a 1-D array of times"):
        dense("a")
    with pytest.raises(ValueError, match=r"1-D array of times, got shape \(1, 2\)"):
        dense([[0.25, 0.5]])
    # "0.5" was read as 0.5, True as t = 1, None as nan ("cannot interpolate at t = nan").
    for t in ("0.5", True, None, ["0.5"]):
        with pytest.raises(TypeError, match=r"sol\(t\) takes a time or a 1-D array of times"):
            dense(t)
    np.testing.assert_array_equal(dense(np.int64(1)), dense(1.0))


def test_retcode_messages_are_actionable():
    for code in ReturnCode:
        assert len(code.message) > 20
    assert ReturnCode.Success.successful and ReturnCode.Terminated.successful
    assert not ReturnCode.Unstable.successful


def test_a_retcode_prints_its_name_and_still_counts_as_its_number():
    # print(sol.retcode) showed "0" (IntEnum's str); the number stays for arrays and format
    assert str(ReturnCode.MaxIters) == f"{ReturnCode.MaxIters}" == "MaxIters"
    assert ReturnCode.MaxIters == 1 and f"{ReturnCode.MaxIters:d}" == "1"


def _falling_as_one_array(u, p, t):
    return np.array([u[1], -p[0]])  # a row of lanes beside a number: ragged in an ensemble


def test_an_ensemble_f_building_one_array_from_lane_rows_and_numbers_is_told_to_return_rows():
    """NumPy's own ValueError (setting an array element with a sequence ... inhomogeneous
    shape) said nothing of the lanes; the message now names the list of rows to return."""
    prob = dxode.ODEProblem(_falling_as_one_array, [1.0, 0.0], (0.0, 0.5), np.array([9.81]))
    ensemble = dxode.EnsembleProblem(prob, u0=np.array([[1.0, 0.0], [2.0, 0.0]]))
    with pytest.raises(ValueError, match=r"lanes last.*\[u\[1\], -p\[0\]\].*NumPy says"):
        dxode.solve(ensemble, dxode.Tsit5(), saveat=[0.5])


def _fills_one_trajectory(u, p, t):
    du = np.empty(2)  # one trajectory's shape; in an ensemble u is (2, lanes)
    du[0] = u[1]
    du[1] = -p[0] * u[0]
    return du


def test_an_ensemble_f_filling_an_array_of_one_trajectory_s_shape_is_told_to_allocate_like_u():
    # NumPy's "setting an array element with a sequence" at the user's du[0] = u[1] said
    # nothing of the lanes; a note now names u's shape and the fix.
    prob = dxode.ODEProblem(_fills_one_trajectory, [1.0, 0.0], (0.0, 0.5), np.array([9.81]))
    ensemble = dxode.EnsembleProblem(prob, u0=np.array([[1.0, 0.0], [2.0, 0.0]]))
    with pytest.raises(ValueError, match="array element with a sequence") as raised:
        dxode.solve(ensemble, dxode.Tsit5(), saveat=[0.5])
    note = " ".join(getattr(raised.value, "__notes__", []))
    assert "u of shape (2, 2)" in note and "np.empty_like(u)" in note
    single = dxode.solve(prob, dxode.Tsit5(), saveat=[0.5], rtol=1e-8, atol=1e-8)  # fine
    w = np.sqrt(9.81)
    np.testing.assert_allclose(single.u[-1], [np.cos(w / 2), -w * np.sin(w / 2)], atol=1e-6)
