"""EnsembleDask on a dask-cuda cluster (one worker per GPU), on a real GPU.

Skipped without CuPy, a GPU and dask-cuda (CI has none). The workers compute on CuPy, with the
array path (``backend="cupy"``) and with the CUDA kernel (``kernel=EnsembleKernel(device=
"cuda")``); their results are the same computation's in the driver, bitwise, whatever the
batch size.
"""

from __future__ import annotations

import numpy as np
import pytest

import dxode
from dxode import EnsembleDask, EnsembleProblem

from matrix import real_gpu_marks
from problems import lorenz

distributed = pytest.importorskip("distributed")
pytest.importorskip("dask_cuda")

pytestmark = real_gpu_marks()

N = 64
SOLVE = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}


@pytest.fixture(scope="module")
def cuda_client():
    with (
        dxode.local_cluster(gpus=True) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        yield client


def _eprob():
    prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 3.0), (10.0, 28.0, 8 / 3))
    rho = np.linspace(20.0, 30.0, N)
    p = np.column_stack([np.full(N, 10.0), rho, np.full(N, 8 / 3)])
    return EnsembleProblem(prob, p=p)


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _assert_same(sim, reference):
    np.testing.assert_array_equal(_host(sim.u), _host(reference.u))
    np.testing.assert_array_equal(sim.retcodes, reference.retcodes)
    np.testing.assert_array_equal(sim.stats.naccept, reference.stats.naccept)


def test_the_cluster_has_one_worker_per_gpu(cuda_client):
    import cupy

    workers = cuda_client.scheduler_info()["workers"]
    assert len(workers) == cupy.cuda.runtime.getDeviceCount()


@pytest.mark.parametrize("batch_size", [9, N])
def test_cupy_batches_on_cuda_workers_equal_the_driver_bitwise(cuda_client, batch_size):
    eprob = _eprob()
    reference = dxode.solve(eprob, dxode.Tsit5(), dxode.EnsembleArray(backend="cupy"), **SOLVE)
    alg = EnsembleDask(cuda_client, backend="cupy")
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=batch_size, **SOLVE)
    assert np.all(sim.retcodes == 0)
    _assert_same(sim, reference)


@pytest.mark.parametrize("batch_size", [9, N])
def test_cuda_kernel_batches_on_cuda_workers_equal_the_driver_bitwise(cuda_client, batch_size):
    pytest.importorskip("numba.cuda")
    kernel = dxode.EnsembleKernel(device="cuda")
    eprob = _eprob()
    reference = dxode.solve(eprob, dxode.Tsit5(), kernel, **SOLVE)
    alg = EnsembleDask(cuda_client, kernel=kernel)
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=batch_size, **SOLVE)
    assert np.all(sim.retcodes == 0)
    _assert_same(sim, reference)
