"""numba's messages as plain text while a kernel compiles.

Where colorama is installed, numba colours every message it formats, and it formats
thousands while it types a kernel, nearly all of them discarded: each float constant is
first tried as a literal type, each module global as a constant, and every failed try builds
its message. Colouring one re-initializes colorama (it wraps ``sys.stdout`` and
``sys.stderr`` again): about 0.25 s of a Lorenz ensemble kernel's 4.3 s cold compile. The
messages dxode shows are stripped of colour anyway (``compiler._compile_error``).

``plain_messages`` gives numba's colour scheme (one object, which numba's modules keep
references to) a ``_markup`` that returns each message as it is, shadowing its method (a
private one: where a numba release has none, nothing changes), and removes it when the last
user leaves.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["plain_messages"]

_LOCK = threading.Lock()
_DEPTH = 0


def _unmarked(msg: str, color: Any = None, style: Any = None) -> str:
    return msg


@contextlib.contextmanager
def plain_messages() -> Iterator[None]:
    """While inside, numba formats its messages without colour (re-entrant, thread-safe)."""
    global _DEPTH
    from numba.core import errors

    scheme = errors.termcolor()
    swap = hasattr(type(scheme), "_markup")
    with _LOCK:
        if swap:
            if _DEPTH == 0:
                scheme._markup = _unmarked
            _DEPTH += 1
    try:
        yield
    finally:
        if swap:
            with _LOCK:
                _DEPTH -= 1
                if _DEPTH == 0:
                    del scheme._markup
