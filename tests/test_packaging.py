"""The built wheel (not only the editable install) ships a working ``dxode.backends``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


BACKEND_MODULES = ("__init__.py", "_array_api.py", "_base.py", "_cupy.py", "_lu.py", "_numpy.py")


def _build(out_dir: Path, *what: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            *what,
            "--no-isolation",
            "--outdir",
            str(out_dir),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel hatchling builds from this checkout."""
    wheel_dir = tmp_path_factory.mktemp("wheel")
    _build(wheel_dir, "--wheel")
    (built,) = wheel_dir.glob("dxode-*.whl")
    return built


@pytest.fixture(scope="module")
def sdist_and_its_wheel(tmp_path_factory):
    """The sdist, and the wheel built from it (what ``pip install dxode-*.tar.gz`` does)."""
    out_dir = tmp_path_factory.mktemp("sdist")
    _build(out_dir)  # build's default: the sdist, then a wheel from the unpacked sdist
    (sdist,) = out_dir.glob("dxode-*.tar.gz")
    (built,) = out_dir.glob("dxode-*.whl")
    return sdist, built


def _wheel_symlinks(wheel: Path) -> list[str]:
    return [
        info.filename
        for info in zipfile.ZipFile(wheel).infolist()
        if stat.S_ISLNK(info.external_attr >> 16)
    ]


def _assert_ships_backends(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert len(names) == len(set(names)), "a file is packed twice"
    for module in BACKEND_MODULES:
        assert f"dxode/backends/{module}" in names
    assert not [name for name in names if name.startswith("backends/")]
    assert not [name for name in names if "__pycache__" in name]
    assert _wheel_symlinks(wheel) == []


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
        "import os, dxode, dxode.backends, numpy as np;"
        "assert 'site-packages' in dxode.__file__, dxode.__file__;"
        "folder = os.path.dirname(dxode.backends.__file__);"
        "assert folder == os.path.join(os.path.dirname(dxode.__file__), 'backends'), folder;"
        "assert not os.path.islink(folder), folder;"
        "assert dxode.backends.get_backend('numpy').xp is np;"
        "from dxode.backends import _lu, backend_for;"
        "sol = dxode.solve(dxode.ODEProblem(lambda u, p, t: -u, [1.0], (0.0, 1.0)), saveat=[1.0]);"
        "print(dxode.__file__, float(sol.u[-1, 0]))"
    )
    # Without PYTHONPATH, which may point at this checkout (its dxode would shadow the wheel's).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr
    location, value = out.stdout.split()
    assert str(env_dir) in location
    assert abs(float(value) - 0.36787944) < 1e-3


def test_wheel_contents_list_backends(wheel):
    # Structural check of what hatchling packs (backends/ mapped to dxode/backends).
    _assert_ships_backends(wheel)
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


def test_sdist_has_backends_and_no_symlink(sdist_and_its_wheel):
    sdist, _ = sdist_and_its_wheel
    with tarfile.open(sdist) as archive:
        members = archive.getmembers()
    assert [m.name for m in members if m.issym() or m.islnk()] == []
    names = {m.name.split("/", 1)[1] for m in members}
    for module in BACKEND_MODULES:
        assert f"backends/{module}" in names
    assert not [name for name in names if name.startswith("dxode/backends")]


def test_wheel_built_from_the_sdist_ships_backends(sdist_and_its_wheel):
    # The sdist has no dxode/backends link: the wheel maps backends/ itself.
    _, built = sdist_and_its_wheel
    _assert_ships_backends(built)


def test_dev_tree_link_points_at_the_shipped_folder():
    # The editable install and PYTHONPATH=<checkout> import dxode.backends through the link;
    # it must be the same code the artifacts ship from backends/.
    link = ROOT / "dxode" / "backends"
    if not link.exists():
        pytest.skip("no dxode/backends link in this tree (an unpacked sdist)")
    assert link.is_symlink() and link.resolve() == (ROOT / "backends").resolve()
