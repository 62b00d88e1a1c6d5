"""``AutoSwitch`` as data, the input of ``autoswitch_codegen``: both methods' descriptions
and the switching rules of ``dxode.solvers.autoswitch`` (``describe`` builds it)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .rosenbrock_description import RosenbrockDescription

if TYPE_CHECKING:
    from .description import StepperDescription

__all__ = ["AutoSwitchDescription"]


@dataclasses.dataclass(frozen=True)
class AutoSwitchDescription:
    """``AutoSwitch`` as plain numbers: both methods' descriptions and the switching rules
    (``dxode.solvers.autoswitch.AutoSwitch``'s attributes; ``boundary`` is the nonstiff
    method's real stability interval ``B``)."""

    nonstiff: StepperDescription
    stiff: RosenbrockDescription
    stiff_tol: float
    nonstiff_tol: float
    stiff_steps: int
    nonstiff_steps: int
    boundary: float

    @property
    def name(self) -> str:
        return f"AutoSwitch({self.nonstiff.name}, {self.stiff.name})"

    @property
    def rows(self) -> int:
        """Workspace row groups before ``u1``: the larger method's, and one for ``rho``."""
        return max(self.nonstiff.stages, self.stiff.stages) + 1
