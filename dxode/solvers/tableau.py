"""Butcher tableaus for explicit Runge–Kutta methods, stored as validated data."""

from __future__ import annotations

import dataclasses
import functools
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["ButcherTableau"]

_TOL: Final = 1e-12


def _as_float_array(name: str, value: ArrayLike | None, ndim: int) -> NDArray[np.float64] | None:
    if value is None:
        return None
    array = np.array(value, dtype=np.float64)
    if array.ndim != ndim:
        raise ValueError(f"tableau field {name!r} must be {ndim}-D, got shape {array.shape}")
    array.setflags(write=False)
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class ButcherTableau:
    """An explicit Runge–Kutta tableau, checked when built.

    The method advances ``u1 = u0 + h * sum_i b[i] * k[i]`` with stages
    ``k[i] = f(u0 + h * sum_{j<i} a[i, j] * k[j], t0 + c[i] * h)``.

    Parameters
    ----------
    c : (s,) array
        Stage times as fractions of the step.
    a : (s, s) array
        Strictly lower-triangular stage coefficients; each row sums to ``c``.
    b : (s,) array
        Solution weights; they sum to one.
    order : int
        Classical order of the ``b`` solution.
    interpolant : (s + e, d) array
        Dense output: ``u(t0 + theta*h) = u0 + h * sum_i w_i(theta) * k[i]`` with
        ``w_i(theta) = sum_j interpolant[i, j] * theta**(j + 1)``.
    interpolant_order : int
        Order of the dense output.
    b_error : (s,) array, optional
        ``b - b_embedded``; the local error estimate is ``h * sum_i b_error[i] * k[i]``.
        Sums to zero. ``None`` for fixed-step methods.
    error_order : int, optional
        Order of the embedded solution (needed with ``b_error``).
    c_extra : (e,) array, optional
        Times of the extra stages needed only by the interpolant (as in Verner's methods),
        computed lazily for the steps that are interpolated.
    a_extra : (e, s + e) array, optional
        Coefficients of the extra stages (each may use the main and earlier extra stages).

    Attributes
    ----------
    stages : int
        Number of stages ``s`` (derived, never given by hand).
    fsal : bool
        Whether the last stage is ``f(u1, t0 + h)`` and can start the next step (first
        same as last; derived, never given by hand).
    """

    c: NDArray[np.float64]
    a: NDArray[np.float64]
    b: NDArray[np.float64]
    order: int
    interpolant: NDArray[np.float64]
    interpolant_order: int
    b_error: NDArray[np.float64] | None = None
    error_order: int | None = None
    c_extra: NDArray[np.float64] | None = None
    a_extra: NDArray[np.float64] | None = None

    stages: int = dataclasses.field(init=False)
    fsal: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        convert = object.__setattr__
        if self.interpolant is None:
            raise ValueError("a tableau needs its dense-output 'interpolant'")
        for name, ndim in [
            ("c", 1),
            ("a", 2),
            ("b", 1),
            ("b_error", 1),
            ("interpolant", 2),
            ("c_extra", 1),
            ("a_extra", 2),
        ]:
            convert(self, name, _as_float_array(name, getattr(self, name), ndim))
        self._check()
        s = self.c.shape[0]
        convert(self, "stages", s)
        fsal = bool(
            self.c[-1] == 1.0 and self.b[-1] == 0.0 and np.array_equal(self.a[-1, :-1], self.b[:-1])
        )
        convert(self, "fsal", fsal)

    def _check(self) -> None:
        c, a, b = self.c, self.a, self.b
        s = c.shape[0]
        if a.shape != (s, s) or b.shape != (s,):
            raise ValueError(f"tableau shapes disagree: c {c.shape}, a {a.shape}, b {b.shape}")
        if np.any(np.triu(a) != 0.0):
            raise ValueError("tableau 'a' must be strictly lower triangular (explicit method)")
        if not np.allclose(a.sum(axis=1), c, rtol=0.0, atol=_TOL):
            raise ValueError("each row of tableau 'a' must sum to the matching 'c'")
        if abs(b.sum() - 1.0) > _TOL:
            raise ValueError(f"tableau weights 'b' must sum to 1, got {b.sum()!r}")
        if (self.b_error is None) != (self.error_order is None):
            raise ValueError("'b_error' and 'error_order' must be given together")
        if self.b_error is not None:
            if self.b_error.shape != (s,):
                raise ValueError(f"'b_error' must have shape ({s},), got {self.b_error.shape}")
            if abs(self.b_error.sum()) > _TOL:
                raise ValueError(f"'b_error' must sum to 0, got {self.b_error.sum()!r}")
        if (self.c_extra is None) != (self.a_extra is None):
            raise ValueError("'c_extra' and 'a_extra' must be given together")
        e = 0 if self.c_extra is None else self.c_extra.shape[0]
        if self.a_extra is not None:
            if self.a_extra.shape != (e, s + e):
                raise ValueError(
                    f"'a_extra' must have shape ({e}, {s + e}), got {self.a_extra.shape}"
                )
            if np.any(np.triu(self.a_extra, k=s) != 0.0):
                raise ValueError(
                    "extra stage i may only use the main stages and extra stages before it"
                )
            if not np.allclose(self.a_extra.sum(axis=1), self.c_extra, rtol=0.0, atol=_TOL):
                raise ValueError("each row of 'a_extra' must sum to the matching 'c_extra'")
        if self.interpolant.shape[0] != s + e:
            raise ValueError(
                f"'interpolant' needs one row per stage ({s + e}), got {self.interpolant.shape[0]}"
            )
        at_one = self.interpolant.sum(axis=1)
        expected = np.concatenate([b, np.zeros(e)])
        if not np.allclose(at_one, expected, rtol=0.0, atol=1e-10):
            raise ValueError("the interpolant at theta = 1 must reproduce the weights 'b'")

    @property
    def adaptive(self) -> bool:
        """Whether the tableau carries an embedded error estimate."""
        return self.b_error is not None

    @functools.cached_property
    def real_stability_interval(self) -> float:
        """The length ``r`` of the method's stability interval on the negative real axis.

        A step of ``u' = λu`` multiplies ``u`` by the stability polynomial
        ``R(z) = 1 + sum_k z^k b^T A^(k-1) 1`` at ``z = hλ``; for real ``-r <= z <= 0`` it does
        not amplify (``|R(z)| <= 1``). Found on a grid of spacing ``1e-3`` (Tsit5: 3.506).
        """
        s = self.stages
        coefficients = [1.0]
        power = np.ones(s)
        for _ in range(s):  # b^T A^(k-1) 1 for k = 1 .. s (A is nilpotent beyond that)
            coefficients.append(float(self.b @ power))
            power = self.a @ power
        x = np.arange(0.0, 2.0 * s * s + 1e-3, 1e-3)  # explicit methods: r <= 2 s^2
        values = np.polynomial.polynomial.polyval(-x, coefficients)
        outside = np.nonzero(np.abs(values) > 1.0 + 1e-12)[0]
        return float(x[outside[0] - 1]) if outside.size else float(x[-1])
