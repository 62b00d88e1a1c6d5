"""Running a Python script as a user would: ``python script.py`` in the script's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python script`` in a fresh interpreter in the script's folder, importing this
    checkout's dxode; its output captured as text."""
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
