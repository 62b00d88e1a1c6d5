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
The factorization and the solve are the functions ``lu_factor(S, nw)``/``lu_solve(S, nw)``,
compiled once and called: up to ``UNROLLED_LU_STATES`` states written out statement by
statement in one lane loop (vectorized), past that (the written-out factorization grows as
``n**3``, and its compile time with it) with loops over the matrix indices (the same
arithmetic, not vectorized).
"""

from __future__ import annotations

from .codegen import _Writer

__all__ = ["UNROLLED_LU_STATES", "Lanes"]

# The largest state whose LU is written out statement by statement (vectorized; at n = 8 the
# written-out factorization took 26 s to compile against 14 s looped, on a busy 2-core VM).
UNROLLED_LU_STATES = 6


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
        self.names = 0
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

    def fresh(self, base: str) -> str:
        """A local name not used before in the generated module."""
        self.names += 1
        return f"{base}_{self.names}"

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
        """Factor ``JM`` in place, pivots into ``PV`` (between lane loops)."""
        w("lu_factor(S, nw)")

    def solve(self, w: _Writer) -> None:
        """Overwrite ``G`` with the solution of ``JM x = G`` (inside an open lane loop: it is
        closed for the call and opened again)."""
        self.close(w)
        w("lu_solve(S, nw)")
        self.open(w)

    def write_functions(self, w: _Writer) -> None:
        """``lu_factor(S, nw)``/``lu_solve(S, nw)``: written out in one lane loop each, or
        with loops over the matrix indices past ``UNROLLED_LU_STATES``."""
        if not self.unrolled:
            _write_looped_factor(w, self)
            _write_looped_solve(w, self)
            return
        for name, body in (("lu_factor", _write_factor_lines), ("lu_solve", _write_solve_lines)):
            w(f"def {name}(S, nw):")
            w.indent()
            w(f"nw = min({self.width}, nw)")
            w("for v in range(nw):")
            w.indent()
            body(w, self)
            w.dedent()
            w.dedent()
            w()


def _write_looped_factor(w: _Writer, lanes: Lanes) -> None:
    """``lu_factor(S, nw)``: ``_write_factor_lines`` with loops over the matrix indices."""
    n = lanes.n
    w("def lu_factor(S, nw):")
    w.indent()
    w(f"nw = min({lanes.width}, nw)")
    w(f"for k in range({n}):")
    w.indent()
    w("for v in range(nw):")
    w.indent()
    _write_pivot(w, lanes, "k", None)
    w.dedent()
    w(f"for i in range(k + 1, {n}):")
    w.indent()
    w(f"for c in range({n}):")
    w.indent()
    w("for v in range(nw):")
    w.indent()
    _write_swap(w, lanes, "k", "i", "c")
    w.dedent()
    w.dedent()
    ik, ic = lanes.jm("i", "k"), lanes.jm("i", "c")
    w("for v in range(nw):")
    w(f"    {ik} = {ik} / {lanes.jm('k', 'k')}")
    w(f"for c in range(k + 1, {n}):")
    w("    for v in range(nw):")
    w(f"        {ic} = {ic} - {ik} * {lanes.jm('k', 'c')}")
    w.dedent()
    w.dedent()
    w.dedent()
    w()


def _write_pivot(w: _Writer, lanes: Lanes, k: int | str, rows: range | None) -> None:
    """``PV[k]``: the first row of the largest ``|JM[i, k]|``, ``i`` from ``k`` on (one lane;
    ``rows`` the rows below ``k`` written out, or ``None``: a loop over them)."""
    big, piv = lanes.fresh("big"), lanes.fresh("piv")
    w(f"{big} = abs({lanes.jm(k, k)})")
    w(f"{piv} = DT({k})")
    if rows is not None:
        for i in rows:
            a, better = lanes.fresh("a"), lanes.fresh("better")
            w(f"{a} = abs({lanes.jm(i, k)})")
            w(f"{better} = {a} > {big}")
            big2, piv2 = lanes.fresh("big"), lanes.fresh("piv")
            w(f"{big2} = select({better}, {a}, {big})")
            w(f"{piv2} = select({better}, DT({i}), {piv})")
            big, piv = big2, piv2
    else:
        w(f"for i in range(k + 1, {lanes.n}):")
        w(f"    a = abs({lanes.jm('i', k)})")
        w(f"    better = a > {big}")
        w(f"    {big} = select(better, a, {big})")
        w(f"    {piv} = select(better, DT(i), {piv})")
    w(f"{lanes.at('PV', k)} = {piv}")


def _write_swap(w: _Writer, lanes: Lanes, k: int | str, i: int | str, c: int | str) -> None:
    """Exchange ``JM[k, c]`` and ``JM[i, c]`` where lane ``v``'s pivot row is ``i``."""
    _write_exchange(w, lanes, lanes.at("PV", k), i, lanes.jm(k, c), lanes.jm(i, c))


def _write_exchange(w: _Writer, lanes: Lanes, pivot: str, i: int | str, a: str, b: str) -> None:
    """Exchange the entries ``a`` and ``b`` where ``pivot`` is ``i`` (fresh names: numba's
    SSA pass slows down with every redefinition of a name in one long block)."""
    swap, x, y = lanes.fresh("swap"), lanes.fresh("x"), lanes.fresh("y")
    w(f"{swap} = {pivot} == DT({i})")
    w(f"{x} = {a}")
    w(f"{y} = {b}")
    w(f"{a} = select({swap}, {y}, {x})")
    w(f"{b} = select({swap}, {x}, {y})")


def _write_factor_lines(w: _Writer, lanes: Lanes) -> None:
    """The elimination written out for one lane: pivot search, row exchange, elimination."""
    n = lanes.n
    for k in range(n):
        _write_pivot(w, lanes, k, range(k + 1, n))
        for i in range(k + 1, n):
            for c in range(n):
                _write_swap(w, lanes, k, i, c)
        for i in range(k + 1, n):
            mult = lanes.fresh("mult")
            w(f"{mult} = {lanes.jm(i, k)} / {lanes.jm(k, k)}")
            w(f"{lanes.jm(i, k)} = {mult}")
            for c in range(k + 1, n):
                w(f"{lanes.jm(i, c)} = {lanes.jm(i, c)} - {mult} * {lanes.jm(k, c)}")


def _write_solve_lines(w: _Writer, lanes: Lanes) -> None:
    """``G <- JM^-1 G`` written out for one lane: the exchanges, then both substitutions."""
    n = lanes.n
    g = [lanes.at("G", m) for m in range(n)]
    for k in range(n - 1):
        for i in range(k + 1, n):
            _write_exchange(w, lanes, lanes.at("PV", k), i, g[k], g[i])
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
    w.indent().indent().indent()
    _write_exchange(w, lanes, lanes.at("PV", "k"), "i", gk, gi)
    w.dedent()
    w.dedent()
    w.dedent()
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
