"""EnsembleKernel: per-trajectory inputs, batch invariance, outputs, and clear refusals."""

from __future__ import annotations

import collections
import re
import types

import numpy as np
import pytest

pytest.importorskip("numba")

import dxode
from dxode.kernels.batch import KernelBatch
from dxode.kernels.errors import KernelCompileError, KernelUnsupportedError

from problems import lorenz

N = 12
PROB = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 2.0), (10.0, 28.0, 8 / 3))
P = np.column_stack([np.full(N, 10.0), 28.0 + np.linspace(-2, 2, N), np.full(N, 8 / 3)])
U0 = np.column_stack([np.linspace(0.5, 1.5, N), np.zeros(N), np.zeros(N)])
OPTS = {"saveat": 0.5, "rtol": 1e-6, "atol": 1e-6}


def _plain_python_helper(x):
    return float(f"{x}")


def _both(eprob, **kwargs):
    options = {**OPTS, **kwargs}
    kernel = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **options)
    array = dxode.solve(eprob, "tsit5", dxode.EnsembleArray(), **options)
    return kernel, array


def _stats(sim):
    return [(s.stats.naccept, s.stats.nreject, s.stats.nf, int(s.retcode)) for s in sim]


def test_per_trajectory_u0_and_p_agree_with_the_array_path():
    kernel, array = _both(dxode.EnsembleProblem(PROB, u0=U0, p=P))
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=0, atol=1e-9)
    assert _stats(kernel) == _stats(array)


def test_per_trajectory_tspans():
    spans = np.column_stack([np.zeros(N), np.linspace(1.0, 2.0, N)])
    eprob = dxode.EnsembleProblem(PROB, p=P, tspan=spans)
    kernel, array = _both(eprob, saveat=None)
    np.testing.assert_allclose(np.asarray(kernel.u), np.asarray(array.u), rtol=0, atol=1e-9)
    assert _stats(kernel) == _stats(array)


def test_results_are_bitwise_independent_of_batch_block_and_threads():
    from dxode.kernels.compiler import _COMPILED

    eprob = dxode.EnsembleProblem(PROB, u0=U0, p=P)
    reference = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **OPTS)
    for alg, batch_size in [
        (dxode.EnsembleKernel(), 5),
        (dxode.EnsembleKernel(threads=1), 1),
        (dxode.EnsembleKernel(block_size=3, threads=2), 7),  # blocks over threads
        (dxode.EnsembleKernel(block_size=3, threads=1), N),  # one after another
    ]:
        other = dxode.solve(eprob, "tsit5", alg, batch_size=batch_size, **OPTS)
        np.testing.assert_array_equal(np.asarray(other.u), np.asarray(reference.u))
        assert _stats(other) == _stats(reference)
    assert any(k.driver.signatures for k in _COMPILED.values() if k.layout.block == 3)


@pytest.mark.parametrize(("blocks", "threads"), [(7, 2), (2, 2), (9, 4), (5, 1)])
def test_threads_share_the_blocks_in_contiguous_ranges(blocks, threads):
    # The blocks go to the threads in contiguous, nearly equal ranges (a static schedule),
    # each range on a thread of its own, the first on the caller's.
    import threading

    from dxode.kernels.cpu import _spread

    ranges = []
    barrier = threading.Barrier(threads, timeout=10)

    def driver(b0, b1, marker):
        barrier.wait()  # every range runs at the same time, each on a thread of its own
        ranges.append((b0, b1, threading.get_ident(), marker))

    _spread(driver, blocks, threads, "arrays")
    ranges.sort()
    assert [b for b0, b1, _, _ in ranges for b in range(b0, b1)] == list(range(blocks))
    assert {b1 - b0 for b0, b1, _, _ in ranges} <= {blocks // threads, -(-blocks // threads)}
    assert len({ident for _, _, ident, _ in ranges}) == threads
    assert ranges[0][2] == threading.get_ident()
    assert {marker for *_, marker in ranges} == {"arrays"}


def test_a_prob_func_changing_u0_in_place_gives_each_trajectory_its_own():
    def prob_func(prob, i, repeat):
        prob.u0[:] = U0[i]  # DifferentialEquations.jl style: in place, then return prob
        return prob

    eprob = dxode.EnsembleProblem(PROB.remake(u0=U0[0].copy()), prob_func=prob_func)
    sim = dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), trajectories=N, **OPTS)
    by_arrays = dxode.solve(
        dxode.EnsembleProblem(PROB, u0=U0), "tsit5", dxode.EnsembleKernel(), **OPTS
    )
    np.testing.assert_array_equal(np.asarray(sim.u), np.asarray(by_arrays.u))


def test_batch_func_prob_func_and_output_func():
    def batch_func(prob, ctx):
        return {"p": P[ctx.indices]}

    def prob_func(prob, i, repeat):
        return prob.remake(p=tuple(P[i]))

    by_batch = dxode.solve(
        dxode.EnsembleProblem(PROB, batch_func=batch_func),
        "tsit5",
        dxode.EnsembleKernel(),
        trajectories=N,
        **OPTS,
    )
    by_prob = dxode.solve(
        dxode.EnsembleProblem(PROB, prob_func=prob_func),
        "tsit5",
        dxode.EnsembleKernel(),
        trajectories=N,
        **OPTS,
    )
    np.testing.assert_array_equal(np.asarray(by_batch.u), np.asarray(by_prob.u))
    finals = dxode.solve(
        dxode.EnsembleProblem(PROB, p=P, output_func=lambda sol, i: (sol.u[-1, 0], False)),
        "tsit5",
        dxode.EnsembleKernel(),
        **OPTS,
    )
    np.testing.assert_array_equal(np.asarray(finals.u), np.asarray(by_batch.u)[:, -1, 0])


@pytest.mark.slow
def test_the_vectorized_commit_gives_the_general_blocks_bits(tmp_path, monkeypatch):
    # Without callbacks a CPU block commits most lanes' attempts with vectorized selects
    # (codegen._vector_commit); the general block's scalar per-lane code must give the same
    # bits: saves, tstops, per-lane ends, lanes that fail.
    from dxode.kernels import codegen

    def lorenz_general(u, p, t):  # its own kernel: the general block, compiled here
        x, y, z = u
        sigma, rho, beta = p
        return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]

    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))
    spans = np.column_stack([np.zeros(N), np.linspace(1.0, 2.0, N)])
    options = [
        {"saveat": [0.0, 0.25, 0.5, 0.9], "tstops": [0.3, 0.71], "rtol": 1e-6, "atol": 1e-6},
        {"saveat": [0.5], "maxiters": 60, "rtol": 1e-6, "atol": 1e-6},
    ]

    def run(prob):
        eprob = dxode.EnsembleProblem(prob, p=P, tspan=spans)
        return [dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **opts) for opts in options]

    vectorized = run(PROB)
    monkeypatch.setattr(codegen, "_vector_commit", lambda layout: False)
    general = run(PROB.remake(f=lorenz_general))
    for a, b in zip(vectorized, general, strict=True):
        np.testing.assert_array_equal(np.asarray(a.u), np.asarray(b.u))
        assert _stats(a) == _stats(b)
    assert int(dxode.ReturnCode.MaxIters) in [int(s.retcode) for s in vectorized[1]]


def test_lanes_fail_on_their_own():
    # maxiters stops the wide-p lanes' long runs while every lane keeps its own code.
    kernel, array = _both(dxode.EnsembleProblem(PROB, u0=U0, p=P), maxiters=60)
    codes = [int(s.retcode) for s in kernel]
    assert codes == [int(s.retcode) for s in array]
    assert int(dxode.ReturnCode.MaxIters) in codes
    np.testing.assert_array_equal(np.isnan(np.asarray(kernel.u)), np.isnan(np.asarray(array.u)))


def test_an_uncompilable_f_names_its_line_and_the_array_path():
    def calls_python(u, p, t):
        return [_plain_python_helper(u[0])]

    prob = dxode.ODEProblem(calls_python, np.array([1.0]), (0.0, 1.0))
    with pytest.raises(KernelCompileError, match=r"test_kernel_ensemble\.py:\d+") as info:
        dxode.solve(prob, "tsit5", kernel=True)
    assert "_plain_python_helper" in str(info.value)  # numba's reason
    assert "\x1b[" not in str(info.value)
    assert "kernel=False" in str(info.value)
    assert "EnsembleArray" in str(info.value)


def test_numba_formats_plainly_only_while_a_kernel_compiles():
    """``plain_messages`` drops numba's colours while a kernel compiles (with colorama,
    colouring the thousands of messages numba formats and discards cost 0.25 s of a cold
    compile), nested or not, and leaves numba's colour scheme as it was."""
    from numba.core import errors

    from dxode.kernels.plain_messages import plain_messages

    scheme = errors.termcolor()
    coloured = scheme.errmsg("message")

    eprob = dxode.EnsembleProblem(PROB, u0=U0, p=P)
    dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **OPTS)
    assert scheme.errmsg("message") == coloured
    with plain_messages():
        with plain_messages():
            assert scheme.errmsg("message") == "message"
        assert scheme.errmsg("message") == "message"
    assert "_markup" not in vars(scheme)
    assert scheme.errmsg("message") == coloured


def _short_array(u, p, t):
    return np.array([-u[0]])


def _long_array(u, p, t):
    return np.array([-u[0], -u[1], 0.0])


def _long_tuple(u, p, t):
    return (-u[0], -u[1], 0.0)


@pytest.mark.parametrize("f", [_short_array, _long_array, _long_tuple])
def test_an_f_with_the_wrong_number_of_rows_is_refused_like_on_the_array_path(f):
    # the kernel reads rows 0 .. n-1 unchecked: a short array was read past its end and a
    # long one cut short, silently
    prob = dxode.ODEProblem(f, np.array([1.0, 2.0]), (0.0, 1.0))
    with pytest.raises(ValueError, match="for a state of"):
        dxode.solve(prob, "tsit5", saveat=[1.0])
    with pytest.raises(ValueError, match=r"returns (3|1) rows") as info:
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    assert "test_kernel_ensemble.py" in str(info.value) and "state of 2" in str(info.value)


def _short_list_late(u, p, t):
    rows = [-u[0], -u[1]]
    if t > 0.5:
        rows = [-u[0]]
    return rows


def test_an_f_returning_a_short_list_after_the_check_gets_a_value_error_naming_f():
    # Rows are counted once, at t = 0; a list that is short later was numba's bare
    # IndexError("getitem out of range") from inside the kernel.
    prob = dxode.ODEProblem(_short_list_late, np.array([1.0, 2.0]), (0.0, 1.0))
    with pytest.raises(ValueError, match="returned 1 rows for a state of 2"):
        dxode.solve(prob, "tsit5", saveat=[1.0])
    with pytest.raises(ValueError, match=r"read past its end.*fewer rows") as info:
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    assert "test_kernel_ensemble.py" in str(info.value)


def _short_array_late(u, p, t):
    if t > 0.5:
        return np.array([-u[0]])
    return np.array([-u[0], -u[1]])


def test_an_f_returning_a_short_array_after_the_check_gets_a_value_error_naming_f():
    # numba does not bounds-check an array's reads: the kernel read past the end of the
    # short array and returned retcode Success with whatever memory held there.
    prob = dxode.ODEProblem(_short_array_late, np.array([1.0, 2.0]), (0.0, 1.0))
    with pytest.raises(ValueError, match=r"returned shape \(1,\) for a state of shape \(2,\)"):
        dxode.solve(prob, "tsit5", saveat=[1.0])
    with pytest.raises(ValueError, match=r"read past its end.*fewer rows") as info:
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    assert "test_kernel_ensemble.py" in str(info.value)
    eprob = dxode.EnsembleProblem(prob, p=np.zeros((4, 1)))
    with pytest.raises(ValueError, match=r"read past its end.*fewer rows"):
        dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(threads=1), saveat=[1.0])


def _forgets_to_return(u, p, t):
    [-u[0], -u[1]]


def test_an_f_that_forgets_to_return_is_told_so_on_both_paths():
    # The kernel said "returns rows of shape ()".
    prob = dxode.ODEProblem(_forgets_to_return, np.array([1.0, 2.0]), (0.0, 1.0))
    with pytest.raises(TypeError, match="did it forget to return"):
        dxode.solve(prob, "tsit5", saveat=[1.0])
    with pytest.raises(ValueError, match=r"returns no rows .*did it forget to return"):
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)


def _returns_a_number(u, p, t):
    return -p[0] * u[0]


def test_an_f_returning_a_number_for_one_component_is_refused_like_on_the_array_path():
    # The kernel failed to compile its own read of row 0 ("getitem(float64, Literal[int](0))"),
    # blaming f's code for a getitem f does not contain.
    prob = dxode.ODEProblem(_returns_a_number, np.array([1.0]), (0.0, 1.0), (2.0,))
    with pytest.raises(ValueError, match=r"returned shape \(\)"):
        dxode.solve(prob, "tsit5", saveat=[1.0])
    with pytest.raises(ValueError, match=r"returns a number, not rows.*\[du0\]") as info:
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    assert "test_kernel_ensemble.py" in str(info.value) and "state of 1" in str(info.value)


def _starred_rows(u, p, t):
    head = [-u[0]]
    return [*head, u[0] - u[1]]


def test_an_f_returning_a_starred_list_compiles_as_written():
    # Returned list literals become tuples for the kernels, and numba builds (*head, x) as
    # tuple(list), which it cannot type: an f numba compiles as written failed to compile.
    import numba

    from dxode.kernels.rhs_source import numba_ready

    rows = numba.njit(numba_ready(_starred_rows))((1.0, 0.5), None, 0.0)
    assert list(rows) == [-1.0, 0.5]


class _Decay:
    rate = 1.0

    def rhs(self, u, p, t):
        return [-self.rate * u[0]]


def _decay_at(u, p, t, rate=1.0):
    return [-rate * u[0]]


def _not_plain_functions():
    import functools

    import numba

    return {
        "method": (_Decay().rhs, "is a method"),
        "partial": (functools.partial(_decay_at, rate=2.0), "is a partial"),
        "njit": (numba.njit(lambda u, p, t: (-u[0],)), r"already compiled.*py_func"),
        "default": (_decay_at, r"does not take exactly \(u, p, t\)"),
    }


@pytest.mark.parametrize("kind", ["method", "partial", "njit", "default"])
def test_an_f_that_is_not_a_plain_function_is_refused_clearly(kind):
    # were numba's internal errors ("Signature mismatch", "not a function", AttributeError)
    f, reason = _not_plain_functions()[kind]
    prob = dxode.ODEProblem(f, np.array([1.0]), (0.0, 1.0))
    assert dxode.solve(prob, "tsit5", saveat=[1.0]).u[-1, 0] > 0  # the array path takes it
    with pytest.raises(KernelUnsupportedError, match=f"plain Python function.*{reason}") as info:
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    assert "EnsembleArray" in str(info.value)


def test_dense_output_is_refused_saying_what_to_use():
    eprob = dxode.EnsembleProblem(PROB, p=P)
    with pytest.raises(KernelUnsupportedError, match="dense") as info:
        dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), trajectories=2, dense=True)
    assert "EnsembleArray" in str(info.value)


def _chain(u, p, t):
    return np.concatenate((-u[:1], u[:-1] - u[1:]))


def test_a_state_too_large_for_the_generated_code_is_refused_naming_the_array_path():
    # 29 components, p and t: a call of 31 arguments, which Python makes a call with *args
    # and numba cannot inline (it raised numba's UnsupportedError from inside the kernel).
    prob = dxode.ODEProblem(_chain, np.ones(29), (0.0, 1.0))
    assert dxode.solve(prob, "tsit5", saveat=[1.0]).retcode == dxode.ReturnCode.Success
    for solve in (
        lambda: dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True),
        lambda: dxode.solve(
            dxode.EnsembleProblem(prob), "tsit5", dxode.EnsembleKernel(), trajectories=2
        ),
    ):
        with pytest.raises(KernelUnsupportedError, match="at most 28 components, u0 has 29"):
            solve()


def _decay(u, p, t):
    return -p * u


def test_an_f_using_a_1d_p_as_an_array_is_told_to_unpack_it():
    prob = dxode.ODEProblem(_decay, np.ones(2), (0.0, 1.0), np.array([1.0, 2.0]))
    assert dxode.solve(prob, "tsit5", saveat=[1.0]).retcode == dxode.ReturnCode.Success
    with pytest.raises(KernelCompileError, match=r"uses p as an array.*unpack it") as info:
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    assert re.search(r"test_kernel_ensemble\.py:\d+", str(info.value))
    assert "EnsembleArray" in str(info.value)


def _shifted_decay(u, p, t):
    return -p[0] * u + p[1]


def test_an_f_using_a_1d_leaf_of_p_as_an_array_is_told_to_index_it():
    # was numba's "No implementation of function neg(UniTuple(float64 x 2))" alone
    p = (np.array([1.0, 2.0]), np.array([0.5, 0.1]))
    prob = dxode.ODEProblem(_shifted_decay, np.ones(2), (0.0, 1.0), p)
    assert dxode.solve(prob, "tsit5", saveat=[1.0]).retcode == dxode.ReturnCode.Success
    with pytest.raises(
        KernelCompileError, match=r"uses p\[0\] as an array.*index it \(p\[0\]\[0\]\)"
    ):
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)


_RATES = {"k": 1.0}
_RATE_LIST = [1.0]


def _reads_a_dict(u, p, t):
    return [-_RATES["k"] * u[0]]


def _reads_a_list(u, p, t):
    return [-_RATE_LIST[0] * u[0]]


@pytest.mark.parametrize(("f", "kind"), [(_reads_a_dict, "dict"), (_reads_a_list, "list")])
def test_an_f_reading_an_untypeable_global_is_told_to_pass_it_in_p(f, kind):
    # was numba's "Untyped global name '_RATES'" alone, with no fix for it
    prob = dxode.ODEProblem(f, np.array([1.0]), (0.0, 1.0))
    name = "_RATES" if kind == "dict" else "_RATE_LIST"
    with pytest.raises(KernelCompileError, match=rf"f reads `{name}` \(a {kind}\).*pass .* in p"):
        dxode.solve(prob, "tsit5", kernel=True)


def _plain_helper(x):
    return 2.0 * x


def _calls_a_plain_helper(u, p, t):
    return [-_plain_helper(u[0])]


def test_an_f_calling_a_plain_python_helper_is_told_to_njit_it():
    # was told to "pass the values f needs in p", which a function cannot be
    prob = dxode.ODEProblem(_calls_a_plain_helper, np.array([1.0]), (0.0, 1.0))
    with pytest.raises(KernelCompileError, match=r"`_plain_helper` \(a function\).*@numba\.njit"):
        dxode.solve(prob, "tsit5", kernel=True)


def _doubled(g):
    import functools

    import numba

    inner = numba.njit(g)

    @functools.wraps(g)
    def wrapper(u, p, t):
        du = inner(u, p, t)
        return [2.0 * du[0]]

    return wrapper


@_doubled
def _doubled_decay(u, p, t):
    return [-u[0]]


def test_an_f_wrapped_with_functools_wraps_compiles_the_wrapper():
    # inspect.getsource follows __wrapped__: the kernel compiled the undecorated _doubled_decay
    # and returned exp(-1) where f is the wrapper, u' = -2u (a silent wrong answer).
    prob = dxode.ODEProblem(_doubled_decay, np.array([1.0]), (0.0, 1.0))
    sol = dxode.solve(prob, "tsit5", saveat=[1.0], rtol=1e-10, atol=1e-12, kernel=True)
    np.testing.assert_allclose(sol.u[-1, 0], np.exp(-2.0), rtol=1e-8)


def _star_unpacks_p(u, p, t):
    k, *rest = p
    return [-k * u[0] - rest[0]]


def test_an_f_with_starred_unpacking_gets_a_kernel_compile_error():
    # numba's UnsupportedBytecodeError is no NumbaError: it escaped the probe's handler as
    # numba's own exception, without f's location or the fix
    prob = dxode.ODEProblem(_star_unpacks_p, np.array([1.0]), (0.0, 1.0), (1.0, 0.0))
    assert dxode.solve(prob, "tsit5", saveat=[1.0]).retcode == dxode.ReturnCode.Success
    with pytest.raises(KernelCompileError, match=r"starred name.*name every item") as info:
        dxode.solve(prob, "tsit5", kernel=True)
    assert re.search(r"test_kernel_ensemble\.py:\d+", str(info.value))


def _reads_past_the_state(u, p, t):
    return [u[1], -u[9]]


def test_an_f_reading_past_the_end_of_u_is_refused():
    # u[9] of 2 components does not compile with u a tuple, and with u an array the kernel
    # read past its end unchecked: it returned Success and numbers from beyond the state,
    # where the array path raises an IndexError
    prob = dxode.ODEProblem(_reads_past_the_state, np.array([1.0, 0.0]), (0.0, 1.0))
    with pytest.raises(IndexError):
        dxode.solve(prob, "tsit5")
    with pytest.raises(KernelCompileError, match=r"test_kernel_ensemble\.py:\d+ indexes u"):
        dxode.solve(prob, "tsit5", kernel=True)


def _indexes_with_p(u, p, t):
    return [-u[p[0]], u[0] - u[1]]


def _indexes_with_int_of_p(u, p, t):
    return [-u[int(p[0])], u[0] - u[1]]


def test_an_f_indexing_with_an_integer_parameter_is_told_to_convert_it():
    # was numba's "getitem(UniTuple(float64 x 2), float64)" alone: the kernels pass an
    # integer p[0] as a float, which f's author never wrote
    prob = dxode.ODEProblem(_indexes_with_p, np.array([1.0, 0.5]), (0.0, 1.0), (0, 2.5))
    array = dxode.solve(prob, "tsit5", saveat=[1.0])
    with pytest.raises(KernelCompileError, match=r"indexes u or p with a float.*int\(p\[0\]\)"):
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    fixed = dxode.solve(prob.remake(f=_indexes_with_int_of_p), "tsit5", saveat=[1.0], kernel=True)
    np.testing.assert_allclose(fixed.u, array.u, rtol=1e-12)


@pytest.mark.parametrize("ensemble", [dxode.EnsembleKernel(), dxode.EnsembleArray()])
def test_an_empty_per_trajectory_tspan_is_refused_as_empty(ensemble):
    # was "all trajectories of an ensemble must integrate in the same time direction"
    spans = np.array([[0.0, 1.0], [0.5, 0.5], [0.0, 2.0]])
    eprob = dxode.EnsembleProblem(PROB, tspan=spans)
    with pytest.raises(ValueError, match=r"tspan of trajectory 1 is empty: t0 == t1 == 0\.5"):
        dxode.solve(eprob, "tsit5", ensemble, saveat=None)


_Rates = collections.namedtuple("_Rates", ["k", "c"])


def _reads_a_field(u, p, t):
    return [-p.k * u[0] + 0.0 * p.c]


def test_an_f_reading_a_namedtuple_field_of_p_is_told_to_index_it():
    # was numba's "Unknown attribute 'k' of type UniTuple(float64 x 2)" alone: the kernels
    # pass p as a plain tuple, which the user never wrote
    prob = dxode.ODEProblem(_reads_a_field, np.array([1.0]), (0.0, 1.0), _Rates(2.0, 1.0))
    assert dxode.solve(prob, "tsit5", saveat=[1.0]).retcode == dxode.ReturnCode.Success
    fix = r"p\.k of a namedtuple.*plain tuples.*p\[0\]"
    with pytest.raises(KernelCompileError, match=fix) as info:
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    assert "EnsembleArray" in str(info.value)


def _complex_rows(u, p, t):
    return [u[0] * 1j]


def test_an_f_returning_complex_rows_is_told_to_keep_them_real():
    # was numba's "Cannot cast complex128 to float64" alone
    prob = dxode.ODEProblem(_complex_rows, np.array([1.0]), (0.0, 1.0))
    with pytest.raises(KernelCompileError, match=r"f returns complex numbers .* keep du/dt real"):
        dxode.solve(prob, "tsit5", kernel=True)


@pytest.mark.parametrize("ensemble", [False, True])
def test_a_fit_closing_over_its_traced_parameter_is_told_to_pass_it_in_p(ensemble):
    autograd = pytest.importorskip("autograd")

    def loss(theta):
        prob = dxode.ODEProblem(lambda u, p, t: [-theta[0] * u[0]], [1.0], (0.0, 1.0))
        if ensemble:
            eprob = dxode.EnsembleProblem(prob)
            return dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), trajectories=2).u.sum()
        return dxode.solve(prob, "tsit5", kernel=True, saveat=[1.0]).u.sum()

    # was numba's "Untyped global name 'theta': ... ArrayBox"
    with pytest.raises(KernelCompileError, match=r"reads `theta`.*differentiating.*p=theta"):
        autograd.grad(loss)(np.array([1.0]))


def test_dict_parameters_are_refused_clearly():
    prob = PROB.remake(p={"sigma": 10.0})
    with pytest.raises(KernelUnsupportedError, match="dict"):
        dxode.solve(prob, "tsit5", kernel=True)


def _decay_ignoring_p(u, p, t):
    return [-u[0]]


def test_empty_parameters():
    # An empty tuple failed with NumPy's "need at least one array to concatenate"; an empty
    # array leaf was laid out as a number.
    prob = dxode.ODEProblem(_decay_ignoring_p, np.array([1.0]), (0.0, 1.0), ())
    sol = dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
    np.testing.assert_allclose(sol.u[-1], np.exp(-1.0), rtol=1e-5)
    with pytest.raises(KernelUnsupportedError, match=r"no empty parameter arrays .*\(0,\)"):
        dxode.solve(prob.remake(p=(1.0, np.zeros(0))), "tsit5", kernel=True)


def test_continuous_adjoints_are_refused_clearly():
    # The kernels differentiate with forward sensitivities or the discrete adjoint
    # (test_kernel_gradients.py, test_kernel_adjoint.py).
    from autograd import grad

    def loss(p):
        eprob = dxode.EnsembleProblem(PROB.remake(p=p))
        alg = dxode.EnsembleKernel()
        sensealg = dxode.InterpolatingAdjoint()
        sim = dxode.solve(eprob, "tsit5", alg, trajectories=2, saveat=1.0, sensealg=sensealg)
        return sim.u[0, -1, 0]

    with pytest.raises(KernelUnsupportedError, match="ForwardSensitivity"):
        grad(loss)(np.array([10.0, 28.0, 8 / 3]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="device"):
        dxode.EnsembleKernel(device="gpu")
    with pytest.raises(ValueError, match="block_size"):
        dxode.EnsembleKernel(block_size=0)
    assert dxode.EnsembleKernel(block_size=np.int64(8), threads=np.int32(1)).threads == 1


def test_more_threads_than_numba_has_are_refused_before_compiling(monkeypatch):
    # numba said "The number of threads must be between 1 and 2", after compiling.
    import numba

    most = numba.config.NUMBA_NUM_THREADS
    monkeypatch.setattr(KernelBatch, "prepare", lambda *args: pytest.fail("compiled"))
    alg = dxode.EnsembleKernel(threads=most + 1)
    with pytest.raises(ValueError, match=rf"threads={most + 1}\) asks for more .* <= {most}"):
        dxode.solve(dxode.EnsembleProblem(PROB, p=P), "tsit5", alg, saveat=[1.0])
    with pytest.raises(TypeError, match="EnsembleKernel"):
        dxode.solve(dxode.EnsembleProblem(PROB), kernel=True, trajectories=2)
    with pytest.raises(TypeError, match="kernel must be True or False, got 'no'"):
        dxode.solve(PROB, "tsit5", kernel="no")


def test_cuda_without_a_gpu_says_so_before_compiling(monkeypatch):
    # It used to compile, then fail inside numba with CudaSupportError ("CUDA driver library
    # cannot be found").
    cuda = pytest.importorskip("numba.cuda")
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    monkeypatch.setattr(KernelBatch, "prepare", lambda *args: pytest.fail("compiled"))
    eprob = dxode.EnsembleProblem(PROB, p=P)
    with pytest.raises(ValueError, match="found no usable CUDA GPU") as info:
        dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(device="cuda"), trajectories=2)
    assert 'device="cpu"' in str(info.value) and "NUMBA_ENABLE_CUDASIM=1" in str(info.value)


@pytest.mark.skipif(
    __import__("platform").machine() not in ("x86_64", "AMD64"), reason="x86 assembly"
)
def test_the_lane_loop_is_vectorized(tmp_path, monkeypatch):
    def lorenz_copy(u, p, t):  # its own kernel, compiled here (not loaded from numba's cache)
        x, y, z = u
        sigma, rho, beta = p
        return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]

    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))
    eprob = dxode.EnsembleProblem(PROB.remake(f=lorenz_copy), p=P)
    dxode.solve(eprob, "tsit5", dxode.EnsembleKernel(), **OPTS)
    from dxode.kernels import compiler

    (kernel,) = [k for k in compiler._COMPILED.values() if k.f is lorenz_copy]
    attempt = kernel.module.attempt
    asm = attempt.inspect_asm(attempt.signatures[0])
    packed = sum(asm.count(op) for op in ("mulpd", "addpd", "subpd"))
    assert packed >= 50, "the trial step's lane loop was not vectorized"


def _final_state(f, n=1):
    """u(1) of u' = f(u, p, t), u(0) = 1 (``n`` components), through the kernel (compiled, or
    from the cache)."""
    prob = dxode.ODEProblem(f, np.ones(n), (0.0, 1.0))
    return dxode.solve(prob, "tsit5", kernel=True, saveat=[1.0], rtol=1e-10, atol=1e-12).u[-1]


DECAY_RATE = 0.5
DECAY_WEIGHTS = np.array([1.0, 2.0])


def _decay_with_module_constants(u, p, t):
    return [-DECAY_RATE * DECAY_WEIGHTS[0] * u[0], -DECAY_RATE * DECAY_WEIGHTS[1] * u[1]]


def test_changed_module_constants_compile_a_new_kernel(monkeypatch, tmp_path):
    # numba freezes the module-level values f reads into the machine code: a kernel reused
    # after they change would silently solve the old problem.
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))

    def final_state():
        return _final_state(_decay_with_module_constants, n=2)

    np.testing.assert_allclose(final_state(), np.exp([-0.5, -1.0]), rtol=1e-8)
    monkeypatch.setattr(__import__(__name__), "DECAY_RATE", 1.0)
    np.testing.assert_allclose(final_state(), np.exp([-1.0, -2.0]), rtol=1e-8)
    DECAY_WEIGHTS[1] = 3.0  # changed in place
    try:
        np.testing.assert_allclose(final_state(), np.exp([-1.0, -3.0]), rtol=1e-8)
    finally:
        DECAY_WEIGHTS[1] = 2.0


def _rate_half(x):
    return 0.5 * x


def _rate_one(x):
    return RATE_SCALE * x


RATE_SCALE = 1.0
RATE = None  # set by the test to a numba.njit helper


def _decay_with_a_helper(u, p, t):
    return [-RATE(u[0])]


def test_a_changed_numba_helper_compiles_a_new_kernel(monkeypatch, tmp_path):
    # f calls a numba.njit helper it reads from its module: numba compiles the helper's code
    # and the values it reads into the kernel, so a redefined helper (a notebook cell run
    # again, another run of a script) must not reuse the kernel compiled with the old one
    # (it did: the helper's fingerprint was its type's name, and the old decay came back).
    numba = pytest.importorskip("numba")
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))
    module = __import__(__name__)

    def final_state():
        return _final_state(_decay_with_a_helper)

    monkeypatch.setattr(module, "RATE", numba.njit(_rate_half))
    np.testing.assert_allclose(final_state(), np.exp([-0.5]), rtol=1e-8)
    monkeypatch.setattr(module, "RATE", numba.njit(_rate_one))
    np.testing.assert_allclose(final_state(), np.exp([-1.0]), rtol=1e-8)
    monkeypatch.setattr(module, "RATE_SCALE", 2.0)  # a value the helper reads
    monkeypatch.setattr(module, "RATE", numba.njit(_rate_one))
    np.testing.assert_allclose(final_state(), np.exp([-2.0]), rtol=1e-8)


def test_two_lambdas_on_one_line_get_kernels_of_their_own(monkeypatch, tmp_path):
    # the key was the source line, where both are defined: the second solve reused the
    # first's kernel and returned exp(-1) for u' = u
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))
    decay, growth = lambda u, p, t: [-u[0]], lambda u, p, t: [u[0]]
    for f, rate in ((decay, -1.0), (growth, 1.0)):
        np.testing.assert_allclose(_final_state(f), np.exp([rate]), rtol=1e-8)


DECAY_TABLE = (np.ones(2000), 0.5)  # a tuple holding a long array


def _decay_with_a_table(u, p, t):
    return [-DECAY_TABLE[0][1000] * DECAY_TABLE[1] * u[0]]


def test_an_array_changed_inside_a_global_tuple_compiles_a_new_kernel(monkeypatch, tmp_path):
    # a tuple was fingerprinted by its repr, which elides the middle of an array of more
    # than 1000 numbers: the kernel with the old value was reused
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))
    np.testing.assert_allclose(_final_state(_decay_with_a_table), np.exp([-0.5]), rtol=1e-8)
    DECAY_TABLE[0][1000] = 4.0  # changed in place
    try:
        np.testing.assert_allclose(_final_state(_decay_with_a_table), np.exp([-2.0]), rtol=1e-8)
    finally:
        DECAY_TABLE[0][1000] = 1.0


SETTINGS = types.ModuleType("settings")  # a module of constants, as `import settings`
SETTINGS.RATE = 0.5


def _decay_with_a_module_attribute(u, p, t):
    return [-SETTINGS.RATE * u[0]]


def test_a_changed_attribute_of_a_module_compiles_a_new_kernel(monkeypatch, tmp_path):
    # f reads settings.RATE: numba freezes the attribute's value as it freezes a global's,
    # and the kernel compiled with the old value was reused (the module's fingerprint was
    # its name alone)
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))
    f = _decay_with_a_module_attribute
    np.testing.assert_allclose(_final_state(f), np.exp([-0.5]), rtol=1e-8)
    monkeypatch.setattr(SETTINGS, "RATE", 2.0)
    np.testing.assert_allclose(_final_state(f), np.exp([-2.0]), rtol=1e-8)


def test_an_f_pickled_by_value_keeps_its_kernel_key_and_tuple_returns():
    # Dask sends an f defined in a script's __main__ or a notebook by value: cloudpickle's
    # copy has no source (co_filename "<dynamic-code>"). Its key held repr(code), with the
    # object's address, so every task compiled the kernel again (4.5 s each), and without
    # the source its list return stayed a heap list (a 13x slower kernel on the workers).
    cloudpickle = pytest.importorskip("cloudpickle", reason="needs dxode[dask]")
    from dxode.kernels.rhs_source import function_key, numba_ready, where_defined

    def lorenz(u, p, t):  # local: cloudpickle copies it by value
        x, y, z = u
        s, r, b = p
        return [s * (y - x), x * (r - z) - y, x * y - b * z]

    first, second = (cloudpickle.loads(cloudpickle.dumps(lorenz)) for _ in range(2))
    assert where_defined(first).startswith("<dynamic-code>")
    assert function_key(first) == function_key(second)
    p = (10.0, 28.0, 8 / 3)
    ready = numba_ready(first)
    assert ready((1.0, 2.0, 3.0), p, 0.0) == tuple(lorenz((1.0, 2.0, 3.0), p, 0.0))
    ens = dxode.EnsembleProblem(
        dxode.ODEProblem(first, [1.0, 0.0, 0.0], (0.0, 1.0), p), p=np.array([p, p])
    )
    sim = dxode.solve(ens, "tsit5", dxode.EnsembleKernel(threads=1), saveat=[1.0])
    plain = dxode.EnsembleProblem(
        dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), p), p=np.array([p, p])
    )
    expected = dxode.solve(plain, "tsit5", dxode.EnsembleKernel(threads=1), saveat=[1.0])
    np.testing.assert_array_equal(sim.u, expected.u)


@pytest.mark.parametrize(
    ("p", "dtype", "limit"),
    [
        ((2**53 + 1,), np.float64, 53),
        ((1.0, np.array([3, -(2**60)])), np.float64, 53),
        ((2**24 + 1,), np.float32, 24),
    ],
    ids=["python-int", "int64-array", "float32-state"],
)
def test_an_integer_parameter_the_kernels_would_round_is_refused(p, dtype, limit):
    """The kernels pass p's numbers as floats of the rows' dtype: an integer beyond what it
    holds exactly reached f as a neighbouring integer, silently (the array path passes p
    as given)."""
    prob = dxode.ODEProblem(_decay, np.ones(1, dtype=dtype), (0.0, 1.0), p)
    with pytest.raises(KernelUnsupportedError, match=rf"p\[\d\] holds the integer .*2\^{limit}"):
        dxode.solve(prob, "tsit5", saveat=[1.0], kernel=True)
