"""ODESolution: what ``solve`` returns for one problem."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._retcode import ReturnCode
from .integrator.interpolation import DenseOutput

__all__ = ["ODESolution", "SolverStats"]

Array = Any


@dataclasses.dataclass(frozen=True)
class SolverStats:
    """Work done for one trajectory.

    Attributes
    ----------
    nf : int
        Right-hand-side evaluations.
    naccept : int
        Accepted steps.
    nreject : int
        Rejected steps.
    njac : int
        Jacobian evaluations (stiff methods; 0 for explicit ones).
    nlu : int
        LU factorizations (stiff methods; 0 for explicit ones).
    nswitch : int
        Switches between the nonstiff and the stiff method (``AutoSwitch``; 0 otherwise).
    """

    nf: int
    naccept: int
    nreject: int
    njac: int = 0
    nlu: int = 0
    nswitch: int = 0


class ODESolution:
    """The solution of one ODEProblem.

    Calling the solution, ``sol(t)``, evaluates the method's dense output at a time or an
    array of times inside the solved span (needs ``dense=True``, the default without
    ``saveat``).

    Attributes
    ----------
    t : (nt,) array
        Save times (the ``saveat`` times, or every accepted step when none were asked for).
    u : (nt, *u0.shape) array
        States at ``t``, in the problem's array library and dtype.
    retcode : ReturnCode
        Why the integration stopped; ``retcode.message`` says what to do about failures.
    stats : SolverStats
        RHS evaluations and accepted/rejected steps.
    prob : ODEProblem
        The problem solved (an ensemble trajectory's own: its ``u0``, ``p`` and ``tspan``).
    alg : AbstractStepper
        The algorithm instance used.
    events : EventRecord or None
        The events callbacks fired (``None`` when no callback was given or none fired).
    """

    def __init__(
        self,
        t: Array,
        u: Array,
        retcode: ReturnCode,
        stats: SolverStats,
        prob: Any,
        alg: Any,
        dense: DenseOutput | None,
        events: Any = None,
        *,
        problem_of: Callable[[], Any] | None = None,
    ) -> None:
        self.t = t
        self.u = u
        self.retcode = retcode
        self.stats = stats
        self._prob = prob
        self._problem_of = problem_of
        self.alg = alg
        self._dense = dense
        self.events = events

    @property
    def prob(self) -> Any:
        """The problem solved; an ensemble trajectory's own problem is built on first use
        (``problem_of``, in place of ``prob``)."""
        if self._problem_of is not None:
            self._prob, self._problem_of = self._problem_of(), None
        return self._prob

    @property
    def success(self) -> bool:
        """Whether the integration reached its end (or was terminated on purpose)."""
        return self.retcode.successful

    def __call__(self, t: Any) -> Array:
        if self._dense is None:
            raise ValueError(self._why_no_dense_output())
        return self._dense(t)

    def _why_no_dense_output(self) -> str:
        if self.stats.naccept == 0:
            return (
                f"this solution has no dense output: it took no step (retcode "
                f"{self.retcode.name} at t0), so its only state is sol.u[0]"
            )
        return (
            "this solution has no dense output: solve with dense=True (the default for one "
            "problem without saveat; an ensemble keeps it only with dense=True, on "
            "EnsembleArray) to evaluate sol(t); a differentiated solve and a compiled one "
            "(kernel=True) keep none, so ask for the times you need with saveat"
        )

    def __repr__(self) -> str:
        return (
            f"ODESolution(retcode={self.retcode.name}, alg={self.alg!r}, t: {tuple(self.t.shape)}, "
            f"u: {tuple(self.u.shape)}, nf={self.stats.nf}, naccept={self.stats.naccept}, "
            f"nreject={self.stats.nreject})"
        )
