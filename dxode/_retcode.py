"""Return codes: why a trajectory stopped, with a message a user can act on."""

from __future__ import annotations

import enum

__all__ = ["ReturnCode"]


class ReturnCode(enum.IntEnum):
    """Why one trajectory (lane) stopped. ``bool(retcode.successful)`` tells whether to trust it."""

    Success = 0
    MaxIters = 1
    DtLessThanMin = 2
    Unstable = 3
    Terminated = 4

    def __str__(self) -> str:
        """The name (``print(sol.retcode)`` shows ``Success``, not ``0``)."""
        return self.name

    @property
    def successful(self) -> bool:
        """True for ``Success`` and ``Terminated`` (a callback ended the trajectory on purpose)."""
        return self in (ReturnCode.Success, ReturnCode.Terminated)

    @property
    def message(self) -> str:
        """What happened and what to try."""
        return _MESSAGES[self]


_MESSAGES = {
    ReturnCode.Success: "the integration reached the end of tspan",
    ReturnCode.MaxIters: (
        "the step limit `maxiters` was reached before the end of tspan; raise `maxiters`, "
        "loosen rtol/atol, or use a stiff method if the problem is stiff"
    ),
    ReturnCode.DtLessThanMin: (
        "the step size fell below `dtmin`; the solution may blow up (a finite-time "
        "singularity) or the problem may be stiff: try a stiff method or looser tolerances"
    ),
    ReturnCode.Unstable: (
        "the solution became non-finite (NaN or inf) and smaller steps did not help; check "
        "the right-hand side for invalid operations (e.g. log or sqrt of negatives) at the "
        "states reached, and a callback's affect for the state it sets; with fixed steps, "
        "an implicit method (TRBDF2) also stops here when its Newton iteration fails: try a "
        "smaller dt"
    ),
    ReturnCode.Terminated: "a callback terminated the integration",
}
