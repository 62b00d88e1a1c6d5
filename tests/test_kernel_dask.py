"""EnsembleDask running compiled-kernel batches (``EnsembleDask(kernel=EnsembleKernel())``) on
real worker processes: the results are the local kernel's, bitwise, whatever the batch size,
and a worker that dies mid-solve loses nothing."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

pytest.importorskip("numba")
distributed = pytest.importorskip("distributed")

import dxode  # noqa: E402
from dxode import EnsembleDask, EnsembleKernel, EnsembleProblem  # noqa: E402
from dxode.kernels.errors import KernelCompileError, KernelUnsupportedError  # noqa: E402

from problems import lorenz  # noqa: E402

N = 40
SOLVE = {"saveat": 1.0, "rtol": 1e-6, "atol": 1e-6}


def _eprob(**kwargs):
    prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 3.0), (10.0, 28.0, 8 / 3))
    return EnsembleProblem(prob, **kwargs)


def _p():
    rho = np.linspace(20.0, 30.0, N)
    return np.column_stack([np.full(N, 10.0), rho, np.full(N, 8 / 3)])


def _assert_same(sim, reference):
    np.testing.assert_array_equal(np.asarray(sim.u), np.asarray(reference.u))
    np.testing.assert_array_equal(sim.retcodes, reference.retcodes)
    for name in ("nf", "naccept", "nreject"):
        np.testing.assert_array_equal(getattr(sim.stats, name), getattr(reference.stats, name))


@pytest.mark.parametrize("batch_size", [7, N])
def test_kernel_batches_on_workers_equal_the_local_kernel_bitwise(client, batch_size):
    eprob = _eprob(p=_p())
    reference = dxode.solve(eprob, dxode.Tsit5(), EnsembleKernel(threads=1), **SOLVE)
    alg = EnsembleDask(client, kernel=EnsembleKernel(threads=1))
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=batch_size, **SOLVE)
    _assert_same(sim, reference)


def _growth(u, p, t):
    return [p[0] * u[0]]


def _reached_two(u, p, t):
    return u[0] - 2.0


def _dose(u, p, t, fired):
    return [u[0] + 0.5]


def test_callbacks_on_workers_equal_the_local_kernel_bitwise(client):
    prob = dxode.ODEProblem(_growth, np.array([1.0]), (0.0, 2.0), (1.0,))
    eprob = EnsembleProblem(prob, p=np.linspace(0.1, 1.2, 9)[:, None])
    callback = dxode.CallbackSet(
        dxode.ContinuousCallback(_reached_two, terminate=True),
        dxode.PresetTimeCallback([0.5, 1.0], _dose),
    )
    options = {**SOLVE, "callback": callback}
    reference = dxode.solve(eprob, dxode.Tsit5(), EnsembleKernel(threads=1), **options)
    alg = EnsembleDask(client, kernel=EnsembleKernel(threads=1))
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=4, **options)
    _assert_same(sim, reference)
    for name in ("t", "callback", "trajectory", "u_before", "u_after"):
        np.testing.assert_array_equal(getattr(sim.events, name), getattr(reference.events, name))
    assert set(sim.retcodes.tolist()) == {dxode.ReturnCode.Success, dxode.ReturnCode.Terminated}


_NEGATIVE = "negative"


def _uncompilable(u, p, t):
    return [getattr(np, _NEGATIVE)(u[0])]  # getattr by name: numba cannot compile it


def test_the_workers_run_the_kernel_not_the_array_path(client):
    # Bitwise equality with the local kernel cannot tell which path ran: on CPUs where
    # NumPy's power and the C library's agree (AVX2), the array path gives the same bits.
    # An f only the array path can run tells: the workers compile, and refuse it.
    prob = dxode.ODEProblem(_uncompilable, np.array([1.0]), (0.0, 1.0))
    eprob = EnsembleProblem(prob, u0=np.ones((4, 1)))
    plain = dxode.solve(eprob, dxode.Tsit5(), EnsembleDask(client), batch_size=2, **SOLVE)
    assert plain.retcodes.tolist() == [dxode.ReturnCode.Success] * 4
    with pytest.raises(KernelCompileError, match=r"test_kernel_dask\.py:\d+"):
        dxode.solve(
            eprob,
            dxode.Tsit5(),
            EnsembleDask(client, kernel=EnsembleKernel(threads=1)),
            batch_size=2,
            **SOLVE,
        )


def _p_of(i):
    return (10.0, 20.0 + i / 4, 8 / 3)


def _dying_once_prob_func(marker):
    """At trajectory 13, the first time only: the worker process dies on the spot."""

    def prob_func(prob, i, repeat):
        if i == 13 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return prob.remake(p=_p_of(i))

    return prob_func


@pytest.mark.slow
def test_a_worker_dying_mid_solve_loses_no_kernel_batch(client, tmp_path):
    marker = str(tmp_path / "died")
    reference = dxode.solve(
        _eprob(prob_func=lambda prob, i, repeat: prob.remake(p=_p_of(i))),
        dxode.Tsit5(),
        EnsembleKernel(threads=1),
        trajectories=N,
        **SOLVE,
    )
    alg = EnsembleDask(client, kernel=EnsembleKernel(threads=1))
    eprob = _eprob(prob_func=_dying_once_prob_func(marker))
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=N, batch_size=5, **SOLVE)
    assert os.path.exists(marker)
    _assert_same(sim, reference)


def test_kernel_must_be_an_ensemble_kernel_and_excludes_backend():
    with pytest.raises(TypeError, match="kernel must be an EnsembleKernel"):
        EnsembleDask(kernel=dxode.EnsembleArray())
    with pytest.raises(ValueError, match="give one of them, not both"):
        EnsembleDask(backend="numpy", kernel=EnsembleKernel())


def test_continuous_adjoints_through_kernel_batches_are_refused_clearly():
    # Kernel batches are differentiated by forward sensitivities (test_kernel_gradients.py)
    # or the kernel discrete adjoint (test_kernel_adjoint.py, on Dask workers too); the
    # continuous adjoints are refused before any cluster is needed.
    from autograd import grad

    def loss(p):
        eprob = _eprob().prob.remake(p=p)
        alg = EnsembleDask(kernel=EnsembleKernel())
        sim = dxode.solve(
            EnsembleProblem(eprob),
            "tsit5",
            alg,
            trajectories=2,
            saveat=1.0,
            sensealg=dxode.InterpolatingAdjoint(),
        )
        return sim.u[0, -1, 0]

    with pytest.raises(
        KernelUnsupportedError, match=r"DiscreteAdjoint\(\)\).*InterpolatingAdjoint"
    ):
        grad(loss)(np.array([10.0, 28.0, 8 / 3]))


@pytest.mark.parametrize("device, cap", [("cpu", 100_000), ("cuda", 1_000_000)])
def test_automatic_kernel_batches_are_capped_by_the_kernel_not_the_array_path(client, device, cap):
    # The array path's 10^4 cap would cut a GPU's million-lane batches a hundredfold.
    alg = EnsembleDask(client, kernel=EnsembleKernel(device=device))
    assert alg.batch_size_for(10**8) == cap
    assert EnsembleDask(client).batch_size_for(10**8) == 10_000


def _rewritten_for_complex_step():
    """An f whose kernel gradients need the complex-step rewrite of its source (math.exp to
    cmath's; x**3, where x goes negative, to the real power), defined in a function so that
    cloudpickle sends it to the workers by value, without its file, as it sends an f defined
    in a script's __main__ or a notebook."""

    def cubic(u, p, t):
        x, v = u
        return [v, -p[0] * x - p[1] * x**3 * math.exp(-v * v)]

    return cubic


_P = np.array([[1.6, 0.3], [1.2, 0.1], [2.0, 0.5], [1.0, 0.2]])


def _lane_losses(q, f, alg, sensealg=None):
    prob = dxode.ODEProblem(f, np.array([1.0, -0.5]), (0.0, 2.0), (1.6, 0.3))
    options = {"saveat": [1.0, 2.0], "rtol": 1e-10, "atol": 1e-10, "sensealg": sensealg}
    sim = dxode.solve(EnsembleProblem(prob, p=q), "tsit5", alg, batch_size=2, **options)
    return (sim.u**2).sum(axis=(1, 2))


@pytest.mark.slow
@pytest.mark.parametrize(
    "sensealg", [dxode.ForwardSensitivity(), dxode.DiscreteAdjoint()], ids=["forward", "adjoint"]
)
def test_kernel_gradients_of_an_f_sent_by_value_are_the_local_ones(client, sensealg):
    """The workers had no source to rewrite for complex step, so they refused math.exp and
    ** by the names f's bytecode uses (after the forward pass, for the adjoint), where this
    process differentiates f: its source now travels with it."""
    import autograd
    import cloudpickle

    f = _rewritten_for_complex_step()
    assert cloudpickle.loads(cloudpickle.dumps(f)).__code__.co_filename == "<dynamic-code>"
    local = EnsembleKernel(threads=1)
    dask = EnsembleDask(client, kernel=EnsembleKernel(threads=1))
    here = autograd.grad(lambda q: _lane_losses(q, f, local, sensealg).sum())(_P)
    there = autograd.grad(lambda q: _lane_losses(q, f, dask, sensealg).sum())(_P)
    np.testing.assert_array_equal(there, here)
    h = 1e-6  # each lane's loss depends on its own row of p only
    for j in range(_P.shape[1]):
        step = np.zeros_like(_P)
        step[:, j] = h
        up, down = (_lane_losses(_P + s, f, local) for s in (step, -step))
        np.testing.assert_allclose(here[:, j], (up - down) / (2 * h), rtol=1e-6)


def test_a_kept_source_stands_for_the_code_it_was_read_from_only():
    """keep_sources' text travels with f's copy pickled by value, whose complex copy is then
    this process's; a copy whose code was replaced since is refused by the names its bytecode
    uses, as any f without source (the kept text is another function's)."""
    import cloudpickle

    from dxode.kernels.complex_step import complex_copy
    from dxode.kernels.rhs_source import keep_sources

    f = _rewritten_for_complex_step()
    keep_sources([f])
    copy = cloudpickle.loads(cloudpickle.dumps(f))
    u, p = (complex(-0.5, 2.0**-100), 0.25), (1.6, 0.3)
    assert complex_copy(copy)(u, p, 0.0) == complex_copy(f)(u, p, 0.0)

    def other(u, p, t):
        x, v = u
        return [v, -(x**3)]

    copy.__code__ = cloudpickle.loads(cloudpickle.dumps(other)).__code__
    with pytest.raises(KernelUnsupportedError, match=r"\*\*.*read off the names"):
        complex_copy(copy)
