"""Shared fixtures: the array backends and dtypes every core test runs on (from ``matrix``).

``--without=distributed,matplotlib,...`` hides optional dependencies as if not installed, to
check that their tests skip with a reason instead of failing.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

from matrix import DTYPES, backend_params, namespace


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without",
        default="",
        metavar="NAMES",
        help="comma-separated optional dependencies to hide, as if not installed "
        "(e.g. distributed,matplotlib): their tests must skip with a reason, not fail",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A None entry in sys.modules makes every later import of the name (and of its
    # submodules) raise ModuleNotFoundError, which is what a missing extra looks like.
    for name in filter(None, config.getoption("--without").split(",")):
        sys.modules[name] = None  # type: ignore[assignment]
    # Compiled kernels go to a directory of this run's own, which its xdist workers and the
    # processes they start inherit: each run compiles as on a fresh machine, and the user's
    # cache is left alone. Set DXODE_KERNEL_CACHE to keep compiled kernels between runs.
    if "DXODE_KERNEL_CACHE" not in os.environ:
        path = tempfile.mkdtemp(prefix="dxode-test-kernels-")
        os.environ["DXODE_KERNEL_CACHE"] = config.dxode_kernel_cache = path


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, "dxode_kernel_cache", None)
    if path is not None:  # this process made it: remove it
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist hands tests to its workers in this order: the slow ones first, so that none of
    # them starts last while the other workers have nothing left to do (the order is
    # otherwise kept, and so are the module-scoped fixtures' groupings among the rest).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(params=backend_params())
def xp(request):
    """An array namespace: NumPy, array_api_strict (the standard and nothing more) or CuPy."""
    return namespace(request.param)


@pytest.fixture(params=DTYPES)
def dtype_name(request):
    return request.param


def to_numpy(x) -> np.ndarray:
    """A host NumPy copy of any backend's array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get"):
        return x.get()
    return np.from_dlpack(x)


@pytest.fixture(scope="module")
def client():
    """A ``distributed.Client`` on a two-worker local cluster of processes, one per module."""
    distributed = pytest.importorskip("distributed", reason="needs dxode[dask]")
    import dxode

    with (
        dxode.local_cluster(n_workers=2) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        yield c
