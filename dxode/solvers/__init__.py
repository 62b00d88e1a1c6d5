"""Integration methods: one file per method, looked up by instance, class or name."""

from __future__ import annotations

from typing import Any

from .autoswitch import AutoSwitch
from .base import AbstractStepper, LaneRHS, StepResult
from .bs3 import BS3
from .dp5 import DP5
from .euler import Euler
from .explicit_rk import ExplicitRungeKutta
from .rk4 import RK4
from .rodas4 import Rodas4
from .rodas5p import Rodas5P
from .rosenbrock import Rosenbrock, RosenbrockTableau
from .rosenbrock23 import Rosenbrock23
from .step import Step
from .stiff import LargeStiffSystemWarning
from .trbdf2 import TRBDF2
from .tsit5 import Tsit5
from .vern7 import Vern7

__all__ = [
    "ALGORITHMS",
    "BS3",
    "DP5",
    "RK4",
    "TRBDF2",
    "AbstractStepper",
    "AutoSwitch",
    "Euler",
    "ExplicitRungeKutta",
    "LaneRHS",
    "LargeStiffSystemWarning",
    "Rodas4",
    "Rodas5P",
    "Rosenbrock",
    "Rosenbrock23",
    "RosenbrockTableau",
    "Step",
    "StepResult",
    "Tsit5",
    "Vern7",
    "get_algorithm",
]

ALGORITHMS: dict[str, type[AbstractStepper]] = {
    cls.__name__.lower(): cls
    for cls in (Euler, RK4, BS3, DP5, Tsit5, Vern7, Rosenbrock23, Rodas4, Rodas5P, TRBDF2)
}
# Every method ``solve`` takes by name: the single methods and AutoSwitch (its defaults,
# Tsit5 and Rodas5P), which combines two of them.
_NAMED: dict[str, type[AbstractStepper]] = {**ALGORITHMS, "autoswitch": AutoSwitch}


def get_algorithm(alg: Any) -> AbstractStepper:
    """An algorithm instance from an instance, a class, a name (``"tsit5"``) or ``None`` (Tsit5)."""
    if alg is None:
        return Tsit5()
    if isinstance(alg, AbstractStepper):
        return alg
    if isinstance(alg, type) and issubclass(alg, AbstractStepper):
        return alg()
    if isinstance(alg, str):
        try:
            return _NAMED[alg.lower()]()
        except KeyError:
            raise ValueError(f"unknown algorithm {alg!r}; choose one of {sorted(_NAMED)}") from None
    raise TypeError(f"alg must be an algorithm such as Tsit5(), got {alg!r}")
