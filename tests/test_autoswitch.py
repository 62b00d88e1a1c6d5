"""AutoSwitch: every lane detects its own stiffness and switches methods both ways.

The switching problem is Prothero–Robinson, ``u' = -lambda(t) (u - cos t) - sin t`` with
``u(0) = 1`` and exact solution ``cos t`` whatever ``lambda``: with
``lambda(t) = 1 + a (tanh(5 (t - 2)) - tanh(5 (t - 6))) / 2`` a lane with ``a = 1e4`` turns
stiff near ``t = 2`` and relaxes near ``t = 6`` (``a = 0`` never does).
"""

from __future__ import annotations

import array_api_compat
import numpy as np
import pytest

import dxode

from conftest import to_numpy
from matrix import namespace

SPAN = (0.0, 10.0)
TOL = {"rtol": 1e-6, "atol": 1e-8}


def prothero(u, p, t):
    xp = array_api_compat.array_namespace(u)
    lam = 1.0 + p * 0.5 * (xp.tanh(5.0 * (t - 2.0)) - xp.tanh(5.0 * (t - 6.0)))
    return -lam * (u - xp.cos(t)) - xp.sin(t)


def vdp(u, p, t):
    x, y = u
    return [y, p * (1 - x * x) * y - x]


def _prothero(amplitude, xp=np, dtype_name="float64"):
    u0 = xp.asarray([1.0], dtype=getattr(xp, dtype_name))
    return dxode.ODEProblem(prothero, u0, SPAN, amplitude)


def test_a_lane_that_turns_stiff_switches_and_switches_back():
    times = np.linspace(*SPAN, 1001)
    stiff = dxode.solve(_prothero(1e4), dxode.AutoSwitch(), **TOL)
    assert stiff.retcode == dxode.ReturnCode.Success
    assert stiff.stats.nswitch == 2  # to Rodas5P as lambda rises, back to Tsit5 as it falls
    assert 0 < stiff.stats.njac < stiff.stats.naccept  # only part of the way on Rodas5P
    assert stiff.stats.njac == stiff.stats.nlu
    # Dense output across both switches: each step interpolated by the method that took it.
    np.testing.assert_allclose(stiff(times)[:, 0], np.cos(times), atol=2e-5)
    mild = dxode.solve(_prothero(0.0), dxode.AutoSwitch(), **TOL)
    assert (mild.stats.nswitch, mild.stats.njac) == (0, 0)
    # Never stiff: exactly Tsit5's steps.
    tsit5 = dxode.solve(_prothero(0.0), dxode.Tsit5(), **TOL)
    np.testing.assert_array_equal(mild.u, tsit5.u)
    assert mild.stats == tsit5.stats


def test_saveat_across_switches_and_lanes_switch_on_their_own():
    # Mixed lanes in one batch: each keeps its own method; the same as solving it alone.
    amplitudes = np.array([0.0, 1e4, 3e3, 0.0])
    eprob = dxode.EnsembleProblem(_prothero(0.0), p=amplitudes)
    saveat = np.linspace(*SPAN, 41)
    kwargs = {"trajectories": 4, "saveat": saveat, **TOL}
    sim = dxode.solve(eprob, dxode.AutoSwitch(), dxode.EnsembleArray(), **kwargs)
    assert list(sim.stats.nswitch) == [0, 2, 2, 0]
    np.testing.assert_allclose(sim.u[:, :, 0], np.cos(saveat) + 0 * sim.u[:, :, 0], atol=2e-5)
    serial = dxode.solve(eprob, dxode.AutoSwitch(), dxode.EnsembleSerial(), **kwargs)
    np.testing.assert_array_equal(serial.stats.nswitch, sim.stats.nswitch)
    np.testing.assert_array_equal(serial.stats.naccept, sim.stats.naccept)
    np.testing.assert_allclose(serial.u, sim.u, rtol=1e-12, atol=1e-14)
    assert sim[1].stats.nswitch == 2


def test_accuracy_against_a_tight_radau_reference():
    # Van der Pol, mu = 1000, from the start of its slow branch: the lane turns stiff and
    # switches to Rodas5P for good.
    scipy_integrate = pytest.importorskip("scipy.integrate")
    mu, span = 1000.0, (0.0, 700.0)
    saveat = np.linspace(*span, 15)
    ref = scipy_integrate.solve_ivp(
        lambda t, u: vdp(u, mu, t),
        span,
        [2.0, 0.0],
        "Radau",
        t_eval=saveat,
        rtol=1e-10,
        atol=1e-11,
        jac=lambda t, u: [[0.0, 1.0], [-2 * mu * u[0] * u[1] - 1.0, mu * (1 - u[0] ** 2)]],
    )
    prob = dxode.ODEProblem(vdp, np.array([2.0, 0.0]), span, mu)
    sol = dxode.solve(prob, dxode.AutoSwitch(), saveat=saveat, **TOL)
    assert sol.retcode == dxode.ReturnCode.Success
    assert sol.stats.nswitch == 1
    np.testing.assert_allclose(sol.u, ref.y.T, rtol=1e-5, atol=1e-7)
    rodas = dxode.solve(prob, dxode.Rodas5P(), saveat=saveat, **TOL)
    # Fewer Jacobians than Rodas5P alone: the first steps are explicit.
    assert sol.stats.njac < rodas.stats.njac


def test_mixed_van_der_pol_ensemble_switches_only_its_stiff_lanes():
    # mu log-uniform in [1, 1000], t in [0, 50], no Jacobian: stiff lanes switch to Rodas5P,
    # mild ones never leave Tsit5 (and take exactly its steps).
    rng = np.random.default_rng(7)
    mus = np.concatenate([[1.0, 1000.0], np.exp(rng.uniform(0.0, np.log(1000.0), 14))])
    prob = dxode.ODEProblem(vdp, np.array([2.0, 0.0]), (0.0, 50.0), 1.0)
    kwargs = {"saveat": [25.0, 50.0], **TOL}
    sim = dxode.solve(
        dxode.EnsembleProblem(prob, p=mus), dxode.AutoSwitch(), trajectories=len(mus), **kwargs
    )
    assert np.all(sim.retcodes == int(dxode.ReturnCode.Success))
    nswitch = np.asarray(sim.stats.nswitch)
    assert np.all(nswitch[mus >= 100.0] >= 1)
    assert np.all(nswitch[mus <= 5.0] == 0)
    assert np.all(nswitch <= 7)  # hysteresis: a handful per lane over its phases
    for alg, lanes in ((dxode.Tsit5(), mus <= 5.0), (dxode.Rodas5P(), mus >= 30.0)):
        eprob = dxode.EnsembleProblem(prob, p=mus[lanes])
        ref = dxode.solve(eprob, alg, trajectories=int(lanes.sum()), **kwargs)
        np.testing.assert_allclose(sim.u[lanes], ref.u, rtol=1e-4, atol=1e-5)


def _decide(switch, memory, h_rho):
    h = np.ones(1)
    rho = np.array([h_rho * switch.boundary])
    return switch.decide(np, memory, rho, h, np.ones(1, dtype=bool), h)


@pytest.mark.parametrize("start_stiff", [False, True])
def test_hysteresis_needs_consecutive_votes_and_has_a_dead_band(start_stiff):
    switch = dxode.AutoSwitch(stiff_steps=4, nonstiff_steps=3)
    memory = switch.lane_memory(np, np.zeros((2, 1)))
    memory["stiff"][:] = start_stiff
    # Votes that alternate never switch a lane, however long.
    for step in range(40):
        memory, switched, _ = _decide(switch, memory, 2.0 if step % 2 else 0.1)
        assert not switched[0]
    # Inside the dead band (between nonstiff_tol and stiff_tol) a lane stays where it is.
    for _ in range(40):
        memory, switched, _ = _decide(switch, memory, 0.7)
        assert not switched[0]
    # Enough consecutive votes the other way switch it, once.
    votes = 0.1 if start_stiff else 2.0
    needed = 3 if start_stiff else 4
    for step in range(needed):
        memory, switched, h_next = _decide(switch, memory, votes)
        assert switched[0] == (step == needed - 1)
    assert memory["stiff"][0] == (not start_stiff)
    assert memory["nswitch"][0] == 1
    if start_stiff:  # back on the explicit method: the first step is inside its stability
        assert h_next[0] <= switch.stiff_tol / votes


@pytest.mark.parametrize("stiff", [dxode.Rodas5P(), dxode.Rodas4()], ids=repr)
def test_float32(stiff):
    # Rodas4's error estimate has another order than Tsit5's: per-lane controller exponents.
    sol = dxode.solve(
        _prothero(1e4, np, "float32"),
        dxode.AutoSwitch(stiff=stiff),
        saveat=[3.0, 5.0, 10.0],
        rtol=1e-4,
        atol=1e-6,
    )
    assert sol.u.dtype == np.float32
    assert sol.t.dtype == np.float32
    assert sol.retcode == dxode.ReturnCode.Success
    assert sol.stats.nswitch == 2
    np.testing.assert_allclose(sol.u[:, 0], np.cos([3.0, 5.0, 10.0]), atol=1e-3)


def test_array_api_strict_backend():
    xp = namespace("array_api_strict")
    tol = {"rtol": 1e-4, "atol": 1e-6}
    sol = dxode.solve(_prothero(1e4, xp), dxode.AutoSwitch(), saveat=[3.0, 10.0], **tol)
    assert array_api_compat.array_namespace(sol.u) is array_api_compat.array_namespace(
        xp.asarray([0.0])
    )
    assert sol.retcode == dxode.ReturnCode.Success
    assert sol.stats.nswitch == 2
    np.testing.assert_allclose(to_numpy(sol.u)[:, 0], np.cos([3.0, 10.0]), atol=1e-3)
    reference = dxode.solve(_prothero(1e4), dxode.AutoSwitch(), saveat=[3.0, 10.0], **tol)
    assert sol.stats == reference.stats  # the same steps as on NumPy


@pytest.mark.slow
def test_dask_ensemble(client, tmp_path):
    from dxode import EnsembleDask

    amplitudes = np.array([0.0, 1e4, 3e3, 0.0])
    eprob = dxode.EnsembleProblem(_prothero(0.0), p=amplitudes)
    kwargs = {"trajectories": 4, "saveat": [5.0, 10.0], "batch_size": 2, **TOL}
    sim = dxode.solve(eprob, dxode.AutoSwitch(), EnsembleDask(client), **kwargs)
    local = dxode.solve(eprob, dxode.AutoSwitch(), dxode.EnsembleArray(), **kwargs)
    np.testing.assert_array_equal(sim.stats.nswitch, [0, 2, 2, 0])
    np.testing.assert_array_equal(sim.u, local.u)
    # The switches travel with the statistics: into a Zarr store, and summed by a reduction.
    store = str(tmp_path / "switches.zarr")
    zarr_sim = dxode.solve(
        eprob, dxode.AutoSwitch(), EnsembleDask(client, output="zarr", store=store), **kwargs
    )
    np.testing.assert_array_equal(np.asarray(zarr_sim.stats.nswitch), [0, 2, 2, 0])
    assert zarr_sim.stats.total_nswitch == 4
    reduced = dxode.EnsembleProblem(
        _prothero(0.0),
        p=amplitudes,
        reduction=lambda acc, u, idx: (acc + len(idx), False),
        u_init=0,
    )
    for alg in (EnsembleDask(client), dxode.EnsembleArray()):
        total = dxode.solve(reduced, dxode.AutoSwitch(), alg, **kwargs)
        assert total.stats.nswitch is None and total.stats.total_nswitch == 4


def test_bad_method_pairs_and_settings_are_refused():
    with pytest.raises(ValueError, match="use Tsit5"):
        dxode.AutoSwitch(nonstiff=dxode.Vern7())
    with pytest.raises(TypeError, match="explicit Runge–Kutta"):
        dxode.AutoSwitch(nonstiff=dxode.Rodas5P())
    with pytest.raises(TypeError, match="stiff method"):
        dxode.AutoSwitch(stiff=dxode.DP5())
    with pytest.raises(ValueError, match="nonstiff_tol <= stiff_tol"):
        dxode.AutoSwitch(nonstiff_tol=0.95)
    with pytest.raises(ValueError, match="stiff_steps"):
        dxode.AutoSwitch(stiff_steps=0)
    # A string failed with "'<=' not supported between instances of 'float' and 'str'".
    with pytest.raises(TypeError, match=r"stiff_tol must be a number, got '0\.9'"):
        dxode.AutoSwitch(stiff_tol="0.9")
    # NumPy integers were refused ("stiff_steps must be a positive integer, got np.int64(3)").
    assert dxode.AutoSwitch(stiff_steps=np.int64(3)).stiff_steps == 3
    # A state the stiff method cannot take is refused before the first step, not at a switch.
    matrix_state = dxode.ODEProblem(lambda u, p, t: -u, np.ones((2, 2)), (0.0, 1.0))
    with pytest.raises(ValueError, match="1-D state"):
        dxode.solve(matrix_state, dxode.AutoSwitch())


@pytest.mark.parametrize(
    ("stiff", "rtol"),
    [(dxode.Rosenbrock23(), 1e-4), (dxode.Rodas4(), 1e-5), (dxode.TRBDF2(), 1e-5)],
)
def test_other_stiff_methods_switch_too(stiff, rtol):
    # As accurate as the stiff method alone (TRBDF2's order drops on this problem).
    kwargs = {"saveat": [4.0, 10.0], "rtol": rtol, "atol": rtol * 1e-2}
    sol = dxode.solve(_prothero(1e4), dxode.AutoSwitch(stiff=stiff), **kwargs)
    assert sol.retcode == dxode.ReturnCode.Success
    assert sol.stats.nswitch == 2
    alone = dxode.solve(_prothero(1e4), stiff, **kwargs)
    exact = np.cos([4.0, 10.0])
    assert np.all(np.abs(sol.u[:, 0] - exact) <= 2 * np.abs(alone.u[:, 0] - exact) + 1e-5)


def test_gradients_and_kernels_name_the_fix():
    autograd = pytest.importorskip("autograd")

    def loss(a):
        sol = dxode.solve(_prothero(a), dxode.AutoSwitch(), saveat=[1.0], **TOL)
        return sol.u[0, 0]

    with pytest.raises(NotImplementedError, match="choose one method"):
        autograd.grad(loss)(1.0)
    with pytest.raises(Exception, match="array path"):
        dxode.solve(_prothero(0.0), dxode.AutoSwitch(), kernel=True)


def test_events_are_located_with_the_interpolant_of_the_method_that_stepped():
    # cos t crosses zero at pi/2 (Tsit5), 3 pi/2 (Rodas5P, inside the stiff window), 5 pi/2
    # (Tsit5 again).
    crossing = dxode.ContinuousCallback(lambda u, p, t: u[0], lambda u, p, t, fired: u)
    sol = dxode.solve(_prothero(1e4), dxode.AutoSwitch(), callback=crossing, **TOL)
    assert sol.stats.nswitch == 2
    np.testing.assert_allclose(sol.events.t, np.pi * np.array([0.5, 1.5, 2.5]), atol=1e-6)
