"""Whether values are being differentiated by autograd (no user code is called to tell)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _pytree


def is_traced(*values: Any) -> bool:
    """Whether any leaf of ``values`` is an autograd value being traced.

    Raises ``TypeError`` for a NumPy object array of traced values: what a plain ``numpy``
    function (``np.outer``, ``np.stack``, ...) makes of them, which autograd cannot follow.
    """
    from autograd.tracer import isbox

    leaves = [leaf for value in values for leaf in _pytree.leaves(value)]
    for leaf in leaves:
        if isinstance(leaf, np.ndarray) and leaf.dtype == object and any(map(isbox, leaf.flat)):
            raise TypeError(
                "an array of traced autograd values was built with a plain `numpy` function; "
                "use `autograd.numpy` (import autograd.numpy as anp) to build u0, p or tspan "
                "from differentiated values"
            )
    return any(isbox(leaf) for leaf in leaves)


def autograd_is_tracing() -> bool:
    """Whether a computation autograd is tracing called this one.

    autograd's trace level alone cannot say: it stays raised after an exception escapes a
    traced function (``TraceStack.new_trace`` has no ``finally``), so after one failed
    gradient it would report tracing for the rest of the process. A trace in progress also
    has autograd's ``trace`` on the call stack.
    """
    from autograd import tracer

    if tracer.trace_stack.top < 0:
        return False
    code = tracer.trace.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False
