"""The forward-sensitivity ODE of ``f`` as a right-hand side the kernel generator takes.

``augmented_rhs`` writes (and imports) a small module defining ``f_aug(y, p, t)`` for the
augmented state ``y = [u, S_1, ..., S_D]`` (``n (1 + D)`` components): ``f(u, p, t)`` and,
for each direction ``d``, ``S_d' = (df/du) S_d (+ df/dp_r)``. The derivatives are computed
inside the compiled code, without autograd: by complex step (``complex_step``), one complex
evaluation of ``f`` per direction, or from the problem's ``jac`` and ``paramjac``. Direction
``d`` is either ``u0`` component ``j`` (``S_d(t0) = e_j``) or parameter row ``r`` of the
kernel's parameter array (``S_d(t0) = 0``).

``f_aug`` is an ordinary user function to ``compiler``: it is compiled, cached and run like
any ``f``. The helpers it calls are numba ``register_jitable`` functions, which compile for
the CPU and for CUDA alike.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from .compiler import _import, _write_source
from .complex_step import STEP, check_compiles, complex_copy
from .rhs_source import ParamLayout, function_key, numba_ready, where_defined

__all__ = ["augmented_rhs", "param_paths"]


class _RowsToTuples(ast.NodeTransformer):
    """List literals (a Jacobian's rows) become tuples: numba keeps tuples in registers."""

    def visit_List(self, node: ast.List) -> Any:
        self.generic_visit(node)
        return ast.copy_location(ast.Tuple(elts=node.elts, ctx=ast.Load()), node)


_MODULES: dict[str, Any] = {}


def check_jacobian_rows(static: Any, n: int, as_array: bool, p_example: Any, columns: int) -> None:
    """Refuse a ``jac`` that is not ``n`` rows of ``n`` entries or a ``paramjac`` that is not
    ``n`` rows of ``columns`` (one per scalar of ``p``), from one call in Python on example
    values (the array path refuses them too): compiled, the kernels index ``J[i][k]``, so
    a short row failed inside numba with an error about ``f`` or the generated source, and
    extra columns were read silently as the first ones. A call that raises is left to
    numba."""
    u = np.full(n, 0.5) if as_array else (0.5,) * n
    for name, fn, cols, what in (
        ("jac", getattr(static, "jac", None), n, "df/du"),
        ("paramjac", getattr(static, "paramjac", None), columns, "df/dp"),
    ):
        if fn is None:
            continue
        try:
            value = fn(u, p_example, 0.0)
            lengths = [len(row) for row in value]
        except Exception:  # numba reports what it cannot compile
            continue
        if len(lengths) != n or any(length != cols for length in lengths):
            extra = f", one column per scalar of p ({cols})" if name == "paramjac" else ""
            raise ValueError(
                f"{name}(u, p, t) defined at {where_defined(fn)} returned rows of "
                f"{lengths} entries; for a state of {n} components it must return {what} as "
                f"{n} rows of {cols} entries each (row i holds the derivatives of f_i{extra})"
            )


def param_paths(structure: Any, prefix: str = "p") -> list[str]:
    """Source text of each scalar of one lane's ``p``, in parameter-row order."""
    if isinstance(structure, tuple):
        return [
            path for i, item in enumerate(structure) for path in param_paths(item, f"{prefix}[{i}]")
        ]
    if structure == 0:
        return [prefix]
    return [f"{prefix}[{k}]" for k in range(structure)]


def complex_rows(structure: Any, stepped: Collection[int]) -> set[int]:
    """The parameter rows of the leaves of ``p`` that hold a row of ``stepped``: the rows the
    complex copy of ``f`` takes as complex numbers."""
    counter = iter(range(len(param_paths(structure))))
    found: set[int] = set()

    def visit(item: Any) -> None:
        if isinstance(item, tuple):
            for x in item:
                visit(x)
            return
        rows = [next(counter) for _ in range(max(item, 1))]
        if any(k in stepped for k in rows):
            found.update(rows)

    visit(structure)
    return found


def _complex_params(structure: Any, paths: list[str], row: int, stepped: Collection[int]) -> str:
    """One lane's ``p`` with parameter row ``row`` stepped by ``i STEP``: the leaves holding a
    row of ``stepped`` (the differentiated ones) as complex numbers, the others as they are,
    so that a leaf ``f`` uses as an integer (``range(p[1])``) or compares is not complex."""
    counter = iter(range(len(paths)))
    as_complex = complex_rows(structure, stepped)

    def build(item: Any) -> str:
        if isinstance(item, tuple):
            return "(" + "".join(f"{build(x)}, " for x in item) + ")"
        rows = [next(counter) for _ in range(max(item, 1))]
        texts = [
            f"complex({paths[k]}, {'H' if k == row else '0.0'})" if k in as_complex else paths[k]
            for k in rows
        ]
        return texts[0] if item == 0 else "(" + "".join(f"{x}, " for x in texts) + ")"

    return build(structure)


def _source(
    n: int,
    layout: ParamLayout,
    rows: list[int | None],
    as_array: bool,
    dtype: str,
    jacobians: bool,
    keys: str,
    target: str,
) -> str:
    """``f_aug``'s module source (on the CPU, what the user's functions return passes
    through ``returned_rows.rows_of``: an array short of rows is refused, not read past)."""
    D = len(rows)
    paths = [] if layout.is_none else param_paths(layout.structure)
    stepped = {row for row in rows if row is not None}
    lines = [
        f'"""dxode forward sensitivities: n={n}, {D} directions (generated)."""',
        "import numpy as np",
        f"H = {STEP!r}",
        "user_real = user_cplx = user_jac = user_pjac = None  # bound after import",
        *(["from dxode.kernels.returned_rows import rows_of"] if target == "cpu" else []),
        f"# {keys}",
        "",
        "def f_aug(y, p, t):",
    ]
    body = lines.append

    def state(values: list[str], kind: str) -> str:
        if not as_array:
            return "(" + "".join(f"{v}, " for v in values) + ")"
        name = f"a{len(lines)}"
        body(f"    {name} = np.empty({n}, np.{kind})")
        for m, v in enumerate(values):
            body(f"    {name}[{m}] = {v}")
        return name

    body(f"    u = {state([f'y[{m}]' for m in range(n)], dtype)}")

    def checked(name: str) -> None:
        if target == "cpu":
            body(f"    {name} = rows_of({name}, {n})")

    body("    r = user_real(u, p, t)")
    checked("r")
    out = [f"r[{m}]" for m in range(n)]
    if jacobians:
        body("    J = user_jac(u, p, t)")
        checked("J")
        if any(r is not None for r in rows):
            body("    PJ = user_pjac(u, p, t)")
            checked("PJ")
    for d, row in enumerate(rows):
        s = [f"y[{n * (1 + d) + k}]" for k in range(n)]
        if jacobians:
            for m in range(n):
                total = f"J[{m}][0] * {s[0]}"
                for k in range(1, n):
                    total = f"({total} + J[{m}][{k}] * {s[k]})"
                out.append(total if row is None else f"({total} + PJ[{m}][{row}])")
            continue
        z = state([f"complex(y[{m}], H * {s[m]})" for m in range(n)], "complex128")
        pc = "p" if row is None else _complex_params(layout.structure, paths, row, stepped)
        body(f"    c{d} = user_cplx({z}, {pc}, t)")
        checked(f"c{d}")
        out += [f"c{d}[{m}].imag / H" for m in range(n)]
    body("    return (" + "".join(f"{x}, " for x in out) + ")")
    return "\n".join(lines) + "\n"


def augmented_rhs(
    f: Callable[..., Any],
    n: int,
    layout: ParamLayout,
    rows: list[int | None],
    as_array: bool,
    dtype: str,
    p_example: Any,
    jac: Callable[..., Any] | None = None,
    paramjac: Callable[..., Any] | None = None,
    target: str = "cpu",
) -> Callable[..., Any]:
    """``f_aug(y, p, t)``: ``f`` and its forward sensitivities in the directions ``rows``
    (``None``: a ``u0`` component, in order; an int: that parameter row); ``p_example``
    is one lane's ``p`` (for type checks).

    ``jac`` and ``paramjac`` (both per lane: ``u`` as ``f`` takes it, ``(n, n)`` and
    ``(n, rows)`` results indexable as ``J[i][k]``) replace complex step when given (``jac``
    alone does when only ``u0`` is differentiated). ``target`` is the kernel's.
    """
    from numba.extending import register_jitable

    params_needed = any(r is not None for r in rows)
    jacobians = jac is not None and (paramjac is not None or not params_needed)
    keys = " ".join(
        [f"f={function_key(f)}@{where_defined(f)}"]
        + ([f"jac={function_key(jac)}"] if jacobians else [])  # type: ignore[arg-type]
        + ([f"paramjac={function_key(paramjac)}"] if jacobians and params_needed else [])  # type: ignore[arg-type]
    )
    source = _source(n, layout, rows, as_array, dtype, jacobians, keys, target)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    module = _MODULES.get(digest)
    if module is None:
        path = _write_source(source, f"dxode_sensitivity_{digest}.py")
        module = _import(path, f"_dxode_sensitivity_{digest}")
        module.user_real = register_jitable(numba_ready(f))
        if jacobians:
            module.user_jac = register_jitable(numba_ready(jac, _RowsToTuples()))  # type: ignore[arg-type]
            if params_needed:
                module.user_pjac = register_jitable(numba_ready(paramjac, _RowsToTuples()))  # type: ignore[arg-type]
        else:
            copy = complex_copy(f)
            stepped = {row for row in rows if row is not None}
            as_complex = set() if layout.is_none else complex_rows(layout.structure, stepped)
            check_compiles(copy, f, n, as_array, p_example, as_complex)
            module.user_cplx = register_jitable(copy)
        module.f_aug.user_function = f  # what CompiledKernel.call's messages name
        _MODULES[digest] = module
    return module.f_aug
