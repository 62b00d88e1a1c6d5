"""The CPU kernels' exponent helpers as bit operations (numba intrinsics; imports numba).

The generated source defines ``split_exponent`` and ``pow2`` as chains of exact
multiplications by powers of two (what CUDA and numba-cuda's simulator run); on the CPU the
compiler binds these names to the intrinsics here instead, which read and write the exponent
field directly: the same results, exactly, in a few integer instructions that vectorize.
Both take and return floats of one width (float32 or float64), for normal numbers only.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["pow2", "split_exponent"]

_I32 = ir.IntType(32)


def _format(x: Any) -> tuple[ir.Type, ir.IntType, int, int]:
    """LLVM float type, same-width integer type, mantissa bits and exponent bias of ``x``."""
    if x.bitwidth == 64:
        return ir.DoubleType(), ir.IntType(64), 52, 1023
    return ir.FloatType(), ir.IntType(32), 23, 127


@intrinsic
def split_exponent(typingctx: Any, x: Any) -> Any:
    """``(m, k)`` with ``x = m * 2**k``, ``m`` in ``[1, 2)``, ``k`` integral, for normal
    ``x > 0``."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        flt, integer, nmant, bias = _format(x)
        bits = builder.bitcast(args[0], integer)
        k = builder.sub(builder.lshr(bits, integer(nmant)), integer(bias))
        mantissa = builder.and_(bits, integer((1 << nmant) - 1))
        m = builder.bitcast(builder.or_(mantissa, integer(bias << nmant)), flt)
        # through 32-bit integers: AVX2 converts those to floats in SIMD, 64-bit ones not
        kf = builder.sitofp(builder.trunc(k, _I32) if integer.width > 32 else k, flt)
        return context.make_tuple(builder, signature.return_type, [m, kf])

    return types.UniTuple(x, 2)(x), codegen


@intrinsic
def pow2(typingctx: Any, n: Any) -> Any:
    """``2**n`` for integral ``n`` in the normal range (``n`` a float)."""
    if not isinstance(n, types.Float):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        flt, integer, nmant, bias = _format(n)
        k = builder.fptosi(args[0], _I32)  # 32-bit: a SIMD conversion on AVX2 too
        if integer.width > 32:
            k = builder.sext(k, integer)
        bits = builder.shl(builder.add(k, integer(bias)), integer(nmant))
        return builder.bitcast(bits, flt)

    return n(n), codegen
