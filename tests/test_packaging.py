"""The built wheel (not only the editable install) ships a working ``dxode.backends``."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel hatchling builds from this checkout."""
    wheel_dir = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(wheel_dir),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = wheel_dir.glob("dxode-*.whl")
    return built


def _see_dependencies_of_this_environment(python: Path) -> None:
    """Put this interpreter's site directories (numpy, ...) on ``python``'s path, after its own.

    Not ``system_site_packages``: inside a virtual environment that means the base
    interpreter's, which lacks what was installed into the environment. A path line in a
    ``.pth`` file adds the directory without running the ``.pth`` files in it, so the editable
    install of this checkout stays out and dxode comes from the wheel.
    """
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_path(key) for key in ("purelib", "platlib"))
    (Path(target) / "_dxode_test_dependencies.pth").write_text("\n".join(ours) + "\n")


@pytest.mark.slow
def test_wheel_installs_and_imports_backends(tmp_path, wheel):
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _see_dependencies_of_this_environment(python)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        "import dxode, dxode.backends, numpy as np;"
        "assert 'site-packages' in dxode.__file__, dxode.__file__;"
        "assert dxode.backends.get_backend('numpy').xp is np;"
        "sol = dxode.solve(dxode.ODEProblem(lambda u, p, t: -u, [1.0], (0.0, 1.0)), saveat=[1.0]);"
        "print(dxode.__file__, float(sol.u[-1, 0]))"
    )
    out = subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    location, value = out.stdout.split()
    assert str(env_dir) in location
    assert abs(float(value) - 0.36787944) < 1e-3


def test_wheel_contents_list_backends(wheel):
    # Structural check of what hatchling packs (the symlinked backends/ folder).
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    for module in (
        "dxode/backends/__init__.py",
        "dxode/backends/_numpy.py",
        "dxode/backends/_cupy.py",
        "dxode/solvers/tsit5.py",
        "dxode/py.typed",
        "dxode/sensitivity/discrete_adjoint.py",
    ):
        assert module in names
