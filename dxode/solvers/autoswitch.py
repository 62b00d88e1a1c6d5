"""AutoSwitch: every lane picks a nonstiff or a stiff method as it goes, by its own stiffness.

The stiffness estimate (the same formulas serve any path that wants to reuse them)
-----------------------------------------------------------------------------------
Each attempted step yields ``rho``, an estimate of the magnitude of the Jacobian's dominant
eigenvalue along the lane's trajectory, ``(L,)``:

* a nonstiff (explicit Runge–Kutta, FSAL) step whose last two stages are taken at the same
  time ``t + h`` (Tsit5, DP5) gives Hairer & Wanner's estimate (Solving ODEs II, IV.2)
  ``rho = ||k_s - k_{s-1}|| / ||y_s - y_{s-1}||`` from the last two stage inputs ``y`` and
  derivatives ``k = f(y)`` (``||.||`` the Euclidean norm over the lane's state; ``rho = 0``
  where ``y_s = y_{s-1}``);
* a stiff step gives the infinity norm of the Jacobian it computed at the step's start,
  ``rho = max_i sum_j |J_ij|``, a bound on every eigenvalue's magnitude (so a stiff lane
  never underestimates its stiffness and does not switch back too early).

With ``B`` the nonstiff method's stability interval on the negative real axis
(``ButcherTableau.real_stability_interval``, Tsit5: 3.506) and ``|h|`` the attempted step, an
accepted step votes "stiff" when ``|h| rho > stiff_tol B`` on a lane running the nonstiff
method, and when ``|h| rho > nonstiff_tol B`` on a lane running the stiff method (so between
``nonstiff_tol B`` and ``stiff_tol B`` a lane stays where it is: hysteresis). Rejected steps
and non-finite estimates do not vote. A signed counter per lane counts consecutive equal
votes; after ``stiff_steps`` consecutive "stiff" votes a nonstiff lane switches to the stiff
method, after ``nonstiff_steps`` consecutive "nonstiff" votes a stiff lane switches back.

At a switch the lane's step-size controller memory is reset (the methods' error histories do
not carry over) and its next step size is the controller's proposal, limited to
``stiff_tol B / rho`` when switching to the nonstiff method (so its first step is stable).

Lanes are grouped by their current method: each method steps only its own lanes, and the
results are put back in lane order. A step's stage data carries one more row, the method that
took it (``0.0`` nonstiff, ``1.0`` stiff, broadcast over the state), so dense output, save
points and events interpolate every step with the method that took it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from .base import AbstractStepper, LaneRHS, StepResult
from .explicit_rk import ExplicitRungeKutta
from .step import Step
from .stiff import StiffMethod, check_state, check_vector_state

Array = Any
RHSFor = Callable[[Array | None], LaneRHS]
"""``rhs_for(idx)``: the lane RHS for the working set's lanes at positions ``idx`` (``None``:
all of them)."""


class AutoSwitch(AbstractStepper):
    """Per-lane automatic switching between a nonstiff and a stiff method.

    Every lane starts with ``nonstiff`` and estimates its own stiffness at every step; a lane
    that turns stiff switches to ``stiff`` and one that relaxes switches back, each on its
    own, so a parameter sweep with stiff and nonstiff trajectories pays for Jacobians and LU
    factorizations only on the stiff ones (see the module docstring for the estimate and the
    hysteresis). ``sol.stats.nswitch`` counts a trajectory's switches.

    Parameters
    ----------
    nonstiff : ExplicitRungeKutta, optional
        An adaptive FSAL explicit method whose last two stages share their time (``Tsit5()``,
        the default, or ``DP5()``).
    stiff : Rodas5P, Rodas4, Rosenbrock23 or TRBDF2, optional
        The stiff method (default ``Rodas5P()``); its ``autodiff`` setting applies.
    stiff_tol : float
        A nonstiff lane's step votes "stiff" when ``|h| rho`` exceeds this fraction of the
        nonstiff method's stability interval (default 0.9).
    nonstiff_tol : float
        A stiff lane's step votes "nonstiff" when ``|h| rho`` is at most this fraction of the
        interval (default 0.5, at most ``stiff_tol``).
    stiff_steps, nonstiff_steps : int
        Consecutive votes needed to switch to the stiff method (default 10) and back (5).

    Notes
    -----
    Runs on the array path (``solve``, ``EnsembleArray``, ``EnsembleSerial``,
    ``EnsembleDask``) and in the compiled kernels (``kernel=True``, ``EnsembleKernel``, with
    the same estimate, votes and switches per lane); gradients do not go through a switch:
    differentiate with one method.
    """

    fsal = True
    rhs_per_step = 0  # every evaluation is counted per lane (StepResult.nf_extra)
    variable_rhs_evals = True
    interpolation_rhs_evals = 0
    counters = ("nswitch", "nstiff")
    memory_names = ("stiff", "stiff_count", "nswitch", "nstiff")

    def __init__(
        self,
        nonstiff: ExplicitRungeKutta | None = None,
        stiff: StiffMethod | None = None,
        *,
        stiff_tol: float = 0.9,
        nonstiff_tol: float = 0.5,
        stiff_steps: int = 10,
        nonstiff_steps: int = 5,
    ) -> None:
        from .rodas5p import Rodas5P
        from .tsit5 import Tsit5

        nonstiff = Tsit5() if nonstiff is None else nonstiff
        stiff = Rodas5P() if stiff is None else stiff
        _check_methods(nonstiff, stiff)
        for name, value in (("stiff_tol", stiff_tol), ("nonstiff_tol", nonstiff_tol)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if not 0.0 < nonstiff_tol <= stiff_tol:
            raise ValueError(
                f"need 0 < nonstiff_tol <= stiff_tol, got nonstiff_tol={nonstiff_tol!r}, "
                f"stiff_tol={stiff_tol!r}"
            )
        for name, value in (("stiff_steps", stiff_steps), ("nonstiff_steps", nonstiff_steps)):
            integer = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            if not integer or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.nonstiff = nonstiff
        self.stiff = copy.copy(stiff)
        self.stiff.estimate_stiffness = True
        self.stiff_tol, self.nonstiff_tol = float(stiff_tol), float(nonstiff_tol)
        self.stiff_steps, self.nonstiff_steps = int(stiff_steps), int(nonstiff_steps)
        self.boundary = nonstiff.tableau.real_stability_interval
        self.order = nonstiff.order
        self.error_order = nonstiff.error_order
        self.jacobians_per_step = stiff.jacobians_per_step
        self.factorizations_per_step = stiff.factorizations_per_step
        self.rows = max(nonstiff.tableau.stages, stiff.dense_stages)

    def configure(self, rtol: float, atol: Any) -> AutoSwitch:
        configured = copy.copy(self)
        configured.nonstiff = self.nonstiff.configure(rtol, atol)
        configured.stiff = self.stiff.configure(rtol, atol)
        return configured

    def check_state_shape(self, shape: tuple[int, ...]) -> None:
        """The stiff method's shape rule (a 1-D state), before any lane can switch; the
        error names ``AutoSwitch``, the method the user chose."""
        check_vector_state(self, shape)
        self.stiff.check_state_shape(shape)

    def lane_memory(self, xp: Any, u0: Array) -> dict[str, Array]:
        """Every lane's switching memory at the start (``u0`` is the lanes' ``(n, L)`` state,
        checked here, before any lane can switch): its method (``stiff``, bool), signed count
        of consecutive votes, switches and attempts with the stiff method."""
        check_state(self.stiff, u0)
        n = u0.shape[-1]
        memory = {name: xp.zeros(n, dtype=xp.int64) for name in self.memory_names[1:]}
        return {"stiff": xp.zeros(n, dtype=xp.bool), **memory}

    def lane_error_order(self, xp: Any, stiff: Array, like: Array) -> Any:
        """The error estimate's order of every lane's current method: an int when both
        methods' are equal, else an ``(L,)`` array of ``like``'s dtype."""
        low, high = self.nonstiff.error_order, self.stiff.error_order
        if low == high:
            return low
        return low + (high - low) * xp.astype(stiff, like.dtype)

    def step(
        self, backend: Any, rhs: LaneRHS, t: Array, u: Array, f0: Array, h: Array
    ) -> StepResult:
        raise NotImplementedError(
            "AutoSwitch picks a method per lane and steps only inside the lane integrator "
            "(solve, EnsembleArray); to replay or differentiate steps, choose one method"
        )

    def attempt(
        self,
        backend: Any,
        rhs_for: RHSFor,
        t: Array,
        u: Array,
        f0: Array,
        h: Array,
        stiff: Array,
    ) -> StepResult:
        """Every lane's trial step with its current method (``stiff``, ``(L,)`` bool).

        The result's ``rho`` is each lane's stiffness estimate, ``f1`` its RHS at the step's
        end and ``nf_extra`` its RHS evaluations.
        """
        xp = backend.xp
        n_stiff = int(xp.sum(xp.astype(stiff, xp.int64)))
        if n_stiff in (0, stiff.shape[0]):
            part = self._attempt_with(backend, rhs_for(None), t, u, f0, h, n_stiff > 0)
            return self._unpacked(xp, *part)
        parts, positions = [], []
        for use_stiff, mask in ((False, ~stiff), (True, stiff)):
            idx = xp.nonzero(mask)[0]
            take = [xp.take(x, idx, axis=-1) for x in (t, u, f0, h)]
            parts.append(self._attempt_with(backend, rhs_for(idx), *take, use_stiff))
            positions.append(idx)
        order = xp.argsort(xp.concat(positions))
        block, lane_values = (
            xp.take(xp.concat([p[i] for p in parts], axis=-1), order, axis=-1) for i in (0, 1)
        )
        return self._unpacked(xp, block, lane_values, parts[0][2] or parts[1][2])

    def _attempt_with(
        self, backend: Any, rhs: LaneRHS, t: Array, u: Array, f0: Array, h: Array, stiff: bool
    ) -> tuple[Array, Array, bool]:
        """The trial step of lanes that all use one method, packed as ``(block, lane_values,
        can_fail)``: ``block`` stacks the stage rows (padded to ``rows``), the method's tag
        row, ``u1``, ``error`` and ``f1`` (``(rows + 4, *shape, L)``); ``lane_values`` the
        RHS evaluations, failures and stiffness estimates ``(3, L)``."""
        xp = backend.xp
        method = self.stiff if stiff else self.nonstiff
        result = method.step(backend, rhs, t, u, f0, h)
        if stiff:
            f1 = result.f1 if result.f1 is not None else rhs(result.u1, t + h)
            nf = result.nf_extra + (method.rhs_per_step + (1 if result.f1 is None else 0))
            rho = result.rho
        else:
            f1, nf = result.f1, method.rhs_per_step
            rho = _stage_estimate(xp, result)
        stages = result.stages
        shape, dtype = stages.shape[1:], stages.dtype
        device = getattr(stages, "device", None)
        block = xp.concat(
            [
                stages,
                xp.zeros((self.rows - stages.shape[0], *shape), dtype=dtype, device=device),
                xp.full((1, *shape), 1.0 if stiff else 0.0, dtype=dtype, device=device),
                xp.stack([result.u1, result.error, f1]),
            ]
        )
        failed = result.failed
        zero = xp.zeros_like(rho)
        lane_values = xp.stack(
            [zero + nf, zero if failed is None else xp.astype(failed, dtype), rho]
        )
        return block, lane_values, failed is not None

    def _unpacked(self, xp: Any, block: Array, lane_values: Array, can_fail: bool) -> StepResult:
        """The step result from ``_attempt_with``'s packing."""
        rows = self.rows + 1
        return StepResult(
            block[rows, ...],
            block[rows + 1, ...],
            block[:rows, ...],
            block[rows + 2, ...],
            nf_extra=xp.astype(lane_values[0, ...], xp.int64),
            failed=lane_values[1, ...] > 0.5 if can_fail else None,
            rho=lane_values[2, ...],
        )

    def decide(
        self,
        xp: Any,
        memory: dict[str, Array],
        rho: Array,
        habs: Array,
        accept: Array,
        h_next: Array,
    ) -> tuple[dict[str, Array], Array, Array]:
        """Count every lane's stiffness vote and switch the lanes that reached their count.

        Returns the new memory, the lanes that switched (``(L,)`` bool) and the next step
        sizes ``(L,)`` (unsigned).
        """
        stiff, count = memory["stiff"], memory["stiff_count"]
        estimate = habs * rho / self.boundary
        limit = self.stiff_tol + (self.nonstiff_tol - self.stiff_tol) * xp.astype(stiff, rho.dtype)
        votes_stiff = estimate > limit
        one = xp.ones_like(count)
        up = xp.where(count > 0, count + 1, one)
        down = xp.where(count < 0, count - 1, -one)
        voted = accept & xp.isfinite(estimate)
        count = xp.where(voted, xp.where(votes_stiff, up, down), count)
        to_stiff = ~stiff & (count >= self.stiff_steps)
        to_nonstiff = stiff & (count <= -self.nonstiff_steps)
        switched = to_stiff | to_nonstiff
        stable = self.stiff_tol * self.boundary / rho
        h_next = xp.where(to_nonstiff, xp.minimum(h_next, stable), h_next)
        as_int = lambda mask: xp.astype(mask, xp.int64)
        return (
            {
                "stiff": stiff ^ switched,
                "stiff_count": xp.where(switched, xp.zeros_like(count), count),
                "nswitch": memory["nswitch"] + as_int(switched),
                "nstiff": memory["nstiff"] + as_int(stiff),
            },
            switched,
            h_next,
        )

    def interpolate(self, step: Step, theta: Array) -> Array:
        xp = step.backend.xp
        stages = step.stages
        flag = xp.reshape(stages[-1, ...], (-1, stages.shape[-1]))[0, ...]
        stiff = flag > 0.5
        n_stiff = int(xp.sum(xp.astype(stiff, xp.int64)))
        if n_stiff in (0, stiff.shape[0]):
            return self._interpolate_with(step, theta, n_stiff > 0)
        values, positions = [], []
        for use_stiff, mask in ((False, ~stiff), (True, stiff)):
            idx = xp.nonzero(mask)[0]
            part = step.take(idx, step.rhs)
            values.append(self._interpolate_with(part, xp.take(theta, idx), use_stiff))
            positions.append(idx)
        order = xp.argsort(xp.concat(positions))
        return xp.take(xp.concat(values, axis=-1), order, axis=-1)

    def _interpolate_with(self, step: Step, theta: Array, stiff: bool) -> Array:
        method = self.stiff if stiff else self.nonstiff
        rows = method.dense_stages if stiff else method.tableau.stages
        return method.interpolate(
            step._replace(stepper=method, stages=step.stages[:rows, ...]), theta
        )

    def __repr__(self) -> str:
        return f"AutoSwitch(nonstiff={self.nonstiff!r}, stiff={self.stiff!r})"


def _check_methods(nonstiff: Any, stiff: Any) -> None:
    """Clear errors for method pairs the switcher cannot run."""
    if not isinstance(nonstiff, ExplicitRungeKutta):
        raise TypeError(
            f"nonstiff must be an explicit Runge–Kutta method such as Tsit5(), got {nonstiff!r}"
        )
    tab = nonstiff.tableau
    if not (tab.adaptive and tab.fsal and tab.c_extra is None and tab.c[-1] == tab.c[-2]):
        raise ValueError(
            f"nonstiff={nonstiff!r} cannot estimate its stiffness: AutoSwitch needs an adaptive "
            "FSAL method whose last two stages share their time and whose interpolant needs "
            "no extra stages; use Tsit5() or DP5()"
        )
    if not (isinstance(stiff, StiffMethod) and hasattr(stiff, "dense_stages")):
        raise TypeError(
            f"stiff must be a stiff method (Rodas5P(), Rodas4(), Rosenbrock23(), TRBDF2()), "
            f"got {stiff!r}"
        )


def _stage_estimate(xp: Any, result: StepResult) -> Array:
    """Hairer & Wanner's ``||k_s - k_{s-1}|| / ||y_s - y_{s-1}||`` per lane, ``(L,)``."""
    assert result.inputs is not None
    axes = tuple(range(result.u1.ndim - 1))
    dk = result.stages[-1, ...] - result.stages[-2, ...]
    dy = result.inputs[-1] - result.inputs[-2]
    num = xp.sqrt(xp.sum(dk * dk, axis=axes))
    den = xp.sqrt(xp.sum(dy * dy, axis=axes))
    positive = den > 0
    return xp.where(positive, num / xp.where(positive, den, xp.ones_like(den)), xp.zeros_like(den))
