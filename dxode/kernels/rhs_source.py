"""The user's ``f(u, p, t)`` made ready for numba, and how its ``p`` reaches each lane.

``f`` stays the function the array path takes. Two things change on the way in:

* a ``return [a, b, c]`` (a list literal) becomes ``return (a, b, c)``: a numba list is a
  heap object, a tuple lives in registers, which keeps the lane loop vectorizable;
* ``u`` and ``p`` arrive per lane as tuples of numbers (``x, y, z = u``, ``u[0]`` and
  ``sigma, rho, beta = p`` work as before). An ``f`` that needs ``u`` as an array (``-k * u``)
  gets a small array instead, which compiles but does not vectorize;
* ``autograd.numpy`` (``anp.sin``, ``from autograd.numpy import exp``), which an ``f``
  written for gradients on the array path uses, is read as NumPy: numba compiles NumPy, not
  autograd's wrappers of it.

The rewritten function keeps ``f``'s file name and line numbers, so numba's errors point to
the user's code.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import dis
import hashlib
import importlib
import inspect
import itertools
import textwrap
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import _pytree
from .errors import ARRAY_PATH, KernelCompileError, KernelUnsupportedError

__all__ = [
    "ParamLayout",
    "check_plain_function",
    "function_key",
    "keep_sources",
    "names_read",
    "numba_ready",
    "where_defined",
]


def where_defined(f: Callable[..., Any]) -> str:
    """``file:line`` of ``f``'s definition (for messages; also part of a kernel's key)."""
    code = getattr(f, "__code__", None)
    if code is None:
        return repr(f)
    return f"{code.co_filename}:{code.co_firstlineno}"


def function_key(f: Callable[..., Any]) -> str:
    """A digest that changes when ``f``'s source, the values it closes over or the
    module-level constants it reads change (numba freezes all three into the kernel)."""
    identity = (getattr(f, "__code__", None), _frozen_values(f))
    try:
        known = _KEYS.get(f)
    except TypeError:  # not weakly referenceable
        known = None
    if known is not None and known[0] == identity:
        return known[1]
    key = _function_digest(f, identity[1])
    with contextlib.suppress(TypeError):
        _KEYS[f] = (identity, key)
    return key


_KEYS: weakref.WeakKeyDictionary[Any, tuple[Any, str]] = weakref.WeakKeyDictionary()


def _frozen_values(f: Callable[..., Any], seen: frozenset[int] = frozenset()) -> tuple[str, ...]:
    """Fingerprints of what numba compiles into ``f`` as constants: its closure cells and
    the module-level values its code (and nested code) names, by value, not identity (an
    array changed in place changes its fingerprint). ``seen``: the ids of the functions
    being fingerprinted around this one (a helper that calls itself)."""
    code = getattr(f, "__code__", None)
    if code is None:
        return ()
    seen = seen | {id(f)}
    cells = [_cell_value(c) for c in getattr(f, "__closure__", None) or ()]
    module = getattr(f, "__globals__", {})
    read = {name for c in _code_objects(code) for name in c.co_names}  # attributes too
    names = sorted(read & module.keys())
    return tuple(_fingerprint(value, seen, read) for value in cells) + tuple(
        f"{name}={_fingerprint(module[name], seen, read)}" for name in names
    )


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return [code, *(inner for c in nested for inner in _code_objects(c))]


def _fingerprint(value: Any, seen: frozenset[int], read: set[str]) -> str:
    """``value`` as numba compiles it into a function that reads it; ``read``: the names
    that function's code reads (a module's attributes among them)."""
    if isinstance(value, np.ndarray):
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]
        return f"array({value.dtype.str}, {value.shape}, {digest})"
    if isinstance(value, tuple):  # item by item: repr elides the middle of a long array
        return "(" + ", ".join(_fingerprint(item, seen, read) for item in value) + ")"
    if isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        return repr(value)
    helper = getattr(value, "py_func", None)  # a numba.njit helper f calls
    if isinstance(helper, types.FunctionType) and id(helper) not in seen:
        # numba compiles its code and the values it reads into the kernel, as f's own
        code = _code_text(helper.__code__)
        return f"{helper.__qualname__}({_digest(code)}, {_frozen_values(helper, seen)})"
    if isinstance(value, types.ModuleType) and id(value) not in seen:
        # ``cfg.K`` of a module of the user's: numba freezes the attribute's value too (its
        # namespace read directly: no lazy imports, no deprecation warnings of a getattr)
        namespace = vars(value)
        inner = seen | {id(value)}
        return f"{value.__name__}" + "".join(
            f" {name}={_fingerprint(namespace[name], inner, read)}"
            for name in sorted(read & namespace.keys())
            if not name.startswith("__")
        )
    return type(value).__qualname__  # functions, classes: their identity is the name


def _function_digest(f: Callable[..., Any], frozen: tuple[str, ...]) -> str:
    code = getattr(f, "__code__", None)  # two lambdas on one line share their source line
    compiled = _code_text(code) if isinstance(code, types.CodeType) else ""
    try:  # the source numba_ready reads
        text = _source_text(code, f) if isinstance(code, types.CodeType) else inspect.getsource(f)
    except (OSError, TypeError):
        # No source (a lambda or function pickled by value without keep_sources, as Dask
        # sends one defined in a script's __main__ or a notebook): its code's text stands for
        # it. Not repr(code), which holds the object's address: every copy would compile a
        # kernel of its own.
        text = "" if compiled else repr(f)
    return _digest(f"{where_defined(f)}\n{text}\n{compiled}\n{frozen}")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _code_text(code: types.CodeType) -> str:
    """A code object's instructions, constants and names (nested code too) as text, the
    same in every process (``marshal``'s bytes depend on reference counts)."""
    consts = [_code_text(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return repr((code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars))


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


_KEPT_SOURCE = "__dxode_source__"  # keep_sources' entry in a function's __dict__


def keep_sources(value: Any) -> None:
    """Store in each plain function that ``value`` reaches (through dxode's objects, tuples,
    lists and dicts; not through closures or globals) its source text, in its ``__dict__``,
    which a copy pickled by value keeps: cloudpickle, as Dask sends a function defined in a
    script's ``__main__`` or a notebook to its workers, copies code and ``__dict__`` but not
    the file, so a worker's kernels could not rewrite ``f`` as this process's do (complex
    step's ``math`` to ``cmath`` and its powers: a kernel gradient that works here was
    refused there). A function whose entry is for its current code is left as it is."""
    for fn in _functions_in(value, set()):
        stamp = _code_stamp(fn.__code__)
        kept = fn.__dict__.get(_KEPT_SOURCE)
        if kept is not None and kept[0] == stamp:
            continue
        with contextlib.suppress(OSError, TypeError):  # nothing to keep: refused by name there
            fn.__dict__[_KEPT_SOURCE] = (stamp, inspect.getsource(fn.__code__))


def _functions_in(value: Any, seen: set[int]) -> Iterator[types.FunctionType]:
    """The plain functions in ``value``, in dxode's objects and in containers."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, types.FunctionType):
        yield value
        return
    if isinstance(value, (tuple, list)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    elif type(value).__module__.startswith("dxode.") and hasattr(value, "__dict__"):
        items = vars(value).values()
    else:
        return
    for item in items:
        yield from _functions_in(item, seen)


def _source_text(code: types.CodeType, f: Any) -> str:
    """The source of ``code``, ``f``'s code: from its file, else the text ``keep_sources``
    stored with ``f`` for this code (a copy pickled by value has no file). Raises ``OSError``
    where there is neither (a function made by exec, or pickled by value without it)."""
    try:
        return inspect.getsource(code)
    except OSError:
        kept = getattr(f, "__dict__", {}).get(_KEPT_SOURCE)
        if kept is None or kept[0] != _code_stamp(code):
            raise
        return str(kept[1])


def _code_stamp(code: types.CodeType) -> str:
    """A digest of ``code`` that its copies pickled by value share (not its file name)."""
    return _digest(_code_text(code))


class _ListReturnsToTuples(ast.NodeTransformer):
    """``return [a, b]`` becomes ``return (a, b)``, and nested list literals in it become
    tuples too (a ``jac``'s ``[[a, b], [c, d]]``); not inside nested functions."""

    def visit_Return(self, node: ast.Return) -> ast.Return:
        if node.value is not None:
            node.value = _lists_to_tuples(node.value)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        return node if getattr(self, "_inside", False) else self._visit_top(node)

    def _visit_top(self, node: ast.FunctionDef) -> ast.FunctionDef:
        self._inside = True
        node.decorator_list = []
        node.body = [self.visit(stmt) for stmt in node.body]
        return node


def _lists_to_tuples(node: ast.expr) -> ast.expr:
    """A list or tuple literal with every list literal in it (recursively) a tuple; one
    with a starred item (``[*head, x]``) as written, since numba types ``(*head, x)`` as
    ``tuple(list)``, which it cannot compile, where it compiles the list."""
    if isinstance(node, (ast.List, ast.Tuple)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            return node
        elts = [_lists_to_tuples(e) for e in node.elts]
        return ast.copy_location(ast.Tuple(elts=elts, ctx=ast.Load()), node)
    return node


def check_plain_function(fn: Any, what: str, arguments: str) -> None:
    """Raise ``KernelUnsupportedError`` unless ``fn`` is a plain Python function (``def`` or
    ``lambda``) taking exactly the positional ``arguments`` (``"u, p, t"``), the one thing the
    kernel compiles and calls: not a numba dispatcher, bound method, ``functools.partial``,
    callable object, nor a function with more (defaulted) or variadic parameters. ``what``
    names it (``"f"``)."""
    count = len(arguments.split(","))
    code = getattr(fn, "__code__", None)
    if hasattr(fn, "py_func"):
        reason = "is already compiled by numba; pass the plain Python function (.py_func)"
    elif not isinstance(fn, types.FunctionType) or code is None:
        reason = (
            f"is a {type(fn).__name__}, not a function; write a def or lambda taking "
            f"({arguments}) that closes over the numbers it needs"
        )
    elif code.co_argcount != count or code.co_kwonlyargcount or code.co_flags & 0x0C:
        reason = f"does not take exactly ({arguments}); the kernel calls it so, without keywords"
    else:
        _check_nothing_traced_closed_over(fn)
        return
    raise KernelUnsupportedError(
        f"the compiled kernels need {what} as a plain Python function of ({arguments}): "
        f"{fn!r} {reason}; or use {ARRAY_PATH}, which calls any Python callable"
    )


def _check_nothing_traced_closed_over(fn: types.FunctionType) -> None:
    """Raise ``KernelCompileError`` when ``fn`` reads a value autograd is differentiating
    from its closure or its module's globals (a fit's ``lambda u, p, t: -theta[0] * u`` inside
    the loss): numba cannot compile it, and the kernels differentiate only ``u0`` and ``p``."""
    from autograd.tracer import isbox

    code = fn.__code__
    label = "the lambda" if fn.__name__ == "<lambda>" else f"the function {fn.__name__}"
    read = list(zip(code.co_freevars, (_cell_value(c) for c in fn.__closure__ or ()), strict=True))
    module = fn.__globals__
    read += [(n, module[n]) for c in _code_objects(code) for n in c.co_names if n in module]
    for name, value in read:
        containers = isinstance(value, (tuple, list, dict))
        if (containers or isbox(value)) and any(map(isbox, _pytree.leaves(value))):
            raise KernelCompileError(
                f"{label} defined at {where_defined(fn)} reads `{name}` from outside "
                f"(a closure or a global), and `{name}` is a value autograd is "
                f"differentiating, which the compiled kernels cannot see: pass it in p, "
                f"ODEProblem(f, u0, tspan, p={name}), and read it from p in f (p[0], ...); "
                f"dxode then differentiates the solve with respect to it, on the kernel "
                f"path and the array path alike"
            )


def numba_ready(
    f: Callable[..., Any],
    rewrite: ast.NodeTransformer | None = None,
    names: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """``f`` with list-literal returns turned into tuples (``f`` itself when its source is not
    available or it is not a plain ``def``).

    ``rewrite`` transforms the function's tree further (``complex_step``), and ``names``
    are added to the globals the rewritten function sees.
    """
    code = getattr(f, "__code__", None)
    if code is None:
        return f
    if f.__name__ == "<lambda>":
        return _with_numpy(_tuple_returns(f))
    try:
        # the source of f's own code: inspect.getsource(f) follows a functools.wraps wrapper's
        # __wrapped__ to the function it wraps, which would compile that one instead of f
        source = textwrap.dedent(_source_text(code, f))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return _with_numpy(_tuple_returns(f))
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return _with_numpy(_tuple_returns(f))
    ast.increment_lineno(tree, code.co_firstlineno - 1)  # the file's lines, in errors too
    func = _ListReturnsToTuples().visit(tree.body[0])
    if rewrite is not None:
        func = rewrite.visit(func)
    freevars = code.co_freevars
    if freevars:  # rebuild the closure: an outer function takes the closed-over values
        outer = ast.FunctionDef(
            name="_dxode_outer",
            args=ast.arguments(
                posonlyargs=[],
                args=[ast.arg(arg=name) for name in freevars],
                kwonlyargs=[],
                kw_defaults=[],
                defaults=[],
            ),
            body=[func, ast.Return(value=ast.Name(id=func.name, ctx=ast.Load()))],
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        tree.body = [outer]
    ast.fix_missing_locations(tree)
    namespace = _numpy_globals(f)
    namespace.update(names or {})
    exec(compile(tree, code.co_filename, "exec"), namespace)
    if freevars:
        cells = [_cell_value(c) for c in f.__closure__ or ()]
        new = namespace["_dxode_outer"](*cells)
    else:
        new = namespace[func.name]
    return types.FunctionType(
        new.__code__, new.__globals__, f.__name__, f.__defaults__, new.__closure__
    )


def numpy_twin(value: Any) -> Any:
    """``value``, or NumPy's own for autograd's NumPy wrapper: the module ``autograd.numpy``
    (and ``.linalg``, ``.fft``, ``.random``) becomes ``numpy``'s, a function autograd wraps
    the NumPy function it wraps (``anp.sin`` is ``np.sin``)."""
    if isinstance(value, types.ModuleType):
        prefix = "autograd.numpy"
        name = value.__name__
        if name == prefix or name.startswith(prefix + "."):
            return importlib.import_module("numpy" + name[len(prefix) :])
        return value
    if callable(value) and str(getattr(value, "__module__", "")).startswith("autograd"):
        wrapped = getattr(value, "fun", None)  # an autograd primitive
        if wrapped is None:  # one of autograd.numpy's own (array, stack, where, ...)
            wrapped = getattr(np, getattr(value, "__name__", ""), None)
        return value if wrapped is None else wrapped
    return value


def _numpy_globals(f: Callable[..., Any]) -> dict[str, Any]:
    """A copy of ``f``'s globals with ``numpy_twin`` applied to the names ``f`` reads."""
    namespace = dict(f.__globals__)
    for name in names_read(f.__code__):
        if name in namespace:
            namespace[name] = numpy_twin(namespace[name])
    return namespace


def names_read(code: types.CodeType) -> set[str]:
    """The global names a code object and the code nested in it (comprehensions) read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= names_read(const)
    return names


def _tuple_returns(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with ``return [a, b, ...]`` returning a tuple, rewritten in its bytecode (where
    there is no source to rewrite: a lambda, or a function pickled by value, as Dask sends
    one defined in a script or notebook to its workers): ``BUILD_LIST n`` right before
    ``RETURN_VALUE`` becomes ``BUILD_TUPLE n``, an instruction of the same size, so no jump
    moves. Without it such an ``f`` builds a heap list per call and the lane loop does not
    vectorize (13x slower on the Lorenz kernel)."""
    code = f.__code__
    ops = list(dis.get_instructions(code))
    build_list, build_tuple = dis.opmap["BUILD_LIST"], dis.opmap["BUILD_TUPLE"]
    raw = bytearray(code.co_code)
    for op, after in itertools.pairwise(ops):
        if op.opcode == build_list and after.opname == "RETURN_VALUE":
            raw[op.offset] = build_tuple
    if raw == code.co_code:
        return f
    copy = types.FunctionType(
        code.replace(co_code=bytes(raw)), f.__globals__, f.__name__, f.__defaults__, f.__closure__
    )
    copy.__kwdefaults__ = f.__kwdefaults__
    return copy


def _with_numpy(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` itself, or a copy reading NumPy where it reads autograd's wrapper of it."""
    namespace = _numpy_globals(f)
    if all(namespace[k] is v for k, v in f.__globals__.items()):
        return f
    return types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__, f.__closure__)


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """How ``p`` is laid out per lane: its leaves as rows of one ``(rows, L)`` array.

    Attributes
    ----------
    structure : tuple
        For each leaf in order, ``0`` for a number or the length of a 1-D leaf; wrapped in
        the nested tuple shape of ``p`` (dicts are not supported; lists become tuples).
    is_none : bool
        ``p`` is ``None``.
    """

    structure: Any
    is_none: bool = False

    @property
    def rows(self) -> int:
        """Rows of the parameter array."""
        return sum(self.leaf_rows)

    @property
    def leaf_rows(self) -> list[int]:
        """Rows of each leaf, in order (a number takes one, a 1-D leaf one per element)."""
        return [] if self.is_none else [max(size, 1) for size in _flat_sizes(self.structure)]

    def expression(self, column: str) -> str:
        """Source text building one lane's ``p`` from rows ``P[k, column]``."""
        if self.is_none:
            return "None"
        counter = iter(range(self.rows))
        return _expression(self.structure, column, counter)

    @classmethod
    def of(cls, p: Any, lane_leaf: list[bool]) -> ParamLayout:
        """The layout of a batch's ``p`` (per-lane leaves carry a trailing lane axis)."""
        if p is None:
            return cls((), is_none=True)
        if isinstance(p, dict) or _has_dict(p):
            raise KernelUnsupportedError(
                "the compiled kernels take p as a number, a 1-D array or a tuple of them, not "
                f"a dict; pass the values as a tuple or array, or use {ARRAY_PATH}"
            )
        leaves = _pytree.leaves(p)
        sizes = []
        for leaf, per_lane in zip(leaves, lane_leaf, strict=True):
            ndim = np.ndim(leaf) - (1 if per_lane else 0)
            if ndim > 1:
                raise KernelUnsupportedError(
                    "the compiled kernels take parameters that are numbers or 1-D arrays per "
                    f"trajectory, got a leaf with {ndim} dimensions; flatten it, or use "
                    f"{ARRAY_PATH}"
                )
            if ndim == 1 and np.shape(leaf)[0] == 0:
                raise KernelUnsupportedError(
                    f"the compiled kernels take no empty parameter arrays (p has a leaf of shape "
                    f"{np.shape(leaf)}); leave it out of p, or use {ARRAY_PATH}"
                )
            sizes.append(0 if ndim == 0 else int(np.shape(leaf)[0]))
        sizes_iter = iter(sizes)
        return cls(_pytree.rebuild(_as_tuples(p), list(sizes_iter)))


def _as_tuples(tree: Any) -> Any:
    if isinstance(tree, (list, tuple)):
        return tuple(_as_tuples(v) for v in tree)
    return tree


def _has_dict(tree: Any) -> bool:
    if isinstance(tree, dict):
        return True
    if isinstance(tree, (list, tuple)):
        return any(_has_dict(v) for v in tree)
    return False


def _flat_sizes(structure: Any) -> list[int]:
    if isinstance(structure, tuple):
        return [size for item in structure for size in _flat_sizes(item)]
    return [structure]


def _expression(structure: Any, column: str, counter: Any) -> str:
    if isinstance(structure, tuple):
        items = [_expression(item, column, counter) for item in structure]
        return "(" + "".join(f"{item}, " for item in items) + ")"
    if structure == 0:
        return f"P[{next(counter)}, {column}]"
    rows = [f"P[{next(counter)}, {column}]" for _ in range(structure)]
    return "(" + "".join(f"{row}, " for row in rows) + ")"
