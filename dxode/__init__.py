"""dxode: ODE solvers for one problem or millions of trajectories, on NumPy or CuPy, over Dask.

The public surface lives here; everything else is private (``dxode._name``) except the
``dxode.backends`` subpackage.
"""

from ._problem import ODEProblem as ODEProblem
from ._retcode import ReturnCode as ReturnCode
from ._solution import ODESolution as ODESolution
from ._solution import SolverStats as SolverStats
from ._solve import solve as solve
from .controllers import (
    AbstractController as AbstractController,
)
from .controllers import (
    IController as IController,
)
from .controllers import (
    PIController as PIController,
)
from .controllers import (
    PIDController as PIDController,
)
from .ensemble.algorithms import (
    AbstractEnsembleAlgorithm as AbstractEnsembleAlgorithm,
)
from .ensemble.algorithms import (
    EnsembleArray as EnsembleArray,
)
from .ensemble.algorithms import (
    EnsembleSerial as EnsembleSerial,
)
from .ensemble.cluster import local_cluster as local_cluster
from .ensemble.dask_ensemble import EnsembleDask as EnsembleDask
from .ensemble.problem import (
    BatchContext as BatchContext,
)
from .ensemble.problem import (
    EnsembleProblem as EnsembleProblem,
)
from .ensemble.problem import (
    TrajectoryContext as TrajectoryContext,
)
from .ensemble.solution import (
    EnsembleSolution as EnsembleSolution,
)
from .ensemble.solution import (
    EnsembleStats as EnsembleStats,
)
from .ensemble.solution import (
    EnsembleSummary as EnsembleSummary,
)
from .ensemble.worker_settings import worker_config as worker_config
from .events.callbacks import CallbackSet as CallbackSet
from .events.callbacks import ContinuousCallback as ContinuousCallback
from .events.callbacks import DiscreteCallback as DiscreteCallback
from .events.callbacks import PresetTimeCallback as PresetTimeCallback
from .events.record import EventRecord as EventRecord
from .kernels import EnsembleKernel as EnsembleKernel
from .sensitivity import BacksolveAdjoint as BacksolveAdjoint
from .sensitivity import DiscreteAdjoint as DiscreteAdjoint
from .sensitivity import ForwardSensitivity as ForwardSensitivity
from .sensitivity import InterpolatingAdjoint as InterpolatingAdjoint
from .solvers import (
    BS3 as BS3,
)
from .solvers import (
    DP5 as DP5,
)
from .solvers import (
    RK4 as RK4,
)
from .solvers import (
    TRBDF2 as TRBDF2,
)
from .solvers import (
    AbstractStepper as AbstractStepper,
)
from .solvers import (
    AutoSwitch as AutoSwitch,
)
from .solvers import (
    Euler as Euler,
)
from .solvers import (
    ExplicitRungeKutta as ExplicitRungeKutta,
)
from .solvers import (
    LargeStiffSystemWarning as LargeStiffSystemWarning,
)
from .solvers import (
    Rodas4 as Rodas4,
)
from .solvers import (
    Rodas5P as Rodas5P,
)
from .solvers import (
    Rosenbrock23 as Rosenbrock23,
)
from .solvers import (
    RosenbrockTableau as RosenbrockTableau,
)
from .solvers import (
    Tsit5 as Tsit5,
)
from .solvers import (
    Vern7 as Vern7,
)
from .solvers.tableau import ButcherTableau as ButcherTableau

__version__ = "0.1.0"

__all__ = [
    "BS3",
    "DP5",
    "RK4",
    "TRBDF2",
    "AbstractController",
    "AbstractEnsembleAlgorithm",
    "AbstractStepper",
    "AutoSwitch",
    "BacksolveAdjoint",
    "BatchContext",
    "ButcherTableau",
    "CallbackSet",
    "ContinuousCallback",
    "DiscreteAdjoint",
    "DiscreteCallback",
    "EnsembleArray",
    "EnsembleDask",
    "EnsembleKernel",
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
    "LargeStiffSystemWarning",
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
