"""The Lorenz system and its derivatives: the demo's model, shared by tests and benchmarks."""

from __future__ import annotations

from typing import Any

import numpy as np


def lorenz(u: Any, p: Any, t: Any) -> list[Any]:
    """The Lorenz system, written once for any array library (a list of rows is stacked)."""
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def lorenz_vjp(u: Any, p: Any, t: Any, v: Any) -> tuple[Any, Any]:
    """``v^T df/du`` per lane and ``v^T df/dp`` summed over lanes (``p`` is shared)."""
    x, y, z = u
    sigma, rho, beta = p
    vx, vy, vz = v
    u_bar = np.stack(
        [-sigma * vx + (rho - z) * vy + y * vz, sigma * vx - vy + x * vz, -x * vy - beta * vz]
    )
    p_bar = np.array([np.sum((y - x) * vx), np.sum(x * vy), np.sum(-z * vz)])
    return u_bar, p_bar


def lorenz_jac(u: Any, p: Any, t: Any) -> list[list[Any]]:
    """``df/du`` as rows of entries (numbers are broadcast over lanes)."""
    x, y, z = u
    sigma, rho, beta = p
    return [[-sigma, sigma, 0.0], [rho - z, -1.0, -x], [y, x, -beta]]


def lorenz_paramjac(u: Any, p: Any, t: Any) -> list[list[Any]]:
    """``df/dp`` as rows of entries: one column per parameter (sigma, rho, beta)."""
    x, y, z = u
    return [[y - x, 0.0, 0.0], [0.0, x, 0.0], [0.0, 0.0, -z]]
