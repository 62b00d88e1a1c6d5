"""The stiff attempt's per-step work on a chunk of lanes: derivatives, ``W``, stages, error.

Written for ``rosenbrock_codegen``'s attempt in ``stiff_lanes``'s layout: every quantity a
row of ``S``, every statement inside a lane loop, the state components written out (``m`` is
never a loop variable, so every offset is a constant). The arithmetic of each lane is that of
the array path's step (``rosenbrock.Rosenbrock.step``, ``rosenbrock23.Rosenbrock23.step``,
``trbdf2.TRBDF2.step``), operation for operation and in its order.

Rows besides the LU's: ``t, hs, tg, hit, tsc`` (the lane's time, signed step, landing time,
whether it lands, and its time scale ``|t1 - t0|``, ``dxode._jacobian.time_scale``),
``UL, F0, DF, V, F1, JC`` (``n`` each: the state, ``f`` there, ``df/dt``, the proposed state,
TRBDF2's Newton base, a Jacobian column), ``K`` (the stages), ``OUT`` (the dense-output rows
for the workspace), ``err, tn`` and, for TRBDF2, the Newton flags ``act, conv, prev, nfx``;
``rho`` for an automatic switch.
"""

from __future__ import annotations

import math

import numpy as np

from .._jacobian import FD_FLOOR
from .codegen import KernelLayout, _const, _Writer
from .rosenbrock_description import RosenbrockDescription
from .stiff_lanes import Lanes

__all__ = [
    "add_rows",
    "write_derivatives",
    "write_finish",
    "write_rho",
    "write_stages",
]


def add_rows(lanes: Lanes, desc: RosenbrockDescription) -> None:
    """Reserve the attempt's rows (see the module docstring)."""
    n = lanes.n
    for name in ("t", "hs", "tg", "hit", "tsc", "err", "tn", "rho", "act", "conv", "prev", "nfx"):
        lanes.add(name)
    for name in ("UL", "F0", "DF", "V", "F1", "JC"):
        lanes.add(name, n)
    lanes.add("K", desc.method_stages * n)
    lanes.add("OUT", (len(desc.H) + (1 if desc.fsal else 0)) * n)


def _lincomb(weights: tuple[float, ...], terms: list[str]) -> str | None:
    """``sum_j w_j * t_j`` in order, zero weights skipped (``stiff.linear_combination``)."""
    total = None
    for weight, term in zip(weights, terms, strict=False):
        if weight == 0.0:
            continue
        product = term if weight == 1.0 else f"{_const(weight)} * {term}"
        total = product if total is None else f"({total} + {product})"
    return total


def _k(lanes: Lanes, i: int, m: int) -> str:
    return lanes.at("K", i * lanes.n + m)


def _rhs(w: _Writer, lanes: Lanes, args: list[str], t: str, into: list[str]) -> None:
    """``into[m] = f(args, p, t)[m]`` for one lane."""
    r = lanes.fresh("r")
    w(f"{r} = rhs({', '.join(args)}, p, {t})")
    for m, target in enumerate(into):
        w(f"{target} = {r}[{m}]")


def _row(lanes: Lanes, name: str) -> list[str]:
    return [lanes.at(name, m) for m in range(lanes.n)]


def _user_u(lanes: Lanes, source: str) -> str:
    """``u`` as the user's ``jac``/``tgrad`` takes it: a tuple, or the small array ``UA``
    filled from the lane's state (which does not vectorize)."""
    if source == "array":
        return "UA"
    return "(" + "".join(f"{u}, " for u in _row(lanes, "UL")) + ")"


def _fill_array(w: _Writer, lanes: Lanes, source: str) -> None:
    if source == "array":
        for m, u in enumerate(_row(lanes, "UL")):
            w(f"UA[{m}] = {u}")


def write_derivatives(
    w: _Writer, desc: RosenbrockDescription, lanes: Lanes, dtype: str, check_rows: bool
) -> None:
    """``JM = J`` and ``DF = df/dt`` at ``(UL, t)``, with ``F0 = f(UL, t)`` known (closed lane
    loops; a difference Jacobian by columns, one ``f`` per column); with ``check_rows`` (the
    CPU), the user's ``jac`` and ``tgrad`` results pass through ``returned_rows.rows_of``."""
    n = lanes.n
    root_eps = _const(math.sqrt(float(np.finfo(dtype).eps)))
    eps = _const(float(np.finfo(dtype).eps))
    ul, f0 = _row(lanes, "UL"), _row(lanes, "F0")
    if desc.jac == "finite_difference":
        w(f"for c in range({n}):")
        w.indent()
        lanes.open(w)
        pick = ul[-1]
        for m in range(n - 2, -1, -1):
            pick = f"select(c == {m}, {ul[m]}, {pick})"
        w(f"uc = {pick}")
        w("au = abs(uc)")  # dxode._jacobian.difference_increment
        w(f"yc = uc + maximum(math.sqrt({eps} * maximum(au, {_const(FD_FLOOR)})), {root_eps} * au)")
        w("dj = yc - uc")
        w(f"r = rhs({', '.join(f'select(c == {m}, yc, {ul[m]})' for m in range(n))}, p, t)")
        for m in range(n):
            w(f"{lanes.at('JC', m)} = (r[{m}] - {f0[m]}) / dj")
        lanes.close(w)
        w("for v in range(nw):  # the column into JM (offsets vary with c: not vectorized)")
        for m in range(n):
            w(f"    {lanes.jm(m, 'c')} = {lanes.at('JC', m)}")
        w.dedent()
    else:
        lanes.open(w)
        _fill_array(w, lanes, desc.jac)
        w(f"rj = user_jac({_user_u(lanes, desc.jac)}, p, t)")
        if check_rows:
            w(f"rj = rows_of(rj, {n})")
        for i in range(n):
            for m in range(n):
                w(f"{lanes.jm(i, m)} = DT(rj[{i}][{m}])")
        lanes.close(w)
    if not desc.needs_tgrad:
        return
    lanes.open(w)
    df = _row(lanes, "DF")
    if desc.tgrad == "finite_difference":  # dxode._jacobian.time_increment
        w("at = abs(t)")
        w(f"c = minimum({lanes.at('tsc')}, maximum(at, DT(1.0)))")
        w("ac = at * c")  # sqrt(at) sqrt(c) where at * c overflows, as time_increment
        w("root = select(ac < math.inf, DT(math.sqrt(ac)), DT(math.sqrt(at)) * DT(math.sqrt(c)))")
        w(f"t_step = t + {root_eps} * maximum(c, root)")
        w("dt = t_step - t")
        w(f"r = rhs({', '.join(ul)}, p, t_step)")
        for m in range(n):
            w(f"{df[m]} = (r[{m}] - {f0[m]}) / dt")
    else:
        _fill_array(w, lanes, desc.tgrad)
        w(f"rt = user_tgrad({_user_u(lanes, desc.tgrad)}, p, t)")
        if check_rows:
            w(f"rt = rows_of(rt, {n})")
        for m in range(n):
            w(f"{df[m]} = DT(rt[{m}])")
    lanes.close(w)


def write_rho(w: _Writer, lanes: Lanes) -> None:
    """``rho = max_i sum_m |J_im|`` of the Jacobian, before it is shifted (an open loop)."""
    n = lanes.n
    rho = ""
    for i in range(n):
        total = f"abs({lanes.jm(i, 0)})"
        for m in range(1, n):
            total = f"({total} + abs({lanes.jm(i, m)}))"
        rs, new = lanes.fresh("rs"), lanes.fresh("rho")
        w(f"{rs} = {total}")
        w(f"{new} = {rs}" if i == 0 else f"{new} = maximum({rho}, {rs})")
        rho = new
    w(f"{lanes.at('rho')} = {rho}")


def _write_shift_and_factor(w: _Writer, lanes: Lanes, diagonal: str, scale: str | None) -> None:
    """``JM <- diagonal * I - scale * JM`` (``stiff.shifted_jacobian``), then factor it
    (inside an open lane loop)."""
    n = lanes.n
    w(f"diag = {diagonal}")
    for i in range(n):
        for m in range(n):
            entry = lanes.jm(i, m)
            w(f"{entry} = -({scale} * {entry})" if scale else f"{entry} = -{entry}")
        w(f"{lanes.jm(i, i)} = diag + {lanes.jm(i, i)}")
    lanes.close(w)
    lanes.factor(w)
    lanes.open(w)


def write_stages(
    w: _Writer, desc: RosenbrockDescription, lanes: Lanes, layout: KernelLayout
) -> None:
    """The method's stages (closed lane loops): ``V = u1``, ``G`` = the error, ``OUT`` rows."""
    if desc.family == "rodas":
        _write_rodas_stages(w, desc, lanes)
    elif desc.family == "rosenbrock23":
        _write_rosenbrock23_stages(w, desc, lanes)
    else:
        _write_trbdf2_stages(w, desc, lanes, layout)


def _write_rodas_stages(w: _Writer, desc: RosenbrockDescription, lanes: Lanes) -> None:
    """``rosenbrock.Rosenbrock.step``: stages into ``K``, ``V = u1``, ``G = error``, dense rows."""
    n, S = lanes.n, desc.method_stages
    g, ul = _row(lanes, "G"), _row(lanes, "UL")
    lanes.open(w)
    _write_shift_and_factor(w, lanes, f"DT(1.0) / (hs * {_const(desc.gamma)})", None)
    for i in range(S):
        ks = [[_k(lanes, s, m) for s in range(i)] for m in range(n)]
        if i > 0:
            ys = [lanes.fresh(f"y{m}") for m in range(n)]
            for m in range(n):
                w(f"{ys[m]} = {ul[m]} + {_lincomb(desc.a[i], ks[m])}")
            r = lanes.fresh("r")
            w(f"{r} = rhs({', '.join(ys)}, p, t + {_const(desc.c[i])} * hs)")
        for m in range(n):
            gm = lanes.at("F0", m) if i == 0 else f"{r}[{m}]"
            if desc.d[i] != 0.0:
                gm = f"{gm} + ({_const(desc.d[i])} * hs) * {lanes.at('DF', m)}"
            coupling = _lincomb(desc.C[i], ks[m])
            if coupling is not None:
                gm = f"({gm}) + {coupling} / hs"
            w(f"{g[m]} = {gm}")
        lanes.solve(w)
        for m in range(n):
            w(f"{_k(lanes, i, m)} = {g[m]}")
    for m in range(n):
        ks = [_k(lanes, s, m) for s in range(S)]
        w(f"{lanes.at('V', m)} = {ul[m]} + {_lincomb(desc.b, ks)}")
        for r, row in enumerate(desc.H):
            w(f"{lanes.at('OUT', r * n + m)} = {_lincomb(row, ks)}")
        w(f"{g[m]} = {_lincomb(desc.e, ks)}")
    lanes.close(w)


def _write_rosenbrock23_stages(w: _Writer, desc: RosenbrockDescription, lanes: Lanes) -> None:
    """``rosenbrock23.Rosenbrock23.step``: ``K[0], K[1]`` = k1, k2, ``V = u1``, ``G = error``,
    and the dense rows k1, k2, ``f(u1)`` (the next step's ``f``)."""
    n = lanes.n
    g, ul, f0, df = (_row(lanes, x) for x in ("G", "UL", "F0", "DF"))
    k0, k1 = ([_k(lanes, i, m) for m in range(n)] for i in (0, 1))
    f1, v, out = _row(lanes, "F1"), _row(lanes, "V"), [lanes.at("OUT", x) for x in range(3 * n)]
    lanes.open(w)
    _write_shift_and_factor(w, lanes, "DT(1.0)", "dh")
    for m in range(n):
        w(f"{g[m]} = {f0[m]} + dh * {df[m]}")
    lanes.solve(w)
    for m in range(n):
        w(f"{k0[m]} = {g[m]}")
        w(f"y{m} = {ul[m]} + ({_const(0.5)} * hs) * {g[m]}")
    _rhs(w, lanes, [f"y{m}" for m in range(n)], f"t + {_const(0.5)} * hs", f1)
    for m in range(n):
        w(f"{g[m]} = {f1[m]} - {k0[m]}")
    lanes.solve(w)
    for m in range(n):
        w(f"{k1[m]} = {g[m]} + {k0[m]}")
        w(f"{v[m]} = {ul[m]} + hs * {k1[m]}")
    _rhs(w, lanes, v, "t + hs", out[2 * n :])
    for m in range(n):
        w(
            f"{g[m]} = (({out[2 * n + m]} - {_const(desc.e32)} * ({k1[m]} - {f1[m]})) - "
            f"{_const(2.0)} * ({k0[m]} - {f0[m]})) + dh * {df[m]}"
        )
    lanes.solve(w)
    for m in range(n):
        w(f"{g[m]} = (hs / {_const(6.0)}) * (({k0[m]} - {_const(2.0)} * {k1[m]}) + {g[m]})")
        w(f"{out[m]} = {k0[m]}")
        w(f"{out[n + m]} = {k1[m]}")
    lanes.close(w)


def _write_trbdf2_stages(
    w: _Writer, desc: RosenbrockDescription, lanes: Lanes, layout: KernelLayout
) -> None:
    """``trbdf2.TRBDF2.step``: ``K[0], K[1], K[2]`` = ``h f`` at ``t``, ``t + gamma h``,
    ``t + h``; ``V = u1``, ``G = error``, ``conv``; the Newton iterations counted in ``nfx``."""
    n = lanes.n
    gamma_tr, weight, gamma = _const(desc.c[1]), _const(desc.b[0]), _const(desc.gamma)
    g, ul, f0, f1, v = (_row(lanes, x) for x in ("G", "UL", "F0", "F1", "V"))
    k0, k1, k2 = ([_k(lanes, i, m) for m in range(n)] for i in (0, 1, 2))
    eps = float(np.finfo(layout.dtype).eps)
    w(f"kappa = maximum({_const(desc.kappa)}, {_const(10.0 * eps)} / RTOL)")
    lanes.open(w)
    _write_shift_and_factor(w, lanes, "DT(1.0)", "dh")
    for m in range(n):
        w(f"{k0[m]} = hs * {f0[m]}")
        w(f"{f1[m]} = {ul[m]} + {gamma} * {k0[m]}")
        w(f"{g[m]} = {gamma_tr} * {k0[m]}")
    lanes.solve(w)
    for m in range(n):
        w(f"{v[m]} = {ul[m]} + {g[m]}")
    w(f"{lanes.at('act')} = DT(1.0)")
    w(f"{lanes.at('nfx')} = DT(0.0)")
    lanes.close(w)
    _write_newton(w, desc, lanes, f"t + {gamma_tr} * hs")
    lanes.open(w)
    for m in range(n):
        w(f"{k1[m]} = ({v[m]} - {f1[m]}) / {gamma}")
        w(f"{f1[m]} = ({ul[m]} + {weight} * {k0[m]}) + {weight} * {k1[m]}")
    w(f"{lanes.at('act')} = {lanes.at('conv')}")
    lanes.close(w)
    _write_newton(w, desc, lanes, "t + hs")
    lanes.open(w)
    for m in range(n):
        w(f"{k2[m]} = ({v[m]} - {f1[m]}) / {gamma}")
        w(f"{g[m]} = {_lincomb(desc.e, [k0[m], k1[m], k2[m]])}")
        w(f"{lanes.at('OUT', m)} = {k0[m]}")
        w(f"{lanes.at('OUT', n + m)} = {k2[m]}")
    lanes.solve(w)
    lanes.close(w)


def _write_newton(w: _Writer, desc: RosenbrockDescription, lanes: Lanes, time: str) -> None:
    """``newton.solve_stage`` for the chunk's lanes whose ``act`` is set: ``V`` solves
    ``V = F1 + dh f(V)`` from its start value; ``conv`` says whether it converged. Every lane
    runs each iteration; a lane that stopped keeps its values (selects) and its count."""
    n = lanes.n
    g, ul, f1, v = (_row(lanes, x) for x in ("G", "UL", "F1", "V"))
    act, conv, prev = lanes.at("act"), lanes.at("conv"), lanes.at("prev")
    lanes.open(w)
    w(f"{conv} = DT(0.0)")
    w(f"{prev} = DT(1.0)")
    lanes.close(w)
    w(f"for itn in range({desc.max_iters}):")
    w.indent()
    w("running = DT(0.0)")
    w("for v in range(nw):")
    w(f"    running = running + {act}")
    w("if running == DT(0.0):")
    w("    break")
    lanes.open(w)
    w(f"r = rhs({', '.join(v)}, p, {time})")
    for m in range(n):
        w(f"{g[m]} = ({f1[m]} + dh * r[{m}]) - {v[m]}")
    lanes.solve(w)
    w(f"active = {act} != DT(0.0)")
    ss = "DT(0.0)"
    for m in range(n):
        q, total = lanes.fresh("q"), lanes.fresh("ss")
        w(f"{q} = {g[m]} / (RTOL * abs({ul[m]}) + atol{m})")
        w(f"{total} = {ss} + {q} * {q}")
        w(f"{v[m]} = select(active, {v[m]} + {g[m]}, {v[m]})")
        ss = total
    w(f"norm = math.sqrt({ss} / DT({n}))")
    w(f"{lanes.at('nfx')} = {lanes.at('nfx')} + select(active, DT(1.0), DT(0.0))")
    w("if itn == 0:")
    w("    done = norm <= kappa")
    w("    bad = not math.isfinite(norm)")
    w("else:")
    w(f"    rate = norm / {prev}")
    w("    contracting = rate < DT(1.0)")
    w("    rate = select(contracting, rate, DT(0.0))")
    w("    done = contracting & (rate / (DT(1.0) - rate) * norm <= kappa)")
    w("    bad = not contracting")
    w(f"{conv} = select(active & done, DT(1.0), {conv})")
    w(f"{act} = select(active & (not done) & (not bad), DT(1.0), DT(0.0))")
    w(f"{prev} = select(active, norm, {prev})")
    lanes.close(w)
    w.dedent()


def write_finish(
    w: _Writer, desc: RosenbrockDescription, lanes: Lanes, layout: KernelLayout
) -> None:
    """The error norm into ``err`` (adaptive) or ``u1``'s finiteness (fixed steps), and the
    step's end time into ``tn`` (a closed lane loop)."""
    n = lanes.n
    lanes.open(w)
    conv = f"({lanes.at('conv')} != DT(0.0))" if desc.family == "trbdf2" else "True"
    ss, finite = "DT(0.0)", "True"
    for m in range(n):
        u, vm = lanes.at("UL", m), lanes.at("V", m)
        q, total, fin = lanes.fresh("q"), lanes.fresh("ss"), lanes.fresh("finite")
        w(f"{q} = {lanes.at('G', m)} / (RTOL * maximum(abs({u}), abs({vm})) + atol{m})")
        w(f"{total} = {ss} + {q} * {q}")
        w(f"{fin} = {finite} & math.isfinite({vm})")
        ss, finite = total, fin
    if layout.adaptive:
        # A stage whose Newton iteration failed: the largest finite error, which the
        # controller treats as the array path treats its infinite one for failed lanes
        # (reject, shrink the step the most, fail with DtLessThanMin), unless its iterate
        # is not finite (a NaN/inf from f): then an infinite one (fail Unstable).
        big = _const(float(np.finfo(layout.dtype).max))
        failed = f"select({finite}, {big}, DT(np.inf))"
        w(f"{lanes.at('err')} = select({conv}, math.sqrt({ss} / DT({n})), {failed})")
    else:  # fixed steps: codegen's control reads the error row as "u1 is finite"
        w(f"{lanes.at('err')} = select({conv} & {finite}, DT(1.0), DT(0.0))")
    w(f"landing = {lanes.at('tg')}")
    w("stepped = t + hs")
    w(f"{lanes.at('tn')} = select({lanes.at('hit')} != DT(0.0), landing, stepped)")
    lanes.close(w)
