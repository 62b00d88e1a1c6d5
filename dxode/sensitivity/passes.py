"""One batch of a differentiated solve: its RHS (plain and traced), its forward pass's record,
and the pieces the sensitivity algorithms' forward and backward passes share.

The sensitivity algorithms (``dxode.sensitivity.algorithms``) say what their forward pass
records and how their backward pass runs; this module does the work they have in common:
integrating a batch's lane problem, turning its result into a ``BatchForward``, and building
the batch's right-hand sides. ``static`` is the differentiated solve's configuration
(``differentiable._Static``): never differentiated, the same for every batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._derivatives import Derivatives
from .._lane_problem import lane_problem, lane_rhs_for, lane_values, parameters_for
from .._retcode import ReturnCode
from .._traced_rhs import TracedRHS
from ..backends import get_backend, to_host
from ..integrator.loop import LaneProblem, integrate
from . import stability
from .augmented_jacobians import is_stiff

Array = Any


@dataclasses.dataclass
class BatchForward:
    """What one batch's forward pass computed: the saved states and statistics (which travel
    back), and the record its backward pass needs (which stays where the batch ran)."""

    saved: np.ndarray  # (L, nsave, *shape), on the host
    record: Any  # the sensitivity algorithm's: trials, dense steps, saved states or S
    outcome: dict[str, np.ndarray]  # retcode, nf, naccept, nreject per lane
    sensealg: Any  # the algorithm whose backward pass runs (the default may have switched)


def small_part(forward: BatchForward) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """What a forward task sends back: the saved states and the statistics, not the record."""
    return forward.saved, forward.outcome


def finished(saved: np.ndarray, record: Any, result: Any, sensealg: Any) -> BatchForward:
    """A ``BatchForward`` with the statistics of the integrator's ``result``."""
    outcome = {k: to_host(getattr(result, k)) for k in ("retcode", "nf", "naccept", "nreject")}
    return BatchForward(saved, record, outcome, sensealg)


@dataclasses.dataclass
class BatchRHS:
    """A batch's lane problem (from the one builder, ``dxode._lane_problem``) and its plain
    (untraced) lane RHS: ``rhs_for(params)`` for the per-lane leaves."""

    backend: Any
    problem: LaneProblem
    lane_positions: list[int]
    leaves: list[Any]  # the batch's parameter leaf values (per-lane ones lanes-last)

    @classmethod
    def of(
        cls,
        static: Any,
        leaves: list[Any],
        u0: Array,
        t0: np.ndarray,
        t1: np.ndarray,
        save_grid: np.ndarray,
        stops: np.ndarray | None,
    ) -> BatchRHS:
        """The batch with parameter leaves ``leaves``, states ``u0`` ``(*shape, L)``, spans
        ``t0``, ``t1`` (host ``(L,)``), saves ``save_grid`` (host ``(nsave, L)``), stops."""
        backend = get_backend(static.backend)
        problem = lane_problem(
            backend,
            _functions(static),
            parameters_for(static.p_template, leaves, static.lane_leaf),
            lane_values(leaves, static.lane_leaf),
            u0,
            t0,
            t1,
            stepper=static.options.alg,
            save_grid=save_grid,
            record_steps="",
            tstops=stops,
        )
        lane_positions = [i for i, lane in enumerate(static.lane_leaf) if lane]
        return cls(backend, problem, lane_positions, leaves)

    @property
    def rhs_for(self) -> Any:
        return self.problem.rhs_for

    @property
    def params(self) -> tuple:
        return self.problem.params

    @property
    def f0(self) -> Array:
        return self.problem.f0


@dataclasses.dataclass
class BatchInputs:
    """Where a batch starts and what it saves: ``u0`` and ``save_times`` on the backend,
    ``t0``, ``t1`` and the ``stops`` (or ``None``) on the host."""

    u0: Array
    t0: np.ndarray
    t1: np.ndarray
    save_times: Array
    stops: np.ndarray | None


def integrate_batch(
    static: Any, batch: BatchRHS, record_steps: str, checkpoint_every: int
) -> tuple[LaneProblem, Any]:
    """The batch's lane problem, recording ``record_steps``, and the integrator's result."""
    problem = dataclasses.replace(
        batch.problem,
        record_steps=record_steps,
        checkpoint_every=checkpoint_every,
    )
    return problem, integrate(problem, static.options, batch.backend)


def dense_steps(result: Any, backend: Any, u0: Array) -> Any:
    """The accepted steps with their stages a dense forward pass recorded (none: empty)."""
    return result.steps or _no_steps(backend, u0)


def _no_steps(backend: Any, u0: Array) -> dict[str, Array]:
    xp = backend.xp
    empty = xp.zeros(0, dtype=u0.dtype)
    return {
        "lane": xp.zeros(0, dtype=xp.int64),
        "t": empty,
        "h": empty,
        "t_end": empty,
        "u0": xp.zeros((*u0.shape[:-1], 0), dtype=u0.dtype),
    }


_SUCCEEDED = (int(ReturnCode.Success), int(ReturnCode.Terminated))


def switch_for_stability(static: Any, batch: BatchRHS, result: Any, n_lanes: int) -> bool:
    """Whether a discrete adjoint's forward pass must switch to the interpolating adjoint:
    ``False`` if no successful lane's steps were limited by stability (failed lanes get NaN
    gradients anyway); ``True`` for the default sensealg where the interpolating adjoint can
    run; otherwise a ``ValueError`` naming the fixes (see ``stability``)."""
    backend = batch.backend
    alg = static.options.alg
    interval = alg.tableau.real_stability_interval
    succeeded = np.isin(to_host(result.retcode), _SUCCEEDED)
    limited, rho = stability.stability_limited(
        backend, batch.rhs_for, batch.params, result.trials or [], succeeded, interval
    )
    if not limited.any():
        return False
    shared_span = bool(np.all(static.t0 == static.t0[0]) and np.all(static.t1 == static.t1[0]))
    if static.default_sensealg and backend.name == "numpy" and shared_span:
        return True
    if not static.default_sensealg:
        why = (
            "Use sensealg=InterpolatingAdjoint() or ForwardSensitivity() (accurate to the "
            "tolerance)."
        )
    elif backend.name != "numpy":
        why = "The default would switch to InterpolatingAdjoint(), which runs on NumPy only."
    else:
        why = (
            "The default would switch to InterpolatingAdjoint(), which needs one tspan for all "
            "trajectories: use sensealg=ForwardSensitivity() (accurate to the tolerance)."
        )
    n_limited = int(limited.sum())
    raise stability.refusal(static.sensealg, alg, n_limited, n_lanes, interval, rho, why)


def on_backend(backend: Any, static: Any, leaves: list[Any]) -> list[Any]:
    """A batch's parameter leaves where it computes: per-lane and differentiated array leaves
    move to the backend; other leaves stay as the user gave them."""
    if backend.name == "numpy":
        return leaves
    return [
        backend.asarray(leaf) if (lane or diff) and np.ndim(leaf) else leaf
        for leaf, lane, diff in zip(leaves, static.lane_leaf, static.diff_leaf, strict=True)
    ]


def plain_rhs_for(static: Any, leaves: list[Any]) -> Any:
    """``rhs_for(params)``: the untraced lane RHS for the per-lane leaf values ``params``.

    For a stiff method the RHS carries the problem's derivatives (``jac``, ``tgrad``, ``vjp``),
    so its Jacobians are computed as in a solve without gradients.
    """
    return lane_rhs_for(
        get_backend(static.backend),
        _functions(static),
        parameters_for(static.p_template, leaves, static.lane_leaf),
        is_stiff(static.options.alg),
    )


def _functions(static: Any) -> Derivatives:
    """The problem's ``f`` and derivative functions, as a batch's lanes call them."""
    return Derivatives(
        static.f, static.jac, static.tgrad, static.vjp, single_lane=static.single_lane
    )


def traced_rhs(static: Any) -> TracedRHS:
    """The batch RHS with its derivatives (autograd, or the problem's ``vjp``)."""
    return TracedRHS(
        static.f,
        static.p_template,
        static.lane_leaf,
        static.diff_leaf,
        static.single_lane,
        vjp=static.vjp,
        backend=get_backend(static.backend),
        jac=static.jac,
        paramjac=static.paramjac,
    )
