"""The stepper contract: what the lane integrator needs from a method."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, NamedTuple

from .step import Step

Array = Any
LaneRHS = Callable[..., Array]
"""``rhs(u, t, out=None) -> du/dt`` on a working set of lanes: ``u`` is ``(*shape, L)``, ``t``
is ``(L,)``. It may write into ``out`` (and then returns ``out``) or return a new array."""


class StepResult(NamedTuple):
    """One trial step of every lane in the working set.

    Attributes
    ----------
    u1 : (*shape, L) array
        The proposed state at ``t + h``.
    error : (*shape, L) array or None
        The local error estimate (same units as ``u``); ``None`` for fixed-step methods.
    stages : (s, *shape, L) array
        The stage derivatives ``k``; together with ``u0``, ``u1`` and ``h`` they define the
        step's dense output.
    f1 : (*shape, L) array or None
        ``f(u1, t + h)`` when the method computed it anyway (FSAL), else ``None``.
    nf_extra : int or (L,) int array
        RHS evaluations beyond ``rhs_per_step`` made by this attempt (per lane): finite-
        difference Jacobians, Newton iterations. Counted only for methods that set
        ``variable_rhs_evals``.
    failed : (L,) bool array or None
        Lanes whose implicit stage equations could not be solved (their ``u1`` and ``error``
        mean nothing): the integrator rejects their step and, when adaptive, shrinks it as
        after a non-finite error. ``None`` when every lane's step is valid.
    inputs : tuple of (*shape, L) arrays, optional
        An explicit Runge–Kutta step's stage inputs ``y_i`` (``y_0 = u0``), the points where
        it evaluated ``f``: what a discrete adjoint pulls cotangents back through.
    rho : (L,) array, optional
        An estimate of the magnitude of the Jacobian's dominant eigenvalue per lane (stiff
        methods with ``estimate_stiffness`` set; see ``dxode.solvers.autoswitch``).
    """

    u1: Array
    error: Array | None
    stages: Array
    f1: Array | None
    nf_extra: Any = 0
    failed: Array | None = None
    inputs: tuple[Array, ...] | None = None
    rho: Array | None = None


class AbstractStepper(abc.ABC):
    """A one-step method advancing a working set of independent lanes.

    Implementer rules
    -----------------
    * Touch arrays only through the backend the integrator passes (``backend.xp`` and its
      kernels such as ``backend.combine``) and use only elementwise arithmetic across lanes
      and in-order reductions over stages: a lane's result must never depend on the other
      lanes, so batching cannot change it.
    * ``step`` must not modify its inputs.
    * ``interpolate`` must reproduce ``u0`` at ``theta = 0`` and ``u1`` at ``theta = 1``.
    * Declare ``order``, ``error_order`` (``None`` when the method has no error estimate)
      and ``rhs_per_step`` (new RHS evaluations per attempted step, excluding the one at the
      start of a step when ``fsal`` is false: the integrator counts that one itself), and
      ``interpolation_rhs_evals`` (RHS evaluations one ``interpolate`` call makes per lane).
      Methods whose cost per attempt varies (Jacobians by differences, Newton iterations)
      set ``variable_rhs_evals`` and report the rest in ``StepResult.nf_extra``.
    * Implicit and Rosenbrock methods declare the Jacobian evaluations and LU factorizations
      each attempt makes (``jacobians_per_step``, ``factorizations_per_step``).
    """

    order: int
    error_order: int | None
    fsal: bool
    rhs_per_step: int
    interpolation_rhs_evals: int = 0
    variable_rhs_evals: bool = False
    jacobians_per_step: int = 0
    factorizations_per_step: int = 0

    @property
    def adaptive(self) -> bool:
        """Whether the method estimates its local error (and so supports adaptive steps)."""
        return self.error_order is not None

    def check_state_shape(self, shape: tuple[int, ...]) -> None:  # noqa: B027 (a hook)
        """Raise a ``ValueError`` naming the fix if the method cannot integrate a state of
        ``shape`` (``u0``'s, without lanes); checked when a solve is set up. Any by default."""

    def configure(self, rtol: float, atol: Any) -> AbstractStepper:
        """The stepper to integrate with at these tolerances; the integrator calls it once.

        Methods whose steps need the tolerances (the Newton iteration of implicit methods)
        return a configured copy; the default returns ``self``. ``atol`` is a float or an
        array that broadcasts against lanes-last states ``(*shape, L)``.
        """
        return self

    @abc.abstractmethod
    def step(
        self, backend: Any, rhs: LaneRHS, t: Array, u: Array, f0: Array, h: Array
    ) -> StepResult:
        """Attempt a step of size ``h`` (``(L,)``, signed) from ``(t, u)``; ``f0 = f(u, t)``."""

    @abc.abstractmethod
    def interpolate(self, step: Step, theta: Array) -> Array:
        """Dense output of ``step`` at ``step.t + theta * step.h`` (``theta`` is ``(L,)`` in
        ``[0, 1]``); methods with extra interpolation stages evaluate ``step.rhs``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
