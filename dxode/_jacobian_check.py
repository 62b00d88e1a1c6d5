"""The user's ``jac`` checked once, at ``u0``, against differences of ``f``.

A stiff method given a ``jac`` that points the wrong way (its sign flipped, or transposed
where ``f``'s Jacobian is mostly skew) takes steps its error estimate keeps rejecting or
shrinking: Robertson, HIRES and Van der Pol with a negated ``jac`` ran Rodas5P and TRBDF2 to
``MaxIters`` (100,000 steps, minutes) without a word about ``jac``. So before the first step
every lane's ``jac(u0, p, t0)`` is compared with ``f``'s Jacobian measured by central
differences (``2 n`` evaluations of ``f``, not counted in ``nf``), and a solve whose ``jac``
is more than 120 degrees from it (cosine of the entrywise, Frobenius, angle below ``-1/2``)
is refused. Only a gross disagreement is refused: a ``jac`` that is scaled, approximate or
missing terms (as TRBDF2's Newton iteration tolerates) passes, and so does any lane where
the differences cannot judge: where the forward and backward differences disagree by more
than a tenth of the measured Jacobian (a kink of ``f`` at ``u0``, round-off), where either
Jacobian is zero, or where a value is not finite.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._derivatives import user_matrix
from ._jacobian import difference_jacobian

__all__ = ["check_user_jacobian", "jacobian_disagreement", "uses_problem_jac"]

Array = Any

# Refused below this cosine of the angle between the user's and the measured Jacobian.
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
    the central-difference Jacobian of ``f`` there (``jacobian_disagreement``)."""
    message = jacobian_disagreement(backend, rhs, u0, t0, f0)
    if message is not None:
        raise ValueError(message)


def jacobian_disagreement(backend: Any, rhs: Any, u0: Array, t0: Array, f0: Array) -> str | None:
    """The error message for the first lane whose ``jac(u0, p, t0)`` points against the
    central-difference Jacobian of ``f`` there (see the module), or ``None``.

    ``rhs`` is the lanes' ``LaneFunction`` (it carries ``jac``), ``u0`` ``(n, L)``, ``t0``
    ``(L,)`` and ``f0 = rhs(u0, t0)``.
    """
    xp = backend.xp
    user = user_matrix(backend, rhs.derivatives, "jac", rhs.p, u0, t0)
    forward = difference_jacobian(backend, rhs, u0, t0, f0)
    backward = difference_jacobian(backend, rhs, u0, t0, f0, direction=-1.0)
    measured = 0.5 * (forward + backward)
    user_norm, measured_norm = _norm(xp, user), _norm(xp, measured)
    judged = (
        (user_norm > 0)
        & (measured_norm > 0)
        & (_norm(xp, forward - backward) <= MAX_SPREAD * measured_norm)
        & xp.isfinite(user_norm)
        & xp.isfinite(measured_norm)
    )
    safe = xp.where(judged, user_norm * measured_norm, xp.ones_like(user_norm))
    cosine = xp.sum(xp.sum(user * measured, axis=0), axis=0) / safe
    wrong = np.asarray(backend.to_host(judged & (cosine < MIN_COSINE)))
    if not wrong.any():
        return None
    lane = int(np.argmax(wrong))
    host = (np.asarray(backend.to_host(x[..., lane])) for x in (user, measured, cosine))
    return _message(*host, lane, u0.shape[-1])


def _norm(xp: Any, matrices: Array) -> Array:
    """The Frobenius norm ``(L,)`` of every lane's matrix in ``matrices`` ``(n, n, L)``."""
    return xp.sqrt(xp.sum(xp.sum(matrices * matrices, axis=0), axis=0))


def _message(
    user: np.ndarray, measured: np.ndarray, cosine: np.ndarray, lane: int, lanes: int
) -> str:
    """The error for lane ``lane`` of ``lanes`` (``user``, ``measured``: its ``(n, n)``
    Jacobians on the host, ``cosine`` the angle's)."""
    i, j = np.unravel_index(int(np.argmax(np.abs(user - measured))), user.shape)
    where = "" if lanes == 1 else f" (lane {lane} of the batch)"
    return (
        f"jac(u, p, t) disagrees with f at the initial state{where}: the Jacobian it returned "
        f"points against df/du measured by differences of f (cosine of the angle between "
        f"them {float(cosine):.2f}; entry [{i}, {j}]: jac gives {user[i, j]:.6g}, "
        f"differences of f give {measured[i, j]:.6g}). With it a stiff method's steps "
        f"shrink until the solve ends in MaxIters. Check jac's sign and that row i holds "
        f"df_i/du_j; or leave jac out (ODEProblem(..., jac=None)) and dxode computes the "
        f"Jacobian itself (autograd or differences)"
    )
