"""Whether a solve is differentiated is decided without running user code twice, and a solve
nothing differentiates never passes through dxode.sensitivity."""

from __future__ import annotations

import pathlib
import sys

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import dxode

from problems import lorenz

P0 = (10.0, 28.0, 8.0 / 3.0)
SENSITIVITY = pathlib.Path(dxode.__file__).parent / "sensitivity"


def _sensitivity_calls(run):
    """The dxode.sensitivity functions ``run()`` calls (their code objects' names)."""
    calls = []

    def profile(frame, event, arg):
        if event == "call" and pathlib.Path(frame.f_code.co_filename).parent == SENSITIVITY:
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def _lorenz(tspan=(0.0, 0.5)):
    return dxode.ODEProblem(lorenz, [1.0, 0.0, 0.0], tspan, P0)


@pytest.mark.parametrize(
    "ensemble",
    [
        {"u0": np.ones((3, 3))},
        {"prob_func": lambda prob, i, repeat: prob.remake(u0=prob.u0 * (1 + i))},
        {"batch_func": lambda prob, ctx: {"u0": np.ones((len(ctx.indices), 3))}},
    ],
    ids=["arrays", "prob_func", "batch_func"],
)
@pytest.mark.parametrize("ensemble_alg", [dxode.EnsembleArray(), dxode.EnsembleSerial()])
def test_a_plain_ensemble_solve_calls_nothing_in_sensitivity(ensemble, ensemble_alg):
    eprob = dxode.EnsembleProblem(_lorenz(), **ensemble)

    def run():
        dxode.solve(eprob, dxode.Tsit5(), ensemble_alg, trajectories=3, saveat=[0.5])

    assert _sensitivity_calls(run) == []


def test_a_plain_single_solve_calls_nothing_in_sensitivity():
    assert _sensitivity_calls(lambda: dxode.solve(_lorenz(), saveat=[0.5])) == []


def test_prob_func_runs_once_per_trajectory_in_a_differentiated_ensemble():
    calls = []

    def loss(theta):
        def prob_func(prob, i, repeat):
            calls.append(i)
            return prob.remake(u0=theta * (1 + i))

        eprob = dxode.EnsembleProblem(_lorenz(), prob_func=prob_func)
        return anp.sum(dxode.solve(eprob, trajectories=3, saveat=[0.5]).u)

    autograd.grad(loss)(np.array([1.0, 0.0, 0.0]))
    assert sorted(calls) == [0, 1, 2]


def test_prob_func_runs_once_per_trajectory_when_autograd_traces_something_else():
    calls = []

    def prob_func(prob, i, repeat):
        calls.append(i)
        return prob.remake(u0=prob.u0 * (1 + i))

    eprob = dxode.EnsembleProblem(_lorenz(), prob_func=prob_func)
    plain = dxode.solve(eprob, trajectories=3, saveat=[0.5]).u
    calls.clear()

    def loss(scale):
        sim = dxode.solve(eprob, trajectories=3, saveat=[0.5])  # not differentiated
        return scale * np.sum(sim.u)

    assert autograd.grad(loss)(2.0) == np.sum(plain)
    assert sorted(calls) == [0, 1, 2]


@pytest.mark.parametrize("differentiated", [False, True])
def test_batch_func_runs_once_per_batch_under_autograd(differentiated):
    contexts = []

    def loss(theta):
        def batch_func(prob, ctx):
            contexts.append(ctx.indices.tolist())
            u0 = anp.outer(1.0 + ctx.indices, theta if differentiated else np.ones(3))
            return {"u0": u0}

        eprob = dxode.EnsembleProblem(_lorenz(), batch_func=batch_func)
        sim = dxode.solve(eprob, trajectories=3, saveat=[0.5])
        return anp.sum(sim.u) * anp.sum(theta)

    autograd.grad(loss)(np.array([1.0, 0.0, 0.0]))
    assert contexts == [[0, 1, 2]]


def test_f_sees_the_same_parameter_layout_with_and_without_gradients():
    # Every trajectory shares one weight array (not prob.p's) and has its own scale: one rule
    # (a leaf every trajectory shares with trajectory 0 stays one leaf) for both solves.
    ndims = {}  # differentiated -> the numbers of axes of (weights, scale) as f sees them
    weights = np.array([10.0, 28.0, 8.0 / 3.0])

    def f(u, p, t):
        w, scale = p
        ndims.setdefault(differentiated, set()).add((np.ndim(w), np.ndim(scale)))
        return lorenz(u, tuple(w[k] * scale for k in range(3)), t)

    def sim_u(theta):
        prob = dxode.ODEProblem(f, [1.0, 0.0, 0.0], (0.0, 0.5), (np.ones(3), 1.0))
        eprob = dxode.EnsembleProblem(
            prob, prob_func=lambda prob, i, repeat: prob.remake(u0=theta, p=(weights, 1.0 + i))
        )
        return dxode.solve(eprob, trajectories=3, saveat=[0.5], batch_size=2).u

    differentiated = False
    sim_u(np.array([1.0, 0.0, 0.0]))
    differentiated = True
    autograd.grad(lambda theta: anp.sum(sim_u(theta)))(np.array([1.0, 0.0, 0.0]))
    assert ndims[False] == {(1, 1)}  # weights shared, scale per lane (lanes last)
    assert ndims[True] == ndims[False]


def test_a_differentiated_ensemble_checks_saveat_against_every_tspan_as_a_plain_one():
    spans = np.array([[0.0, 1.0], [0.0, 2.0]])

    def loss(theta):
        eprob = dxode.EnsembleProblem(_lorenz(), u0=anp.stack([theta, theta]), tspan=spans)
        return anp.sum(dxode.solve(eprob, saveat=0.5).u)

    message = "saveat as an interval needs one shared tspan"
    with pytest.raises(ValueError, match=message):
        dxode.solve(dxode.EnsembleProblem(_lorenz(), u0=np.ones((2, 3)), tspan=spans), saveat=0.5)
    with pytest.raises(ValueError, match=message):
        autograd.grad(loss)(np.array([1.0, 0.0, 0.0]))
