"""DiffEqGPU's benchmark through the kernels runs, and its CUDA rows match the CPU kernel.

The CUDA kernel runs under numba-cuda's simulator at a tiny size (``NUMBA_ENABLE_CUDASIM``
must be set before ``numba.cuda`` is first imported, so the script runs in a fresh
interpreter); the script itself checks the final states against the CPU kernel's, bitwise.
On a GPU, where FMA contraction changes the last bits, it checks accuracy instead: that check
is exercised here on the CPU kernel's own results.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dxode

pytest.importorskip("numba")
pytest.importorskip("numba.cuda")

ROOT = Path(__file__).resolve().parents[1]


def test_diffeqgpu_benchmark_cuda_rows_run_on_the_simulator_and_match_the_cpu_kernel():
    env = {
        **os.environ,
        "NUMBA_ENABLE_CUDASIM": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    script = ROOT / "asv_bench" / "diffeqgpu_kernel.py"
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cuda", "--sizes", "8", "--repeats", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 2, done.stdout  # adaptive and fixed
    assert all(row.endswith("| bitwise equal |") for row in rows), done.stdout
    assert done.stdout.strip().endswith("cuda kernel vs CPU kernel: passed")


def test_diffeqgpu_benchmark_gpu_check_is_an_accuracy_check(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "asv_bench"))
    import diffeqgpu_kernel as script

    monkeypatch.setattr(script, "on_simulator", lambda: False)  # as on a GPU
    n = 16
    u0, p = script.paper_inputs(n)
    adaptive = script.options("adaptive")
    cpu = np.asarray(script.solve_lanes(u0, p, dxode.EnsembleKernel(), **adaptive))
    passed, cell = script.check_against_cpu(cpu, n, "adaptive")
    assert passed and "(ok)" in cell and cell.endswith("differ 0.0e+00"), cell
    # far beyond the CPU kernel's own error (about 1e-6 relative here): refused
    passed, cell = script.check_against_cpu(cpu * np.float32(1 + 1e-3), n, "adaptive")
    assert not passed and "(WORSE)" in cell, cell
