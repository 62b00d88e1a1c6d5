"""Callbacks inside the lane integrator: locate events per lane, apply them, log them.

The integrator's ``Events`` observer (``dxode.integrator.observers``) calls three hooks:
``start`` once (preset times at ``t0``), ``locate`` on each iteration's ``Step`` after the
accept/reject decision (cuts lanes' steps at their earliest continuous event, before any
saving), and ``apply`` after the lanes advanced (affects, termination, a fresh ``f``).
Per-lane state lives in the working set, so it is compacted with the lanes: ``ev_g{k}`` the
condition value of continuous callback ``k`` at the lane's time (``0`` right after it fired
where the affects left that value unchanged), ``ev_s{k}`` the sign it had before its crossing
in the last step (or its last nonzero sign), ``ev_f{k}`` whether it crossed (in its
direction) in the last step, ``ev_z{k}`` whether it sat on zero when that step began,
``ev_i{k}`` the next time of preset callback ``k``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import _pytree
from .._rhs import as_array, foreign_array, is_traced_result, wrong_dtype
from ..backends import to_host
from ..integrator.lanes import expand
from ..solvers import Step
from .callbacks import (
    CallbackSet,
    ContinuousCallback,
    DiscreteCallback,
    PresetTimeCallback,
    nan_condition_error,
)
from .roots import bracket_root

Array = Any


@dataclasses.dataclass
class LaneEvents:
    """What the integrator needs to run callbacks on a batch of lanes.

    Attributes
    ----------
    callbacks : CallbackSet
    p_for : callable
        ``p_for(params) -> p``: the user's ``p`` for lanes holding the per-lane parameter
        arrays ``params`` (as ``LaneProblem.rhs_for``).
    single : bool
        The user's functions see one trajectory without the lane axis (a single problem).
    """

    callbacks: CallbackSet
    p_for: Callable[[tuple[Array, ...]], Any]
    single: bool = False


class EventHandler:
    """The integrator's side of the callbacks of one batch (see the module docstring)."""

    def __init__(
        self,
        spec: LaneEvents,
        backend: Any,
        stepper: Any,
        rhs_for: Callable[[tuple[Array, ...]], Any],
        direction: float,
        u0: Array,
    ) -> None:
        self._spec = spec
        self._rhs_for = rhs_for
        self._backend = backend
        self._xp = backend.xp
        self._stepper = stepper
        self._direction = direction
        self._dtype = u0.dtype
        self._shape = tuple(u0.shape[:-1])
        self._eps = float(self._xp.finfo(u0.dtype).eps)
        self._callbacks = tuple(spec.callbacks)
        self._continuous = [
            (k, cb) for k, cb in enumerate(self._callbacks) if isinstance(cb, ContinuousCallback)
        ]
        # The order callbacks apply in at a lane's time: the continuous one that fired (at
        # most one), then the discrete and preset-time ones in the set's order.
        self._order = self._continuous + [
            (k, cb)
            for k, cb in enumerate(self._callbacks)
            if not isinstance(cb, ContinuousCallback)
        ]
        self._points = max((cb.interp_points for _, cb in self._continuous), default=0)
        self._preset_times = {
            k: self._sorted_times(cb.times)
            for k, cb in enumerate(self._callbacks)
            if isinstance(cb, PresetTimeCallback)
        }
        self._log: list[tuple[Array, ...]] = []
        self._nan = self._xp.asarray(float("nan"), dtype=u0.dtype)

    # ---- setup ------------------------------------------------------------------------------

    def _sorted_times(self, times: Any) -> Array:
        ordered = times if self._direction > 0 else times[::-1]
        return self._backend.asarray(ordered.copy(), dtype=self._dtype)

    def tstops(self, tstops: Array | None) -> Array | None:
        """The integrator's ``tstops`` with every preset time added (ordered, no repeats)."""
        xp = self._xp
        parts = ([] if tstops is None else [tstops]) + list(self._preset_times.values())
        if not parts:
            return tstops
        merged = xp.unique_values(xp.concat(parts))  # sorted ascending
        return merged if self._direction > 0 else xp.flip(merged)

    def start(self, lanes: Any, rhs: Any) -> Array | None:
        """Set up the lanes' event state at ``t0`` and fire preset times equal to ``t0``.

        Returns the lanes a callback terminated, or ``None``.
        """
        xp = self._xp
        u, t, params = lanes["u"], lanes["t"], lanes.group("p")
        n = t.shape[0]
        if n == 0:
            return None
        for k, cb in self._continuous:
            g = self._condition(k, cb, u, t, params)
            lanes.put(**{f"ev_g{k}": g, f"ev_s{k}": xp.sign(g), f"ev_z{k}": g == 0})
            lanes.put(**{f"ev_f{k}": xp.zeros(n, dtype=xp.bool)})
        for k, times in self._preset_times.items():
            before = self._direction * (xp.reshape(times, (-1, 1)) - t) < 0
            lanes.put(**{f"ev_i{k}": xp.sum(xp.astype(before, xp.int64), axis=0)})
        if lanes.get("nf_extra", None) is None:
            lanes.put(nf_extra=xp.zeros(n, dtype=xp.int64))
        return self.apply(lanes, rhs, xp.ones(n, dtype=xp.bool), None, discrete=False)

    # ---- after each trial step --------------------------------------------------------------

    def locate(
        self, lanes: Any, step: Step, accept: Array, t_new: Array
    ) -> tuple[Array, Array, Array | None, Array | None]:
        """Cut each accepted lane's ``step`` (ending at ``t_new``) at its earliest continuous
        event.

        Returns ``(t_end, u_end, which, cut)``: the lanes' step ends (the event where one
        fired), the index of the continuous callback that fired (``-1``: none) and the lanes
        whose step was cut short; ``which`` and ``cut`` are ``None`` when no event fired.
        """
        if not self._continuous:
            return t_new, step.u1, None, None
        found, brackets = self._scan(lanes, step, accept, t_new)
        if not any(bool(self._xp.any(f)) for f in found):
            return t_new, step.u1, None, None
        return self._cut(lanes, step, t_new, found, brackets)

    def _scan(
        self, lanes: Any, step: Step, accept: Array, t_new: Array
    ) -> tuple[list[Array], list[_Bracket]]:
        """Sample the continuous conditions at ``interp_points`` points of each accepted step.

        Returns per continuous callback the lanes where its condition crossed zero (in its
        direction) and the bracket ``(a, b, g(a), g(b))`` of the first crossing (fractions of
        the step); the lanes' condition values at the step's end go into the working set.
        """
        xp = self._xp
        params = lanes.group("p")
        n = step.t.shape[0]
        m = self._points
        prev = [lanes[f"ev_g{k}"] for k, _ in self._continuous]
        for (k, _), g in zip(self._continuous, prev, strict=True):
            lanes.put(**{f"ev_z{k}": g == 0})
        ref = [xp.sign(g) for g in prev]
        found = [xp.zeros(n, dtype=xp.bool) for _ in self._continuous]
        zeros = xp.zeros(n, dtype=self._dtype)
        brackets = [_Bracket(zeros, zeros, zeros, zeros) for _ in self._continuous]
        theta_prev = 0.0
        for j in range(1, m + 1):
            theta = j / m
            if j == m:
                u_j, t_j = step.u1, t_new
            else:
                u_j = step.interpolate(xp.full((n,), theta, dtype=self._dtype))
                t_j = step.t + theta * step.h
            for i, (k, cb) in enumerate(self._continuous):
                v = self._condition(k, cb, u_j, t_j, params)
                s = xp.sign(v)
                cross = accept & ~found[i] & (ref[i] != 0) & (s != ref[i])
                if cb.direction == "up":
                    cross = cross & (ref[i] < 0)
                elif cb.direction == "down":
                    cross = cross & (ref[i] > 0)
                brackets[i] = brackets[i].where(xp, cross, _Bracket(theta_prev, theta, prev[i], v))
                found[i] = found[i] | cross
                ref[i] = xp.where(~found[i] & (s != 0), s, ref[i])
                prev[i] = v
            theta_prev = theta
        extra = self._stepper.interpolation_rhs_evals
        if extra:
            self._count(lanes, xp.full((n,), extra * (m - 1), dtype=xp.int64))
        for i, (k, _) in enumerate(self._continuous):
            lanes.put(**{f"ev_g{k}": xp.where(accept, prev[i], lanes[f"ev_g{k}"])})
            lanes.put(**{f"ev_s{k}": xp.where(accept, ref[i], lanes[f"ev_s{k}"])})
            lanes.put(**{f"ev_f{k}": found[i]})
        return found, brackets

    def _cut(
        self, lanes: Any, step: Step, t_new: Array, found: list[Array], brackets: list[_Bracket]
    ) -> tuple[Array, Array, Array, Array]:
        """Narrow each callback's crossing; a lane's earliest one fires and ends its step."""
        xp = self._xp
        n = step.t.shape[0]
        best = xp.full((n,), 2.0, dtype=self._dtype)
        which = xp.full((n,), -1, dtype=xp.int64)
        for i, (k, cb) in enumerate(self._continuous):
            if not bool(xp.any(found[i])):
                continue
            theta_k = self._root(lanes, step, cb, k, found[i], brackets[i])
            earlier = found[i] & (theta_k < best)
            best = xp.where(earlier, theta_k, best)
            which = xp.where(earlier, k, which)
        fired = which >= 0
        theta = xp.where(fired, best, 1.0)
        cut = fired & (theta < 1)
        u_end = step.interpolate(theta)
        extra = self._stepper.interpolation_rhs_evals
        if extra:
            self._count(lanes, extra * xp.astype(fired, xp.int64))
        t_end = xp.where(cut, step.t + theta * step.h, t_new)
        return t_end, u_end, which, cut

    def _root(
        self,
        lanes: Any,
        step: Step,
        cb: ContinuousCallback,
        k: int,
        found: Array,
        bracket: _Bracket,
    ) -> Array:
        """The event point (fraction of the step) of callback ``k`` in the lanes ``found``."""
        xp = self._xp
        extra = self._stepper.interpolation_rhs_evals
        idx = xp.nonzero(found)[0]

        def sub(x: Array) -> Array:
            return xp.take(x, idx, axis=-1)

        p_s = tuple(sub(p) for p in lanes.group("p"))
        # Only interpolants with extra stages evaluate the RHS (on these lanes alone).
        lanes_step = step.take(idx, self._rhs_for(p_s) if extra else None)
        t_s, h_s = lanes_step.t, lanes_step.h

        def g(theta: Array) -> Array:
            return self._condition(k, cb, lanes_step.interpolate(theta), t_s + theta * h_s, p_s)

        habs = xp.abs(h_s)
        if cb.abstol is not None:
            width = xp.full(habs.shape, cb.abstol, dtype=self._dtype)
        else:
            scale = xp.maximum(xp.maximum(xp.abs(t_s), xp.abs(t_s + h_s)), habs)
            width = 8 * self._eps * scale
        tol = xp.maximum(width / habs, 4 * self._eps)
        a, b, ga, gb = (sub(x) for x in bracket)
        left, _, evaluations = bracket_root(xp, g, a, b, ga, gb, tol)
        if extra:
            self._count(lanes, _expand_sub(xp, found, evaluations * extra, 0))
        return _expand_sub(xp, found, left, 2.0)

    # ---- after the lanes advanced -----------------------------------------------------------

    def apply(
        self, lanes: Any, rhs: Any, accept: Array, which: Array | None, discrete: bool = True
    ) -> Array | None:
        """Apply the callbacks that fired at the lanes' current times: the continuous one that
        fired, then the discrete and preset-time ones in the set's order.

        ``which`` names each lane's continuous callback that fired (from ``locate``). Lanes
        whose state an event touched get a fresh ``f`` and fresh condition values. Returns
        the lanes a callback terminated, or ``None`` when no callback fired.
        """
        xp = self._xp
        u, t, params = lanes["u"], lanes["t"], lanes.group("p")
        n = t.shape[0]
        changed = xp.zeros(n, dtype=xp.bool)
        stop = xp.zeros(n, dtype=xp.bool)
        at_event = self._at_event(which, u, t, params)
        for k, cb in self._order:
            if isinstance(cb, ContinuousCallback):
                if which is None:
                    continue
                fired = which == k
            elif isinstance(cb, DiscreteCallback):
                if not discrete:
                    continue
                fired = accept & ~stop & self._condition(k, cb, u, t, params)
            else:
                times = self._preset_times[k]
                pos = lanes[f"ev_i{k}"]
                nxt = xp.take(times, xp.clip(pos, max=times.shape[0] - 1))
                fired = accept & ~stop & (pos < times.shape[0]) & (nxt == t)
                lanes.put(**{f"ev_i{k}": pos + xp.astype(fired, xp.int64)})
            if not bool(xp.any(fired)):
                continue
            u, stop = self._fire(lanes, k, cb, u, t, params, fired, stop)
            changed = changed | fired
        if not bool(xp.any(changed)):
            return None
        mask = expand(xp, changed, u)
        lanes.put(u=u, f=xp.where(mask, rhs(u, t), lanes["f"]))
        self._count(lanes, xp.astype(changed, xp.int64))
        for k, cb in self._continuous:
            g = xp.where(changed, self._condition(k, cb, u, t, params), lanes[f"ev_g{k}"])
            if k in at_event:
                # A lane the affects left on the crossing (its condition unchanged) sits
                # there: 0, so it fires again only after leaving zero. One they moved off it
                # keeps the new value, so a crossing right after the event is found.
                g = xp.where((which == k) & (g == at_event[k]), 0.0, g)
            if which is not None:
                # Zero at another callback's event (a tie): the sign it had before that
                # crossing, so it fires right after, at the same time, instead of never. So
                # too where it crossed in this step and already sits across at the event (the
                # two roots a rounding error apart) and the affects left its value as it was.
                # One that sat on zero since its own event and found no crossing keeps
                # sitting there where it is a rounding error across at this event.
                before = lanes[f"ev_s{k}"]
                other = (which >= 0) & (which != k)
                tie = other & (g == 0)
                if k in at_event:
                    kept = other & (g == at_event[k])
                    across = at_event[k] * before <= 0
                    tie = tie | (kept & lanes[f"ev_f{k}"] & across)
                    sitting = kept & lanes[f"ev_z{k}"] & ~lanes[f"ev_f{k}"] & across
                    g = xp.where(sitting, 0.0, g)
                g = xp.where(tie, before, g)
            lanes.put(**{f"ev_g{k}": g})
        return stop

    def _at_event(
        self, which: Array | None, u: Array, t: Array, params: tuple[Array, ...]
    ) -> dict[int, Array]:
        """Each continuous callback's condition at the lanes' event, before any affect (none
        where no continuous event fired)."""
        xp = self._xp
        if which is None or not bool(xp.any(which >= 0)):
            return {}
        return {k: self._condition(k, cb, u, t, params) for k, cb in self._continuous}

    def _fire(
        self,
        lanes: Any,
        k: int,
        cb: Any,
        u: Array,
        t: Array,
        params: tuple[Array, ...],
        fired: Array,
        stop: Array,
    ) -> tuple[Array, Array]:
        xp = self._xp
        mask = expand(xp, fired, u)
        after = u
        if cb.affect is not None:
            after = xp.where(mask, self._affect(k, cb, u, t, params, fired), u)
        if cb.terminate is True:
            stop = stop | fired
        elif cb.terminate is not False:
            stop = stop | (fired & self._terminate(k, cb, after, t, params))
        idx = xp.nonzero(fired)[0]

        def sub(x: Array) -> Array:
            return xp.take(x, idx, axis=-1)

        before_saved, after_saved = cb.save_positions
        self._log.append(
            (
                sub(lanes["lane"]),
                sub(t),
                xp.full(idx.shape, k, dtype=xp.int64),
                sub(u) if before_saved else xp.full_like(sub(u), self._nan),
                sub(after) if after_saved else xp.full_like(sub(after), self._nan),
            )
        )
        return after, stop

    def _count(self, lanes: Any, evaluations: Array) -> None:
        lanes.put(nf_extra=lanes["nf_extra"] + evaluations)

    def log(self) -> dict[str, Array]:
        """The events logged, lanes last and grouped by lane (in time order within a lane)."""
        xp = self._xp
        if not self._log:
            empty = xp.zeros((*self._shape, 0), dtype=self._dtype)
            none = xp.zeros(0, dtype=xp.int64)
            return {
                "lane": none,
                "t": xp.zeros(0, dtype=self._dtype),
                "callback": none,
                "u_before": empty,
                "u_after": empty,
            }
        fields = [xp.concat([entry[i] for entry in self._log], axis=-1) for i in range(5)]
        order = xp.argsort(fields[0], stable=True)
        fields = [xp.take(f, order, axis=-1) for f in fields]
        names = ("lane", "t", "callback", "u_before", "u_after")
        return dict(zip(names, fields, strict=True))

    # ---- calling the user's functions -------------------------------------------------------

    def _call(self, fn: Any, u: Array, t: Array, params: tuple[Array, ...], *extra: Any) -> Any:
        p = self._spec.p_for(params)
        if self._spec.single:
            return fn(u[..., 0], p, t[0], *(x[0] for x in extra))
        return fn(u, p, t, *extra)

    def _per_lane(self, k: int, what: str, out: Any, n: int) -> Array:
        xp = self._xp
        _refuse_traced_result(k, what, out)
        if out is None:
            raise TypeError(f"callback {k}: {what} returned None; did it forget to return?")
        if not self._spec.single and type(out) in (bool, int, float):
            # A Python constant (``True``: fire every step) is the same for every lane, as
            # it is for each trajectory on the kernel path; an array reduced over the lanes
            # by mistake (``np.max(u)``) is a NumPy scalar and still refused below.
            out = xp.full((n,), out)
        if not hasattr(out, "shape") or not hasattr(out, "dtype"):
            out = xp.asarray(out)
        if not xp.isdtype(out.dtype, ("bool", "integral", "real floating")):
            raise TypeError(
                f"callback {k}: {what} returned {out.dtype} values; it must return real "
                f"numbers (bools for a test)"
            )
        expected = () if self._spec.single else (n,)
        if tuple(out.shape) != expected:
            kind = "a scalar" if self._spec.single else f"shape ({n},), one value per lane"
            raise ValueError(
                f"callback {k}: {what} returned shape {tuple(out.shape)}; it must return {kind}"
            )
        return xp.reshape(out, (n,))

    def _condition(self, k: int, cb: Any, u: Array, t: Array, params: tuple[Array, ...]) -> Array:
        xp = self._xp
        out = self._per_lane(k, "condition", self._call(cb.condition, u, t, params), t.shape[0])
        if isinstance(cb, ContinuousCallback):
            if xp.isdtype(out.dtype, "bool"):
                raise TypeError(
                    f"callback {k}: a ContinuousCallback condition returns values whose zero "
                    f"crossings are events, not bools (use DiscreteCallback for a test)"
                )
            out = out if out.dtype == self._dtype else xp.astype(out, self._dtype)
            self._check_no_nan(k, out, u, t)
            return out
        if not xp.isdtype(out.dtype, "bool"):
            raise TypeError(
                f"callback {k}: a DiscreteCallback condition must return bools, got {out.dtype}"
            )
        return out

    def _check_no_nan(self, k: int, values: Array, u: Array, t: Array) -> None:
        """Raise if a condition is NaN on a lane whose state is finite (it has no sign, so no
        crossing could be found, and the lane would crawl). A lane whose state has itself
        become non-finite is left to fail with its own return code."""
        xp = self._xp
        finite = xp.all(xp.isfinite(u), axis=tuple(range(u.ndim - 1)))
        bad = xp.isnan(values) & finite
        if bool(xp.any(bad)):
            raise nan_condition_error(k, float(to_host(t)[to_host(bad)][0]))

    def _terminate(self, k: int, cb: Any, u: Array, t: Array, params: tuple[Array, ...]) -> Array:
        out = self._per_lane(k, "terminate", self._call(cb.terminate, u, t, params), t.shape[0])
        if not self._xp.isdtype(out.dtype, "bool"):
            raise TypeError(f"callback {k}: terminate must return bools, got {out.dtype}")
        return out

    def _affect(
        self, k: int, cb: Any, u: Array, t: Array, params: tuple[Array, ...], fired: Array
    ) -> Array:
        xp = self._xp
        shape = tuple(u.shape[:-1]) if self._spec.single else tuple(u.shape)
        # The affect gets its own copy of the state: one that changes ``u`` in place (as
        # DifferentialEquations.jl's affect! does) must not reach the lanes that did not fire,
        # the logged state before the event, or the step the event cut.
        mine = u if is_traced_result(u) else self._xp.asarray(u, copy=True)
        p_leaves = [x for x in _pytree.leaves(self._spec.p_for(params)) if _is_plain_array(x)]
        kept = [self._xp.asarray(x, copy=True) for x in p_leaves]
        raw = self._call(cb.affect, mine, t, params, fired)
        for leaf, was in zip(p_leaves, kept, strict=True):
            if not bool(self._xp.all((leaf == was) | (leaf != leaf))):
                leaf[...] = was  # the caller's p as it was
                raise TypeError(
                    f"callback {k}: affect changed p in place; p is fixed during a solve (shared "
                    f"by the trajectories, and your own array): keep a parameter that events "
                    f"change in the state u, and return its new value from affect"
                )
        _refuse_traced_result(k, "affect", raw)
        try:
            out = as_array(self._backend, raw, shape=shape, dtype=u.dtype)
        except (ValueError, TypeError) as exc:  # the stacking's message names f's result
            raise type(exc)(
                f"callback {k}: affect's rows do not make the new state of shape {shape}: {exc}"
            ) from None
        if not hasattr(out, "shape") or tuple(out.shape) != shape:
            got = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
            raise ValueError(
                f"callback {k}: affect returned {got}; it must return the new state, shape {shape}"
            )
        foreign = foreign_array(out, u, f"callback {k}: affect")
        if foreign is not None:
            raise foreign
        if out.dtype != u.dtype:
            raise wrong_dtype(out.dtype, u.dtype, f"callback {k}: affect")
        return xp.expand_dims(out, axis=-1) if self._spec.single else out


def _refuse_traced_result(k: int, what: str, out: Any) -> None:
    """Raise if callback ``k``'s ``what`` returned values autograd is tracing from plain
    arguments: it closes over a value being differentiated, which dxode cannot see."""
    if is_traced_result(out):
        raise TypeError(
            f"callback {k}: {what} returned a value autograd is tracing although u and p are "
            f"plain: it uses a variable being differentiated from outside (a closure); pass "
            f"it in the problem's p and read it from p, so that dxode differentiates the "
            f"solve with respect to it"
        )


def _is_plain_array(x: Any) -> bool:
    """Whether ``x`` is an array an affect could change in place (not a number, not traced)."""
    return hasattr(x, "shape") and hasattr(x, "__setitem__") and not is_traced_result(x)


class _Bracket(NamedTuple):
    """A sign change of a condition inside a step: fractions ``a < b`` and ``g(a)``, ``g(b)``."""

    a: Array
    b: Array
    ga: Array
    gb: Array

    def where(self, xp: Any, mask: Array, other: _Bracket) -> _Bracket:
        """``other`` on the lanes where ``mask`` holds, ``self`` elsewhere."""
        return _Bracket(*(xp.where(mask, o, x) for o, x in zip(other, self, strict=True)))


def _expand_sub(xp: Any, mask: Array, values: Array, fill: float) -> Array:
    """``(L,)`` values: ``values[j]`` at the ``j``-th lane where ``mask`` holds, else ``fill``."""
    pos = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    spread = xp.take(values, xp.clip(pos, min=0))
    return xp.where(mask, spread, xp.asarray(fill, dtype=values.dtype))
