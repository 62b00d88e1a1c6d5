"""Errors raised by an ensemble's own functions keep their type and name their trajectory."""

from __future__ import annotations

import pytest

import dxode
from dxode import EnsembleProblem


class BoomError(Exception):
    """A user's own exception type."""


def _decay():
    return dxode.ODEProblem(lambda u, p, t: -p[0] * u, [1.0], (0.0, 1.0), [1.0])


def _prob_func(prob, i, repeat):
    if i == 7:
        raise BoomError("no rate for this one")
    return prob.remake(p=[1.0 + i])


def _context_prob_func(prob, ctx):
    if ctx.index == 7 and ctx.repeat == 1:
        raise BoomError("no rate for the rerun")
    return prob


def _rerun_seven(sol, i):
    return sol.u[-1], i == 7


def _batch_func(prob, ctx):
    if 7 in ctx.indices:
        raise BoomError("no rates for this batch")
    return {"p": 1.0 + ctx.indices[:, None].astype(float)}


def _output_func(sol, i):
    if i == 7:
        raise BoomError("cannot summarize")
    return sol.u[-1], False


@pytest.mark.parametrize(
    ("alg", "kwargs", "note"),
    [
        (dxode.EnsembleArray(), {"prob_func": _prob_func}, "raised by prob_func for trajectory 7"),
        (dxode.EnsembleSerial(), {"prob_func": _prob_func}, "raised by prob_func for trajectory 7"),
        (
            dxode.EnsembleArray(),
            {"prob_func": _context_prob_func, "output_func": _rerun_seven},
            "raised by prob_func for trajectory 7 (rerun 1)",
        ),
        (
            dxode.EnsembleArray(),
            {"batch_func": _batch_func},
            "raised by batch_func for trajectories 4-7",
        ),
        (
            dxode.EnsembleArray(),
            {"output_func": _output_func},
            "raised by output_func for trajectory 7",
        ),
    ],
    ids=["prob_func", "prob_func-serial", "prob_func-rerun", "batch_func", "output_func"],
)
def test_an_error_of_a_user_function_names_its_trajectory(alg, kwargs, note):
    eprob = EnsembleProblem(_decay(), **kwargs)
    with pytest.raises(BoomError) as raised:
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=12, batch_size=4)
    assert raised.value.__notes__ == [note]
