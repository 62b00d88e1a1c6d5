"""A Rosenbrock method (or TRBDF2) as data, the input of ``rosenbrock_codegen``.

Rodas4 and Rodas5P are described from their ``RosenbrockTableau`` (the array path's numbers),
Rosenbrock23 and TRBDF2 from the constants of ``dxode.solvers.rosenbrock23`` and
``dxode.solvers.trbdf2``: the kernels use exactly the coefficients the array path uses.
TRBDF2 is implicit, not a Rosenbrock method, but it shares their per-step work (one
Jacobian, one factored ``W = I - gamma h J``), so it is described and generated with them.
The description also says where each lane's Jacobian and ``df/dt`` come from (the user's
``jac``/``tgrad``, or differences of ``f`` in the kernel).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..solvers import TRBDF2, Rosenbrock, Rosenbrock23
from ..solvers import rosenbrock23 as _r23
from ..solvers import trbdf2 as _trbdf2
from .errors import ARRAY_PATH, KernelUnsupportedError

__all__ = [
    "RosenbrockDescription",
    "describe_rosenbrock",
    "stiff_derivatives",
]

# How a derivative reaches the kernel: differences of f, or the user's function taking u as
# a tuple of numbers or as a small array.
DERIVATIVE_SOURCES = ("finite_difference", "tuple", "array")


@dataclasses.dataclass(frozen=True)
class RosenbrockDescription:
    """A Rosenbrock method as plain numbers (Python floats, rows as tuples).

    Attributes
    ----------
    name : str
        The method's class name (``"Rodas5P"``).
    family : str
        ``"rodas"`` (a transformed-form ``RosenbrockTableau``), ``"rosenbrock23"`` or
        ``"trbdf2"``.
    gamma : float
        The diagonal coefficient (Rosenbrock23: its ``d = 1/(2 + sqrt 2)``; TRBDF2: ``D``).
    a, C : tuple of tuple of float
        Row ``i`` holds ``a[i, :i]`` and ``C[i, :i]`` (empty for Rosenbrock23).
    c, d, b, e : tuple of float
        Stage times, ``h df/dt`` weights, solution and error weights (``s`` each).
    H : tuple of tuple of float
        Dense-output rows (``m`` rows of ``s``).
    e32 : float
        Rosenbrock23's ``6 + sqrt 2`` (0 for Rodas).
    order, error_order : int
    fsal : bool
        The step's last RHS (at ``u1``) starts the next step (Rosenbrock23).
    jac, tgrad : str
        One of ``DERIVATIVE_SOURCES``: where ``J`` and ``df/dt`` come from.
    jac_evals : int
        RHS evaluations one Jacobian costs (``n`` by differences, 0 from the user's ``jac``).
    kappa : float
        TRBDF2's Newton stopping tolerance (0 for Rosenbrock methods).
    max_iters : int
        TRBDF2's Newton iterations per stage (0 for Rosenbrock methods).
    """

    name: str
    family: str
    gamma: float
    a: tuple[tuple[float, ...], ...]
    C: tuple[tuple[float, ...], ...]
    c: tuple[float, ...]
    d: tuple[float, ...]
    b: tuple[float, ...]
    e: tuple[float, ...]
    H: tuple[tuple[float, ...], ...]
    e32: float
    order: int
    error_order: int
    fsal: bool
    jac: str = "finite_difference"
    tgrad: str = "finite_difference"
    jac_evals: int = 0
    kappa: float = 0.0
    max_iters: int = 0

    @property
    def method_stages(self) -> int:
        """Rows of the attempt's stage array ``K``: the Rodas stages, Rosenbrock23's k1, k2
        (and a spare), TRBDF2's ``h f`` at ``t``, ``t + gamma h`` and ``t + h``."""
        return len(self.b) if self.family == "rodas" else 3

    @property
    def needs_tgrad(self) -> bool:
        """Whether a step uses ``df/dt`` (the Rosenbrock methods; not TRBDF2)."""
        return self.family != "trbdf2"

    @property
    def stages(self) -> int:
        """Rows of per-step data the attempt keeps in the workspace (``codegen``'s ``stages``):
        the dense-output rows, and for FSAL methods the RHS at ``u1`` as the last row."""
        return len(self.H) + (1 if self.fsal else 0)

    @property
    def extra_stages(self) -> int:
        return 0

    @property
    def adaptive(self) -> bool:
        return True

    @property
    def rhs_per_attempt(self) -> int:
        """RHS evaluations per attempted step, counted as the array path counts them (the
        stages, a fresh ``f`` for non-FSAL methods, the Jacobian's and ``df/dt``'s; TRBDF2's
        Newton iterations are counted per lane on top)."""
        stages = {"rodas": self.method_stages, "rosenbrock23": 2, "trbdf2": 1}[self.family]
        tgrad = 1 if self.needs_tgrad and self.tgrad == "finite_difference" else 0
        return stages + self.jac_evals + tgrad

    def with_derivatives(self, n: int, jac: str, tgrad: str) -> RosenbrockDescription:
        """This method for an ``n``-state problem whose derivatives come from ``jac``/``tgrad``
        (each one of ``DERIVATIVE_SOURCES``)."""
        if jac not in DERIVATIVE_SOURCES or tgrad not in DERIVATIVE_SOURCES:
            raise ValueError(f"derivative sources must be among {DERIVATIVE_SOURCES}")
        evals = n if jac == "finite_difference" else 0
        return dataclasses.replace(self, jac=jac, tgrad=tgrad, jac_evals=evals)


def stiff_derivatives(
    desc: RosenbrockDescription,
    alg: Any,
    n: int,
    jac: Callable[..., Any] | None,
    tgrad: Callable[..., Any] | None,
    mode: Callable[[Callable[..., Any], str], bool],
) -> tuple[RosenbrockDescription, tuple[tuple[str, Callable[..., Any]], ...]]:
    """``desc`` for an ``n``-state problem with ``jac``/``tgrad`` (or ``None``), and the user
    functions the kernel binds (``(global name, function)`` pairs).

    As on the array path, ``autodiff="auto"`` uses the problem's ``jac`` when it has one and
    ``"finite_difference"`` never does; without a ``jac`` the kernel differentiates ``f`` by
    forward differences (the array path's ``"auto"`` traces ``f`` instead, which kernels
    cannot). ``mode(fn, role)`` says whether ``fn`` (``"jac"`` or ``"tgrad"``) takes ``u`` as an
    array (``user_function_mode``).
    """
    autodiff = getattr(alg, "autodiff", "auto")
    if autodiff == "autograd":
        raise KernelUnsupportedError(
            f"the compiled kernels cannot trace f for autodiff='autograd'; use autodiff='auto' "
            f"(the problem's jac, else finite differences in the kernel), or {ARRAY_PATH}"
        )
    bound: list[tuple[str, Callable[..., Any]]] = []
    sources = []
    tgrad = tgrad if desc.needs_tgrad else None
    for name, fn in (("user_jac", jac if autodiff == "auto" else None), ("user_tgrad", tgrad)):
        if fn is None:
            sources.append("finite_difference")
            continue
        sources.append("array" if mode(fn, name.removeprefix("user_")) else "tuple")
        bound.append((name, fn))
    return desc.with_derivatives(n, sources[0], sources[1]), tuple(bound)


def describe_rosenbrock(stepper: Any) -> RosenbrockDescription | None:
    """The description of a Rosenbrock method (``None`` for other methods)."""

    def floats(values: Any) -> tuple[float, ...]:
        return tuple(float(v) for v in values)

    name = type(stepper).__name__
    if isinstance(stepper, TRBDF2):
        return RosenbrockDescription(
            name=name,
            family="trbdf2",
            gamma=float(_trbdf2.D),
            a=(),
            C=(),
            c=(0.0, float(_trbdf2.GAMMA), 1.0),
            d=(),
            b=(float(_trbdf2.W),),
            e=floats(_trbdf2.ERROR),
            H=((), ()),
            e32=0.0,
            order=stepper.order,
            error_order=stepper.error_order,
            fsal=False,
            kappa=stepper.kappa,
            max_iters=stepper.max_iters,
        )
    if isinstance(stepper, Rosenbrock23):
        return RosenbrockDescription(
            name=name,
            family="rosenbrock23",
            gamma=float(_r23._D),
            a=(),
            C=(),
            c=(0.0, 0.5, 1.0),
            d=(),
            b=(),
            e=(),
            H=((), ()),
            e32=float(_r23._E32),
            order=stepper.order,
            error_order=stepper.error_order,
            fsal=True,
        )
    if isinstance(stepper, Rosenbrock):
        tab = stepper.tableau
        s = tab.stages
        return RosenbrockDescription(
            name=name,
            family="rodas",
            gamma=float(tab.gamma),
            a=tuple(floats(tab.a[i, :i]) for i in range(s)),
            C=tuple(floats(tab.C[i, :i]) for i in range(s)),
            c=floats(tab.c),
            d=floats(tab.d),
            b=floats(tab.b),
            e=floats(tab.e),
            H=tuple(floats(row) for row in tab.H),
            e32=0.0,
            order=stepper.order,
            error_order=stepper.error_order,
            fsal=False,
        )
    return None
