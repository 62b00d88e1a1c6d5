"""The benchmark suite stays runnable: asv in quick mode, and the benchmarks page's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_asv_suite_runs_once_in_quick_mode(tmp_path):
    """Every asv benchmark runs once against the installed dxode; none may fail."""
    pytest.importorskip("asv", reason="asv is not installed (extras 'bench', 'test')")
    if not (ROOT / ".git").exists():
        pytest.skip("asv needs the git checkout (run from a clone)")
    env = {"HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    asv = [sys.executable, "-m", "asv"]
    machine = [*asv, "machine", "--yes", "--machine", "ci"]
    subprocess.run(machine, cwd=ROOT / "asv_bench", env=env, check=True, capture_output=True)
    quick_run = ["run", "--quick", "--dry-run", "--show-stderr", "--machine", "ci"]
    result = subprocess.run(
        [*asv, *quick_run, "-E", f"existing:{sys.executable}"],
        cwd=ROOT / "asv_bench",
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "failed" not in output, output[-5000:]
    assert output.count(" ok") >= 5, output[-5000:]


def test_benchmark_figures_are_drawn_from_the_committed_measurements(tmp_path):
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(ROOT / "asv_bench"))
    try:
        import plot_benchmarks
    finally:
        sys.path.remove(str(ROOT / "asv_bench"))
    data = ROOT / "docs" / "benchmarks"
    measured = sorted(p.name for p in data.glob("*.json"))
    assert measured, "docs/benchmarks/ holds no measurements"
    written = plot_benchmarks.main(["--data", str(data), "--out", str(tmp_path)])
    assert len(written) == len(measured)
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in measured:  # every figure the page shows is one of these
        assert json.loads((data / name).read_text())
