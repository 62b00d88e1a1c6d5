"""Vector-Jacobian products of the user's right-hand side, over a working set of lanes.

``f(u, p, t)`` is differentiated with autograd (written with ``autograd.numpy``, or with
operators and indexing only), or through a user-supplied ``vjp``. Parameters are a pytree
whose leaves are either per-lane (a trailing lane axis) or shared by all lanes; only the
leaves marked differentiable get cotangents.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _column_boxes, _pytree
from ._derivatives import Derivatives, user_matrix
from ._rhs import as_array
from .backends import get_backend
from .backends._base import ordered_sum

Array = Any

_PLAIN_NUMPY = (
    "the right-hand side applied a plain `numpy` function to a value autograd is tracing, or "
    "wrote one into a NumPy array (du[0] = ...); to differentiate it, write f with "
    "`autograd.numpy` (import autograd.numpy as anp) and return its rows as a list "
    "([u[1], -k * u[0]]), or differentiate through the compiled kernels (kernel=True), "
    "which do not trace f"
)


def hides_the_trace(exc: Exception) -> bool:
    """Whether ``exc``, raised while autograd traced ``f``, comes from plain NumPy meeting a
    traced value: a function that cannot take autograd's boxes, or a traced value written
    into a float array ("setting an array element with a sequence")."""
    text = str(exc)
    if isinstance(exc, ValueError):
        return "setting an array element with a sequence" in text
    return "Box" in text or "Node" in text


@dataclasses.dataclass
class TracedRHS:
    """The RHS of a batch, differentiable with respect to the state and chosen parameter leaves.

    Attributes
    ----------
    f : callable
        The user's ``f(u, p, t)``.
    p_template : pytree
        ``p`` with its leaves in order (their values are replaced on every call).
    lane_leaf, diff_leaf : list of bool
        Per leaf: whether it carries a trailing lane axis, whether it is differentiated.
    single_lane : bool
        ``f`` takes one trajectory without a lane axis (a plain ``solve``).
    vjp : callable, optional
        A user-supplied ``vjp(u, p, t, v) -> (u_bar, p_bar)`` (``p_bar`` a pytree like ``p``).
    jac, paramjac : callable, optional
        The problem's ``jac(u, p, t)`` and ``paramjac(u, p, t)``: together (and without a
        ``vjp``) they give the VJPs and JVPs of ``f`` without autograd.
    backend : Backend, optional
        Where the batch computes (NumPy by default). Autograd traces NumPy only; on other
        backends the derivatives come from ``vjp`` or from ``jac`` with ``paramjac``.
    """

    f: Callable[..., Any]
    p_template: Any
    lane_leaf: list[bool]
    diff_leaf: list[bool]
    single_lane: bool
    vjp: Callable[..., Any] | None = None
    backend: Any = None
    jac: Callable[..., Any] | None = None
    paramjac: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = get_backend("numpy")

    def pullback(
        self,
        y: Array,
        t: Array,
        leaves: list[Any],
        wrt: list[int] | None = None,
        columns: bool = False,
    ) -> tuple[Array, Callable[[Array], tuple[Array, list[Any]]]]:
        """``f(y, p, t)`` and its VJP ``v -> (y_bar, [leaf cotangents of the diff leaves])``.

        ``y`` is ``(*shape, L)`` (``L = 1`` for a single trajectory); ``leaves`` are this
        working set's parameter leaves; ``wrt`` the positions of the leaves to differentiate
        (default: the differentiated ones). ``columns``: autograd traces the state and the
        per-lane leaves as ``dxode._column_boxes.Columns`` (the same numbers, faster over
        very many lanes; the VJP may then be called many times).
        """
        diff_idx = self.diff_positions() if wrt is None else wrt
        if self.vjp is not None:
            return self._user_pullback(y, t, leaves, diff_idx)
        if self.has_jacobians:
            return self._jacobian_pullback(y, t, leaves, diff_idx)
        import autograd

        if columns:
            y, leaves = _columns(y, leaves, self.lane_leaf)

        def call(y_: Array, *diff_values: Any) -> Array:
            return self._evaluate(y_, t, substituted(leaves, diff_idx, diff_values), columns)

        argnums = tuple(range(1 + len(diff_idx)))
        try:
            with warnings.catch_warnings():
                # A plain numpy function hides the trace: reported below, with the fix.
                warnings.filterwarnings("ignore", "Output seems independent of input")
                vjp, value = autograd.make_vjp(call, argnum=argnums)(
                    y, *[leaves[i] for i in diff_idx]
                )
        except (TypeError, AttributeError, ValueError) as exc:
            if not hides_the_trace(exc):
                raise
            raise TypeError(_PLAIN_NUMPY) from exc
        if getattr(value, "dtype", None) == np.dtype(object):
            raise TypeError(_PLAIN_NUMPY)

        def pull(v: Array) -> tuple[Array, list[Any]]:
            grads = vjp(v)
            if columns:
                grads = [np.asarray(g) if isinstance(g, np.ndarray) else g for g in grads]
            return grads[0], list(grads[1:])

        return value, pull

    def vjp_for(self, leaves: list[Any]) -> Callable[..., tuple[Array, list[Any]]]:
        """``vjp(y, t, v, out=None) -> (y_bar, [cotangents of the differentiated leaves])``:
        the VJP of ``f`` at ``(y, t)`` applied to ``v``, for these parameter leaves. A user
        ``vjp`` runs without evaluating ``f`` (and ``p`` is assembled once), and when it
        returns ``u_bar`` as a list of rows they are stacked into ``out`` (if given)."""
        if self.vjp is None:
            return lambda y, t, v, out=None: self.pullback(y, t, leaves)[1](v)
        p = _pytree.rebuild(self.p_template, leaves)
        wrt = self.diff_positions()
        checks = [(i, leaves[i], _shape(leaves[i]), self.lane_leaf[i]) for i in wrt]
        return lambda y, t, v, out=None: self._call_user_vjp(y, t, p, v, checks, out)

    def _call_user_vjp(
        self,
        y: Array,
        t: Array,
        p: Any,
        v: Array,
        checks: list[tuple[int, Any, tuple[int, ...], bool]],
        out: Array | None = None,
    ) -> tuple[Array, list[Any]]:
        """The user's ``vjp`` at ``(y, p, t)`` applied to ``v``, its results checked: ``checks``
        holds, per differentiated leaf of ``p``, its position, value, shape and whether it is
        per-lane (called once per stage and step: the common case costs no more than needed)."""
        backend = self.backend
        if self.single_lane:
            shape = y.shape[:-1]
            u_bar, p_bar = _vjp_pair(self.vjp(y[..., 0], p, t[0], v[..., 0]), shape)
            u_bar = _checked_u_bar(as_array(backend, u_bar), shape)
            u_bar = backend.xp.expand_dims(u_bar, -1)
        else:
            u_bar, p_bar = _vjp_pair(self.vjp(y, p, t, v), y.shape)
            u_bar = _checked_u_bar(as_array(backend, u_bar, out=out), y.shape)
        if not checks:  # no parameter differentiated: p_bar is not looked at (None will do)
            return u_bar, []
        p_leaves = _bar_leaves(p, p_bar)
        bars = []
        for i, leaf, shape, lane in checks:
            bar = as_array(backend, p_leaves[i])  # rows unbroadcast: sizes checked
            if getattr(bar, "shape", None) != shape:
                _check_p_bar_leaf(i, leaf, bar, lane)
            bars.append(bar)
        return u_bar, bars

    def diff_positions(self) -> list[int]:
        """Positions of the differentiated parameter leaves."""
        return [i for i, d in enumerate(self.diff_leaf) if d]

    def jvp(
        self, y: Array, t: Array, leaves: list[Any], y_dot: Array, leaf_dots: dict[int, Any]
    ) -> tuple[Array, Array]:
        """``f(y, p, t)`` and its forward-mode derivative along ``(y_dot, leaf_dots)``.

        ``leaf_dots`` maps leaf positions to tangents shaped like those leaves (the other
        leaves are held fixed).
        """
        if self.has_jacobians:
            xp = self.backend.xp
            value, j_u, j_p = self.linearization(y, t, leaves)
            offsets = parameter_offsets(leaves, self.lane_leaf)
            # Column j of each matrix times tangent entry j, added over j in order.
            dot = ordered_sum(xp, xp.moveaxis(j_u, 1, 0) * y_dot[:, None, ...])
            for i, tangent in leaf_dots.items():
                flat = xp.reshape(tangent, _flat_shape(tangent, self.lane_leaf[i]))
                cols = xp.moveaxis(j_p[:, offsets[i] : offsets[i + 1], ...], 1, 0)
                dot = dot + ordered_sum(xp, cols * flat[:, None, ...])
            return value, dot
        import autograd

        idx = sorted(leaf_dots)

        def call(y_: Array, *values: Any) -> Array:
            return self._evaluate(y_, t, substituted(leaves, idx, values))

        argnums = tuple(range(1 + len(idx)))
        try:
            with warnings.catch_warnings():  # f ignores y and the leaves: a zero derivative
                warnings.filterwarnings("ignore", "Output seems independent of input")
                jvp = autograd.make_jvp(call, argnum=argnums)(y, *[leaves[i] for i in idx])
                value, value_dot = jvp((y_dot, *[leaf_dots[i] for i in idx]))
        except (TypeError, AttributeError, ValueError) as exc:
            if not hides_the_trace(exc):
                raise
            raise TypeError(_PLAIN_NUMPY) from exc
        if getattr(value_dot, "dtype", None) == np.dtype(object):
            raise TypeError(_PLAIN_NUMPY)
        return value, value_dot

    def _evaluate(self, y: Array, t: Array, leaves: list[Any], columns: bool = False) -> Array:
        import autograd.numpy as anp

        p = _pytree.rebuild(self.p_template, leaves)
        if self.single_lane:  # one trajectory: f sees the state without the lane axis
            state = y[..., 0]
            return anp.expand_dims(_as_traced_array(self.f(state, p, t[0]), state), -1)
        stack = _column_boxes.stack_rows if columns else anp.stack
        return _as_traced_array(self.f(y, p, t), y, stack)

    def _plain_value(self, y: Array, t: Array, p: Any) -> Array:
        """``f(y, p, t)`` evaluated plainly (nothing traced), lanes last."""
        backend = self.backend
        if self.single_lane:  # one trajectory: f sees the state without the lane axis
            return backend.xp.expand_dims(as_array(backend, self.f(y[..., 0], p, t[0])), -1)
        return as_array(backend, self.f(y, p, t))

    @property
    def has_jacobians(self) -> bool:
        """Whether ``jac`` and ``paramjac`` stand in for autograd (no ``vjp`` given)."""
        return self.vjp is None and self.jac is not None and self.paramjac is not None

    def linearization(self, y: Array, t: Array, leaves: list[Any]) -> tuple[Array, Array, Array]:
        """``f``, ``df/du`` ``(n, n, L)`` and ``df/dp`` ``(n, m, L)`` at ``(y, t)`` from the
        problem's ``jac`` and ``paramjac`` (``y`` a 1-D state per lane, ``(n, L)``)."""
        backend = self.backend
        p = _pytree.rebuild(self.p_template, leaves)
        derivs = Derivatives(
            self.f, jac=self.jac, single_lane=self.single_lane, paramjac=self.paramjac
        )
        m = parameter_offsets(leaves, self.lane_leaf)[-1]
        value = self._plain_value(y, t, p)
        j_u = user_matrix(backend, derivs, "jac", p, y, t)
        j_p = user_matrix(backend, derivs, "paramjac", p, y, t, m)
        return value, j_u, j_p

    def _jacobian_pullback(
        self, y: Array, t: Array, leaves: list[Any], wrt: list[int]
    ) -> tuple[Array, Callable[[Array], tuple[Array, list[Any]]]]:
        """The VJP as products with the transposed ``jac`` and ``paramjac``."""
        xp = self.backend.xp
        value, j_u, j_p = self.linearization(y, t, leaves)
        offsets = parameter_offsets(leaves, self.lane_leaf)

        def pull(v: Array) -> tuple[Array, list[Any]]:
            weights = v[:, None, ...]  # (n, 1, L): row i of each matrix times v_i
            u_bar = ordered_sum(xp, j_u * weights)
            p_rows = ordered_sum(xp, j_p * weights)  # (m, L)
            bars = []
            for i in wrt:
                rows = p_rows[offsets[i] : offsets[i + 1], ...]
                if self.lane_leaf[i]:
                    bars.append(xp.reshape(rows, tuple(leaves[i].shape)))
                else:  # a leaf shared by the lanes: their contributions summed
                    summed = ordered_sum(xp, xp.moveaxis(rows, -1, 0))
                    bars.append(xp.reshape(summed, tuple(np.shape(leaves[i]))))
            return u_bar, bars

        return value, pull

    def _user_pullback(
        self, y: Array, t: Array, leaves: list[Any], wrt: list[int]
    ) -> tuple[Array, Callable[[Array], tuple[Array, list[Any]]]]:
        """``f`` evaluated plainly (nothing to trace) and the user's ``vjp`` as the pullback."""
        p = _pytree.rebuild(self.p_template, leaves)
        value = self._plain_value(y, t, p)
        checks = [(i, leaves[i], _shape(leaves[i]), self.lane_leaf[i]) for i in wrt]
        return value, lambda v: self._call_user_vjp(y, t, p, v, checks)


_VJP_RETURNS = (
    "vjp(u, p, t, v) must return (u_bar, p_bar): u_bar shaped like u {shape} (or a list of "
    "its rows), p_bar shaped like p"
)


def _vjp_pair(result: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """A user ``vjp``'s ``(u_bar, p_bar)``; anything else (the state's rows alone, say,
    which would unpack as a pair) is refused with what to return."""
    if type(result) not in (tuple, list) or len(result) != 2:
        got = type(result).__name__ + (
            f" of length {len(result)}" if type(result) in (tuple, list) else ""
        )
        raise ValueError(_VJP_RETURNS.format(shape=tuple(shape)) + f"; it returned a {got}")
    return result[0], result[1]


def _checked_u_bar(u_bar: Array, shape: tuple[int, ...]) -> Array:
    """``u_bar`` as the user's ``vjp`` gave it, which must have the state's ``shape``."""
    got = tuple(getattr(u_bar, "shape", ()))
    if got != tuple(shape):
        raise ValueError(_VJP_RETURNS.format(shape=tuple(shape)) + f"; its u_bar has shape {got}")
    return u_bar


def _bar_leaves(tree: Any, bar: Any) -> list[Any]:
    """The cotangents in a user ``vjp``'s ``p_bar`` of the leaves of ``p`` (``tree``): its
    structure must follow ``p``'s down to the leaves; where ``p`` has an array leaf,
    ``p_bar`` may hold a list or tuple of its rows (stacked by the caller)."""
    if isinstance(tree, dict) and isinstance(bar, dict) and bar.keys() == tree.keys():
        return [leaf for key in tree for leaf in _bar_leaves(tree[key], bar[key])]
    if isinstance(tree, (list, tuple)):
        if isinstance(bar, (list, tuple)) and len(bar) == len(tree):
            return [
                leaf for item, b in zip(tree, bar, strict=True) for leaf in _bar_leaves(item, b)
            ]
        raise ValueError(
            "vjp(u, p, t, v) must return (u_bar, p_bar) with p_bar shaped like p: p holds "
            f"{len(tree)} items here, its p_bar {_describe(bar)}"
        )
    if isinstance(tree, dict):
        raise ValueError(
            f"vjp(u, p, t, v) must return p_bar shaped like p: a dict with p's keys "
            f"{list(tree)}, not {_describe(bar)}"
        )
    return [bar]


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(getattr(leaf, "shape", ()))


def _check_p_bar_leaf(i: int, leaf: Any, bar: Array, lane: bool) -> None:
    """A user ``vjp``'s cotangent ``bar`` of leaf ``i`` of ``p`` has the leaf's size (a
    smaller one would be broadcast: a wrong gradient)."""
    size, got = math.prod(_shape(leaf)), math.prod(_shape(bar))
    if got == size:
        return
    lanes = (
        " one cotangent per trajectory (the leaf holds per-trajectory parameters), not "
        "summed over the trajectories;"
        if lane
        else ""
    )
    raise ValueError(
        f"vjp(u, p, t, v) must return p_bar shaped like p: leaf {i} of p has shape "
        f"{_shape(leaf)} (lanes last), so its p_bar needs{lanes} that shape, not {_shape(bar)}"
    )


def _columns(y: Array, leaves: list[Any], lane_leaf: list[bool]) -> tuple[Array, list[Any]]:
    """The state and the per-lane array leaves as ``Columns`` (see ``dxode._column_boxes``)."""
    as_columns = _column_boxes.as_columns
    return as_columns(y), [
        as_columns(leaf) if lane and isinstance(leaf, np.ndarray) else leaf
        for leaf, lane in zip(leaves, lane_leaf, strict=True)
    ]


def _as_traced_array(value: Any, state: Any, stack: Any = None) -> Any:
    """An RHS output as one array: a list of rows stacked with ``stack`` (autograd's own
    ``stack`` by default).

    As on the plain path (``Backend.stack_rows``), each row is broadcast to the state's row
    shape, so a constant row such as ``-9.81`` fills a whole row of lanes, and a Python number
    takes the state's dtype.
    """
    import autograd.numpy as anp

    if type(value) not in (list, tuple):
        return value
    shape = tuple(state.shape[1:])
    rows = [
        np.full(shape, row, dtype=state.dtype)
        if isinstance(row, (int, float))
        else row
        if anp.shape(row) == shape
        else _broadcast_row(row, shape)
        for row in value
    ]
    return (stack or anp.stack)(rows)


def _broadcast_row(row: Any, shape: tuple[int, ...]) -> Any:
    """``row`` broadcast to ``shape``, its missing leading axes added first: autograd's
    ``broadcast_to`` cannot differentiate adding axes (a shared parameter's scalar as a row
    of lanes, ``[u[1], -p[0]]``, failed with "Can't handle extra leading dims")."""
    import autograd.numpy as anp

    missing = len(shape) - anp.ndim(row)
    if missing > 0:
        row = anp.reshape(row, (1,) * missing + anp.shape(row))
    return anp.broadcast_to(row, shape)


def leaf_size(leaf: Any, per_lane: bool) -> int:
    """Elements of one lane's part of a parameter leaf."""
    shape = np.shape(leaf)
    return math.prod(shape[:-1] if per_lane else shape)


def parameter_offsets(leaves: list[Any], lane_leaf: list[bool]) -> list[int]:
    """Where each leaf's scalars start among the columns of ``paramjac`` (and the total)."""
    offsets = [0]
    for leaf, lane in zip(leaves, lane_leaf, strict=True):
        offsets.append(offsets[-1] + leaf_size(leaf, lane))
    return offsets


def substituted(leaves: list[Any], positions: Any, values: Any) -> list[Any]:
    """``leaves`` with the entries at ``positions`` replaced by ``values``."""
    current = list(leaves)
    for i, value in zip(positions, values, strict=True):
        current[i] = value
    return current


def _flat_shape(tangent: Any, lane: bool) -> tuple[int, ...]:
    """A leaf tangent's shape with one lane's scalars in one axis (lanes kept last)."""
    shape = tuple(tangent.shape)
    return (math.prod(shape[:-1]), shape[-1]) if lane else (math.prod(shape), 1)
