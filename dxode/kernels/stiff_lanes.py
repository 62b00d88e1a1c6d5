"""The lane-vectorized workspace of the stiff kernels' attempt, and its dense LU.

The stiff attempt (``rosenbrock_codegen``) gathers the active lanes of a block into chunks
of ``width`` lanes and steps a chunk at once: every per-lane quantity (the state, the stages,
the Jacobian, its factors, the pivots) is a row of ``width`` entries, lanes last, in one flat
array ``S``. Every statement runs in a lane loop ``for v in range(nw)`` (``nw`` the chunk's
live lanes, at most ``width``) whose body reads and writes ``S`` at constant offsets only, and
takes no branch on lane data, so the CPU compiler vectorizes it across lanes (offsets that
vary with an outer loop variable keep LLVM from proving the lanes independent).

The factorization is Gaussian elimination with partial pivoting that takes the first largest
pivot (``dxode._lu``'s choice), with the row exchanges as selects: each lane keeps its own
pivot rows, and its arithmetic is that of the scalar elimination, operation for operation.
Up to ``UNROLLED_LU_STATES`` states the factorization and the solves are written out
statement by statement into the attempt's lane loops; past that (their size grows as
``n**3``) they are the functions ``lu_factor(S, nw)``/``lu_solve(S, nw)``, compiled once
and called, with loops over the matrix indices (the same arithmetic, not vectorized).
"""

from __future__ import annotations

from .codegen import _Writer

__all__ = ["UNROLLED_LU_STATES", "Lanes"]

# The largest state whose LU is written out statement by statement (vectorized).
UNROLLED_LU_STATES = 12


class Lanes:
    """Rows of ``width`` lanes in the flat workspace ``S``, and writers of lane loops.

    ``add(name, count)`` reserves ``count`` rows; ``at(name, e)`` is the source of lane
    ``v``'s entry ``e`` of them (``e`` an int, or in the looped LU a source expression).
    The rows ``JM`` (``n * n``, row-major), ``PV`` (the pivot rows, as numbers) and ``G``
    (the right-hand side a solve overwrites) are the LU's.
    """

    def __init__(self, n: int, width: int, unrolled: bool, preamble: list[str]) -> None:
        self.n = n
        self.width = width
        self.unrolled = unrolled
        self.preamble = preamble
        self.offsets: dict[str, int] = {}
        self.size = 0
        for name, count in (("JM", n * n), ("PV", n), ("G", n)):
            self.add(name, count)

    def add(self, name: str, count: int = 1) -> None:
        self.offsets[name] = self.size
        self.size += count

    def at(self, name: str, e: int | str = 0) -> str:
        base = self.offsets[name]
        if isinstance(e, int):
            return f"S[{(base + e) * self.width} + v]"
        return f"S[{base * self.width} + ({e}) * {self.width} + v]"

    def jm(self, r: int | str, c: int | str) -> str:
        if isinstance(r, int) and isinstance(c, int):
            return self.at("JM", r * self.n + c)
        return self.at("JM", f"{r} * {self.n} + {c}")

    def open(self, w: _Writer) -> None:
        """Start a lane loop (with the per-lane locals of ``preamble``)."""
        w("for v in range(nw):")
        w.indent()
        for line in self.preamble:
            w(line)

    def close(self, w: _Writer) -> None:
        w.dedent()

    def factor(self, w: _Writer) -> None:
        """Factor ``JM`` in place, pivots into ``PV`` (inside an open lane loop)."""
        if self.unrolled:
            _write_factor_lines(w, self)
            return
        self.close(w)
        w("lu_factor(S, nw)")
        self.open(w)

    def solve(self, w: _Writer) -> None:
        """Overwrite ``G`` with the solution of ``JM x = G`` (inside an open lane loop)."""
        if self.unrolled:
            _write_solve_lines(w, self)
            return
        self.close(w)
        w("lu_solve(S, nw)")
        self.open(w)

    def write_functions(self, w: _Writer) -> None:
        """``lu_factor``/``lu_solve`` of the looped LU (nothing when it is written out)."""
        if self.unrolled:
            return
        w("def lu_factor(S, nw):")
        w.indent()
        w(f"nw = min({self.width}, nw)")
        w(f"for k in range({self.n}):")
        w.indent()
        w("for v in range(nw):")
        w.indent()
        _write_pivot(w, self, "k", None)
        w.dedent()
        w(f"for i in range(k + 1, {self.n}):")
        w.indent()
        w(f"for c in range({self.n}):")
        w.indent()
        w("for v in range(nw):")
        _write_swap(w, self, "k", "i", "c", "    ")
        w.dedent()
        ik, ic = self.jm("i", "k"), self.jm("i", "c")
        w("for v in range(nw):")
        w(f"    {ik} = {ik} / {self.jm('k', 'k')}")
        w(f"for c in range(k + 1, {self.n}):")
        w("    for v in range(nw):")
        w(f"        {ic} = {ic} - {ik} * {self.jm('k', 'c')}")
        w.dedent()
        w.dedent()
        w.dedent()
        w()
        _write_looped_solve(w, self)


def _write_pivot(w: _Writer, lanes: Lanes, k: int | str, rows: range | None) -> None:
    """``PV[k]``: the first row of the largest ``|JM[i, k]|``, ``i`` from ``k`` on (one lane;
    ``rows`` the rows below ``k`` written out, or ``None``: a loop over them)."""
    w(f"big = abs({lanes.jm(k, k)})")
    w(f"piv = DT({k})")
    if rows is not None:
        for i in rows:
            w(f"a = abs({lanes.jm(i, k)})")
            w("better = a > big")
            w("big = a if better else big")
            w(f"piv = DT({i}) if better else piv")
    else:
        w(f"for i in range(k + 1, {lanes.n}):")
        w(f"    a = abs({lanes.jm('i', k)})")
        w("    better = a > big")
        w("    big = a if better else big")
        w("    piv = DT(i) if better else piv")
    w(f"{lanes.at('PV', k)} = piv")


def _write_swap(
    w: _Writer, lanes: Lanes, k: int | str, i: int | str, c: int | str, pad: str
) -> None:
    """Exchange ``JM[k, c]`` and ``JM[i, c]`` where lane ``v``'s pivot row is ``i``."""
    w(f"{pad}swap = {lanes.at('PV', k)} == DT({i})")
    w(f"{pad}x = {lanes.jm(k, c)}")
    w(f"{pad}y = {lanes.jm(i, c)}")
    w(f"{pad}{lanes.jm(k, c)} = y if swap else x")
    w(f"{pad}{lanes.jm(i, c)} = x if swap else y")


def _write_factor_lines(w: _Writer, lanes: Lanes) -> None:
    """The elimination written out for one lane: pivot search, row exchange, elimination."""
    n = lanes.n
    for k in range(n):
        _write_pivot(w, lanes, k, range(k + 1, n))
        for i in range(k + 1, n):
            for c in range(n):
                _write_swap(w, lanes, k, i, c, "")
        for i in range(k + 1, n):
            w(f"mult = {lanes.jm(i, k)} / {lanes.jm(k, k)}")
            w(f"{lanes.jm(i, k)} = mult")
            for c in range(k + 1, n):
                w(f"{lanes.jm(i, c)} = {lanes.jm(i, c)} - mult * {lanes.jm(k, c)}")


def _write_solve_lines(w: _Writer, lanes: Lanes) -> None:
    """``G <- JM^-1 G`` written out for one lane: the exchanges, then both substitutions."""
    n = lanes.n
    g = [lanes.at("G", m) for m in range(n)]
    for k in range(n - 1):
        for i in range(k + 1, n):
            w(f"swap = {lanes.at('PV', k)} == DT({i})")
            w(f"x = {g[k]}")
            w(f"y = {g[i]}")
            w(f"{g[k]} = y if swap else x")
            w(f"{g[i]} = x if swap else y")
    for k in range(n - 1):
        for i in range(k + 1, n):
            w(f"{g[i]} = {g[i]} - {lanes.jm(i, k)} * {g[k]}")
    for k in range(n - 1, -1, -1):
        w(f"{g[k]} = {g[k]} / {lanes.jm(k, k)}")
        for i in range(k):
            w(f"{g[i]} = {g[i]} - {lanes.jm(i, k)} * {g[k]}")


def _write_looped_solve(w: _Writer, lanes: Lanes) -> None:
    """``lu_solve(S, nw)``: ``_write_solve_lines`` with loops over the matrix indices."""
    n = lanes.n
    gk, gi, ik = lanes.at("G", "k"), lanes.at("G", "i"), lanes.jm("i", "k")
    w("def lu_solve(S, nw):")
    w.indent()
    w(f"nw = min({lanes.width}, nw)")
    w(f"for k in range({n - 1}):")
    w(f"    for i in range(k + 1, {n}):")
    w("        for v in range(nw):")
    w(f"            swap = {lanes.at('PV', 'k')} == DT(i)")
    w(f"            x = {gk}")
    w(f"            y = {gi}")
    w(f"            {gk} = y if swap else x")
    w(f"            {gi} = x if swap else y")
    w(f"for k in range({n - 1}):")
    w(f"    for i in range(k + 1, {n}):")
    w("        for v in range(nw):")
    w(f"            {gi} = {gi} - {ik} * {gk}")
    w(f"for kk in range({n}):")
    w(f"    k = {n - 1} - kk")
    w("    for v in range(nw):")
    w(f"        {gk} = {gk} / {lanes.jm('k', 'k')}")
    w("    for i in range(k):")
    w("        for v in range(nw):")
    w(f"            {gi} = {gi} - {ik} * {gk}")
    w.dedent()
    w()
