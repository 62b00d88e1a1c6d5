"""The kernel cache directory and what dxode keeps there besides numba's own files.

Generated kernel sources live in ``$DXODE_KERNEL_CACHE`` (else ``~/.cache/dxode/kernels``),
where numba's ``cache=True`` keeps their machine code between processes. Before compiling a
kernel, dxode probes each user function once with numba to learn whether it takes ``u`` as
a tuple of numbers or as an array; that probe is a small compilation of its own (about
0.1 s, most of a cached kernel's first call after numba's start-up), so its answer is
remembered here too, keyed by everything that decides it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._rhs import wrong_dtype
from .errors import KernelCompileError, numba_refusals
from .rhs_source import numba_ready, where_defined

__all__ = [
    "cache_dir",
    "check_float_array",
    "probed_mode",
    "remembered_mode",
    "returned_shape",
    "write_atomically",
]

_MODES: dict[tuple[Any, ...], bool] = {}
_ANSWERS = {"tuple": False, "array": True}


def cache_dir() -> Path:
    """Where generated kernel sources (and numba's cache beside them) are kept."""
    env = os.environ.get("DXODE_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "dxode" / "kernels"


def probed_mode(
    key: tuple[Any, ...],
    fn: Callable[..., Any],
    n: int,
    dtype: str,
    rest: tuple[Any, ...],
    error: Callable[[Exception], Exception],
    check: Callable[[Any], None] | None = None,
) -> bool:
    """Whether the user function ``fn`` takes ``u`` as an array (``True``) or as a tuple of
    ``n`` numbers of ``dtype`` (``False``, tried first), its other arguments' numba types
    being ``rest``: compiled for one lane each way until one compiles, then
    ``check(dispatcher)`` (what it returns); neither compiling raises ``error(numba's first
    error)``. Remembered by ``key`` (``remembered_mode``)."""

    def probe() -> bool:
        import numba
        from numba.core import types

        ready = numba_ready(fn)
        dt = getattr(types, dtype)
        first_error = None
        for as_array in (False, True):
            u_type = types.Array(dt, 1, "C") if as_array else types.UniTuple(dt, n)
            # bounds checked (the probe only; a kernel does not check): the trial call of
            # ``check`` raises for u[9] of 2 components, which a tuple refuses to compile
            dispatcher = numba.njit(ready, boundscheck=as_array)
            try:
                dispatcher.compile((u_type, *rest))
            except numba_refusals() as err:
                first_error = first_error or err
                continue
            if check is not None:
                check(dispatcher)
            return as_array
        assert first_error is not None
        raise error(first_error) from None

    return remembered_mode(key, probe)


_FAILED = object()  # what a trial call that raised returned


def returned_shape(dispatcher: Any, n: int, dtype: str, *rest: Any) -> tuple[int, ...] | None:
    """The shape of what a probed user function returns (the generated code reads rows
    ``0 .. n-1`` of it, and of each row for a ``jac``, unchecked): that of one call at
    ``u = (1, ..., 1)``, ``t = 0`` with the other arguments ``rest`` after ``t``'s place
    (``rest[0]`` is ``p``); ragged rows give ``-1`` as their length. Where that call raises
    (left to the kernel), a tuple's length from its type; ``None`` for a number.

    Raises ``KernelCompileError`` where the call reads past the end of an array ``u`` (the
    probe checks bounds: ``u[9]`` of 2 components, which a kernel would read unchecked).
    """
    from numba.core import types

    signature = dispatcher.nopython_signatures[-1]
    returned = signature.return_type
    ones = np.ones(n, dtype=dtype)
    u = ones if isinstance(signature.args[0], types.Array) else tuple(ones)
    try:
        value = dispatcher(u, rest[0], ones[0] * 0, *rest[1:])
    except IndexError as err:
        raise KernelCompileError(
            f"the function defined at {where_defined(dispatcher.py_func)} indexes u or p past "
            f"its end at u = (1, ..., 1), t = 0 ({err}; u[2] of a state of 2 components, "
            f"say), which the array path refuses with an IndexError too; the compiled "
            f"kernels pass u and p as tuples of their items"
        ) from None
    except Exception:  # an f failing at this trial point is left to the kernel
        value = _FAILED
    if isinstance(returned, (types.Number, types.Boolean)):
        return None
    if value is _FAILED:
        return (len(returned),) if isinstance(returned, types.BaseTuple) else None
    try:
        return tuple(np.shape(value))
    except ValueError:  # rows of different lengths
        return (len(value), -1)


def check_float_array(
    dispatcher: Any, n: int, dtype: str, p: Any, *rest: Any, who: str = "f(u, p, t)"
) -> None:
    """Raise the array path's ``TypeError`` where the compiled ``f`` (or ``who``: an affect)
    returns a result not in the state's dtype, which the kernel would cast silently: an array
    of integers or bools (``np.array([1, 2])``, ``u > 0``; from its numba type), or floats of
    the other precision (``np.zeros(2)`` or a float64 constant for a float32 state). Rows
    (a list or tuple) of Python numbers take the state's dtype on both paths.

    The precision is judged as the array path judges it, by one NumPy call of the Python
    function at ``u = (1, ..., 1)``, ``t = 0`` (``rest``: its arguments after ``t``): numba
    computes a float32 ``x`` times the literal ``2.0`` in float64, NumPy in float32. A call
    that raises is left to the kernel.
    """
    from numba.core import types

    returned = dispatcher.nopython_signatures[-1].return_type
    if isinstance(returned, types.Array) and not isinstance(returned.dtype, types.Float):
        raise wrong_dtype(returned.dtype, dtype, who)
    got = _numpy_result_dtype(dispatcher.py_func, n, dtype, p, *rest)
    if got is not None and got.kind == "f" and got != np.dtype(dtype):  # complex: told later
        raise wrong_dtype(got, dtype, who)


def _numpy_result_dtype(fn: Callable[..., Any], n: int, dtype: str, p: Any, *rest: Any) -> Any:
    """The dtype of ``fn(u, p, t, *rest)`` on the array path (rows stacked as there) for a
    state ``u = (1, ..., 1)`` of ``dtype`` at ``t = 0``, called quietly; ``None`` where the
    call raises or returns no array."""
    import warnings

    from .._rhs import as_array
    from ..backends import get_backend

    u = np.ones(n, dtype=dtype)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = as_array(get_backend("numpy"), fn(u, p, u.dtype.type(0), *rest), dtype=u.dtype)
    except Exception:
        return None
    return getattr(value, "dtype", None)


def remembered_mode(key: tuple[Any, ...], probe: Callable[[], bool]) -> bool:
    """Whether a user function takes ``u`` as an array (``True``) or a tuple (``False``):
    ``probe()``'s answer for ``key`` (the function's digest and every type it is compiled
    for, as strings), remembered in this process and on disk. Only answers are remembered:
    a function that fails to compile is probed (and reported) again every time."""
    import numba

    key = (*key, numba.__version__)
    if key in _MODES:
        return _MODES[key]
    path = cache_dir() / "modes" / hashlib.sha256(repr(key).encode()).hexdigest()
    try:
        answer = _ANSWERS.get(path.read_text())
    except OSError:
        answer = None
    if answer is None:
        answer = probe()
        with contextlib.suppress(OSError):  # an unwritable cache only costs the probe
            write_atomically(path, "array" if answer else "tuple")
    _MODES[key] = answer
    return answer


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (its directory made if missing) through a temporary file
    and a rename, so that other processes see the old or the new contents, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
