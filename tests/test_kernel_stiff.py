"""Rosenbrock methods in the compiled kernels agree with the array path.

On the Bari test set (``stiff_problems``) the kernel reaches the digits the array path must
reach (``test_bari.EXPECTED``) at the test set's tolerances, in about as many steps; with the
same derivatives (the user's ``jac``, or forward differences on both sides) its statistics
match the array path's. The problems are written here once more with scalar rows, so numba
compiles them; the published reference values are ``stiff_problems``'s.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from scripts import assert_runs_under_cuda_simulator
from stiff_problems import HIRES, OREGO, ROBER, VDPOL, scd
from test_bari import EXPECTED

import dxode
from dxode.kernels.description import describe
from dxode.kernels.errors import KernelUnsupportedError

pytest.importorskip("numba")


def vdpol(u, p, t):
    return [u[1], ((1.0 - u[0] * u[0]) * u[1] - u[0]) / 1e-6]


def vdpol_jac(u, p, t):
    return [[0.0, 1.0], [(-2.0 * u[0] * u[1] - 1.0) / 1e-6, (1.0 - u[0] * u[0]) / 1e-6]]


def rober(u, p, t):
    k1, k2, k3 = p
    return [
        -k1 * u[0] + k3 * u[1] * u[2],
        k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] * u[1],
        k2 * u[1] * u[1],
    ]


def rober_jac(u, p, t):
    k1, k2, k3 = p
    return [
        [-k1, k3 * u[2], k3 * u[1]],
        [k1, -k3 * u[2] - 2.0 * k2 * u[1], -k3 * u[1]],
        [0.0, 2.0 * k2 * u[1], 0.0],
    ]


def orego(u, p, t):
    y1, y2, y3 = u[0], u[1], u[2]
    return [
        77.27 * (y2 + y1 * (1.0 - 8.375e-6 * y1 - y2)),
        (y3 - (1.0 + y1) * y2) / 77.27,
        0.161 * (y1 - y3),
    ]


def orego_jac(u, p, t):
    y1, y2 = u[0], u[1]
    return [
        [77.27 * (1.0 - 2.0 * 8.375e-6 * y1 - y2), 77.27 * (1.0 - y1), 0.0],
        [-y2 / 77.27, -(1.0 + y1) / 77.27, 1.0 / 77.27],
        [0.161, 0.0, -0.161],
    ]


def hires(u, p, t):
    y1, y2, y3, y4, y5, y6, y7, y8 = u
    r7 = 280.0 * y6 * y8 - 1.81 * y7
    return [
        -1.71 * y1 + 0.43 * y2 + 8.32 * y3 + 0.0007,
        1.71 * y1 - 8.75 * y2,
        -10.03 * y3 + 0.43 * y4 + 0.035 * y5,
        8.32 * y2 + 1.71 * y3 - 1.12 * y4,
        -1.745 * y5 + 0.43 * (y6 + y7),
        -280.0 * y6 * y8 + 0.69 * y4 + 1.71 * y5 - 0.43 * y6 + 0.69 * y7,
        r7,
        -r7,
    ]


def hires_jac(u, p, t):
    y6, y8 = u[5], u[7]
    z = 0.0
    return [
        [-1.71, 0.43, 8.32, z, z, z, z, z],
        [1.71, -8.75, z, z, z, z, z, z],
        [z, z, -10.03, 0.43, 0.035, z, z, z],
        [z, 8.32, 1.71, -1.12, z, z, z, z],
        [z, z, z, z, -1.745, 0.43, 0.43, z],
        [z, z, z, 0.69, 1.71, -280.0 * y8 - 0.43, 0.69, -280.0 * y6],
        [z, z, z, z, z, 280.0 * y8, -1.81, 280.0 * y6],
        [z, z, z, z, z, -280.0 * y8, 1.81, -280.0 * y6],
    ]


SCALAR_ROWS = {
    "vdpol": (vdpol, vdpol_jac, None),
    "rober": (rober, rober_jac, (0.04, 3e7, 1e4)),
    "orego": (orego, orego_jac, None),
    "hires": (hires, hires_jac, None),
}
PROBLEMS = {p.name: p for p in (VDPOL, ROBER, OREGO, HIRES)}
# One compile each: every method, every problem.
CASES = [
    ("vdpol", "Rodas5P"),
    ("vdpol", "Rosenbrock23"),
    ("hires", "Rodas4"),
    ("rober", "Rodas5P"),
    ("orego", "TRBDF2"),
]


def _problem(name: str, with_jac: bool = True, dtype=np.float64) -> dxode.ODEProblem:
    problem = PROBLEMS[name]
    f, jac, p = SCALAR_ROWS[name]
    u0 = np.array(problem.u0, dtype=dtype)
    return dxode.ODEProblem(f, u0, problem.tspan, p, jac=jac if with_jac else None)


def _final(name: str, prob: dxode.ODEProblem, alg, **kwargs) -> dxode.ODESolution:
    problem = PROBLEMS[name]
    options = {"rtol": problem.rtol, "atol": problem.atol, "saveat": [problem.tspan[1]]}
    sol = dxode.solve(prob, alg, **options, **kwargs)
    assert sol.retcode == dxode.ReturnCode.Success, sol.retcode
    return sol


def _cases():
    for name, method in CASES:
        marks = [] if (name, method) == ("vdpol", "Rodas5P") else [pytest.mark.slow]
        yield pytest.param(name, method, marks=marks, id=f"{name}-{method}")


@pytest.mark.parametrize(("name", "method"), list(_cases()))
def test_kernel_reaches_the_bari_reference_like_the_array_path(name, method):
    """With the analytic Jacobian: the digits the array path must reach, in as many steps."""
    prob = _problem(name)
    alg = getattr(dxode, method)()
    kernel, array = _final(name, prob, alg, kernel=True), _final(name, prob, alg)
    problem = PROBLEMS[name]
    digits = scd(np.asarray(kernel.u)[-1], problem)
    assert digits >= EXPECTED[problem, method]
    assert abs(digits - scd(np.asarray(array.u)[-1], problem)) < 0.3
    steps = array.stats.naccept
    assert abs(kernel.stats.naccept - steps) <= max(2, 0.02 * steps)
    assert abs(kernel.stats.nreject - array.stats.nreject) <= max(2, 0.05 * steps)
    assert kernel.stats.njac == kernel.stats.naccept + kernel.stats.nreject
    assert kernel.stats.nlu == kernel.stats.njac


def test_finite_difference_jacobian_matches_the_array_paths():
    """Without a ``jac`` the kernel differences ``f`` as the array path's
    ``autodiff="finite_difference"`` does: the same counts, the same solution to round-off."""
    prob = _problem("vdpol", with_jac=False)
    kernel = _final("vdpol", prob, dxode.Rodas5P(), kernel=True)
    array = _final("vdpol", prob, dxode.Rodas5P(autodiff="finite_difference"))
    n = 2
    attempts = kernel.stats.naccept + kernel.stats.nreject
    # 8 stages' evaluations (7 stages + the fresh f), n for J, 1 for df/dt; 2 to start.
    assert kernel.stats.nf == 2 + attempts * (8 + n + 1)
    # Van der Pol's ~730 steps move by a few with the last bits (LAPACK's inverse against the
    # kernel's elimination; the differenced Jacobians, which differ even with the same
    # elimination on both paths: 727 and 728 steps). Rounding each step to how far it moves
    # t reshuffled them (727/726 to 725/728).
    assert abs(kernel.stats.naccept - array.stats.naccept) <= 4
    assert abs(kernel.stats.nf - array.stats.nf) <= 4 * (8 + n + 1)
    np.testing.assert_allclose(np.asarray(kernel.u)[-1], np.asarray(array.u)[-1], rtol=1e-7)
    assert scd(np.asarray(kernel.u)[-1], VDPOL) >= EXPECTED[VDPOL, "Rodas5P"]


@pytest.fixture
def generic_lu(monkeypatch):
    """The array path on NumPy with the generic elimination (partial pivoting, as the kernel
    factors) instead of LAPACK's inverses: the same linear algebra on both paths."""
    from dxode.backends import _base, get_backend

    numpy_backend = type(get_backend("numpy"))
    monkeypatch.setattr(numpy_backend, "lu_factor", _base.Backend.lu_factor)
    monkeypatch.setattr(numpy_backend, "lu_solve", _base.Backend.lu_solve)


SAME_ALGEBRA = [
    "Rodas5P",
    pytest.param("Rodas4", marks=pytest.mark.slow),
    pytest.param("TRBDF2", marks=pytest.mark.slow),
    "Rosenbrock23",
]


@pytest.mark.parametrize("method", SAME_ALGEBRA)
def test_with_the_same_linear_algebra_the_kernel_is_the_array_path(generic_lu, method):
    """With the same elimination on both paths the kernel takes the array path's steps and
    reaches its values: what differs otherwise is LAPACK's inverse. The one difference left is
    the controller's power (the kernel's own log/exp, NumPy's ``pow`` on the array path,
    which differ in the last bits), as in ``test_kernel_agreement``."""
    prob = _problem("vdpol").remake(tspan=(0.0, 0.5))
    options = {"rtol": 1e-6, "atol": 1e-6, "saveat": np.linspace(0.0, 0.5, 6)}
    kernel = dxode.solve(prob, getattr(dxode, method)(), kernel=True, **options)
    array = dxode.solve(prob, getattr(dxode, method)(), **options)
    stats = lambda sol: (sol.stats.naccept, sol.stats.nreject, sol.stats.nf, sol.stats.njac)
    assert stats(kernel) == stats(array)
    # The controller's factor is not NumPy's ``pow`` bit for bit (the kernel's vectorized
    # log/exp, within 2 ulp); on this stiff problem (epsilon = 1e-6) W's conditioning turns
    # such last-bit step differences into 3e-12 relative ones after the first step and 4e-9
    # in the values at rtol = 1e-6: agreement to a hundredth of the tolerance.
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=0, atol=1e-8)


@pytest.mark.slow
def test_every_step_is_saved_without_saveat(generic_lu):
    """Without ``saveat`` a single solve records every accepted step, as the array path does.

    The controller's factor moves the step ends in their last bits (see above), which this
    stiff problem grows to 0.4 % in the step times: the kernel's states are compared with the
    array path's dense output at the kernel's own step times, and the end states directly."""
    prob = _problem("vdpol").remake(tspan=(0.0, 0.5))
    kernel = dxode.solve(prob, dxode.Rodas5P(), kernel=True, rtol=1e-6, atol=1e-6)
    array = dxode.solve(prob, dxode.Rodas5P(), rtol=1e-6, atol=1e-6)
    t, u = np.asarray(kernel.t), np.asarray(kernel.u)
    assert t.shape == np.asarray(array.t).shape and t[-1] == array.t[-1]
    assert kernel.stats.naccept == array.stats.naccept
    np.testing.assert_allclose(u[-1], np.asarray(array.u)[-1], rtol=0, atol=1e-8)
    np.testing.assert_allclose(u, np.asarray(array(t)), rtol=1e-5, atol=1e-6)


def prothero_robinson(u, p, t):
    return [-p[0] * (u[0] - math.sin(t)) + math.cos(t)]


def prothero_robinson_tgrad(u, p, t):
    return [-p[0] * (-math.cos(t)) - math.sin(t)]


@pytest.mark.parametrize("method", [pytest.param("Rodas4", marks=pytest.mark.slow), "Rosenbrock23"])
def test_user_tgrad_and_one_state(method):
    """A non-autonomous stiff problem (``u = sin t`` exactly), with the user's ``tgrad`` and
    with a forward difference in ``t``, on one state.

    The kernel factors ``W`` by elimination, the array path (NumPy) inverts it with LAPACK,
    and the controller's factor is the kernel's log/exp, not NumPy's pow: the round-off
    differs, so a step size can differ in its last bits, and the two solutions agree to the
    tolerance (rtol = 1e-5 here), not to round-off.
    """
    alg = getattr(dxode, method)()
    options = {"rtol": 1e-5, "atol": 1e-7, "saveat": np.linspace(0.0, 2.0, 5)}
    for tgrad in (prothero_robinson_tgrad, None):
        prob = dxode.ODEProblem(prothero_robinson, np.array([0.0]), (0.0, 2.0), (1e4,), tgrad=tgrad)
        kernel = dxode.solve(prob, alg, kernel=True, **options)
        array = dxode.solve(prob, alg, **options)
        exact = np.sin(options["saveat"])
        assert np.max(np.abs(np.asarray(kernel.u)[:, 0] - exact)) < 1e-4
        assert abs(kernel.stats.naccept - array.stats.naccept) <= 2
        assert kernel.stats.nf == array.stats.nf
        np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_ensemble_with_per_lane_parameters_matches_the_array_path():
    """Robertson with ``k1`` per trajectory: each lane as the array path's ensemble solves it."""
    prob = _problem("rober").remake(tspan=(0.0, 1e3))
    p = np.array([[0.04 * (1 + i / 4), 3e7, 1e4] for i in range(6)])
    eprob = dxode.EnsembleProblem(prob, p=p)
    options = {"rtol": 1e-7, "atol": 1e-12, "saveat": [1.0, 10.0, 1e3]}
    kernel = dxode.solve(eprob, dxode.Rodas5P(), dxode.EnsembleKernel(block_size=4), **options)
    array = dxode.solve(eprob, dxode.Rodas5P(), dxode.EnsembleArray(), **options)
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=1e-6, atol=1e-12)
    ends = np.asarray(kernel.u)[:, -1, 0]
    assert np.all(np.diff(ends) < 0)  # a faster first reaction leaves less y1: p reached f
    for k, a in zip(kernel, array, strict=True):
        assert k.retcode == dxode.ReturnCode.Success
        assert abs(k.stats.naccept - a.stats.naccept) <= 2


@pytest.mark.slow
def test_float32_runs_in_float32():
    prob = _problem("vdpol", dtype=np.float32).remake(tspan=(0.0, 0.5))
    options = {"rtol": 1e-4, "atol": 1e-4, "saveat": [0.25, 0.5]}
    kernel = dxode.solve(prob, dxode.Rosenbrock23(), kernel=True, **options)
    array = dxode.solve(prob, dxode.Rosenbrock23(), **options)
    assert np.asarray(kernel.u).dtype == np.float32
    assert kernel.retcode == dxode.ReturnCode.Success
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=1e-3)
    assert abs(kernel.stats.naccept - array.stats.naccept) <= max(2, 0.05 * array.stats.naccept)


@pytest.mark.slow
def test_the_looped_lu_of_larger_states_is_the_written_out_one(monkeypatch):
    """Past ``UNROLLED_LU_STATES`` the LU is looped and called instead of written out into the
    lane loops: the same elimination, operation for operation, so the same bits."""
    from dxode.kernels import compiler, rosenbrock_codegen

    prob = _problem("vdpol", with_jac=False)
    written = _final("vdpol", prob, dxode.Rodas5P(), kernel=True)
    monkeypatch.setattr(rosenbrock_codegen, "UNROLLED_LU_STATES", 1)
    monkeypatch.setattr(compiler, "_COMPILED", {})  # built anew, not the kernel just used
    looped = _final("vdpol", prob, dxode.Rodas5P(), kernel=True)
    (kernel,) = compiler._COMPILED.values()
    assert "for k in range(2):" in kernel.source_path.read_text()  # the looped factorization
    assert np.array_equal(np.asarray(looped.u), np.asarray(written.u))
    assert looped.stats == written.stats


def _big(u, p, t):
    return [-u[i] for i in range(29)]


def test_states_past_the_limit_are_refused_with_a_pointer_to_the_array_path():
    prob = dxode.ODEProblem(_big, np.ones(29), (0.0, 1.0))
    with pytest.raises(KernelUnsupportedError, match=r"at most 28 .*u0 has 29.*array path"):
        dxode.solve(prob, dxode.Rodas5P(), kernel=True)


def _short_rows_jac(u, p, t):
    return [[-1.0, 0.0], [0.0, -1.0], [0.0, 0.0]]


def test_a_jac_of_the_wrong_shape_is_refused_naming_it():
    # was a KernelCompileError naming f, from numba's "tuple index out of range"
    prob = _problem("rober").remake(jac=_short_rows_jac)
    with pytest.raises(ValueError, match=r"rows of shape \(3, 2\).*jac 3 rows of 3") as info:
        dxode.solve(prob, dxode.Rodas5P(), kernel=True, saveat=[1.0])
    assert f"test_kernel_stiff.py:{_short_rows_jac.__code__.co_firstlineno}" in str(info.value)


def _negated_rober_jac(u, p, t):
    return [[-x for x in row] for row in rober_jac(u, p, t)]


@pytest.mark.parametrize("how", ["kernel", "EnsembleKernel"])
def test_a_jac_with_its_sign_flipped_is_refused_before_compiling(how):
    # Robertson with -jac ran the kernel to MaxIters, as it did the array path.
    prob = _problem("rober").remake(jac=_negated_rober_jac)
    with pytest.raises(ValueError, match=r"jac\(u, p, t\) disagrees with f at the initial"):
        if how == "kernel":
            dxode.solve(prob, dxode.Rodas5P(), kernel=True, saveat=[1.0], maxiters=1000)
        else:
            eprob = dxode.EnsembleProblem(prob, u0=np.array([[1.0, 0.0, 0.0], [0.5, 1e-5, 0.5]]))
            ensemble = dxode.EnsembleKernel()
            dxode.solve(eprob, dxode.Rodas5P(), ensemble, trajectories=2, maxiters=1000)


def _decay_pair(u, p, t):
    return [-u[0], -2.0 * u[1]]


def _jac_short_later(u, p, t):
    if t > 0.5:
        return np.array([[-1.0, 0.0]])
    return np.array([[-1.0, 0.0], [0.0, -2.0]])


def _tgrad_short_later(u, p, t):
    return np.zeros(1) if t > 0.5 else np.zeros(2)


@pytest.mark.parametrize("which", ["jac", "tgrad"])
def test_a_jac_or_tgrad_short_of_rows_after_the_check_gets_a_value_error(which):
    # The rows are counted once, at t = 0; a NumPy array's reads are not bounds-checked, so a
    # jac or tgrad short of a row later was read past its end, silently.
    derivatives = {"jac": _jac_short_later}
    if which == "tgrad":
        derivatives = {"jac": lambda u, p, t: [[-1.0, 0.0], [0.0, -2.0]]}
        derivatives["tgrad"] = _tgrad_short_later
    prob = dxode.ODEProblem(_decay_pair, np.ones(2), (0.0, 1.0), **derivatives)
    with pytest.raises(ValueError, match=r"read past its end.*jac, tgrad"):
        dxode.solve(prob, dxode.Rodas5P(), kernel=True, saveat=[1.0])


def _jac_pair(u, p, t):
    return [[-1.0, 0.0], [0.0, -2.0]]


def _tgrad_of_a_jacs_shape(u, p, t):
    return [[0.0, 0.0], [0.0, 0.0]]


def _jac_of_a_tgrads_shape(u, p, t):
    return [0.0, 0.0]


@pytest.mark.parametrize(
    ("derivatives", "message"),
    [
        (
            {"jac": _jac_pair, "tgrad": _tgrad_of_a_jacs_shape},
            r"the tgrad .* rows of shape \(2, 2\)",
        ),
        ({"jac": _jac_of_a_tgrads_shape}, r"the jac .* rows of shape \(2,\)"),
    ],
    ids=["tgrad", "jac"],
)
def test_a_tgrad_or_jac_with_the_others_shape_is_refused_naming_it(derivatives, message):
    # Both passed the row check (it took (n,) and (n, n) from each), and the kernel failed to
    # compile with numba's message, naming f.
    prob = dxode.ODEProblem(_decay_pair, np.ones(2), (0.0, 1.0), **derivatives)
    with pytest.raises(ValueError, match=message) as info:
        dxode.solve(prob, dxode.Rodas5P(), kernel=True, saveat=[1.0])
    function = derivatives.get("tgrad", derivatives["jac"])
    assert f"test_kernel_stiff.py:{function.__code__.co_firstlineno}" in str(info.value)


def test_autograd_and_unknown_methods_are_refused():
    prob = _problem("vdpol")
    with pytest.raises(KernelUnsupportedError, match="autodiff='autograd'"):
        dxode.solve(prob, dxode.Rodas5P(autodiff="autograd"), kernel=True)
    with pytest.raises(KernelUnsupportedError, match="Rodas5P and TRBDF2, not 'other'"):
        describe("other")


CUDA_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import dxode
    from test_kernel_stiff import _problem

    prob = _problem("rober").remake(tspan=(0.0, 10.0))
    p = np.array([[0.04 * (1 + i / 4), 3e7, 1e4] for i in range(3)])
    spans = np.array([[0.0, 10.0 - i] for i in range(3)])
    options = {"saveat": [0.0, 0.5, 5.0], "rtol": 1e-6, "atol": 1e-10}
    cases = ((dxode.Rodas5P(), True), (dxode.Rosenbrock23(), False), (dxode.TRBDF2(), True))
    for alg, jac in cases:
        base = prob if jac else prob.remake(jac=None)
        eprob = dxode.EnsembleProblem(base, p=p, tspan=spans)
        gpu = dxode.solve(eprob, alg, dxode.EnsembleKernel(device="cuda"), **options)
        cpu = dxode.solve(eprob, alg, dxode.EnsembleKernel(), **options)
        assert np.array_equal(np.asarray(gpu.u), np.asarray(cpu.u)), alg
        stats = lambda sim: [(s.stats.naccept, s.stats.nreject, s.stats.nf) for s in sim]
        assert stats(gpu) == stats(cpu), (stats(gpu), stats(cpu))
        assert all(s.retcode == dxode.ReturnCode.Success for s in gpu)
    print("ok")
    """
)


@pytest.mark.slow
def test_cuda_kernel_under_the_simulator_matches_the_cpu_kernel():
    """The CUDA kernel (thread-local LU) under numba-cuda's simulator agrees bitwise with the
    CPU kernel; ``NUMBA_ENABLE_CUDASIM`` must be set before ``numba.cuda`` is imported, so the
    check runs in a fresh interpreter."""
    pytest.importorskip("numba.cuda")
    assert_runs_under_cuda_simulator(CUDA_SCRIPT)


def _nan_after(u, p, t):
    return [-u[0] + 0.0 * np.sqrt(p[0] - t)]  # NaN once t > p[0]


@pytest.mark.slow
@pytest.mark.parametrize("adaptive", [True, False])
def test_trbdf2_a_nan_rhs_ends_unstable_like_the_array_path(adaptive):
    # The kernel ended this DtLessThanMin: a Newton iteration that met a NaN got the
    # largest finite error, as one that merely did not converge.
    opts = {"saveat": [1.0]} | ({} if adaptive else {"adaptive": False, "dt": 0.1})
    prob = dxode.ODEProblem(_nan_after, [1.0], (0.0, 1.0), np.array([2.0]))
    eprob = dxode.EnsembleProblem(prob, p=np.array([[2.0], [0.5]]))
    sim = dxode.solve(eprob, dxode.TRBDF2(), dxode.EnsembleKernel(), **opts)
    with np.errstate(invalid="ignore"):
        ref = dxode.solve(eprob, dxode.TRBDF2(), **opts)
    codes = [dxode.ReturnCode.Success, dxode.ReturnCode.Unstable]
    assert [dxode.ReturnCode(int(c)) for c in sim.retcodes] == codes
    assert [dxode.ReturnCode(int(c)) for c in ref.retcodes] == codes
    np.testing.assert_allclose(sim.u[0], ref.u[0], rtol=1e-10)
