"""Errors raised by an ensemble's own functions keep their type and name their trajectory."""

from __future__ import annotations

import numpy as np
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


def _local_algorithms():
    """Every local ensemble algorithm; the kernel one refuses bad trajectories before it
    compiles anything."""
    algs = [dxode.EnsembleSerial(), dxode.EnsembleArray()]
    try:
        import numba  # noqa: F401
    except ImportError:
        return algs
    return [*algs, dxode.EnsembleKernel()]


def _changed_at_five(**changes):
    def prob_func(prob, i, repeat):
        return prob.remake(**changes) if i == 5 else prob

    return prob_func


@pytest.mark.parametrize("alg", _local_algorithms(), ids=lambda a: type(a).__name__)
@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"p": (2.0,)}, r"trajectory 5's p has a different structure than prob.p"),
        ({"f": lambda u, p, t: -u}, r"prob_func changed f for trajectory 5;"),
        ({"u0": [1.0, 2.0]}, r"trajectory 5 has u0 shape \(2,\), expected \(1,\)"),
    ],
    ids=["p-structure", "f", "u0-shape"],
)
def test_every_algorithm_refuses_a_misfit_trajectory_by_its_index(alg, change, match):
    # EnsembleSerial solved these (a tuple p for a list prob.p, another f) or failed inside
    # NumPy's stack; the others named the trajectory's position in its batch (1, not 5).
    eprob = EnsembleProblem(_decay(), prob_func=_changed_at_five(**change))
    with pytest.raises(ValueError, match=match):
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=8, batch_size=4, saveat=[1.0])


@pytest.mark.parametrize("alg", _local_algorithms(), ids=lambda a: type(a).__name__)
def test_a_number_for_an_array_leaf_of_prob_p_is_refused_by_trajectory(alg):
    # prob.p is the array [1.0] (f reads p[0]) and prob_func gives trajectory i the number
    # 1 + i: the structures match (one leaf), so EnsembleArray stacked the numbers into the
    # lanes' (B,) row and every lane's p[0] was trajectory 0's rate, silently.
    prob = dxode.ODEProblem(lambda u, p, t: -p[0] * u, [1.0], (0.0, 1.0), np.array([1.0]))
    eprob = EnsembleProblem(prob, prob_func=lambda prob, i, repeat: prob.remake(p=1.0 + i))
    with pytest.raises(ValueError, match=r"trajectory 0's p holds a number where prob.p"):
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=4, batch_size=2, saveat=[1.0])


@pytest.mark.parametrize("alg", _local_algorithms(), ids=lambda a: type(a).__name__)
def test_an_array_of_another_shape_in_p_is_refused_by_trajectory(alg):
    # prob.p is the array [1.0]; trajectory 5's [1.0, 2.0] was solved by EnsembleSerial (f
    # read its first number) while EnsembleArray failed in NumPy's stack ("all input arrays
    # must have the same shape").
    prob = dxode.ODEProblem(lambda u, p, t: -p[0] * u, [1.0], (0.0, 1.0), np.array([1.0]))
    eprob = EnsembleProblem(prob, prob_func=_changed_at_five(p=np.array([1.0, 2.0])))
    with pytest.raises(ValueError, match=r"trajectory 5's p holds an array of shape \(2,\)"):
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=8, batch_size=4, saveat=[1.0])


@pytest.mark.parametrize("alg", _local_algorithms(), ids=lambda a: type(a).__name__)
@pytest.mark.parametrize(
    ("saveat", "match"),
    [
        ([0.5, 2.5], r"time 2.5 is outside the tspan \(0.0, 2.0\) of trajectory 1;"),
        ([1.5], r"time 1.5 is outside the tspan \(0.0, 1.0\) of trajectory 2;"),
        ([0.5, 3.5], r"time 3.5 is outside the tspan \(0.0, 3.0\) of trajectory 0;"),
    ],
)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_saveat_outside_a_trajectory_span_names_that_trajectory(alg, saveat, match, batch_size):
    # The message named trajectory 0's span, (0.0, 3.0) here, whichever trajectory's span
    # the time lay outside of (and no trajectory at all).
    spans = [[0.0, 3.0], [0.0, 2.0], [0.0, 1.0]]
    eprob = EnsembleProblem(_decay(), tspan=spans)
    with pytest.raises(ValueError, match=match):
        dxode.solve(eprob, dxode.Tsit5(), alg, saveat=saveat, batch_size=batch_size)


def _rows(extra=0, width=1, key="u0"):
    def batch_func(prob, ctx):
        return {key: np.ones((len(ctx.indices) + extra, width))}

    return batch_func


def _scalar_rates(prob, ctx):
    return {"p": 1.0 + ctx.indices.astype(float)}


def _shared_p(prob, ctx):
    return {"p": [2.0]}


def _backwards_at_one(prob, i, repeat):
    return prob.remake(tspan=(1.0, 0.0)) if i == 1 else prob


@pytest.mark.parametrize("alg", _local_algorithms(), ids=lambda a: type(a).__name__)
@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"u0": np.ones((4, 3))}, r"per-trajectory u0 must have shape \(trajectories, \*\(1,\)\)"),
        ({"batch_func": _rows(extra=1)}, "expected 2 trajectories along the first axis, got 3"),
        ({"batch_func": _rows(width=3)}, r"u0 must have shape \(trajectories, \*\(1,\)\)"),
        ({"prob_func": _backwards_at_one}, "must integrate in the same time direction"),
        ({"p": np.arange(1.0, 5.0)}, r"per-trajectory p gives each trajectory one number"),
        ({"batch_func": _scalar_rates}, r"shape \(trajectories, 1\)"),
        ({"batch_func": _shared_p}, r"per-trajectory p needs a leading axis of 2 trajectories"),
        ({"p": np.ones((4, 3))}, r"a row of shape \(3,\), but prob.p, the form f indexes"),
        ({"p": np.ones((1, 4))}, r"p looks transposed \(one column per trajectory\): give p.T"),
        ({"batch_func": _rows(key="p", width=2)}, r"shape \(trajectories, 1\), trajectories"),
        ({"p": (np.ones(4), np.ones(4))}, r"p is a tuple of 2, but prob.p, .* a list of 1"),
    ],
    ids=[
        "arrays-u0-shape",
        "batch_func-rows",
        "batch_func-u0-shape",
        "directions",
        "p-rows-for-a-list",
        "batch_func-p-rows",
        "batch_func-shared-p",
        "p-rows-wider-than-prob-p",
        "p-transposed",
        "batch_func-p-rows-wider",
        "p-entries-unlike-prob-p",
    ],
)
def test_every_algorithm_refuses_misfit_arrays_alike(alg, given, match):
    # EnsembleSerial solved the first four: trajectories with a (3,) state for a (1,) prob.u0,
    # the first rows of a batch_func's extra ones, spans running both ways in one batch.
    # One rate per trajectory, (N,), where prob.p is the list [1.0]: f's p[0] read the batch's
    # first rate for every lane of EnsembleArray (a silent wrong answer), the kernel failed
    # to compile p[0] on a number. A batch_func returning prob.p's own form, [2.0], (a number
    # where each trajectory needs a row) raised an IndexError from inside the batch code.
    # Rows of 3 numbers for that one-number list were solved with their first (the rest
    # ignored), and transposed rates, (1, 4), were counted as one trajectory of 4 numbers.
    # A tuple of per-trajectory arrays unlike prob.p's entries failed inside f (unpacking).
    eprob = EnsembleProblem(_decay(), **given)
    with pytest.raises(ValueError, match=match):
        dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=4, batch_size=2, saveat=[0.5])


@pytest.mark.parametrize("alg", _local_algorithms(), ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("rates", [(np.arange(1.0, 5.0),), np.arange(1.0, 5.0)[:, None]])
def test_one_rate_per_trajectory_nested_as_prob_p_is_each_trajectory_s_own(alg, rates):
    # prob.p is [1.0]; a tuple of one (N,) leaf or an (N, 1) array gives each trajectory its
    # own p[0] (the check above refuses only a bare (N,) leaf).
    eprob = EnsembleProblem(_decay(), p=rates)
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, batch_size=3, saveat=[0.5], rtol=1e-8)
    exact = np.exp(-0.5 * np.arange(1.0, 5.0))
    np.testing.assert_allclose(sim.u[:, 0, 0], exact, rtol=1e-6)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_spans_in_both_directions_are_refused_whatever_the_batching(batch_size):
    # Checked batch by batch only, so batch_size=1 solved them.
    eprob = EnsembleProblem(_decay(), tspan=[[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="must integrate in the same time direction"):
        dxode.solve(eprob, dxode.Tsit5(), batch_size=batch_size)


def _fold(acc, values, indices):
    if 5 in indices:
        raise BoomError("cannot fold")
    return acc + len(indices), False


def _never_content(sol, i):
    return 0.0, i == 3


def test_a_reduction_error_names_its_trajectories_and_endless_reruns_name_theirs():
    eprob = EnsembleProblem(_decay(), reduction=_fold, u_init=0)
    with pytest.raises(BoomError) as raised:
        dxode.solve(eprob, dxode.Tsit5(), trajectories=8, batch_size=4)
    assert raised.value.__notes__ == ["raised by reduction for trajectories 4-7"]
    endless = EnsembleProblem(_decay(), output_func=_never_content)
    with pytest.raises(RuntimeError, match="more than 100 reruns of trajectory 3;"):
        dxode.solve(endless, dxode.Tsit5(), trajectories=8, batch_size=4)


def _count_until(converged):
    def reduction(acc, values, indices):
        return acc + len(indices), converged

    return reduction


@pytest.mark.parametrize("converged", ["no", None, 1, np.array([True, False])])
def test_a_reduction_s_converged_that_is_not_a_bool_is_refused(converged):
    # "no" stopped the solve after its first batch, None did not, and an array of
    # booleans failed with NumPy's "truth value of an array ... is ambiguous".
    eprob = EnsembleProblem(_decay(), reduction=_count_until(converged), u_init=0)
    match = r"converged a bool .* got converged=.* for trajectories 0-3"
    with pytest.raises(TypeError, match=match):
        dxode.solve(eprob, dxode.Tsit5(), trajectories=8, batch_size=4)


@pytest.mark.parametrize("converged", [np.bool_(True), np.array(True)])
def test_a_reduction_may_say_converged_with_a_numpy_bool(converged):
    eprob = EnsembleProblem(_decay(), reduction=_count_until(converged), u_init=0)
    sim = dxode.solve(eprob, dxode.Tsit5(), trajectories=8, batch_size=4)
    assert sim.u == 4 and sim.converged is True


def test_dense_output_that_a_reduction_never_reads_is_refused():
    # dense=True recorded every step of every batch for nothing: the reduction gets the
    # saved states and no trajectory is kept
    eprob = EnsembleProblem(_decay(), reduction=_count_until(False), u_init=0)
    with pytest.raises(ValueError, match=r"dense=True .* call sol\(t\) in an output_func"):
        dxode.solve(eprob, dxode.Tsit5(), trajectories=8, batch_size=4, dense=True)
    assert dxode.solve(eprob, dxode.Tsit5(), trajectories=8, batch_size=4).u == 8


def _longer_spans(prob, i, repeat):
    return prob.remake(tspan=(0.0, 1.0 + i))


def _save_count(sol, i):
    return len(sol.t), False


def _count_saves(acc, values, indices):
    return acc + len(indices), False


KEPT = {
    "states": {},
    "output_func": {"output_func": _save_count},
    "reduction": {"reduction": _count_saves, "u_init": 0},
}


@pytest.mark.parametrize("kept", sorted(KEPT))
@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.parametrize("how", ["arrays", "prob_func"])
def test_an_interval_saveat_with_spans_of_different_lengths_is_refused_clearly(
    batch_size, how, kept
):
    # With batch_size=1 each batch had its own grid: NumPy failed while assembling them
    # ("could not broadcast input array from shape (1,5,1) into shape (1,3,1)"); with an
    # output_func ("operands could not be broadcast together with shapes (5,) (3,)"), and a
    # reduction folded the batches and kept the first batch's save times.
    given = {"tspan": [[0.0, 1.0], [0.0, 2.0]]} if how == "arrays" else {"prob_func": _longer_spans}
    eprob = EnsembleProblem(_decay(), **given, **KEPT[kept])
    with pytest.raises(ValueError, match="saveat as an interval needs one shared tspan"):
        dxode.solve(eprob, dxode.Tsit5(), trajectories=2, batch_size=batch_size, saveat=0.5)


def _longer_on_rerun(prob, i, repeat):
    return prob.remake(tspan=(0.0, 1.0 + repeat))


def _rerun_once(sol, i):
    return len(sol.t), sol.prob.tspan[1] < 2.0


@pytest.mark.parametrize("alg", [dxode.EnsembleArray(), dxode.EnsembleSerial()])
def test_a_rerun_saving_another_number_of_times_is_refused_clearly(alg):
    # Its save times, 5 of them against the first attempt's 3, cannot join the batch's.
    eprob = EnsembleProblem(_decay(), prob_func=_longer_on_rerun, output_func=_rerun_once)
    match = r"trajectories 0-1 saved 5 times, their first attempt 3: saveat as an interval"
    with pytest.raises(ValueError, match=match):
        dxode.solve(eprob, alg, trajectories=2, saveat=0.5)


def test_one_tspan_pair_for_the_ensemble_is_refused_with_the_fix():
    # It was taken as two trajectories' spans of one number each: "trajectories=3 but the
    # per-trajectory arrays hold only 2".
    with pytest.raises(ValueError, match=r"shape \(trajectories, 2\), got shape \(2,\).*remake"):
        EnsembleProblem(_decay(), tspan=[0.0, 2.0])


@pytest.mark.parametrize(
    "spans", [[("0", "1"), ("0", "2")], np.array([[False, True], [False, True]])]
)
def test_per_trajectory_spans_of_strings_or_booleans_are_refused(spans):
    # float() takes "0" and True: strings failed inside NumPy's minimum, booleans ran.
    with pytest.raises(TypeError, match=r"tspan must hold real numbers, got dtype (<U1|bool)"):
        dxode.solve(EnsembleProblem(_decay(), tspan=spans), dxode.Tsit5())


def test_spans_of_strings_from_batch_func_are_refused():
    def batch_func(prob, ctx):
        return {"tspan": [("0", "1")] * len(ctx.indices)}

    with pytest.raises(TypeError, match="per-trajectory tspan must hold real numbers"):
        dxode.solve(EnsembleProblem(_decay(), batch_func=batch_func), trajectories=2)
