"""Generate the per-lane integration of ``AutoSwitch`` (a nonstiff explicit Runge–Kutta method
and a stiff Rosenbrock method, each lane switching by its own stiffness estimate).

The block function is ``codegen``'s loop with both methods' attempts: every lane keeps its
method in ``MODE`` (0 nonstiff, 1 stiff; all start nonstiff). An iteration runs the explicit
attempt (vectorized over the block) when a lane of the block runs it, then the Rosenbrock
attempt on the lanes whose ``MODE`` is 1 (their rows overwrite the explicit ones). Both write
``u1``, the error and the end time to the same workspace rows (sized for the larger method,
plus one row for each lane's stiffness estimate ``rho``), so the controller (with each
method's own error exponent) and the lane bookkeeping are shared; save points use the dense
output of the method that took the step.

The stiffness estimate, the votes, the hysteresis and the switch are
``dxode.solvers.autoswitch``'s, lane by lane: explicit lanes estimate
``rho = ||k_s - k_{s-1}|| / ||y_s - y_{s-1}||``, stiff lanes ``rho = ||J||_inf`` of the
Jacobian their step computed. A lane switching back to the explicit method (whose FSAL
derivative a non-FSAL Rosenbrock method does not keep) evaluates ``f`` at its new state.
``block`` also returns every lane's switches and attempts with the stiff method in
``NSW[g, 0]``, ``NSW[g, 1]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .autoswitch_description import AutoSwitchDescription
from .codegen import (
    _MAXITERS,
    KernelLayout,
    _alloc,
    _combine,
    _const,
    _sum_of_squares,
    _w,
    _write_attempt,
    _write_attempt_head,
    _write_block_setup,
    _write_control,
    _write_cpu_driver,
    _write_factor,
    _write_lane_starts,
    _write_outcome,
    _write_record,
    _write_record_end,
    _write_retire,
    _write_step_sizes,
    _Writer,
)
from .codegen import HELPERS as EXPLICIT_HELPERS
from .codegen import _write_saves as _write_explicit_saves
from .rosenbrock_codegen import _row, write_module_head, write_time_scales
from .rosenbrock_codegen import _write_attempt_function as _write_stiff_attempt
from .rosenbrock_codegen import _write_saves as _write_stiff_saves

__all__ = ["CALLED", "HELPERS", "generate"]

HELPERS = EXPLICIT_HELPERS
CALLED = ("attempt_stiff",)  # write_module_head adds codegen's and the LU functions


class _Padded:
    """A method's description seen with ``rows`` workspace row groups (``codegen``'s
    ``stages`` sets the offsets of ``u1``, the error and the end time), its own error order
    for the controller and no RHS evaluations counted per attempt (``NFX`` counts them)."""

    rhs_per_attempt = 0

    def __init__(self, desc: Any, rows: int) -> None:
        self._desc = desc
        self.stages = rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._desc, name)


def generate(desc: AutoSwitchDescription, layout: KernelLayout) -> str:
    """The module source for ``desc`` under ``layout`` (deterministic: a cache key)."""
    w = _Writer()
    named = dataclasses.replace(desc.stiff, name=desc.name)  # its jac and tgrad sources
    write_module_head(w, named, layout, HELPERS, CALLED)
    _write_explicit_attempt(w, desc, layout)
    _write_stiff_attempt_with_rho(w, desc, layout)
    _write_block(w, desc, layout)
    _write_drivers(w, layout)
    return w.text()


def _write_explicit_attempt(w: _Writer, desc: AutoSwitchDescription, layout: KernelLayout) -> None:
    """``attempt``: codegen's explicit attempt over the block, with each lane's ``rho``."""
    ns, n = desc.nonstiff, layout.n
    pad = _Padded(ns, desc.rows)
    s = ns.stages
    _write_attempt_head(w, n)
    _write_attempt(w, pad, layout, n, s)  # type: ignore[arg-type]
    # y_{s-1}: the input of stage s - 2, recomputed as the attempt computed it; y_s = u1.
    for m in range(n):
        prev = _combine(f"u{m}", "hs", ns.a[s - 2], [f"k{i}_{m}" for i in range(s - 2)])
        w(f"dy{m} = v{m} - ({prev})")
        w(f"dk{m} = k{s - 1}_{m} - k{s - 2}_{m}")
    # the Euclidean norms over the lane's state, summed in the array path's order
    w(f"num = math.sqrt({_sum_of_squares([f'dk{m}' for m in range(n)])})")
    w(f"den = math.sqrt({_sum_of_squares([f'dy{m}' for m in range(n)])})")
    # both sides of a select run: a zero den divides nothing (the simulator would raise)
    w("some = den > DT(0.0)")
    rho = _w(layout, pad, "k", desc.rows - 1)  # type: ignore[arg-type]
    w(f"{rho} = select(some, num / select(some, den, DT(1.0)), DT(0.0))")
    w.dedent()
    if layout.adaptive:  # the explicit method's factors (the stiff attempt redoes its lanes')
        w("for j in range(nlive):")
        w.indent()
        _write_factor(w, pad, layout)  # type: ignore[arg-type]
        w.dedent()
    w.dedent()
    w()


def _write_stiff_attempt_with_rho(
    w: _Writer, desc: AutoSwitchDescription, layout: KernelLayout
) -> None:
    """``attempt_stiff``: ``rosenbrock_codegen``'s attempt, renamed, that also stores
    ``rho = max_i sum_m |J_im|`` of the Jacobian before it is shifted and factored."""
    pad = _Padded(desc.stiff, desc.rows)
    rho_row = _w(layout, pad, "k", desc.rows - 1)  # type: ignore[arg-type]
    inner = _Writer()
    _write_stiff_attempt(inner, pad, layout, rho_row)  # type: ignore[arg-type]
    lines = inner.lines
    assert lines[0].startswith("def attempt(")
    lines[0] = lines[0].replace("def attempt(", "def attempt_stiff(", 1)
    w.lines.extend(lines)


def _write_block(w: _Writer, desc: AutoSwitchDescription, layout: KernelLayout) -> None:
    """The block function: codegen's loop, both attempts, the switch, per-lane saves."""
    n, B = layout.n, layout.block
    ns_pad = _Padded(desc.nonstiff, desc.rows)
    st_pad = _Padded(desc.stiff, desc.rows)
    _write_block_setup(w, ns_pad, layout, n)  # type: ignore[arg-type]
    _add_switch_output(w)
    for name in ("MODE", "CNT", "NSWITCH", "NSTIFF", "SACT"):
        w(f"{name} = {_alloc(layout, f'({B},)', 'int')}")
    _write_lane_starts(w, ns_pad, layout, n)  # type: ignore[arg-type]
    write_time_scales(w, layout)
    w(f"for j in range({B}):")
    for name in ("MODE", "CNT", "NSWITCH", "NSTIFF"):
        w(f"    {name}[j] = 0")
    w("it = 0")
    w("while nact > 0:")
    w.indent()
    w("if it >= MAXITERS:")
    w(f"    for j in range({B}):")
    w("        if ACT[j] != 0:")
    _write_retire_counted(w, n, str(_MAXITERS), depth=3)
    w("    break")
    w("it += 1")
    _write_step_sizes(w, layout)
    w("nst = 0")
    w("nex = 0")
    w(f"for j in range({B}):")
    w("    SACT[j] = ACT[j] if MODE[j] == 1 else 0")
    w("    nst += SACT[j]")
    w("    nex += ACT[j] - SACT[j]")
    w("if nex > 0:")
    w("    attempt(T, HS, PB, U, F, W, TG, HIT, RTOL, ATOL, nlive)")
    w("if nst > 0:")
    w("    attempt_stiff(T, HS, PB, U, F, W, TG, HIT, TSC, RTOL, ATOL, nlive, SACT, NFX)")
    w(f"for j in range({B}):")
    w.indent()
    w("if MODE[j] == 0:")
    w.indent()
    _write_control(w, ns_pad, layout)  # type: ignore[arg-type]
    w(f"NFX[j] += {desc.nonstiff.rhs_per_attempt}")
    w.dedent()
    w("else:")
    w.indent()
    _write_control(w, st_pad, layout)  # type: ignore[arg-type]
    w(f"NFX[j] += {desc.stiff.rhs_per_attempt}")
    w("NSTIFF[j] += 1")
    w.dedent()
    w("if acc:")
    w.indent()
    _write_accept(w, desc, layout)
    w.dedent()
    _write_switch(w, desc, layout)
    _write_outcome_counted(w, ns_pad, layout)
    w.dedent()
    w.dedent()
    _write_record_end(w, layout)
    w.dedent()
    w()


def _add_switch_output(w: _Writer) -> None:
    """Add ``NSW`` (every lane's switches and stiff attempts) to ``block``'s signature."""
    at = next(i for i, line in enumerate(w.lines) if line.startswith("def block("))
    w.lines[at] = w.lines[at].replace("NREJ, NF):", "NREJ, NF, NSW):")


def _write_retire_counted(w: _Writer, n: int, code: str, depth: int) -> None:
    """``codegen``'s retirement, with the lane's switches and stiff attempts."""
    pad = "    " * depth
    w(f"{pad}NSW[LANE[j], 0] = NSWITCH[j]")
    w(f"{pad}NSW[LANE[j], 1] = NSTIFF[j]")
    _write_retire(w, n, code, depth)


def _write_outcome_counted(w: _Writer, desc: Any, layout: KernelLayout) -> None:
    """``codegen``'s outcome, the lane's counters written out when it ends."""
    start = len(w.lines)
    _write_outcome(w, desc, layout, layout.n)
    at = next(i for i in range(start, len(w.lines)) if w.lines[i].strip() == "if code >= 0:")
    indent = w.lines[at][: len(w.lines[at]) - len(w.lines[at].lstrip())] + "    "
    w.lines[at + 1 : at + 1] = [
        f"{indent}NSW[LANE[j], 0] = NSWITCH[j]",
        f"{indent}NSW[LANE[j], 1] = NSTIFF[j]",
    ]


def _write_accept(w: _Writer, desc: AutoSwitchDescription, layout: KernelLayout) -> None:
    """An accepted step: saves by the method that took it, the recorded step, the lane
    advanced (the FSAL derivative from the method that has one)."""
    n = layout.n
    ns, st = desc.nonstiff, desc.stiff
    ns_pad, st_pad = _Padded(ns, desc.rows), _Padded(st, desc.rows)
    w("if NSAVE > 0:")
    w.indent()
    w("if MODE[j] == 0:")
    w.indent()
    _write_explicit_saves(w, ns_pad, layout, n, ns.stages, ns.extra_stages)  # type: ignore[arg-type]
    w.dedent()
    w("else:")
    w.indent()
    _write_stiff_saves(w, st_pad, layout)  # type: ignore[arg-type]
    w.dedent()
    w.dedent()
    if layout.record:
        copy = [f"for m in range({n}):", f"    UREC[nrec, m] = {_row(layout, ns_pad, 'u1')}"]  # type: ignore[arg-type]
        _write_record(w, layout, copy)
    w(f"for m in range({n}):")
    w(f"    U[m, j] = {_row(layout, ns_pad, 'u1')}")  # type: ignore[arg-type]
    w("    if MODE[j] == 0:")
    w(f"        F[m, j] = {_row(layout, ns_pad, 'k', ns.stages - 1)}")  # type: ignore[arg-type]
    if st.fsal:
        w("    else:")
        w(f"        F[m, j] = {_row(layout, st_pad, 'k', st.stages - 1)}")  # type: ignore[arg-type]
    w("T[j] = tn")
    w("NA[j] += 1")
    w("if HIT[j] != 0 and USE[j] != 0:")
    w("    STI[j] += 1")


def _write_switch(w: _Writer, desc: AutoSwitchDescription, layout: KernelLayout) -> None:
    """``AutoSwitch.decide`` for lane ``j``: its vote, its count, and a switch (fresh
    controller memory; back to the explicit method: a stable first step and ``f`` at ``u``)."""
    n = layout.n
    pad = _Padded(desc.nonstiff, desc.rows)
    # The vote thresholds exactly as decide computes them (as floats, then in DT).
    limits = [desc.stiff_tol + (desc.nonstiff_tol - desc.stiff_tol) * x for x in (0.0, 1.0)]
    w(f"rho = {_w(layout, pad, 'k', desc.rows - 1)}")  # type: ignore[arg-type]
    w(f"est = HA[j] * rho / {_const(desc.boundary)}")
    w("if acc and math.isfinite(est):")
    w.indent()
    w(f"limit = {_const(limits[0])} if MODE[j] == 0 else {_const(limits[1])}")
    w("if est > limit:")
    w("    CNT[j] = CNT[j] + 1 if CNT[j] > 0 else 1")
    w("else:")
    w("    CNT[j] = CNT[j] - 1 if CNT[j] < 0 else -1")
    w.dedent()
    w(f"to_stiff = MODE[j] == 0 and CNT[j] >= {desc.stiff_steps}")
    w(f"to_nonstiff = MODE[j] == 1 and CNT[j] <= {-desc.nonstiff_steps}")
    w("if to_stiff or to_nonstiff:")
    w.indent()
    w("CNT[j] = 0")
    w("NSWITCH[j] += 1")
    w("MODE[j] = 1 - MODE[j]")
    w(f"{_w(layout, pad, 'lp1')} = DT(0.0)")  # type: ignore[arg-type]
    w(f"{_w(layout, pad, 'lp2')} = DT(0.0)")  # type: ignore[arg-type]
    w("if to_nonstiff:")
    w.indent()
    w(f"hnext = minimum(hnext, {_const(desc.stiff_tol * desc.boundary)} / rho)")
    if not desc.stiff.fsal:  # the explicit method's FSAL derivative at the lane's state
        w(f"p = {layout.params.replace('COL', 'g')}")
        ys = ", ".join(f"U[{m}, j]" for m in range(n))
        w(f"r = rhs({ys}, p, T[j])")
        for m in range(n):
            w(f"F[{m}, j] = r[{m}]")
        w("NFX[j] += 1")
    w.dedent()
    w.dedent()


def _write_drivers(w: _Writer, layout: KernelLayout) -> None:
    """``codegen``'s drivers, passing ``NSW`` on."""
    args = (
        "U0, P, T0, T1, TS, TSTOPS, ATOL, SCAL, IVALS, SAVED, UEND, TEND, RET, NACC, NREJ, NF, NSW"
    )
    if layout.target == "cuda":
        w(f"def run_lanes({args}):")
        w("    g = cuda.grid(1)")
        w("    if g < U0.shape[1]:")
        w(f"        block(g, U0.shape[1], {args})")
        w()
    else:
        _write_cpu_driver(w, layout, args)
