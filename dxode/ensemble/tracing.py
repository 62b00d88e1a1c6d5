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

    ``u0``, ``p`` and the per-trajectory arrays are inspected for autograd values; no user
    code runs unless autograd is tracing a computation right now. Only then are a
    ``prob_func``'s first trajectory, or ``batch_func``'s first batch (``first_batch``), built
    to see whether they carry differentiated values; the problem returned remembers them,
    so the solve that follows builds them from the user's function only once.
    """
    if is_traced(eprob.prob.u0, eprob.prob.p, eprob.arrays):
        return True, eprob
    if (eprob.prob_func is None and eprob.batch_func is None) or not autograd_is_tracing():
        return False, eprob
    if eprob.prob_func is not None:
        first = eprob.trajectory(0, 0, seed)
        return is_traced(first.u0, first.p), eprob.remembering(trajectory=((0, 0, seed), first))
    indices = np.arange(first_batch.start, first_batch.stop, dtype=np.int64)
    repeat = np.zeros_like(indices)
    data = eprob.batch(indices, repeat, seed)
    return is_traced(data), eprob.remembering(batch=(BatchContext(indices, repeat, seed), data))
