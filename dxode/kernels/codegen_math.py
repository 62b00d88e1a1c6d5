"""Generated source for the controller's powers as branch-free arithmetic that vectorizes.

The PI controller's ``e ** a * prev ** b`` was two calls to libm's ``pow`` per lane and attempt:
half of a Lorenz kernel's time, and calls stop the vectorizer. Here the factor is computed as
``exp(a * log(e) + b * log(prev))`` (the logs of earlier errors kept), with ``log`` and ``exp``
written as plain arithmetic:

- ``log``: ``x = m 2**k`` (``split_exponent``), ``m`` brought into ``[sqrt(1/2), sqrt(2)]``,
  then ``2 atanh(s)``'s series in ``s = (m - 1) / (m + 1)``;
- ``exp``: ``n = round(y / ln 2)`` by the shifter trick, ``r = y - n ln 2`` (Cody–Waite), a
  Taylor polynomial, times ``2**n`` (``pow2``).

Polynomials are evaluated by Estrin's scheme (short dependency chains). ``split_exponent`` and
``pow2`` are generated as chains of exact multiplications by powers of two (for CUDA and the
simulator); the CPU compiler binds them to bit-level intrinsics (``float_bits``) with the same,
exact results. Every step is IEEE arithmetic without contraction, so the SIMD loop, its scalar
remainder, the CUDA kernel and numba-cuda's simulator give the same bits (results stay
independent of block size). Relative error is a few units in the last place, like NumPy's
vectorized ``power`` (which the array path uses and which differs from libm's by as much).

The exponent is clamped to ``[ln(factor_min / safety) - 1/2, ln(factor_max / safety) + 1/2]``:
beyond it the factor is clipped to ``factor_min`` or ``factor_max`` anyway, so the clamp changes
no result and bounds ``n``.
"""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from typing import Protocol

import numpy as np

__all__ = ["exponent_bounds", "write_exp", "write_helpers", "write_log"]

getcontext().prec = 60
_LN2 = Decimal("0.69314718055994530941723212145817656807550013436025525412068")


class _Writes(Protocol):
    def __call__(self, line: str = "") -> None: ...


def _lit(x: float) -> str:
    return f"DT({float(x)!r})"


def _ln2_split(dtype: str) -> tuple[float, float]:
    """``ln 2 = hi + lo`` with ``hi``'s last 12 bits zero: ``n * hi`` exact for ``|n| < 2**12``."""
    mantissa = np.finfo(dtype).nmant + 1
    scale = 2 ** (mantissa - 12)
    hi = math.floor(float(_LN2) * scale) / scale
    lo = float(np.dtype(dtype).type(float(_LN2 - Decimal(hi))))
    return hi, lo


def _chain_bits(span: int) -> list[int]:
    """Powers of two, largest first, whose greedy sums reach every integer in ``[0, span]``."""
    bits = [1]
    while 2 * bits[-1] - 1 < span:
        bits.append(2 * bits[-1])
    return bits[::-1]


def _scale(b: int, dtype: str) -> str:
    """``2**b`` as a product of literals that each stay in ``dtype``'s normal range."""
    limit = int(np.finfo(dtype).maxexp) // 2
    chunks = [limit] * (abs(b) // limit) + ([abs(b) % limit] if abs(b) % limit else [])
    sign = 1 if b >= 0 else -1
    return " * ".join(_lit(2.0 ** (sign * c)) for c in chunks) or _lit(1.0)


def exponent_range(bounds: tuple[float, float]) -> tuple[int, int]:
    """The integers ``n = round(y / ln 2)`` can take for ``y`` in ``bounds``, with a margin."""
    return math.floor(bounds[0] / math.log(2.0)) - 1, math.ceil(bounds[1] / math.log(2.0)) + 1


def write_helpers(w: _Writes, dtype: str, lowest: float, bounds: tuple[float, float]) -> None:
    """``split_exponent(x)`` for ``x`` in ``[lowest, max]`` and ``pow2(n)`` for ``n`` in
    ``exponent_range(bounds)``, as exact multiplication chains."""
    info = np.finfo(dtype)
    w("def split_exponent(x):")
    w('    """(m, k): x = m * 2**k, m in [1, 2) (exact steps)."""')
    w("    m = x")
    w("    k = DT(0.0)")
    for b in _chain_bits(int(info.maxexp) - 1):  # x >= 1 down to [1, 2), largest bit first
        w(f"    c = m >= {_scale(b, dtype)}")
        w(f"    m = m * {_scale(-b, dtype)} if c else m")
        w(f"    k = k + {_lit(b)} if c else k")
    for b in _chain_bits(-math.floor(math.log2(lowest))):  # x < 1 up to [1, 2)
        w(f"    c = m < {_scale(1 - b, dtype)}")
        w(f"    m = m * {_scale(b, dtype)} if c else m")
        w(f"    k = k - {_lit(b)} if c else k")
    w("    return m, k")
    w()
    nlo, nhi = exponent_range(bounds)
    w("def pow2(n):")
    w('    """2**n for integral n in the controller\'s range (exact steps)."""')
    w(f"    p = {_scale(nlo, dtype)}")
    w(f"    m = n - {_lit(nlo)}")
    for b in _chain_bits(nhi - nlo):
        w(f"    c = m >= {_lit(b)}")
        w(f"    p = p * {_scale(b, dtype)} if c else p")
        w(f"    m = m - {_lit(b)} if c else m")
    w("    return p")
    w()


def _estrin(w: _Writes, out: str, coefficients: list[float], x: str) -> None:
    """``out = sum(c_i x**i)`` by Estrin's scheme (pairs, then pairs of pairs, ...)."""
    terms = [_lit(c) for c in coefficients]
    power = x
    level = 0
    while len(terms) > 1:
        pairs = []
        for i in range(0, len(terms), 2):
            if i + 1 < len(terms):
                name = f"{out}_{level}_{i // 2}"
                w(f"{name} = {terms[i]} + ({terms[i + 1]}) * {power}")
                pairs.append(name)
            else:
                pairs.append(terms[i])
        terms = pairs
        if len(terms) > 1:
            w(f"{out}_x{level + 1} = {power} * {power}")
            power = f"{out}_x{level + 1}"
        level += 1
    w(f"{out} = {terms[0]}")


def write_log(w: _Writes, x: str, out: str, dtype: str) -> None:
    """Lines setting ``out = log(x)`` for ``x`` in ``split_exponent``'s range."""
    hi, lo = _ln2_split(dtype)
    w(f"lm0, lk0 = split_exponent({x})")
    w(f"c = lm0 > {_lit(math.sqrt(2.0))}")
    w(f"lx = select(c, lm0 * {_lit(0.5)}, lm0)")
    w(f"lk = select(c, lk0 + {_lit(1.0)}, lk0)")
    # log m = 2 atanh(s) = 2 s + s z (2/3 + 2 z/5 + ...), z = s*s <= 0.0295
    terms = 11 if np.finfo(dtype).nmant > 30 else 5
    w(f"s = (lx - {_lit(1.0)}) / (lx + {_lit(1.0)})")
    w("z = s * s")
    _estrin(w, "ls", [2.0 / (2 * k + 1) for k in range(1, terms + 1)], "z")
    w(f"lm = {_lit(2.0)} * s + s * z * ls")
    w(f"{out} = lk * {_lit(hi)} + (lm + lk * {_lit(lo)})")


def exponent_bounds(
    safety: float, factor_min: float, factor_max: float, dtype: str
) -> tuple[float, float]:
    """The clamp ``[ylo, yhi]`` of the factor's exponent (see the module docstring)."""
    info = np.finfo(dtype)
    floor = math.log(float(info.smallest_normal)) + 2.0
    ceiling = math.log(float(info.max)) - 2.0
    ylo = max(math.log(factor_min / safety) - 0.5, floor)
    yhi = min(math.log(factor_max / safety) + 0.5, ceiling)
    return ylo, yhi


def write_exp(w: _Writes, y: str, out: str, dtype: str, bounds: tuple[float, float]) -> None:
    """Lines setting ``out = exp(y)`` for ``y`` clamped to ``bounds`` (``y`` finite)."""
    info = np.finfo(dtype)
    hi, lo = _ln2_split(dtype)
    shifter = 1.5 * 2.0**info.nmant
    w(f"ey = minimum(maximum({y}, {_lit(bounds[0])}), {_lit(bounds[1])})")
    w(f"en = (ey * {_lit(1.0 / math.log(2.0))} + {_lit(shifter)}) - {_lit(shifter)}")
    w(f"r = (ey - en * {_lit(hi)}) - en * {_lit(lo)}")
    degree = 13 if info.nmant > 30 else 7
    _estrin(w, "ep", [1.0 / math.factorial(k) for k in range(degree + 1)], "r")
    w(f"{out} = ep * pow2(en)")
