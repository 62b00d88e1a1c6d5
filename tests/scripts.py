"""Running a Python script as a user would: ``python script.py`` in the script's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: Path, source: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``source`` written to ``script`` and run as ``python script`` in a fresh interpreter
    in the script's folder, importing this checkout's dxode; its output captured as text."""
    script.write_text(source, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_runs_under_cuda_simulator(source: str, timeout: float = 600) -> None:
    """Run ``source`` in a fresh interpreter with numba-cuda's simulator on (it is chosen
    when ``numba.cuda`` first loads, so never in this process) and assert it prints ``ok``
    last; the tests folder is importable beside this checkout's dxode."""
    env = {
        **os.environ,
        "NUMBA_ENABLE_CUDASIM": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok"), done.stdout[-3000:]
