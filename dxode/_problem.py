"""ODEProblem: the vector field, initial state, time span and parameters of one IVP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _validation

__all__ = ["ODEProblem"]

_UNSET: Any = object()

SCIPY_HINT = "(dxode's order is f(u, p, t), not SciPy's f(t, y))"


class ODEProblem:
    """The initial value problem ``du/dt = f(u, p, t)``, ``u(t0) = u0``, on ``tspan``.

    Parameters
    ----------
    f : callable
        ``f(u, p, t) -> du/dt``, returning an array of ``u``'s shape and dtype (or a list of
        rows, which is stacked). Write it once with operators, indexing (``x, y, z = u``) and
        ``numpy`` / ``autograd.numpy`` functions: it then runs on NumPy and CuPy arrays alike,
        and in ensembles on ``(n, B)`` batches of lanes (see the docs' RHS rules).
    u0 : array_like
        Initial state, of any shape with at least one axis (a scalar is refused: give
        ``[x0]``), real float32 or float64 (integers and bools become float64). The solution
        keeps this dtype and array library end to end.
    tspan : (float, float)
        ``(t0, t1)``; ``t1 < t0`` integrates backwards.
    p : any, optional
        Parameters passed to ``f`` unchanged: an array, a tuple/dict of arrays, or any object.
    vjp : callable, optional
        ``vjp(u, p, t, v) -> (u_bar, p_bar)``: the vector-Jacobian products of ``f`` with
        respect to ``u`` and ``p`` (``p_bar`` shaped like ``p``), used by gradients instead of
        tracing ``f`` with autograd. In ensembles it receives lanes-last batches like ``f``.
    jac : callable, optional
        ``jac(u, p, t) -> df/du``, the ``(n, n)`` Jacobian (entry ``[i, j]`` is
        ``df_i/du_j``) for a 1-D state of shape ``(n,)``, used by stiff methods. In ensembles
        it receives lanes-last batches (``u`` ``(n, B)``, ``t`` ``(B,)``) and returns
        ``(n, n, B)``. It may return nested lists of rows (numbers are broadcast). Without
        it, stiff methods compute the Jacobian (autograd or finite differences).
    tgrad : callable, optional
        ``tgrad(u, p, t) -> df/dt`` of shape ``(n,)`` (``(n, B)`` in ensembles), used by
        Rosenbrock methods. Without it, a forward difference in ``t`` (one RHS evaluation
        per step; exactly zero for an autonomous ``f``).
    paramjac : callable, optional
        ``paramjac(u, p, t) -> df/dp`` of shape ``(n, m)`` for a 1-D state: column ``k`` is
        the derivative with respect to the ``k``-th scalar of ``p``, counting the leaves of
        ``p`` in order, each flattened (a per-trajectory leaf by one trajectory's part).
        In ensembles ``(n, m, B)``. With ``jac`` it gives gradients their derivatives of
        ``f`` without autograd (on every backend, and one contraction per direction for
        ``ForwardSensitivity``); a ``vjp``, when given, is preferred for adjoints.

    Raises
    ------
    ValueError, TypeError
        At construction, for non-finite ``u0`` or ``p``, a non-floating ``u0``, an empty or
        non-finite ``tspan``, a float16, empty or scalar ``u0``, or an ``f`` (``jac``, ...) that is
        not callable with the arguments it is given.
    """

    def __init__(
        self,
        f: Callable[..., Any],
        u0: Any,
        tspan: Any,
        p: Any = None,
        *,
        vjp: Callable[..., Any] | None = None,
        jac: Callable[..., Any] | None = None,
        tgrad: Callable[..., Any] | None = None,
        paramjac: Callable[..., Any] | None = None,
    ) -> None:
        _check_functions(f, vjp, jac, tgrad, paramjac)
        self.f = f
        self.vjp = vjp
        self.jac = jac
        self.tgrad = tgrad
        self.paramjac = paramjac
        self.u0 = _validation.as_state_array("u0", u0)
        self.tspan = _validation.as_tspan(tspan)
        _validation.check_parameters_finite(p)
        self.p = p

    def remake(
        self,
        *,
        f: Any = _UNSET,
        u0: Any = _UNSET,
        tspan: Any = _UNSET,
        p: Any = _UNSET,
        vjp: Any = _UNSET,
        jac: Any = _UNSET,
        tgrad: Any = _UNSET,
        paramjac: Any = _UNSET,
    ) -> ODEProblem:
        """A copy with the given fields replaced.

        Only the replaced fields are validated (as at construction): the others were
        validated when this problem was made and are shared with it as they are, so a
        ``prob_func`` that changes ``p`` pays for checking ``p`` alone.
        """
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        functions = {"f": f, "vjp": vjp, "jac": jac, "tgrad": tgrad, "paramjac": paramjac}
        changed = {name: fn for name, fn in functions.items() if fn is not _UNSET}
        if changed:
            new.__dict__.update(changed)
            _check_functions(new.f, new.vjp, new.jac, new.tgrad, new.paramjac)
        if u0 is not _UNSET:
            new.u0 = _validation.as_state_array("u0", u0)
        if tspan is not _UNSET:
            new.tspan = _validation.as_tspan(tspan)
        if p is not _UNSET:
            _validation.check_parameters_finite(p)
            new.p = p
        return new

    def __repr__(self) -> str:
        return (
            f"ODEProblem(f={getattr(self.f, '__name__', self.f)!s}, "
            f"u0 shape={tuple(self.u0.shape)}, dtype={self.u0.dtype}, tspan={self.tspan})"
        )


def _check_functions(f: Any, vjp: Any, jac: Any, tgrad: Any, paramjac: Any) -> None:
    """Raise unless ``f`` and each given derivative function are callable with their arguments."""
    if not callable(f):
        raise TypeError(f"f must be callable as f(u, p, t), got {type(f).__name__}")
    _validation.check_arguments("f", f, "u, p, t", hint=SCIPY_HINT)
    if vjp is not None:
        if not callable(vjp):
            raise TypeError(f"vjp must be callable as vjp(u, p, t, v), got {type(vjp).__name__}")
        _validation.check_arguments("vjp", vjp, "u, p, t, v")
    for name, fn in (("jac", jac), ("tgrad", tgrad), ("paramjac", paramjac)):
        if fn is not None:
            if not callable(fn):
                raise TypeError(
                    f"{name} must be callable as {name}(u, p, t), got {type(fn).__name__}"
                )
            _validation.check_arguments(name, fn, "u, p, t")
