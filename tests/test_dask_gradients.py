"""Differentiated EnsembleDask solves on a real LocalCluster of worker processes: both passes
run through EnsembleDask's one scheduling primitive (keyed tasks, retries, progress bar), and
give the local gradient bit for bit."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
autograd = pytest.importorskip("autograd")

import autograd.numpy as anp  # noqa: E402

import dxode  # noqa: E402
from dxode import EnsembleDask, EnsembleProblem  # noqa: E402

from problems import lorenz, lorenz_vjp  # noqa: E402

P0 = np.array([10.0, 28.0, 8.0 / 3.0])
TRAJECTORIES, BATCH = 8, 2
SOLVE = {"saveat": [0.5, 1.0], "rtol": 1e-6, "atol": 1e-6}


class BoomError(Exception):
    """A passing failure of a backward task."""


def _loss(ealg, vjp=lorenz_vjp, batch_size=None):
    def loss(theta):
        prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 1.0), theta, vjp=vjp)

        def prob_func(prob, i, repeat):
            return prob.remake(u0=anp.array([1.0 + 0.1 * i, 0.0, 0.0]))

        eprob = EnsembleProblem(prob, prob_func=prob_func)
        sim = dxode.solve(
            eprob, dxode.Tsit5(), ealg, trajectories=TRAJECTORIES, batch_size=batch_size, **SOLVE
        )
        return anp.sum(sim.u**2)

    return loss


@pytest.fixture(scope="module")
def local_gradient():
    # The same batches: each sums its lanes' shared-parameter cotangents, the driver the
    # batches' in batch order (other batch sizes agree to rounding, not bit for bit).
    return autograd.grad(_loss(dxode.EnsembleArray(), batch_size=BATCH))(P0)


def test_both_passes_run_as_keyed_tasks_and_match_the_local_gradient(client, local_gradient):
    alg = EnsembleDask(client, batch_size=BATCH)
    with distributed.get_task_stream(client=client) as stream:
        gradient = autograd.grad(_loss(alg))(P0)
    np.testing.assert_array_equal(gradient, local_gradient)
    keys = [str(task["key"]) for task in stream.data]
    batches = TRAJECTORIES // BATCH
    for label in ("forward", "backward"):
        ours = [k for k in keys if re.fullmatch(rf"dxode-{label}-[0-9a-f]{{12}}-\d+", k)]
        assert len(ours) == batches, keys


def test_a_gradient_shows_the_progress_bar(client, capsys):
    autograd.grad(_loss(EnsembleDask(client, batch_size=BATCH, progress=True)))(P0)
    # One bar for the forward pass, one for the backward pass.
    assert capsys.readouterr().err.count("dxode batches") >= 2


def _failing_once(marker):
    """Lorenz's VJP (called in backward passes only), raising the first time anywhere."""

    def vjp(u, p, t, v):
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise BoomError("a passing failure")
        return lorenz_vjp(u, p, t, v)

    return vjp


def test_a_backward_task_that_fails_once_is_retried(client, tmp_path, local_gradient):
    marker = str(tmp_path / "failed")
    alg = EnsembleDask(client, batch_size=BATCH)
    gradient = autograd.grad(_loss(alg, _failing_once(marker)))(P0)
    assert os.path.exists(marker)
    np.testing.assert_array_equal(gradient, local_gradient)


def _killing_once(marker):
    """Lorenz's VJP, killing the worker it runs on the first time anywhere: that worker's
    forward records are lost with it."""

    def vjp(u, p, t, v):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return lorenz_vjp(u, p, t, v)

    return vjp


@pytest.mark.slow
def test_a_worker_killed_in_the_backward_pass_loses_nothing(tmp_path, local_gradient):
    marker = str(tmp_path / "killed")
    with (
        dxode.local_cluster(n_workers=2) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        alg = EnsembleDask(c, batch_size=BATCH)
        gradient = autograd.grad(_loss(alg, _killing_once(marker)))(P0)
    assert os.path.exists(marker)
    np.testing.assert_array_equal(gradient, local_gradient)


def test_a_failed_gradient_releases_its_tasks(client):
    def failing(u, p, t, v):
        raise BoomError("always")

    def backward_tasks():
        tasks = client.run_on_scheduler(
            lambda dask_scheduler: {k: ts.state for k, ts in dask_scheduler.tasks.items()}
        )
        return {k: state for k, state in tasks.items() if str(k).startswith("dxode-backward")}

    def backward_keys():
        return set(backward_tasks())

    before = backward_keys()
    with pytest.raises(BoomError) as raised:
        autograd.grad(_loss(EnsembleDask(client, batch_size=BATCH), failing))(P0)
    assert any("of an EnsembleDask solve" in note for note in raised.value.__notes__)
    # Every task is cancelled before the error arrives: none is left queued, running or
    # holding a result. Erred ones may stay while the caller holds the exception: its
    # traceback's frames hold their Futures (and Dask keeps an erred task a live Future
    # refers to). Dropping the exception releases them (a message: allow a moment).
    left = {k: state for k, state in backward_tasks().items() if k not in before}
    assert set(left.values()) <= {"erred"}, left
    del raised
    gc.collect()
    deadline = time.monotonic() + 10.0
    while backward_keys() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not backward_keys() - before


def test_a_differentiated_dask_solve_without_distributed_names_the_extra():
    script = """
import sys
sys.modules["distributed"] = None
import autograd, autograd.numpy as anp, numpy as np, dxode
prob = dxode.ODEProblem(lambda u, p, t: -p * u, np.array([1.0]), (0.0, 1.0), 0.5)
def loss(k):
    eprob = dxode.EnsembleProblem(prob, p=k * anp.linspace(0.5, 1.5, 4))
    return anp.sum(dxode.solve(eprob, dxode.Tsit5(), dxode.EnsembleDask(), saveat=[1.0]).u)
try:
    autograd.grad(loss)(1.0)
except ImportError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert 'pip install "dxode[dask]"' in out.stdout, out.stdout + out.stderr
