"""The kernel discrete adjoint's parameter cotangent: one pass over the whole stage record.

The backward sweep (``adjoint_sweep``) leaves every stage's input ``y_i``, time ``t_i``,
value ``k_i`` and cotangent ``k̄_i`` of every step of every lane. The parameter cotangent is
linear in the ``k̄_i``: ``p̄ = Σ_i (∂f/∂p (y_i, t_i))ᵀ k̄_i`` per lane, summed over the lanes
for parameters they share. It is computed, in this order of preference:

1. from the problem's ``paramjac`` (compiled, one call per stage);
2. by ONE reverse-mode VJP of ``f`` traced by autograd over all the stages at once as
   columns ``(n, N)`` (per-lane parameters indexed per column; chunks of ``CHUNK`` columns)
   — its cost does not grow with the number of parameters. ``f`` is traced as a copy whose
   ``math`` and NumPy functions are autograd's (``math.tanh`` and ``np.tanh`` become
   ``autograd.numpy.tanh``), so kernel-style ``f`` qualifies. Used where that copy traces
   over columns and its values there agree with the compiled ``k_i`` (an ``f`` that is not
   written elementwise, such as one summing over ``u``, would mix the columns: it is then
   not used);
3. otherwise by complex step, one complex evaluation of ``f`` per parameter and stage
   (compiled).

Rows: the kernel's parameter array rows (``ParamLayout``), those of differentiated leaves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _pytree
from .codegen import CODEGEN_VERSION
from .compiler import _import, _write_source
from .complex_step import STEP, check_compiles, complex_copy
from .rhs_source import ParamLayout, function_key, numba_ready, where_defined
from .sensitivity_rhs import _complex_params, _RowsToTuples, complex_rows, param_paths

__all__ = ["autograd_rows", "compiled_rows"]

CHUNK = 200_000  # stage columns per traced VJP (bounds the trace's memory)
_MODULES: dict[str, Any] = {}


def autograd_rows(
    static: Any,
    leaves: list[Any],
    record: dict[str, np.ndarray],
    n_lanes: int,
) -> list[np.ndarray] | None:
    """Cotangents of the differentiated leaves, each ``(*leaf lane shape, L)`` per lane,
    from VJPs of ``f`` traced over the record's columns; ``None`` where ``f`` does not trace
    over columns or gives other values there than the compiled ``f``."""
    from .._traced_rhs import TracedRHS

    f = traceable_copy(static.f)
    rhs = TracedRHS(f, static.p_template, static.lane_leaf, static.diff_leaf, False)
    diff = [i for i, d in enumerate(static.diff_leaf) if d]
    out = [np.zeros((*_lane_shape(leaves[i], static.lane_leaf[i]), n_lanes)) for i in diff]
    ys, ts, kb, ks, lane = (record[k] for k in ("y", "t", "kbar", "k", "lane"))
    for start in range(0, ts.shape[0], CHUNK):
        part = slice(start, start + CHUNK)
        columns = [
            np.asarray(leaf, dtype=np.float64)[..., lane[part]] if per_lane else leaf
            for leaf, per_lane in zip(leaves, static.lane_leaf, strict=True)
        ]
        try:
            value, pull = rhs.pullback(ys[part].T, ts[part], columns)
        except Exception:
            return None
        value = np.reshape(np.asarray(value), ks[part].T.shape)
        scale = np.max(np.abs(ks[part]), initial=1.0)
        if not np.max(np.abs(value - ks[part].T), initial=0.0) <= 1e-10 * scale:
            return None
        _, bars = pull(kb[part].T)
        for j, i in enumerate(diff):
            bar = np.asarray(bars[j], dtype=np.float64)
            if static.lane_leaf[i]:
                rows = bar.reshape(-1, bar.shape[-1])
                flat = out[j].reshape(-1, n_lanes)
                for r in range(rows.shape[0]):
                    flat[r] += np.bincount(lane[part], weights=rows[r], minlength=n_lanes)
            else:  # shared: its sum over the chunk, carried by lane 0
                out[j].reshape(-1, n_lanes)[:, 0] += bar.reshape(-1)
    return out


def traceable_copy(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with the ``math`` and NumPy functions it names (as modules, or imported by
    name) replaced by ``autograd.numpy``'s of the same name, so that autograd traces it."""
    import math
    import types

    import autograd.numpy as anp

    code = getattr(f, "__code__", None)
    if code is None:
        return f
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions and comprehensions
        if isinstance(const, types.CodeType):
            names |= set(const.co_names)
    namespace = dict(f.__globals__)
    for name in names & set(namespace):
        value = namespace[name]
        if value is math:
            namespace[name] = _AutogradMath()
        elif value is np:
            namespace[name] = anp
        elif callable(value) and getattr(value, "__module__", "") in ("math", "numpy"):
            namespace[name] = getattr(anp, _ANP_NAMES.get(value.__name__, value.__name__), value)
    return types.FunctionType(code, namespace, f.__name__, f.__defaults__, f.__closure__)


_ANP_NAMES = {
    "asin": "arcsin",
    "acos": "arccos",
    "atan": "arctan",
    "asinh": "arcsinh",
    "acosh": "arccosh",
    "atanh": "arctanh",
    "pow": "power",
}


class _AutogradMath:
    """``math`` with its functions taken from ``autograd.numpy`` (constants kept)."""

    def __getattr__(self, name: str) -> Any:
        import math

        import autograd.numpy as anp

        value = getattr(math, name)
        return getattr(anp, _ANP_NAMES.get(name, name), value) if callable(value) else value


def _lane_shape(leaf: Any, per_lane: bool) -> tuple[int, ...]:
    shape = np.shape(leaf)
    return tuple(shape[:-1]) if per_lane else tuple(shape)


def compiled_rows(
    f: Callable[..., Any],
    n: int,
    as_array: bool,
    layout: ParamLayout,
    rows: list[int],
    params: np.ndarray,
    record: dict[str, np.ndarray],
    paramjac: Callable[..., Any] | None = None,
) -> np.ndarray:
    """``(len(rows), L)``: each lane's cotangent of parameter rows ``rows``, from the
    problem's ``paramjac`` (``PJ[i][r]``) or by complex step, compiled."""
    example = None if layout.is_none else eval(layout.expression("0"), {"P": params[:, :1]})
    module = _module(f, n, as_array, layout, rows, paramjac, example)
    out = np.zeros((len(rows), params.shape[1]))
    module.pbar(record["y"], record["t"], record["kbar"], record["lane"], params, out)
    return out


def _source(
    n: int, as_array: bool, layout: ParamLayout, rows: list[int], jacobian: bool, keys: str
) -> str:
    paths = param_paths(layout.structure)
    lines = [
        f'"""dxode kernel adjoint parameter rows: n={n}, {len(rows)} rows '
        f'(generated; codegen {CODEGEN_VERSION})."""',
        "import numpy as np",
        f"H = {STEP!r}",
        "user_cplx = user_pjac = None  # bound after import",
        f"# {keys}",
        "",
        "def pbar(YS, TS, KB, LANE, P, OUT):",
        "    for e in range(TS.shape[0]):",
        "        g = LANE[e]",
        f"        p = {layout.expression('g')}",
        "        t = TS[e]",
    ]

    def state(values: list[str], kind: str) -> str:
        if not as_array:
            return "(" + "".join(f"{v}, " for v in values) + ")"
        lines.append(f"        z = np.empty({n}, np.{kind})")
        lines.extend(f"        z[{m}] = {v}" for m, v in enumerate(values))
        return "z"

    if jacobian:
        u = state([f"YS[e, {m}]" for m in range(n)], "float64")
        lines.append(f"        PJ = user_pjac({u}, p, t)")
    for d, row in enumerate(rows):
        if jacobian:
            terms = " + ".join(f"PJ[{m}][{row}] * KB[e, {m}]" for m in range(n))
        else:
            u = state([f"complex(YS[e, {m}], 0.0)" for m in range(n)], "complex128")
            pc = _complex_params(layout.structure, paths, row, rows)
            lines.append(f"        c = user_cplx({u}, {pc}, t)")
            terms = " + ".join(f"(c[{m}].imag / H) * KB[e, {m}]" for m in range(n))
        lines.append(f"        OUT[{d}, g] += {terms}")
    return "\n".join(lines) + "\n"


def _module(
    f: Callable[..., Any],
    n: int,
    as_array: bool,
    layout: ParamLayout,
    rows: list[int],
    paramjac: Callable[..., Any] | None,
    p_example: Any,
) -> Any:
    import numba

    inline = numba.njit(inline="always", error_model="numpy")  # as in adjoint_sweep
    keys = f"f={function_key(f)}@{where_defined(f)}" + (
        f" paramjac={function_key(paramjac)}" if paramjac is not None else ""
    )
    source = _source(n, as_array, layout, rows, paramjac is not None, keys)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    module = _MODULES.get(digest)
    if module is None:
        path = _write_source(source, f"dxode_adjoint_params_{digest}.py")
        module = _import(path, f"_dxode_adjoint_params_{digest}")
        if paramjac is not None:
            module.user_pjac = inline(numba_ready(paramjac, _RowsToTuples()))
        else:
            copy = complex_copy(f)
            check_compiles(copy, f, n, as_array, p_example, complex_rows(layout.structure, rows))
            module.user_cplx = inline(copy)
        module.pbar = numba.njit(cache=True, nogil=True, error_model="numpy")(module.pbar)
        _MODULES[digest] = module
    return module


def leaf_rows(static: Any, leaves: list[Any]) -> list[tuple[int, list[int]]]:
    """``(leaf position, its parameter rows)`` for each differentiated leaf."""
    layout_rows = ParamLayout.of(
        _pytree.rebuild(static.p_template, leaves), static.lane_leaf
    ).leaf_rows
    offsets = np.cumsum([0, *layout_rows])
    return [
        (i, list(range(int(offsets[i]), int(offsets[i + 1]))))
        for i, d in enumerate(static.diff_leaf)
        if d
    ]
