"""A complex copy of the user's ``f`` for complex-step derivatives inside compiled kernels.

For a real-analytic ``f``, ``Im f(u + i h v, p + i h w, t) / h`` is its directional
derivative ``J_u v + J_p w`` with an error of order ``h²`` and no cancellation, so with
``h = 2^-100`` it is exact to rounding. numba compiles complex arithmetic, and NumPy's
functions (``np.exp``, ...) take complex numbers; ``math`` functions do not, so the copy
calls their ``cmath`` twins instead.

What complex step cannot differentiate, and what this module refuses with a
``KernelUnsupportedError`` before compiling: ``abs``, ``min``, ``max``, ``round``, and
``math``/NumPy functions that are not analytic or have no complex version (``fabs``,
``floor``, ``atan2``, ``hypot``, ``np.abs``, ``np.maximum``, ``np.where``, ...), and
what takes a complex number apart (``np.conj``, ``np.real``, ``.real``, ``.conjugate()``,
``np.vdot``, ``np.linalg.norm``, ...): on the complex copy each of these computes the
derivative of something else (the modulus, the real part), a silently wrong gradient.
Comparisons of values that depend on ``u`` or ``p`` (``if x > 0:``) do not compile for
complex numbers; ``compiler``-time errors say so (comparisons on ``t`` alone are fine).

Powers (``**``, ``pow``, ``np.power``, ``math.pow``) become ``complex_power``: numba's complex
power goes through the polar form, which loses the step for a negative base (``x ** 3`` at
``x < 0``). Where they cannot be rewritten (an ``f`` without source, a compiled helper ``f``
calls) they are refused.
"""

from __future__ import annotations

import ast
import cmath
import dis
import inspect
import itertools
import math
import re
import textwrap
import types
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from .errors import ARRAY_PATH, KernelUnsupportedError, numba_refusals
from .rhs_source import names_read, numba_ready, numpy_twin, where_defined

__all__ = ["NOT_ANALYTIC_HINT", "STEP", "complex_copy"]

STEP = 2.0**-100  # the complex step h (a power of two: dividing by it is exact)

# math functions with a cmath twin of the same name.
_CMATH_TWINS = frozenset(
    [
        "exp",
        "log",
        "log10",
        "sqrt",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
    ]
)
_MATH_CONSTANTS = frozenset(["pi", "e", "tau", "inf", "nan"])
_COMPARISONS = frozenset(["lt", "le", "gt", "ge"])  # numba's names of <, <=, >, >=
_NOT_ANALYTIC_BUILTINS = frozenset(["abs", "min", "max", "round", "int"])
_NOT_ANALYTIC_NUMPY = frozenset(
    [
        "abs",
        "absolute",
        "fabs",
        "sign",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "floor",
        "ceil",
        "trunc",
        "rint",
        "round",
        "around",
        "clip",
        "where",
        "heaviside",
        "mod",
        "fmod",
        "remainder",
        "arctan2",
        "hypot",
        "copysign",
        # these take a complex number apart (or conjugate it): the complex copy would
        # differentiate the modulus or the real part
        "conj",
        "conjugate",
        "real",
        "imag",
        "angle",
        "vdot",
    ]
)
# attributes of any value that take a complex number apart (u.real, v.conjugate())
_NOT_ANALYTIC_ATTRIBUTES = frozenset(["real", "imag", "conj", "conjugate"])
# np.linalg functions that are analytic and compile for complex matrices; the others
# (norm, svd, eigh, pinv, qr, cholesky, lstsq, slogdet, vecdot, ...) conjugate or take moduli
_ANALYTIC_LINALG = frozenset(
    [
        "inv",
        "solve",
        "det",
        "matrix_power",
        "multi_dot",
        "matmul",
        "tensordot",
        "tensorinv",
        "tensorsolve",
        "trace",
        "diagonal",
        "matrix_transpose",
        "cross",
        "outer",
    ]
)

NOT_ANALYTIC_HINT = (
    "Complex-step derivatives need f to be real-analytic in u and p: no abs, min, max, "
    "round, floor, atan2, norms, conjugates or real parts, or comparisons of u- or "
    "p-dependent values. Give the problem "
    "jac= and paramjac= (compiled with f: their derivatives are used instead), or "
    f"differentiate with {ARRAY_PATH}."
)


def complex_power(z, w):  # type: ignore[no-untyped-def]
    """``z ** w`` for the complex copy: the real power ``x ** c`` of the real parts, and as
    imaginary part its first-order change ``c x^(c-1) Im z + x^c log(x) Im w``.

    numba (and CPython for non-integer exponents) raise a complex number to a power through
    its polar form, ``exp(w log z)``: for a base with a negative real part the angle is
    about pi, whose rounding (1e-16) swamps the step's 1e-30 imaginary part, so complex
    step returned derivatives of 1e13 for ``x ** 3`` at ``x = -0.3`` (numba writes out only
    the square). Real arguments give the real power, as in ``f``; so does this function
    under numba (an overload, ``_register_power``) and in Python (the CUDA simulator)."""
    if not (np.iscomplexobj(z) or np.iscomplexobj(w)):
        return z**w
    x, dx, c, dc = np.real(z), np.imag(z), np.real(w), np.imag(w)
    with np.errstate(all="ignore"):
        value = x**c
        slope = np.where(dx != 0, dx * (c * x ** (c - 1)), 0.0)
        slope = slope + np.where(dc != 0, dc * value * np.log(x), 0.0)
    if np.ndim(value) == 0:
        return complex(value, slope)
    return value + 1j * slope


def _register_power() -> None:
    """``complex_power`` under numba: ``z ** w`` for real arguments, else the power by parts
    (scalars by branches, arrays elementwise)."""
    global _POWER_REGISTERED
    if _POWER_REGISTERED:
        return
    from numba.core import types
    from numba.extending import overload

    def is_complex(ty: Any) -> bool:
        return isinstance(getattr(ty, "dtype", ty), types.Complex)

    # no annotations: numba compares the typing and implementation signatures, annotations
    # included
    @overload(complex_power, target="generic")
    def _power(z, w):  # type: ignore[no-untyped-def]
        if not (is_complex(z) or is_complex(w)):
            return lambda z, w: z**w
        if isinstance(z, types.Array) or isinstance(w, types.Array):

            def by_elements(z, w):  # type: ignore[no-untyped-def]
                x, dx, c, dc = np.real(z), np.imag(z), np.real(w), np.imag(w)
                value = x**c
                slope = np.where(dx != 0, dx * (c * x ** (c - 1)), 0.0)
                slope = slope + np.where(dc != 0, dc * value * np.log(x), 0.0)
                return value + 1j * slope

            return by_elements

        def by_parts(z, w):  # type: ignore[no-untyped-def]
            x, dx, c, dc = z.real, z.imag, w.real, w.imag
            value = x**c
            slope = 0.0
            if dx != 0 and c != 0:
                slope += dx * (c * x ** (c - 1))
            if dc != 0:
                slope += dc * value * (np.log(x) if x > 0 else np.nan)
            return complex(value, slope)

        return by_parts

    _POWER_REGISTERED = True


_POWER_REGISTERED = False


class _ToComplex(ast.NodeTransformer):
    """``math.X`` becomes ``cmath.X`` and powers ``complex_power``; non-analytic calls are
    collected as ``refused``."""

    def __init__(self, globals_: dict[str, Any]) -> None:
        self.globals = globals_
        self.refused: list[str] = []
        self.rewrote = False  # whether f's source was there to rewrite
        self.powers: list[str] = []  # the powers rewritten (refused in compiled helpers)

    def _module(self, node: ast.AST) -> Any:
        return numpy_twin(self.globals.get(node.id)) if isinstance(node, ast.Name) else None

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        module = self._module(node.value)
        if module is math:
            if node.attr in _CMATH_TWINS:
                return ast.copy_location(
                    ast.Attribute(
                        value=ast.Name(id="_dxode_cmath", ctx=ast.Load()),
                        attr=node.attr,
                        ctx=ast.Load(),
                    ),
                    node,
                )
            if node.attr not in _MATH_CONSTANTS:
                self.refused.append(f"math.{node.attr} (line {node.lineno})")
        elif module is np and node.attr in _NOT_ANALYTIC_NUMPY:
            self.refused.append(f"np.{node.attr} (line {node.lineno})")
        elif _is_linalg(module, node.value, self.globals) and node.attr not in _ANALYTIC_LINALG:
            self.refused.append(f"np.linalg.{node.attr} (line {node.lineno})")
        elif module is None and node.attr in _NOT_ANALYTIC_ATTRIBUTES:
            self.refused.append(f".{node.attr} (line {node.lineno})")
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        node = self.generic_visit(node)
        if not isinstance(node.op, ast.Pow):
            return node
        self.powers.append(f"** (line {node.lineno})")
        return ast.copy_location(_power_call(node.left, node.right), node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        node = self.generic_visit(node)
        if not isinstance(node.op, ast.Pow) or not isinstance(node.target, ast.Name):
            return node
        self.powers.append(f"**= (line {node.lineno})")
        value = _power_call(ast.Name(id=node.target.id, ctx=ast.Load()), node.value)
        return ast.copy_location(ast.Assign(targets=[node.target], value=value), node)

    def visit_Call(self, node: ast.Call) -> Any:
        function = node.func
        name = function.id if isinstance(function, ast.Name) else None
        module = self._module(function.value) if isinstance(function, ast.Attribute) else None
        value = numpy_twin(self.globals.get(name)) if name is not None else None
        power = (
            (name == "pow" and value is None and name not in getattr(self, "local", ()))
            or value is np.power
            or value is math.pow
            or (module is np and function.attr == "power")
            or (module is math and function.attr == "pow")
        )
        if power and len(node.args) == 2 and not node.keywords:
            self.powers.append(f"{ast.unparse(function)} (line {node.lineno})")
            args = [self.visit(arg) for arg in node.args]
            return ast.copy_location(_power_call(*args), node)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        self.rewrote = True
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        stored = [
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        ]
        self.local = {a.arg for a in arguments} | set(stored)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in getattr(self, "local", ()):
            return node
        value = numpy_twin(self.globals.get(node.id))
        numpy_name = getattr(value, "__name__", None)
        if node.id in _NOT_ANALYTIC_BUILTINS and value is None:
            self.refused.append(f"{node.id} (line {node.lineno})")
        elif numpy_name in _NOT_ANALYTIC_NUMPY and getattr(np, numpy_name, None) is value:
            self.refused.append(f"{node.id} (np.{numpy_name}, line {node.lineno})")
        elif _is_linalg_function(value):
            self.refused.append(f"{node.id} (np.linalg.{numpy_name}, line {node.lineno})")
        elif callable(value) and getattr(value, "__module__", None) == "math":
            name = getattr(value, "__name__", node.id)
            if name in _CMATH_TWINS:
                return ast.copy_location(
                    ast.Attribute(
                        value=ast.Name(id="_dxode_cmath", ctx=ast.Load()),
                        attr=name,
                        ctx=ast.Load(),
                    ),
                    node,
                )
            else:
                self.refused.append(f"{node.id} (math.{name}, line {node.lineno})")
        return node


def _power_call(base: ast.expr, exponent: ast.expr) -> ast.Call:
    return ast.Call(
        func=ast.Name(id="_dxode_power", ctx=ast.Load()), args=[base, exponent], keywords=[]
    )


def _is_linalg(module: Any, node: ast.AST, globals_: dict[str, Any]) -> bool:
    """Whether ``node`` (whose module, if a name, is ``module``) is ``np.linalg``: a name
    bound to it, or the attribute ``linalg`` of NumPy."""
    if module is np.linalg:
        return True
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "linalg"
        and isinstance(node.value, ast.Name)
        and numpy_twin(globals_.get(node.value.id)) is np
    )


def _is_linalg_function(value: Any) -> bool:
    """Whether ``value`` is a non-analytic ``np.linalg`` function (``from numpy.linalg
    import norm``)."""
    name = getattr(value, "__name__", None)
    return (
        name is not None
        and name not in _ANALYTIC_LINALG
        and getattr(np.linalg, name, None) is value
        and callable(value)
    )


def complex_copy(f: Callable[..., Any], what: str = "f") -> Callable[..., Any]:
    """``f`` made ready for numba (see ``rhs_source.numba_ready``) and for complex ``u`` and
    ``p``: its ``math`` calls become ``cmath`` calls. Raises ``KernelUnsupportedError``
    naming what complex step cannot differentiate."""
    rewrite = _ToComplex(getattr(f, "__globals__", {}))
    _register_power()
    copy = numba_ready(f, rewrite, {"_dxode_cmath": cmath, "_dxode_power": complex_power})
    refused, how = rewrite.refused, ""
    if not rewrite.rewrote and hasattr(f, "__code__"):
        refused = _refused_by_name(f)
        how = (
            f" ({what}'s source cannot be read, as for a lambda or a function sent by value, "
            f"so these were read off the names its bytecode uses; the source of a def in a "
            f"module is read, on Dask workers too where they import it, and "
            f"EnsembleDask(kernel=...) sends that of one in a script's __main__ along)"
        )
    refused = refused + _refused_in_compiled_helpers(f, set())
    if refused:
        raise KernelUnsupportedError(
            f"the kernel path differentiates {what} defined at {where_defined(f)} by complex "
            f"step, which cannot differentiate {', '.join(refused)}{how}. {NOT_ANALYTIC_HINT}"
        )
    return copy


def _refused_in_compiled_helpers(f: Callable[..., Any], seen: set[int]) -> list[str]:
    """What complex step cannot take in the ``@numba.njit`` functions ``f`` calls (from its
    module, its closure or an attribute of a module, ``helpers.damping(v)``), and in those
    they call: the complex copy calls them with complex numbers, so an ``abs`` in one is the
    modulus there (a silently wrong derivative)."""
    code = getattr(f, "__code__", None)
    if code is None:
        return []
    globals_ = getattr(f, "__globals__", {})
    names = names_read(code)
    values = [globals_.get(name) for name in names]
    values += [_cell_contents(cell) for cell in getattr(f, "__closure__", None) or ()]
    values += _module_attributes_read(values, names)
    refused = []
    for value in values:
        py_func = getattr(value, "py_func", None)
        if py_func is None or not type(value).__module__.startswith("numba") or id(value) in seen:
            continue
        seen.add(id(value))
        rewrite = _ToComplex(getattr(py_func, "__globals__", {}))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(py_func)))
            ast.increment_lineno(tree, py_func.__code__.co_firstlineno - 1)
            rewrite.visit(tree)
            # powers too: the helper runs as compiled, with numba's complex power (see
            # complex_power), not rewritten
            found = rewrite.refused + rewrite.powers
        except (OSError, TypeError, SyntaxError):
            found = _refused_by_name(py_func)
        name = getattr(py_func, "__name__", "?")
        refused += [f"{entry} in the compiled helper {name}" for entry in found]
        refused += _refused_in_compiled_helpers(py_func, seen)
    return refused


def _module_attributes_read(values: list[Any], names: set[str]) -> list[Any]:
    """The attributes named in ``names`` of the modules among ``values``, and of the modules
    among those (``pkg.helpers.damping``), as numba resolves ``module.name`` in ``f``."""
    modules = [value for value in values if isinstance(value, types.ModuleType)]
    seen, found = set(), []
    while modules:
        module = modules.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        namespace = vars(module)
        for name in sorted(names & namespace.keys()):
            value = namespace[name]
            (modules if isinstance(value, types.ModuleType) else found).append(value)
    return found


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _refused_by_name(f: Callable[..., Any]) -> list[str]:
    """What complex step cannot take in ``f`` when there is no source to rewrite, from the
    names its bytecode (and that of functions defined in it) uses: the builtins and NumPy
    functions ``_ToComplex`` refuses, and ``math`` functions, which stay real without the
    rewrite to ``cmath``. Conservative: an attribute of another object with such a name is
    refused too (before, complex step took ``abs`` as the modulus: a silently wrong
    derivative)."""
    globals_ = getattr(f, "__globals__", {})
    names = names_read(f.__code__)
    modules = {numpy_twin(globals_.get(name)) for name in names} - {None}
    refused = set()
    for name in names:
        value = numpy_twin(globals_.get(name))
        if value is None and name in _NOT_ANALYTIC_BUILTINS:
            refused.add(name)
        elif value is not None and getattr(np, getattr(value, "__name__", ""), None) is value:
            if value.__name__ in _NOT_ANALYTIC_NUMPY:
                refused.add(f"{name} (np.{value.__name__})")
        elif _is_linalg_function(value):
            refused.add(f"{name} (np.linalg.{value.__name__})")
        elif callable(value) and getattr(value, "__module__", None) == "math":
            refused.add(f"{name} (math.{value.__name__})")
        if np in modules and name in _NOT_ANALYTIC_NUMPY:
            refused.add(f"np.{name}")
        if name in _NOT_ANALYTIC_ATTRIBUTES:
            refused.add(f".{name}")
        linalg = np.linalg in modules or (np in modules and "linalg" in names)
        if linalg and hasattr(np.linalg, name) and name not in _ANALYTIC_LINALG:
            refused.add(f"np.linalg.{name}")
        if math in modules and hasattr(math, name) and name not in _MATH_CONSTANTS:
            refused.add(f"math.{name}")
        if (name == "pow" and value is None) or value is np.power:
            refused.add(name)  # numba's complex power (see complex_power)
        if np in modules and name == "power":
            refused.add("np.power")
    if _raises_to_powers(f.__code__):
        refused.add("**")
    return sorted(refused)


def _raises_to_powers(code: types.CodeType) -> bool:
    """Whether ``code`` (or a function defined in it) has a ``**``: without the source to
    rewrite it into ``complex_power``, numba's complex power would differentiate it."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("BINARY_POWER", "INPLACE_POWER") or (
            instruction.opname == "BINARY_OP" and instruction.argrepr in ("**", "**=")
        ):
            return True
    return any(_raises_to_powers(c) for c in code.co_consts if isinstance(c, types.CodeType))


def check_compiles(
    copy: Callable[..., Any],
    f: Callable[..., Any],
    n: int,
    as_array: bool,
    p_example: Any,
    complex_rows: Collection[int] = (),
) -> None:
    """Type-check the complex copy for complex ``u`` (a tuple, or an array with ``as_array``)
    and ``p`` real, and with its parameter rows ``complex_rows`` complex (those of the
    differentiated leaves, as ``sensitivity_rhs.complex_params`` passes them): a
    ``KernelUnsupportedError`` with numba's reason where it does not compile (typically a
    comparison of a value that depends on ``u`` or ``p``)."""
    import numba
    from numba.core import types

    u_type = (
        types.Array(types.complex128, 1, "C") if as_array else types.UniTuple(types.complex128, n)
    )
    rows = itertools.count()  # the scalars of p in parameter-row order
    as_complex = _map_scalars(lambda x: complex(x) if next(rows) in complex_rows else x, p_example)
    try:
        for p in (p_example, as_complex) if complex_rows else (p_example,):
            numba.njit(copy).compile((u_type, numba.typeof(p), types.float64))
    except numba_refusals() as err:
        reason = str(err).split("During: ")[0].strip()
        raise KernelUnsupportedError(
            f"the complex-step copy of f defined at {where_defined(f)} does not compile for "
            f"complex u and p ({_likely_cause(reason)}). {NOT_ANALYTIC_HINT}\n"
            f"numba says: {reason}"
        ) from None


def _likely_cause(reason: str) -> str:
    """What in ``f`` most likely kept its complex copy from compiling, from numba's
    ``reason``: a real array filled with values that depend on ``u`` or ``p`` (``du =
    np.empty(n); du[0] = ...``, which the array path and the plain kernel take), a cast to
    a real number, a function numba does not define for complex numbers (a NumPy ufunc, a
    ``math`` function in a compiled helper), or (numba's other refusals) a comparison."""
    if "setitem(array(float" in reason and "complex" in reason:
        return (
            "f stores values that depend on u or p in a real array, as du = np.empty(n) "
            "or np.zeros(n) then du[0] = ... does, and a complex value does not fit there: "
            "return the rows as a list instead (return [du0, du1, ...])"
        )
    if "Cannot cast complex" in reason:
        return (
            "f casts a value that depends on u or p to a real number (np.float64(x), "
            "float(x), a real array): drop the cast"
        )
    missing = re.search(r"Function\((.*?)\) found for signature:\s*>>> (\w+)\(", reason)
    if missing is None or missing.group(2) in _COMPARISONS:
        return "comparisons of values that depend on u or p, as in 'if x > 0:', do not"
    what, name = missing.groups()
    if what.startswith("<ufunc"):
        return f"numba has no complex version of np.{name}"
    if not what.startswith("<built-in function"):
        return "numba does not take complex numbers in one of f's operations (see below)"
    if name in _CMATH_TWINS:
        return (
            f"math.{name} takes no complex numbers: f's own math calls become cmath's, "
            f"but not those of the @numba.njit helpers it calls: call NumPy's twin there"
        )
    return f"numba does not define {name} for complex numbers"


def _map_scalars(func: Callable[[Any], Any], tree: Any) -> Any:
    if isinstance(tree, tuple):
        return tuple(_map_scalars(func, x) for x in tree)
    return None if tree is None else func(tree)
