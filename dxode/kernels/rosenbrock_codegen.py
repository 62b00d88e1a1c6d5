"""Generate the per-lane integration of a Rosenbrock method (or TRBDF2), from a
``RosenbrockDescription``.

The block function, its drivers, the step-size control, the lane starts, the return codes and
the statistics are ``codegen``'s (its helpers are reused, with this method's workspace laid
out as theirs: ``desc.stages`` rows of per-step data, then ``u1``, the error, the end time).
What differs is the attempt and the dense output:

``attempt(T, HS, PB, U, F, W, TG, HIT, RTOL, ATOL, nlive, ACT, NFX)``
    For each active lane of the block in turn: ``f`` at the step's start, the Jacobian (the
    user's ``jac``, or forward differences of ``f`` as ``dxode._jacobian`` takes them),
    ``df/dt`` (the user's ``tgrad``, or a forward difference), the shifted matrix
    ``W = I/(h gamma) - J`` (Rosenbrock23, TRBDF2: ``I - d h J``) factored by ``lu_factor``
    (Gaussian elimination with partial pivoting, in a lane-local ``(n, n)`` array), then the
    stages (TRBDF2: two simplified Newton iterations, their RHS evaluations added to
    ``NFX``), the solution, its error norm and the dense-output rows into the workspace
    ``W``. Lanes are not vectorized across (pivoting branches on lane data); an inactive
    lane costs nothing.
``lu_factor(A, PIV)`` / ``lu_solve(A, PIV, X)``
    One lane's factorization in place, and a solve in place.

A kernel that switches method per lane (an automatic stiffness switch) can call codegen's
explicit attempt and this one on the same workspace layout: both write ``u1``, the error and
the end time to the same rows, so the controller and the lane bookkeeping stay shared.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from .codegen import (
    _ERROR_FLOOR,
    _MAXITERS,
    CODEGEN_VERSION,
    KernelLayout,
    _alloc,
    _const,
    _exponent_bounds,
    _w,
    _write_block_setup,
    _write_control,
    _write_cpu_driver,
    _write_cuda_driver,
    _write_factor,
    _write_lane_starts,
    _write_minmax,
    _write_outcome,
    _write_record,
    _write_retire,
    _write_rhs,
    _write_step_sizes,
    _Writer,
)
from .codegen_math import write_helpers
from .rosenbrock_description import RosenbrockDescription

__all__ = ["CALLED", "HELPERS", "generate"]

# Generated helper functions compiled inline into ``attempt`` and ``block``, and those
# compiled once and called (inlining the LU's loops at every solve made compiling slow).
HELPERS = ("maximum", "minimum", "rhs", "split_exponent", "pow2")
CALLED = ("lu_factor", "lu_solve")


def generate(desc: RosenbrockDescription, layout: KernelLayout) -> str:
    """The module source for ``desc`` under ``layout`` (deterministic: a cache key)."""
    w = _Writer()
    write_module_head(w, desc, layout, HELPERS, CALLED)
    _write_attempt_function(w, desc, layout)
    _write_block(w, desc, layout)
    if layout.target == "cuda":
        _write_cuda_driver(w, layout)
    else:
        _write_cpu_driver(w, layout)
    return w.text()


def write_module_head(
    w: _Writer, desc: Any, layout: KernelLayout, helpers: tuple[str, ...], called: tuple[str, ...]
) -> None:
    """A stiff kernel module's docstring, imports, the user functions' slots (``f``, ``jac``,
    ``tgrad``), its ``HELPERS``/``CALLED`` lists, and the helpers, ``rhs`` and the LU."""
    w(
        f'"""dxode kernel: {desc.name}, n={layout.n}, {layout.dtype}, target {layout.target}, '
        f'jac {desc.jac}, tgrad {desc.tgrad} (generated; codegen {CODEGEN_VERSION})."""'
    )
    w("import math")
    w("import numpy as np")
    if layout.target == "cuda":
        w("from numba import cuda")
        w(f"from numba import {layout.dtype} as DTN")
        w(f"from numba import {layout.param_dtype} as PDTN")
    else:
        w("from numba import prange")
    w(f"DT = np.{layout.dtype}")
    w("user_f = None  # bound to the compiled user functions before compiling")
    w("user_jac = None")
    w("user_tgrad = None")
    w(f"HELPERS = {helpers!r}")
    w(f"CALLED = {called!r}")
    w()
    _write_minmax(w)
    write_helpers(w, layout.dtype, _ERROR_FLOOR, _exponent_bounds(layout))
    _write_rhs(w, layout)
    _write_lu(w, layout.n)


def _write_lu(w: _Writer, n: int) -> None:
    """``lu_factor``/``lu_solve``: partial pivoting, the first largest pivot (as ``_lu``)."""
    w("def lu_factor(A, PIV):")
    w(f"    for k in range({n}):")
    w("        piv = k")
    w("        big = abs(A[k, k])")
    w(f"        for i in range(k + 1, {n}):")
    w("            if abs(A[i, k]) > big:")
    w("                big = abs(A[i, k])")
    w("                piv = i")
    w("        PIV[k] = piv")
    w("        if piv != k:")
    w(f"            for c in range({n}):")
    w("                x = A[k, c]")
    w("                A[k, c] = A[piv, c]")
    w("                A[piv, c] = x")
    w("        pivot = A[k, k]")
    w(f"        for i in range(k + 1, {n}):")
    w("            mult = A[i, k] / pivot")
    w("            A[i, k] = mult")
    w(f"            for c in range(k + 1, {n}):")
    w("                A[i, c] = A[i, c] - mult * A[k, c]")
    w()
    w("def lu_solve(A, PIV, X):")
    w(f"    for k in range({n - 1}):")
    w("        piv = PIV[k]")
    w("        x = X[k]")
    w("        X[k] = X[piv]")
    w("        X[piv] = x")
    w(f"    for k in range({n - 1}):")
    w(f"        for i in range(k + 1, {n}):")
    w("            X[i] = X[i] - A[i, k] * X[k]")
    w(f"    for k in range({n - 1}, -1, -1):")
    w("        X[k] = X[k] / A[k, k]")
    w("        for i in range(k):")
    w("            X[i] = X[i] - A[i, k] * X[k]")
    w()


def _row(layout: KernelLayout, desc: RosenbrockDescription, what: str, i: int = 0) -> str:
    """Lane ``j``'s entry ``m`` of workspace row group ``what`` (``m`` a loop variable), at
    ``codegen``'s offsets."""
    entry = _w(layout, desc, what, i, 0)  # type: ignore[arg-type]
    match = re.fullmatch(r"W\[(\d+) \+ j\]", entry)
    assert match is not None, entry
    return f"W[{match.group(1)} + m * {layout.block} + j]"


def _lincomb(weights: tuple[float, ...], terms: list[str]) -> str | None:
    """``sum_j w_j * t_j`` in order, zero weights skipped (``stiff.linear_combination``)."""
    total = None
    for weight, term in zip(weights, terms, strict=False):
        if weight == 0.0:
            continue
        product = term if weight == 1.0 else f"{_const(weight)} * {term}"
        total = product if total is None else f"({total} + {product})"
    return total


def _call_rhs(w: _Writer, n: int, args: str, t: str, into: str) -> None:
    """``into[m] = f(args, p, t)[m]`` for every ``m`` (``args``: a template with ``{m}``)."""
    w(f"r = rhs({', '.join(args.format(m=m) for m in range(n))}, p, {t})")
    for m in range(n):
        w(f"{into}[{m}] = r[{m}]")


def _user_u(desc_source: str, n: int) -> str:
    """``u`` as the user's ``jac``/``tgrad`` takes it (a tuple, or the lane's array ``UL``)."""
    if desc_source == "array":
        return "UL"
    return "(" + "".join(f"UL[{m}], " for m in range(n)) + ")"


def _write_derivatives(w: _Writer, desc: RosenbrockDescription, n: int, dtype: str) -> None:
    """``JM = J`` and ``DF = df/dt`` at ``(UL, t)``, ``F0 = f(UL, t)`` already known."""
    root_eps = _const(math.sqrt(float(np.finfo(dtype).eps)))
    if desc.jac == "finite_difference":
        w(f"for c in range({n}):")
        w.indent()
        w(f"for m in range({n}):")
        w("    Y[m] = UL[m]")
        w(f"Y[c] = UL[c] + {root_eps} * maximum(abs(UL[c]), DT(1.0))")
        w("dj = Y[c] - UL[c]")
        w(f"r = rhs({', '.join(f'Y[{m}]' for m in range(n))}, p, t)")
        for m in range(n):
            w(f"JM[{m}, c] = (r[{m}] - F0[{m}]) / dj")
        w.dedent()
    else:
        w(f"rj = user_jac({_user_u(desc.jac, n)}, p, t)")
        for i in range(n):
            for m in range(n):
                w(f"JM[{i}, {m}] = DT(rj[{i}][{m}])")
    if not desc.needs_tgrad:
        return
    if desc.tgrad == "finite_difference":
        w(f"t_step = t + {root_eps} * maximum(abs(t), DT(1.0))")
        w("dt = t_step - t")
        w(f"r = rhs({', '.join(f'UL[{m}]' for m in range(n))}, p, t_step)")
        for m in range(n):
            w(f"DF[{m}] = (r[{m}] - F0[{m}]) / dt")
    else:
        w(f"rt = user_tgrad({_user_u(desc.tgrad, n)}, p, t)")
        for m in range(n):
            w(f"DF[{m}] = DT(rt[{m}])")


def _write_shift_and_factor(w: _Writer, n: int, diagonal: str, scale: str | None) -> None:
    """``JM <- diagonal * I - scale * JM`` (``stiff.shifted_jacobian``), then factor it."""
    w(f"diag = {diagonal}")
    w(f"for i in range({n}):")
    w(f"    for m in range({n}):")
    w(f"        JM[i, m] = -({scale} * JM[i, m])" if scale else "        JM[i, m] = -JM[i, m]")
    w("    JM[i, i] = diag + JM[i, i]")
    w("lu_factor(JM, PIV)")


def _write_attempt_function(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """``attempt``: one trial step of each active lane of a block (see the module docstring)."""
    n, S = layout.n, desc.method_stages
    w("def attempt(T, HS, PB, U, F, W, TG, HIT, RTOL, ATOL, nlive, ACT, NFX):")
    w.indent()
    for name in ("UL", "F0", "Y", "G", "DF", "V", "F1"):
        w(f"{name} = {_alloc(layout, str(n))}")
    w(f"K = {_alloc(layout, f'({S}, {n})')}")
    w(f"JM = {_alloc(layout, f'({n}, {n})')}")
    w(f"PIV = {_alloc(layout, str(n), 'int')}")
    w("for j in range(nlive):")
    w.indent()
    w("if ACT[j] == 0:")
    w("    continue")
    w("t = T[j]")
    w("hs = HS[j]")
    w(f"p = {layout.params.replace('P[', 'PB[').replace('COL', 'j')}")
    w(f"for m in range({n}):")
    w("    UL[m] = U[m, j]")
    if desc.fsal:
        w(f"for m in range({n}):")
        w("    F0[m] = F[m, j]")
    else:
        _call_rhs(w, n, "UL[{m}]", "t", "F0")
    _write_derivatives(w, desc, n, layout.dtype)
    w("conv = True")
    if desc.family == "rodas":
        _write_rodas_stages(w, desc, layout)
    elif desc.family == "rosenbrock23":
        _write_rosenbrock23_stages(w, desc, layout)
    else:
        _write_trbdf2_stages(w, desc, layout)
    w("ss = DT(0.0)")
    w("finite = conv")
    w(f"for m in range({n}):")
    w("    q = G[m] / (RTOL * maximum(abs(UL[m]), abs(V[m])) + ATOL[m])")
    w("    ss = ss + q * q")
    w("    finite = finite and math.isfinite(V[m])")
    w(f"    {_row(layout, desc, 'u1')} = V[m]")
    if layout.adaptive:
        # A stage whose Newton iteration failed: the largest finite error, which the
        # controller treats as the array path treats its infinite one for failed lanes
        # (reject, shrink the step the most, fail with DtLessThanMin rather than Unstable).
        big = _const(float(np.finfo(layout.dtype).max))
        w(f"{_w(layout, desc, 'err')} = math.sqrt(ss / DT({n})) if conv else {big}")
    else:  # fixed steps: codegen's control reads the error row as "u1 is finite"
        w(f"{_w(layout, desc, 'err')} = DT(1.0) if finite else DT(0.0)")
    w("landing = TG[j]")
    w("stepped = t + hs")
    w(f"{_w(layout, desc, 'tn')} = landing if HIT[j] != 0 else stepped")
    w.dedent()
    if layout.adaptive:  # the controller's factors of the lanes attempted
        w("for j in range(nlive):")
        w.indent()
        w("if ACT[j] == 0:")
        w("    continue")
        _write_factor(w, desc, layout)  # type: ignore[arg-type]
        w.dedent()
    w.dedent()
    w()


def _write_rodas_stages(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """``rosenbrock.Rosenbrock.step``: stages into ``K``, ``V = u1``, ``G = error``, dense rows."""
    n, S = layout.n, desc.method_stages
    ks = [f"K[{i}, m]" for i in range(S)]
    _write_shift_and_factor(w, n, f"DT(1.0) / (hs * {_const(desc.gamma)})", None)
    for i in range(S):
        if i > 0:
            w(f"for m in range({n}):")
            w(f"    Y[m] = UL[m] + {_lincomb(desc.a[i], ks[:i])}")
            _call_rhs(w, n, "Y[{m}]", f"t + {_const(desc.c[i])} * hs", "G")
        coupling = _lincomb(desc.C[i], ks[:i])
        if desc.d[i] != 0.0 or coupling is not None:
            w(f"for m in range({n}):")
            w.indent()
            w("gm = F0[m]" if i == 0 else "gm = G[m]")
            if desc.d[i] != 0.0:
                w(f"gm = gm + ({_const(desc.d[i])} * hs) * DF[m]")
            if coupling is not None:
                w(f"gm = gm + {coupling} / hs")
            w("G[m] = gm")
            w.dedent()
        elif i == 0:
            w(f"for m in range({n}):")
            w("    G[m] = F0[m]")
        w("lu_solve(JM, PIV, G)")
        w(f"for m in range({n}):")
        w(f"    K[{i}, m] = G[m]")
    w(f"for m in range({n}):")
    w.indent()
    w(f"V[m] = UL[m] + {_lincomb(desc.b, ks)}")
    for r, row in enumerate(desc.H):
        w(f"{_row(layout, desc, 'k', r)} = {_lincomb(row, ks)}")
    w(f"G[m] = {_lincomb(desc.e, ks)}")
    w.dedent()


def _write_rosenbrock23_stages(
    w: _Writer, desc: RosenbrockDescription, layout: KernelLayout
) -> None:
    """``rosenbrock23.Rosenbrock23.step``: ``K[0], K[1]`` = k1, k2, ``V = u1``, ``G = error``,
    and the workspace rows k1, k2, ``f(u1)`` (the next step's ``f``)."""
    n = layout.n
    w(f"dh = {_const(desc.gamma)} * hs")
    _write_shift_and_factor(w, n, "DT(1.0)", "dh")
    w(f"for m in range({n}):")
    w("    G[m] = F0[m] + dh * DF[m]")
    w("lu_solve(JM, PIV, G)")
    w(f"for m in range({n}):")
    w("    K[0, m] = G[m]")
    w(f"    Y[m] = UL[m] + ({_const(0.5)} * hs) * G[m]")
    _call_rhs(w, n, "Y[{m}]", f"t + {_const(0.5)} * hs", "F1")
    w(f"for m in range({n}):")
    w("    G[m] = F1[m] - K[0, m]")
    w("lu_solve(JM, PIV, G)")
    w(f"for m in range({n}):")
    w("    K[1, m] = G[m] + K[0, m]")
    w("    V[m] = UL[m] + hs * K[1, m]")
    _call_rhs(w, n, "V[{m}]", "t + hs", "Y")
    w(f"for m in range({n}):")
    w(
        f"    G[m] = ((Y[m] - {_const(desc.e32)} * (K[1, m] - F1[m])) - {_const(2.0)} "
        "* (K[0, m] - F0[m])) + dh * DF[m]"
    )
    w("lu_solve(JM, PIV, G)")
    w(f"for m in range({n}):")
    w(f"    G[m] = (hs / {_const(6.0)}) * ((K[0, m] - {_const(2.0)} * K[1, m]) + G[m])")
    for r in range(2):
        w(f"    {_row(layout, desc, 'k', r)} = K[{r}, m]")
    w(f"    {_row(layout, desc, 'k', 2)} = Y[m]")


def _write_trbdf2_stages(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """``trbdf2.TRBDF2.step``: ``K[0], K[1], K[2]`` = ``h f`` at ``t``, ``t + gamma h``,
    ``t + h``; ``V = u1``, ``G = error``, ``conv``; the Newton iterations added to ``NFX``."""
    n = layout.n
    gamma_tr, weight = desc.c[1], desc.b[0]
    w(f"dh = {_const(desc.gamma)} * hs")
    _write_shift_and_factor(w, n, "DT(1.0)", "dh")
    eps = float(np.finfo(layout.dtype).eps)
    w(f"kappa = maximum({_const(desc.kappa)}, {_const(10.0 * eps)} / RTOL)")
    w(f"for m in range({n}):")
    w("    K[0, m] = hs * F0[m]")
    w(f"    F1[m] = UL[m] + {_const(desc.gamma)} * K[0, m]")
    w(f"    G[m] = {_const(gamma_tr)} * K[0, m]")
    w("lu_solve(JM, PIV, G)")
    w(f"for m in range({n}):")
    w("    V[m] = UL[m] + G[m]")
    _write_newton(w, desc, n, f"t + {_const(gamma_tr)} * hs", "True")
    w(f"for m in range({n}):")
    w(f"    K[1, m] = (V[m] - F1[m]) / {_const(desc.gamma)}")
    w(f"    F1[m] = (UL[m] + {_const(weight)} * K[0, m]) + {_const(weight)} * K[1, m]")
    _write_newton(w, desc, n, "t + hs", "conv")
    w(f"for m in range({n}):")
    w(f"    K[2, m] = (V[m] - F1[m]) / {_const(desc.gamma)}")
    w(f"    G[m] = {_lincomb(desc.e, [f'K[{i}, m]' for i in range(3)])}")
    w(f"    {_row(layout, desc, 'k', 0)} = K[0, m]")
    w(f"    {_row(layout, desc, 'k', 1)} = K[2, m]")
    w("lu_solve(JM, PIV, G)")


def _write_newton(w: _Writer, desc: RosenbrockDescription, n: int, time: str, run: str) -> None:
    """``newton.solve_stage`` for one lane: ``V`` solves ``V = F1 + dh f(V)`` from its start
    value; ``conv`` says whether it converged; iterations counted in ``NFX[j]``."""
    w(f"tst = {time}")
    w(f"active = {run}")
    w("conv = False")
    w("prev = DT(1.0)")
    w(f"for itn in range({desc.max_iters}):")
    w.indent()
    w("if not active:")
    w("    break")
    _call_rhs(w, n, "V[{m}]", "tst", "G")
    w(f"for m in range({n}):")
    w("    G[m] = (F1[m] + dh * G[m]) - V[m]")
    w("lu_solve(JM, PIV, G)")
    w("ss = DT(0.0)")
    w(f"for m in range({n}):")
    w("    q = G[m] / (RTOL * abs(UL[m]) + ATOL[m])")
    w("    ss = ss + q * q")
    w("    V[m] = V[m] + G[m]")
    w(f"norm = math.sqrt(ss / DT({n}))")
    w("NFX[j] += 1")
    w("if itn == 0:")
    w("    done = norm <= kappa")
    w("    bad = not math.isfinite(norm)")
    w("else:")
    w("    rate = norm / prev")
    w("    contracting = rate < DT(1.0)")
    w("    if not contracting:")
    w("        rate = DT(0.0)")
    w("    done = contracting and (rate / (DT(1.0) - rate) * norm <= kappa)")
    w("    bad = not contracting")
    w("if done:")
    w("    conv = True")
    w("active = active and not done and not bad")
    w("prev = norm")
    w.dedent()


def _write_block(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """The block function: ``codegen``'s loop around this method's attempt and saves."""
    n = layout.n
    _write_block_setup(w, desc, layout, n)  # type: ignore[arg-type]
    _write_lane_starts(w, desc, layout, n)  # type: ignore[arg-type]
    w("it = 0")
    w("while nact > 0:")
    w.indent()
    w("if it >= MAXITERS:")
    w(f"    for j in range({layout.block}):")
    w("        if ACT[j] != 0:")
    _write_retire(w, n, str(_MAXITERS), depth=3)
    w("    break")
    w("it += 1")
    _write_step_sizes(w, layout)
    w("attempt(T, HS, PB, U, F, W, TG, HIT, RTOL, ATOL, nlive, ACT, NFX)")
    w(f"for j in range({layout.block}):")
    w.indent()
    _write_control(w, desc, layout)  # type: ignore[arg-type]
    w("if acc:")
    w.indent()
    _write_accept(w, desc, layout)
    w.dedent()
    _write_outcome(w, desc, layout, n)  # type: ignore[arg-type]
    w.dedent()
    w.dedent()
    if layout.record:
        w("return TREC, UREC, nrec")
    w.dedent()
    w()


def _write_accept(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """An accepted step: saves it passed, the recorded step, the lane advanced."""
    n = layout.n
    w("if NSAVE > 0:")
    w.indent()
    _write_saves(w, desc, layout)
    w.dedent()
    if layout.record:
        copy = [f"for m in range({n}):", f"    UREC[nrec, m] = {_row(layout, desc, 'u1')}"]
        _write_record(w, n, copy)
    w(f"for m in range({n}):")
    w(f"    U[m, j] = {_row(layout, desc, 'u1')}")
    if desc.fsal:
        w(f"    F[m, j] = {_row(layout, desc, 'k', desc.stages - 1)}")
    w("T[j] = tn")
    w("NA[j] += 1")
    w("if HIT[j] != 0 and USE[j] != 0:")
    w("    STI[j] += 1")


def _write_saves(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """Fill the save points the accepted step passed, with the array path's interpolant."""
    n = layout.n
    w("while D * (TS[SI[j], g] - tn) <= DT(0.0):")
    w.indent()
    w("theta = (TS[SI[j], g] - t) / hs")
    w(f"for m in range({n}):")
    w.indent()
    w("u0m = U[m, j]")
    w(f"u1m = {_row(layout, desc, 'u1')}")
    if desc.family == "rodas":
        last = len(desc.H) - 1
        w(f"poly = {_row(layout, desc, 'k', last)}")
        for r in range(last - 1, -1, -1):
            w(f"poly = {_row(layout, desc, 'k', r)} + theta * poly")
        w("SAVED[g, SI[j], m] = (DT(1.0) - theta) * u0m + theta * (u1m + (DT(1.0) - theta) * poly)")
    elif desc.family == "trbdf2":  # cubic Hermite through (u0, h f0) and (u1, h f1)
        z0, z1 = _row(layout, desc, "k", 0), _row(layout, desc, "k", 1)
        w(
            f"slope = ((DT(1.0) - {_const(2.0)} * theta) * (u1m - u0m) + (theta - DT(1.0)) * "
            f"{z0}) + theta * {z1}"
        )
        w(
            "SAVED[g, SI[j], m] = ((DT(1.0) - theta) * u0m + theta * u1m) + theta * "
            "(theta - DT(1.0)) * slope"
        )
    else:
        scale = _const(1.0 / (1.0 - 2.0 * desc.gamma))
        w(f"w1 = theta * (DT(1.0) - theta) * {scale}")
        w(f"w2 = theta * (theta - {_const(2.0 * desc.gamma)}) * {scale}")
        k1, k2 = _row(layout, desc, "k", 0), _row(layout, desc, "k", 1)
        w(f"value = u0m + hs * (w1 * {k1} + w2 * {k2})")
        w("SAVED[g, SI[j], m] = u1m if theta == DT(1.0) else value")
    w.dedent()
    w("SI[j] += 1")
    w.dedent()
