"""A real single-node SLURM cluster on localhost: plain batch jobs, and Dask workers as jobs.

The cluster (``tests/slurm_cluster.py``) is started and stopped by these tests themselves:
its own munged, slurmctld and slurmd, stopped by pid. Needs root and ``.ci/install-slurm.sh``;
elsewhere the tests skip with the reason, unless ``DXODE_REQUIRE_SLURM=1`` (set it in CI),
which turns that skip into a failure.
"""

from __future__ import annotations

import gc
import os
import subprocess
import time
import warnings

import pytest
from slurm_cluster import local_slurm, slurm_unavailable_reason

# One cluster for the module: its tests stay on one xdist worker.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

_UNFINISHED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = slurm_unavailable_reason()
    if reason is not None:
        if os.environ.get("DXODE_REQUIRE_SLURM") == "1":
            pytest.fail(f"DXODE_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    with local_slurm(tmp_path_factory.mktemp("slurm")) as info:
        yield info


def _queue(slurm) -> list[tuple[str, str, str]]:
    """(job id, name, state) of every job SLURM still lists."""
    out = slurm.run("squeue", "-h", "-o", "%i %j %T").stdout
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]


def _wait_queue_empty(slurm, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    while (jobs := _queue(slurm)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return jobs


def _job_record(slurm, job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (kept MinJobAge=60 s after the job ends)."""
    out = slurm.run("scontrol", "show", "job", "--oneliner", job_id).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def test_sbatch_runs_a_job_to_completion(slurm, tmp_path):
    out = tmp_path / "hostname.out"
    r = slurm.run(
        "sbatch",
        "--parsable",
        f"--partition={slurm.partition}",
        f"--chdir={tmp_path}",
        f"--output={out}",
        "--time=00:01:00",
        "--wrap",
        "hostname",
    )
    job_id = r.stdout.strip().split(";")[0]
    assert job_id.isdigit(), r.stdout
    # Poll ourselves: ``sbatch --wait`` polls at up to 10 s intervals.
    deadline = time.monotonic() + 60
    while (record := _job_record(slurm, job_id))["JobState"] in _UNFINISHED:
        assert time.monotonic() < deadline, (record, slurm.logs())
        time.sleep(0.1)
    assert record["JobState"] == "COMPLETED", (record, slurm.logs())
    assert record["ExitCode"] == "0:0", record
    assert record["NodeList"] == slurm.node
    expected = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout
    assert out.read_text().strip() == expected.strip(), slurm.logs()
    assert job_id not in {j[0] for j in _wait_queue_empty(slurm)}


def test_dask_jobqueue_workers_are_slurm_jobs(slurm, tmp_path):
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (extra 'hpc')")
    from dask.distributed import Client
    from dask_jobqueue import SLURMCluster

    n_jobs = max(1, min(2, slurm.cores))  # CR_Core: a 1-core job holds a whole core
    with (
        SLURMCluster(
            queue=slurm.partition,
            cores=1,
            processes=1,
            memory="1GB",
            walltime="00:10:00",
            job_name="dxode-dask",
            interface="lo",  # scheduler and workers listen on 127.0.0.1 only
            scheduler_options={"dashboard_address": "127.0.0.1:0"},
            worker_extra_args=["--no-dashboard"],
            local_directory=str(tmp_path / "worker-space"),
            log_directory=str(tmp_path / "logs"),
            death_timeout=30,
        ) as cluster,
        Client(cluster) as client,
    ):
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        cluster.scale(jobs=n_jobs)
        try:
            client.wait_for_workers(n_jobs, timeout=120)
        except TimeoutError:
            pytest.fail(
                f"workers did not join; queue={_queue(slurm)}\n{cluster.job_script()}\n"
                + slurm.logs()
            )

        futures = client.map(lambda x: x**2, range(10))
        assert client.gather(futures) == [x**2 for x in range(10)]

        # Each worker runs inside a SLURM job of ours, and SLURM lists those jobs as running.
        job_ids = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
        assert len(job_ids) == n_jobs
        assert all(v is not None for v in job_ids.values()), job_ids
        running = {j[0]: j for j in _queue(slurm) if j[2] == "RUNNING"}
        assert set(job_ids.values()) <= set(running), (job_ids, running)
        assert {running[i][1] for i in job_ids.values()} == {"dxode-dask"}
        assert {str(job.job_id) for job in cluster.workers.values()} == set(job_ids.values())
        assert all(
            addr.startswith("tcp://127.0.0.1:") for addr in client.scheduler_info()["workers"]
        )

    # Closing the cluster cancels its jobs.
    assert _wait_queue_empty(slurm) == []


def test_dxode_ensemble_on_slurm_workers(slurm, tmp_path):
    """The documented HPC recipe: dxode's EnsembleDask on dask-jobqueue workers (SLURM jobs)."""
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (extra 'hpc')")
    import numpy as np
    from dask.distributed import Client
    from dask_jobqueue import SLURMCluster

    import dxode

    def lorenz(u, p, t):
        x, y, z = u
        sigma, rho, beta = p
        return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]

    rng = np.random.default_rng(0)
    params = np.array([10.0, 28.0, 8 / 3]) * (1 + 0.1 * (rng.random((200, 3)) - 0.5))
    prob = dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], (0.0, 2.0), (10.0, 28.0, 8 / 3))
    eprob = dxode.EnsembleProblem(prob, p=params)
    options = {"saveat": 0.5, "rtol": 1e-6, "atol": 1e-6}
    reference = dxode.solve(eprob, dxode.Tsit5(), trajectories=200, **options)

    import dask

    n_jobs = max(1, min(2, slurm.cores))
    with (
        dask.config.set(dxode.worker_config()),
        SLURMCluster(
            queue=slurm.partition,
            cores=1,
            processes=1,
            memory="1GB",
            walltime="00:10:00",  # the job's time limit ...
            # ... and a worker lifetime inside it, so work moves off before the limit hits.
            worker_extra_args=["--no-dashboard", "--lifetime", "9m", "--lifetime-stagger", "30s"],
            job_name="dxode-ensemble",
            interface="lo",
            scheduler_options={"dashboard_address": "127.0.0.1:0"},
            local_directory=str(tmp_path / "worker-space"),
            log_directory=str(tmp_path / "logs"),
            death_timeout=30,
        ) as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(jobs=n_jobs)
        client.wait_for_workers(n_jobs, timeout=120)
        sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=200, batch_size=25, **options)
        assert all(
            v is not None for v in client.run(lambda: os.environ.get("SLURM_JOB_ID")).values()
        )
    np.testing.assert_array_equal(sim.u, reference.u)
    assert _wait_queue_empty(slurm) == []


def _slurm_config(slurm, tmp_path) -> dict[str, object]:
    """Dask's ``jobqueue.slurm`` settings for one-core worker jobs on the test cluster."""
    settings = {
        "queue": slurm.partition,
        "cores": 1,
        "processes": 1,
        "memory": "1GB",
        "walltime": "00:10:00",
        "interface": "lo",
        "scheduler-options": {"dashboard_address": "127.0.0.1:0"},
        "worker-extra-args": ["--no-dashboard", "--lifetime", "9m", "--lifetime-stagger", "30s"],
        "local-directory": str(tmp_path / "worker-space"),
        "log-directory": str(tmp_path / "logs"),
        "shared-temp-directory": str(tmp_path),
        "death-timeout": 30,
    }
    return {f"jobqueue.slurm.{key}": value for key, value in settings.items()}


def test_demo_runs_on_slurm_jobs(slurm, tmp_path, capsys):
    """``dxode demo --jobqueue slurm``: the main job on batch-job workers set up by Dask config."""
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (extra 'hpc')")
    pytest.importorskip("matplotlib")
    import dask

    from dxode.__main__ import main

    output = tmp_path / "demo.png"
    with dask.config.set(_slurm_config(slurm, tmp_path)):
        argv = ["demo", "-o", output, "-n", "400", "--fit-iterations", "2"]
        assert main([*argv, "--jobqueue", "slurm", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "waiting for 1 slurm job(s)" in out and "Dask cluster: 1 workers" in out
    assert "400 trajectories" in out and "fitted" in out
    assert output.exists()
    assert _wait_queue_empty(slurm) == []


def test_hpc_tutorial_runs_on_slurm(slurm, tmp_path, monkeypatch, capsys):
    """docs/tutorials/hpc.md, executed as written (its python blocks, in order)."""
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (extra 'hpc')")
    pytest.importorskip("zarr")
    import re
    from pathlib import Path

    import dask

    page = Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "hpc.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    # Steps 2 and 3 are one `with` block split in two for the page.
    source = blocks[0] + blocks[1] + "".join(blocks[2:])
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    with dask.config.set(_slurm_config(slurm, tmp_path)):
        exec(compile(source, str(page), "exec"), namespace)
    # dask-jobqueue leaves the files it writes Security.temporary()'s certificates to open;
    # collect them here, quietly, rather than as unraisable warnings at the end of the session.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        namespace.clear()
        gc.collect()
    out = capsys.readouterr().out
    assert "tls://" in out
    assert out.count("True") == 2 and "(4000, 11, 3)" in out
    assert _wait_queue_empty(slurm) == []
