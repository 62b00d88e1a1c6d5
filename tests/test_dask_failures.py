"""EnsembleDask when things go wrong, on real LocalClusters of worker processes: a failed solve
leaves nothing running or pinned, dying workers lose nothing, and errors name their batch."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import uuid

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import dxode  # noqa: E402
from dxode import EnsembleDask, EnsembleProblem  # noqa: E402

from problems import lorenz  # noqa: E402

P0 = (10.0, 28.0, 8.0 / 3.0)
SOLVE = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}
BATCH = 4
BAD = 37  # in batch 9: trajectories 36-39


class BoomError(Exception):
    """A user's own exception type, which must arrive as itself."""


def _prob():
    return dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 3.0), P0)


def _p(i):
    rng = np.random.default_rng(i)
    return tuple(np.array(P0) * (1 + 0.1 * (rng.random(3) - 0.5)))


def _varied(prob, i, repeat):
    return prob.remake(p=_p(i))


def _scheduler_keys(client):
    return set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)))


def _eventually(condition, timeout=5.0):
    """Poll ``condition`` (releases on the scheduler are asynchronous) until true or timeout."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def _recording_prob_func(starts):
    """A prob_func that records every batch start, takes a while per batch, and raises for
    trajectory BAD (batch 9 of 100)."""

    def prob_func(prob, i, repeat):
        if i % BATCH == 0:
            open(os.path.join(starts, f"{i}-{uuid.uuid4().hex}"), "w").close()
            time.sleep(0.05)
        if i == BAD:
            raise BoomError(f"no parameters for trajectory {i}")
        return _varied(prob, i, repeat)

    return prob_func


def _chunk_files(store):
    return sum(len(files) for _, _, files in os.walk(os.path.join(store, "u")))


def _sum_last(acc, values, indices):
    return acc + values[:, -1, :].sum(axis=0), False


def _add(a, b):
    return a + b


@pytest.mark.parametrize("output", ["memory", "dask", "zarr", "tree reduction"])
def test_a_failed_solve_stops_its_batches_and_releases_everything(client, tmp_path, output):
    starts = tmp_path / "starts"
    starts.mkdir()
    store = str(tmp_path / "ensemble.zarr")
    before = _scheduler_keys(client)
    reduced = {"reduction": _sum_last, "combine": _add, "u_init": np.zeros(3)}
    eprob = EnsembleProblem(
        _prob(),
        prob_func=_recording_prob_func(str(starts)),
        **(reduced if output == "tree reduction" else {}),
    )
    alg = EnsembleDask(
        client,
        output="memory" if output == "tree reduction" else output,
        store=store if output == "zarr" else None,
    )
    with pytest.raises(BoomError) as raised:
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=400, batch_size=BATCH, **SOLVE)
    started = len(os.listdir(starts))
    chunks = _chunk_files(store) if output == "zarr" else 0
    # The error (kept alive here, as a debugger or notebook keeps it) pins nothing of the
    # solve on the cluster: neither the problem nor any batch result.
    assert _eventually(lambda: not _scheduler_keys(client) - before), (
        _scheduler_keys(client) - before
    )
    time.sleep(0.5)
    # No batch started after solve() raised. (Usually about 20 of the 100 batches have run
    # then; not asserted, since Dask may run a failed batch's retries after the queue.)
    assert len(os.listdir(starts)) == started
    if output == "zarr":
        assert _chunk_files(store) == chunks  # and none wrote a chunk afterwards
    assert "raised by prob_func for trajectory 37" in raised.value.__notes__


def _slow_but_batch_one(prob, i, repeat):
    """Every batch takes half a second but batch 1, which fails at once."""
    if i == BATCH:
        raise BoomError("batch 1 fails")
    if i % BATCH == 0:
        time.sleep(0.5)
    return _varied(prob, i, repeat)


def _executing(dask_worker):
    return len(dask_worker.state.executing)


def test_a_failed_solve_raises_once_none_of_its_batches_runs(client, tmp_path):
    store = str(tmp_path / "ensemble.zarr")
    eprob = EnsembleProblem(_prob(), prob_func=_slow_but_batch_one)
    alg = EnsembleDask(client, output="zarr", store=store)
    with pytest.raises(BoomError):
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=32, batch_size=BATCH, **SOLVE)
    # Batch 1 failed while another worker was in the middle of a batch: solve() waited for
    # it (Dask cannot interrupt a running task), so nothing runs or writes any more.
    assert set(client.run(_executing).values()) == {0}
    chunks = _chunk_files(store)
    time.sleep(0.5)
    assert _chunk_files(store) == chunks


def _raise_in(where):
    """EnsembleProblem keyword arguments whose ``where`` function raises for trajectory BAD."""
    if where == "prob_func":

        def prob_func(prob, i, repeat):
            if i == BAD:
                raise BoomError("bad trajectory")
            return _varied(prob, i, repeat)

        return {"prob_func": prob_func}
    if where == "batch_func":

        def batch_func(prob, ctx):
            if BAD in ctx.indices:
                raise BoomError("bad batch")
            return {"p": np.array([_p(int(i)) for i in ctx.indices])}

        return {"batch_func": batch_func}

    def output_func(sol, i):
        if i == BAD:
            raise BoomError("bad output")
        return sol.u[-1], False

    return {"output_func": output_func}


@pytest.mark.parametrize(
    ("where", "trajectory_note"),
    [
        ("prob_func", "raised by prob_func for trajectory 37"),
        ("batch_func", "raised by batch_func for trajectories 36-39"),
        ("output_func", "raised by output_func for trajectory 37"),
    ],
)
def test_an_error_on_a_worker_names_its_trajectory_and_batch(client, where, trajectory_note):
    eprob = EnsembleProblem(_prob(), **_raise_in(where))
    with pytest.raises(BoomError) as raised:
        dxode.solve(eprob, dxode.Tsit5(), client, trajectories=64, batch_size=BATCH, **SOLVE)
    assert raised.value.__notes__ == [
        trajectory_note,
        "in batch 9 (trajectories 36-39) of an EnsembleDask solve",
    ]


def _failing_combine(a, b):
    raise BoomError("cannot merge")


def test_an_error_in_combine_says_so(client):
    # It arrived with no note at all, not even that it came from an EnsembleDask solve.
    reduced = {"reduction": _sum_last, "u_init": np.zeros(3), "combine": _failing_combine}
    eprob = EnsembleProblem(_prob(), prob_func=_varied, **reduced)
    with pytest.raises(BoomError) as raised:
        dxode.solve(eprob, dxode.Tsit5(), client, trajectories=8, batch_size=BATCH, **SOLVE)
    assert raised.value.__notes__ == [
        "raised by combine, merging batches' reductions on the workers of an EnsembleDask solve"
    ]
    assert _eventually(lambda: not any(client.has_what().values()))


def _killing_prob_func(marker, pids):
    """At trajectory BAD, once: kill every worker process at the same moment."""

    def prob_func(prob, i, repeat):
        if i == BAD and not os.path.exists(marker):
            open(marker, "w").close()
            with open(pids) as f:
                for pid in f.read().split():
                    if int(pid) != os.getpid():
                        os.kill(int(pid), signal.SIGKILL)
            os._exit(1)
        return _varied(prob, i, repeat)

    return prob_func


@pytest.mark.slow
def test_the_problem_is_recomputed_when_every_worker_holding_it_dies(tmp_path):
    marker, pids = str(tmp_path / "killed"), tmp_path / "pids"
    eprob = EnsembleProblem(_prob(), prob_func=_killing_prob_func(marker, str(pids)))
    reference = dxode.solve(
        EnsembleProblem(_prob(), prob_func=_varied), dxode.Tsit5(), trajectories=64, **SOLVE
    )
    with (
        dxode.local_cluster(n_workers=2) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        killed = set(c.run(os.getpid).values())
        pids.write_text(" ".join(str(pid) for pid in killed))
        sim = dxode.solve(eprob, dxode.Tsit5(), c, trajectories=64, batch_size=BATCH, **SOLVE)
        assert killed.isdisjoint(c.run(os.getpid).values())  # all restarted by their nannies
    assert os.path.exists(marker)
    np.testing.assert_array_equal(sim.u, reference.u)
    np.testing.assert_array_equal(sim.stats.nf, reference.stats.nf)


def _always_killing_prob_func(prob, i, repeat):
    if i == BAD:
        os._exit(1)
    return _varied(prob, i, repeat)


@pytest.mark.slow
def test_a_batch_that_kills_every_worker_it_runs_on_is_named():
    import dask

    # Give up after the second death (default: the fourth), and send each worker one task
    # at a time, so that the deaths count against the killing batch alone.
    config = {
        "distributed.scheduler.allowed-failures": 1,
        "distributed.scheduler.worker-saturation": 1.0,
    }
    eprob = EnsembleProblem(_prob(), prob_func=_always_killing_prob_func)
    with (
        dask.config.set(config),
        dxode.local_cluster(n_workers=2) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
        pytest.raises(distributed.KilledWorker) as raised,
    ):
        dxode.solve(eprob, dxode.Tsit5(), c, trajectories=64, batch_size=BATCH, **SOLVE)
    assert raised.value.__notes__ == ["in batch 9 (trajectories 36-39) of an EnsembleDask solve"]


def _decay_first_rate(u, p, t):
    return -p[0] * u


def test_a_large_problem_travels_once_without_a_large_graph_warning(client):
    # 13 MB of per-trajectory parameters: Dask warns about graphs over 10 MB, but the
    # problem is sent through the scheduler once on purpose (so that it can be recomputed).
    rates = np.linspace(1.0, 2.0, 16)
    p = np.repeat(rates[:, None], 100_000, axis=1)
    prob = dxode.ODEProblem(_decay_first_rate, [1.0], (0.0, 1.0), p[0])
    eprob = EnsembleProblem(prob, p=p)
    sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=16, batch_size=BATCH)
    local = dxode.solve(eprob, dxode.Tsit5(), trajectories=16, batch_size=BATCH)
    np.testing.assert_array_equal(sim.u, local.u)


def test_a_problem_that_does_not_pickle_is_named_with_its_part(client):
    # Dask said only "Could not serialize object of type LLGExpr" about its own graph.
    lock = threading.Lock()

    def holding_a_lock(u, p, t):
        with lock:
            return lorenz(u, p, t)

    prob = dxode.ODEProblem(holding_a_lock, [1.0, 0.0, 0.0], (0.0, 3.0), P0)
    with pytest.raises(TypeError, match=r"its prob\.f cannot be pickled \(cannot pickle '_thr"):
        dxode.solve(EnsembleProblem(prob), dxode.Tsit5(), client, trajectories=2)
    numbers = (x for x in range(2))
    eprob = EnsembleProblem(_prob(), output_func=lambda sol, i, numbers=numbers: (i, False))
    with pytest.raises(TypeError, match=r"its output_func cannot be pickled .*generator"):
        dxode.solve(eprob, dxode.Tsit5(), client, trajectories=2)
    # The cluster is usable afterwards.
    assert len(dxode.solve(EnsembleProblem(_prob()), client, trajectories=2, **SOLVE)) == 2


def _slow_second_trajectory(started, prob, i, repeat):
    """Trajectory 1 (on a worker) says it has started, then takes two seconds."""
    if i == 1:
        started.touch()
        time.sleep(2.0)
    return prob


def test_a_client_closed_during_the_solve_is_named(client, tmp_path):
    # The solve raised Dask's "FutureCancelledError: ... cancelled for reason: unknown",
    # noted as if batch 1 had failed, and a second note that cancelling failed.
    started = tmp_path / "started"
    eprob = EnsembleProblem(_prob(), prob_func=functools.partial(_slow_second_trajectory, started))
    with distributed.Client(client.scheduler.address, set_as_default=False) as own:

        def close_once_batch_1_runs():
            _eventually(started.exists, timeout=60)
            own.close()

        closer = threading.Thread(target=close_once_batch_1_runs)
        closer.start()
        try:
            with pytest.raises(RuntimeError, match="client was closed during the solve") as err:
                dxode.solve(eprob, dxode.Tsit5(), own, trajectories=2, batch_size=1, **SOLVE)
        finally:
            closer.join()
    assert not getattr(err.value, "__notes__", None)
