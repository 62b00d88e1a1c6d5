"""The sensitivity algorithms ``solve(..., sensealg=...)`` accepts: what each one computes.

Each is a small frozen dataclass naming a method; the work is done in the modules of
``dxode.sensitivity`` by integrating augmented lane problems with the one integrator.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DiscreteAdjoint:
    """Differentiate the discrete solution: replay the accepted steps backward (the default
    for explicit methods; stiff methods raise ``NotImplementedError``).

    The gradient is exact for the numbers the forward pass computed with the step sizes held
    fixed, whatever the tolerance, and costs one backward sweep with one RHS vector-Jacobian
    product per stage. Where an adaptive step went beyond the method's stability interval (a
    stiff problem: steps limited by stability, not accuracy), that derivative can be far
    from the gradient of the loss, so ``solve`` raises a ``ValueError`` naming the fixes; the
    default ``sensealg=None`` switches to ``InterpolatingAdjoint`` instead.

    To make save points exact step ends, the forward pass steps onto every save time (so its
    steps differ slightly from a solve without gradients).

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
        k = self.checkpoint_every
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"checkpoint_every must be a positive integer or None, got {k!r}")


@dataclasses.dataclass(frozen=True)
class InterpolatingAdjoint:
    """The continuous adjoint, integrated backward along the forward pass's dense output.

    Solves ``a' = -(df/du)^T a`` and ``g' = -(df/dp)^T a`` from the last save time back to
    ``t0`` with the same method and tolerances, adding each save point's cotangent to ``a``
    when it reaches that time; ``u(t)`` comes from the forward pass's interpolant. The
    gradient is accurate to the tolerances (not exact for the discrete solution); memory
    holds every forward step with its stages. The default for stiff methods, which integrate
    the adjoint with its exact Jacobian ``[[-J^T, 0], [-(df/dp)^T, 0]]``.
    """


@dataclasses.dataclass(frozen=True)
class BacksolveAdjoint:
    """The continuous adjoint with the state integrated backward alongside it.

    Integrates ``[u, a, g]`` from the last save point back to ``t0`` and keeps nothing of the
    forward pass but the saved states: the least memory. Integrating ``u`` backward is
    unstable for dissipative or chaotic systems (Lorenz over more than a few time units): the
    reconstructed ``u`` drifts from the forward solution and the gradient is then wrong.
    Use it for non-stiff, non-chaotic, reversible problems only (stiff methods raise
    ``NotImplementedError``).
    """


@dataclasses.dataclass(frozen=True)
class ForwardSensitivity:
    """Forward-mode sensitivities: integrate ``S = du/dθ`` with the state.

    ``S' = (df/du) S + df/dθ`` for every differentiated input θ (the ``u0`` components and the
    elements of the traced parameter leaves), with one forward-mode Jacobian-vector product
    of ``f`` per input and stage, all under the same error control. It gives the Jacobian of
    every save point, so its cost grows with the number of inputs: use it for few inputs
    (a handful per trajectory), or as a tight reference. Stiff methods integrate it with the
    exact block lower triangular Jacobian of ``[u, S]``.
    """


SENSEALGS = (DiscreteAdjoint, InterpolatingAdjoint, BacksolveAdjoint, ForwardSensitivity)
