"""The sensitivity algorithms ``solve(..., sensealg=...)`` accepts: what each one computes.

Each is a small frozen dataclass (its options) and a strategy: it says what its forward pass
records (``forward``) and how its backward pass runs (``backward``), one batch at a time;
the work is done in the modules of ``dxode.sensitivity`` by integrating (augmented) lane
problems with the one integrator. ``differentiable`` schedules the batches and asks the
algorithm, never its type.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from .._validation import positive_int

if TYPE_CHECKING:
    from .passes import BatchForward, BatchInputs, BatchRHS

Gradients = tuple[Any, list[Any]]  # the cotangents of u0 (*shape, L) and of the traced leaves


class _Sensitivity:
    """What every sensitivity algorithm says about itself and does with a batch."""

    records: ClassVar[str] = ""  # what the integrator records in the forward pass
    one_tspan: ClassVar[bool] = False  # needs one tspan shared by all trajectories
    off_numpy: ClassVar[bool] = False  # runs on backends other than NumPy
    stiff_refusal: ClassVar[str] = ""  # why it cannot differentiate a stiff method
    # Its forward pass takes a batch's lanes (``forward_lanes``: a compiled kernel), not the
    # array path's batch (``forward``).
    compiled: ClassVar[bool] = False

    def steps_onto_save_times(self, options: Any) -> bool:
        """Whether the forward pass steps exactly onto the save times (else it interpolates
        them, as a solve without gradients does)."""
        return True

    def event_lanes(
        self, static: Any, callbacks: Any, u0: Any, leaves: list[Any], t0: Any, t1: Any
    ) -> tuple[Any, ...] | None:
        """The event pass of a differentiated solve with callbacks for lanes ``u0``
        ``(*shape, L)``, ``(lane, t, callback, retcode)``, where the algorithm runs it itself
        (a compiled kernel); ``None``: the array path's pass (``event_plan``)."""
        return None

    def forward(self, static: Any, batch: BatchRHS, inputs: BatchInputs) -> BatchForward:
        """One batch's forward pass: its saved states, statistics and record."""
        from .passes import finished, integrate_batch

        _, result = integrate_batch(static, batch, self.records, 0)
        saved = _host(result.saved)
        return finished(saved, self._record(result, saved, batch, inputs), result, self)

    def _record(self, result: Any, saved: Any, batch: BatchRHS, inputs: BatchInputs) -> Any:
        raise NotImplementedError

    def backward(
        self, static: Any, record: Any, leaves: list[Any], retcode: Any, t0: Any, g: Any
    ) -> Gradients:
        """One batch's backward pass: the cotangents of its ``u0`` and traced leaves, from
        its forward ``record`` and the cotangent ``g`` of its saved states."""
        raise NotImplementedError


class _ContinuousAdjoint(_Sensitivity):
    """The adjoint ODE integrated backward (``continuous_adjoint``)."""

    one_tspan = True

    def backward(
        self, static: Any, record: Any, leaves: list[Any], retcode: Any, t0: Any, g: Any
    ) -> Gradients:
        from . import continuous_adjoint
        from .passes import plain_rhs_for, traced_rhs

        return continuous_adjoint.backward(
            static,
            traced_rhs(static),
            plain_rhs_for(static, leaves),
            record,
            leaves,
            static.save_grid.astype(g.dtype),
            t0,
            retcode,
            g,
            backsolve=not self.records,
        )


def _host(x: Any) -> Any:
    from ..backends import to_host

    return to_host(x)


@dataclasses.dataclass(frozen=True)
class DiscreteAdjoint(_Sensitivity):
    """Differentiate the discrete solution: replay the accepted steps backward (the default
    for explicit methods; stiff methods raise ``NotImplementedError``).

    The gradient is exact for the numbers the forward pass computed with the step sizes held
    fixed, whatever the tolerance, and costs one backward sweep with one RHS vector-Jacobian
    product per stage. When autograd traces ``f`` over a lane axis (an ensemble) and the state
    has at most 8 components, those products come from a bulk linearization where a count of
    ``f``'s array work says it pays: ``f`` is traced once per chunk of iterations at all their
    recorded stage inputs, not once per stage and step
    (``dxode.sensitivity.bulk_linearization``; the same gradient to rounding).

    Where an adaptive step went beyond the method's stability interval (a
    stiff problem: steps limited by stability, not accuracy), that derivative can be far
    from the gradient of the loss, so ``solve`` raises a ``ValueError`` naming the fixes; the
    default ``sensealg=None`` switches to ``InterpolatingAdjoint`` instead.

    With a method whose interpolant needs no extra RHS evaluations (Tsit5, DP5, BS3, ...), a
    save point inside a step comes from the dense output, differentiated with the step, so
    the steps are those of the solve without gradients; with the others (the Verner methods)
    the forward pass steps onto every save time, and its steps differ slightly from it.

    Parameters
    ----------
    checkpoint_every : int, optional
        Keep each lane's state only at every ``checkpoint_every``-th accepted step (with the
        RHS value there) instead of at every step; the backward pass recomputes each segment's
        states from its checkpoint with the recorded step sizes, so the gradient is the same
        to the last bit. Memory: ``steps / checkpoint_every + checkpoint_every`` states per
        lane instead of ``steps``, for one extra forward sweep of RHS evaluations. About
        ``sqrt(steps)`` minimises memory. ``None`` (default): keep every step's state.
    """

    checkpoint_every: int | None = None

    def __post_init__(self) -> None:
        every = positive_int("checkpoint_every", self.checkpoint_every, allow_none=True)
        object.__setattr__(self, "checkpoint_every", every)  # a NumPy integer as an int

    records: ClassVar[str] = "trials"  # every iteration: the backward pass replays them
    off_numpy: ClassVar[bool] = True
    stiff_refusal: ClassVar[str] = (
        "replaying its steps backward would need the derivative of the Jacobian inside every step"
    )

    def steps_onto_save_times(self, options: Any) -> bool:
        # Where the dense output needs no extra stages, it is differentiated instead, so the
        # steps are those of a solve without gradients.
        return bool(options.alg.interpolation_rhs_evals)

    def forward(self, static: Any, batch: BatchRHS, inputs: BatchInputs) -> BatchForward:
        from ..integrator.loop import integrate
        from .passes import dense_steps, finished, integrate_batch, switch_for_stability

        every = self.checkpoint_every or 0
        problem, result = integrate_batch(static, batch, self.records, every)
        saved = _host(result.saved)
        n_lanes = inputs.u0.shape[-1]
        # Fixed steps are not controlled: their derivative is that of the loss.
        if static.options.adaptive and switch_for_stability(static, batch, result, n_lanes):
            # The same steps again, with stages, for the interpolating adjoint.
            dense = dataclasses.replace(problem, record_steps=InterpolatingAdjoint.records)
            result = integrate(dense, static.options, batch.backend)
            record = dense_steps(result, batch.backend, inputs.u0)
            return finished(saved, record, result, InterpolatingAdjoint())
        return finished(saved, result.trials or [], result, self)

    def backward(
        self, static: Any, record: Any, leaves: list[Any], retcode: Any, t0: Any, g: Any
    ) -> Gradients:
        from ..backends import get_backend
        from .discrete_adjoint import backward
        from .passes import on_backend, plain_rhs_for, traced_rhs

        rhs = traced_rhs(static)
        backend = get_backend(static.backend)
        leaves = on_backend(backend, static, leaves)
        u0_bar, leaf_bars = backward(
            backend,
            static.options.alg,
            rhs,
            record,
            leaves,
            None if static.save_grid is None else static.save_grid.astype(g.dtype),
            t0,
            retcode,
            backend.asarray(g),
            rhs_for=plain_rhs_for(static, leaves) if self.checkpoint_every else None,
        )
        return _host(u0_bar), [_host(bar) for bar in leaf_bars]


@dataclasses.dataclass(frozen=True)
class InterpolatingAdjoint(_ContinuousAdjoint):
    """The continuous adjoint, integrated backward along the forward pass's dense output.

    Solves ``a' = -(df/du)^T a`` and ``g' = -(df/dp)^T a`` from the last save time back to
    ``t0`` with the same method and tolerances, adding each save point's cotangent to ``a``
    when it reaches that time; ``u(t)`` comes from the forward pass's interpolant. The
    gradient is accurate to the tolerances (not exact for the discrete solution); memory
    holds every forward step with its stages. The default for stiff methods, which integrate
    the adjoint with its exact Jacobian ``[[-J^T, 0], [-(df/dp)^T, 0]]``.
    """

    records: ClassVar[str] = "dense"  # every accepted step with its stages

    def _record(self, result: Any, saved: Any, batch: BatchRHS, inputs: BatchInputs) -> Any:
        from .passes import dense_steps

        return dense_steps(result, batch.backend, inputs.u0)


@dataclasses.dataclass(frozen=True)
class BacksolveAdjoint(_ContinuousAdjoint):
    """The continuous adjoint with the state integrated backward alongside it.

    Integrates ``[u, a, g]`` from the last save point back to ``t0`` and keeps nothing of the
    forward pass but the saved states: the least memory. Integrating ``u`` backward is
    unstable for dissipative or chaotic systems (Lorenz over more than a few time units): the
    reconstructed ``u`` drifts from the forward solution and the gradient is then wrong.
    Use it for non-stiff, non-chaotic, reversible problems only (stiff methods raise
    ``NotImplementedError``).
    """

    stiff_refusal: ClassVar[str] = (
        "integrating a stiff problem's state backward in time is unstable (its fast decaying "
        "modes grow backward), so the recomputed states and the gradient are wrong"
    )

    def _record(self, result: Any, saved: Any, batch: BatchRHS, inputs: BatchInputs) -> Any:
        return saved  # the backward pass starts from the last saved state


@dataclasses.dataclass(frozen=True)
class ForwardSensitivity(_Sensitivity):
    """Forward-mode sensitivities: integrate ``S = du/dθ`` with the state.

    ``S' = (df/du) S + df/dθ`` for every differentiated input θ (the ``u0`` components and the
    elements of the traced parameter leaves), with one forward-mode Jacobian-vector product
    of ``f`` per input and stage, all under the same error control. It gives the Jacobian of
    every save point, so its cost grows with the number of inputs: use it for few inputs
    (a handful per trajectory), or as a tight reference. Stiff methods integrate it with the
    exact block lower triangular Jacobian of ``[u, S]``.
    """

    def forward(self, static: Any, batch: BatchRHS, inputs: BatchInputs) -> BatchForward:
        from . import forward_sensitivity
        from .passes import finished

        dtype = inputs.u0.dtype
        saved, record, result = forward_sensitivity.forward(
            static,
            batch,
            inputs.u0,
            inputs.t0,
            inputs.t1,
            inputs.save_times,
            None if inputs.stops is None else inputs.stops.astype(dtype),
        )
        return finished(saved, record, result, self)

    def backward(
        self, static: Any, record: Any, leaves: list[Any], retcode: Any, t0: Any, g: Any
    ) -> Gradients:
        from . import forward_sensitivity

        return forward_sensitivity.contract(static, record, retcode, g)


SENSEALGS = (DiscreteAdjoint, InterpolatingAdjoint, BacksolveAdjoint, ForwardSensitivity)
