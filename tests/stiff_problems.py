"""Stiff problems of the Bari "Test Set for IVP Solvers", with their published reference solutions.

F. Mazzia, F. Iavernaro, C. Magherini et al., *Test Set for IVP Solvers*, release 2.4, University
of Bari (http://www.dm.uniba.it/~testset/). Each problem's Fortran file there (``src/problems/
<name>.f``, revision dates 2006) gives the right-hand side (``feval``), the analytic Jacobian
(``jeval``), the initial values (``init``), the interval (``prob``) and the reference solution at
the end point (``solut``). The digits below were transcribed from public copies of those files:

- HIRES, POLLU, VDPOL: GitHub ``volpatto/pside``, ``problems/HIRES/hires.f``,
  ``problems/Pollution/pollu.f``, ``problems/VdPol/vdpol.f`` (commit f00d105);
- ROBER, OREGO, E5: copies of ``rober.f`` (rev. 1.2), ``orego.f`` (rev. 1.4) and ``e5.f``
  (rev. 1.3) carrying D. R. Reynolds' 2013 note "all other routines remain untouched"; the same
  end values are in the R port of the test set, deTestSet (Soetaert, Cash & Mazzia), GitHub
  ``rforge/bvpsolve``, ``pkg/deTestSet/R/ex_reference.R``.

The tolerances are deTestSet's defaults for each problem (``pkg/deTestSet/R/ex_<name>.R``), the
R port's choice of the test set's settings.

Every ``f(u, p, t)`` and ``jac(u, p, t)`` indexes rows of ``u`` only, so the same function serves
one trajectory (``u`` of shape ``(n,)``; ``jac`` returns ``(n, n)``) and a batch of lanes (``u``
of shape ``(n, L)``; ``jac`` returns ``(n, n, L)``), with any array-API namespace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

Array = Any


@dataclass(frozen=True)
class StiffProblem:
    """One test-set problem: ``u' = f(u, p, t)``, ``u(t0) = u0``, reference ``u(t1)``.

    ``abs_components`` lists components whose reference is zero or below the floating-point
    range of any useful relative error (E5's ``y1 ~ 1e-291`` and ``y4 = 0``); the scd counts
    their absolute error instead, as the test set's IVPTestSuite port does (``scd_absinds``).
    """

    name: str
    f: Callable[..., Array]
    jac: Callable[..., Array]
    u0: tuple[float, ...]
    tspan: tuple[float, float]
    reference: tuple[float, ...]
    rtol: float
    atol: float
    p: Any = None
    abs_components: tuple[int, ...] = ()


def scd(u: Sequence[float], problem: StiffProblem) -> float:
    """Significant correct digits, ``-log10`` of the largest relative error at ``t1``.

    The test set's measure: ``scd = -log10(max_i |u_i - ref_i| / |ref_i|)``; the components in
    ``problem.abs_components`` contribute their absolute error. ``inf`` when exact.
    """
    u = np.asarray(u, dtype=np.float64)
    ref = np.asarray(problem.reference, dtype=np.float64)
    err = np.abs(u - ref)
    scale = np.array([1.0 if i in problem.abs_components else abs(r) for i, r in enumerate(ref)])
    rel = err / scale
    worst = float(np.max(rel))
    return math.inf if worst == 0.0 else -math.log10(worst)


# ---- stacking rows that mix constants and lane rows ------------------------------------------


def _rows(u: Array, rows: Sequence[Any]) -> Array:
    """Rows (arrays of a row's shape, or Python numbers) stacked: ``(len(rows), ...)``."""
    xp = array_api_compat.array_namespace(u)
    shape = tuple(u.shape[1:])
    return xp.stack([xp.broadcast_to(xp.asarray(r, dtype=u.dtype), shape) for r in rows])


def _matrix(u: Array, entries: dict[tuple[int, int], Any]) -> Array:
    """The ``(n, n, ...)`` Jacobian with the given nonzero ``(row, column)`` entries (0-based)."""
    xp = array_api_compat.array_namespace(u)
    n = u.shape[0]
    return xp.stack([_rows(u, [entries.get((i, j), 0.0) for j in range(n)]) for i in range(n)])


# ---- ROBER (Robertson's chemical reaction) ---------------------------------------------------

ROBER_K = (0.04, 3e7, 1e4)  # k1, k2, k3


def rober(u, p, t):
    y1, y2, y3 = u[0, ...], u[1, ...], u[2, ...]
    k1, k2, k3 = ROBER_K if p is None else p
    return _rows(
        u,
        [
            -k1 * y1 + k3 * y2 * y3,
            k1 * y1 - k3 * y2 * y3 - k2 * y2 * y2,
            k2 * y2 * y2,
        ],
    )


def rober_jac(u, p, t):
    y2, y3 = u[1, ...], u[2, ...]
    k1, k2, k3 = ROBER_K if p is None else p
    return _matrix(
        u,
        {
            (0, 0): -k1,
            (0, 1): k3 * y3,
            (0, 2): k3 * y2,
            (1, 0): k1,
            (1, 1): -k3 * y3 - 2.0 * k2 * y2,
            (1, 2): -k3 * y2,
            (2, 1): 2.0 * k2 * y2,
        },
    )


ROBER = StiffProblem(
    "rober",
    rober,
    rober_jac,
    (1.0, 0.0, 0.0),
    (0.0, 1e11),
    (0.2083340149701255e-07, 0.8333360770334713e-13, 0.9999999791665050e00),
    rtol=1e-10,
    atol=1e-14,
)


# ---- HIRES (plant physiology: high irradiance responses) -------------------------------------


def hires(u, p, t):
    y1, y2, y3, y4, y5, y6, y7, y8 = (u[i, ...] for i in range(8))
    r7 = 280.0 * y6 * y8 - 1.81 * y7
    return _rows(
        u,
        [
            -1.71 * y1 + 0.43 * y2 + 8.32 * y3 + 0.0007,
            1.71 * y1 - 8.75 * y2,
            -10.03 * y3 + 0.43 * y4 + 0.035 * y5,
            8.32 * y2 + 1.71 * y3 - 1.12 * y4,
            -1.745 * y5 + 0.43 * (y6 + y7),
            -280.0 * y6 * y8 + 0.69 * y4 + 1.71 * y5 - 0.43 * y6 + 0.69 * y7,
            r7,
            -r7,
        ],
    )


def hires_jac(u, p, t):
    y6, y8 = u[5, ...], u[7, ...]
    return _matrix(
        u,
        {
            (0, 0): -1.71,
            (0, 1): 0.43,
            (0, 2): 8.32,
            (1, 0): 1.71,
            (1, 1): -8.75,
            (2, 2): -10.03,
            (2, 3): 0.43,
            (2, 4): 0.035,
            (3, 1): 8.32,
            (3, 2): 1.71,
            (3, 3): -1.12,
            (4, 4): -1.745,
            (4, 5): 0.43,
            (4, 6): 0.43,
            (5, 3): 0.69,
            (5, 4): 1.71,
            (5, 5): -280.0 * y8 - 0.43,
            (5, 6): 0.69,
            (5, 7): -280.0 * y6,
            (6, 5): 280.0 * y8,
            (6, 6): -1.81,
            (6, 7): 280.0 * y6,
            (7, 5): -280.0 * y8,
            (7, 6): 1.81,
            (7, 7): -280.0 * y6,
        },
    )


HIRES = StiffProblem(
    "hires",
    hires,
    hires_jac,
    (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0057),
    (0.0, 321.8122),
    (
        0.7371312573325668e-3,
        0.1442485726316185e-3,
        0.5888729740967575e-4,
        0.1175651343283149e-2,
        0.2386356198831331e-2,
        0.6238968252742796e-2,
        0.2849998395185769e-2,
        0.2850001604814231e-2,
    ),
    rtol=1e-6,
    atol=1e-6,
)


# ---- VDPOL (van der Pol, the test set's scaled form, epsilon = 1e-6) --------------------------

VDPOL_EPS = 1e-6


def vdpol(u, p, t):
    y1, y2 = u[0, ...], u[1, ...]
    return _rows(u, [y2, ((1.0 - y1 * y1) * y2 - y1) / VDPOL_EPS])


def vdpol_jac(u, p, t):
    y1, y2 = u[0, ...], u[1, ...]
    return _matrix(
        u,
        {
            (0, 1): 1.0,
            (1, 0): (-2.0 * y1 * y2 - 1.0) / VDPOL_EPS,
            (1, 1): (1.0 - y1 * y1) / VDPOL_EPS,
        },
    )


VDPOL = StiffProblem(
    "vdpol",
    vdpol,
    vdpol_jac,
    (2.0, 0.0),
    (0.0, 2.0),
    (0.1706167732170483e01, -0.8928097010247975e00),
    rtol=1e-6,
    atol=1e-6,
)


# ---- OREGO (Oregonator, Belousov-Zhabotinskii reaction) --------------------------------------


def orego(u, p, t):
    y1, y2, y3 = u[0, ...], u[1, ...], u[2, ...]
    return _rows(
        u,
        [
            77.27 * (y2 + y1 * (1.0 - 8.375e-6 * y1 - y2)),
            (y3 - (1.0 + y1) * y2) / 77.27,
            0.161 * (y1 - y3),
        ],
    )


def orego_jac(u, p, t):
    y1, y2 = u[0, ...], u[1, ...]
    return _matrix(
        u,
        {
            (0, 0): 77.27 * (1.0 - 2.0 * 8.375e-6 * y1 - y2),
            (0, 1): 77.27 * (1.0 - y1),
            (1, 0): -y2 / 77.27,
            (1, 1): -(1.0 + y1) / 77.27,
            (1, 2): 1.0 / 77.27,
            (2, 0): 0.161,
            (2, 2): -0.161,
        },
    )


OREGO = StiffProblem(
    "orego",
    orego,
    orego_jac,
    (1.0, 2.0, 3.0),
    (0.0, 360.0),
    (0.1000814870318523e01, 0.1228178521549917e04, 0.1320554942846706e03),
    rtol=1e-6,
    atol=1e-6,
)


# ---- E5 (chemical pyrolysis, from the stiff DETEST set) --------------------------------------

E5_A, E5_B, E5_CM, E5_C = 7.89e-10, 1.1e7, 1.13e9, 1.13e3


def e5(u, p, t):
    y1, y2, y3, y4 = u[0, ...], u[1, ...], u[2, ...], u[3, ...]
    prod1 = E5_A * y1
    prod2 = E5_B * y1 * y3
    prod3 = E5_CM * y2 * y3
    prod4 = E5_C * y4
    f2 = prod1 - prod3
    f4 = prod2 - prod4
    return _rows(u, [-prod1 - prod2, f2, f2 - f4, f4])


def e5_jac(u, p, t):
    y1, y2, y3 = u[0, ...], u[1, ...], u[2, ...]
    return _matrix(
        u,
        {
            (0, 0): -E5_A - E5_B * y3,
            (0, 2): -E5_B * y1,
            (1, 0): E5_A,
            (1, 1): -E5_CM * y3,
            (1, 2): -E5_CM * y2,
            (2, 0): E5_A - E5_B * y3,
            (2, 1): -E5_CM * y3,
            (2, 2): -E5_B * y1 - E5_CM * y2,
            (2, 3): E5_C,
            (3, 0): E5_B * y3,
            (3, 2): E5_B * y1,
            (3, 3): -E5_C,
        },
    )


E5 = StiffProblem(
    "e5",
    e5,
    e5_jac,
    (1.76e-3, 0.0, 0.0, 0.0),
    (0.0, 1e13),
    (0.1152903278711829e-290, 0.8867655517642120e-22, 0.8854814626268838e-22, 0.0),
    rtol=1e-6,
    atol=1.11e-24,
    abs_components=(0, 3),
)


# ---- POLLU (air pollution model of the Dutch RIVM: 20 species, 25 reactions) -----------------

POLLU_K = (
    0.35, 0.266e2, 0.123e5, 0.86e-3, 0.82e-3, 0.15e5, 0.13e-3, 0.24e5, 0.165e5, 0.9e4,
    0.22e-1, 0.12e5, 0.188e1, 0.163e5, 0.48e7, 0.35e-3, 0.175e-1, 0.1e9, 0.444e12, 0.124e4,
    0.21e1, 0.578e1, 0.474e-1, 0.178e4, 0.312e1,
)  # fmt: skip


def _pollu_rates(u):
    y = [u[i, ...] for i in range(20)]
    k = POLLU_K
    # The 25 reaction rates r1..r25 (0-based here), as in the test set's feval.
    return [
        k[0] * y[0], k[1] * y[1] * y[3], k[2] * y[4] * y[1], k[3] * y[6], k[4] * y[6],
        k[5] * y[6] * y[5], k[6] * y[8], k[7] * y[8] * y[5], k[8] * y[10] * y[1],
        k[9] * y[10] * y[0], k[10] * y[12], k[11] * y[9] * y[1], k[12] * y[13],
        k[13] * y[0] * y[5], k[14] * y[2], k[15] * y[3], k[16] * y[3], k[17] * y[15],
        k[18] * y[15], k[19] * y[16] * y[5], k[20] * y[18], k[21] * y[18],
        k[22] * y[0] * y[3], k[23] * y[18] * y[0], k[24] * y[19],
    ]  # fmt: skip


def pollu(u, p, t):
    r = [None, *_pollu_rates(u)]  # 1-based, as in the test set's description
    return _rows(
        u,
        [
            -r[1]
            - r[10]
            - r[14]
            - r[23]
            - r[24]
            + r[2]
            + r[3]
            + r[9]
            + r[11]
            + r[12]
            + r[22]
            + r[25],
            -r[2] - r[3] - r[9] - r[12] + r[1] + r[21],
            -r[15] + r[1] + r[17] + r[19] + r[22],
            -r[2] - r[16] - r[17] - r[23] + r[15],
            -r[3] + r[4] + r[4] + r[6] + r[7] + r[13] + r[20],
            -r[6] - r[8] - r[14] - r[20] + r[3] + r[18] + r[18],
            -r[4] - r[5] - r[6] + r[13],
            r[4] + r[5] + r[6] + r[7],
            -r[7] - r[8],
            -r[12] + r[7] + r[9],
            -r[9] - r[10] + r[8] + r[11],
            r[9],
            -r[11] + r[10],
            -r[13] + r[12],
            r[14],
            -r[18] - r[19] + r[16],
            -r[20],
            r[20],
            -r[21] - r[22] - r[24] + r[23] + r[25],
            -r[25] + r[24],
        ],
    )


def pollu_jac(u, p, t):
    y = [None, *(u[i, ...] for i in range(20))]  # 1-based
    k = [None, *POLLU_K]
    entries_1based = {
        (1, 1): -k[1] - k[10] * y[11] - k[14] * y[6] - k[23] * y[4] - k[24] * y[19],
        (1, 11): -k[10] * y[1] + k[9] * y[2],
        (1, 6): -k[14] * y[1],
        (1, 4): -k[23] * y[1] + k[2] * y[2],
        (1, 19): -k[24] * y[1] + k[22],
        (1, 2): k[2] * y[4] + k[9] * y[11] + k[3] * y[5] + k[12] * y[10],
        (1, 13): k[11],
        (1, 20): k[25],
        (1, 5): k[3] * y[2],
        (1, 10): k[12] * y[2],
        (2, 4): -k[2] * y[2],
        (2, 5): -k[3] * y[2],
        (2, 11): -k[9] * y[2],
        (2, 10): -k[12] * y[2],
        (2, 19): k[21],
        (2, 1): k[1],
        (2, 2): -k[2] * y[4] - k[3] * y[5] - k[9] * y[11] - k[12] * y[10],
        (3, 1): k[1],
        (3, 4): k[17],
        (3, 16): k[19],
        (3, 19): k[22],
        (3, 3): -k[15],
        (4, 4): -k[2] * y[2] - k[16] - k[17] - k[23] * y[1],
        (4, 2): -k[2] * y[4],
        (4, 1): -k[23] * y[4],
        (4, 3): k[15],
        (5, 5): -k[3] * y[2],
        (5, 2): -k[3] * y[5],
        (5, 7): 2.0 * k[4] + k[6] * y[6],
        (5, 6): k[6] * y[7] + k[20] * y[17],
        (5, 9): k[7],
        (5, 14): k[13],
        (5, 17): k[20] * y[6],
        (6, 6): -k[6] * y[7] - k[8] * y[9] - k[14] * y[1] - k[20] * y[17],
        (6, 7): -k[6] * y[6],
        (6, 9): -k[8] * y[6],
        (6, 1): -k[14] * y[6],
        (6, 17): -k[20] * y[6],
        (6, 2): k[3] * y[5],
        (6, 5): k[3] * y[2],
        (6, 16): 2.0 * k[18],
        (7, 7): -k[4] - k[5] - k[6] * y[6],
        (7, 6): -k[6] * y[7],
        (7, 14): k[13],
        (8, 7): k[4] + k[5] + k[6] * y[6],
        (8, 6): k[6] * y[7],
        (8, 9): k[7],
        (9, 9): -k[7] - k[8] * y[6],
        (9, 6): -k[8] * y[9],
        (10, 10): -k[12] * y[2],
        (10, 2): -k[12] * y[10] + k[9] * y[11],
        (10, 9): k[7],
        (10, 11): k[9] * y[2],
        (11, 11): -k[9] * y[2] - k[10] * y[1],
        (11, 2): -k[9] * y[11],
        (11, 1): -k[10] * y[11],
        (11, 9): k[8] * y[6],
        (11, 6): k[8] * y[9],
        (11, 13): k[11],
        (12, 11): k[9] * y[2],
        (12, 2): k[9] * y[11],
        (13, 13): -k[11],
        (13, 11): k[10] * y[1],
        (13, 1): k[10] * y[11],
        (14, 14): -k[13],
        (14, 10): k[12] * y[2],
        (14, 2): k[12] * y[10],
        (15, 1): k[14] * y[6],
        (15, 6): k[14] * y[1],
        (16, 16): -k[18] - k[19],
        (16, 4): k[16],
        (17, 17): -k[20] * y[6],
        (17, 6): -k[20] * y[17],
        (18, 17): k[20] * y[6],
        (18, 6): k[20] * y[17],
        (19, 19): -k[21] - k[22] - k[24] * y[1],
        (19, 1): -k[24] * y[19] + k[23] * y[4],
        (19, 4): k[23] * y[1],
        (19, 20): k[25],
        (20, 20): -k[25],
        (20, 1): k[24] * y[19],
        (20, 19): k[24] * y[1],
    }
    return _matrix(u, {(i - 1, j - 1): v for (i, j), v in entries_1based.items()})


_POLLU_U0 = [0.0] * 20
for _i, _v in ((2, 0.2), (4, 0.04), (7, 0.1), (8, 0.3), (9, 0.01), (17, 0.007)):
    _POLLU_U0[_i - 1] = _v

POLLU = StiffProblem(
    "pollu",
    pollu,
    pollu_jac,
    tuple(_POLLU_U0),
    (0.0, 60.0),
    (
        0.5646255480022769e-01,
        0.1342484130422339e00,
        0.4139734331099427e-08,
        0.5523140207484359e-02,
        0.2018977262302196e-06,
        0.1464541863493966e-06,
        0.7784249118997964e-01,
        0.3245075353396018e00,
        0.7494013383880406e-02,
        0.1622293157301561e-07,
        0.1135863833257075e-07,
        0.2230505975721359e-02,
        0.2087162882798630e-03,
        0.1396921016840158e-04,
        0.8964884856898295e-02,
        0.4352846369330103e-17,
        0.6899219696263405e-02,
        0.1007803037365946e-03,
        0.1772146513969984e-05,
        0.5682943292316392e-04,
    ),
    rtol=1e-6,
    atol=1e-6,
)

PROBLEMS = (ROBER, HIRES, VDPOL, OREGO, E5, POLLU)
