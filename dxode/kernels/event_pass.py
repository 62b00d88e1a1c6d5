"""The event pass of a differentiated kernel solve with callbacks, run by the compiled kernel.

A differentiated solve with callbacks first finds the events without gradients
(``sensitivity.event_plan``); on the kernel path that pass is the plain kernel solve with the
callbacks on the sensitivity algorithm's device, so the events (and so the segments) are those
of the same solve without gradients on that device, bit for bit, at a kernel's cost instead of
the array path's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _pytree
from .batch import KernelBatch, lane_params
from .cpu import run_cpu
from .ensemble_batch import check_state
from .events import run_events

__all__ = ["kernel_event_log"]


def kernel_event_log(
    static: Any,
    callbacks: Any,
    u0: np.ndarray,
    leaves: list[Any],
    t0: np.ndarray,
    t1: np.ndarray,
    device: str = "cpu",
    **run: Any,
) -> tuple[np.ndarray, ...]:
    """The events of lanes ``u0`` ``(n, L)`` on spans ``t0``, ``t1`` ``(L,)`` with parameter
    leaf values ``leaves``: ``(lane, t, callback, retcode)`` as ``event_plan`` logs them (by
    lane, in firing order), from the kernel on ``device`` (``"cpu"``, with ``run``:
    ``run_cpu``'s block and threads, or ``"cuda"``).
    A method the kernels run no callbacks with raises (``KernelBatch``), as without
    gradients."""
    u0 = np.ascontiguousarray(u0)
    check_state(u0[..., 0])
    lanes = u0.shape[-1]
    p = _pytree.rebuild(static.p_template, leaves)
    layout, params = lane_params(p, static.lane_leaf, lanes, u0.dtype)
    ends = np.stack([np.asarray(t0), np.asarray(t1)])  # nothing else is saved
    batch = KernelBatch(
        static.f,
        u0,
        params,
        layout,
        np.asarray(t0),
        np.asarray(t1),
        ends,
        static.tstops,
        static.options,
        jac=static.jac,
        tgrad=static.tgrad,
        callbacks=callbacks,
    )
    if device == "cuda":
        from .cuda import run_cuda

        result, events = run_events(run_cuda, batch)
    else:
        result, events = run_events(lambda b: run_cpu(b, **run), batch)
    assert events is not None
    return (
        np.asarray(events.trajectory, dtype=np.int64),
        np.asarray(events.t),
        np.asarray(events.callback, dtype=np.int64),
        np.asarray(result.retcode, dtype=np.int64),
    )
