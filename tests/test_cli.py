"""The ``dxode`` command line: ``main(argv)`` and ``python -m dxode``."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from dxode.__main__ import main
from dxode.demo.run import SCHEDULER_TIMEOUT_S

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_demo_writes_png(tmp_path, capfd):
    pytest.importorskip("matplotlib")
    output = tmp_path / "x.png"
    argv = ["demo", "--output", output, "--trajectories", "2000", "--workers", "2"]
    assert main([*argv, "--fit-iterations", "11"]) == 0
    assert output.read_bytes()[:8] == PNG_MAGIC
    out, err = capfd.readouterr()
    # Standard error (here not a terminal) gets neither a progress bar nor log messages from
    # the workers: capfd sees the worker processes' output too.
    assert err == ""
    assert "Success" in out
    assert "RHS evals" in out
    assert "sol(5.0)" in out
    assert "2,000 trajectories" in out and "trajectories/s" in out
    from dxode.backends import cupy_available

    backend = "cupy" if cupy_available() else "numpy"  # the default picks the GPU when there is one
    assert f"Dask cluster: 2 workers, {backend} backend" in out
    # The fit prints its loss every ten iterations and ends with a summary.
    assert "iteration   0  loss" in out and "iteration  10  loss" in out
    assert "fitted       sigma" in out
    assert "summary" in out and str(output.resolve()) in out


def test_demo_fit_recovers_the_parameters():
    from dxode import EnsembleArray
    from dxode.demo.fit import INITIAL_GUESS, TRUE_PARAMETERS, fit_parameters

    fit = fit_parameters(EnsembleArray(), iterations=60)
    assert len(fit["history"]) == 60
    assert fit["loss"] < fit["history"][0] / 100
    start_error = np.abs(INITIAL_GUESS / TRUE_PARAMETERS - 1)
    assert np.all(np.abs(fit["parameters"] / TRUE_PARAMETERS - 1) < start_error / 5)


def test_demo_rejects_scheduler_and_jobqueue_together(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    argv = ["demo", "-o", tmp_path / "x.png", "-n", "10", "--scheduler", "tcp://127.0.0.1:1"]
    assert main([*argv, "--jobqueue", "slurm"]) == 1
    assert "either --scheduler or --jobqueue" in capsys.readouterr().err


@pytest.mark.parametrize("system", ["slurm", "pbs"])
def test_demo_jobqueue_without_dask_jobqueue_names_the_extra(tmp_path, capsys, monkeypatch, system):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)
    assert main(["demo", "-o", tmp_path / "x.png", "-n", "10", "--jobqueue", system]) == 1
    out, err = capsys.readouterr()
    assert 'pip install "dxode[hpc]"' in err
    assert out == ""  # said before anything is solved


def test_demo_unreachable_scheduler_fails_fast_in_one_line(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("distributed")
    address = "tcp://127.0.0.1:1"  # nothing listens on port 1
    start = time.perf_counter()
    result = _dxode("demo", "-o", tmp_path / "x.png", "-n", "10", "--scheduler", address)
    wall = time.perf_counter() - start
    assert result.returncode == 1
    [line] = result.stderr.splitlines()  # one line: no traceback, no log messages
    assert line.startswith(f"dxode demo: cannot connect to --scheduler {address}: ")
    assert result.stdout == ""  # said before anything is solved
    assert wall < SCHEDULER_TIMEOUT_S + 15


def _default_client_or_none():
    import distributed

    try:
        return distributed.default_client()
    except ValueError:
        return None


def test_demo_scheduler_that_is_no_address_says_so(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("distributed")
    import dask

    before = _default_client_or_none(), dask.config.get("scheduler", None)
    assert main(["demo", "-o", tmp_path / "x.png", "-n", "10", "--scheduler", "nonsense"]) == 1
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert line.startswith("dxode demo: cannot connect to --scheduler nonsense: ")
    assert out == ""
    # Nothing left behind in this process: the client that failed to connect was made the
    # default one (by Dask, before connecting), and every later dask.compute here waited on
    # it forever (a CI run hung on a Zarr ensemble's sim[i] in this test's worker process).
    assert (_default_client_or_none(), dask.config.get("scheduler", None)) == before


def test_demo_asking_for_cupy_without_a_gpu_says_so(tmp_path, capsys):
    from dxode.backends import cupy_available

    if cupy_available():
        pytest.skip("this machine has a GPU")
    pytest.importorskip("matplotlib")  # the demo checks for plotting first
    assert main(["demo", "--output", tmp_path / "x.png", "--backend", "cupy"]) == 1
    assert "needs CuPy and an NVIDIA GPU" in capsys.readouterr().err


def test_demo_without_matplotlib_names_the_plot_extra(tmp_path, capsys, monkeypatch):
    # A None entry in sys.modules makes the import raise ImportError.
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    output = tmp_path / "x.png"
    assert main(["demo", "--output", output]) != 0
    assert not output.exists()
    assert 'pip install "dxode[plot]"' in capsys.readouterr().err


def _dxode(*args: object) -> subprocess.CompletedProcess[str]:
    """``python -m dxode *args`` with its output captured."""
    command = [sys.executable, "-m", "dxode", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_module_help_runs():
    result = _dxode("--help")
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout


def test_demo_help_shows_percent_signs_once(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # undo the line wrapping
    assert "5-95 % quantile band" in out
    assert "%%" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "abc"], "argument --trajectories/-n: expected a positive integer, got 'abc'"),
        (["-n", "0"], "argument --trajectories/-n: expected a positive integer, got '0'"),
        (["--workers", "2.5"], "argument --workers: expected a positive integer, got '2.5'"),
        (
            ["--fit-iterations", "-1"],
            "argument --fit-iterations: expected a non-negative integer, got '-1'",
        ),
    ],
)
def test_demo_bad_counts_are_usage_errors_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"dxode demo: error: {message}"


def test_missing_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err
