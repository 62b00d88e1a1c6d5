"""EnsembleDask on real LocalClusters of worker processes: results, outputs, faults, TLS."""

from __future__ import annotations

import copy
import os
import pickle

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from scripts import run_script  # noqa: E402

import dxode  # noqa: E402
from dxode import EnsembleDask, EnsembleProblem  # noqa: E402

P0 = (10.0, 28.0, 8.0 / 3.0)
SOLVE = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}
N = 64


def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def _params(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return np.array(P0) * (1 + 0.1 * (rng.random((n, 3)) - 0.5))


def _eprob(**kwargs):
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 3.0), P0)
    return EnsembleProblem(prob, p=_params(), **kwargs)


@pytest.fixture(scope="module")
def reference():
    return dxode.solve(_eprob(), dxode.Tsit5(), trajectories=N, **SOLVE)


@pytest.mark.parametrize("batch_size", [None, 5, 64])
def test_dask_equals_array_for_any_batch_size(client, reference, batch_size):
    sim = dxode.solve(
        _eprob(),
        dxode.Tsit5(),
        EnsembleDask(client),
        trajectories=N,
        batch_size=batch_size,
        **SOLVE,
    )
    np.testing.assert_array_equal(sim.u, reference.u)
    np.testing.assert_array_equal(sim.stats.nf, reference.stats.nf)
    assert isinstance(sim.u, np.ndarray)


def _in_place_prob_func(prob, i, repeat):
    prob.p[:] = _params()[i]  # DifferentialEquations.jl style: in place, then return prob
    return prob


def test_a_prob_func_changing_p_in_place_gives_each_trajectory_its_own(client, reference):
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 3.0), np.array(P0))
    eprob = EnsembleProblem(prob, prob_func=_in_place_prob_func)
    sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=N, batch_size=8, **SOLVE)
    np.testing.assert_array_equal(sim.u, reference.u)


COUPLING = np.array([[-0.5, 1.0], [-1.0, -0.3]])  # one array every trajectory shares


def _coupled(u, p, t):
    weights, rate = p
    return rate * (weights @ u)  # the shared matrix itself, not a stack of one per lane


def _shared_weights(prob, i, repeat):
    return prob.remake(p=(COUPLING, 0.5 + 0.2 * i))


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_a_leaf_every_trajectory_shares_reaches_f_unchanged_on_the_workers(client, batch_size):
    # The workers compared the leaves a module-level prob_func returned with the driver's
    # trajectory 0, unpickled: never the same object, so the shared matrix was stacked per
    # lane and `weights @ u` failed in matmul (or, for 2 lanes, returned the wrong shape).
    prob = dxode.ODEProblem(_coupled, [1.0, 0.5], (0.0, 1.0), (COUPLING, 1.0))
    eprob = EnsembleProblem(prob, prob_func=_shared_weights)
    opts = {"trajectories": 6, "batch_size": batch_size, "saveat": [0.5, 1.0]}
    local = dxode.solve(eprob, dxode.Tsit5(), **opts)
    sim = dxode.solve(eprob, dxode.Tsit5(), client, **opts)
    np.testing.assert_array_equal(sim.u, local.u)


def test_a_client_is_shorthand_and_worker_count_does_not_matter(client, reference):
    sim = dxode.solve(_eprob(), dxode.Tsit5(), client, trajectories=N, batch_size=8, **SOLVE)
    np.testing.assert_array_equal(sim.u, reference.u)
    with (
        dxode.local_cluster(n_workers=1) as one,
        distributed.Client(one, set_as_default=False) as c1,
    ):
        single = dxode.solve(_eprob(), dxode.Tsit5(), c1, trajectories=N, batch_size=8, **SOLVE)
    np.testing.assert_array_equal(single.u, reference.u)


def test_default_client_then_embedded_cluster(reference):
    with dxode.local_cluster(n_workers=1) as cluster, distributed.Client(cluster) as default:
        sim = dxode.solve(_eprob(), dxode.Tsit5(), EnsembleDask(), trajectories=N, **SOLVE)
        assert default.has_what()  # the default client's workers did the work
    np.testing.assert_array_equal(sim.u, reference.u)
    # No client at all: an embedded LocalCluster is started for the call and closed after.
    embedded = dxode.solve(_eprob(), dxode.Tsit5(), EnsembleDask(), trajectories=N, **SOLVE)
    np.testing.assert_array_equal(embedded.u, reference.u)
    with pytest.raises(ValueError):
        distributed.default_client()


# In a fresh process: this one's environment may hold what other tests' clusters changed.
CLUSTER_ENVIRON_SCRIPT = """
import os

import dxode


def decay(u, p, t):
    return -u


def start_and_close_a_cluster():
    {}


if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = "3"  # the user's own setting
    for name in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED"):
        os.environ.pop(name, None)
    before = dict(os.environ)
    start_and_close_a_cluster()
    changed = {{k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}}
    print(sorted(changed))
"""
EMBEDDED_CLUSTER = """prob = dxode.ODEProblem(decay, [1.0], (0.0, 1.0))
    dxode.solve(dxode.EnsembleProblem(prob), dxode.Tsit5(), dxode.EnsembleDask(), trajectories=4)
"""
SCALED_LOCAL_CLUSTER = """import distributed

    with dxode.local_cluster(n_workers=1) as cluster, distributed.Client(cluster) as client:
        cluster.scale(2)  # a worker started later sets them again
        client.wait_for_workers(2, timeout=120)
"""

OVERLAPPING_CLUSTERS = """first = dxode.local_cluster(n_workers=1)
    second = dxode.local_cluster(n_workers=1)  # started with the first one's changes made
    first.close()
    second.close()
"""
USER_CHANGE_MEANWHILE = """with dxode.local_cluster(n_workers=1):
        os.environ["DXODE_TEST_SETTING"] = "the user's"  # kept: not the nanny's
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("cluster", "changed"),
    [
        (EMBEDDED_CLUSTER, []),
        (SCALED_LOCAL_CLUSTER, []),
        (OVERLAPPING_CLUSTERS, []),
        (USER_CHANGE_MEANWHILE, ["DXODE_TEST_SETTING"]),
    ],
    ids=["embedded", "local_cluster", "overlapping", "user_change_kept"],
)
def test_a_closed_cluster_leaves_this_process_s_environment_as_it_was(tmp_path, cluster, changed):
    # Dask's nannies set OMP_NUM_THREADS=1, PYTHONHASHSEED, ... for their workers in the
    # environment of the process that starts them, and leave them there, where later child
    # processes and libraries of the user's read them. What the user sets meanwhile stays.
    script = CLUSTER_ENVIRON_SCRIPT.format(cluster)
    result = run_script(tmp_path / "cluster_environ.py", script, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(changed), result.stdout


@pytest.fixture
def unconnected_default_client():
    """The default client Dask leaves behind when a client fails to connect (a mistyped
    scheduler address): status "connecting" for good. Closed afterwards."""
    import dask

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(ValueError, match="missing port number"):
            distributed.Client("nonsense", timeout=1)
        try:
            broken = distributed.default_client()
        except ValueError:
            pytest.skip("this Dask release leaves no client behind when connecting fails")
        try:
            assert broken.status == "connecting"
            yield broken
        finally:
            broken.close()


@pytest.mark.timeout(120)
def test_a_default_client_that_never_connected_is_refused_by_name(unconnected_default_client):
    # Every solve on it waited forever: its messages queue until it connects, which it never
    # does. Waiting Dask's connect timeout (1 s here) lets a reconnecting client recover.
    name = unconnected_default_client.id
    with pytest.raises(ValueError, match=rf"client '{name}' has not connected.*client.close\(\)"):
        dxode.solve(_eprob(), dxode.Tsit5(), EnsembleDask(), trajectories=4, **SOLVE)


@pytest.mark.timeout(120)
def test_a_zarr_output_is_read_here_not_through_the_default_client(
    client, tmp_path, reference, unconnected_default_client
):
    # sim[i] and to_host() computed the Zarr-backed dask.array with the default scheduler:
    # whatever default client this process had, which hung when it was a broken one.
    alg = EnsembleDask(client, output="zarr", store=str(tmp_path / "here.zarr"))
    sim = dxode.solve(_eprob(), dxode.Tsit5(), alg, trajectories=N, batch_size=16, **SOLVE)
    np.testing.assert_array_equal(sim.to_host(), reference.u)
    np.testing.assert_array_equal(sim[5].u, reference[5].u)


def test_a_dask_output_whose_client_closed_says_its_states_are_gone():
    # Dask's own error was a bare "ClosedClientError: Client is closed".
    with (
        dxode.local_cluster(n_workers=1) as cluster,
        distributed.Client(cluster, set_as_default=False) as short_lived,
    ):
        sim = dxode.solve(
            _eprob(),
            dxode.Tsit5(),
            EnsembleDask(short_lived, output="dask"),
            trajectories=4,
            **SOLVE,
        )
        assert sim[0].u.shape == sim.u.shape[1:]
    for use in (sim.to_host, lambda: sim[0], sim.mean, sim.summary):
        with pytest.raises(ValueError, match=r"client that is now closed.*output='memory'"):
            use()


def test_a_dask_output_needs_a_cluster_that_outlives_the_solve():
    # Without a client the LocalCluster started for the call was closed on return, and with
    # it the chunks: sim.u could never be computed ("Client is closed").
    alg = EnsembleDask(output="dask")
    with pytest.raises(ValueError, match=r"output='dask' keeps the saved states on the workers"):
        dxode.solve(_eprob(), dxode.Tsit5(), alg, trajectories=4, **SOLVE)


def test_lazy_dask_array_output(client, reference):
    import dask.array as da

    sim = dxode.solve(
        _eprob(),
        dxode.Tsit5(),
        EnsembleDask(client, output="dask"),
        trajectories=N,
        batch_size=16,
        **SOLVE,
    )
    assert isinstance(sim.u, da.Array)
    assert sim.u.chunks[0] == (16, 16, 16, 16)
    # The chunks live on the cluster's workers: compute with its client.
    np.testing.assert_array_equal(sim.u.compute(scheduler=client), reference.u)
    np.testing.assert_array_equal(sim.retcodes, reference.retcodes)
    # Downstream Dask work on the distributed result: the mean over trajectories.
    mean = sim.u.mean(axis=0).compute(scheduler=client)
    np.testing.assert_allclose(mean, reference.u.mean(axis=0))
    # The solution's own API computes with that client, not the default scheduler (which
    # failed, the client not being the default, with Dask's "Missing dependency dxode-batch-").
    np.testing.assert_array_equal(sim.to_host(), reference.u)
    np.testing.assert_array_equal(sim.mean(), reference.mean())
    np.testing.assert_array_equal(sim.summary().quantiles[0.5], reference.quantile(0.5))
    np.testing.assert_array_equal(sim[5].u, reference.u[5])
    np.testing.assert_array_equal(np.stack([sol.u for sol in sim]), reference.u)


def test_a_dask_output_refuses_pickling_and_names_what_to_pickle(client):
    # Its futures belong to this process's client: pickle failed deep inside distributed
    # ("cannot pickle '_asyncio.Task' object"), copy.deepcopy too.
    alg = EnsembleDask(client, output="dask")
    sim = dxode.solve(_eprob(), dxode.Tsit5(), alg, trajectories=4, **SOLVE)
    for copy_of in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match=r"stay on its Dask workers.*pickle sim\.to_host\(\)"):
            copy_of(sim)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(sim.to_host())), sim.to_host())


def test_zarr_output(client, reference, tmp_path):
    import zarr

    store = str(tmp_path / "ensemble.zarr")
    sim = dxode.solve(
        _eprob(),
        dxode.Tsit5(),
        EnsembleDask(client, output="zarr", store=store),
        trajectories=N,
        batch_size=16,
        **SOLVE,
    )
    group = zarr.open_group(store, mode="r")
    np.testing.assert_array_equal(group["u"][...], reference.u)
    np.testing.assert_array_equal(group["retcode"][...], reference.retcodes)
    np.testing.assert_array_equal(group["nf"][...], reference.stats.nf)
    np.testing.assert_array_equal(np.asarray(sim.u), reference.u)
    assert sim.success and len(sim) == N
    assert sim.stats.total_nf == reference.stats.total_nf
    # Summaries read the store: they said "no trajectory succeeded" (a Zarr array of
    # return codes compared unequal to Success as a whole) and to_host raised AttributeError.
    np.testing.assert_array_equal(sim.to_host(), reference.u)
    assert sim.summary().count == N
    np.testing.assert_array_equal(sim.mean(), reference.mean())


@pytest.mark.parametrize("batch_size", [3, 1])
@pytest.mark.parametrize("output", ["memory", "dask", "zarr"])
def test_outputs_keep_each_trajectory_s_own_save_times(client, tmp_path, output, batch_size):
    # With per-trajectory spans and saveat=None every trajectory saves at its own start and
    # end; a Zarr output's sim.t was trajectory 0's times (2,), so sim[5].t was [0, 1]. It
    # still was when every batch's trajectories shared their span (batch_size=1): a batch's
    # times were compared with themselves, not with the first batch's.
    import zarr

    spans = np.column_stack([np.zeros(7), np.linspace(1.0, 2.0, 7)])
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0)
    eprob = EnsembleProblem(prob, tspan=spans)
    store = str(tmp_path / "spans.zarr")
    alg = EnsembleDask(client, output=output, store=store)
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=batch_size)
    np.testing.assert_array_equal(np.asarray(sim.t), spans)
    np.testing.assert_array_equal(sim[5].t, spans[5])
    if output == "zarr":
        np.testing.assert_array_equal(zarr.open_group(store, mode="r")["t"][...], spans)
    # A Zarr output's summaries failed with "TypeError: Array is not a supported array type".
    with pytest.raises(ValueError, match=r"saved at their own times.*saveat array"):
        sim.summary()


def _decay(u, p, t):
    return -p[0] * u


def _below_a_third(u, p, t):
    return u[0] - 0.3


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_summaries_of_dask_and_zarr_outputs_reduce_chunk_by_chunk(client, tmp_path, dtype):
    # They brought every trajectory to the driver (sim.to_host()), so a Zarr output larger
    # than the driver's memory could not be summarized. Now every chunk is reduced where it
    # is, to the bits and dtypes of the same summaries in memory; trajectories that stopped
    # at their event hold NaN after it.
    prob = dxode.ODEProblem(_decay, np.array([1.0], dtype=dtype), (0.0, 1.0), [1.0])
    stop = dxode.ContinuousCallback(_below_a_third, terminate=True)
    eprob = EnsembleProblem(prob, p=np.linspace(0.5, 4.0, 40)[:, None])
    opts = {"trajectories": 40, "batch_size": 7, "saveat": 0.125, "callback": stop}
    memory = dxode.solve(eprob, dxode.Tsit5(), EnsembleDask(client), **opts)
    assert np.isnan(memory.u).any() and not np.isnan(memory.u).all()
    levels = (0.1, 0.5)
    expected = memory.summary(quantiles=levels)
    expected_levels = memory.quantile(list(levels))
    expected_median = memory.quantile(0.5)
    store = str(tmp_path / "summaries.zarr")
    for output in ("dask", "zarr"):
        sim = dxode.solve(
            eprob, dxode.Tsit5(), EnsembleDask(client, output=output, store=store), **opts
        )
        sim.to_host = None  # summaries must not bring the whole ensemble here
        got = sim.summary(quantiles=levels)
        pairs = [(got.mean, expected.mean), (got.var, expected.var), (sim.var(), expected.var)]
        pairs += [(got.quantiles[q], expected.quantiles[q]) for q in levels]
        pairs += [
            (sim.quantile(list(levels)), expected_levels),
            (sim.quantile(0.5), expected_median),
        ]
        for value, reference in pairs:
            np.testing.assert_array_equal(value, reference)
            assert value.dtype == reference.dtype
        assert got.count == expected.count and np.array_equal(got.t, expected.t)


def _span_to_two(prob, i, repeat):
    return prob.remake(tspan=(0.0, 2.0))


def _span_to_one_plus_i(prob, i, repeat):
    return prob.remake(tspan=(0.0, 1.0 + i))


@pytest.mark.parametrize("output", ["dask", "zarr"])
def test_outputs_hold_the_save_times_of_a_span_set_by_prob_func(client, tmp_path, output):
    # Laid out from prob.tspan (0, 1): saveat=0.5 over the trajectories' (0, 2) saved 5 times
    # per trajectory, but Zarr kept the first 3 and the dask.array declared 3 (its [:, -1]
    # was t = 1, not 2) while sim.t listed 5. Spans of different lengths went unnoticed.
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0)
    opts = {"trajectories": 4, "batch_size": 2, "saveat": 0.5}
    eprob = EnsembleProblem(prob, prob_func=_span_to_two)
    local = dxode.solve(eprob, dxode.Tsit5(), **opts)
    alg = EnsembleDask(client, output=output, store=str(tmp_path / "two.zarr"))
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, **opts)
    assert sim.u.shape == local.u.shape == (4, 5, 3)
    np.testing.assert_array_equal(client.compute(sim.u[:, -1]).result(), local.u[:, -1])
    np.testing.assert_array_equal(sim.t, local.t)
    alg = EnsembleDask(client, output=output, store=str(tmp_path / "grow.zarr"))
    growing = EnsembleProblem(prob, prob_func=_span_to_one_plus_i)
    with pytest.raises(ValueError, match=r"trajectory \d saved \d+ times, trajectory 0 3"):
        dxode.solve(growing, dxode.Tsit5(), alg, **{**opts, "batch_size": 1})


def _ten_times_x(sol, i):
    return 10 * float(sol.u[-1, 0]), False


def _count(acc, values, indices):
    return acc + len(indices), False


@pytest.mark.parametrize("output", ["dask", "zarr"])
@pytest.mark.parametrize(
    "kept",
    [
        {"output_func": _ten_times_x},
        {"reduction": _count, "u_init": 0},
        {"reduction": _count, "u_init": 0, "combine": np.add},
    ],
    ids=["output_func", "reduction", "reduction-combine"],
)
def test_outputs_for_saved_states_refuse_values(client, tmp_path, output, kept):
    # output="zarr" returned the saved states, dropping the output_func's values or the
    # reduction without a word; output="dask" failed with TypeError 'NoneType' ...
    alg = EnsembleDask(client, output=output, store=str(tmp_path / "values.zarr"))
    with pytest.raises(ValueError, match=f"output='{output}' is where saved states go"):
        dxode.solve(_eprob(**kept), dxode.Tsit5(), alg, trajectories=4, batch_size=2, **SOLVE)


def test_a_closed_client_is_refused_clearly(client):
    closed = distributed.Client(client.scheduler.address, set_as_default=False)
    closed.close()
    with pytest.raises(ValueError, match="EnsembleDask's client is closed: pass a running"):
        dxode.solve(_eprob(), dxode.Tsit5(), closed, trajectories=4, **SOLVE)
    with pytest.raises(ValueError, match="client is closed"):
        dxode.solve(_eprob(), dxode.Tsit5(), EnsembleDask(closed), trajectories=4, batch_size=2)


def test_output_func_runs_on_the_workers(client):
    def output_func(sol, i):
        return (os.getpid(), float(sol.u[-1, 0])), False

    sim = dxode.solve(
        _eprob(output_func=output_func),
        dxode.Tsit5(),
        client,
        trajectories=N,
        batch_size=8,
        **SOLVE,
    )
    pids = {pid for pid, _ in sim.u}
    assert os.getpid() not in pids
    assert pids <= set(client.run(os.getpid).values())


def _longer_on_rerun(prob, i, repeat):
    return prob.remake(tspan=(0.0, 1.0 + repeat), p=tuple(_params()[i]))


def _rerun_even_once(sol, i):
    return float(sol.u[-1, 0]), (i % 2 == 0 and sol.prob.tspan[1] < 2.0)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_reruns_on_the_workers_keep_their_last_attempts_save_times(client, batch_size):
    # sim.t held the first attempt's (0, 1) for the even trajectories solved again over (0, 2).
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0)
    eprob = EnsembleProblem(prob, prob_func=_longer_on_rerun, output_func=_rerun_even_once)
    here = dxode.solve(eprob, dxode.Tsit5(), trajectories=5, rtol=1e-6, atol=1e-6)
    there = dxode.solve(
        eprob, dxode.Tsit5(), client, trajectories=5, batch_size=batch_size, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_array_equal(there.t, [[0.0, 1.0 + (i % 2 == 0)] for i in range(5)])
    np.testing.assert_array_equal(there.u, here.u)
    np.testing.assert_array_equal(there.stats.naccept, here.stats.naccept)


def _sum_in_place(acc, values, indices):
    acc += np.sum(values[:, -1, :], axis=0)
    return acc, False


@pytest.mark.parametrize("combine", [np.add, None], ids=["on-workers", "on-the-driver"])
def test_a_reduction_may_update_its_accumulator_in_place(client, reference, combine):
    # Each reduction starts from a copy of u_init: a worker reused the u_init its earlier
    # batches had updated in place (the tree sum then counted them again), and a solve left
    # u_init changed for the next one.
    u_init = np.zeros(3)
    eprob = _eprob(reduction=_sum_in_place, u_init=u_init, combine=combine)
    expected = reference.u[:, -1, :].sum(axis=0)
    for _ in range(2):
        sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=N, batch_size=8, **SOLVE)
        np.testing.assert_allclose(sim.u, expected, rtol=1e-12)
    np.testing.assert_array_equal(u_init, 0.0)


def _final_x(acc, u, indices):
    return acc + u[:, -1, 0].sum(), False


@pytest.mark.parametrize("combine", [np.add, None], ids=["on-workers", "on-the-driver"])
def test_a_reduction_of_trajectories_with_their_own_save_times_keeps_no_times(client, combine):
    # sim.t was trajectory 0's (0, 1) as if every trajectory had saved then, not at its end.
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0)
    spans = np.column_stack([np.zeros(4), [1.0, 2.0, 3.0, 4.0]])
    eprob = EnsembleProblem(prob, tspan=spans, reduction=_final_x, u_init=0.0, combine=combine)
    sim = dxode.solve(eprob, dxode.Tsit5(), client, batch_size=2, rtol=1e-6, atol=1e-6)
    kept = dxode.solve(EnsembleProblem(prob, tspan=spans), dxode.Tsit5(), rtol=1e-6, atol=1e-6)
    assert sim.t is None and len(sim) == 4
    assert sim.u == pytest.approx(float(kept.u[:, -1, 0].sum()), rel=1e-12)


def test_reduction_tree_on_workers(client, reference):
    def reduction(acc, values, indices):
        return acc + np.sum(values[:, -1, :], axis=0), False

    def combine(a, b):
        return a + b

    eprob = _eprob(reduction=reduction, combine=combine, u_init=np.zeros(3))
    sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=N, batch_size=5, **SOLVE)
    np.testing.assert_allclose(sim.u, reference.u[:, -1, :].sum(axis=0), rtol=1e-12)
    assert sim.converged is None and len(sim) == N
    assert sim.retcodes is None and sim.success  # counted on the workers, not kept per trajectory
    assert sim.stats.total_steps == reference.stats.total_steps
    again = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=N, batch_size=5, **SOLVE)
    np.testing.assert_array_equal(again.u, sim.u)  # a fixed tree: the same bits every time


def test_reduction_on_the_driver_stops_early(client):
    def reduction(acc, values, indices):
        return acc + len(indices), acc + len(indices) >= 16

    sim = dxode.solve(
        _eprob(reduction=reduction, u_init=0),
        dxode.Tsit5(),
        client,
        trajectories=N,
        batch_size=4,
        **SOLVE,
    )
    assert sim.converged is True and sim.u == 16 and len(sim) == 16


def _suicidal_prob_func(marker):
    def prob_func(prob, i, repeat):
        if i == 37 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the worker process dies mid-ensemble
        return prob.remake(p=tuple(_params()[i]))

    return prob_func


@pytest.mark.slow
def test_a_dying_worker_loses_nothing(tmp_path, reference):
    eprob = EnsembleProblem(_eprob().prob, prob_func=_suicidal_prob_func(str(tmp_path / "died")))
    with (
        dxode.local_cluster(n_workers=2) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        sim = dxode.solve(eprob, dxode.Tsit5(), c, trajectories=N, batch_size=4, **SOLVE)
    assert (tmp_path / "died").exists()
    np.testing.assert_array_equal(sim.u, reference.u)
    assert sim.success


def test_failing_trajectories_keep_their_retcodes(client):
    params = _params()
    params[3, 0] = 1e300
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 3.0), P0)
    sim = dxode.solve(
        EnsembleProblem(prob, p=params),
        dxode.Tsit5(),
        client,
        trajectories=N,
        batch_size=8,
        **SOLVE,
    )
    assert not dxode.ReturnCode(int(sim.retcodes[3])).successful
    assert np.sum(sim.retcodes != 0) == 1


def test_progress_bar(client, capsys):
    dxode.solve(
        _eprob(),
        dxode.Tsit5(),
        EnsembleDask(client, progress=True),
        trajectories=N,
        batch_size=16,
        **SOLVE,
    )
    assert "dxode batches" in capsys.readouterr().err


def test_tls_secured_cluster(reference):
    security = distributed.Security.temporary()
    with (
        dxode.local_cluster(n_workers=1, security=security, protocol="tls") as cluster,
        distributed.Client(cluster, security=security, set_as_default=False) as c,
    ):
        assert c.scheduler.address.startswith("tls://")
        sim = dxode.solve(_eprob(), dxode.Tsit5(), c, trajectories=N, batch_size=32, **SOLVE)
    np.testing.assert_array_equal(sim.u, reference.u)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_the_dashboard_listens_on_this_machine_only(tls):
    import ipaddress

    import psutil

    kwargs = {"security": distributed.Security.temporary(), "protocol": "tls"} if tls else {}
    with dxode.local_cluster(n_workers=1, **kwargs) as cluster:
        port = cluster.scheduler.http_server.port
        bound = [
            c.laddr.ip
            for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
    assert bound and all(ipaddress.ip_address(ip).is_loopback for ip in bound), bound


def test_bad_dask_options():
    with pytest.raises(ValueError, match="output must be"):
        EnsembleDask(output="disk")
    # These were taken, and failed inside the solve (batch_size=0 in range(), a string
    # client in Dask) or not at all (progress="no" showed a bar).
    with pytest.raises(ValueError, match="batch_size must be a positive integer or None"):
        EnsembleDask(batch_size=0)
    with pytest.raises(TypeError, match=r"pass distributed.Client\('tcp://host:8786'\)"):
        EnsembleDask("tcp://host:8786")
    with pytest.raises(ValueError, match="backend must be 'numpy', 'cupy' or None"):
        EnsembleDask(backend="torch")
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        EnsembleDask(progress="no")
    with pytest.raises(ValueError, match="needs store"):
        EnsembleDask(output="zarr")
    with pytest.raises(ValueError, match="combine merges reduction"):
        _eprob(combine=lambda a, b: a)


def _batch_sizes(acc, values, indices):
    return [*acc, len(indices)], False


def test_batch_size_given_to_solve_and_to_ensemble_dask_must_agree(client):
    # solve's won silently: a reduction folded batches of 3 where EnsembleDask said 2.
    eprob = _eprob(reduction=_batch_sizes, u_init=[])
    sim = dxode.solve(eprob, dxode.Tsit5(), EnsembleDask(client, batch_size=2), trajectories=5)
    assert sim.u == [2, 2, 1]
    same = dxode.solve(
        eprob, dxode.Tsit5(), EnsembleDask(client, batch_size=2), trajectories=5, batch_size=2
    )
    assert same.u == [2, 2, 1]
    with pytest.raises(ValueError, match=r"batch_size=3 for solve but EnsembleDask\(batch_size=2"):
        dxode.solve(
            eprob, dxode.Tsit5(), EnsembleDask(client, batch_size=2), trajectories=5, batch_size=3
        )


def test_cuda_cluster_errors_are_clear():
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="dask-cuda"):
            dxode.local_cluster(gpus=True)
    else:  # pragma: no cover - only where dask-cuda is installed
        if not dxode.backends.cupy_available():
            with pytest.raises(RuntimeError, match="no usable NVIDIA GPU"):
                dxode.local_cluster(gpus=True)


def _diffeqflux_loss(ensemble_alg):
    """DiffEqFlux's data-parallel tutorial: du/dt = 1.01 u p, u0_i = 0.5 + i/100 theta[0]."""
    import autograd.numpy as anp

    def loss(theta, iteration=0):
        prob = dxode.ODEProblem(lambda u, p, t: 1.01 * u * p[0], [theta[0]], (0.0, 1.0), [theta[1]])
        eprob = EnsembleProblem(
            prob, prob_func=lambda prob, i, repeat: prob.remake(u0=[0.5 + (i + 1) / 100 * theta[0]])
        )
        sim = dxode.solve(
            eprob, dxode.Tsit5(), ensemble_alg, trajectories=100, batch_size=25, saveat=0.1
        )
        return anp.sum((1.0 - sim.u) ** 2)

    return loss


def test_gradients_across_workers_match_a_single_process(client):
    import autograd
    from autograd.misc.optimizers import adam

    histories = {}
    for name, alg in [
        ("array", dxode.EnsembleArray()),
        ("dask", EnsembleDask(client)),
        ("serial", dxode.EnsembleSerial()),
    ]:
        loss = _diffeqflux_loss(alg)
        history = []
        adam(
            autograd.grad(loss),
            np.array([3.0, 1.0]),
            step_size=0.1,
            num_iters=5,
            callback=lambda theta, i, g, loss=loss, history=history: history.append(loss(theta)),
        )
        histories[name] = history
    assert histories["dask"] == histories["array"]  # the same batches, bit for bit
    # Serially, the shared parameter's cotangent is summed in another order (last bits).
    np.testing.assert_allclose(histories["serial"], histories["array"], rtol=1e-12)
    assert histories["array"][-1] < histories["array"][0]


def test_dxode_workers_keep_the_default_malloc_trimming_and_do_not_profile(client):
    # Dask's default MALLOC_TRIM_THRESHOLD_=65536 makes batches several times slower, its
    # statistical profiler about a quarter slower.
    env = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert set(env.values()) == {None}

    def profiling():
        import dask

        return dask.config.get("distributed.worker.profile.enabled")

    assert set(client.run(profiling).values()) == {False}
    import dask

    with dask.config.set(dxode.worker_config()):
        assert "MALLOC_TRIM_THRESHOLD_" not in dask.config.get(
            "distributed.nanny.pre-spawn-environ"
        )


def _malloc_trim_and_profiling():
    import dask

    enabled = dask.config.get("distributed.worker.profile.enabled")
    return os.environ.get("MALLOC_TRIM_THRESHOLD_"), enabled


def test_workers_added_by_scaling_up_get_dxode_s_settings_too():
    # Dask's nanny reads them when it builds and starts its worker, after local_cluster
    # returned for those cluster.scale adds: they ran with Dask's defaults (trimming at
    # 64 KiB, profiling on).
    with (
        dxode.local_cluster(n_workers=1) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        cluster.scale(2)
        c.wait_for_workers(2, timeout=120)
        assert list(c.run(_malloc_trim_and_profiling).values()) == [(None, False)] * 2


@pytest.mark.parametrize(
    "sensealg",
    [dxode.InterpolatingAdjoint(), dxode.ForwardSensitivity(), dxode.DiscreteAdjoint(2)],
    ids=repr,
)
def test_every_sensealg_runs_its_batches_on_the_workers(client, sensealg):
    import autograd
    import autograd.numpy as anp

    def loss_with(ensemble_alg):
        def loss(theta):
            prob = dxode.ODEProblem(
                lambda u, p, t: 1.01 * u * p[0], [theta[0]], (0.0, 1.0), [theta[1]]
            )
            eprob = EnsembleProblem(
                prob, prob_func=lambda prob, i, repeat: prob.remake(u0=[0.5 + i / 10 * theta[0]])
            )
            sim = dxode.solve(
                eprob, ensemble_alg, trajectories=10, batch_size=4, saveat=0.25, sensealg=sensealg
            )
            return anp.sum((1.0 - sim.u) ** 2)

        return loss

    theta = np.array([3.0, 1.0])
    on_workers = autograd.grad(loss_with(EnsembleDask(client)))(theta)
    here = autograd.grad(loss_with(dxode.EnsembleArray()))(theta)
    np.testing.assert_array_equal(on_workers, here)  # the same batches, bit for bit


def test_gradients_on_another_backend_run_on_the_workers(client):
    import array_api_strict as xps
    import autograd
    import autograd.numpy as anp

    from problems import lorenz_xp, lorenz_xp_vjp

    scale = 1 + 0.1 * (np.random.default_rng(1).random((20, 3)) - 0.5)

    def loss_with(ensemble_alg):
        def loss(theta):
            u0 = xps.asarray([1.0, 0.0, 0.0])
            prob = dxode.ODEProblem(lorenz_xp, u0, (0.0, 1.0), P0, vjp=lorenz_xp_vjp)
            eprob = EnsembleProblem(prob, p=theta[None, :] * scale)
            sim = dxode.solve(
                eprob, dxode.Tsit5(), ensemble_alg, trajectories=20, batch_size=7, saveat=0.5
            )
            return anp.sum(sim.u**2)

        return loss

    theta = np.array(P0)
    on_workers = autograd.grad(loss_with(EnsembleDask(client)))(theta)
    np.testing.assert_array_equal(on_workers, autograd.grad(loss_with(None))(theta))


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Vern7(), dxode.Rodas5P()])
def test_a_solve_submitted_to_a_worker_comes_back_with_its_dense_output(client, alg):
    # The solution travels back pickled: its backend's thread-local scratch space and the
    # method's coefficient cache (keyed by modules) had made that fail.
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), P0)
    here = dxode.solve(prob, alg, rtol=1e-8, atol=1e-8)
    there = client.submit(dxode.solve, prob, alg, rtol=1e-8, atol=1e-8, pure=False).result()
    assert there.retcode == dxode.ReturnCode.Success
    np.testing.assert_array_equal(np.asarray(there.u), np.asarray(here.u))
    np.testing.assert_array_equal(there([0.25, 0.5]), here([0.25, 0.5]))
    solved_again = dxode.solve(prob, there.alg, rtol=1e-8, atol=1e-8)  # its method still runs
    np.testing.assert_array_equal(np.asarray(solved_again.u), np.asarray(here.u))


def test_batches_run_in_batch_order_so_results_stream_back_while_later_ones_run():
    # The driver folds results in batch order; a batch 0 that ran last held every result back
    # until the end (Dask ran 8 batches as 4, 5, 3, 7, 2, 6, 1, 0 without priorities).
    with (
        dxode.local_cluster(n_workers=1) as cluster,
        distributed.Client(cluster, set_as_default=False) as one,
        distributed.get_task_stream(one) as stream,
    ):
        dxode.solve(_eprob(), dxode.Tsit5(), one, trajectories=N, batch_size=8, **SOLVE)
    starts = {
        int(task["key"].rsplit("-", 1)[1]): task["startstops"][0]["start"]
        for task in stream.data
        if task["key"].startswith("dxode-batch-")
    }
    assert len(starts) == N // 8
    assert sorted(starts, key=starts.get) == list(range(N // 8))


def test_a_local_cluster_s_results_come_from_its_workers_not_through_the_scheduler(client):
    from dxode.ensemble.dask_ensemble import _gathers_directly

    assert _gathers_directly(client) is True  # the in-process LocalCluster's workers
    with distributed.Client(client.scheduler.address, set_as_default=False) as by_address:
        assert _gathers_directly(by_address) is None  # maybe reachable only via the scheduler
    with distributed.Client(
        client.scheduler.address, set_as_default=False, direct_to_workers=False
    ) as relayed:
        assert _gathers_directly(relayed) is False  # the user's choice stands
