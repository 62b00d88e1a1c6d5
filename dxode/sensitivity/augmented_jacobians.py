"""Exact Jacobians of the augmented systems, so stiff methods can integrate them.

A stiff method (a Rosenbrock method) needs every lane's Jacobian of the system it integrates.
The augmented lane systems of the sensitivity algorithms get theirs assembled from blocks,
exactly (a difference Jacobian of the whole augmented state would cost one augmented RHS
evaluation per row, each with many products, and lose half the digits):

* forward sensitivities ``z = [u, S_1..S_D]``, ``z' = [f, J S_d + f_θd]``::

      [[J,   0, ..., 0],
       [M_1, J, ..., 0],      M_d = d(J S_d + f_θd)/du, one forward-over-forward product
       [M_D, 0, ..., J]]      of f per state component (n per Jacobian)

  with ``J`` from the problem's ``jac``, autograd or differences (the method's ``autodiff``);
* the interpolating adjoint ``z = [a, g]``, ``z' = [-J^T a, -f_p^T a]`` (``u(t)`` from the
  forward dense output) is linear in ``a``: ``[[-J^T, 0], [-f_p^T, 0]]`` from ``n``
  vector-Jacobian products with one-hot cotangents (autograd or the problem's ``vjp``).

``d/dt`` of the augmented systems is left to the method (a forward difference in ``t``,
exactly zero for autonomous systems).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .._derivatives import Derivatives, LaneFunction
from ..solvers import ExplicitRungeKutta

Array = Any


def is_stiff(stepper: Any) -> bool:
    """Whether ``stepper`` needs Jacobians of the system it integrates."""
    return bool(getattr(stepper, "jacobians_per_step", 0))


def with_jacobian(rhs: Callable[..., Array], jac: Callable[[Array, Array], Array]) -> LaneFunction:
    """The lane RHS ``rhs(z, t, out=None)`` carrying ``jac(z, t) -> (N, N, L)`` for the method."""
    derivatives = Derivatives(f=rhs, jac=lambda z, _p, t: jac(z, t), single_lane=False)
    return LaneFunction(rhs, None, derivatives)


def augmented_options(options: Any) -> Any:
    """``options`` whose stiff method takes the assembled Jacobian (``autodiff="auto"``)."""
    alg = options.alg
    if isinstance(alg, ExplicitRungeKutta) or getattr(alg, "autodiff", "auto") == "auto":
        return options
    return dataclasses.replace(options, alg=alg.with_autodiff("auto"))


def u_jacobian(func: Callable[[Array], Array], u: Array) -> Array:
    """Every lane's Jacobian ``(m, n, L)`` of ``func: (n, L) -> (m, L)`` at ``u``.

    One forward-mode product per state component, with the one-hot tangent broadcast over the
    lanes (``func`` is elementwise across lanes); ``func`` may itself use autograd.
    """
    import autograd

    columns = []
    for j in range(u.shape[0]):
        tangent = np.zeros_like(u)
        tangent[j] = 1.0
        with warnings.catch_warnings():  # func ignores u (f linear in u): a zero column
            warnings.filterwarnings("ignore", "Output seems independent of input")
            _, column = autograd.make_jvp(func)(u)(tangent)
        columns.append(np.asarray(column, dtype=u.dtype))
    return np.stack(columns, axis=1)


def sensitivity_jacobian(jac: Array, coupling: Array) -> Array:
    """The forward-sensitivity system's ``(n (1 + D), n (1 + D), L)`` Jacobian.

    ``jac`` is ``J`` ``(n, n, L)``; ``coupling`` stacks the ``M_d`` as ``(D n, n, L)``.
    """
    n, width = jac.shape[0], jac.shape[-1]
    d = coupling.shape[0] // n
    out = np.zeros((n * (1 + d), n * (1 + d), width), dtype=jac.dtype)
    out[n:, :n] = coupling
    for block in range(1 + d):
        rows = slice(block * n, (block + 1) * n)
        out[rows, rows] = jac
    return out
