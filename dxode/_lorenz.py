"""The Lorenz system and its vector-Jacobian product, as the demo uses them."""

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
