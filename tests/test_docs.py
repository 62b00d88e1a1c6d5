"""The documentation builds cleanly and its examples run.

``mkdocs build --strict`` turns every warning (a broken link, a docstring mkdocstrings cannot
parse) into a failure. The fenced ``python`` blocks of each page (the README and the docs
pages) are joined, in order, into one script that runs in a fresh interpreter in an empty
directory, exactly as a reader who copies the page into a file and runs it would: Dask's
worker processes re-import that script, so cluster code needs its ``if __name__ ==
"__main__":`` guard. Blocks meant only to be read (GPU code, counter-examples) are fenced as
``py`` instead and are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/usage/rhs.md",
    "docs/usage/choosing-a-solver.md",
    "docs/usage/saving.md",
    "docs/usage/gradients.md",
    "docs/usage/ensembles.md",
    "docs/usage/dask.md",
    "docs/usage/events.md",
    "docs/tutorials/batching-vs-ensembles.md",
    "docs/tutorials/ensembles-three-ways.md",
    "docs/tutorials/gpu-ensembles.md",
    "docs/tutorials/stiff-ensembles.md",
    "docs/tutorials/distributed-lbfgs.md",
    "docs/tutorials/neural-ode.md",
    "docs/tutorials/scaling.md",
    # docs/tutorials/hpc.md runs on a real SLURM cluster: tests/test_slurm_harness.py
]


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


PAGE_TIMEOUT_S = 300


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_page_examples_run_as_a_script(page, tmp_path):
    script = tmp_path / "page.py"
    script.write_text(page_script(page), encoding="utf-8")
    result = run_script(script)
    assert result.returncode == 0, (
        f"{page}: its python blocks, run as a script, exit with {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )


def page_script(page: str) -> str:
    """The page's ``python`` blocks in order, each headed by a comment naming it."""
    source = (ROOT / page).read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", source, flags=re.S | re.M)
    assert blocks, f"{page} has no runnable python blocks"
    return "\n\n".join(f"# {page}, python block {i + 1}\n{b}" for i, b in enumerate(blocks))


def run_script(script: Path) -> subprocess.CompletedProcess[str]:
    """``python script`` in the script's folder, importing this checkout's dxode."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )


def test_every_public_name_has_an_api_entry():
    import dxode

    documented = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: (dxode\.\S+)", page.read_text(), flags=re.M))
    missing = sorted(f"dxode.{name}" for name in dxode.__all__ if f"dxode.{name}" not in documented)
    assert not missing, f"public names without a '::: name' entry in docs/api/*.md: {missing}"
