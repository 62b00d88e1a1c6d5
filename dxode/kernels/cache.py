"""The kernel cache directory and what dxode keeps there besides numba's own files.

Generated kernel sources live in ``$DXODE_KERNEL_CACHE`` (else ``~/.cache/dxode/kernels``),
where numba's ``cache=True`` keeps their machine code between processes. Before compiling a
kernel, dxode probes each user function once with numba to learn whether it takes ``u`` as
a tuple of numbers or as an array; that probe is a small compilation of its own (about
0.1 s, most of a cached kernel's first call after numba's start-up), so its answer is
remembered here too, keyed by everything that decides it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "remembered_mode"]

_MODES: dict[tuple[Any, ...], bool] = {}
_ANSWERS = {"tuple": False, "array": True}


def cache_dir() -> Path:
    """Where generated kernel sources (and numba's cache beside them) are kept."""
    env = os.environ.get("DXODE_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "dxode" / "kernels"


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
        _write(path, "array" if answer else "tuple")
    _MODES[key] = answer
    return answer


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; an unwritable cache only costs the probe."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        pass
