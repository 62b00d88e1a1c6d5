"""Test problems with known solutions: analytic ones, DETEST, the Arenstorf orbit."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np
import pytest

from dxode.demo.lorenz import lorenz_jac, lorenz_paramjac  # noqa: F401 - shared with the tests


@dataclass(frozen=True)
class Reference:
    """A nonstiff test problem: ``f(u, p, t)`` written once for every backend."""

    name: str
    f: Callable[..., Any]
    u0: tuple[float, ...]
    tspan: tuple[float, float]
    p: Any = None
    exact: Callable[[float], np.ndarray] | None = None


# ---- analytic problems ------------------------------------------------------------------


def decay(u, p, t):
    return -p * u


def oscillator(u, p, t):
    x, v = u
    return [v, -x]


DECAY = Reference(
    "decay",
    decay,
    (1.0, 2.0, -0.5),
    (0.0, 2.0),
    p=1.5,
    exact=lambda t: np.array([1.0, 2.0, -0.5]) * math.exp(-1.5 * t),
)
OSCILLATOR = Reference(
    "oscillator",
    oscillator,
    (1.0, 0.0),
    (0.0, 2.0),
    exact=lambda t: np.array([math.cos(t), -math.sin(t)]),
)


# ---- the Arenstorf orbit (Hairer, Nørsett & Wanner, Solving ODEs I, Sec. II.0) -------------

ARENSTORF_PERIOD = 17.0652165601579625588917206249
_MU = 0.012277471


def arenstorf(u, p, t):
    y1, y2, v1, v2 = u
    mu, mup = _MU, 1.0 - _MU
    d1 = ((y1 + mu) ** 2 + y2**2) ** 1.5
    d2 = ((y1 - mup) ** 2 + y2**2) ** 1.5
    return [
        v1,
        v2,
        y1 + 2 * v2 - mup * (y1 + mu) / d1 - mu * (y1 - mup) / d2,
        y2 - 2 * v1 - mup * y2 / d1 - mu * y2 / d2,
    ]


ARENSTORF = Reference(
    "arenstorf",
    arenstorf,
    (0.994, 0.0, 0.0, -2.00158510637908252240537862224),
    (0.0, ARENSTORF_PERIOD),
    # The orbit is periodic: after one period it is back at its start.
    exact=lambda t: np.array([0.994, 0.0, 0.0, -2.00158510637908252240537862224]),
)


# ---- Pleiades: seven stars in the plane (Hairer, Norsett & Wanner I, II.10; Bari test set) ---


def pleiades(u, p, t):
    # u = (x1..x7, y1..y7, x1'..x7', y1'..y7'); star j has mass j.
    x, y = [u[i] for i in range(7)], [u[7 + i] for i in range(7)]
    ax, ay = [], []
    for i in range(7):
        sx, sy = 0.0 * x[i], 0.0 * y[i]
        for j in range(7):
            if j != i:
                dx, dy = x[j] - x[i], y[j] - y[i]
                r3 = (dx * dx + dy * dy) ** 1.5
                sx, sy = sx + (j + 1) * dx / r3, sy + (j + 1) * dy / r3
        ax.append(sx)
        ay.append(sy)
    return [u[14 + i] for i in range(14)] + ax + ay


PLEIADES_U0 = (3.0, 3.0, -1.0, -3.0, 2.0, -2.0, 2.0, 3.0, -3.0, 2.0, 0.0, 0.0, -4.0, 4.0)
PLEIADES_U0 += (0.0, 0.0, 0.0, 0.0, 0.0, 1.75, -1.5, 0.0, 0.0, 0.0, -1.25, 1.0, 0.0, 0.0)
# The Bari test set's reference solution at t = 3 (pleiades.pdf).
PLEIADES_AT_3 = np.array([
    0.3706139143970502, 0.3237284092057233e1, -0.3222559032418324e1, 0.6597091455775310,
    0.3425581707156584, 0.1562172101400631e1, -0.7003092922212495, -0.3943437585517392e1,
    -0.3271380973972550e1, 0.5225081843456543e1, -0.2590612434977470e1, 0.1198213693392275e1,
    -0.2429682344935824, 0.1091449240428980e1, 0.3417003806314313e1, 0.1354584501625501e1,
    -0.2590065597810775e1, 0.2025053734714242e1, -0.1155815100160448e1, -0.8072988170223021,
    0.5952396354208710, -0.3741244961234010e1, 0.3773459685750630, 0.9386858869551073,
    0.3667922227200571, -0.3474046353808490, 0.2344915448180937e1, -0.1947020434263292e1,
])  # fmt: skip
PLEIADES = Reference("Pleiades", pleiades, PLEIADES_U0, (0.0, 3.0), exact=lambda t: PLEIADES_AT_3)


# ---- DETEST nonstiff problems (Hull, Enright, Fellen & Sedgwick, SIAM J. Numer. Anal. 1972) --


def a1(u, p, t):
    return -u


def a2(u, p, t):
    return -0.5 * u**3


def a3(u, p, t):
    return u * np.cos(t)


def a4(u, p, t):
    return 0.25 * u * (1 - u / 20)


def a5(u, p, t):
    return (u - t) / (u + t)


def b1(u, p, t):
    y1, y2 = u
    return [2 * (y1 - y1 * y2), -(y2 - y1 * y2)]


def b2(u, p, t):
    y1, y2, y3 = u
    return [-y1 + y2, y1 - 2 * y2 + y3, y2 - y3]


def b3(u, p, t):
    y1, y2, _ = u
    return [-y1, y1 - y2**2, y2**2]


def b4(u, p, t):
    y1, y2, y3 = u
    r = (y1**2 + y2**2) ** 0.5
    return [-y2 - y1 * y3 / r, y1 - y2 * y3 / r, y1 / r]


def b5(u, p, t):
    y1, y2, y3 = u
    return [y2 * y3, -y1 * y3, -0.51 * y1 * y2]


def c1(u, p, t):
    # A 10-component linear chain: y1' = -y1, yi' = y(i-1) - yi, y10' = y9.
    xp = array_api_compat.array_namespace(u)
    return xp.concat([-u[:1], u[:-2] - u[1:-1], u[-2:-1]])


def _orbit(eps):
    def d(u, p, t):
        y1, y2, y3, y4 = u
        r3 = (y1**2 + y2**2) ** 1.5
        return [y3, y4, -y1 / r3, -y2 / r3]

    u0 = (1 - eps, 0.0, 0.0, math.sqrt((1 + eps) / (1 - eps)))
    return d, u0


def c2(u, p, t):
    # A 10-component chain with growing rates: y1' = -y1, yi' = (i-1) y(i-1) - i yi,
    # y10' = 9 y9.
    xp = array_api_compat.array_namespace(u)
    i = xp.reshape(xp.arange(2, 10, dtype=u.dtype), (8,) + (1,) * (u.ndim - 1))
    return xp.concat([-u[:1], (i - 1) * u[:-2] - i * u[1:-1], 9 * u[-2:-1]])


def e1(u, p, t):
    # Bessel's equation of order 1/2 in the variable t + 1.
    y1, y2 = u
    return [y2, -(y2 / (t + 1) + (1 - 0.25 / (t + 1) ** 2) * y1)]


def e4(u, p, t):
    _, y2 = u
    return [y2, 0.032 - 0.4 * y2**2]


def e2(u, p, t):
    # Van der Pol with mu = 1.
    y1, y2 = u
    return [y2, (1 - y1**2) * y2 - y1]


def e3(u, p, t):
    # Duffing-type forced oscillator.
    y1, y2 = u
    return [y2, y1**3 / 6 - y1 + 2 * np.sin(2.78535 * t)]


D1, D1_U0 = _orbit(0.1)
D3, D3_U0 = _orbit(0.5)
D5, D5_U0 = _orbit(0.9)

DETEST = [
    Reference("A1", a1, (1.0,), (0.0, 20.0)),
    Reference("A2", a2, (1.0,), (0.0, 20.0)),
    Reference("A3", a3, (1.0,), (0.0, 20.0)),
    Reference("A4", a4, (1.0,), (0.0, 20.0)),
    Reference("A5", a5, (4.0,), (0.0, 20.0)),
    Reference("B1", b1, (1.0, 3.0), (0.0, 20.0)),
    Reference("B2", b2, (2.0, 0.0, 1.0), (0.0, 20.0)),
    Reference("B3", b3, (1.0, 0.0, 0.0), (0.0, 20.0)),
    Reference("B4", b4, (3.0, 0.0, 0.0), (0.0, 20.0)),
    Reference("B5", b5, (0.0, 1.0, 1.0), (0.0, 20.0)),
    Reference("C1", c1, (1.0,) + (0.0,) * 9, (0.0, 20.0)),
    Reference("C2", c2, (1.0,) + (0.0,) * 9, (0.0, 20.0)),
    Reference("D1", D1, D1_U0, (0.0, 20.0)),
    Reference("D3", D3, D3_U0, (0.0, 20.0)),
    Reference("D5", D5, D5_U0, (0.0, 20.0)),
    Reference("E1", e1, (0.6713967071418030, 0.09540051444747446), (0.0, 20.0)),
    Reference("E2", e2, (2.0, 0.0), (0.0, 20.0)),
    Reference("E3", e3, (0.0, 0.0), (0.0, 20.0)),
    Reference("E4", e4, (30.0, 0.0), (0.0, 20.0)),
]


def scipy_reference(problem: Reference, times: np.ndarray) -> np.ndarray:
    """SciPy's DOP853 at rtol = atol = 1e-13: ``(len(times), n)``."""
    return _scipy(problem, times, "DOP853", 1e-13)


def scipy_rk45(problem: Reference, times: np.ndarray, tol: float) -> np.ndarray:
    """SciPy's RK45 (a peer of the same order) at rtol = atol = ``tol``."""
    return _scipy(problem, times, "RK45", tol)


def _scipy(problem: Reference, times: np.ndarray, method: str, tol: float) -> np.ndarray:
    integrate = pytest.importorskip(
        "scipy.integrate", reason="SciPy is not installed (extra 'test')"
    )

    def f(t, u):
        return np.asarray(problem.f(u, problem.p, t), dtype=float)

    sol = integrate.solve_ivp(
        f, problem.tspan, np.array(problem.u0), method=method, t_eval=times, rtol=tol, atol=tol
    )
    assert sol.success
    return sol.y.T


def lorenz(u, p, t):
    """The Lorenz system for a state ``(3,)`` or lanes ``(3, L)``."""
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def _lorenz_u_bar(u, p, v):
    x, y, z = u
    sigma, rho, beta = p
    vx, vy, vz = v
    return np.stack(
        [-sigma * vx + (rho - z) * vy + y * vz, sigma * vx - vy + x * vz, -x * vy - beta * vz]
    )


def lorenz_vjp(u, p, t, v):
    """Lorenz's VJP for a parameter tuple shared by all lanes (its cotangent summed)."""
    x, y, z = u
    vx, vy, vz = v
    p_bar = (np.sum((y - x) * vx), np.sum(x * vy), np.sum(-z * vz))
    return _lorenz_u_bar(u, p, v), p_bar


def lorenz_vjp_lanes(u, p, t, v):
    """Lorenz's VJP for per-lane parameters ``(3, L)`` (one cotangent per lane)."""
    x, y, z = u
    vx, vy, vz = v
    return _lorenz_u_bar(u, p, v), np.stack([(y - x) * vx, x * vy, -z * vz])


def lorenz_xp(u, p, t):
    """Lorenz for lanes-last states ``(3, L)`` and per-lane parameters ``(3, L)``, written
    with the arrays' own namespace (NumPy, array_api_strict, CuPy)."""
    xp = array_api_compat.array_namespace(u)
    x, y, z = u[0, ...], u[1, ...], u[2, ...]
    sigma, rho, beta = p[0, ...], p[1, ...], p[2, ...]
    return xp.stack([sigma * (y - x), x * (rho - z) - y, x * y - beta * z])


def lorenz_xp_vjp(u, p, t, v):
    """The VJP of ``lorenz_xp``: state and per-lane parameter cotangents."""
    xp = array_api_compat.array_namespace(u)
    x, y, z = u[0, ...], u[1, ...], u[2, ...]
    sigma, rho, beta = p[0, ...], p[1, ...], p[2, ...]
    vx, vy, vz = v[0, ...], v[1, ...], v[2, ...]
    u_bar = xp.stack(
        [-sigma * vx + (rho - z) * vy + y * vz, sigma * vx - vy + x * vz, -x * vy - beta * vz]
    )
    return u_bar, xp.stack([(y - x) * vx, x * vy, -z * vz])


def lorenz_xp_jac(u, p, t):
    """df/du of ``lorenz_xp`` as rows of entries, ``(3, 3, L)`` once stacked."""
    x, y, z = u[0, ...], u[1, ...], u[2, ...]
    sigma, rho, beta = p[0, ...], p[1, ...], p[2, ...]
    return [[-sigma, sigma, 0.0], [rho - z, -1.0, -x], [y, x, -beta]]


def lorenz_xp_paramjac(u, p, t):
    """df/dp of ``lorenz_xp`` for its per-lane parameters, ``(3, 3, L)`` once stacked."""
    x, y, z = u[0, ...], u[1, ...], u[2, ...]
    return [[y - x, 0.0, 0.0], [0.0, x, 0.0], [0.0, 0.0, -z]]
