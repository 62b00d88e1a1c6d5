"""Compile generated kernels once per signature: in memory, and on disk where numba allows.

A kernel is identified by the user's ``f`` (its source and closed-over values), the method's
description and the ``KernelLayout``. The generated source is written to the kernel cache
directory (``$DXODE_KERNEL_CACHE``, else ``~/.cache/dxode/kernels``) and imported from there,
so numba's own on-disk cache (``cache=True``, which needs functions backed by a source file)
keeps the machine code between processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .cache import cache_dir, check_float_array, probed_mode, returned_shape, write_atomically
from .codegen import CODEGEN_VERSION, KernelLayout, generate, pool_constants
from .description import StepperDescription
from .errors import ARRAY_PATH, KernelCompileError, numba_refusals
from .events import bind_callbacks
from .events_codegen import locate_copies, separate_functions
from .plain_messages import plain_messages
from .rhs_source import check_plain_function, function_key, numba_ready, where_defined
from .rosenbrock_description import RosenbrockDescription

__all__ = ["CompiledKernel", "cache_dir", "compile_kernel", "user_function_mode"]

_LOCK = threading.Lock()
_COMPILED: dict[tuple[Any, ...], CompiledKernel] = {}


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """A compiled kernel: the one-block integrator and the batch driver.

    ``block`` integrates one block (a numba dispatcher: for CUDA a device function);
    ``driver`` runs a batch: on the CPU a range of its blocks one after another
    (``run_blocks(b0, b1, ...)``, without the GIL: ``cpu.run_cpu`` runs one range per
    thread), on CUDA the whole batch (the kernel ``run_lanes``).
    ``source_path`` is the generated source, kept for inspection; ``module`` the imported
    generated module (its compiled ``attempt``, ``rhs``, ... for inspection and reuse).
    """

    description: StepperDescription | RosenbrockDescription
    layout: KernelLayout
    block: Any
    driver: Any
    source_path: Path
    f: Callable[..., Any]
    module: Any = None

    def call(self, function: Any, *args: Any) -> Any:
        """Call ``function`` (``block``/``driver``), turning numba's typing errors about ``f``
        (and its refusals of what ``f`` does once inlined) into a ``KernelCompileError``, and
        a user function's list or array read past its end while running (a list's reads are
        bounds-checked, an array's by ``returned_rows.rows_of``) into a ``ValueError`` that
        says where to look."""
        from numba.core.errors import TypingError, UnsupportedError

        try:
            with plain_messages():
                return function(*args)
        except (TypingError, UnsupportedError) as err:
            raise _compile_error(self.f, err) from None
        except IndexError as err:
            raise ValueError(
                f"a list or array returned by a user function was read past its end inside "
                f"the compiled kernel ({err}): most likely the right-hand side f defined at "
                f"{where_defined(getattr(self.f, 'user_function', self.f))} (or its jac, "
                f"tgrad or a callback) returned fewer rows than the state has components on "
                f"some call; the kernels check the "
                f"number of rows once, at u = (1, ..., 1) and t = 0, so f must return one row "
                f"per component on every call, as the array path requires"
            ) from None


def user_function_mode(
    f: Callable[..., Any],
    n: int,
    dtype: str,
    p_example: Any,
    target: str,
    *,
    role: str = "f",
) -> bool:
    """Whether ``f`` must get ``u`` as an array (``True``) or takes a tuple (``False``).

    ``f`` is type-checked with numba for one lane: first with ``u`` as a tuple of numbers,
    then as a 1-D array (the answer is remembered, on disk too: ``cache.probed_mode``).
    Raises ``KernelCompileError`` (naming ``f``'s file and line and numba's reason) when
    neither compiles, and ``ValueError`` when ``f`` (its ``role``: ``"f"``, ``"jac"`` or
    ``"tgrad"``) does not return ``n`` rows (``_check_rows``; of ``n`` numbers each for a
    ``jac``). An ``f`` returning a result not in the state's dtype (an integer or bool
    array, float64 for a float32 state) raises ``TypeError``, as on the array path
    (``check_float_array``); ``jac`` and ``tgrad`` are cast there.
    """
    import numba
    from numba.core import types

    check_plain_function(f, "each of f, jac and tgrad", "u, p, t")
    p_type = numba.typeof(p_example)
    # "rows by role, numbers, in range, floats, state dtype": answers remembered before
    # _check_rows ran (or before it refused a number, a jac's shape for an f, u[9] of 2
    # components, an f's integer array or its float64 result for a float32 state) are not
    # reused
    checked = "rows by role, numbers, in range, floats, state dtype"
    key = (role, function_key(f), n, dtype, str(p_type), target, checked)
    rest = (p_type, getattr(types, dtype))

    def check(dispatcher: Any) -> None:
        _check_rows(f, dispatcher, n, dtype, p_example, role)
        if role == "f":
            check_float_array(dispatcher, n, dtype, p_example)

    return probed_mode(key, f, n, dtype, rest, lambda err: _refusal(f, err, p_example), check)


def _refusal(f: Callable[..., Any], err: Exception, p_example: Any) -> KernelCompileError:
    """The error for an ``f`` numba cannot compile; the fix named where ``f`` would compile
    with ``p`` (or a 1-D leaf of a tuple ``p``) an array: arithmetic on a whole 1-D array,
    which the kernels pass as a tuple of numbers."""
    past_end = "tuple index out of range" in str(err)  # compiles as an array, read past it
    as_tuple = isinstance(p_example, tuple) and p_example
    used = None if past_end or not as_tuple else _used_as_array(f, p_example)
    if used is not None:
        how = "unpack it (a, b = p) or index it (p[0])" if used == "p" else f"index it ({used}[0])"
        return KernelCompileError(
            f"the right-hand side f defined at {where_defined(f)} uses {used} as an array "
            f"(-{used} * u, say), and the compiled kernels pass a 1-D array "
            f"{'p' if used == 'p' else 'in p'} as a tuple of numbers; {how} in f, or use "
            f"{ARRAY_PATH}"
        )
    return _compile_error(f, err)


def _used_as_array(f: Callable[..., Any], p_example: tuple[Any, ...]) -> str | None:
    """``"p"`` where ``f`` compiles with the whole tuple ``p_example`` as a 1-D array,
    ``"p[i]"`` where it compiles with its tuple leaves as arrays (``i``: the first of them);
    else ``None``."""
    flat = _float_vector(p_example)
    if flat is not None:
        return "p" if _compiles_with_p(f, flat, flat.dtype) else None
    leaves = [_float_vector(leaf) if isinstance(leaf, tuple) else None for leaf in p_example]
    arrays = [i for i, leaf in enumerate(leaves) if leaf is not None]
    if not arrays:
        return None
    p = tuple(leaf if leaf is not None else x for leaf, x in zip(leaves, p_example, strict=True))
    return f"p[{arrays[0]}]" if _compiles_with_p(f, p, leaves[arrays[0]].dtype) else None


def _float_vector(values: tuple[Any, ...]) -> np.ndarray | None:
    """``values`` as a 1-D float array, or ``None`` where they are not a flat float tuple."""
    try:
        array = np.asarray(values)
    except ValueError:  # nested tuples of different lengths
        return None
    return array if array.ndim == 1 and array.dtype.kind == "f" else None


def _compiles_with_p(f: Callable[..., Any], p: Any, dtype: np.dtype) -> bool:
    import numba

    u_type = numba.typeof(np.ones(2, dtype))
    try:
        numba.njit(numba_ready(f)).compile((u_type, numba.typeof(p), numba.typeof(dtype.type(0))))
    except numba_refusals():
        return False
    return True


def _check_rows(
    f: Callable[..., Any], dispatcher: Any, n: int, dtype: str, p_example: Any, role: str
) -> None:
    """Raise ``ValueError`` unless the compiled ``f`` returns ``n`` rows of numbers, or (a
    ``jac``, its ``role``) ``n`` rows of ``n`` (``returned_shape``), as the array path does:
    a short row would be read past its end, a long one cut short, and an ``f`` returning a
    jac's shape failed to compile in the kernel with numba's message."""
    from numba.core import types

    shape = returned_shape(dispatcher, n, dtype, p_example)
    returned = dispatcher.nopython_signatures[-1].return_type
    if isinstance(returned, (types.Number, types.Boolean)):  # the array path's shape ()
        got = "a number, not rows (return a list, e.g. [du0])"
    elif shape is None or shape == ((n, n) if role == "jac" else (n,)):
        return
    elif shape == ():  # None (a forgotten return), a string, ...
        got = "no rows (a single object; did it forget to return?)"
    else:
        rows = len(shape) == 1 and role != "jac"  # a jac's (n,) is n numbers, not rows
        got = f"{shape[0]} rows" if rows else f"rows of shape {shape}"
    raise ValueError(
        f"the {role} defined at {where_defined(f)} returns {got} for a state of {n} "
        f"components; f and tgrad must return one number per component ({n} rows), jac "
        f"{n} rows of {n} (row i holds the derivatives of f_i)"
    )


def compile_kernel(
    f: Callable[..., Any],
    description: Any,
    layout: KernelLayout,
    derivatives: tuple[tuple[str, Callable[..., Any]], ...] = (),
    callbacks: Any = None,
) -> CompiledKernel:
    """The compiled kernel for ``f``, the method and the layout (built once, then reused).

    ``derivatives`` binds more user functions by the generated module's global names
    (``(("user_jac", jac),)``): compiled like ``f``, part of the key like ``f``.
    ``callbacks`` (a ``CallbackSet``) holds the functions ``layout.events`` describes (their
    keys are in the layout, so in the cache key).
    """
    import numba

    extra = tuple((name, function_key(fn)) for name, fn in derivatives)
    key = (function_key(f), description, layout, numba.__version__, extra)
    with _LOCK:
        kernel = _COMPILED.get(key)
        if kernel is None:
            kernel = _build(f, description, layout, key[0], derivatives, callbacks)
            _COMPILED[key] = kernel
    return kernel


def _source(description: Any, layout: KernelLayout) -> str:
    """The generated module for a description of either family, its constants pooled."""
    if isinstance(description, RosenbrockDescription):
        from .rosenbrock_codegen import generate as generate_family
    elif not isinstance(description, StepperDescription):  # AutoSwitch
        from .autoswitch_codegen import generate as generate_family
    else:
        generate_family = generate
    return pool_constants(generate_family(description, layout))


def _build(
    f: Callable[..., Any],
    description: Any,
    layout: KernelLayout,
    fkey: str,
    derivatives: tuple[tuple[str, Callable[..., Any]], ...] = (),
    callbacks: Any = None,
) -> CompiledKernel:
    import numba

    users = "".join(
        f"# user {name}: {where_defined(fn)} ({function_key(fn)})\n" for name, fn in derivatives
    )
    source = (
        _source(description, layout)
        + f"# user f: {where_defined(f)} ({fkey}); numba {numba.__version__}\n"
        + users
    )
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    path = _write_source(source, f"dxode_kernel_v{CODEGEN_VERSION}_{digest}.py")
    module = _import(path, f"_dxode_kernel_{digest}")
    ready = numba_ready(f)
    # the generated helpers compiled inline, and those compiled on their own and called
    names = list(module.HELPERS)
    separate = list(module.CALLED)
    if layout.events is not None:
        separate += separate_functions(layout.events)
    if layout.target == "cuda":
        from numba import cuda

        device = lambda fn: cuda.jit(device=True, inline=True)(fn)
        module.user_f = device(ready)
        for name, fn in derivatives:
            setattr(module, name, device(numba_ready(fn)))
        if layout.events is not None:
            names += bind_callbacks(module, callbacks, layout.events, device)
            for name, copy in locate_copies(layout.events):
                setattr(module, copy, getattr(module, name))
                names.append(copy)
        for name in names:
            setattr(module, name, device(getattr(module, name)))
        module.attempt = cuda.jit(device=True)(module.attempt)
        for name in separate:
            setattr(module, name, cuda.jit(device=True)(getattr(module, name)))
        module.block = cuda.jit(device=True)(module.block)
        driver = cuda.jit(module.run_lanes)
    else:
        # NumPy's error model: x / 0 is inf or nan as on the array path, and no
        # ZeroDivisionError branch in the lane loop (it would stop the vectorizer).
        inline = numba.njit(inline="always", error_model="numpy")
        module.user_f = inline(ready)
        if "rhs" in names:
            # f's wrapper (f inline in it) compiled once and called from each of its call
            # sites (7 in a Tsit5 attempt): numba types and lowers f once, not at every site,
            # and LLVM inlines the calls (the same vector loops, the same bits).
            names.remove("rhs")
            separate.append("rhs")
        for name, fn in derivatives:
            setattr(module, name, inline(numba_ready(fn)))
        if layout.events is not None:
            # Called from scalar code: compiled once each, not inlined at every call site
            # (which doubles the compile time of a few callbacks), but in locate's hot loops.
            separate = bind_callbacks(module, callbacks, layout.events, inline) + separate
            for name, copy in locate_copies(layout.events):
                setattr(module, copy, inline(getattr(module, name)))
        for name in names:
            setattr(module, name, inline(getattr(module, name)))
        if hasattr(module, "split_exponent"):
            # the exponent helpers as bit operations: the same results as the generated chains
            from . import float_bits

            module.split_exponent = float_bits.split_exponent
            module.pow2 = float_bits.pow2
        compiled = numba.njit(cache=True, nogil=True, error_model="numpy")
        module.attempt = compiled(module.attempt)
        for name in separate:
            setattr(module, name, compiled(getattr(module, name)))
        module.block = compiled(module.block)
        driver = compiled(module.run_blocks)
    return CompiledKernel(description, layout, module.block, driver, path, f, module)


def _write_source(source: str, name: str) -> Path:
    path = cache_dir() / name
    if not path.exists() or path.read_text() != source:
        write_atomically(path, source)
    return path


def _import(path: Path, name: str) -> Any:
    """A fresh module from ``path`` (never one already imported: ``_build`` replaces its
    functions with compiled ones, which two builds of one source must not both do)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def _compile_error(f: Callable[..., Any], err: Exception) -> KernelCompileError:
    reason = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).split("During: ")[0].strip()
    return KernelCompileError(
        f"the right-hand side f defined at {where_defined(f)} cannot be compiled by numba for "
        f"the kernel path; numba says:\n{reason}\n{_hint(reason)}"
        f"Write f with arithmetic, math/NumPy scalar functions and a list or tuple of rows "
        f"returned (see the kernels guide), or use {ARRAY_PATH}, which runs any f."
    )


def _hint(reason: str) -> str:
    """The fix for a numba error that has a known cause in ``f``; else nothing."""
    if re.search(r"Cannot cast complex\d+ to float\d+", reason):
        return (
            "f returns complex numbers for a real state: keep du/dt real (complex parameters "
            "or constants such as 1j make it complex), as the array path requires too.\n"
        )
    if "tuple index out of range" in reason:
        return (
            "f indexes u or p past its end (u[2] of a state of 2 components, say; the array "
            "path raises an IndexError there): the kernels pass u and p as tuples of their "
            "items.\n"
        )
    if re.search(r"getitem\((?:Uni)?Tuple\(.*\), float(?:32|64)\)", reason):
        return (
            "f indexes u or p with a float (u[p[0]] with an integer p[0], say): the kernels "
            "pass p's numbers, integers too, as floats of the state's dtype; index with "
            "int(p[0]).\n"
        )
    if "(UNPACK_EX)" in reason:
        return (
            "f unpacks with a starred name (a, *rest = p), which numba does not compile: "
            "name every item (a, b, c = p) or index (p[0], p[1]).\n"
        )
    field = re.search(r"Unknown attribute '(\w+)' of type (?:Uni)?Tuple", reason)
    if field is not None:  # p.k of a namedtuple, passed to f as a plain tuple
        return (
            f"f reads .{field.group(1)} of a tuple (p.{field.group(1)} of a namedtuple p?): "
            f"the compiled kernels pass p (and u) as plain tuples of numbers, so read a "
            f"namedtuple's fields by position (p[0], or unpack them: k, c = p).\n"
        )
    return _untyped_global_hint(reason)


def _untyped_global_hint(reason: str) -> str:
    """The fix for numba's "Untyped global name" or "reflected list ... in globals" (``f``
    reads a dict, a list, an object ... from its closure or module): pass the values
    through ``p``; else nothing."""
    found = re.search(r"Untyped global name '(\w+)'(?:.*?type of <class '([\w.]+)'>)?", reason)
    listed = re.search(r"reflected (list)\(.*?assigned to variable '(\w+)' in globals", reason)
    if found is not None:
        name, kind = found.group(1), found.group(2)
    elif listed is not None:
        name, kind = listed.group(2), listed.group(1)
    else:
        return ""
    what = f"`{name}` (a {kind})" if kind else f"`{name}`"
    if kind == "function":  # a plain Python helper: numba calls only what it compiles
        return (
            f"f calls {what} from its closure or its module, and numba calls only functions "
            f"it compiles: decorate it with @numba.njit (its body follows the same rules as "
            f"f's), or write its body into f.\n"
        )
    return (
        f"f reads {what} from its closure or its module, and numba compiles only numbers, "
        f"tuples of numbers and NumPy arrays read so (a list: make it a tuple): pass the "
        f"values f needs in p instead, "
        f"ODEProblem(f, u0, tspan, p=...) with a number, an array or a tuple of them, "
        f"and read them from p in f.\n"
    )


def dtype_name(dtype: Any) -> str:
    """``"float32"`` or ``"float64"`` for a floating dtype (kernels support these two)."""
    return np.dtype(dtype).name
