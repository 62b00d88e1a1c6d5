"""Dense output of a whole solution: the per-step interpolants joined end to end."""

from __future__ import annotations

from typing import Any

from .._validation import holds_real_numbers
from ..solvers import Step

Array = Any


class DenseOutput:
    """Evaluate a solution anywhere in its span from its accepted steps.

    Query times become lanes: each query gathers its step's data and the method's own
    interpolant is evaluated for all queries at once.

    Parameters
    ----------
    stepper : AbstractStepper
        The method whose interpolant is used.
    rhs : callable
        The lane RHS, needed by methods whose interpolant has extra stages.
    steps : dict
        Accepted steps, lanes-last along the step axis (keys ``t, h, t_end, u0, u1, stages``),
        in order of time.
    direction : float
        +1 forward, -1 backward.
    end_state : (*shape) array, optional
        The state at the span's end after the events there (the last step's end is the state
        before them): the value at that time, as after every other event.
    """

    def __init__(
        self,
        backend: Any,
        stepper: Any,
        rhs: Any,
        steps: dict[str, Array],
        direction: float,
        end_state: Array | None = None,
    ) -> None:
        self._backend = backend  # pickles by name; its xp, a module, would not
        self._stepper = stepper
        self._rhs = rhs
        self._steps = steps
        self._direction = direction
        self.t_start = steps["t"][0]
        self.t_end = steps["t_end"][-1]
        self._end_state = end_state

    def __call__(self, t: Any) -> Array:
        """The state at ``t``: ``(*shape)`` for a scalar time, ``(len(t), *shape)`` for an array."""
        xp, d, steps = self._backend.xp, self._direction, self._steps
        like = steps["t"]
        try:
            # Numbers only: asarray would read "0.5" as 0.5, True as 1 and None as nan.
            if not holds_real_numbers(t):
                raise TypeError
            tq = xp.asarray(t, dtype=like.dtype, device=getattr(like, "device", None))
        except (TypeError, ValueError):
            raise TypeError(f"sol(t) takes a time or a 1-D array of times, got {t!r}") from None
        if tq.ndim > 1:
            raise ValueError(f"sol(t) takes a time or a 1-D array of times, got shape {tq.shape}")
        scalar = tq.ndim == 0
        tq = xp.reshape(tq, (-1,))
        lo, hi = float(self.t_start), float(self.t_end)
        if bool(xp.any(xp.isnan(tq))):
            raise ValueError("cannot interpolate at t = nan: give times in the solved span")
        outside = (d * (tq - lo) < 0) | (d * (tq - hi) > 0)
        if bool(xp.any(outside)):
            raise ValueError(f"cannot interpolate outside the solved span [{lo}, {hi}]")
        n_steps = like.shape[0]
        idx = xp.searchsorted(d * like, d * tq, side="right") - 1
        idx = xp.clip(idx, min=0, max=n_steps - 1)
        take = lambda a: xp.take(a, idx, axis=-1)
        t0, h = take(steps["t"]), take(steps["h"])
        theta = xp.clip((tq - t0) / h, min=0.0, max=1.0)
        step = Step(
            self._stepper,
            self._backend,
            self._rhs,
            t0,
            h,
            take(steps["u0"]),
            take(steps["u1"]),
            take(steps["stages"]),
        )
        values = step.interpolate(theta)
        values = xp.moveaxis(values, -1, 0)
        if self._end_state is not None:
            at_end = xp.reshape(tq == self.t_end, (-1,) + (1,) * (values.ndim - 1))
            values = xp.where(at_end, self._end_state, values)
        return values[0, ...] if scalar else values
