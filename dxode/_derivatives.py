"""The problem's own derivative functions (``jac``, ``tgrad``, ``vjp``, ``paramjac``) over lanes.

``Derivatives`` bundles them with ``f``; ``LaneFunction`` is a lane RHS that carries them to
the stiff methods; ``user_matrix`` calls ``jac``, ``tgrad`` or ``paramjac`` on a working set
and checks what it returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._rhs import as_array, foreign_array

Array = Any


@dataclasses.dataclass
class Derivatives:
    """What a batch (or a single solve) knows about the derivatives of ``f``.

    Attributes
    ----------
    f : callable
        The user's ``f(u, p, t)``.
    jac, tgrad, vjp, paramjac : callable or None
        The problem's ``jac(u, p, t)``, ``tgrad(u, p, t)``, ``vjp(u, p, t, v)`` and
        ``paramjac(u, p, t)``.
    single_lane : bool
        The functions take one trajectory without a lane axis (a plain ``solve``); otherwise
        they take lanes-last batches.
    autograd_failed : bool
        Set once ``f`` turned out not to be traceable (``"auto"`` then uses differences).
    """

    f: Callable[..., Any]
    jac: Callable[..., Any] | None = None
    tgrad: Callable[..., Any] | None = None
    vjp: Callable[..., Any] | None = None
    single_lane: bool = False
    autograd_failed: bool = False
    paramjac: Callable[..., Any] | None = None

    @classmethod
    def of(cls, prob: Any, single_lane: bool) -> Derivatives:
        return cls(prob.f, prob.jac, prob.tgrad, prob.vjp, single_lane, paramjac=prob.paramjac)


class LaneFunction:
    """A lane RHS ``rhs(u, t, out=None)`` that also carries what its derivatives need.

    Parameters
    ----------
    rhs : callable
        The lane RHS of a working set.
    p : any
        The working set's parameters (per-lane leaves lanes last).
    derivatives : Derivatives
        Shared by every working set of the batch.
    time_scale : (L,) array, optional
        The working set's lanes' time scales, ``|t1 - t0|`` of the spans they integrate
        (``dxode._jacobian.time_scale``): what ``df/dt`` is differenced against. ``None`` (a
        function no integrator has attached to lanes) counts as an unbounded span.
    """

    def __init__(
        self,
        rhs: Callable[..., Array],
        p: Any,
        derivatives: Derivatives,
        time_scale: Array | None = None,
    ) -> None:
        self.rhs = rhs
        self.p = p
        self.derivatives = derivatives
        self.time_scale = time_scale

    def __call__(self, u: Array, t: Array, out: Array | None = None) -> Array:
        return self.rhs(u, t, out)

    def on_lanes(self, time_scale: Array) -> LaneFunction:
        """This function for lanes whose time scales are ``time_scale`` (a copy)."""
        return LaneFunction(self.rhs, self.p, self.derivatives, time_scale)


def user_matrix(
    backend: Any, derivs: Derivatives, name: str, p: Any, u: Array, t: Array, m: int = 0
) -> Array:
    """The user's ``jac`` (``(n, n, L)``), ``tgrad`` (``(n, L)``) or ``paramjac``
    (``(n, m, L)``) for a working set."""
    xp = backend.xp
    fn = getattr(derivs, name)
    n, lanes = u.shape[0], u.shape[-1]
    core = {"jac": (n, n), "tgrad": (n,), "paramjac": (n, m)}[name]
    if not derivs.single_lane:
        return _checked(backend, name, fn(u, p, t), core, (lanes,), u)
    columns = [_checked(backend, name, fn(u[..., i], p, t[i]), core, (), u) for i in range(lanes)]
    return xp.stack(columns, axis=-1)


def _checked(
    backend: Any, name: str, value: Any, core: tuple[int, ...], lanes: tuple[int, ...], u: Array
) -> Array:
    xp = backend.xp
    if type(value) in (list, tuple) and len(core) == 2:
        rows = [_row(backend, name, row, core, lanes, u, (len(value),)) for row in value]
        value = xp.stack(rows)
    elif type(value) in (list, tuple):
        value = _row(backend, name, value, core, lanes, u, ())
    foreign = foreign_array(value, u, f"{name}(u, p, t)")
    if foreign is not None:
        raise foreign
    shape = tuple(getattr(value, "shape", ()))
    if shape != core + lanes:
        raise _wrong_shape(name, shape, core, lanes, u)
    if value.dtype != u.dtype:
        value = xp.astype(value, u.dtype)
    return value


def _wrong_shape(
    name: str, shape: tuple[int, ...], core: tuple[int, ...], lanes: tuple[int, ...], u: Array
) -> ValueError:
    """The error for ``name`` returning ``shape`` where ``core + lanes`` was expected."""
    what = {"jac": "df/du", "tgrad": "df/dt", "paramjac": "df/dp"}[name]
    if name == "paramjac":
        what += f" (one column per scalar of p: {core[1]})"
    layout = " (lanes last)" if lanes else ""
    return ValueError(
        f"{name}(u, p, t) returned shape {shape} for a state of shape "
        f"{tuple(u.shape[:-1]) + lanes}; it must return {what} of shape {core + lanes}{layout}"
    )


def _row(
    backend: Any,
    name: str,
    row: Any,
    core: tuple[int, ...],
    lanes: tuple[int, ...],
    u: Array,
    outer: tuple[int, ...],
) -> Array:
    """A list of entries (arrays of the lane shape, or numbers) as one array, lanes last;
    ``outer`` is the shape of the lists holding ``row`` (for the error)."""
    xp = backend.xp
    n = core[-1]
    if type(row) not in (list, tuple) or len(row) != n:
        raise ValueError(
            f"a {name} given as nested lists must have rows of {n} entries each (row i holds "
            f"the derivatives of f_i)"
        )
    entries = [xp.asarray(as_array(backend, e), dtype=u.dtype) for e in row]
    for entry in entries:
        if not _broadcasts(tuple(entry.shape), lanes):
            raise _wrong_shape(name, (*outer, n, *entry.shape), core, lanes, u)
    return xp.stack([xp.broadcast_to(entry, lanes) for entry in entries])


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether an array of ``shape`` broadcasts to ``to``."""
    tail = to[len(to) - len(shape) :] if shape else ()
    return len(shape) <= len(to) and all(d in (1, e) for d, e in zip(shape, tail, strict=True))
