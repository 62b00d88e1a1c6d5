"""Ensembles: every way of building trajectories, every algorithm, and per-lane independence."""

from __future__ import annotations

import math
import pickle
import tracemalloc

import numpy as np
import pytest

import dxode
from dxode import EnsembleArray, EnsembleProblem, EnsembleSerial, ReturnCode

from conftest import to_numpy

P0 = (10.0, 28.0, 8.0 / 3.0)


def lorenz(u, p, t):
    # Indexing rather than unpacking: array_api_strict forbids iterating 2-D arrays.
    sigma, rho, beta = (p[i, ...] if hasattr(p, "shape") else p[i] for i in range(3))
    x, y, z = u[0, ...], u[1, ...], u[2, ...]
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def _prob(xp=np, dtype="float64", tspan=(0.0, 3.0)):
    return dxode.ODEProblem(
        lorenz, xp.asarray([1.0, 0.0, 0.0], dtype=getattr(xp, dtype)), tspan, P0
    )


def _scaled_params(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.array(P0) * (1 + 0.1 * (rng.random((n, 3)) - 0.5))


def classic_prob_func(prob, i, repeat):
    return prob.remake(p=tuple(_scaled_params(i + 1)[i]))


def context_prob_func(prob, ctx):
    return prob.remake(p=tuple(np.array(P0) * (1 + 0.1 * (ctx.rng.random(3) - 0.5))))


SOLVE = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}


def test_array_batches_equal_serial_solves_bitwise(xp):
    # Three batches, the last one short: 5 + 5 + 2.
    eprob = EnsembleProblem(_prob(xp), p=xp.asarray(_scaled_params(12)))
    array = dxode.solve(
        eprob, dxode.Tsit5(), EnsembleArray(), trajectories=12, batch_size=5, **SOLVE
    )
    serial = dxode.solve(eprob, dxode.Tsit5(), EnsembleSerial(), trajectories=12, **SOLVE)
    np.testing.assert_array_equal(to_numpy(array.u), to_numpy(serial.u))
    np.testing.assert_array_equal(array.stats.nf, serial.stats.nf)
    assert len(set(array.stats.nf.tolist())) > 1  # the lanes took their own steps
    assert array.u.shape == (12, 4, 3)
    np.testing.assert_allclose(to_numpy(array.t), [0, 1, 2, 3])


def test_serial_equals_array_bitwise_only_where_f_rounds_alike_on_a_scalar():
    # The ensembles guide's caveat: EnsembleSerial evaluates f on one state, where u[0] is a
    # NumPy scalar and u[0]**2 calls pow (an array squares): the same steps, not the same bits.
    def vdp(square):
        def f(u, p, t):
            x2 = u[0] ** 2 if square else u[0] * u[0]
            return [u[1], p[0] * (1 - x2) * u[1] - u[0]]

        return f

    mus = np.linspace(0.5, 50.0, 9)[:, None]
    kwargs = {"trajectories": 9, "saveat": [5.0, 20.0], "rtol": 1e-6, "atol": 1e-8}
    for square in (False, True):
        eprob = EnsembleProblem(
            dxode.ODEProblem(vdp(square), [2.0, 0.0], (0.0, 20.0), [1.0]), p=mus
        )
        array = dxode.solve(eprob, dxode.Tsit5(), EnsembleArray(), batch_size=4, **kwargs)
        serial = dxode.solve(eprob, dxode.Tsit5(), EnsembleSerial(), **kwargs)
        np.testing.assert_array_equal(serial.stats.naccept, array.stats.naccept)
        if square:
            np.testing.assert_allclose(serial.u, array.u, rtol=1e-12, atol=1e-13)
        else:
            np.testing.assert_array_equal(serial.u, array.u)


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_results_do_not_depend_on_batch_size(batch_size):
    eprob = EnsembleProblem(_prob(), prob_func=context_prob_func)
    reference = dxode.solve(eprob, trajectories=40, batch_size=40, seed=11, **SOLVE)
    other = dxode.solve(eprob, trajectories=40, batch_size=batch_size, seed=11, **SOLVE)
    np.testing.assert_array_equal(other.u, reference.u)
    assert other.seed == 11


def test_the_three_construction_paths_agree():
    params = _scaled_params(12)
    by_array = dxode.solve(EnsembleProblem(_prob(), p=params), trajectories=12, **SOLVE)
    by_classic = dxode.solve(
        EnsembleProblem(_prob(), prob_func=lambda prob, i, repeat: prob.remake(p=tuple(params[i]))),
        trajectories=12,
        **SOLVE,
    )
    by_batch = dxode.solve(
        EnsembleProblem(_prob(), batch_func=lambda prob, ctx: {"p": params[ctx.indices]}),
        trajectories=12,
        batch_size=5,
        **SOLVE,
    )
    np.testing.assert_array_equal(by_classic.u, by_array.u)
    np.testing.assert_array_equal(by_batch.u, by_array.u)


def test_prob_func_remake_gives_the_bits_of_per_trajectory_arrays(xp, dtype_name):
    params = xp.asarray(_scaled_params(12))  # float64, cast to the state's dtype per lane
    starts = xp.asarray(np.linspace(0.5, 1.5, 36).reshape(12, 3), dtype=getattr(xp, dtype_name))
    prob = _prob(xp, dtype_name).remake(p=xp.asarray(P0))
    by_arrays = dxode.solve(EnsembleProblem(prob, u0=starts, p=params), trajectories=12, **SOLVE)
    by_remake = dxode.solve(
        EnsembleProblem(
            prob,
            prob_func=lambda prob, i, repeat: prob.remake(u0=starts[i, ...], p=params[i, ...]),
        ),
        trajectories=12,
        batch_size=5,
        **SOLVE,
    )
    np.testing.assert_array_equal(to_numpy(by_remake.u), to_numpy(by_arrays.u))
    np.testing.assert_array_equal(by_remake.stats.nf, by_arrays.stats.nf)
    assert by_remake.u.dtype == by_arrays.u.dtype


def _in_place_prob_func(starts, rhos):
    """A prob_func in DifferentialEquations.jl style: changes prob in place, returns it."""

    def prob_func(prob, i, repeat):
        prob.u0[...] = starts[i, ...]
        prob.p[1] = rhos[i]
        return prob

    return prob_func


@pytest.mark.parametrize("alg", [EnsembleArray(), EnsembleSerial()], ids=["array", "serial"])
def test_prob_func_changing_prob_in_place_gives_each_trajectory_its_values(xp, alg):
    # Every trajectory got the values of the last prob_func call of its batch: all returned
    # the one problem, and the batch was built from them after the calls.
    starts = xp.asarray(np.linspace(0.5, 1.5, 18).reshape(6, 3))
    rhos = xp.asarray(28.0 + np.linspace(-2.0, 2.0, 6))
    params = xp.stack([xp.full(6, P0[0]), rhos, xp.full(6, P0[2])], axis=1)
    expected = dxode.solve(EnsembleProblem(_prob(xp), u0=starts, p=params), "tsit5", alg, **SOLVE)
    prob = _prob(xp).remake(p=xp.asarray(P0))
    eprob = EnsembleProblem(prob, prob_func=_in_place_prob_func(starts, rhos))
    sim = dxode.solve(eprob, "tsit5", alg, trajectories=6, batch_size=4, **SOLVE)
    np.testing.assert_array_equal(to_numpy(sim.u), to_numpy(expected.u))


def test_a_leaf_prob_func_leaves_alone_stays_shared_when_another_changes_in_place():
    shapes = []

    def f(u, p, t):
        shapes.append((tuple(p["w"].shape), tuple(p["k"].shape)))
        return -p["k"][0] * p["w"][0] * u

    def prob_func(prob, i, repeat):
        prob.p["k"][0] = 1.0 + i  # the leaf changed in place
        if i == 3:
            prob.p["k"] = np.array([10.0])  # and the dict entry rebound
        return prob

    prob = dxode.ODEProblem(f, [1.0], (0.0, 1.0), {"w": np.ones(3), "k": np.array([1.0])})
    sim = dxode.solve(
        EnsembleProblem(prob, prob_func=prob_func),
        trajectories=6,
        batch_size=4,
        saveat=[1.0],
        rtol=1e-8,
        atol=1e-12,
    )
    rates = np.array([1.0, 2.0, 3.0, 10.0, 10.0, 10.0])  # prob.p["k"] is the new array from 3
    rates[4:] = [5.0, 6.0]
    np.testing.assert_allclose(sim.u[:, 0, 0], np.exp(-rates), rtol=1e-5)
    # w, the same unchanged array in every trajectory, is passed to f as it is (not a column)
    assert {w for w, _ in shapes} == {(3,)}
    assert {len(k) for _, k in shapes} == {2}  # k, which changes, is a column of lanes


@pytest.mark.parametrize(
    "values",
    [
        [np.array([1.5, 2.0], dtype=np.float32), np.array([0.1, 3.0], dtype=np.float32)],
        [np.float64(0.1), np.float64(0.2)],
        [0.1, 0.2, 1e-3],
        [1, 2, 3],
        [True, False],
        [np.array([1, 2], dtype=np.int32), np.array([3, 4], dtype=np.int32)],
        [1, 2.5],  # mixed: converted one by one
        [np.array([1.0]), np.array([2.0], dtype=np.float32)],
    ],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_parameter_column_is_converted_as_each_value_alone(values, dtype):
    from dxode.backends import get_backend
    from dxode.ensemble.batch import _as_lane_param, _lane_column

    backend = get_backend("numpy")
    column = _lane_column(values, backend, dtype)
    one_by_one = np.stack([_as_lane_param(v, backend, dtype) for v in values], axis=-1)
    assert column.dtype == one_by_one.dtype and column.flags.c_contiguous
    np.testing.assert_array_equal(column, one_by_one)


def test_context_rng_depends_only_on_seed_and_index():
    seen = {}

    def prob_func(prob, ctx):
        seen.setdefault(ctx.index, []).append(ctx.rng.random())
        return prob

    eprob = EnsembleProblem(_prob(), prob_func=prob_func)
    dxode.solve(eprob, EnsembleSerial(), trajectories=5, seed=3, saveat=[3.0])
    dxode.solve(eprob, trajectories=5, batch_size=2, seed=3, saveat=[3.0])
    assert all(len(v) == 2 and v[0] == v[1] for v in seen.values())
    assert len({v[0] for v in seen.values()}) == 5


def test_batch_context_uniforms_are_batch_independent():
    draws = {}

    def batch_func(prob, ctx):
        u = ctx.uniform(3)
        for i, row in zip(ctx.indices, u, strict=True):
            draws.setdefault(int(i), []).append(row)
        return {"p": np.array(P0) * (1 + 0.1 * (u - 0.5))}

    eprob = EnsembleProblem(_prob(), batch_func=batch_func)
    a = dxode.solve(eprob, trajectories=9, batch_size=9, seed=5, **SOLVE)
    b = dxode.solve(eprob, trajectories=9, batch_size=4, seed=5, **SOLVE)
    np.testing.assert_array_equal(a.u, b.u)
    assert all(np.array_equal(*rows) for rows in draws.values())


def test_output_func_with_reruns():
    attempts = []

    def prob_func(prob, ctx):
        attempts.append((ctx.index, ctx.repeat))
        return prob.remake(u0=[1.0 + ctx.repeat, 0.0, 0.0])

    def output_func(sol, i):
        first_x = float(sol.u[0, 0])
        return first_x, (i % 2 == 0 and first_x < 2.0)  # rerun even trajectories once

    eprob = EnsembleProblem(_prob(), prob_func=prob_func, output_func=output_func)
    sim = dxode.solve(eprob, trajectories=6, batch_size=4, **SOLVE)
    assert sim.u.tolist() == [2.0, 1.0, 2.0, 1.0, 2.0, 1.0]
    assert sorted(a for a in attempts if a[1] == 1) == [(0, 1), (2, 1), (4, 1)]


def _longer_on_rerun(prob, i, repeat):
    return prob.remake(tspan=(0.0, 1.0 + repeat), p=(10.0, 28.0 + i, 8.0 / 3.0))


def _rerun_even_once(sol, i):
    return float(sol.u[-1, 0]), (i % 2 == 0 and sol.prob.tspan[1] < 2.0)


@pytest.mark.parametrize("batch_size", [1, 2, 5])
@pytest.mark.parametrize("alg", [EnsembleArray(), EnsembleSerial()], ids=["array", "serial"])
def test_a_rerun_keeps_its_last_attempts_save_times_and_stats(alg, batch_size):
    # Reruns solve the even trajectories over (0, 2): sim.t, the return codes and the
    # statistics are those of that last attempt (sim.t kept the first attempt's (0, 1)).
    eprob = EnsembleProblem(_prob(), prob_func=_longer_on_rerun, output_func=_rerun_even_once)
    sim = dxode.solve(eprob, alg, trajectories=5, batch_size=batch_size, rtol=1e-6, atol=1e-6)
    last = [
        dxode.solve(_longer_on_rerun(_prob(), i, i % 2 == 0), saveat=None, rtol=1e-6, atol=1e-6)
        for i in range(5)
    ]
    np.testing.assert_array_equal(sim.t, [[0.0, 1.0 + (i % 2 == 0)] for i in range(5)])
    np.testing.assert_allclose(sim.u, [sol.u[-1, 0] for sol in last], rtol=1e-12)
    np.testing.assert_array_equal(sim.stats.naccept, [sol.stats.naccept for sol in last])


def test_reruns_that_all_end_at_one_time_share_their_save_times():
    def always_once(sol, i):
        return float(sol.u[-1, 0]), sol.prob.tspan[1] < 2.0

    eprob = EnsembleProblem(_prob(), prob_func=_longer_on_rerun, output_func=always_once)
    sim = dxode.solve(eprob, trajectories=4, batch_size=3)
    np.testing.assert_array_equal(sim.t, [0.0, 2.0])  # shaped by the times, not the batches


def _final_state(sol, i):
    return sol.u[-1, ...], False


def _stacked_rows(acc, values, indices):
    assert values.shape == (len(indices), 3)  # one array, not a list of them
    return acc + len(indices), False


@pytest.mark.parametrize("batch_size", [1, 3])
def test_output_func_arrays_are_stacked_on_every_backend(xp, batch_size):
    # Only NumPy values were stacked: array_api_strict (and CuPy) gave a list of N arrays.
    prob = _prob(xp)
    values = dxode.solve(
        EnsembleProblem(prob, output_func=_final_state),
        trajectories=4,
        batch_size=batch_size,
        **SOLVE,
    )
    states = dxode.solve(EnsembleProblem(prob), trajectories=4, **SOLVE)
    assert values.u.shape == (4, 3)
    np.testing.assert_array_equal(to_numpy(values.u), to_numpy(states.u)[:, -1, :])
    eprob = EnsembleProblem(prob, output_func=_final_state, reduction=_stacked_rows, u_init=0)
    reduced = dxode.solve(eprob, trajectories=4, batch_size=batch_size, **SOLVE)
    assert reduced.u == 4


def test_reduction_stops_early_once_converged():
    calls = []

    def reduction(acc, values, indices):
        calls.append(indices.tolist())
        total, count = acc
        total = total + values[:, -1, 0].sum()
        return (total, count + len(indices)), count + len(indices) >= 20

    eprob = EnsembleProblem(_prob(), p=_scaled_params(100), reduction=reduction, u_init=(0.0, 0))
    sim = dxode.solve(eprob, trajectories=100, batch_size=8, **SOLVE)
    assert len(calls) == 3 and sim.converged is True
    assert sim.u[1] == 24 and len(sim) == 24
    full = dxode.solve(EnsembleProblem(_prob(), p=_scaled_params(100)), trajectories=24, **SOLVE)
    assert sim.u[0] == pytest.approx(float(full.u[:, -1, 0].sum()), rel=1e-12)


def test_a_reduction_keeps_only_counts_and_totals():
    def final_sum(acc, u, indices):
        return acc + float(u[:, -1, 0].sum()), False

    kept = dxode.solve(
        EnsembleProblem(_prob(), p=_scaled_params(30)), trajectories=30, batch_size=7, **SOLVE
    )
    eprob = EnsembleProblem(_prob(), p=_scaled_params(30), reduction=final_sum, u_init=0.0)
    reduced = dxode.solve(eprob, trajectories=30, batch_size=7, **SOLVE)
    assert reduced.u == pytest.approx(float(kept.u[:, -1, 0].sum()), rel=1e-12)
    assert reduced.retcodes is None and reduced.stats.nf is None and reduced.events is None
    assert len(reduced) == 30 and reduced.success and reduced.converged is False
    assert reduced.stats.total_nf == kept.stats.total_nf
    assert reduced.stats.total_steps == kept.stats.total_steps
    np.testing.assert_array_equal(reduced.t, kept.t)
    with pytest.raises(TypeError, match="this ensemble was reduced"):
        reduced[0]


def _final_sum(acc, u, indices):
    return acc + float(u[:, -1, 0].sum()), False


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_a_reduction_of_trajectories_with_their_own_save_times_keeps_no_times(batch_size):
    # sim.t was trajectory 0's (0, 1) as if every trajectory had saved then, not at its end.
    spans = np.column_stack([np.zeros(4), [1.0, 2.0, 3.0, 4.0]])
    eprob = EnsembleProblem(_prob(), tspan=spans, reduction=_final_sum, u_init=0.0)
    reduced = dxode.solve(eprob, trajectories=4, batch_size=batch_size, rtol=1e-6, atol=1e-6)
    kept = dxode.solve(EnsembleProblem(_prob(), tspan=spans), trajectories=4, rtol=1e-6, atol=1e-6)
    assert reduced.t is None and len(reduced) == 4
    assert reduced.u == pytest.approx(float(kept.u[:, -1, 0].sum()), rel=1e-12)


def test_a_reduction_holds_driver_memory_flat_in_the_number_of_trajectories():
    def count(acc, u, indices):
        return acc + len(indices), False

    prob = dxode.ODEProblem(lambda u, p, t: -u, [1.0], (0.0, 0.1))
    eprob = EnsembleProblem(prob, reduction=count, u_init=0)
    dxode.solve(eprob, trajectories=2_000, batch_size=2_000)  # first-call caches
    peaks = {}
    for n in (20_000, 100_000):
        tracemalloc.start()
        try:
            sim = dxode.solve(eprob, trajectories=n, batch_size=2_000)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert sim.u == n and len(sim) == n and sim.success
    # Per-trajectory records (return codes, statistics, indices: ~55 B each) would add 4 MiB.
    assert peaks[100_000] - peaks[20_000] < 256 * 1024, peaks


def test_per_trajectory_tspan():
    spans = np.array([[0.0, 1.0], [0.0, 2.5], [0.0, 0.5]])
    eprob = EnsembleProblem(_prob(), tspan=spans)
    sim = dxode.solve(eprob, trajectories=3, rtol=1e-8, atol=1e-8)
    np.testing.assert_array_equal(sim.t, spans)
    for i in range(3):
        alone = dxode.solve(
            _prob(tspan=tuple(spans[i])), saveat=list(spans[i]), rtol=1e-8, atol=1e-8
        )
        np.testing.assert_array_equal(sim.u[i], alone.u)
    shared = dxode.solve(eprob, trajectories=3, saveat=[0.25, 0.5], rtol=1e-8, atol=1e-8)
    assert shared.u.shape == (3, 2, 3)
    with pytest.raises(
        ValueError, match=r"time 0.75 is outside the tspan \(0.0, 0.5\) of trajectory 2"
    ):
        dxode.solve(eprob, trajectories=3, saveat=[0.25, 0.75])
    with pytest.raises(ValueError, match="interval needs one shared tspan"):
        dxode.solve(eprob, trajectories=3, saveat=0.1)


def test_a_reduction_may_update_its_accumulator_in_place():
    # The second solve started from the first one's sum, left in u_init.
    def sum_in_place(acc, u, indices):
        acc += u[:, -1, :].sum(axis=0)
        return acc, False

    u_init = np.zeros(3)
    eprob = EnsembleProblem(_prob(), p=_scaled_params(6), reduction=sum_in_place, u_init=u_init)
    plain = dxode.solve(EnsembleProblem(_prob(), p=_scaled_params(6)), saveat=[1.0])
    for alg in (EnsembleArray(), EnsembleSerial(), EnsembleArray()):
        sim = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=4, saveat=[1.0])
        np.testing.assert_allclose(sim.u, plain.u[:, -1, :].sum(axis=0), rtol=1e-14)
    np.testing.assert_array_equal(u_init, 0.0)


@pytest.mark.parametrize("alg", [EnsembleSerial(), EnsembleArray()], ids=["serial", "array"])
@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_sim_t_shape_does_not_depend_on_batching(alg, batch_size):
    # sim.t is (trajectories, nsave) exactly when trajectories save at different times; an
    # EnsembleArray batch of lanes with different spans gave (B, nsave) rows for a shared
    # saveat, so sim.t was (3, 2) with batch_size=2 or 3 and (2,) with batch_size=1 or serially.
    spans = np.array([[0.0, 1.0], [0.0, 2.5], [0.0, 0.5]])
    eprob = EnsembleProblem(_prob(), tspan=spans)
    shared = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=batch_size, saveat=[0.25, 0.5])
    np.testing.assert_array_equal(shared.t, [0.25, 0.5])
    np.testing.assert_array_equal(shared[1].t, [0.25, 0.5])
    ends = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=batch_size)
    np.testing.assert_array_equal(ends.t, spans)


def _span_by_index(prob, i, repeat):
    return prob.remake(tspan=(0.0, 1.0 + 0.5 * i))


@pytest.mark.parametrize("alg", [EnsembleSerial(), EnsembleArray()], ids=["serial", "array"])
@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("how", ["arrays", "prob_func"])
def test_times_inside_some_spans_are_taken_whatever_the_batching(alg, batch_size, how):
    # tstops were checked against the span covering a batch, so a stop past trajectory 0's
    # end was refused with batch_size=1 and taken with 3; spans a prob_func built had their
    # saveat and tstops checked against prob.tspan, which need not be any trajectory's.
    spans = np.column_stack([np.zeros(3), 1.0 + 0.5 * np.arange(3)])
    given = {"tspan": spans} if how == "arrays" else {"prob_func": _span_by_index}
    eprob = EnsembleProblem(_prob(tspan=(0.0, 0.5)), **given)
    opts = {"rtol": 1e-8, "atol": 1e-8, "saveat": [0.75]}
    sim = dxode.solve(eprob, alg, trajectories=3, batch_size=batch_size, tstops=[1.25], **opts)
    for i in range(3):
        own = [1.25] if spans[i, 1] >= 1.25 else None
        alone = dxode.solve(_prob(tspan=tuple(spans[i])), tstops=own, **opts)
        np.testing.assert_array_equal(sim.u[i], alone.u)
        assert sim[i].stats.naccept == alone.stats.naccept
    with pytest.raises(ValueError, match="outside tspan"):  # beyond every span
        dxode.solve(EnsembleProblem(_prob(), tspan=spans), alg, tstops=[2.5], **opts)


@pytest.mark.parametrize("kernel", [False, True])
def test_tstops_with_per_trajectory_tspans(kernel):
    # A stop inside some trajectories' spans only: those step onto it, the others pass it by
    # (it was refused as outside the first trajectory's span).
    from problems import lorenz as compilable_lorenz

    if kernel:
        pytest.importorskip("numba")

    def prob_on(tspan):
        return dxode.ODEProblem(compilable_lorenz, np.array([1.0, 0.0, 0.0]), tspan, P0)

    spans = np.array([[0.0, 1.0], [0.5, 2.0], [0.0, 2.0]])
    eprob = EnsembleProblem(prob_on((0.0, 1.0)), tspan=spans)
    alg = dxode.EnsembleKernel() if kernel else EnsembleArray()
    opts = {"rtol": 1e-8, "atol": 1e-8}
    sim = dxode.solve(eprob, "tsit5", alg, trajectories=3, tstops=[0.25, 1.5], **opts)
    for i, own in enumerate(([0.25], [1.5], [0.25, 1.5])):
        t0, t1 = spans[i]
        alone = dxode.solve(prob_on((t0, t1)), "tsit5", saveat=[t0, t1], tstops=own, **opts)
        np.testing.assert_allclose(sim.u[i], alone.u, rtol=1e-12 if kernel else 0, atol=0)
        assert sim[i].stats.naccept == alone.stats.naccept
    with pytest.raises(ValueError, match="outside tspan"):
        dxode.solve(eprob, "tsit5", alg, trajectories=3, tstops=[2.5])


def test_a_failing_trajectory_gets_its_own_retcode():
    params = _scaled_params(5)
    params[1, 0] = 1e300  # overflows to inf/NaN at once
    eprob = EnsembleProblem(_prob(), p=params)
    for alg in (EnsembleArray(), EnsembleSerial()):
        sim = dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=5, **SOLVE)
        assert sim.retcodes[1] in (ReturnCode.Unstable, ReturnCode.DtLessThanMin)
        assert all(sim.retcodes[i] == ReturnCode.Success for i in (0, 2, 3, 4))
        assert not sim.success and sum(sim.failures().values()) == 1
        assert np.all(np.isfinite(sim.u[[0, 2, 3, 4]]))


def test_float32_ensembles_stay_float32(xp):
    eprob = EnsembleProblem(_prob(xp, "float32"), p=xp.asarray(_scaled_params(6)))
    sim = dxode.solve(eprob, trajectories=6, saveat=1.0, rtol=1e-4, atol=1e-4)
    assert sim.u.dtype == xp.float32 and sim.t.dtype == xp.float32
    single = dxode.solve(_prob(xp, "float32"), saveat=1.0, rtol=1e-4, atol=1e-4)
    assert single.u.dtype == xp.float32


_U0_ROWS = np.array([[1.0, 0.0, 0.0], [0.5, 0.2, 0.1], [0.1, 1.0, 2.0]])


@pytest.mark.parametrize("how", ["arrays", "batch_func", "prob_func"])
@pytest.mark.parametrize(("state", "rows"), [("float32", "float64"), ("float64", "float32")])
def test_every_algorithm_computes_in_the_ensembles_state_dtype(how, state, rows):
    # EnsembleSerial solved each trajectory in its own u0's dtype (float64 rows of a float32
    # ensemble in float64, and the reverse), where EnsembleArray casts them to prob.u0's
    u0s = _U0_ROWS.astype(rows)
    given = {
        "arrays": {"u0": u0s},
        "batch_func": {"batch_func": lambda prob, ctx: {"u0": u0s[ctx.indices]}},
        "prob_func": {"prob_func": lambda prob, i, repeat: prob.remake(u0=u0s[i])},
    }[how]
    eprob = EnsembleProblem(_prob(np, state), **given)
    sims = [
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=3, **SOLVE)
        for alg in (EnsembleArray(), EnsembleSerial())
    ]
    assert [sim.u.dtype for sim in sims] == [np.dtype(state)] * 2
    np.testing.assert_array_equal(sims[0].u, sims[1].u)


def test_diffeqgpu_lorenz_example():
    # DiffEqGPU docs: Lorenz with 10,000 random parameter sets p = rand(3) .* p, saveat 1.0.
    rng = np.random.default_rng(1)
    params = rng.random((10_000, 3)) * np.array(P0)
    eprob = EnsembleProblem(dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 10.0), P0), p=params)
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=10_000, saveat=1.0, rtol=1e-6, atol=1e-6)
    assert sim.success and sim.u.shape == (10_000, 11, 3)
    for i in (0, 4321, 9999):
        alone = dxode.solve(
            dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 10.0), tuple(params[i])),
            saveat=1.0,
            rtol=1e-6,
            atol=1e-6,
        )
        np.testing.assert_array_equal(sim.u[i], alone.u)


def test_diffeqflux_data_parallel_example():
    # DiffEqFlux docs: du/dt = 1.01*u*p, 100 trajectories with u0 = 0.5 + i/100 * u0, saveat 0.1.
    u0, p = 3.0, 1.0
    prob = dxode.ODEProblem(lambda u, p, t: 1.01 * u * p[0], [u0], (0.0, 1.0), [p])
    eprob = EnsembleProblem(
        prob, prob_func=lambda prob, i, repeat: prob.remake(u0=[0.5 + (i + 1) / 100 * u0])
    )
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=100, saveat=0.1, rtol=1e-8, atol=1e-8)
    t = np.linspace(0, 1, 11)
    exact = (0.5 + np.arange(1, 101)[:, None] / 100 * u0) * np.exp(1.01 * p * t)[None, :]
    np.testing.assert_allclose(sim.u[:, :, 0], exact, rtol=1e-6)


def test_within_ode_batching_is_one_system():
    # A neural-ODE RHS on an (n, B) matrix of independent columns: one system, one step size.
    rng = np.random.default_rng(0)
    w1, b1, w2, b2 = (
        rng.normal(size=(16, 2)),
        rng.normal(size=(16, 1)),
        rng.normal(size=(2, 16)),
        rng.normal(size=(2, 1)),
    )

    def mlp(u, p, t):
        w1, b1, w2, b2 = p
        return 0.1 * (w2 @ np.tanh(w1 @ u + b1) + b2)

    u0 = rng.normal(size=(2, 50))
    sol = dxode.solve(
        dxode.ODEProblem(mlp, u0, (0.0, 1.0), (w1, b1, w2, b2)), saveat=[1.0], rtol=1e-8, atol=1e-8
    )
    assert sol.u.shape == (1, 2, 50)
    column = dxode.solve(
        dxode.ODEProblem(mlp, u0[:, :1], (0.0, 1.0), (w1, b1, w2, b2)),
        saveat=[1.0],
        rtol=1e-8,
        atol=1e-8,
    )
    np.testing.assert_allclose(sol.u[0, :, :1], column.u[0], rtol=1e-6, atol=1e-8)


def test_shared_parameters_reach_the_rhs_unchanged():
    weights = np.array([[0.0, 1.0], [-1.0, 0.0]])

    def linear(u, p, t):
        return p["A"] @ u

    prob = dxode.ODEProblem(linear, [1.0, 0.0], (0.0, 1.0), {"A": weights})
    eprob = EnsembleProblem(prob, u0=np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]]))
    sim = dxode.solve(eprob, trajectories=3, saveat=[1.0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(sim.u[2, 0], [2 * math.cos(1), -2 * math.sin(1)], rtol=1e-8)


def test_lockstep_shares_one_step_size():
    params = _scaled_params(8, seed=2)
    params[0, 1] = 0.5  # a quiet trajectory
    eprob = EnsembleProblem(_prob(), p=params)
    free = dxode.solve(eprob, EnsembleArray(), trajectories=8, **SOLVE)
    locked = dxode.solve(eprob, EnsembleArray(lockstep=True), trajectories=8, **SOLVE)
    assert len(set(locked.stats.naccept.tolist())) == 1
    assert free.stats.naccept[0] < locked.stats.naccept[0]
    assert free.stats.total_nf < locked.stats.total_nf


def test_dense_ensembles_interpolate_each_trajectory():
    params = _scaled_params(4)
    sim = dxode.solve(
        EnsembleProblem(_prob(), p=params), trajectories=4, dense=True, rtol=1e-8, atol=1e-8
    )
    alone = dxode.solve(_prob().remake(p=tuple(params[2])), rtol=1e-8, atol=1e-8)
    np.testing.assert_array_equal(sim[2](np.array([0.3, 1.7])), alone(np.array([0.3, 1.7])))


def _at_halfway_rerun_odd_once(sol, i):
    return sol(np.array([0.3, 1.7])), (i % 2 == 1 and sol.prob.u0[0] < 2.0)


def _start_higher_on_rerun(prob, i, repeat):
    return prob.remake(u0=[1.0 + repeat, 0.0, 0.0], p=tuple(_scaled_params(4)[i]))


@pytest.mark.parametrize("batch_size", [1, 4])
def test_output_func_interpolates_a_dense_ensemble_s_trajectories(batch_size):
    # With dense=True, output_func's sol(t) raised "this solution has no dense output: solve
    # with dense=True", and a rerun's would have been the first attempt's.
    eprob = EnsembleProblem(
        _prob(), prob_func=_start_higher_on_rerun, output_func=_at_halfway_rerun_odd_once
    )
    sim = dxode.solve(
        eprob, trajectories=4, batch_size=batch_size, dense=True, rtol=1e-8, atol=1e-8
    )
    for i in range(4):
        alone = dxode.solve(_start_higher_on_rerun(_prob(), i, i % 2), rtol=1e-8, atol=1e-8)
        np.testing.assert_array_equal(sim.u[i], alone(np.array([0.3, 1.7])))


def test_a_dense_ensemble_and_its_trajectories_pickle():
    # Per-trajectory parameters were rebuilt by a closure the dense output kept, and each
    # trajectory's RHS was one too: plain pickle (multiprocessing) refused both.
    params = _scaled_params(3)
    sim = dxode.solve(EnsembleProblem(_prob(), p=params), dense=True, rtol=1e-8, atol=1e-8)
    times = np.array([0.3, 1.7])
    back = pickle.loads(pickle.dumps(sim))
    np.testing.assert_array_equal(back.u, sim.u)
    for i in range(3):
        np.testing.assert_array_equal(back[i](times), sim[i](times))
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(sim[i]))(times), sim[i](times))


def test_indexing_summaries_and_plot(tmp_path):
    sim = dxode.solve(EnsembleProblem(_prob(), p=_scaled_params(50)), trajectories=50, **SOLVE)
    one = sim[3]
    assert isinstance(one, dxode.ODESolution) and one.retcode == ReturnCode.Success
    np.testing.assert_array_equal(one.u, sim.u[3])
    assert sim[-1].stats.nf == sim.stats.nf[-1]
    summary = sim.summary(quantiles=(0.1, 0.9))
    np.testing.assert_allclose(summary.mean, sim.u.mean(axis=0))
    np.testing.assert_allclose(summary.var, sim.u.var(axis=0))
    np.testing.assert_allclose(summary.quantiles[0.9], np.quantile(sim.u, 0.9, axis=0))
    assert summary.count == 50 and len(sim) == 50
    with pytest.raises(IndexError):
        sim[50]
    matplotlib = pytest.importorskip(
        "matplotlib", reason="matplotlib is not installed (extra 'plot')"
    )
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = sim.plot(component=2)
    plt.savefig(tmp_path / "band.png")
    assert (tmp_path / "band.png").stat().st_size > 1000 and ax.get_xlabel() == "t"
    plt.close("all")


@pytest.mark.parametrize(
    ("make", "kwargs", "error", "match"),
    [
        (lambda: EnsembleProblem(_prob()), {}, TypeError, "needs trajectories=N"),
        (
            lambda: EnsembleProblem(_prob()),
            {"trajectories": 0},
            ValueError,
            "trajectories must be a positive",
        ),
        (
            lambda: EnsembleProblem(_prob()),
            {"trajectories": 3, "batch_size": -1},
            ValueError,
            "batch_size",
        ),
        (
            lambda: EnsembleProblem(_prob(), p=_scaled_params(3)),
            {"trajectories": 5},
            ValueError,
            "hold only 3",
        ),
        (
            lambda: EnsembleProblem(_prob(), prob_func=lambda prob, i, r: 3),
            {"trajectories": 2},
            TypeError,
            "must return an ODEProblem",
        ),
        (
            lambda: EnsembleProblem(
                _prob(), prob_func=lambda prob, i, r: prob.remake(f=lambda u, p, t: u)
            ),
            {"trajectories": 2},
            ValueError,
            "changed f",
        ),
        (
            lambda: EnsembleProblem(_prob(), u0=np.ones((3, 2))),
            {"trajectories": 3},
            ValueError,
            r"u0 must have shape \(trajectories, \*\(3,\)\)",
        ),
        (
            lambda: EnsembleProblem(_prob(), tspan=np.array([[0.0, 1.0], [1.0, 0.0]])),
            {"trajectories": 2},
            ValueError,
            "same time direction",
        ),
        (
            lambda: EnsembleProblem(_prob()),
            {"trajectories": 2, "seed": -3},
            ValueError,
            "seed must be",
        ),
        (
            lambda: EnsembleProblem(_prob()),
            {"trajectories": 2, "ensemble_alg": "gpu"},
            TypeError,
            "ensemble_alg must be",
        ),
    ],
)
def test_bad_ensemble_input(make, kwargs, error, match):
    kwargs = {"saveat": 1.0} | kwargs
    ensemble_alg = kwargs.pop("ensemble_alg", None)
    with pytest.raises(error, match=match):
        dxode.solve(make(), dxode.Tsit5(), ensemble_alg, **kwargs)


def test_construction_errors():
    with pytest.raises(TypeError, match="prob_func must take"):
        EnsembleProblem(_prob(), prob_func=lambda prob: prob)
    with pytest.raises(ValueError, match="at most one way"):
        EnsembleProblem(_prob(), prob_func=classic_prob_func, p=_scaled_params(2))
    with pytest.raises(ValueError, match="u_init is the reduction's starting value"):
        EnsembleProblem(_prob(), u_init=0.0)  # was ignored
    with pytest.raises(ValueError, match="disagree on the number of trajectories"):
        EnsembleProblem(_prob(), p=_scaled_params(2), u0=np.ones((3, 3)))
    with pytest.raises(TypeError, match="ensemble_alg applies to an EnsembleProblem"):
        dxode.solve(_prob(), dxode.Tsit5(), EnsembleArray())


@pytest.mark.parametrize("alg", [dxode.Vern7, dxode.DP5, dxode.BS3])
def test_scalar_states_are_bitwise_batch_independent(alg):
    # One-component states: no reduction may switch to pairwise summation at batch size 1.
    prob = dxode.ODEProblem(lambda u, p, t: -p * u + 0.1 * t, [1.0], (0.0, 2.0), 1.0)
    rates = np.linspace(0.5, 3.0, 16)
    sim = dxode.solve(EnsembleProblem(prob, p=rates), alg(), trajectories=16, saveat=0.5, rtol=1e-9)
    for i in (0, 7, 15):
        alone = dxode.solve(prob.remake(p=float(rates[i])), alg(), saveat=0.5, rtol=1e-9)
        np.testing.assert_array_equal(sim.u[i], alone.u)


def test_large_states_are_bitwise_batch_independent():
    # Twelve components: a lone lane's error norm must add its squares in the same order as a
    # lane inside a batch (no pairwise summation).
    def chain(u, p, t):
        return -p[0] * u + 0.1 * u[::-1]

    prob = dxode.ODEProblem(chain, np.linspace(1.0, 2.0, 12), (0.0, 2.0), (1.0,))
    rates = np.linspace(0.5, 2.0, 24)[:, None]
    eprob = EnsembleProblem(prob, p=(rates[:, 0],))
    together = dxode.solve(eprob, trajectories=24, batch_size=24, saveat=1.0, rtol=1e-7)
    one_by_one = dxode.solve(eprob, trajectories=24, batch_size=1, saveat=1.0, rtol=1e-7)
    np.testing.assert_array_equal(one_by_one.u, together.u)
    alone = dxode.solve(prob.remake(p=(float(rates[5, 0]),)), saveat=1.0, rtol=1e-7)
    np.testing.assert_array_equal(alone.u, together.u[5])


def _rate(u, p, t):
    return -p[0] * u


@pytest.mark.parametrize(
    "kwargs",
    [
        {"p": (np.array([0.5, 1.5]),)},
        {"prob_func": lambda prob, i, repeat: prob.remake(p=(np.float64(0.5 + i),))},
        {"batch_func": lambda prob, ctx: {"p": (0.5 + ctx.indices.astype(np.float64),)}},
    ],
    ids=["arrays", "prob_func", "batch_func"],
)
def test_serial_casts_float64_trajectory_parameters_to_a_float32_state_like_array(kwargs):
    # EnsembleSerial passed them on uncast, and f's float64 result was refused.
    prob = dxode.ODEProblem(_rate, np.array([1.0], dtype=np.float32), (0.0, 1.0), (1.0,))
    eprob = EnsembleProblem(prob, **kwargs)
    serial = dxode.solve(eprob, EnsembleSerial(), trajectories=2, saveat=[1.0])
    array = dxode.solve(eprob, EnsembleArray(), trajectories=2, saveat=[1.0])
    assert serial.u.dtype == np.float32
    np.testing.assert_array_equal(serial.u, array.u)
    np.testing.assert_allclose(serial.u[:, -1, 0], np.exp([-0.5, -1.5]), rtol=1e-4)


def _decay(u, p, t):
    return -p[0] * u


def test_summaries_refuse_trajectories_with_their_own_save_times():
    # Without saveat each trajectory saves its own start and end: sim.mean() averaged the
    # states at t = 1, 2, 3, 4 and summary() labelled the average with trajectory 0's t = 1.
    prob = dxode.ODEProblem(_decay, [1.0], (0.0, 1.0), [1.0])
    spans = np.column_stack([np.zeros(4), [1.0, 2.0, 3.0, 4.0]])
    sim = dxode.solve(EnsembleProblem(prob, tspan=spans), trajectories=4)
    for summary in (sim.mean, sim.var, sim.summary, lambda: sim.quantile(0.5)):
        with pytest.raises(ValueError, match=r"saved at their own times.*saveat array"):
            summary()
    shared = dxode.solve(EnsembleProblem(prob, tspan=spans), trajectories=4, saveat=[0.5, 1.0])
    np.testing.assert_allclose(shared.mean()[:, 0], np.exp([-0.5, -1.0]), rtol=1e-3)


def test_summaries_count_a_terminated_trajectory_up_to_its_event():
    # A terminated trajectory's save points after its event hold NaN, and it counts as
    # successful: every summary after the first event was NaN.
    prob = dxode.ODEProblem(_decay, [1.0], (0.0, 1.0), [1.0])
    stop = dxode.ContinuousCallback(lambda u, p, t: u[0] - 0.3, terminate=True)
    rates = np.array([[1.0], [2.0], [4.0]])
    sim = dxode.solve(
        EnsembleProblem(prob, p=rates),
        trajectories=3,
        saveat=0.25,
        callback=stop,
        rtol=1e-8,
        atol=1e-8,
    )
    assert list(sim.retcodes) == [ReturnCode.Success, ReturnCode.Terminated, ReturnCode.Terminated]
    u = sim.u[..., 0]
    expected = np.array([np.mean(u[:, 0]), np.mean(u[:, 1]), np.mean(u[:2, 2]), u[0, 3], u[0, 4]])
    np.testing.assert_allclose(sim.mean()[:, 0], expected)
    summary = sim.summary(quantiles=(0.5,))
    np.testing.assert_allclose(summary.mean[:, 0], expected)
    median = [1.0, np.median(u[:, 1]), np.median(u[:2, 2]), u[0, 3], u[0, 4]]
    np.testing.assert_allclose(summary.quantiles[0.5][:, 0], median)
    expected_var = [0.0, np.var(u[:, 1]), np.var(u[:2, 2]), 0.0, 0.0]
    np.testing.assert_allclose(sim.var()[:, 0], expected_var, atol=1e-15)
    assert summary.count == 3


def test_quantiles_keep_a_float32_ensemble_s_dtype():
    # quantile([0.1, 0.9]) came back float64 where quantile(0.1), mean() and summary() keep
    # float32: NumPy computes at an array of float64 levels in float64.
    prob = dxode.ODEProblem(_decay, np.ones(1, np.float32), (0.0, 1.0), [1.0])
    rates = np.linspace(0.5, 2.0, 7, dtype=np.float32)[:, None]
    sim = dxode.solve(EnsembleProblem(prob, p=rates), saveat=[0.5, 1.0], rtol=1e-5, atol=1e-6)
    levels = sim.quantile([0.1, 0.9])
    assert levels.dtype == np.float32 == sim.summary(quantiles=(0.1, 0.9)).quantiles[0.1].dtype
    np.testing.assert_array_equal(levels, [sim.quantile(0.1), sim.quantile(0.9)])
    assert sim.quantile([]).shape == (0, 2, 1)


def test_quantile_levels_are_checked():
    # "0.5" failed inside NumPy ("ufunc 'minimum' did not contain a loop"), quantiles=0.5
    # with "'float' object is not iterable".
    sim = dxode.solve(EnsembleProblem(_prob(), p=_scaled_params(3)), trajectories=3, **SOLVE)
    with pytest.raises(TypeError, match=r"quantile level must be a number in \[0, 1\], got '0.5'"):
        sim.quantile("0.5")
    with pytest.raises(ValueError, match=r"quantile level must be in \[0, 1\].*got 50"):
        sim.quantile(50)
    with pytest.raises(TypeError, match="quantiles must be a tuple of levels"):
        sim.summary(quantiles=0.5)
    np.testing.assert_array_equal(sim.quantile(np.float32(0.5)), np.median(sim.u, axis=0))
    both = sim.quantile([0.0, 1.0])  # a sequence of levels: one slice each
    np.testing.assert_array_equal(both, [sim.u.min(axis=0), sim.u.max(axis=0)])
    with pytest.raises(ValueError, match=r"quantile level must be in \[0, 1\].*got 2"):
        sim.quantile([0.5, 2])


def test_indexing_a_solution_by_trajectory():
    sim = dxode.solve(EnsembleProblem(_prob(), p=_scaled_params(3)), trajectories=3, saveat=[1.0])
    np.testing.assert_array_equal(sim[-1].u, sim.u[2])
    with pytest.raises(IndexError, match="trajectory 3 out of range for 3 trajectories"):
        sim[3]
    # A float or a slice failed inside NumPy or with "'<=' not supported ... 'slice'".
    for index in (1.0, slice(1, None), True):
        with pytest.raises(TypeError, match=r"sim\[i\] takes one trajectory number \(an int\)"):
            sim[index]


def test_output_func_arrays_are_not_taken_for_saved_states():
    # Values of two or more dimensions (each trajectory's final state, stacked (N, 3)) were
    # taken for states: sim[0] was an ODESolution of 4 save times holding 3 numbers, and
    # sim.mean() averaged the values under the save times' labels.
    final = EnsembleProblem(
        _prob(), p=_scaled_params(3), output_func=lambda sol, i: (sol.u[-1], False)
    )
    sim = dxode.solve(final, trajectories=3, saveat=1.0)
    assert sim.u.shape == (3, 3)
    with pytest.raises(TypeError, match=r"sim\[i\] needs the saved states"):
        sim[0]
    for summary in (sim.mean, sim.var, sim.summary):
        with pytest.raises(TypeError, match="summaries need the saved states"):
            summary()


def test_ensemble_array_arguments():
    # lockstep="no" turned lock-step on; a misspelt backend failed only in the first batch.
    with pytest.raises(ValueError, match="backend must be 'numpy', 'cupy' or None, got 'numpyy'"):
        EnsembleArray(backend="numpyy")
    with pytest.raises(TypeError, match="lockstep must be True or False, got 'no'"):
        EnsembleArray(lockstep="no")


@pytest.mark.skipif(dxode.backends.cupy_available(), reason="CuPy with a GPU is here")
def test_the_cupy_backend_without_cupy_says_what_to_install():
    # It failed with array_api_compat's "No module named 'cupy'".
    eprob = EnsembleProblem(_prob())
    with pytest.raises((ImportError, RuntimeError), match="the 'cupy' backend needs"):
        dxode.solve(eprob, EnsembleArray(backend="cupy"), trajectories=2, saveat=[1.0])


def _decay_rows(u, p, t):
    return [-p[0] * u[0]]


_RATES = np.array([[0.5], [1.0], [2.0], [3.0], [4.0]])
_STARTS = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
_SPANS = np.array([[0.0, 1.0], [0.0, 0.5], [0.25, 2.0], [0.0, 1.5], [1.0, 2.0]])


def _described(how):
    """The same five trajectories, by arrays, a batch_func or a prob_func."""
    prob = dxode.ODEProblem(_decay_rows, np.array([9.0]), (0.0, 9.0), np.array([9.0]))
    if how == "arrays":
        return prob, {"u0": _STARTS, "p": _RATES, "tspan": _SPANS}
    if how == "batch_func":
        rows = lambda prob, ctx: {
            "u0": _STARTS[ctx.indices],
            "p": _RATES[ctx.indices],
            "tspan": _SPANS[ctx.indices],
        }
        return prob, {"batch_func": rows}
    one = lambda prob, i, repeat: prob.remake(u0=_STARTS[i], p=_RATES[i], tspan=tuple(_SPANS[i]))
    return prob, {"prob_func": one}


def _ensemble_algorithms():
    algs = [EnsembleSerial(), EnsembleArray()]
    try:
        import numba  # noqa: F401
    except ImportError:
        return algs
    return [*algs, dxode.EnsembleKernel()]


@pytest.mark.parametrize("alg", _ensemble_algorithms(), ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("how", ["arrays", "batch_func", "prob_func"])
def test_a_trajectory_s_solution_holds_its_own_problem(alg, how):
    # sol.prob in output_func and sim[i].prob were the ensemble's prob for every trajectory:
    # an output_func reading sol.prob.p (DifferentialEquations.jl's idiom) got prob.p.
    prob, given = _described(how)

    def own(sol, i):
        return (np.asarray(sol.prob.u0), np.asarray(sol.prob.p), tuple(sol.prob.tspan)), False

    opts = {"trajectories": 5, "batch_size": 2, "saveat": None}
    kept = dxode.solve(EnsembleProblem(prob, output_func=own, **given), "tsit5", alg, **opts)
    sim = dxode.solve(EnsembleProblem(prob, **given), "tsit5", alg, **opts)
    for i in range(5):
        for u0, p, tspan in (kept.u[i], (sim[i].prob.u0, sim[i].prob.p, sim[i].prob.tspan)):
            np.testing.assert_array_equal(np.ravel(u0), _STARTS[i])
            np.testing.assert_array_equal(np.ravel(p), _RATES[i])
            assert tuple(tspan) == tuple(_SPANS[i])
        assert sim[i].prob.f is prob.f


def test_a_float32_trajectory_s_problem_holds_its_values_as_its_lanes_do():
    # Integer starts and float64 rates are cast to the float32 state's dtype in the lanes;
    # the trajectory's problem holds the same values (remake alone made the start float64).
    prob = dxode.ODEProblem(_decay_rows, np.array([9.0], dtype=np.float32), (0.0, 1.0), (9.0,))
    eprob = EnsembleProblem(prob, u0=np.array([[1], [2]]), p=np.array([[0.5], [2.0]]))
    own = dxode.solve(eprob, "tsit5", trajectories=2, saveat=[1.0])[1].prob
    assert own.u0.dtype == own.p.dtype == np.float32
    assert own.u0[0] == 2.0 and own.p[0] == 2.0


@pytest.mark.parametrize("p_library", ["state's", "numpy"])
def test_a_trajectory_s_problem_is_built_on_any_backend(xp, p_library):
    # array_api_strict: sim[i].prob failed with an IndexError (a 2-D array indexed by one
    # axis) or "Cannot interpret 'array_api_strict.float64'" (a NumPy row cast to its dtype).
    starts = _scaled_params(3, seed=1)
    rates = _scaled_params(3)
    p = xp.asarray(rates) if p_library == "state's" else rates
    sim = dxode.solve(EnsembleProblem(_prob(xp), u0=xp.asarray(starts), p=p), **SOLVE)
    own = sim[1].prob
    np.testing.assert_array_equal(to_numpy(own.u0), starts[1])
    np.testing.assert_array_equal(to_numpy(own.p), rates[1])
    assert own.u0.dtype == own.p.dtype == _prob(xp).u0.dtype
    again = dxode.solve(own, "tsit5", **SOLVE)
    np.testing.assert_array_equal(to_numpy(again.u), to_numpy(sim.u)[1])


def _unpacked_lorenz(u, p, t):  # numba compiles it for the kernel
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def _float64_rates(prob, ctx):
    return prob.remake(p=tuple(np.array(P0) * (0.5 + ctx.rng.random(3))))  # np.float64 each


@pytest.mark.parametrize("ensemble_alg", [EnsembleArray(), dxode.EnsembleKernel()], ids=repr)
def test_trajectory_0_alone_in_a_batch_gets_its_parameters_as_the_others_do(ensemble_alg):
    # A batch holding trajectory 0 alone compared its parameter leaves with trajectory 0
    # itself, so they were shared: passed uncast, np.float64 for a float32 state, and refused
    # ("f returned dtype float64"), while any larger batch cast them as per-trajectory rows.
    u0 = np.array([1.0, 0.0, 0.0], np.float32)
    prob = dxode.ODEProblem(_unpacked_lorenz, u0, (0.0, 1.0), P0)
    eprob = EnsembleProblem(prob, prob_func=_float64_rates)
    opts = {"trajectories": 3, "saveat": [0.5, 1.0], "seed": 4}
    whole = dxode.solve(eprob, dxode.Tsit5(), ensemble_alg, batch_size=3, **opts)
    alone = dxode.solve(eprob, dxode.Tsit5(), ensemble_alg, batch_size=1, **opts)
    assert alone.u.dtype == np.float32
    np.testing.assert_array_equal(alone.u, whole.u)
    single = dxode.solve(eprob, dxode.Tsit5(), ensemble_alg, **{**opts, "trajectories": 1})
    np.testing.assert_array_equal(single.u, whole.u[:1])
