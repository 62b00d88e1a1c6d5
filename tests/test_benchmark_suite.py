"""The benchmark suite stays runnable: asv in quick mode, and the benchmarks page's figures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# One asv run per benchmark file, so that xdist spreads the suite over its workers (as one
# run it took one worker for minutes, most of it numba compiling the kernel benchmarks).
BENCHMARK_MODULES = sorted(
    path.stem
    for path in (ROOT / "asv_bench" / "benchmarks").glob("*.py")
    if path.stem != "__init__"
)


@pytest.mark.slow
@pytest.mark.parametrize("module", BENCHMARK_MODULES)
def test_asv_suite_runs_once_in_quick_mode(module, tmp_path):
    """Every asv benchmark in ``asv_bench/benchmarks/<module>.py`` runs once against the
    installed dxode; none may fail, and none may be left out."""
    pytest.importorskip("asv", reason="asv is not installed (extras 'bench', 'test')")
    if not (ROOT / ".git").exists():
        pytest.skip("asv needs the git checkout (run from a clone)")
    env = {"HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    if "DXODE_KERNEL_CACHE" in os.environ:  # this run's kernels (conftest), not ~/.cache's
        env["DXODE_KERNEL_CACHE"] = os.environ["DXODE_KERNEL_CACHE"]
    asv = [sys.executable, "-m", "asv"]
    config = ["--config", str(_asv_config(tmp_path))]
    machine = [*asv, "machine", "--yes", "--machine", "ci", *config]
    subprocess.run(machine, cwd=tmp_path, env=env, check=True, capture_output=True)
    quick_run = ["run", "--quick", "--dry-run", "--show-stderr", "--machine", "ci", *config]
    result = subprocess.run(
        [*asv, *quick_run, "--bench", rf"^{module}\.", "-E", f"existing:{sys.executable}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "failed" not in output, output[-5000:]
    total = re.search(r"Running (\d+) total benchmarks", output)
    assert total and int(total.group(1)) > 0, output[-5000:]
    ran = re.findall(r"··· \S+\s+ok$", output, flags=re.M)
    assert len(ran) == int(total.group(1)), output[-5000:]


def _asv_config(tmp_path: Path) -> Path:
    """The checkout's asv configuration with absolute paths and results under ``tmp_path``,
    so that the runs of different benchmark files write nothing shared (nor into the
    checkout)."""
    text = (ROOT / "asv_bench" / "asv.conf.json").read_text(encoding="utf-8")
    config = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    bench = ROOT / "asv_bench"
    config |= {
        "repo": str((bench / config["repo"]).resolve()),
        "benchmark_dir": str(bench / config["benchmark_dir"]),
        "env_dir": str(tmp_path / "env"),
        "results_dir": str(tmp_path / "results"),
        "html_dir": str(tmp_path / "html"),
    }
    path = tmp_path / "asv.conf.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


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
