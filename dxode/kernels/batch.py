"""A batch of lanes as the compiled kernels take it, and what they give back.

``KernelBatch`` gathers the per-lane inputs (lanes last, like the array path's working set)
and the solver options as the two small arrays the generated ``block`` reads; ``prepare``
compiles (or reuses) the kernel for it. ``run`` dispatches to a device module.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import numpy as np
from array_api_compat import is_cupy_array

from .. import _pytree
from .._options import SolverOptions
from .._validation import leaf_paths
from ..controllers import PIDController
from .autoswitch_description import AutoSwitchDescription
from .codegen import KernelLayout
from .compiler import CompiledKernel, compile_kernel, dtype_name, user_function_mode
from .description import StepperDescription, describe
from .errors import ARRAY_PATH, KernelUnsupportedError
from .events import EVENT_CAPACITY, event_arrays, event_layout, merged_tstops
from .lane_arrays import array_module
from .rhs_source import ParamLayout
from .rosenbrock_description import RosenbrockDescription, stiff_derivatives

__all__ = ["KernelBatch", "KernelResult", "check_callback_method", "lane_params"]

DEFAULT_BLOCK = 32
# The outputs (``KernelBatch.outputs``) every lane's retirement writes in full: UEND, TEND, RET,
# NACC, NREJ, NF. A device needs only to allocate them; SAVED (NaN where a lane never got) and
# NSW (counters) start from their values.
WRITTEN_IN_FULL = range(1, 7)


@dataclasses.dataclass
class KernelResult:
    """Per-lane outcomes (host or device arrays, lanes first).

    ``saved`` is ``(L, nsave, n)`` (NaN where a failed lane never got), ``u`` ``(L, n)``;
    ``steps`` holds ``(t, u)`` of every accepted step for recorded one-lane solves on the
    CPU, and every lane's buffers ``(times, states, counts)`` for recorded CUDA runs
    (``cuda.run_cuda``);
    ``events`` the host event log ``EVT, EVK, EVUB, EVUA, EVN`` with callbacks (see
    ``events_codegen``).
    ``switches`` (``AutoSwitch`` only) every lane's switches and attempts with the stiff method,
    ``(L, 2)``. ``screen`` (``KernelBatch.screen_steps`` only) is ``(largest, states,
    times)``: every lane's largest accepted ``|h|`` ``(L,)``, and its states ``(L, P, n)``
    and times ``(L, P)`` after the accepted steps asked for (NaN where it took fewer).
    """

    retcode: Any
    t: Any
    u: Any
    naccept: Any
    nreject: Any
    nf: Any
    saved: Any
    steps: tuple[Any, Any] | None = None
    events: tuple[Any, ...] | None = None
    switches: Any = None
    screen: tuple[Any, Any, Any] | None = None

    @classmethod
    def from_outputs(
        cls,
        outs: Any,
        steps: tuple[Any, Any] | None,
        events: tuple[Any, ...] | None,
        screen: bool = False,
    ) -> KernelResult:
        """The result from the kernel's outputs, in ``KernelBatch.outputs``'s order (after
        ``NF``: the screen's ``HMAX, PSTEP, PSTATE, PTIME`` for a ``screen`` batch, else
        ``NSW`` where there is one)."""
        saved, u, t, ret, nacc, nrej, nf, *extra = outs
        result = cls(ret, t, u, nacc, nrej, nf, saved, steps, events)
        if screen:
            largest, _, states, times = extra
            return dataclasses.replace(result, screen=(largest, states, times))
        return dataclasses.replace(result, switches=extra[0] if extra else None)


@dataclasses.dataclass
class KernelBatch:
    """One batch of lanes for a compiled kernel.

    Attributes
    ----------
    f : callable
        The user's ``f(u, p, t)``.
    u0 : (n, L) array
        Initial states, lanes last, in the state's dtype.
    params : (rows, L) array
        Every lane's ``p``, flattened (see ``ParamLayout``).
    param_layout : ParamLayout
    t0, t1 : (L,) float64 arrays
    save_times : (nsave, L) array or None
        Save times per lane (``None``: save nothing on a grid).
    tstops : (K,) array or None
    options : SolverOptions
    error_components : int
        The first components the error norm controls (``0``: all; see ``KernelLayout``).
    jac, tgrad : callable or None
        The problem's ``jac(u, p, t)`` and ``tgrad(u, p, t)`` (stiff methods), taking one
        trajectory's ``u``.
    callbacks : CallbackSet or None
    event_capacity : int
        Events each lane's log holds (see ``events.run_events``).
    screen_steps : (P, L) array, optional
        Run as the stability check's screen (explicit methods without callbacks, not
        recorded; ``KernelResult.screen``): also return each lane's largest accepted
        ``|h|``, and its state and time after ``screen_steps[:, g]`` accepted steps
        (ascending counts, then ``-1`` where a lane has fewer).
    """

    f: Any
    u0: np.ndarray
    params: np.ndarray
    param_layout: ParamLayout
    t0: np.ndarray
    t1: np.ndarray
    save_times: np.ndarray | None
    tstops: np.ndarray | None
    options: SolverOptions
    error_components: int = 0
    jac: Any = None
    tgrad: Any = None
    callbacks: Any = None
    event_capacity: int = EVENT_CAPACITY
    screen_steps: np.ndarray | None = None

    @property
    def n_lanes(self) -> int:
        return int(self.u0.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return self.u0.dtype

    def prepare(self, target: str, block: int, record: bool = False) -> CompiledKernel:
        """The compiled kernel for this batch on ``target`` (``"cpu"`` or ``"cuda"``)."""
        opts = self.options
        desc = describe(opts.alg)
        controller = _controller_constants(opts.controller)
        dtype = dtype_name(self.dtype)
        example = eval(
            self.param_layout.expression("COL").replace("COL", "0"),
            {"P": np.asarray(_host(self.params[:, :1]))},
        )
        n = int(self.u0.shape[0])
        derivatives: tuple[tuple[str, Any], ...] = ()
        mode = lambda fn, role: user_function_mode(fn, n, dtype, example, target, role=role)
        check_callback_method(self.callbacks, opts.alg)
        if isinstance(desc, RosenbrockDescription):
            desc, derivatives = stiff_derivatives(desc, opts.alg, n, self.jac, self.tgrad, mode)
        elif isinstance(desc, AutoSwitchDescription):
            stiff, derivatives = stiff_derivatives(
                desc.stiff, opts.alg.stiff, n, self.jac, self.tgrad, mode
            )
            desc = dataclasses.replace(desc, stiff=stiff)
        screen = self.screen_steps is not None
        if screen and not (
            isinstance(desc, StepperDescription) and self.callbacks is None and not record
        ):
            raise ValueError("screen_steps: explicit methods only, without callbacks, not recorded")
        as_array = user_function_mode(self.f, n, dtype, example, target)
        layout = KernelLayout(
            n=int(self.u0.shape[0]),
            dtype=dtype,
            params=self.param_layout.expression("COL"),
            u_as_array=as_array,
            block=block,
            target=target,
            adaptive=bool(opts.adaptive),
            controller=controller,  # type: ignore[arg-type]
            record=record,
            param_rows=int(self.params.shape[0]),
            param_dtype=self.params.dtype.name,
            error_components=self.error_components,
            events=(
                None
                if self.callbacks is None
                else event_layout(self.callbacks, int(self.u0.shape[0]), dtype, example)
            ),
            screen=screen,
        )
        return compile_kernel(self.f, desc, layout, derivatives, self.callbacks)

    def arguments(self) -> tuple[np.ndarray, ...]:
        """The generated ``block``'s array arguments before the outputs (host arrays; the
        states and parameters of a batch on the GPU stay CuPy arrays)."""
        opts = self.options
        dt = self.dtype.type
        n, lanes = self.u0.shape
        direction = 1.0 if self.t1[0] > self.t0[0] else -1.0
        xp = array_module(self.u0)
        ts = xp.full((1, lanes), direction * np.inf, dtype=self.dtype)  # the sentinel row
        if self.save_times is not None:
            ts = xp.concatenate([_lane_rows(xp, self.save_times, self.dtype), ts])
        stops = merged_tstops(self.tstops, self.callbacks, self.dtype, direction)
        tstops = (
            np.zeros(0, dtype=self.dtype) if stops is None else np.asarray(stops, dtype=self.dtype)
        )
        controlled = self.error_components or n
        atol = np.ones(n, dtype=self.dtype)  # uncontrolled components: never read
        atol[:controlled] = np.broadcast_to(
            np.asarray(_host(opts.atol), dtype=self.dtype), (controlled,)
        )
        scal = np.array(
            [opts.rtol, opts.dt or 0.0, opts.dtmin or 0.0, opts.dtmax or 0.0, direction],
            dtype=self.dtype,
        )
        ivals = np.array(
            [opts.maxiters, opts.dt is not None, opts.dtmin is not None, opts.dtmax is not None],
            dtype=np.int64,
        )
        del dt
        return (
            xp.ascontiguousarray(self.u0),
            xp.ascontiguousarray(self.params),
            _lane_rows(xp, self.t0[None, :], np.float64)[0],
            _lane_rows(xp, self.t1[None, :], np.float64)[0],
            xp.ascontiguousarray(ts),
            tstops,
            atol,
            scal,
            ivals,
        )

    def outputs(self) -> tuple[np.ndarray, ...]:
        """Freshly allocated outputs ``SAVED, UEND, TEND, RET, NACC, NREJ, NF`` (host; ``SAVED``
        on the GPU for a batch there), and ``NSW`` ``(L, 2)`` for ``AutoSwitch`` (see
        ``KernelResult.switches``), or the screen's ``HMAX, PSTEP, PSTATE, PTIME`` for
        ``screen_steps`` (see ``KernelResult.screen``)."""
        n, lanes = self.u0.shape
        nsave = 0 if self.save_times is None else self.save_times.shape[0]
        from ..solvers import AutoSwitch

        switches = isinstance(self.options.alg, AutoSwitch)
        return (
            array_module(self.u0).full((lanes, nsave, n), np.nan, dtype=self.dtype),
            np.empty((lanes, n), dtype=self.dtype),
            np.empty(lanes, dtype=self.dtype),
            np.empty(lanes, dtype=np.int64),
            np.empty(lanes, dtype=np.int64),
            np.empty(lanes, dtype=np.int64),
            np.empty(lanes, dtype=np.int64),
        ) + (
            ((np.zeros((lanes, 2), dtype=np.int64),) if switches else ())
            + (self._screen_arrays() if self.screen_steps is not None else ())
        )

    def _screen_arrays(self) -> tuple[np.ndarray, ...]:
        """``HMAX`` ``(L,)``; ``PSTEP`` ``(P + 1, L)`` (``screen_steps`` in the state's dtype
        and a row of ``-1``: the probe after the last is never reached); ``PSTATE``
        ``(L, P, n)``, ``PTIME`` ``(L, P)``, NaN until written."""
        n, lanes = self.u0.shape
        steps = np.asarray(self.screen_steps)
        probes = steps.shape[0]
        pstep = np.concatenate([steps, np.full((1, lanes), -1)]).astype(self.dtype)
        return (
            np.zeros(lanes, dtype=self.dtype),
            pstep,
            np.full((lanes, probes, n), np.nan, dtype=self.dtype),
            np.full((lanes, probes), np.nan, dtype=self.dtype),
        )

    def event_arrays(self) -> tuple[np.ndarray, ...]:
        """The block's event arguments (``()`` without callbacks; see ``events_codegen``)."""
        if self.callbacks is None:
            return ()
        n, lanes = self.u0.shape
        direction = 1.0 if self.t1[0] > self.t0[0] else -1.0
        return event_arrays(self.callbacks, lanes, n, self.dtype, direction, self.event_capacity)

    def select(self, lanes: np.ndarray, event_capacity: int) -> KernelBatch:
        """The batch of lanes ``lanes`` alone, its logs holding ``event_capacity`` events."""
        xp = array_module(self.u0)
        on_device = xp.asarray(lanes)  # CuPy takes its index arrays on the GPU
        return dataclasses.replace(
            self,
            u0=xp.ascontiguousarray(self.u0[:, on_device]),
            params=xp.ascontiguousarray(self.params[:, on_device]),
            t0=self.t0[lanes],
            t1=self.t1[lanes],
            save_times=None if self.save_times is None else self.save_times[:, lanes],
            event_capacity=event_capacity,
        )


def lane_params(
    p: Any, lane_leaf: list[bool], lanes: int, dtype: Any, xp: ModuleType = np
) -> tuple[Any, Any]:
    """``(ParamLayout, (rows, L) array)`` from a batch's ``p`` (per-lane leaves lanes last).

    Rows take the state's dtype when every leaf has it (or is a Python number), else float64.
    ``xp`` (``numpy``, or ``cupy`` for a batch on the GPU, whose per-lane leaves are CuPy
    arrays) is the rows' module.
    """
    layout = ParamLayout.of(p, lane_leaf)
    leaves = _pytree.leaves(p)
    if layout.is_none:
        return layout, xp.zeros((0, lanes), dtype=dtype)
    rows = []
    for (path, leaf), lane in zip(leaf_paths("p", p), lane_leaf, strict=True):
        value = leaf if is_cupy_array(leaf) and xp is not np else np.asarray(_host(leaf))
        if value.dtype.kind not in "fiub":  # a string, a complex number, an object, ...
            raise KernelUnsupportedError(
                f"the compiled kernels take real numbers as parameters, got {path} = "
                f"{leaf!r:.60} ({type(leaf).__name__}, dtype {value.dtype}); pass real numbers, "
                f"or use {ARRAY_PATH}"
            )
        value = xp.asarray(value)
        if not lane:
            value = xp.broadcast_to(value[..., None], (*value.shape, lanes))
        rows.append(value.reshape(-1, lanes))
    if not rows:  # an empty tuple or list
        return layout, xp.zeros((0, lanes), dtype=dtype)
    kinds = {np.dtype(dtype) if isinstance(leaf, (int, float)) else _dtype(leaf) for leaf in leaves}
    row_dtype = np.dtype(dtype) if kinds == {np.dtype(dtype)} else np.dtype(np.float64)
    _check_exact_integers(p, row_dtype)
    stacked = xp.concatenate(rows).astype(row_dtype, copy=False)
    return layout, xp.ascontiguousarray(stacked)


def _check_exact_integers(p: Any, row_dtype: np.dtype) -> None:
    """Refuse an integer parameter the kernels' float rows would round (above ``2^53`` in
    float64, ``2^24`` in float32): ``f`` would silently see a neighbouring integer."""
    exact = 2 ** (np.finfo(row_dtype).nmant + 1)
    for path, leaf in leaf_paths("p", p):
        kind = "i" if isinstance(leaf, int) else _dtype(leaf).kind
        if kind not in "iu" or np.size(leaf) == 0:
            continue
        values = np.asarray(_host(leaf))
        largest = max(int(values.max()), -int(values.min()))  # Python ints: no overflow
        if largest > exact:
            raise KernelUnsupportedError(
                f"{path} holds the integer {largest}, which the compiled kernels' "
                f"{row_dtype.name} parameters cannot hold exactly (integers up to 2^"
                f"{exact.bit_length() - 1}); pass it as a float if rounding is meant, or use "
                f"{ARRAY_PATH}"
            )


def _lane_rows(xp: ModuleType, rows: np.ndarray, dtype: Any) -> Any:
    """Host ``rows`` ``(k, L)`` as a C-contiguous ``xp`` array of ``dtype``; rows shared by the
    lanes (a broadcast column: ``lane_save_grid``'s shared save times, a shared span) are
    filled in there, not copied over."""
    if xp is not np and rows.strides[-1] == 0:
        return xp.ascontiguousarray(
            xp.broadcast_to(xp.asarray(rows[:, :1], dtype=dtype), rows.shape)
        )
    return xp.ascontiguousarray(xp.asarray(rows, dtype=dtype))


def _dtype(x: Any) -> np.dtype:
    """``x``'s dtype as NumPy's, without copying a device array to the host."""
    from ..backends import host_dtype

    return host_dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def check_parameter_dtypes(p: Any, lane_leaf: list[bool], dtype: Any) -> None:
    """Refuse, for a float32 state, a parameter that is an integer array or NumPy scalar, or
    a shared float64 one, as the array path does.

    There NumPy's promotion makes ``f`` return float64 for such a ``p``, which ``solve`` refuses;
    the kernel would silently compute ``f`` in float64 and round it to float32. Python numbers
    adapt to the state's dtype on both paths, and floating per-trajectory parameters are cast
    to it (integer ones stay integers).
    """
    if np.dtype(dtype) != np.float32:
        return
    for (path, leaf), per_lane in zip(leaf_paths("p", p), lane_leaf, strict=True):
        if type(leaf) in (bool, int, float):  # np.float64 is a float subclass
            continue
        kind = _dtype(leaf)
        if kind.kind in "iu" or (kind == np.float64 and not per_lane):
            raise TypeError(
                f"{path} has dtype {kind} for a float32 state: f(u, p, t) would compute in "
                f"float64 (the array path refuses it too); cast the parameters to float32 "
                f"(e.g. p.astype(np.float32)) or pass Python floats"
            )


_CONTROLLER_FIELDS = ("beta1", "beta2", "beta3", "safety", "factor_min", "factor_max")


def _controller_constants(ctrl: Any) -> tuple[float, ...]:
    """``(beta1, beta2, beta3, safety, factor_min, factor_max)`` of a PID controller, which
    the kernels compile in; a controller whose ``init`` or ``adapt`` is not
    ``PIDController``'s (a subclass that overrides them, or another controller) is refused:
    the kernels would run the plain PID rule with its constants instead."""
    own = all(
        getattr(type(ctrl), name, None) is getattr(PIDController, name)
        for name in ("init", "adapt")
    )
    if not isinstance(ctrl, PIDController) or not own:
        raise KernelUnsupportedError(
            f"the compiled kernels run the PID rule of PIController, IController and "
            f"PIDController (any beta1, beta2, beta3, safety, factor_min, factor_max), not "
            f"{ctrl!r}, whose init or adapt is its own; give those parameters to a "
            f"PIDController, or use {ARRAY_PATH}, which runs any controller"
        )
    return tuple(float(getattr(ctrl, name)) for name in _CONTROLLER_FIELDS)


def check_callback_method(callbacks: Any, alg: Any) -> None:
    """Refuse callbacks with a method other than an explicit Runge–Kutta one (the kernels
    locate events in the explicit methods' dense output only), naming the array path."""
    if callbacks is not None and not isinstance(describe(alg), StepperDescription):
        raise KernelUnsupportedError(
            f"the compiled kernels run callbacks with explicit Runge–Kutta methods only, "
            f"not {type(alg).__name__}; use {ARRAY_PATH}"
        )


def _host(x: Any) -> Any:
    from ..backends import to_host

    if is_cupy_array(x) or (hasattr(x, "__array_namespace__") and not isinstance(x, np.ndarray)):
        return to_host(x)
    return x
