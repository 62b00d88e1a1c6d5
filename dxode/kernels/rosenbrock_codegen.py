"""Generate the per-lane integration of a Rosenbrock method (or TRBDF2), from a
``RosenbrockDescription``.

The block function, its drivers, the step-size control, the lane starts, the return codes and
the statistics are ``codegen``'s (its helpers are reused, with this method's workspace laid
out as theirs: ``desc.stages`` rows of per-step data, then ``u1``, the error, the end time).
What differs is the attempt and the dense output:

``attempt(T, HS, PB, U, F, W, TG, HIT, TSC, RTOL, ATOL, nlive, ACT, NFX)``
    The block's active lanes, gathered in order into chunks of up to ``LANE_WIDTH`` lanes
    (``stiff_lanes``): per chunk, ``f`` at the step's start, the Jacobian (the user's
    ``jac``, or forward differences of ``f`` as ``dxode._jacobian`` takes them), ``df/dt``
    (the user's ``tgrad``, or a forward difference on the lane's time scale ``TSC``, filled
    once per block by ``write_time_scales``), the shifted matrix
    ``W = I/(h gamma) - J`` (Rosenbrock23, TRBDF2: ``I - d h J``) factored (Gaussian
    elimination with partial pivoting, the exchanges as selects), then the stages
    (``rosenbrock_stages``; TRBDF2: two simplified Newton iterations, their RHS evaluations
    added to ``NFX``), the solution, its error norm and the dense-output rows, scattered
    into the workspace ``W``. Every step of a chunk runs in lane loops that the CPU compiler
    vectorizes across trajectories; an inactive lane costs nothing.
``lu_factor(S, nw)`` / ``lu_solve(S, nw)``, ``select(c, a, b)``
    The chunk's factorization and a solve (``stiff_lanes``), and the lane loops' selects:
    compiled once and called (LLVM inlines ``select``).

A kernel that switches method per lane (an automatic stiffness switch) can call codegen's
explicit attempt and this one on the same workspace layout: both write ``u1``, the error and
the end time to the same rows, so the controller and the lane bookkeeping stay shared.
"""

from __future__ import annotations

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
    _write_outcome,
    _write_record,
    _write_record_end,
    _write_retire,
    _write_rhs,
    _write_selects,
    _write_step_sizes,
    _Writer,
)
from .codegen import CALLED as EXPLICIT_CALLED
from .codegen import HELPERS as EXPLICIT_HELPERS
from .codegen_math import write_helpers
from .rosenbrock_description import RosenbrockDescription
from .rosenbrock_stages import add_rows, write_derivatives, write_finish, write_rho, write_stages
from .stiff_lanes import UNROLLED_LU_STATES, Lanes

__all__ = ["CALLED", "HELPERS", "LANE_WIDTH", "generate", "lanes_for", "write_time_scales"]

# Generated helper functions compiled inline into ``attempt`` and ``block``, and those
# compiled once and called (besides the looped LU's ``lu_factor``/``lu_solve``).
HELPERS = EXPLICIT_HELPERS
CALLED: tuple[str, ...] = ()

# Lanes a stiff attempt steps at once on the CPU: one 512-bit vector (two 256-bit ones).
LANE_WIDTH = {"float64": 8, "float32": 16}


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
    ``tgrad``), its ``HELPERS``/``CALLED`` lists (with ``codegen``'s and the LU's functions),
    and the helpers, ``rhs`` and those functions."""
    lanes = lanes_for(desc, layout)
    called = (*EXPLICIT_CALLED, "lu_factor", "lu_solve", *called)
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
    w(f"DT = np.{layout.dtype}")
    w("user_f = None  # bound to the compiled user functions before compiling")
    w("user_jac = None")
    w("user_tgrad = None")
    w(f"HELPERS = {helpers!r}")
    w(f"CALLED = {called!r}")
    w()
    _write_selects(w)
    write_helpers(w, layout.dtype, _ERROR_FLOOR, _exponent_bounds(layout))
    _write_rhs(w, layout)
    lanes.write_functions(w)


def _row(layout: KernelLayout, desc: RosenbrockDescription, what: str, i: int = 0) -> str:
    """Lane ``j``'s entry ``m`` of workspace row group ``what`` (``m`` a loop variable), at
    ``codegen``'s offsets."""
    entry = _w(layout, desc, what, i, 0)  # type: ignore[arg-type]
    match = re.fullmatch(r"W\[(\d+) \+ j\]", entry)
    assert match is not None, entry
    return f"W[{match.group(1)} + m * {layout.block} + j]"


def lanes_for(desc: RosenbrockDescription, layout: KernelLayout) -> Lanes:
    """The attempt's chunk layout: ``LANE_WIDTH`` lanes (fewer in smaller blocks, one lane
    per CUDA thread), the LU written out up to ``UNROLLED_LU_STATES`` states."""
    width = 1 if layout.target == "cuda" else min(layout.block, LANE_WIDTH[layout.dtype])
    lanes = Lanes(layout.n, width, layout.n <= UNROLLED_LU_STATES, [])
    add_rows(lanes, desc)
    if _params_in_rows(layout):  # one array read and written: no run-time alias checks
        lanes.add("P", layout.param_rows)
        params = re.sub(r"P\[(\d+), COL\]", lambda g: lanes.at("P", int(g[1])), layout.params)
    else:
        params = layout.params.replace("P[", "PC[").replace("COL", "v")
    lanes.preamble = [f"t = {lanes.at('t')}", f"hs = {lanes.at('hs')}", f"p = {params}"]
    if desc.family != "rodas":
        lanes.preamble.append(f"dh = {_const(desc.gamma)} * hs")
    return lanes


def _params_in_rows(layout: KernelLayout) -> bool:
    """Whether the chunk's parameters go to rows of ``S`` (the state's dtype), not ``PC``."""
    return layout.param_dtype == layout.dtype and layout.target != "cuda"


def _write_attempt_function(
    w: _Writer, desc: RosenbrockDescription, layout: KernelLayout, rho_row: str | None = None
) -> None:
    """``attempt``: one trial step of each active lane of a block (see the module docstring);
    with ``rho_row`` (a workspace entry) also each lane's ``||J||_inf`` there."""
    n = layout.n
    lanes = lanes_for(desc, layout)
    width = lanes.width
    w("def attempt(T, HS, PB, U, F, W, TG, HIT, TSC, RTOL, ATOL, nlive, ACT, NFX):")
    w.indent()
    w(f"S = {_alloc(layout, f'({lanes.size * width},)')}")
    if layout.target == "cuda":
        w(f"PC = {_alloc(layout, '', 'P')}")
    elif not _params_in_rows(layout):
        w(f"PC = np.empty((PB.shape[0], {width}), PB.dtype)")
    w(f"IDX = {_alloc(layout, f'({layout.block},)', 'int')}")
    if "array" in (desc.jac, desc.tgrad):
        w(f"UA = {_alloc(layout, str(n))}")
    for m in range(n):
        w(f"atol{m} = ATOL[{m}]")
    w("nsel = 0")  # the active lanes, in order, are stepped in chunks of ``width``
    w("for j in range(nlive):")
    w("    if ACT[j] != 0:")
    w("        IDX[nsel] = j")
    w("        nsel += 1")
    w(f"for c0 in range(0, nsel, {width}):")
    w.indent()
    w(f"nw = min({width}, nsel - c0)")
    _write_gather(w, desc, layout, lanes)
    if not desc.fsal:
        lanes.open(w)
        w(f"r = rhs({', '.join(lanes.at('UL', m) for m in range(n))}, p, t)")
        for m in range(n):
            w(f"{lanes.at('F0', m)} = r[{m}]")
        lanes.close(w)
    write_derivatives(w, desc, lanes, layout.dtype, check_rows=layout.target == "cpu")
    if rho_row is not None:
        lanes.open(w)
        write_rho(w, lanes)
        lanes.close(w)
    write_stages(w, desc, lanes, layout)
    write_finish(w, desc, lanes, layout)
    _write_scatter(w, desc, layout, lanes, rho_row)
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


def _write_gather(
    w: _Writer, desc: RosenbrockDescription, layout: KernelLayout, lanes: Lanes
) -> None:
    """Copy the chunk's lanes (``IDX[c0:c0 + nw]``) into their rows of ``S`` (and ``PC``)."""
    w("for v in range(nw):")
    w.indent()
    w("j = IDX[c0 + v]")
    for row, source in (("t", "T[j]"), ("hs", "HS[j]"), ("tg", "TG[j]"), ("tsc", "TSC[j]")):
        w(f"{lanes.at(row)} = {source}")
    w(f"{lanes.at('hit')} = select(HIT[j] != 0, DT(1.0), DT(0.0))")
    for m in range(lanes.n):
        w(f"{lanes.at('UL', m)} = U[{m}, j]")
        if desc.fsal:
            w(f"{lanes.at('F0', m)} = F[{m}, j]")
    if _params_in_rows(layout):
        for k in range(layout.param_rows):
            w(f"{lanes.at('P', k)} = PB[{k}, j]")
    else:
        w("for k in range(PB.shape[0]):")
        w("    PC[k, v] = PB[k, j]")
    w.dedent()


def _write_scatter(
    w: _Writer, desc: RosenbrockDescription, layout: KernelLayout, lanes: Lanes, rho: str | None
) -> None:
    """The chunk's results into the block's workspace ``W`` (and TRBDF2's Newton counts)."""
    n = lanes.n
    w("for v in range(nw):")
    w.indent()
    w("j = IDX[c0 + v]")
    for m in range(n):
        w(f"{_w(layout, desc, 'u1', m=m)} = {lanes.at('V', m)}")  # type: ignore[arg-type]
    for what in ("err", "tn"):
        w(f"{_w(layout, desc, what)} = {lanes.at(what)}")  # type: ignore[arg-type]
    for r in range(len(desc.H) + (1 if desc.fsal else 0)):
        for m in range(n):
            w(f"{_w(layout, desc, 'k', r, m)} = {lanes.at('OUT', r * n + m)}")  # type: ignore[arg-type]
    if rho is not None:
        w(f"{rho} = {lanes.at('rho')}")
    if desc.family == "trbdf2":
        w(f"NFX[j] += int({lanes.at('nfx')})")
    w.dedent()


def _write_block(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """The block function: ``codegen``'s loop around this method's attempt and saves."""
    n = layout.n
    _write_block_setup(w, desc, layout, n)  # type: ignore[arg-type]
    _write_lane_starts(w, desc, layout, n)  # type: ignore[arg-type]
    write_time_scales(w, layout)
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
    w("attempt(T, HS, PB, U, F, W, TG, HIT, TSC, RTOL, ATOL, nlive, ACT, NFX)")
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
    _write_record_end(w, layout)
    w.dedent()
    w()


def write_time_scales(w: _Writer, layout: KernelLayout) -> None:
    """``TSC[j]``: each lane's time scale ``|t1 - t0|``, at least the smallest normal
    number (``dxode._jacobian.time_scale``; after the lane starts, which set ``TE`` and
    ``LANE``)."""
    tiny = _const(float(np.finfo(layout.dtype).smallest_normal))
    w(f"TSC = {_alloc(layout, f'({layout.block},)')}")
    w(f"for j in range({layout.block}):")
    w("    span = abs(TE[j] - DT(T0[LANE[j]]))")
    w(f"    TSC[j] = maximum(span, {tiny})")


def _write_accept(w: _Writer, desc: RosenbrockDescription, layout: KernelLayout) -> None:
    """An accepted step: saves it passed, the recorded step, the lane advanced."""
    n = layout.n
    w("if NSAVE > 0:")
    w.indent()
    _write_saves(w, desc, layout)
    w.dedent()
    if layout.record:
        copy = [f"for m in range({n}):", f"    UREC[nrec, m] = {_row(layout, desc, 'u1')}"]
        _write_record(w, layout, copy)
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
