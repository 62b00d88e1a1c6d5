"""Generated source for callbacks (events) inside the kernel's ``block``, per lane.

The same semantics as the array path's ``dxode.events.lanes.EventHandler``, one lane at a
time. At module level ``codegen`` writes the wrappers of the user's functions
(``write_wrappers``) and ``locate`` (``write_locate_function``, compiled on its own like
``attempt``); inside ``block`` it calls four hooks (only when the layout has callbacks):

``write_start``
    Before the step loop: the lanes' event state at ``t0`` and preset times equal to ``t0``.
``write_locate``
    First thing in an accepted step, a call of ``locate``: sample each continuous condition
    at ``points`` points of the step's dense output, bracket the first crossing with the
    Illinois method, and cut the step at the earliest event (the step's end ``tn`` and the
    workspace's ``u1``).
``write_apply``
    Last thing in an accepted step: the callbacks that fired, the continuous one first and
    then the others in the set's order (affects, termination, the event log, a fresh ``f``).
``write_outcome``
    A terminated lane's return code, and the interpolation stages the array path counts.

Per-lane state lives in per-block arrays: ``EG{k}`` continuous callback ``k``'s condition
at the lane's time (``0`` right after it fired where the affects left it unchanged),
``ER{k}`` its sign before its crossing in the last step (or its last nonzero sign), ``EI{k}``
the next time of preset callback ``k``, ``EVS`` whether a callback terminated the lane. The
log goes straight to the per-lane outputs ``EVT, EVK, EVUB, EVUA`` (``(L, capacity[, n])``)
and ``EVN`` (events per lane, which may exceed the capacity: the caller then runs those lanes
again with room for all of them).

A continuous condition that returns NaN for a finite state (it has no sign, so no crossing
can be found) stops its lane there, as a termination does, and logs the time with the
callback ``NAN_CONDITION - k`` (``locate`` returns that as ``EW``, its time as ``tn``): the
host raises the array path's ``ValueError`` for it (``events.run_events``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "BLOCK_ARGS",
    "NAN_CONDITION",
    "TERMINATED",
    "CallbackLayout",
    "EventLayout",
    "Primitives",
    "functions",
    "interpolant_weight",
    "locate_copies",
    "separate_functions",
    "write_apply",
    "write_locate",
    "write_locate_function",
    "write_outcome",
    "write_start",
    "write_wrappers",
]

# The block's extra arguments: preset times and offsets (inputs), then the event log.
BLOCK_ARGS = "EVTIMES, EVOFF, EVT, EVK, EVUB, EVUA, EVN"
TERMINATED = 4  # ReturnCode.Terminated
# The log's callback for a NaN condition: ``NAN_CONDITION - k`` for continuous callback ``k``
# (``-1`` is an empty entry).
NAN_CONDITION = -2

# The Illinois iteration (as ``dxode.events.roots``): every fourth iterate bisects.
_BISECT_EVERY = 4
_MAX_ITERATIONS = 4 * 64


@dataclasses.dataclass(frozen=True)
class CallbackLayout:
    """One callback as the generator needs it (hashable: part of the kernel's cache key).

    Attributes
    ----------
    kind : str
        ``"continuous"``, ``"discrete"`` or ``"preset"``.
    direction : str
        ``"both"``, ``"up"`` or ``"down"`` (continuous only).
    affect, terminate : bool
        Whether there is an ``affect`` / a ``terminate`` function.
    terminate_always : bool
        ``terminate=True``.
    save_before, save_after : bool
        ``save_positions``.
    abstol : float or None
        Bracket width in time (continuous only).
    as_array : tuple of bool
        Whether condition, affect and terminate take ``u`` as an array (else a tuple).
    keys : tuple of str
        ``function_key`` of condition, affect and terminate (``""`` for none).
    preset : int
        This callback's position among the preset-time callbacks (``-1``: not one).
    """

    kind: str
    direction: str = "both"
    affect: bool = False
    terminate: bool = False
    terminate_always: bool = False
    save_before: bool = True
    save_after: bool = True
    abstol: float | None = None
    as_array: tuple[bool, bool, bool] = (False, False, False)
    keys: tuple[str, str, str] = ("", "", "")
    preset: int = -1


@dataclasses.dataclass(frozen=True)
class EventLayout:
    """A kernel's callbacks: ``callbacks`` in the set's order, ``points`` the continuous
    callbacks' sample points per step (the largest ``interp_points``)."""

    callbacks: tuple[CallbackLayout, ...]
    points: int = 0

    @property
    def continuous(self) -> list[int]:
        """Positions of the continuous callbacks."""
        return [k for k, cb in enumerate(self.callbacks) if cb.kind == "continuous"]

    @property
    def presets(self) -> list[int]:
        """Positions of the preset-time callbacks."""
        return [k for k, cb in enumerate(self.callbacks) if cb.kind == "preset"]


@dataclasses.dataclass(frozen=True)
class Primitives:
    """What the generator borrows from ``codegen`` (passed in, so no import cycle).

    ``alloc(layout, shape, kind)`` block-local arrays, ``slot(layout, desc, what, i, m)``
    workspace entries, ``retire(w, n, code, depth)`` retiring lane ``j``, ``const(x)``
    dtype-cast literals.
    """

    alloc: Callable[..., str]
    slot: Callable[..., str]
    retire: Callable[..., None]
    const: Callable[[float], str]


# ---- wrappers around the user's functions -------------------------------------------------


def write_wrappers(w: Any, layout: Any, prims: Primitives) -> None:
    """``cond{k}``, ``affect{k}``, ``term{k}``: the user's functions on one lane's components
    (globals ``cb{k}_cond`` ... are bound to the compiled user functions)."""
    n, events = layout.n, layout.events
    ys = ", ".join(f"y{m}" for m in range(n))
    for _, user, k, role in functions(events):
        # The function's key makes the source (so numba's disk cache) differ per function.
        key = events.callbacks[k].keys[role]
        w(f"{user} = None  # bound to the compiled user function {key} before compiling")
    w()
    for wrapper, user, k, role in functions(events):
        cb = events.callbacks[k]
        w(f"def {wrapper}({ys}, p, t):")
        w.indent()
        if cb.as_array[role]:
            w(f"u = {prims.alloc(layout, str(n))}")
            for m in range(n):
                w(f"u[{m}] = y{m}")
        else:
            w(f"u = ({''.join(f'y{m}, ' for m in range(n))})")
        w(f"r = {user}(u, p, t{', True' if role == 1 else ''})")
        if role == 1:
            if layout.target == "cpu":
                w(f"r = rows_of(r, {n})")
            w("return (" + "".join(f"DT(r[{m}]), " for m in range(n)) + ")")
        elif role == 0 and cb.kind == "continuous":
            w("return DT(r)")
        else:
            w("return r")
        w.dedent()
        w()
    for wrapper, copy in locate_copies(events):
        w(f"{copy} = {wrapper}  # locate's copy, compiled inline there")
    w()


def functions(events: EventLayout) -> list[tuple[str, str, int, int]]:
    """``(wrapper, user global, callback, role)`` of every user function, ``role`` ``0``
    condition, ``1`` affect, ``2`` terminate (wrappers are compiled like ``rhs``)."""
    out = []
    for k, cb in enumerate(events.callbacks):
        present = (cb.kind != "preset", cb.affect, cb.terminate)
        for role, name in enumerate(("cond", "affect", "term")):
            if present[role]:
                out.append((f"{name}{k}", f"cb{k}_{name}", k, role))
    return out


# ---- hooks in the block -------------------------------------------------------------------


def write_start(w: Any, layout: Any, prims: Primitives) -> None:
    """Per-block event state, every live lane's at ``t0``, preset times at ``t0``."""
    ev, B, n = layout.events, layout.block, layout.n
    w(f"EVS = {prims.alloc(layout, f'({B},)', 'int')}")
    for k in ev.continuous:
        w(f"EG{k} = {prims.alloc(layout, f'({B},)')}")
        w(f"ER{k} = {prims.alloc(layout, f'({B},)')}")
    for k in ev.presets:
        w(f"EI{k} = {prims.alloc(layout, f'({B},)', 'int')}")
    w(f"for j in range({B}):")
    w.indent()
    w("EVS[j] = 0")
    w("if ACT[j] == 0:")
    w("    continue")
    w("g = LANE[j]")
    w("EVN[g] = 0")
    w("t = T[j]")
    w(f"p = {layout.params.replace('COL', 'g')}")
    for m in range(n):
        w(f"u{m} = U[{m}, j]")
    for k in ev.continuous:
        w(f"EG{k}[j] = cond{k}({_us(n)}, p, t)")
        w(f"ER{k}[j] = {_sign(f'EG{k}[j]')}")
        _write_nan_flag(w, n, k, f"EG{k}[j]")
    for k in ev.presets:
        q = ev.callbacks[k].preset
        w("cnt = 0")
        w(f"for q in range(EVOFF[{q}], EVOFF[{q + 1}]):")
        w("    if D * (EVTIMES[q] - t) < DT(0.0):")
        w("        cnt += 1")
        w(f"EI{k}[j] = cnt")
    if ev.presets:
        w("EW = -1")
        _write_fire_all(w, layout, prims, discrete=False)
    if ev.presets or ev.continuous:
        w("if EVS[j] != 0:")
        prims.retire(w, n, str(TERMINATED), depth=1)
    w.dedent()


def write_locate(w: Any, desc: Any, layout: Any, prims: Primitives) -> None:
    """Cut lane ``j``'s accepted step (from ``t``, size ``hs``, to ``tn``) at its earliest
    continuous event; ``EW`` is the callback that fired (``-1``: none)."""
    ev = layout.events
    if not ev.continuous:
        w("EW = -1")
        return
    w(f"EW, tn = locate(j, g, t, hs, tn, {_locate_arrays(ev)})")


def _locate_arrays(ev: EventLayout) -> str:
    return "U, W, P, NFX, HIT" + "".join(f", EG{k}, ER{k}" for k in ev.continuous)


def locate_copies(events: EventLayout) -> list[tuple[str, str]]:
    """``(wrapper, copy)``: the continuous conditions as ``locate`` calls them (``lcond{k}``,
    inlined there: its sampling and root finding are the hot path), beside ``cond{k}``
    (compiled once, called from ``block``)."""
    return [(f"cond{k}", f"lcond{k}") for k in events.continuous]


def separate_functions(events: EventLayout) -> list[str]:
    """Generated functions compiled on their own (not inlined into ``block``): ``locate``,
    with continuous callbacks (it keeps ``block`` small enough to compile quickly)."""
    return ["locate"] if events.continuous else []


def write_locate_function(w: Any, desc: Any, layout: Any, prims: Primitives) -> None:
    """``locate(j, g, t, hs, tn, ...) -> (EW, tn)``: lane ``j``'s accepted step cut at its
    earliest continuous event (the workspace's ``u1`` then holds the state there)."""
    ev, n = layout.events, layout.n
    if not ev.continuous:
        return
    s, e = desc.stages, desc.extra_stages
    w(f"def locate(j, g, t, hs, tn, {_locate_arrays(ev)}):")
    w.indent()
    w("EW = -1")
    w(f"p = {layout.params.replace('COL', 'g')}")
    for m in range(n):
        w(f"u{m} = U[{m}, j]")
        for i in range(s):
            w(f"k{i}_{m} = {prims.slot(layout, desc, 'k', i, m)}")
    _write_extra_stages(w, desc, layout, prims)
    _write_scan(w, desc, layout, prims)
    found = " or ".join(f"efound{k}" for k in ev.continuous)
    w(f"if {found}:")
    w.indent()
    w("ebest = DT(2.0)")
    for k in ev.continuous:
        w(f"if efound{k}:")
        w.indent()
        _write_root(w, desc, layout, prims, k)
        w("if ea < ebest:")
        w("    ebest = ea")
        w(f"    EW = {k}")
        w.dedent()
    if e:
        w(f"NFX[j] += {e}")
    w("if ebest < DT(1.0):")
    w.indent()
    w("tn = t + ebest * hs")
    _write_interpolant(w, desc, layout, prims, "ebest", "v")
    for m in range(n):
        w(f"{prims.slot(layout, desc, 'u1', m=m)} = v{m}")
    w("HIT[j] = 0  # a cut step does not land on its tstop")
    w.dedent()
    w.dedent()
    w("return EW, tn")
    w.dedent()
    w()


def write_apply(w: Any, layout: Any, prims: Primitives) -> None:
    """After lane ``j`` advanced: fire its callbacks (``EW`` names the continuous one)."""
    w("t = T[j]")
    w(f"p = {layout.params.replace('COL', 'g')}")
    for m in range(layout.n):
        w(f"u{m} = U[{m}, j]")
    if not layout.events.continuous:
        _write_fire_all(w, layout, prims, discrete=True)
        return
    w(f"if EW < {NAN_CONDITION + 1}:  # locate met a NaN condition")
    w.indent()
    _write_log_nan(w, "EW")
    w.dedent()
    w("else:")
    w.indent()
    _write_fire_all(w, layout, prims, discrete=True)
    w.dedent()


def write_outcome(w: Any, desc: Any, layout: Any) -> None:
    """A lane a callback terminated ends with ``Terminated``; every attempt counts the RHS
    evaluations the array path spends interpolating for the continuous conditions."""
    ev = layout.events
    if ev.continuous and desc.extra_stages:
        w(f"NFX[j] += {desc.extra_stages * (ev.points - 1)}")
    w("if acc and EVS[j] != 0:")
    w(f"    code = {TERMINATED}")


# ---- pieces -------------------------------------------------------------------------------


def _us(n: int, prefix: str = "u") -> str:
    return ", ".join(f"{prefix}{m}" for m in range(n))


def _write_extra_stages(w: Any, desc: Any, layout: Any, prims: Primitives) -> None:
    """The interpolation-only stages (Verner), as ``codegen``'s saves compute them."""
    s, n = desc.stages, layout.n
    for x in range(desc.extra_stages):
        i = s + x
        for m in range(n):
            terms = [f"k{jj}_{m}" for jj in range(i)]
            w(f"y{m} = {_combine(prims, f'u{m}', 'hs', desc.a_extra[x], terms)}")
        at = f"t + {prims.const(desc.c_extra[x])} * hs"
        w(f"{', '.join(f'k{i}_{m}' for m in range(n))}, = rhs({_us(n, 'y')}, p, {at})")


def _combine(prims: Primitives, base: str, h: str, weights: Any, terms: list[str]) -> str:
    products = [f"{prims.const(wt)} * {t}" for wt, t in zip(weights, terms, strict=False)]
    total = products[0]
    for product in products[1:]:
        total = f"({total} + {product})"
    return f"({total}) * {h} + {base}"


def _write_interpolant(
    w: Any, desc: Any, layout: Any, prims: Primitives, theta: str, out: str
) -> None:
    """``{out}{m}``: the dense output at fraction ``theta`` of the step (``u1`` at 1)."""
    s, e, n = desc.stages, desc.extra_stages, layout.n
    for i, row in enumerate(desc.interpolant):
        w(f"w{i} = {interpolant_weight(row, theta)}")
    for m in range(n):
        products = [f"w{i} * k{i}_{m}" for i in range(s + e)]
        total = products[0]
        for product in products[1:]:
            total = f"({total} + {product})"
        u1 = prims.slot(layout, desc, "u1", m=m)
        w(f"{out}{m} = {u1} if {theta} == DT(1.0) else ({total}) * hs + u{m}")


def interpolant_weight(row: Any, theta: str) -> str:
    """The dense output's stage weight ``sum_j row[j] theta^(j+1)`` by Horner's rule, in
    float64 and rounded once to ``DT`` (as ``ExplicitRungeKutta.interpolation_weights``: the
    coefficients are large and of both signs, so float32 arithmetic loses digits)."""
    x = f"np.float64({theta})"
    horner = f"{float(row[-1])!r} * {x}"
    for coefficient in reversed(row[:-1]):
        horner = f"({horner} + {float(coefficient)!r}) * {x}"
    return f"DT({horner})"


def _sign(value: str) -> str:
    """``numpy.sign`` of a scalar (NaN stays NaN)."""
    return f"(DT(1.0) if {value} > DT(0.0) else (DT(-1.0) if {value} < DT(0.0) else {value}))"


def _write_scan(w: Any, desc: Any, layout: Any, prims: Primitives) -> None:
    """Sample every continuous condition at the step's ``points`` points (as ``_scan``)."""
    ev, n = layout.events, layout.n
    for k in ev.continuous:
        w(f"efound{k} = False")
        w(f"eprev{k} = EG{k}[j]")
        w(f"eref{k} = {_sign(f'eprev{k}')}")
        for name in ("ea", "eb", "ega", "egb"):
            w(f"{name}{k} = DT(0.0)")
    w("ethp = DT(0.0)")
    w(f"for q in range(1, {ev.points + 1}):")
    w.indent()
    w(f"eth = DT(q / {ev.points})")
    w(f"if q == {ev.points}:")
    for m in range(n):
        w(f"    v{m} = {prims.slot(layout, desc, 'u1', m=m)}")
    w("    etq = tn")
    w("else:")
    w.indent()
    _write_interpolant(w, desc, layout, prims, "eth", "v")
    w("etq = t + eth * hs")
    w.dedent()
    for k in ev.continuous:
        cb = ev.callbacks[k]
        w(f"ev = lcond{k}({_us(n, 'v')}, p, etq)")
        _write_nan_exit(w, desc, layout, prims, k, "ev", "etq")
        w(f"es = {_sign('ev')}")
        test = f"not efound{k} and eref{k} != DT(0.0) and es != eref{k} and es == es"
        if cb.direction == "up":
            test += f" and eref{k} < DT(0.0)"
        elif cb.direction == "down":
            test += f" and eref{k} > DT(0.0)"
        w(f"if {test}:")
        w(f"    ea{k} = ethp")
        w(f"    eb{k} = eth")
        w(f"    ega{k} = eprev{k}")
        w(f"    egb{k} = ev")
        w(f"    efound{k} = True")
        w(f"if not efound{k} and es != DT(0.0) and es == es:")
        w(f"    eref{k} = es")
        w(f"eprev{k} = ev")
    w("ethp = eth")
    w.dedent()
    for k in ev.continuous:
        w(f"EG{k}[j] = eprev{k}")
        w(f"ER{k}[j] = eref{k}")


def _write_root(w: Any, desc: Any, layout: Any, prims: Primitives, k: int) -> None:
    """Narrow callback ``k``'s bracket (``dxode.events.roots.bracket_root``, one lane):
    leaves ``ea``, the fraction of the step just before the crossing (or the zero found)."""
    n, eps = layout.n, float(np.finfo(layout.dtype).eps)
    cb = layout.events.callbacks[k]
    c = prims.const
    w("ehab = abs(hs)")
    if cb.abstol is not None:
        w(f"ewid = {c(cb.abstol)}")
    else:
        w("esc = maximum(maximum(abs(t), abs(t + hs)), ehab)")
        w(f"ewid = {c(8 * eps)} * esc")
    w(f"etol = maximum(ewid / ehab, {c(4 * eps)})")
    w(f"ea, eb, ega, egb = ea{k}, eb{k}, ega{k}, egb{k}")
    w("if ega == DT(0.0):")
    w("    eb = ea")
    w("edone = (eb - ea <= etol) or ega == DT(0.0)")
    w("elast = 0")
    w("eprobed = False")
    w("eit = 0")
    w(f"while not edone and eit < {_MAX_ITERATIONS}:")
    w.indent()
    w("eit += 1")
    w("emid = DT(0.5) * (ea + eb)")
    w(f"if eit % {_BISECT_EVERY} == 0:")
    w("    ex = emid")
    w("else:")
    w("    ex = eb - egb * (eb - ea) / (egb - ega)")
    w("    if not (ex > ea and ex < eb):")
    w("        ex = emid")
    w("eprobe = egb == DT(0.0) and not eprobed")
    w("if eprobe:")
    w("    ex = maximum(ea, eb - etol)")
    w("    eprobed = True")
    _write_interpolant(w, desc, layout, prims, "ex", "v")
    w(f"egx = lcond{k}({_us(n, 'v')}, p, t + ex * hs)")
    _write_nan_exit(w, desc, layout, prims, k, "egx", "t + ex * hs")
    if desc.extra_stages:
        w(f"NFX[j] += {desc.extra_stages}")
    w(f"eto_a = egx != DT(0.0) and {_sign('egx')} == {_sign('ega')}")
    w("eto_b = not eto_a")
    w("if eto_b and elast == 1:")
    w("    ega = DT(0.5) * ega")
    w("if eto_a and elast == -1:")
    w("    egb = DT(0.5) * egb")
    w("if eto_a:")
    w("    ea = ex")
    w("if eto_b:")
    w("    eb = ex")
    w("if eto_a:")
    w("    ega = egx")
    w("    elast = -1")
    w("if eto_b:")
    w("    egb = egx")
    w("    elast = 1")
    w("edone = (eb - ea <= etol) or (eprobe and eto_a)")
    w.dedent()
    w("if egb == DT(0.0):")
    w("    ea = eb")


def _finite(n: int, prefix: str) -> str:
    """Whether the state ``{prefix}0 .. {prefix}{n-1}`` is finite."""
    return " and ".join(f"math.isfinite({prefix}{m})" for m in range(n))


def _write_nan_exit(
    w: Any, desc: Any, layout: Any, prims: Primitives, k: int, value: str, time: str
) -> None:
    """In ``locate``: where condition ``k``'s ``value`` at the state ``v`` and ``time`` is NaN
    for a finite state, end the step there and return ``NAN_CONDITION - k``."""
    w(f"if {value} != {value} and {_finite(layout.n, 'v')}:")
    w.indent()
    for m in range(layout.n):
        w(f"{prims.slot(layout, desc, 'u1', m=m)} = v{m}")
    w("HIT[j] = 0")
    w(f"return {NAN_CONDITION - k}, {time}")
    w.dedent()


def _write_nan_flag(w: Any, n: int, k: int, value: str) -> None:
    """In ``block``: where condition ``k``'s ``value`` at ``(u, t)`` is NaN for a finite
    state, log it and stop the lane."""
    w(f"if {value} != {value} and {_finite(n, 'u')}:")
    w.indent()
    _write_log_nan(w, str(NAN_CONDITION - k))
    w.dedent()


def _write_log_nan(w: Any, which: str) -> None:
    """Log a NaN condition (the log's callback ``which``) at lane ``j``'s ``t``; stop it."""
    w("ec = EVN[g]")
    w("if ec < EVT.shape[1]:")
    w("    EVT[g, ec] = t")
    w(f"    EVK[g, ec] = {which}")
    w("EVN[g] = ec + 1")
    w("EVS[j] = 1")


def _write_fire_all(w: Any, layout: Any, prims: Primitives, discrete: bool) -> None:
    """Fire lane ``j``'s callbacks at ``(t, u)``, the continuous one first, then the others in
    the set's order (``EventHandler.apply``);
    without ``discrete`` (at ``t0``) only preset times fire."""
    ev, n = layout.events, layout.n
    w("echg = False")
    w("estop = False")
    if ev.continuous:
        w("eg0 = DT(0.0)  # the fired condition at the event, before any affect")
    for k in ev.continuous if discrete else ():
        w(f"if EW == {k}:")
        w.indent()
        w(f"eg0 = cond{k}({_us(n)}, p, t)")
        _write_nan_flag(w, n, k, "eg0")
        w.dedent()
    # The continuous callback that fired applies first, then the others in the set's order.
    order = ev.continuous + [k for k in range(len(ev.callbacks)) if k not in ev.continuous]
    for k in order:
        cb = ev.callbacks[k]
        if cb.kind == "continuous":
            if not discrete:
                continue
            w(f"efire = EW == {k}")
        elif cb.kind == "discrete":
            if not discrete:
                continue
            w(f"efire = (not estop) and cond{k}({_us(n)}, p, t)")
        else:
            q = cb.preset
            w("efire = False")
            w(f"epos = EI{k}[j]")
            w(f"if (not estop) and epos < EVOFF[{q + 1}] - EVOFF[{q}]:")
            w(f"    if EVTIMES[EVOFF[{q}] + epos] == t:")
            w("        efire = True")
            w(f"        EI{k}[j] = epos + 1")
        w("if efire:")
        w.indent()
        _write_fire(w, layout, k, cb)
        w.dedent()
    w("if echg:")
    w.indent()
    for m in range(n):
        w(f"U[{m}, j] = u{m}")
    w(f"{', '.join(f'f{m}' for m in range(n))}, = rhs({_us(n)}, p, t)")
    for m in range(n):
        w(f"F[{m}, j] = f{m}")
    w("NFX[j] += 1")
    for k in ev.continuous:
        w(f"EG{k}[j] = cond{k}({_us(n)}, p, t)")
        _write_nan_flag(w, n, k, f"EG{k}[j]")
        w(f"if EW == {k} and EG{k}[j] == eg0:  # left on the crossing: it sits there")
        w(f"    EG{k}[j] = DT(0.0)")
        w(f"if EW >= 0 and EW != {k} and EG{k}[j] == DT(0.0):  # a tie: fires next, at t")
        w(f"    EG{k}[j] = ER{k}[j]")
    w("if estop:")
    w("    EVS[j] = 1")
    w.dedent()


def _write_fire(w: Any, layout: Any, k: int, cb: CallbackLayout) -> None:
    """Callback ``k`` fired on lane ``j``: affect, terminate, log."""
    n = layout.n
    for m in range(n):
        w(f"eu{m} = u{m}")
    if cb.affect:
        w(f"{', '.join(f'u{m}' for m in range(n))}, = affect{k}({_us(n)}, p, t)")
    if cb.terminate_always:
        w("estop = True")
    elif cb.terminate:
        w(f"if term{k}({_us(n)}, p, t):")
        w("    estop = True")
    w("ec = EVN[g]")
    w("if ec < EVT.shape[1]:")
    w("    EVT[g, ec] = t")
    w(f"    EVK[g, ec] = {k}")
    for m in range(n):
        w(f"    EVUB[g, ec, {m}] = {f'eu{m}' if cb.save_before else 'DT(np.nan)'}")
        w(f"    EVUA[g, ec, {m}] = {f'u{m}' if cb.save_after else 'DT(np.nan)'}")
    w("EVN[g] = ec + 1")
    w("echg = True")
