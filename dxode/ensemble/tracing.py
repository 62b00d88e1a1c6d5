"""Whether an ensemble solve is differentiated, decided without running user code twice."""

from __future__ import annotations

import numpy as np

from .._tracing import autograd_is_tracing, is_traced
from .problem import BatchContext, EnsembleProblem


def differentiated(
    eprob: EnsembleProblem, seed: int, first_batch: range
) -> tuple[bool, EnsembleProblem]:
    """Whether solving ``eprob`` involves values autograd is differentiating, and the problem
    to solve.

    ``u0``, ``p`` and the per-trajectory arrays are inspected for autograd values. A
    ``prob_func``'s trajectory 0 is built here (every batch compares its parameter leaves
    with it, see ``per_trajectory_leaves``) and inspected too while autograd is tracing; a
    ``batch_func``'s first batch (``first_batch``) is built only while autograd is tracing.
    Where autograd traces the solve but trajectory 0 holds no traced value, the problem
    returned refuses a later trajectory that does (``remembering``'s ``plain_under_trace``).
    The problem returned remembers what was built, so the solve that follows calls the
    user's function once per trajectory, as without this check.
    """
    if eprob.prob_func is not None:
        # Built now in any case: batches share parameter leaves with trajectory 0.
        first = eprob.trajectory(0, 0, seed)
        built = ((0, 0, seed), first)
        if is_traced(eprob.prob.u0, eprob.prob.p, eprob.arrays):
            return True, eprob.remembering(trajectory=built)
        if not autograd_is_tracing():
            return False, eprob.remembering(trajectory=built)
        traced = is_traced(first.u0, first.p)
        return traced, eprob.remembering(trajectory=built, plain_under_trace=not traced)
    if is_traced(eprob.prob.u0, eprob.prob.p, eprob.arrays):
        return True, eprob
    if eprob.batch_func is None or not autograd_is_tracing():
        return False, eprob
    indices = np.arange(first_batch.start, first_batch.stop, dtype=np.int64)
    repeat = np.zeros_like(indices)
    data = eprob.batch(indices, repeat, seed)
    return is_traced(data), eprob.remembering(batch=(BatchContext(indices, repeat, seed), data))
