"""Stopping an EnsembleDask solve early: the batches a converged reduction cancels end before
``solve`` returns; an interrupt reaches the caller at once."""

from __future__ import annotations

import ctypes
import re
import sys
import textwrap
import time

import pytest
from scripts import run_script

# Batches 0 and 1 are quick and make the reduction converge; batches 2 and 3, which the two
# workers have started by then, take a second. The cluster closes as soon as solve returns.
SCRIPT = textwrap.dedent(
    """
    import time

    import distributed

    import dxode


    def decay(u, p, t):
        return -u


    def slow_after_the_first_two(prob, ctx):
        if ctx.indices[0] >= 20:
            time.sleep(1.0)
        return {}


    def two_batches(acc, u, indices):
        return acc + len(indices), acc + len(indices) >= 20


    if __name__ == "__main__":
        prob = dxode.ODEProblem(decay, [1.0], (0.0, 1.0))
        eprob = dxode.EnsembleProblem(
            prob, batch_func=slow_after_the_first_two, reduction=two_batches, u_init=0
        )
        with dxode.local_cluster(n_workers=2) as cluster, distributed.Client(cluster) as client:
            sim = dxode.solve(eprob, dxode.Tsit5(), client, trajectories=80, batch_size=10)
            print(sim.converged, sim.u)
    """
)


def test_early_stop_waits_for_cancelled_batches_so_closing_the_cluster_is_quiet(tmp_path):
    pytest.importorskip("distributed")
    result = run_script(tmp_path / "early_stop.py", SCRIPT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "20"]
    assert result.stderr == ""  # no "... ended with CancelledError" from the workers


def test_early_stop_warns_of_batches_still_running_after_the_wait(tmp_path):
    # The count of batches still running once the wait was over was dropped silently.
    pytest.importorskip("distributed")
    script = SCRIPT.replace("time.sleep(1.0)", "time.sleep(5.0)").replace(
        'if __name__ == "__main__":',
        'if __name__ == "__main__":\n    dxode.ensemble.dask_ensemble.STOP_WAIT_S = 0.5',
    )
    result = run_script(tmp_path / "early_stop_warns.py", script, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "20"]
    warned = r"RuntimeWarning: [1-9]\d* tasks .* may still run .* 0\.5 s after"
    assert re.search(warned, result.stderr), result.stderr


# Batch 1 interrupts the driver (as Ctrl-C would) and then runs on for half a minute; the marker
# file it writes at its end must not exist yet when the KeyboardInterrupt reaches the caller.
INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import functools
    import os
    import pathlib
    import signal
    import time

    import distributed

    import dxode


    def decay(u, p, t):
        return -u


    def interrupt_the_driver(driver, marker, prob, i, repeat):
        if i == 1:  # on a worker (trajectory 0 is also set up on the driver)
            os.kill(driver, signal.SIGINT)
            time.sleep(30.0)
            marker.write_text("batch 1 ended")
        return prob


    if __name__ == "__main__":
        # Ctrl-C's handler, also where this was started with SIGINT ignored (a job put in the
        # background by a shell without job control), which Python keeps ignoring.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        marker = pathlib.Path("batch-1-ended")
        prob_func = functools.partial(interrupt_the_driver, os.getpid(), marker.resolve())
        prob = dxode.ODEProblem(decay, [1.0], (0.0, 1.0))
        eprob = dxode.EnsembleProblem(prob, prob_func=prob_func)
        with dxode.local_cluster(n_workers=2) as cluster:
            with distributed.Client(cluster, set_as_default=False) as client:
                try:
                    dxode.solve(eprob, dxode.Tsit5(), client, trajectories=2, batch_size=1)
                except KeyboardInterrupt:
                    print("interrupted", "after batch 1" if marker.exists() else "at once")
    """
)


@pytest.mark.timeout(120)
def test_an_interrupt_reaches_the_caller_without_waiting_for_running_batches(tmp_path):
    pytest.importorskip("distributed")
    result = run_script(tmp_path / "interrupted.py", INTERRUPT_SCRIPT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "at", "once"], result.stderr


def _hold_the_gil(started, ended):
    """A task that holds its worker's GIL for half a minute (libc's sleep called through
    ``PyDLL``, which keeps the GIL), so that the worker answers nobody meanwhile."""
    started.touch()
    ctypes.PyDLL(None).sleep(30)
    ended.touch()


@pytest.mark.skipif(sys.platform == "win32", reason="libc's sleep through ctypes.PyDLL(None)")
@pytest.mark.timeout(120)
def test_cancelling_returns_after_its_timeout_when_a_worker_does_not_answer(tmp_path):
    distributed = pytest.importorskip("distributed")
    import dxode
    from dxode.ensemble.dask_cancel import cancel_and_wait

    started, ended = tmp_path / "started", tmp_path / "ended"
    with (
        dxode.local_cluster(n_workers=1) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        future = client.submit(_hold_the_gil, started, ended)
        while not started.exists():
            time.sleep(0.05)
        # It waited for the worker's answer, which came only once the task had ended.
        assert cancel_and_wait(client, [future], timeout=1.0) == 1
        assert not ended.exists()
