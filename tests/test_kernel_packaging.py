"""The kernel path is optional: ``import dxode`` works without numba; the extra names it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_dxode_imports_without_numba():
    script = textwrap.dedent(
        """
        import sys

        class NoNumba:
            def find_spec(self, name, path=None, target=None):
                if name == "numba" or name.startswith("numba."):
                    raise ImportError("numba is blocked for this test")
                return None

        sys.meta_path.insert(0, NoNumba())
        import dxode
        assert dxode.EnsembleKernel().device == "cpu"
        assert not any(m == "numba" or m.startswith("numba.") for m in sys.modules)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_kernel_extra_is_part_of_the_test_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"numba", "numba-cuda"} <= {_name(r) for r in extras["kernel"]}
    assert {"numba", "numba-cuda"} <= {_name(r) for r in extras["test"]}


def _name(requirement: str) -> str:
    for sep in "<>=!~[ ;":
        requirement = requirement.split(sep)[0]
    return requirement
