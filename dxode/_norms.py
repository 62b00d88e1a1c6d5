"""Per-lane error norms and the automatic initial step."""

from __future__ import annotations

from typing import Any

from .backends._base import ordered_sum

Array = Any


def rms_norm(xp: Any, x: Array) -> Array:
    """Root-mean-square over the state axes of ``x`` ``(*shape, L)``: one value per lane."""
    if x.ndim == 1:
        return xp.abs(x)
    size = 1
    for n in x.shape[:-1]:
        size *= n
    squares = xp.reshape(x * x, (size, x.shape[-1]))
    # In order, so that a lane's norm never depends on the batch around it.
    return xp.sqrt(ordered_sum(xp, squares) / size)


def initial_step(
    xp: Any,
    rhs: Any,
    t0: Array,
    u0: Array,
    f0: Array,
    direction: float,
    t1: Array,
    order: int,
    rtol: float,
    atol: Any,
) -> Array:
    """A first step size per lane (positive ``(L,)``), Hairer, Nørsett & Wanner's heuristic.

    Takes ``h0 = 0.01 * |u0| / |f0|`` (in the tolerance-scaled norm), probes with one Euler
    step to estimate the second derivative, and chooses ``h`` so that the first step's local
    error is about the tolerance; never beyond ``100 * h0`` nor the span. One RHS evaluation.

    References
    ----------
    E. Hairer, S. P. Nørsett, G. Wanner, Solving Ordinary Differential Equations I, 2nd ed.,
    Springer (1993), Sec. II.4.
    """
    scale = atol + rtol * xp.abs(u0)
    d0 = rms_norm(xp, u0 / scale)
    d1 = rms_norm(xp, f0 / scale)
    span = xp.abs(t1 - t0)
    small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = xp.where(small, 1e-6, 0.01 * d0 / xp.where(small, 1.0, d1))
    h0 = xp.minimum(h0, span)
    u_probe = u0 + (direction * h0) * f0
    f_probe = rhs(u_probe, t0 + direction * h0)
    d2 = rms_norm(xp, (f_probe - f0) / scale) / h0
    dmax = xp.maximum(d1, d2)
    tiny = dmax <= 1e-15
    h1 = xp.where(
        tiny,
        xp.maximum(xp.full_like(h0, 1e-6), h0 * 1e-3),
        (0.01 / xp.where(tiny, 1.0, dmax)) ** (1.0 / (order + 1)),
    )
    return xp.minimum(xp.minimum(100 * h0, h1), span)
