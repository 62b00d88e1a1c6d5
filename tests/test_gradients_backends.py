"""Gradients of ensembles that compute on another backend (array_api_strict here, CuPy on a GPU).

Autograd traces the loss on the host; the batches' forward and backward passes run on the
ensemble's backend with the problem's hand-written VJP. On array_api_strict the arithmetic is
the same as NumPy's, so the gradients must agree to the last bit.
"""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode

from matrix import DTYPES, namespace
from problems import lorenz_xp as lorenz
from problems import lorenz_xp_jac, lorenz_xp_paramjac
from problems import lorenz_xp_vjp as lorenz_vjp

SCALE = 1 + 0.1 * (np.random.default_rng(3).random((12, 3)) - 0.5)
THETA = np.array([10.0, 28.0, 8.0 / 3.0])


def ensemble_loss(
    u0,
    ensemble_alg=None,
    sensealg=None,
    dtype="float64",
    tol=1e-6,
    vjp=lorenz_vjp,
    t1=1.0,
    **derivatives,
):
    """Loss over 12 trajectories: per-lane parameters and starts built from theta (6,)."""
    n = SCALE.shape[0]

    def loss(theta):
        prob = dxode.ODEProblem(lorenz, u0, (0.0, t1), THETA.astype(dtype), vjp=vjp, **derivatives)
        starts = theta[None, :3] * (1 + 0.01 * np.arange(n))[:, None]
        eprob = dxode.EnsembleProblem(prob, u0=starts, p=theta[None, 3:] * SCALE.astype(dtype))
        sim = dxode.solve(
            eprob,
            dxode.Tsit5(),
            ensemble_alg,
            trajectories=n,
            batch_size=5,
            saveat=t1 / 2,
            rtol=tol,
            atol=tol,
            sensealg=sensealg,
        )
        return anp.sum(sim.u**2)

    return loss


START = np.array([1.0, 0.5, 0.2, *THETA])


@pytest.mark.parametrize(
    "sensealg", [dxode.DiscreteAdjoint(), dxode.DiscreteAdjoint(checkpoint_every=3)], ids=repr
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_array_api_gradients_are_numpys_to_the_last_bit(sensealg, dtype):
    import array_api_strict as xps

    start = START.astype(dtype)
    on_numpy = autograd.grad(ensemble_loss(np.zeros(3, dtype), sensealg=sensealg, dtype=dtype))
    u0 = xps.zeros(3, dtype=getattr(xps, dtype))
    on_strict = autograd.grad(ensemble_loss(u0, sensealg=sensealg, dtype=dtype))
    g = on_strict(start)
    assert g.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(g, on_numpy(start))


def test_a_single_problem_on_another_backend_gets_numpys_gradient():
    # The traced single solve took u0's dtype as it is (array_api_strict's), which NumPy
    # cannot interpret: it failed inside dxode.
    import array_api_strict as xps

    def loss(theta, u0):
        prob = dxode.ODEProblem(lorenz, u0, (0.0, 0.5), theta, vjp=lorenz_vjp)
        return anp.sum(dxode.solve(prob, saveat=[0.25, 0.5], rtol=1e-6, atol=1e-6).u ** 2)

    on_strict = autograd.grad(loss)(THETA, xps.asarray([1.0, 0.5, 0.2]))
    np.testing.assert_array_equal(on_strict, autograd.grad(loss)(THETA, np.array([1.0, 0.5, 0.2])))


def test_array_api_gradients_match_finite_differences():
    import array_api_strict as xps

    loss = ensemble_loss(xps.zeros(3, dtype=xps.float64), tol=1e-10, t1=0.3)
    g = autograd.grad(loss)(START)
    direction = np.random.default_rng(0).standard_normal(6)  # one directional derivative
    eps = 1e-6
    fd = (loss(START + eps * direction) - loss(START - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(g @ direction, fd, rtol=1e-6)


def test_jac_and_paramjac_serve_as_derivatives_on_another_backend():
    import array_api_strict as xps

    u0 = xps.zeros(3, dtype=xps.float64)
    by_vjp = autograd.grad(ensemble_loss(u0))(START)
    by_jacobians = ensemble_loss(u0, vjp=None, jac=lorenz_xp_jac, paramjac=lorenz_xp_paramjac)
    np.testing.assert_allclose(autograd.grad(by_jacobians)(START), by_vjp, rtol=1e-12)


def test_other_backends_need_a_vjp_and_the_discrete_adjoint():
    import array_api_strict as xps

    u0 = xps.zeros(3, dtype=xps.float64)
    with pytest.raises(NotImplementedError, match="autograd cannot trace f: give the problem"):
        autograd.grad(ensemble_loss(u0, vjp=None))(START)
    with pytest.raises(NotImplementedError, match="runs on NumPy only"):
        autograd.grad(ensemble_loss(u0, sensealg=dxode.InterpolatingAdjoint()))(START)


def test_a_failed_lane_on_another_backend_gives_nan_only_for_its_own_start():
    import array_api_strict as xps

    def blowup(u, p, t):
        return u * u * p

    def blowup_vjp(u, p, t, v):
        return 2 * u * p * v, u * u * v

    def loss(theta):
        prob = dxode.ODEProblem(
            blowup, xps.ones(1, dtype=xps.float64), (0.0, 2.0), 1.0, vjp=blowup_vjp
        )
        eprob = dxode.EnsembleProblem(prob, u0=theta[:, None], p=np.ones((2, 1)))
        sim = dxode.solve(eprob, trajectories=2, saveat=[0.5], rtol=1e-8, atol=1e-10)
        return anp.sum(sim.u)

    g = autograd.grad(loss)(np.array([0.1, 1.0]))  # the second lane blows up at t = 1
    assert np.isfinite(g[0]) and np.isnan(g[1])
    np.testing.assert_allclose(g[0], 1 / (1 - 0.1 * 0.5) ** 2, rtol=1e-5)  # d/du0 of u0/(1-u0 t)


@pytest.mark.gpu
def test_cupy_gradients_match_numpy():
    namespace("cupy")  # skips without a GPU
    loss_gpu = ensemble_loss(np.zeros(3), ensemble_alg=dxode.EnsembleArray(backend="cupy"))
    loss_cpu = ensemble_loss(np.zeros(3))
    np.testing.assert_allclose(
        autograd.grad(loss_gpu)(START), autograd.grad(loss_cpu)(START), rtol=1e-9
    )
