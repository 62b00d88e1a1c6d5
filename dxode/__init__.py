"""dxode: ODE solvers for one problem or millions of trajectories, on NumPy or CuPy, over Dask.

The public surface lives here; everything else is private (``dxode._name``) except the
``dxode.backends`` subpackage.
"""

from ._callbacks import CallbackSet as CallbackSet
from ._callbacks import ContinuousCallback as ContinuousCallback
from ._callbacks import DiscreteCallback as DiscreteCallback
from ._callbacks import PresetTimeCallback as PresetTimeCallback
from ._cluster import local_cluster as local_cluster
from ._cluster import worker_config as worker_config
from ._controllers import (
    AbstractController as AbstractController,
)
from ._controllers import (
    IController as IController,
)
from ._controllers import (
    PIController as PIController,
)
from ._controllers import (
    PIDController as PIDController,
)
from ._ensemble_algorithms import (
    AbstractEnsembleAlgorithm as AbstractEnsembleAlgorithm,
)
from ._ensemble_algorithms import (
    EnsembleArray as EnsembleArray,
)
from ._ensemble_algorithms import (
    EnsembleSerial as EnsembleSerial,
)
from ._ensemble_dask import EnsembleDask as EnsembleDask
from ._ensemble_problem import (
    BatchContext as BatchContext,
)
from ._ensemble_problem import (
    EnsembleProblem as EnsembleProblem,
)
from ._ensemble_problem import (
    TrajectoryContext as TrajectoryContext,
)
from ._ensemble_solution import (
    EnsembleSolution as EnsembleSolution,
)
from ._ensemble_solution import (
    EnsembleStats as EnsembleStats,
)
from ._ensemble_solution import (
    EnsembleSummary as EnsembleSummary,
)
from ._event_record import EventRecord as EventRecord
from ._problem import ODEProblem as ODEProblem
from ._retcode import ReturnCode as ReturnCode
from ._sensitivity import BacksolveAdjoint as BacksolveAdjoint
from ._sensitivity import DiscreteAdjoint as DiscreteAdjoint
from ._sensitivity import ForwardSensitivity as ForwardSensitivity
from ._sensitivity import InterpolatingAdjoint as InterpolatingAdjoint
from ._solution import ODESolution as ODESolution
from ._solution import SolverStats as SolverStats
from ._solve import solve as solve
from ._solvers import (
    BS3 as BS3,
)
from ._solvers import (
    DP5 as DP5,
)
from ._solvers import (
    RK4 as RK4,
)
from ._solvers import (
    TRBDF2 as TRBDF2,
)
from ._solvers import (
    AbstractStepper as AbstractStepper,
)
from ._solvers import (
    Euler as Euler,
)
from ._solvers import (
    ExplicitRungeKutta as ExplicitRungeKutta,
)
from ._solvers import (
    Rodas4 as Rodas4,
)
from ._solvers import (
    Rodas5P as Rodas5P,
)
from ._solvers import (
    Rosenbrock23 as Rosenbrock23,
)
from ._solvers import (
    RosenbrockTableau as RosenbrockTableau,
)
from ._solvers import (
    Tsit5 as Tsit5,
)
from ._solvers import (
    Vern7 as Vern7,
)
from ._tableau import ButcherTableau as ButcherTableau

__version__ = "0.1.0"

__all__ = [
    "BS3",
    "DP5",
    "RK4",
    "TRBDF2",
    "AbstractController",
    "AbstractEnsembleAlgorithm",
    "AbstractStepper",
    "BacksolveAdjoint",
    "BatchContext",
    "ButcherTableau",
    "CallbackSet",
    "ContinuousCallback",
    "DiscreteAdjoint",
    "DiscreteCallback",
    "EnsembleArray",
    "EnsembleDask",
    "EnsembleProblem",
    "EnsembleSerial",
    "EnsembleSolution",
    "EnsembleStats",
    "EnsembleSummary",
    "Euler",
    "EventRecord",
    "ExplicitRungeKutta",
    "ForwardSensitivity",
    "IController",
    "InterpolatingAdjoint",
    "ODEProblem",
    "ODESolution",
    "PIController",
    "PIDController",
    "PresetTimeCallback",
    "ReturnCode",
    "Rodas4",
    "Rodas5P",
    "Rosenbrock23",
    "RosenbrockTableau",
    "SolverStats",
    "TrajectoryContext",
    "Tsit5",
    "Vern7",
    "__version__",
    "local_cluster",
    "solve",
    "worker_config",
]
