"""The user's ``jac`` checked once, at ``u0``, against differences of ``f``.

A stiff method given a ``jac`` that points the wrong way (its sign flipped, or transposed
where ``f``'s Jacobian is mostly skew) takes steps its error estimate keeps rejecting or
shrinking: Robertson, HIRES and Van der Pol with a negated ``jac`` ran Rodas5P and TRBDF2 to
``MaxIters`` (100,000 steps, minutes) without a word about ``jac``. So before the first step
every lane's ``jac(u0, p, t0)`` is applied to ``DIRECTIONS`` fixed test directions ``w`` and
compared with ``f``'s derivatives along them measured by central differences, ``(f(u0 + w) -
f(u0 - w)) / 2`` (``2 DIRECTIONS`` evaluations of ``f``, not counted in ``nf``; ``w`` has
the increments of dxode's difference Jacobians, per component). A solve whose ``jac`` points
more than 120 degrees from them (cosine below ``-1/2``) is refused. Only a gross
disagreement is refused: a ``jac`` that is scaled, approximate or missing terms (as TRBDF2's
Newton iteration tolerates) passes, and so does any lane where the differences cannot judge:
where the forward and backward differences disagree by more than a tenth of their mean (a
kink of ``f`` at ``u0``, round-off), where either side is zero, or where a value is not
finite.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._derivatives import user_matrix
from ._jacobian import difference_increment

__all__ = ["check_user_jacobian", "jacobian_disagreement", "uses_problem_jac"]

Array = Any

# Test directions: standard normal entries (seed 0), times each component's increment.
DIRECTIONS = 2
# Refused below this cosine of the angle between ``jac · w`` and the measured derivatives.
MIN_COSINE = -0.5
# Lanes whose forward and backward differences differ by more than this, relative to their
# mean, are not judged.
MAX_SPREAD = 0.1


def uses_problem_jac(method: Any, jac: Any) -> bool:
    """Whether ``method`` steps with the problem's ``jac`` (``None`` if it has none): a
    method that factors Jacobians, whose stiff part (AutoSwitch's ``stiff``) has
    ``autodiff="auto"``."""
    stiff = getattr(method, "stiff", method)
    uses_jacobians = bool(getattr(method, "jacobians_per_step", 0))
    return jac is not None and uses_jacobians and getattr(stiff, "autodiff", None) == "auto"


def check_user_jacobian(backend: Any, rhs: Any, u0: Array, t0: Array, f0: Array) -> None:
    """Raise a ``ValueError`` naming ``jac`` if any lane's ``jac(u0, p, t0)`` points against
    the derivatives of ``f`` measured there (``jacobian_disagreement``)."""
    message = jacobian_disagreement(backend, rhs, u0, t0, f0)
    if message is not None:
        raise ValueError(message)


def jacobian_disagreement(backend: Any, rhs: Any, u0: Array, t0: Array, f0: Array) -> str | None:
    """The error message for the first lane whose ``jac(u0, p, t0)`` points against the
    derivatives of ``f`` measured along the test directions (see the module), or ``None``.

    ``rhs`` is the lanes' ``LaneFunction`` (it carries ``jac``), ``u0`` ``(n, L)``, ``t0``
    ``(L,)`` and ``f0 = rhs(u0, t0)``.
    """
    xp = backend.xp
    user = user_matrix(backend, rhs.derivatives, "jac", rhs.p, u0, t0)  # (n, n, L)
    increments = difference_increment(xp, u0, float(xp.finfo(u0.dtype).eps))
    entries = np.random.default_rng(0).standard_normal((DIRECTIONS, u0.shape[0], 1))
    applied, measured, spread = [], [], []
    for v in entries:
        w = backend.asarray(v, dtype=u0.dtype) * increments
        forward, backward = rhs(u0 + w, t0) - f0, f0 - rhs(u0 - w, t0)
        applied.append(xp.sum(user * w[None, ...], axis=1))  # jac · w, (n, L)
        measured.append(0.5 * (forward + backward))
        spread.append(forward - backward)
    applied, measured = xp.stack(applied), xp.stack(measured)  # (DIRECTIONS, n, L)
    applied_norm, measured_norm = _norm(xp, applied), _norm(xp, measured)
    judged = (
        (applied_norm > 0)
        & (measured_norm > 0)
        & (_norm(xp, xp.stack(spread)) <= MAX_SPREAD * measured_norm)
        & xp.isfinite(applied_norm)
        & xp.isfinite(measured_norm)
    )
    safe = xp.where(judged, applied_norm * measured_norm, xp.ones_like(applied_norm))
    cosine = xp.sum(xp.sum(applied * measured, axis=0), axis=0) / safe
    wrong = np.asarray(backend.to_host(judged & (cosine < MIN_COSINE)))
    if not wrong.any():
        return None
    lane = int(np.argmax(wrong))
    host = (np.asarray(backend.to_host(x[..., lane])) for x in (applied, measured, cosine))
    return _message(*host, lane, u0.shape[-1])


def _norm(xp: Any, vectors: Array) -> Array:
    """The 2-norm ``(L,)`` of every lane's ``vectors`` ``(DIRECTIONS, n, L)``."""
    return xp.sqrt(xp.sum(xp.sum(vectors * vectors, axis=0), axis=0))


def _message(
    applied: np.ndarray, measured: np.ndarray, cosine: np.ndarray, lane: int, lanes: int
) -> str:
    """The error for lane ``lane`` of ``lanes`` (``applied``, ``measured``: its ``jac · w``
    and measured derivatives ``(DIRECTIONS, n)`` on the host, ``cosine`` their angle's)."""
    k, i = np.unravel_index(int(np.argmax(np.abs(applied - measured))), applied.shape)
    where = "" if lanes == 1 else f" (lane {lane} of the batch)"
    return (
        f"jac(u, p, t) disagrees with f at the initial state{where}: along small test "
        f"steps w of the state, jac · w points against the change of f measured by "
        f"differences of f (cosine of the angle between them {float(cosine):.2f}; component "
        f"{i}: jac · w gives {applied[k, i]:.6g}, differences of f give {measured[k, i]:.6g}). "
        f"With it a stiff method's steps shrink until the solve ends in MaxIters. Check jac's "
        f"sign and that row i holds df_i/du_j; or leave jac out (ODEProblem(..., jac=None)) "
        f"and dxode computes the Jacobian itself (autograd or differences)"
    )
