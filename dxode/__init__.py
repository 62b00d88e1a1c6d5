"""dxode: ODE solvers for one problem or millions of trajectories, on NumPy or CuPy, over Dask.

The public surface lives here; everything else is private (``dxode._name``) except the
``dxode.backends`` subpackage.
"""

from ._controllers import (
    AbstractController as AbstractController,
    IController as IController,
    PIController as PIController,
    PIDController as PIDController,
)
from ._problem import ODEProblem as ODEProblem
from ._retcode import ReturnCode as ReturnCode
from ._solution import ODESolution as ODESolution, SolverStats as SolverStats
from ._solve import solve as solve
from ._solvers import (
    BS3 as BS3,
    DP5 as DP5,
    RK4 as RK4,
    AbstractStepper as AbstractStepper,
    Euler as Euler,
    ExplicitRungeKutta as ExplicitRungeKutta,
    Tsit5 as Tsit5,
    Vern7 as Vern7,
)
from ._tableau import ButcherTableau as ButcherTableau

__version__ = "0.1.0"

__all__ = [
    "BS3",
    "DP5",
    "RK4",
    "AbstractController",
    "AbstractStepper",
    "ButcherTableau",
    "Euler",
    "ExplicitRungeKutta",
    "IController",
    "ODEProblem",
    "ODESolution",
    "PIController",
    "PIDController",
    "ReturnCode",
    "SolverStats",
    "Tsit5",
    "Vern7",
    "__version__",
    "solve",
]
