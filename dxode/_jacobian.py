"""Jacobians ``J = df/du`` and time derivatives ``df/dt`` of a working set of lanes.

Stiff methods need, for each lane, the ``(n, n)`` Jacobian of the right-hand side and its
time derivative. They come from the user's ``jac``/``tgrad`` when the problem has them, and
are otherwise computed:

* ``"autograd"`` (NumPy only): one traced evaluation of ``f`` and ``n`` reverse passes with
  one-hot cotangents broadcast over lanes (row ``i`` of every lane's Jacobian per pass),
  through the same tracing code as the gradients (``_traced_rhs``), or through
  the problem's ``vjp`` when it has one. Exact to round-off; costs about ``n + 1`` RHS
  evaluations' worth of work and is counted as one RHS evaluation.
* ``"finite_difference"`` (every backend): forward differences, component ``j`` of all
  lanes perturbed at once by ``max(sqrt(eps * max(|u_j|, 1e-5)), sqrt(eps) |u_j|)`` per lane
  (``difference_increment``: Hairer and Wanner's RADAU5 increment up to ``|u_j| = 1``,
  ``sqrt(eps)`` relative above it): ``n`` extra RHS evaluations (counted in ``nf``). A
  component far below 1 gets a perturbation to its own scale: with
  ``sqrt(eps) * max(|u_j|, 1)``, Robertson's ``y2 ~ 1e-5`` was moved by 1.5e-8 and its
  ``3e7 y2^2`` term differentiated 1.6 % wrong, and Rodas5P took 2.4 times the steps of an
  exact Jacobian at ``rtol=1e-6`` (9 times at ``1e-8``). So does one far above 1: RADAU5's
  ``sqrt(eps |u_j|)`` alone is ``sqrt(eps / |u_j|)`` relative, a few ulps of a component of
  1e12, and Robertson in number densities (``y`` scaled by 1e12) took Rodas5P 968 steps at
  ``rtol=1e-8`` against 270 with an exact Jacobian (at 1e16, 13048: the increment fell below
  an ulp); now 271.
* ``"auto"``: the user's ``jac`` if given, else autograd where ``f`` can be traced on NumPy,
  else finite differences.

Without a user ``tgrad``, ``df/dt`` is a forward difference in ``t`` (one RHS evaluation; it
is exactly zero for an autonomous ``f``) over ``sqrt(eps) * m`` (``time_increment``). A lane
whose span is ``s = |t1 - t0|`` (its ``time_scale``) takes ``m = max(c, sqrt(|t| c))`` with
``c = min(s, max(|t|, 1))``:

* near ``t = 0`` on a span of at least 1 (``|t| <= s``) that is ``max(|t|, 1)``, the
  increment the lanes always had;
* on a span shorter than 1, or far from ``t = 0`` (``|t| > s``), it is ``max(s, sqrt(|t| s))``:
  the problem is differenced on its own time scale. With ``max(|t|, 1)`` alone, a forcing of
  period 6e-9 over ``tspan = (0, 1e-8)`` was differenced across more than the whole span
  and Rodas5P crawled (1e5 steps against 20 with an exact ``tgrad``); over
  ``(1e6, 1e6 + 3)`` a forcing on the scale 1 was differenced over 0.015 and Rodas5P took
  8416 steps against 15.

The geometric mean ``sqrt(|t| s)`` balances the difference's truncation error on the scale
``s`` against the round-off of ``f`` at a large ``|t|``, whose own resolution is
``eps |t|``: over ``(1e6, 1e6 + 1e-3)`` it differences over 4.7e-7, where ``max(|t|, s)``
would take 0.015, fifteen times the span. The integrator
attaches each lane's scale to its RHS (``LaneFunction.time_scale``); the kernels compute the
same per lane (``rosenbrock_codegen.write_time_scales``). All arithmetic is elementwise
across lanes, so a lane's Jacobian does not depend on the batch it is in.
"""

from __future__ import annotations

import math
from typing import Any

from . import _pytree
from ._derivatives import Derivatives, user_matrix
from ._traced_rhs import TracedRHS

Array = Any

AUTODIFF_MODES = ("auto", "autograd", "finite_difference")

# The magnitude below which a component's difference increment stops shrinking with it
# (``sqrt(eps * FD_FLOOR)``: 4.7e-11 in float64); the kernels' Jacobians use it too.
FD_FLOOR = 1e-5


def check_autodiff(mode: str) -> str:
    """``mode`` if it names a Jacobian method, else a ValueError listing the choices."""
    if mode not in AUTODIFF_MODES:
        raise ValueError(f"autodiff must be one of {AUTODIFF_MODES}, got {mode!r}")
    return mode


def lane_jacobian(
    backend: Any, rhs: Any, u: Array, t: Array, f_u: Array, mode: str
) -> tuple[Array, int]:
    """Every lane's Jacobian ``(n, n, L)`` at ``(u, t)`` and the RHS evaluations it cost.

    ``u`` is ``(n, L)``, ``t`` ``(L,)`` and ``f_u = rhs(u, t)``.
    """
    derivs: Derivatives | None = getattr(rhs, "derivatives", None)
    if derivs is not None and derivs.jac is not None and mode == "auto":
        return user_matrix(backend, derivs, "jac", rhs.p, u, t), 0
    if mode != "finite_difference" and derivs is not None and not derivs.autograd_failed:
        if backend.name == "numpy":
            try:
                return _autograd_jacobian(derivs, rhs.p, u, t), 1
            except Exception:
                # Not traceable (plain numpy calls, in-place writes...): "auto" falls back to
                # differences, which evaluate f normally (a genuine error in f resurfaces).
                if mode == "autograd":
                    raise
                derivs.autograd_failed = True
        elif mode == "autograd":
            raise ValueError(
                f"autodiff='autograd' needs NumPy arrays (this problem is on {backend.name}); "
                f"use autodiff='finite_difference' or give the problem a jac"
            )
    return _difference_jacobian(backend, rhs, u, t, f_u), int(u.shape[0])


def time_scale(xp: Any, t0: Array, t1: Array) -> Array:
    """Every lane's time scale ``(L,)`` for differencing ``f`` in ``t``: the length
    ``|t1 - t0|`` of its span (``t0``, ``t1``: ``(L,)``, the state's dtype), at least the
    dtype's smallest normal number (so that the increment at ``t = 0`` stays above zero)."""
    span = xp.abs(t1 - t0)
    return xp.maximum(span, xp.full_like(span, float(xp.finfo(span.dtype).smallest_normal)))


def time_increment(xp: Any, t: Array, scale: Array) -> Array:
    """The forward-difference increment of ``df/dt`` at ``t`` ``(L,)`` for lanes of time scale
    ``scale`` (``time_scale``): ``sqrt(eps) * max(c, sqrt(|t| c))``, ``c = min(scale,
    max(|t|, 1))``; that is ``sqrt(eps) * max(|t|, 1)`` where ``|t| <= scale`` and
    ``scale >= 1``, else ``sqrt(eps) * max(scale, sqrt(|t| scale))``. Where ``|t| c``
    overflows (times beyond the square root of the dtype's largest number, ``1e154`` in
    float64, ``2e19`` in float32), ``sqrt(|t|) sqrt(c)``: not ``t + inf``."""
    eps = float(xp.finfo(t.dtype).eps)
    at = xp.abs(t)
    c = xp.minimum(scale, xp.maximum(at, xp.ones_like(t)))
    product = at * c
    root = xp.where(xp.isinf(product), xp.sqrt(at) * xp.sqrt(c), xp.sqrt(product))
    return math.sqrt(eps) * xp.maximum(c, root)


def lane_tgrad(backend: Any, rhs: Any, u: Array, t: Array, f_u: Array) -> tuple[Array, int]:
    """Every lane's ``df/dt`` ``(n, L)`` at ``(u, t)`` and the RHS evaluations it cost.

    Differenced on the lanes' time scales ``rhs.time_scale`` (``LaneFunction``; without one,
    over ``sqrt(eps) * max(|t|, 1)``, as for an unbounded span).
    """
    derivs: Derivatives | None = getattr(rhs, "derivatives", None)
    if derivs is not None and derivs.tgrad is not None:
        return user_matrix(backend, derivs, "tgrad", rhs.p, u, t), 0
    xp = backend.xp
    scale = getattr(rhs, "time_scale", None)
    t_step = t + time_increment(xp, t, xp.full_like(t, math.inf) if scale is None else scale)
    dt = t_step - t  # the step actually taken, after rounding
    return (rhs(u, t_step) - f_u) / dt, 1


def difference_increment(xp: Any, u_j: Array, eps: float) -> Array:
    """The increment of component ``u_j`` ``(L,)`` for a forward-difference Jacobian column:
    ``max(sqrt(eps max(|u_j|, FD_FLOOR)), sqrt(eps) |u_j|)``, RADAU5's increment up to
    ``|u_j| = 1`` and ``sqrt(eps)`` relative above it."""
    magnitude = xp.abs(u_j)
    return xp.maximum(xp.sqrt(eps * xp.maximum(magnitude, FD_FLOOR)), math.sqrt(eps) * magnitude)


def _difference_jacobian(backend: Any, rhs: Any, u: Array, t: Array, f_u: Array) -> Array:
    xp = backend.xp
    n = u.shape[0]
    eps = float(xp.finfo(u.dtype).eps)
    rows = xp.reshape(xp.arange(n), (n, 1))
    columns = []
    for j in range(n):
        step = difference_increment(xp, u[j, ...], eps)
        perturbed = u + xp.where(rows == j, step, xp.zeros_like(u))
        dj = perturbed[j, ...] - u[j, ...]  # the step actually taken, after rounding
        columns.append((rhs(perturbed, t) - f_u) / dj)
    return xp.stack(columns, axis=1)


def _autograd_jacobian(derivs: Derivatives, p: Any, u: Array, t: Array) -> Array:
    import numpy as np

    leaves = _pytree.leaves(p)
    traced = TracedRHS(
        f=derivs.f,
        p_template=p,
        lane_leaf=[False] * len(leaves),
        diff_leaf=[False] * len(leaves),
        single_lane=derivs.single_lane,
        vjp=derivs.vjp,
    )
    _, pull = traced.pullback(u, t, leaves)
    n = u.shape[0]
    rows = []
    for i in range(n):
        cotangent = np.zeros_like(u)
        cotangent[i, ...] = 1.0
        rows.append(np.asarray(pull(cotangent)[0], dtype=u.dtype))
    return np.stack(rows)
