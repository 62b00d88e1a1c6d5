"""Events through EnsembleDask on a real LocalCluster: the same results and event records."""

from __future__ import annotations

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from test_events import above_two, ball_ensemble, bounce, dose, growth, height  # noqa: E402

import dxode  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with (
        dxode.local_cluster(n_workers=2, threads_per_worker=1) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        yield c


def test_dask_events_equal_local_events(client):
    n = 9
    eprob, _ = ball_ensemble(n)
    cbs = dxode.CallbackSet(
        dxode.ContinuousCallback(height, bounce, direction="down"),
        dxode.PresetTimeCallback([0.7], dose),
    )
    kw = {"callback": cbs, "saveat": np.linspace(0.0, 3.0, 7), "rtol": 1e-6}
    local = dxode.solve(eprob, dxode.Tsit5(), trajectories=n, **kw)
    sim = dxode.solve(
        eprob, dxode.Tsit5(), dxode.EnsembleDask(client, batch_size=4), trajectories=n, **kw
    )
    np.testing.assert_array_equal(sim.u, local.u)
    for name in ("t", "callback", "trajectory", "u_before", "u_after"):
        np.testing.assert_array_equal(getattr(sim.events, name), getattr(local.events, name))
    assert set(sim.events.trajectory.tolist()) == set(range(n))


def test_dask_termination_per_lane(client):
    rates = np.linspace(0.1, 2.0, 6)
    prob = dxode.ODEProblem(growth, np.array([1.0]), (0.0, 1.0), np.array([1.0]))
    eprob = dxode.EnsembleProblem(prob, p=rates[:, None])
    cb = dxode.ContinuousCallback(above_two, terminate=True)
    sim = dxode.solve(
        eprob,
        dxode.Tsit5(),
        dxode.EnsembleDask(client, batch_size=2),
        trajectories=6,
        callback=cb,
        rtol=1e-8,
    )
    stops = rates > np.log(2)
    assert (sim.retcodes == dxode.ReturnCode.Terminated).tolist() == stops.tolist()
    np.testing.assert_allclose(sim.events.t, np.log(2) / rates[stops], rtol=1e-6)
