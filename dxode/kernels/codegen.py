"""Generate the per-lane integration as Python source, from a ``StepperDescription``.

The source defines undecorated functions; ``compiler`` compiles them with numba for a target:

``maximum, minimum``
    NaN-propagating like ``numpy.maximum``/``minimum`` (so failing lanes fail the same way).
``split_exponent(x)``, ``pow2(n)``
    Exact exponent helpers of the controller's ``log``/``exp`` (``codegen_math``; the CPU
    compiler binds them to bit-level intrinsics).
``rhs(y_0, ..., y_{n-1}, p, t)``
    The user's ``f`` (global ``user_f``) on one lane, its rows cast to the state's dtype.
``attempt(...)``
    One trial step of the block's lanes (stages, error norm), then, in a second lane loop,
    the controller's step factor: both loops vectorize across lanes.
``block(j0, L, U0, P, T0, T1, TS, TSTOPS, ATOL, SCAL, IVALS, SAVED, UEND, TEND, RET, NACC,
NREJ, NF)``
    Integrates lanes ``j0 .. j0 + B - 1`` to their end with the array path's semantics
    (``dxode._integrator``): per-lane steps taken in masked lockstep, stages unrolled. Its
    inner attempt loop runs over the ``B`` lanes of the block with no branches on lane data,
    so the CPU compiler vectorizes it across trajectories. With ``record`` (one-lane blocks)
    it also records every accepted step: on the CPU it returns ``(times, states, count)``
    (growing its buffers), on CUDA it writes lane ``g``'s into ``TRECS[g]``, ``URECS[g]``
    (preallocated, taken last) and its count into ``NRECS[g]``, counting past their
    capacity without writing (the caller reruns such lanes). With callbacks it
    takes the event arrays ``EVTIMES, EVOFF, EVT, EVK, EVUB, EVUA, EVN`` last and runs the
    hooks of ``events_codegen``.
``run_blocks(b0, b1, ...)`` (CPU) / ``run_lanes`` (CUDA)
    The drivers: blocks ``b0 .. b1 - 1`` one after another (``cpu.run_cpu`` gives each of its
    threads a range), or one CUDA thread per lane.

Every constant is cast to the state's dtype (``DT``), so float32 runs in float32 as the array
path does. Sums over stages and state components run in the array path's order.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np

from ..integrator.loop import SLIVER
from . import events_codegen
from .codegen_math import exponent_bounds, write_exp, write_helpers, write_log
from .description import StepperDescription
from .events_codegen import EventLayout

__all__ = ["CALLED", "HELPERS", "KernelLayout", "generate", "pool_constants"]

# Bumped whenever the generated code changes meaning, or what the compiler binds into it
# (part of every cache key).
CODEGEN_VERSION = 35

# Generated functions compiled inline (``HELPERS``; ``user_f`` through ``rhs``, which the CPU
# compiles once and calls) and those compiled once and called (``CALLED``); the compiler
# reads both lists from the module.
HELPERS = ("rhs", "split_exponent", "pow2")
CALLED = ("select", "maximum", "minimum")

# The controller's floor under the error (``PIDController.adapt``'s guard of its powers).
_ERROR_FLOOR = 1e-10

# Outputs of ``block``'s per-lane return codes (``dxode.ReturnCode`` values).
_SUCCESS, _MAXITERS, _DTMIN, _UNSTABLE = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class KernelLayout:
    """Everything fixed at compile time besides the method (the option signature).

    Attributes
    ----------
    n : int
        State components.
    dtype : str
        ``"float32"`` or ``"float64"``.
    params : str
        Source text of one lane's ``p`` in terms of ``P[k, g]`` (``ParamLayout.expression``).
    u_as_array : bool
        Pass ``u`` to ``f`` as a small array instead of a tuple.
    block : int
        Lanes per block (``B``); 1 for CUDA and for recorded single solves.
    target : str
        ``"cpu"`` or ``"cuda"``.
    adaptive : bool
        Adaptive steps (else fixed ``dt``).
    controller : tuple of float
        ``(beta1, beta2, beta3, safety, factor_min, factor_max)``.
    record : bool
        Record every accepted step (one-lane blocks; on CUDA into the per-lane buffers
        ``TRECS, URECS, NRECS`` ``block`` takes last).
    param_rows : int
        Rows of the parameter array ``P``.
    param_dtype : str
        Its dtype.
    error_components : int
        The first components that enter the error norm and the initial step (``0``: all).
        Forward sensitivities ride along uncontrolled, so their steps are those of the plain
        solve (CVODES's ``errconS = false``).
    events : EventLayout, optional
        The callbacks (``events_codegen``); ``None`` without callbacks.
    screen : bool
        The stability check's screen (explicit methods, without callbacks or recording): also
        write each lane's largest accepted ``|h|`` to ``HMAX`` ``(L,)``, and its state and time
        after the accepted steps ``PSTEP[:, g]`` (step counts, ascending, then ``-1``;
        ``(P + 1, L)``) to ``PSTATE`` ``(L, P, n)`` and ``PTIME`` ``(L, P)`` (arguments after
        ``NF``, in that order).
    """

    n: int
    dtype: str
    params: str
    u_as_array: bool
    block: int
    target: str
    adaptive: bool
    controller: tuple[float, float, float, float, float, float]
    record: bool = False
    param_rows: int = 0
    param_dtype: str = "float64"
    error_components: int = 0
    events: EventLayout | None = None
    screen: bool = False


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append("    " * self.depth + line if line else "")

    def indent(self) -> _Writer:
        self.depth += 1
        return self

    def dedent(self) -> None:
        self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _const(x: float) -> str:
    """A dtype-cast literal (exact: ``repr`` round-trips doubles)."""
    if math.isinf(x):
        return "DT(np.inf)" if x > 0 else "DT(-np.inf)"
    return f"DT({float(x)!r})"


_CAST_LITERAL = re.compile(r"\bDT\((-?(?:np\.inf|\d[\d.]*(?:e[+-]?\d+)?))\)")


def pool_constants(source: str) -> str:
    """``source`` with each cast literal ``DT(x)`` replaced by a module constant ``DT_k``
    defined after ``DT`` (the same value and dtype: numba freezes global scalars into the
    code), so numba types one global read per use instead of a call: ~450 calls in a Tsit5
    ensemble kernel, about a tenth of its compile."""
    names: dict[str, str] = {}

    def name(match: re.Match[str]) -> str:
        return names.setdefault(match.group(1), f"DT_{len(names)}")

    head, sep, body = source.partition("\nDT = ")
    dtype_line, _, rest = body.partition("\n")
    rest = _CAST_LITERAL.sub(name, rest)
    pool = "".join(f"{n} = DT({x})\n" for x, n in names.items())
    return f"{head}{sep}{dtype_line}\n{pool}{rest}"


def _combine(base: str | None, h: str, weights: tuple[float, ...], terms: list[str]) -> str:
    """``base + h * (w0*t0 + w1*t1 + ...)`` in the array path's order (``base`` optional)."""
    products = [f"{_const(w)} * {t}" for w, t in zip(weights, terms, strict=False)]
    total = products[0]
    for product in products[1:]:
        total = f"({total} + {product})"
    increment = f"({total}) * {h}"
    return increment if base is None else f"{increment} + {base}"


def _sum_of_squares(values: list[str]) -> str:
    total = f"{values[0]} * {values[0]}"
    for v in values[1:]:
        total = f"({total} + {v} * {v})"
    return total


def generate(desc: StepperDescription, layout: KernelLayout) -> str:
    """The module source for ``desc`` under ``layout`` (deterministic: a cache key)."""
    w = _Writer()
    n, s, e = layout.n, desc.stages, desc.extra_stages
    cuda = layout.target == "cuda"
    w(
        f'"""dxode kernel: {desc.name}, n={n}, {layout.dtype}, target {layout.target} '
        f'(generated; codegen {CODEGEN_VERSION})."""'
    )
    w("import math")
    w("import numpy as np")
    if cuda:
        w("from numba import cuda")
        w(f"from numba import {layout.dtype} as DTN")
        w(f"from numba import {layout.param_dtype} as PDTN")
    w(f"DT = np.{layout.dtype}")
    w("user_f = None  # bound to the compiled user function before compiling")
    w(f"HELPERS = {HELPERS!r}")
    w(f"CALLED = {CALLED!r}")
    w()
    _write_selects(w)
    write_helpers(w, layout.dtype, _ERROR_FLOOR, _exponent_bounds(layout))
    _write_rhs(w, layout)
    if layout.events is not None:
        events_codegen.write_wrappers(w, layout, _PRIMITIVES)
        events_codegen.write_locate_function(w, desc, layout, _PRIMITIVES)
    if _vector_commit(layout):
        _write_vector_attempt_function(w, desc, layout, n, s)
    else:
        _write_attempt_function(w, desc, layout, n, s)
    _write_block(w, desc, layout, n, s, e)
    if cuda:
        _write_cuda_driver(w, layout)
    else:
        _write_cpu_driver(w, layout)
    return w.text()


def _write_selects(w: _Writer) -> None:
    """``maximum``, ``minimum`` and ``select(c, a, b)``: compiled once each and called (in
    numba's IR a call is one block where a conditional expression makes three, and type
    inference and SSA grow with blocks times names); LLVM inlines each as a select."""
    w("def maximum(a, b):")
    w("    return a if (a != a or a >= b) else b")
    w()
    w("def minimum(a, b):")
    w("    return a if (a != a or a <= b) else b")
    w()
    w("def select(c, a, b):")
    w("    return a if c else b")
    w()


def _alloc(layout: KernelLayout, shape: str, kind: str = "DT") -> str:
    """Source allocating a block-local array (``kind``: ``"DT"``, ``"int"`` or ``"P"``, the
    parameters' dtype)."""
    if layout.target == "cuda":
        if kind == "P":
            shape = f"({layout.param_rows}, {layout.block})"
        dtype = {"DT": "DTN", "int": "np.int64", "P": "PDTN"}[kind]
        return f"cuda.local.array({shape}, {dtype})"
    dtype = {"DT": "DT", "int": "np.int64", "P": "P.dtype"}[kind]
    return f"np.empty({shape}, {dtype})"


def _write_rhs(w: _Writer, layout: KernelLayout) -> None:
    n = layout.n
    ys = [f"y{m}" for m in range(n)]
    if layout.target == "cpu":
        w("from dxode.kernels.returned_rows import rows_of  # f's array rows, checked")
        w()
    w(f"def rhs({', '.join(ys)}, p, t):")
    w.indent()
    if layout.u_as_array:
        w(f"u = {_alloc(layout, str(n))}")
        for m in range(n):
            w(f"u[{m}] = y{m}")
        w("r = user_f(u, p, t)")
    else:
        w(f"r = user_f(({''.join(y + ', ' for y in ys)}), p, t)")
    if layout.target == "cpu":
        w(f"r = rows_of(r, {n})")
    w("return (" + "".join(f"DT(r[{m}]), " for m in range(n)) + ")")
    w.dedent()
    w()


def _controlled(layout: KernelLayout) -> int:
    """Components in the error norm and the initial step."""
    return layout.error_components or layout.n


def _rms(values: list[str], n: int) -> str:
    return f"math.sqrt({_sum_of_squares(values)} / DT({n}))"


def _write_block(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int, s: int, e: int
) -> None:
    """The block function: lanes ``j0 .. j0 + B`` from their start to their end."""
    if _vector_commit(layout):
        _write_vector_block(w, desc, layout, n, s, e)
        return
    _write_block_setup(w, desc, layout, n)
    _write_lane_starts(w, desc, layout, n)
    w("it = 0")
    if layout.events is not None:
        events_codegen.write_start(w, layout, _PRIMITIVES)
    w("while nact > 0:")
    w.indent()
    w("if it >= MAXITERS:")
    w(f"    for j in range({layout.block}):")
    w("        if ACT[j] != 0:")
    _write_retire(w, n, str(_MAXITERS), depth=3)
    w("    break")
    w("it += 1")
    _write_step_sizes(w, layout)
    # the attempt: every lane of the block, stages unrolled (the vectorized loop)
    w("attempt(T, HS, PB, U, F, W, TG, HIT, RTOL, ATOL, nlive)")
    w(f"for j in range({layout.block}):")
    w.indent()
    _write_control(w, desc, layout)
    w("if acc:")
    w.indent()
    _write_accept(w, desc, layout, n, s, e)
    w.dedent()
    _write_outcome(w, desc, layout, n)
    w.dedent()
    w.dedent()
    _write_screen_end(w, layout)
    _write_record_end(w, layout)
    w.dedent()
    w()


def _write_block_setup(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int, lane_rows: bool = False
) -> None:
    """The block function's signature, options and per-block work arrays (with
    ``lane_rows``, the float lane state as views of rows of the workspace ``W``:
    ``_lane_slot``)."""
    B = layout.block
    M = range(n)
    w(f"def block(j0, L, {_arrays(layout)}):")
    w.indent()
    w("RTOL = SCAL[0]")
    w("DTV = SCAL[1]")
    w("DTMIN = SCAL[2]")
    w("DTMAX = SCAL[3]")
    w("D = SCAL[4]")
    w("MAXITERS = IVALS[0]")
    w("HAS_DT = IVALS[1] != 0")
    w("HAS_DTMIN = IVALS[2] != 0")
    w("HAS_DTMAX = IVALS[3] != 0")
    w("NSAVE = TS.shape[0] - 1")
    w("NSTOP = TSTOPS.shape[0]")
    w("NFS = 1 if HAS_DT else 2")
    w(f"EVALS = {desc.rhs_per_attempt}")
    for m in M:
        w(f"atol{m} = ATOL[{m}]")
    if lane_rows:
        _write_lane_views(w, desc, layout, n)
    else:
        for name in ("U", "F"):
            w(f"{name} = {_alloc(layout, f'({n}, {B})')}")
        w(f"W = {_alloc(layout, f'({_workspace_rows(desc, n) * B},)')}")
    w(f"PB = {_alloc(layout, f'(P.shape[0], {B})', 'P')}")
    if not lane_rows:
        screen = ("HM", "NP") if layout.screen else ()
        for name in ("T", "H", "TE", "HS", "HA", "TG", *screen):
            w(f"{name} = {_alloc(layout, f'({B},)')}")
    probe_index = ("PI",) if layout.screen else ()
    for name in ("LANE", "ACT", "NA", "SI", "STI", "NFX", "HIT", "USE", *probe_index):
        if not (lane_rows and name in _LANE_ROWS):
            w(f"{name} = {_alloc(layout, f'({B},)', 'int')}")
    if layout.record and layout.target == "cuda":
        w("TREC = TRECS[j0]")
        w("UREC = URECS[j0]")
        w("nrec = 0")
    elif layout.record:
        w("TREC = np.empty(64, DT)")
        w(f"UREC = np.empty((64, {n}), DT)")
        w("nrec = 0")
    w("nact = 0")
    # A one-lane block (a CUDA thread's) is never partial: with a constant count the compiler
    # resolves every lane index to 0, so libNVVM keeps the block's arrays in registers (with
    # min(1, L - j0) they lived in local memory: 33 local loads and stores per attempt, which
    # made the GPU kernel memory-bound).
    w("nlive = 1" if B == 1 else f"nlive = min({B}, L - j0)")


def _write_lane_starts(w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int) -> None:
    """Each lane's start: ``f0``, the first step, the first save, the tstops passed."""
    B = layout.block
    M = range(n)
    w(f"for j in range({B}):")
    w.indent()
    w("g = j0 + j")
    w("live = g < L")
    w("if not live:")
    w("    g = j0")
    w("LANE[j] = g")
    w("t = DT(T0[g])")
    w("T[j] = t")
    w("TE[j] = DT(T1[g])")
    w(f"p = {layout.params.replace('COL', 'g')}")
    w("for k in range(P.shape[0]):")
    w("    PB[k, j] = P[k, g]")
    for m in M:
        w(f"u{m} = U0[{m}, g]")
        w(f"U[{m}, j] = u{m}")
    w(f"{', '.join(f'f{m}' for m in M)}, = rhs({', '.join(f'u{m}' for m in M)}, p, t)")
    for m in M:
        w(f"F[{m}, j] = f{m}")
    w("if HAS_DT:")
    w("    h = DTV")
    w("else:")
    w.indent()
    _write_initial_step(w, desc, n, _controlled(layout))
    w("if HAS_DTMIN:")
    w("    h = maximum(h, DTMIN)")
    w.dedent()
    w("if HAS_DTMAX:")
    w("    h = minimum(h, DTMAX)")
    w("H[j] = h")
    w(f"{_w(layout, desc, 'lp1')} = DT(0.0)")  # the logs of the previous errors, 1 at first
    w(f"{_w(layout, desc, 'lp2')} = DT(0.0)")
    w("NA[j] = 0")
    if layout.screen:
        w("HM[j] = DT(0.0)")
        w("PI[j] = 0")
        w("NP[j] = PSTEP[0, g]")
        w("if NP[j] == 0:")
        w.indent()
        _write_probe(w, n, [f"u{m}" for m in M], "t", "g")
        w.dedent()
    w("NFX[j] = 0")
    w("SI[j] = 0")
    w("if NSAVE > 0 and TS[0, g] == t:")
    w("    SI[j] = 1")
    w("    if live:")
    for m in M:
        w(f"        SAVED[g, 0, {m}] = u{m}")
    w("STI[j] = 0")
    w("for k in range(NSTOP):")
    w("    if D * (TSTOPS[k] - t) <= DT(0.0):")
    w("        STI[j] += 1")
    w("ACT[j] = 1 if live else 0")
    w("nact += ACT[j]")
    w.dedent()
    if layout.record:
        w("TREC[0] = T[0]")
        for m in M:
            w(f"UREC[0, {m}] = U[{m}, 0]")
        w("nrec = 1")


def _write_step_sizes(w: _Writer, layout: KernelLayout) -> None:
    """Step sizes: the controller's proposal, clipped to land on the target."""
    w(f"for j in range({layout.block}):")
    w.indent()
    _write_target(w, store=False)
    w("remaining = D * (target - T[j])")
    w("hprop = abs(H[j]) if ACT[j] != 0 else DT(0.0)")
    _write_representable(w, "T[j]", "hprop", "habs", layout)
    w(f"hit = habs >= remaining * {_const(1.0 - 1e-3)}")
    w("if hit:")
    w("    habs = remaining")
    w("HA[j] = habs")
    w("HS[j] = D * habs")
    w("HIT[j] = 1 if hit else 0")
    w("USE[j] = use")
    w("TG[j] = target")
    w.dedent()


def _write_representable(w: _Writer, t: str, h: str, out: str, layout: KernelLayout) -> None:
    """``out``: the step size ``h`` rounded to how far it moves the lane's time ``t``, at
    least an ulp or two of ``t`` (zero stays zero): the array path's ``_representable`` in
    ``integrator.loop``."""
    eps = _const(float(np.finfo(layout.dtype).eps))
    w(f"moved = abs(({t} + D * {h}) - {t})")
    w(f"least = abs(({t} + D * {eps} * abs({t})) - {t})")
    w(f"{out} = select({h} > DT(0.0), maximum(moved, least), {h})")


def _write_control(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, gate: str = "ACT"
) -> None:
    """Accept or reject lane ``j``'s attempt and propose its next step (the controller);
    lanes whose ``gate[j]`` is zero are skipped."""
    beta2, beta3 = layout.controller[1:3]
    w(f"if {gate}[j] == 0:")
    w("    continue")
    w("g = LANE[j]")
    w("t = T[j]")
    w("hs = HS[j]")
    w(f"tn = {_w(layout, desc, 'tn')}")
    if desc.adaptive and layout.adaptive:
        w(f"err = {_w(layout, desc, 'err')}")
        w("fin = math.isfinite(err)")
        w("acc = err <= DT(1.0)")
        w(f"factor = {_w(layout, desc, 'factor')}")
        if beta2 != 0.0 or beta3 != 0.0:
            w("if acc:")
            w(f"    {_w(layout, desc, 'lp2')} = {_w(layout, desc, 'lp1')}")
            w(f"    {_w(layout, desc, 'lp1')} = {_w(layout, desc, 'lee')}")
        w("hnext = HA[j] * factor")
    else:
        w(f"fin = {_w(layout, desc, 'err')} != DT(0.0)")
        w("acc = fin")
        w("hnext = DTV")
    w("if HAS_DTMAX:")
    w("    hnext = minimum(hnext, DTMAX)")


def _write_accept(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int, s: int, e: int
) -> None:
    """An accepted step: saves it passed, the recorded step, the lane advanced."""
    M = range(n)
    if layout.events is not None:
        events_codegen.write_locate(w, desc, layout, _PRIMITIVES)
    w("if NSAVE > 0:")
    w.indent()
    _write_saves(w, desc, layout, n, s, e)
    w.dedent()
    if layout.record:
        copy = [f"UREC[nrec, {m}] = {_w(layout, desc, 'u1', m=m)}" for m in M]
        _write_record(w, layout, copy)
    for m in M:
        w(f"U[{m}, j] = {_w(layout, desc, 'u1', m=m)}")
        if desc.fsal:
            w(f"F[{m}, j] = {_w(layout, desc, 'k', s - 1, m)}")
    w("T[j] = tn")
    w("NA[j] += 1")
    if layout.screen:
        w("HM[j] = maximum(HM[j], HA[j])")
        w("if NA[j] == NP[j]:")
        w.indent()
        _write_probe(w, n, [f"U[{m}, j]" for m in M], "T[j]", "LANE[j]")
        w.dedent()
    w("if HIT[j] != 0 and USE[j] != 0:")
    w("    STI[j] += 1")
    if layout.events is not None:
        events_codegen.write_apply(w, layout, _PRIMITIVES)


def _write_record(w: _Writer, layout: KernelLayout, copy_state: list[str]) -> None:
    """Append an accepted step to the record (``tn``, and the state by the lines
    ``copy_state`` into ``UREC[nrec, :]``): on the CPU doubling ``TREC``/``UREC`` when they
    are full, on CUDA (fixed buffers) counting the step without writing it."""
    if layout.target == "cuda":
        w("if nrec < TREC.shape[0]:")
        w("    TREC[nrec] = tn")
        for line in copy_state:
            w("    " + line)
        w("nrec += 1")
        return
    w("if nrec == TREC.shape[0]:")
    w("    TREC2 = np.empty(2 * nrec, DT)")
    w(f"    UREC2 = np.empty((2 * nrec, {layout.n}), DT)")
    # element loops, not slice assignment: numba compiles a slice assignment's shape-mismatch
    # error message (string formatting, about 0.5 s of a cold compile)
    w("    for rcopy in range(nrec):")
    w("        TREC2[rcopy] = TREC[rcopy]")
    w(f"        for mcopy in range({layout.n}):")
    w("            UREC2[rcopy, mcopy] = UREC[rcopy, mcopy]")
    w("    TREC = TREC2")
    w("    UREC = UREC2")
    w("TREC[nrec] = tn")
    for line in copy_state:
        w(line)
    w("nrec += 1")


def _write_probe(w: _Writer, n: int, state: list[str], t: str, g: str) -> None:
    """The screen's probe of lane ``j`` (global lane ``g``): its ``state`` and time ``t`` to
    ``PSTATE``/``PTIME``, and the next probe's step count to ``NP``."""
    for m in range(n):
        w(f"PSTATE[{g}, PI[j], {m}] = {state[m]}")
    w(f"PTIME[{g}, PI[j]] = {t}")
    w("PI[j] += 1")
    w(f"NP[j] = PSTEP[PI[j], {g}]")


def _write_screen_end(w: _Writer, layout: KernelLayout) -> None:
    """The end of a ``screen`` block: each lane's largest accepted ``|h|`` to ``HMAX``."""
    if layout.screen:
        w("for j in range(nlive):")
        w("    HMAX[LANE[j]] = HM[j]")


def _write_record_end(w: _Writer, layout: KernelLayout) -> None:
    """The end of a recording ``block``: the record returned (CPU), or its length written
    to ``NRECS`` (CUDA)."""
    if layout.record and layout.target == "cuda":
        w("NRECS[j0] = nrec")
    elif layout.record:
        w("return TREC, UREC, nrec")


def _write_outcome(w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int) -> None:
    """The next step size, and the lane's return code if it ended (success or failure)."""
    eps = float(np.finfo(layout.dtype).eps)
    tiny = float(np.finfo(layout.dtype).smallest_normal)
    adaptive = desc.adaptive and layout.adaptive
    # a step clipped onto a target to a sliver of the lane's proposal (an event's root a few
    # ulps before a tstop) keeps the proposal, as on the array path (``_Loop._control``)
    w(f"if HA[j] < {_const(SLIVER)} * abs(H[j]):")
    w("    hnext = abs(H[j])")
    w("H[j] = hnext")
    w("code = -1")
    w("if acc:")
    w.indent()
    w("if T[j] == TE[j]:")
    w(f"    code = {_SUCCESS}")
    if adaptive:  # a step below dtmin only to land on the target (``_Loop._below_dtmin``)
        w("elif HAS_DTMIN and not (hnext >= DTMIN):")
        w.indent()
        _write_target(w, store=False)
        w("if D * (target - T[j]) <= DTMIN:")
        w("    H[j] = maximum(hnext, DTMIN)")
        w("else:")
        w(f"    code = {_DTMIN}")
        w.dedent()
    w.dedent()
    w("else:")
    w.indent()
    if adaptive:
        w("if HAS_DTMIN:")
        w("    dtmin = DTMIN")
        w("else:")
        w(f"    dtmin = {_const(16 * eps)} * abs(T[j]) + {_const(tiny)}")
        w("if not (hnext >= dtmin):")
        w(f"    code = {_DTMIN} if fin else {_UNSTABLE}")
    else:
        w(f"code = {_UNSTABLE}")
    w.dedent()
    if layout.events is not None:
        events_codegen.write_outcome(w, desc, layout)
    w("if code >= 0:")
    _write_retire(w, n, "code", depth=1)


def _workspace_rows(desc: StepperDescription, n: int) -> int:
    """Rows of the attempt's workspace: stages, the proposed state, error, end time, the
    controller's factor and log error, and the logs of the last two accepted errors."""
    return desc.stages * n + n + 6


def _w(layout: KernelLayout, desc: StepperDescription, what: str, i: int = 0, m: int = 0) -> str:
    """Lane ``j``'s entry of the workspace ``W`` (rows of ``B`` lanes, one flat array).

    Everything the attempt loop writes goes to this one array at offsets that are constant
    multiples of ``B``: the vectorizer then needs no run-time alias checks between outputs
    (with one array per output it gave up: too many pointer pairs to check).
    """
    n, s = layout.n, desc.stages
    if what == "k":
        row = i * n + m
    elif what == "u1":
        row = s * n + m
    else:
        row = s * n + n + ("err", "tn", "factor", "lee", "lp1", "lp2").index(what)
    return f"W[{row * layout.block} + j]"


def _write_retire(w: _Writer, n: int, code: str, depth: int) -> None:
    pad = "    " * depth
    w(f"{pad}g = LANE[j]")
    w(f"{pad}RET[g] = {code}")
    w(f"{pad}TEND[g] = T[j]")
    for m in range(n):
        w(f"{pad}UEND[g, {m}] = U[{m}, j]")
    w(f"{pad}NACC[g] = NA[j]")
    w(f"{pad}NREJ[g] = it - NA[j]")
    w(f"{pad}NF[g] = NFS + EVALS * it + NFX[j]")
    w(f"{pad}ACT[j] = 0")
    w(f"{pad}nact -= 1")


def _write_initial_step(w: _Writer, desc: StepperDescription, n: int, nc: int) -> None:
    """Hairer–Nørsett–Wanner's first step, as ``dxode._norms.initial_step`` computes it,
    from the norms of the first ``nc`` of the ``n`` components."""
    M = range(nc)
    for m in M:
        w(f"sc{m} = atol{m} + RTOL * abs(u{m})")
    w(f"d0 = {_rms([f'(u{m} / sc{m})' for m in M], nc)}")
    w(f"d1 = {_rms([f'(f{m} / sc{m})' for m in M], nc)}")
    w("span = abs(TE[j] - t)")
    w(f"if d0 < {_const(1e-5)} or d1 < {_const(1e-5)}:")
    w(f"    h0 = {_const(1e-6)}")
    w("else:")
    w(f"    h0 = {_const(0.01)} * d0 / d1")
    w("h0 = minimum(h0, span)")
    for m in range(n):
        w(f"v{m} = u{m} + (D * h0) * f{m}")
    ws, vs = (", ".join(f"{x}{m}" for m in range(n)) for x in "wv")
    w(f"{ws}, = rhs({vs}, p, t + D * h0)")
    w(f"d2 = {_rms([f'((w{m} - f{m}) / sc{m})' for m in M], nc)} / h0")
    w("dmax = maximum(d1, d2)")
    w(f"if dmax <= {_const(1e-15)}:")
    w(f"    h1 = maximum({_const(1e-6)}, h0 * {_const(1e-3)})")
    w("else:")
    w(f"    h1 = ({_const(0.01)} / dmax) ** {_const(1.0 / (desc.order + 1))}")
    w(f"h = minimum(minimum({_const(100.0)} * h0, h1), span)")


def _write_attempt_function(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int, s: int
) -> None:
    """``attempt``: one trial step of every lane of a block, outputs into the workspace ``W``.

    A function of its own (not inlined into ``block``): LLVM vectorizes its lane loop, whose
    bound is read at run time so that it is vectorized rather than unrolled. It runs over the
    block's first ``nlive`` lanes: the padding of a last, partial block is skipped.
    """
    _write_attempt_head(w, n)
    _write_attempt(w, desc, layout, n, s)
    w.dedent()
    if desc.adaptive and layout.adaptive:
        # a loop of its own: the stage loop already uses every vector register (measured a
        # little faster than one fused loop)
        w("for j in range(nlive):")
        w.indent()
        _write_factor(w, desc, layout)
        w.dedent()
    w.dedent()
    w()


def _lane_array(name: str, m: int = 0) -> str:
    """Lane ``j``'s entry of the block's lane-state array ``name`` (``U``/``F``: row ``m``)."""
    return f"{name}[{m}, j]" if name in ("U", "F") else f"{name}[j]"


def _write_attempt_head(w: _Writer, n: int) -> None:
    """``attempt``'s signature, its per-component ``atol``, and the open lane loop."""
    w("def attempt(T, HS, PB, U, F, W, TG, HIT, RTOL, ATOL, nlive):")
    w.indent()
    for m in range(n):
        w(f"atol{m} = ATOL[{m}]")
    w("for j in range(nlive):")
    w.indent()


def _write_attempt(
    w: _Writer,
    desc: StepperDescription,
    layout: KernelLayout,
    n: int,
    s: int,
    state: Callable[[str, int], str] = _lane_array,
    norm_apart: bool = False,
) -> None:
    """The body of ``attempt``'s lane loop; ``state(name, m)`` is lane ``j``'s entry of the
    lane state ``name`` (``T``, ``HS``, ``U``, ``F``, ``TG``, ``HIT``). With ``norm_apart``
    the scaled error components go to ``state("Q", m)``, their norm left to the caller (a
    loop of its own: the lane loop then waits for no square root)."""
    M = range(n)
    us = [f"u{m}" for m in M]
    w(f"t = {state('T', 0)}")
    w(f"hs = {state('HS', 0)}")
    w(f"p = {layout.params.replace('P[', 'PB[').replace('COL', 'j')}")
    for m in M:
        w(f"u{m} = {state('U', m)}")
    if desc.fsal:
        for m in M:
            w(f"k0_{m} = {state('F', m)}")
    else:
        w(f"{', '.join(f'k0_{m}' for m in M)}, = rhs({', '.join(us)}, p, t)")
    for i in range(1, s):
        for m in M:
            terms = [f"k{j}_{m}" for j in range(i)]
            w(f"y{i}_{m} = {_combine(f'u{m}', 'hs', desc.a[i], terms)}")
        ys = ", ".join(f"y{i}_{m}" for m in M)
        w(f"{', '.join(f'k{i}_{m}' for m in M)}, = rhs({ys}, p, t + {_const(desc.c[i])} * hs)")
    for m in M:
        if desc.fsal:
            w(f"v{m} = y{s - 1}_{m}")
        else:
            terms = [f"k{j}_{m}" for j in range(s)]
            w(f"v{m} = {_combine(f'u{m}', 'hs', desc.b, terms)}")
        w(f"{_w(layout, desc, 'u1', m=m)} = v{m}")
        for i in range(s):
            w(f"{_w(layout, desc, 'k', i, m)} = k{i}_{m}")
    if desc.adaptive and layout.adaptive:
        nc = _controlled(layout)
        for m in range(nc):
            terms = [f"k{j}_{m}" for j in range(s)]
            w(f"e{m} = {_combine(None, 'hs', desc.b_error, terms)}")
            w(f"q{m} = e{m} / (RTOL * maximum(abs(u{m}), abs(v{m})) + atol{m})")
            if norm_apart:
                w(f"{state('Q', m)} = q{m}")
        if not norm_apart:
            w(f"{_w(layout, desc, 'err')} = {_rms([f'q{m}' for m in range(nc)], nc)}")
    else:
        finite = " and ".join(f"math.isfinite(v{m})" for m in M)
        w(f"{_w(layout, desc, 'err')} = select({finite}, DT(1.0), DT(0.0))")
    # Both sides loaded unconditionally: a conditional load would stop the vectorizer.
    w(f"landing = {state('TG', 0)}")
    w("stepped = t + hs")
    w(f"{_w(layout, desc, 'tn')} = select({state('HIT', 0)} != 0, landing, stepped)")


def _write_factor(w: _Writer, desc: StepperDescription, layout: KernelLayout) -> None:
    """The controller's step factor for lane ``j`` from its error ``err`` (in the lane loop).

    ``safety * e**(-beta1/k) * prev1**(-beta2/k) * prev2**(-beta3/k)``, clipped, as
    ``exp`` of a sum of logs (``codegen_math``: no libm calls, so it vectorizes); a non-finite
    error counts as infinite, and the factor after a rejection is at most ``safety``.
    """
    beta1, beta2, beta3, safety, fmin, fmax = layout.controller
    k_err = (desc.error_order or 0) + 1
    dtype = layout.dtype
    w(f"err = {_w(layout, desc, 'err')}")
    w("ei = select(math.isfinite(err), err, DT(np.inf))")
    w(f"ee = maximum(ei, {_const(_ERROR_FLOOR)})")
    w(f"xl = minimum(ee, {_const(float(np.finfo(dtype).max))})")
    write_log(w, "xl", "lee", dtype)
    y = f"{_const(-beta1 / k_err)} * lee"
    for beta, row in ((beta2, "lp1"), (beta3, "lp2")):
        if beta != 0.0:
            y = f"{y} + {_const(-beta / k_err)} * {_w(layout, desc, row)}"
    w(f"y = {y}")
    write_exp(w, "y", "fe", dtype, _exponent_bounds(layout))
    w(f"fc = minimum(maximum({_const(safety)} * fe, {_const(fmin)}), {_const(fmax)})")
    w(f"factor = select(err <= DT(1.0), fc, minimum(fc, {_const(safety)}))")
    w(f"{_w(layout, desc, 'factor')} = factor")
    w(f"{_w(layout, desc, 'lee')} = lee")


def _exponent_bounds(layout: KernelLayout) -> tuple[float, float]:
    """The clamp of the controller factor's exponent (``codegen_math.exponent_bounds``)."""
    _, _, _, safety, fmin, fmax = layout.controller
    return exponent_bounds(safety, fmin, fmax, layout.dtype)


def _write_saves(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int, s: int, e: int
) -> None:
    """Fill the save points the accepted step passed, from the method's dense output."""
    M = range(n)
    w("while D * (TS[SI[j], g] - tn) <= DT(0.0):")
    w.indent()
    w("ts = TS[SI[j], g]")
    w("theta = (ts - t) / hs")
    w(f"p = {layout.params.replace('COL', 'g')}")
    for m in M:
        w(f"u{m} = U[{m}, j]")
        for i in range(s):
            w(f"k{i}_{m} = {_w(layout, desc, 'k', i, m)}")
    for x in range(e):
        i = s + x
        for m in M:
            terms = [f"k{j}_{m}" for j in range(i)]
            w(f"y{m} = {_combine(f'u{m}', 'hs', desc.a_extra[x], terms)}")
        ys = ", ".join(f"y{m}" for m in M)
        at = f"t + {_const(desc.c_extra[x])} * hs"
        w(f"{', '.join(f'k{i}_{m}' for m in M)}, = rhs({ys}, p, {at})")
    for i, row in enumerate(desc.interpolant):
        w(f"w{i} = {events_codegen.interpolant_weight(row, 'theta')}")
    w("if theta == DT(1.0):")
    for m in M:
        w(f"    SAVED[g, SI[j], {m}] = {_w(layout, desc, 'u1', m=m)}")
    w("else:")
    for m in M:
        terms = [f"k{i}_{m}" for i in range(s + e)]
        weights = [f"w{i}" for i in range(s + e)]
        products = [f"{wt} * {t}" for wt, t in zip(weights, terms, strict=True)]
        total = products[0]
        for product in products[1:]:
            total = f"({total} + {product})"
        w(f"    SAVED[g, SI[j], {m}] = ({total}) * hs + u{m}")
    if e:
        w(f"NFX[j] += {e}")
    w("SI[j] += 1")
    w.dedent()


def _write_cpu_driver(w: _Writer, layout: KernelLayout, args: str | None = None) -> None:
    """``run_blocks(b0, b1, ...)``: blocks ``b0 .. b1 - 1`` one after another, on the calling
    thread (``cpu.run_cpu`` runs one range per thread: numba's ``prange`` region took seconds
    to compile). Its loop runs a copy of ``block``'s body (written above), not a call: called,
    ``block`` was compiled on its own as well, and LLVM optimized and emitted its code twice.
    A recording block (one lane, never run through a driver) returns, so it is called.
    ``args``: the arrays, if not ``_arrays``'."""
    args = _arrays(layout) if args is None else args
    start = w.lines.index(f"def block(j0, L, {args}):") + 1
    end = next((i for i in range(start, len(w.lines)) if w.lines[i][:1] not in ("", " ")), None)
    body = w.lines[start:end]
    while body and not body[-1]:
        body.pop()
    w(f"def run_blocks(b0, b1, {args}):")
    if any(re.search(r"\breturn\b", line) for line in body):
        w("    for b in range(b0, b1):")
        w(f"        block(b * {layout.block}, U0.shape[1], {args})")
    else:
        w("    L = U0.shape[1]")
        w("    for block_index in range(b0, b1):")
        w(f"        j0 = block_index * {layout.block}")
        for line in body:
            w(f"    {line}" if line else "")
    w()


def _write_cuda_driver(w: _Writer, layout: KernelLayout) -> None:
    w(f"def run_lanes({_arrays(layout)}):")
    w("    g = cuda.grid(1)")
    w("    if g < U0.shape[1]:")
    w(f"        block(g, U0.shape[1], {_arrays(layout)})")
    w()


def _arrays(layout: KernelLayout) -> str:
    """The array arguments of ``block`` and the drivers (inputs, outputs, then the screen's
    arrays, the event arrays when there are callbacks, the record buffers of a recording
    CUDA block)."""
    names = "U0, P, T0, T1, TS, TSTOPS, ATOL, SCAL, IVALS, SAVED, UEND, TEND, RET, NACC, NREJ, NF"
    if layout.screen:
        names = f"{names}, HMAX, PSTEP, PSTATE, PTIME"
    if layout.events is not None:
        names = f"{names}, {events_codegen.BLOCK_ARGS}"
    if layout.record and layout.target == "cuda":
        names = f"{names}, TRECS, URECS, NRECS"
    return names


_PRIMITIVES = events_codegen.Primitives(alloc=_alloc, slot=_w, retire=_write_retire, const=_const)


# ---- the CPU block with vectorized bookkeeping --------------------------------------------
#
# Without callbacks or recording, a CPU block keeps its float lane state in rows of the
# workspace ``W`` (``U``, ``T``, ... are views of them), so that loops reading and writing
# the lane state touch one array at constant offsets and vectorize. ``attempt`` also sizes
# the steps, and then commits (``_write_commit``) every lane whose attempt needs nothing else
# (an accepted step that passes no save point, lands on no tstop and does not end the lane,
# or a rejection above ``dtmin``) with branch-free selects; it flags the rest (``SLOW``) for
# the scalar per-lane code of the general block, which handles them exactly as before.
# Each lane's arithmetic is the general block's, so results are bitwise the same.

# The lane-state rows after the attempt's (besides ``U`` and ``F``, ``n`` rows each): the
# integer ones (``HIT``, ``USE``, ``ACT``, ``NA``, ``SLOW``, ``NP``) hold exact small integers;
# ``HM`` and ``NP`` serve the screen's layouts (``KernelLayout.screen``) only.
_LANE_ROWS = ("T", "H", "TE", "TG", "HA", "HS", "HIT", "USE", "ACT", "NA", "NS", "SLOW", "HM", "NP")


def _vector_commit(layout: KernelLayout) -> bool:
    """Whether ``attempt`` commits plain lanes itself (CPU, no callbacks, no recording)."""
    return layout.target == "cpu" and layout.events is None and not layout.record


def _lane_row(desc: StepperDescription, n: int, name: str, m: int = 0) -> int:
    base = _workspace_rows(desc, n)
    if name in ("U", "F", "Q"):
        return base + m + n * ("U", "F", "Q").index(name)
    return base + 3 * n + _LANE_ROWS.index(name)


def _lane_slot(layout: KernelLayout, desc: StepperDescription) -> Callable[[str, int], str]:
    """``state(name, m)``: lane ``j``'s entry of the lane state ``name`` in ``W``."""
    return lambda name, m=0: f"W[{_lane_row(desc, layout.n, name, m) * layout.block} + j]"


def _write_lane_views(w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int) -> None:
    """``W`` with the lane-state rows, and the lane-state arrays as views of them."""
    B = layout.block
    rows = _lane_row(desc, n, _LANE_ROWS[-1]) + 1
    w(f"W = np.zeros({rows * B}, DT)  # zeros: loops may run on padding lanes")
    for name in ("U", "F"):
        start = _lane_row(desc, n, name) * B
        w(f"{name} = W[{start}:{start + n * B}].reshape(({n}, {B}))")
    for name in _LANE_ROWS:
        start = _lane_row(desc, n, name) * B
        w(f"{name} = W[{start}:{start + B}]")


def _write_target(w: _Writer, store: bool = True) -> None:
    """Lane ``j``'s ``target``: its end, or its next tstop before it (then ``use = 1``);
    kept in ``TG``/``USE`` when ``store``."""
    w("target = TE[j]")
    w("use = 0")
    w("if STI[j] < NSTOP:")
    w("    stop = TSTOPS[STI[j]]")
    w("    if D * (stop - target) < DT(0.0):")
    w("        target = stop")
    w("        use = 1")
    if store:
        w("TG[j] = target")
        w("USE[j] = use")


def _write_vector_block(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int, s: int, e: int
) -> None:
    """``block`` for ``_vector_commit`` layouts: the scalar per-lane code runs only for the
    lanes ``attempt`` flagged, and not at all when it flagged none."""
    B = layout.block
    _write_block_setup(w, desc, layout, n, lane_rows=True)
    _write_lane_starts(w, desc, layout, n)
    w(f"for j in range({B}):")
    w.indent()
    _write_target(w)
    w("NS[j] = TS[SI[j], LANE[j]]")
    w.dedent()
    w("it = 0")
    w("while nact > 0:")
    w.indent()
    w("if it >= MAXITERS:")
    w(f"    for j in range({B}):")
    w("        if ACT[j] != 0:")
    _write_retire(w, n, str(_MAXITERS), depth=3)
    w("    break")
    w("it += 1")
    w("if attempt(W, PB, RTOL, ATOL, D, DTV, DTMIN, DTMAX, HAS_DTMIN, HAS_DTMAX, nlive) == 0:")
    w("    continue  # every lane committed")
    w(f"for j in range({B}):")
    w.indent()
    _write_control(w, desc, layout, gate="SLOW")
    w("if acc:")
    w.indent()
    _write_accept(w, desc, layout, n, s, e)
    w("NS[j] = TS[SI[j], g]")
    _write_target(w)
    w.dedent()
    _write_outcome(w, desc, layout, n)
    w.dedent()
    w.dedent()
    _write_screen_end(w, layout)
    w.dedent()
    w()


def _write_vector_attempt_function(
    w: _Writer, desc: StepperDescription, layout: KernelLayout, n: int, s: int
) -> None:
    """``attempt(W, PB, RTOL, ATOL, D, DTV, DTMIN, DTMAX, HAS_DTMIN, HAS_DTMAX, nlive) ->
    nslow``: each lane's step size (the controller's proposal, clipped to land on its
    target), the trial step and the step factor as ``_write_attempt_function``'s, then the
    commit (``_write_commit``); all lane state in ``W``. Returns the flagged lanes' count."""
    st = _lane_slot(layout, desc)
    w("def attempt(W, PB, RTOL, ATOL, D, DTV, DTMIN, DTMAX, HAS_DTMIN, HAS_DTMAX, nlive):")
    w.indent()
    for m in range(n):
        w(f"atol{m} = ATOL[{m}]")
    w("for j in range(nlive):")
    w.indent()
    w(f"remaining = D * ({st('TG')} - {st('T')})")
    w(f"hprop = select({st('ACT')} != DT(0.0), abs({st('H')}), DT(0.0))")
    _write_representable(w, st("T"), "hprop", "hmove", layout)
    w(f"hit = hmove >= remaining * {_const(1.0 - 1e-3)}")
    w("habs = select(hit, remaining, hmove)")
    w(f"{st('HA')} = habs")
    w(f"{st('HS')} = D * habs")
    w(f"{st('HIT')} = select(hit, DT(1.0), DT(0.0))")
    adaptive = desc.adaptive and layout.adaptive
    _write_attempt(w, desc, layout, n, s, state=st, norm_apart=adaptive)
    w.dedent()
    # The error norm and the step factor: long dependency chains (a square root, a
    # division, log, exp), so the loop runs COPIES interleaved copies, on lanes j,
    # j + B / COPIES, ...: independent chains for the out-of-order core (the commit in the
    # same loop stopped the vectorizer).
    if adaptive:
        body = _Writer()
        nc = _controlled(layout)
        body(f"{_w(layout, desc, 'err')} = {_rms([st('Q', m) for m in range(nc)], nc)}")
        _write_factor(body, desc, layout)
        copies = _COPIES if layout.block % _COPIES == 0 else 1
        w(f"for j in range(min(nlive, {layout.block // copies})):")
        w.indent()
        _write_interleaved(w, body.lines, copies, layout.block // copies)
        w.dedent()
    w("nslow = 0")
    w("for j in range(nlive):")
    w.indent()
    _write_commit(w, desc, layout)
    w("nslow += select(slow, 1, 0)")
    w.dedent()
    w("return nslow")
    w.dedent()
    w()


_COPIES = 4


def _write_interleaved(w: _Writer, body: list[str], copies: int, stride: int) -> None:
    """The straight-line lane-loop ``body`` (lane ``j``) for lanes ``j + c * stride``,
    ``c < copies``, statement by statement, each copy's locals renamed."""
    names: set[str] = set()
    for line in body:
        lhs = re.match(r"\s*([A-Za-z_][\w, ]*?)\s*=[^=]", line)
        if lhs:
            names.update(x.strip() for x in lhs.group(1).split(",") if x.strip())
    local = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
    for line in body:
        for c in range(copies):
            renamed = local.sub(lambda m, c=c: f"{m.group(1)}_c{c}", line)
            w(renamed.replace(" + j]", f" + j + {c * stride}]"))


def _write_commit(w: _Writer, desc: StepperDescription, layout: KernelLayout) -> None:
    """Lane ``j``'s commit (in ``attempt``'s second loop): what the scalar control, accept
    and outcome code does for a lane with nothing else to do, as selects; any other live
    lane is flagged ``slow`` and ``SLOW`` (and left as it was)."""
    n, st = layout.n, _lane_slot(layout, desc)
    beta2, beta3 = layout.controller[1:3]
    eps = float(np.finfo(layout.dtype).eps)
    tiny = float(np.finfo(layout.dtype).smallest_normal)
    adaptive = desc.adaptive and layout.adaptive
    w(f"act = {st('ACT')} != DT(0.0)")
    w(f"err = {_w(layout, desc, 'err')}")
    w(f"tn = {_w(layout, desc, 'tn')}")
    w(f"t = {st('T')}")
    if adaptive:
        w("acc = err <= DT(1.0)")
        w(f"hprop = {st('HA')} * {_w(layout, desc, 'factor')}")
    else:
        w("acc = err != DT(0.0)")
        w("hprop = DTV")
    w("hnext = select(HAS_DTMAX, minimum(hprop, DTMAX), hprop)")
    if adaptive:  # a rejection that keeps the lane going (else the outcome code ends it)
        w(f"dtmin = select(HAS_DTMIN, DTMIN, {_const(16 * eps)} * abs(t) + {_const(tiny)})")
        w("goes = (acc ^ True) & (hnext >= dtmin)")
    else:
        w("goes = False")
    # an accepted step that passes no save point, lands on no tstop, ends nothing and
    # proposes no step below a user's dtmin
    w(f"passes = (D * ({st('NS')} - tn) > DT(0.0)) & (tn != {st('TE')})")
    if adaptive:
        w("passes = passes & ((hnext >= DTMIN) | (HAS_DTMIN ^ True))")
    w(f"plain = passes & (({st('HIT')} == DT(0.0)) | ({st('USE')} == DT(0.0)))")
    if layout.screen:  # a step the screen probes the state after
        w(f"plain = plain & ({st('NA')} + DT(1.0) != {st('NP')})")
    w("fast = act & ((acc & plain) | goes)")
    w("a = fast & acc")
    if adaptive and (beta2 != 0.0 or beta3 != 0.0):
        lp1, lp2, lee = (_w(layout, desc, x) for x in ("lp1", "lp2", "lee"))
        w(f"l1 = {lp1}")
        w(f"{lp2} = select(a, l1, {lp2})")
        w(f"{lp1} = select(a, {lee}, l1)")
    for m in range(n):
        w(f"{st('U', m)} = select(a, {_w(layout, desc, 'u1', m=m)}, {st('U', m)})")
        if desc.fsal:
            last = _w(layout, desc, "k", desc.stages - 1, m)
            w(f"{st('F', m)} = select(a, {last}, {st('F', m)})")
    w(f"{st('T')} = select(a, tn, t)")
    w(f"{st('NA')} = select(a, {st('NA')} + DT(1.0), {st('NA')})")
    if layout.screen:
        w(f"{st('HM')} = select(a, maximum({st('HM')}, {st('HA')}), {st('HM')})")
    w(f"{st('H')} = select(fast, hnext, {st('H')})")
    w("slow = act & (fast ^ True)")
    w(f"{st('SLOW')} = select(slow, DT(1.0), DT(0.0))")
