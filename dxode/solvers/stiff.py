"""What every stiff method shares: the state check, derivatives, and ``W`` factorizations."""

from __future__ import annotations

import copy
import warnings
from typing import Any

from .._jacobian import check_autodiff, lane_jacobian, lane_tgrad
from .._validation import user_stacklevel

Array = Any

# Components per lane from which a stiff solve warns of its dense n x n linear algebra.
LARGE_STATE = 1000


class LargeStiffSystemWarning(UserWarning):
    """A stiff method was given a state so large that its dense Jacobians and their
    factorizations, ``O(n^2)`` memory and ``O(n^3)`` work per step, dominate the solve."""


def check_state(method: Any, u: Array) -> None:
    """Stiff methods work on 1-D states ``(n,)`` (``u``: ``(n, L)`` with lanes)."""
    check_vector_state(method, tuple(u.shape[:-1]))


def check_vector_state(method: Any, shape: tuple[int, ...]) -> None:
    """Raise unless ``shape`` (a state's, without lanes) is 1-D: ``(n,)``."""
    if len(shape) != 1:
        raise ValueError(
            f"{type(method).__name__} needs a 1-D state u0 of shape (n,), got shape "
            f"{shape}; flatten the state (u0.ravel()) and reshape inside f"
        )


def shifted_jacobian(xp: Any, diagonal: Array, scale: Array, jac: Array) -> Array:
    """``diagonal * I - scale * J`` for every lane (``diagonal``, ``scale``: ``(L,)`` or floats)."""
    n = jac.shape[0]
    eye = xp.reshape(xp.eye(n, dtype=jac.dtype), (n, n, 1))
    return eye * diagonal - scale * jac


def linear_combination(coefficients: Any, vectors: list[Array]) -> Array | None:
    """``sum_j coefficients[j] * vectors[j]`` in order, skipping zero coefficients."""
    total = None
    for c, v in zip(coefficients, vectors, strict=False):
        c = float(c)
        if c == 0.0:
            continue
        term = v if c == 1.0 else c * v
        total = term if total is None else total + term
    return total


def jacobian_norm(xp: Any, jac: Array) -> Array:
    """``max_i sum_j |J_ij|`` per lane (``jac`` is ``(n, n, L)``): a bound on the magnitude of
    every eigenvalue of ``J``."""
    return xp.max(xp.sum(xp.abs(jac), axis=1), axis=0)


class StiffMethod:
    """Mixin: the ``autodiff`` option and the derivatives of the lane RHS.

    Parameters
    ----------
    autodiff : {"auto", "autograd", "finite_difference"}
        How the Jacobian is computed when the problem has no ``jac`` (see the module
        ``dxode._jacobian``): ``"auto"`` uses the problem's ``jac``, else autograd where
        ``f`` can be traced on NumPy, else finite differences.
    """

    variable_rhs_evals = True
    estimate_stiffness = False  # report StepResult.rho (set on AutoSwitch's copy)
    dense_stages: int  # rows of StepResult.stages
    jacobians_per_step = 1
    factorizations_per_step = 1

    def __init__(self, autodiff: str = "auto") -> None:
        self.autodiff = check_autodiff(autodiff)

    def check_state_shape(self, shape: tuple[int, ...]) -> None:
        """Stiff methods work on 1-D states ``(n,)``: ``J`` is ``(n, n)``; a large ``n``
        gets a ``LargeStiffSystemWarning``."""
        check_vector_state(self, shape)
        if shape[0] >= LARGE_STATE:
            message = _large_state_message(self, shape[0])
            warnings.warn(message, LargeStiffSystemWarning, stacklevel=user_stacklevel())

    def with_autodiff(self, autodiff: str) -> Any:
        """A copy of this method (its other settings kept) computing Jacobians by ``autodiff``."""
        changed = copy.copy(self)
        changed.autodiff = check_autodiff(autodiff)
        return changed

    def derivatives(
        self, backend: Any, rhs: Any, t: Array, u: Array, f0: Array, need_tgrad: bool
    ) -> tuple[Array, Array | None, int]:
        """``J`` ``(n, n, L)``, ``df/dt`` ``(n, L)`` (if needed) and the RHS evaluations spent."""
        check_state(self, u)
        jac, nf = lane_jacobian(backend, rhs, u, t, f0, self.autodiff)
        if not need_tgrad:
            return jac, None, nf
        tgrad, nf_t = lane_tgrad(backend, rhs, u, t, f0)
        return jac, tgrad, nf + nf_t

    def stiffness(self, xp: Any, jac: Array) -> Array | None:
        """``StepResult.rho`` for a step with Jacobian ``jac``: its norm, when asked for."""
        return jacobian_norm(xp, jac) if self.estimate_stiffness else None

    def __repr__(self) -> str:
        arg = "" if self.autodiff == "auto" else f"autodiff={self.autodiff!r}"
        return f"{type(self).__name__}({arg})"


def _large_state_message(method: Any, n: int) -> str:
    megabytes = 8 * n * n / 2**20
    return (
        f"{type(method).__name__} on a state of {n:,} components builds a dense {n:,} x {n:,} "
        f"Jacobian at every step ({megabytes:,.0f} MB per trajectory in float64; {n:,} "
        f"evaluations of f, or autograd's {n:,} passes, unless the problem has jac) and "
        f"factors it (about {2 * n**3:.0e} operations): the solve costs O(n^3) per step. "
        f"dxode's stiff methods suit many small systems; for one large sparse stiff system "
        f"use scipy.integrate.solve_ivp(method='BDF', jac_sparsity=...), and if the problem "
        f"is not stiff, Tsit5(). Silence this with warnings.filterwarnings('ignore', "
        f"category=dxode.LargeStiffSystemWarning)"
    )
