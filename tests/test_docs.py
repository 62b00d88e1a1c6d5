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

import re
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import run_script

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/usage/rhs.md",
    "docs/usage/choosing-a-solver.md",
    "docs/usage/stiff.md",
    "docs/usage/saving.md",
    "docs/usage/gradients.md",
    "docs/usage/ensembles.md",
    "docs/usage/dask.md",
    "docs/usage/events.md",
    "docs/usage/kernels.md",
    "docs/tutorials/batching-vs-ensembles.md",
    "docs/tutorials/ensembles-three-ways.md",
    "docs/tutorials/gpu-ensembles.md",
    "docs/tutorials/stiff-ensembles.md",
    "docs/tutorials/distributed-lbfgs.md",
    "docs/tutorials/neural-ode.md",
    "docs/tutorials/scaling.md",
    # docs/tutorials/hpc.md runs on a real SLURM cluster: tests/test_slurm_harness.py
]


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_page_examples_run_as_a_script(page, tmp_path):
    result = run_script(tmp_path / "page.py", page_script(page), timeout=PAGE_TIMEOUT_S)
    assert result.returncode == 0, (
        f"{page}: its python blocks, run as a script, exit with {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
    # A reader sees the page's output and nothing else: no warnings, no log messages.
    stderr = _without_heartbeat_race(result.stderr)
    assert stderr == "", f"{page}: the script writes to standard error:\n{stderr}"


# Dask's own shutdown race (dask/distributed#7105, open): a worker whose heartbeat is in
# flight while the closing cluster retires it logs this error and its traceback. It says
# nothing about the page; anything else on standard error still fails the test.
_HEARTBEAT_RACE = re.compile(
    r"^\S+ \S+ - distributed\.worker - ERROR - Failed to communicate with scheduler during "
    r"heartbeat\.\n(?:.*\n)*?distributed\.comm\.core\.CommClosedError: .*heartbeat_worker.*\n",
    flags=re.M,
)


def _without_heartbeat_race(stderr: str) -> str:
    return _HEARTBEAT_RACE.sub("", stderr)


def page_script(page: str) -> str:
    """The page's ``python`` blocks in order, each headed by a comment naming it."""
    source = (ROOT / page).read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", source, flags=re.S | re.M)
    assert blocks, f"{page} has no runnable python blocks"
    return "\n\n".join(f"# {page}, python block {i + 1}\n{b}" for i, b in enumerate(blocks))


def test_every_public_name_has_an_api_entry():
    import dxode

    documented = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: (dxode\.\S+)", page.read_text(), flags=re.M))
    missing = sorted(f"dxode.{name}" for name in dxode.__all__ if f"dxode.{name}" not in documented)
    assert not missing, f"public names without a '::: name' entry in docs/api/*.md: {missing}"


def test_solve_docstring_lists_every_method_and_ensemble_algorithm():
    import dxode
    from dxode.solvers import ALGORITHMS

    doc = dxode.solve.__doc__
    alg_doc = _parameter_doc(doc, "alg")
    methods = [cls.__name__ for cls in ALGORITHMS.values()]
    assert [m for m in methods if f"``{m}()``" not in alg_doc] == []
    ensemble_doc = _parameter_doc(doc, "ensemble_alg")
    ensemble_algs = ["EnsembleArray", "EnsembleSerial", "EnsembleDask", "distributed.Client"]
    assert [a for a in ensemble_algs if a not in ensemble_doc] == []


def _parameter_doc(doc: str, name: str) -> str:
    """The numpydoc entry of parameter ``name``: its type line and its indented description."""
    match = re.search(rf"^( *){name} :.*\n((?:\1 .*\n)*)", doc, flags=re.M)
    assert match, f"solve's docstring has no entry for {name}"
    return match.group(0)


def test_readme_stats_comment_names_every_stats_field():
    import dataclasses

    import dxode

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    comment = re.search(
        r"print\(sol\.retcode\.name, sol\.stats\) +# Success (SolverStats\(.*\))", readme
    )
    assert comment, "the README's quickstart no longer prints sol.stats with a comment"
    named = re.findall(r"(\w+)=", comment.group(1))
    assert named == [field.name for field in dataclasses.fields(dxode.SolverStats)]


def test_benchmarks_summary_quotes_the_single_solve_table():
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    summary = re.search(
        r"^\| one Lorenz solve, time per step vs SciPy RK45 \| ([\d.]+)–([\d.]+)×", page, flags=re.M
    )
    assert summary, "the at-a-glance table has no range for the single Lorenz solve"
    results = page[page.index("### Results") :]
    table = re.findall(r"^\| .* \| dxode Tsit5 \|.*\| \*\*([\d.]+)\*\* \|$", results, flags=re.M)
    assert len(table) == 2, "the single-solve results table has changed shape"
    ratios = sorted(float(r) for r in table)
    assert [float(summary.group(1)), float(summary.group(2))] == [ratios[0], ratios[-1]]


# Claims the docs once made and that are no longer true; they must not come back.
RETRACTED_CLAIMS = {
    r"not available for stiff methods": "gradients work with the stiff methods",
    r"(?i)callbacks are not differentiable|gradients through (events|callbacks) (raise|are not)": (
        "gradients run through callbacks"
    ),
}


@pytest.mark.parametrize("claim", sorted(RETRACTED_CLAIMS))
def test_no_page_makes_a_retracted_claim(claim):
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    making_it = [
        str(page.relative_to(ROOT))
        for page in pages
        if re.search(claim, " ".join(page.read_text(encoding="utf-8").split()))
    ]
    assert making_it == [], f"{making_it} say {claim!r}, but {RETRACTED_CLAIMS[claim]}"
