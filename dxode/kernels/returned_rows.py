"""The rows a user's function returned, checked where numba does not check them (imports
numba).

The kernels count the rows of ``f`` (and of ``jac``, ``tgrad``, callbacks) once, when they
compile. A tuple's length is part of its type and a list's reads are bounds-checked, but a
NumPy array's are not: an ``f`` returning ``np.array([...])`` that is short on a later call
would be read past its end, silently. The generated CPU code passes such a result through
``rows_of``, which raises ``IndexError`` there (``CompiledKernel.call`` turns it into a
``ValueError`` naming ``f``) and compiles to nothing for tuples and lists.
"""

from __future__ import annotations

from numba import types
from numba.extending import overload

__all__ = ["rows_of"]


def rows_of(r, n):  # type: ignore[no-untyped-def]  # numba matches its unannotated overloads
    """``r`` (what a user function returned), once it has at least ``n`` rows (from Python:
    unchecked; compiled: see the module)."""
    return r


@overload(rows_of, target="cpu")
def _rows_of(r, n):  # type: ignore[no-untyped-def]  # numba compares its parameters
    if isinstance(r, types.Array) and r.ndim >= 1:

        def checked(r, n):  # pragma: no cover - compiled by numba
            if r.shape[0] < n:
                raise IndexError("an array returned by a user function has too few rows")
            return r

        return checked
    return lambda r, n: r
