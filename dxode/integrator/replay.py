"""The integrator in replay mode: re-take recorded trial steps, for the discrete adjoint.

A checkpointed discrete adjoint needs the stage inputs of a stretch of the forward pass's
iterations that it did not keep. Replay re-runs those iterations from the checkpoint the
loop's ``TrialRecorder`` kept: the same ``stepper.step`` and the same ``advance`` as the loop,
with each iteration's recorded step sizes and acceptances in place of error control and the
recorded lanes in place of retirement and compaction — so every value is the forward pass's
to the last bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..solvers import Step
from .lanes import Trial, advance

Array = Any


def replay(
    backend: Any,
    stepper: Any,
    trials: Sequence[Trial],
    rhs_at: Callable[[int], Any],
    keep_at: Callable[[int], Array | None],
) -> list[tuple[Array, ...]]:
    """The stage inputs of consecutive iterations ``trials``, re-taken from ``trials[0].start``.

    Parameters
    ----------
    backend : Backend
        Where the forward pass ran.
    stepper : AbstractStepper
        The (configured) method the forward pass stepped with.
    trials : sequence of Trial
        Consecutive iterations as the loop recorded them; the first holds a checkpoint.
    rhs_at : callable
        ``rhs_at(i)``: the lane RHS for the working set of ``trials[i]``.
    keep_at : callable
        ``keep_at(i)`` for ``i >= 1``: where the lanes of ``trials[i]`` sit in the working set
        of ``trials[i - 1]`` when the loop compacted between them (device indices), else
        ``None``.

    Returns
    -------
    list of tuple
        Each iteration's stage inputs (``StepResult.inputs``).
    """
    xp = backend.xp
    u, f = trials[0].start
    inputs = []
    rhs = None
    for i, trial in enumerate(trials):
        keep = keep_at(i) if i else None
        if keep is not None:  # the working set was compacted
            u, f = xp.take(u, keep, axis=-1), xp.take(f, keep, axis=-1)
            rhs = None
        if rhs is None:
            rhs = rhs_at(i)
        result = stepper.step(backend, rhs, trial.t, u, f, trial.h)
        inputs.append(result.inputs)
        step = Step(stepper, backend, rhs, trial.t, trial.h, u, result.u1, result.stages)
        _, u, f = advance(step, trial.accept, f, trial.t_end, result.u1, result.f1)
    return inputs
