"""The step-size controller contract."""

from __future__ import annotations

import abc
from typing import Any

Array = Any


class AbstractController(abc.ABC):
    """Decides, per lane, whether a trial step is accepted and how long the next one is.

    Implementer rules
    -----------------
    * Controllers are stateless objects; per-lane memory (e.g. previous error norms) lives in
      the tuple returned by ``init`` and is passed back in, so the integrator can compact it
      along with the other lane arrays. Each entry is an ``(L,)`` array.
    * ``adapt`` receives error norms already scaled by the tolerances (accept when ``<= 1``);
      a non-finite norm arrives as ``inf`` and must give the smallest allowed factor.
    * Work elementwise per lane, through ``xp`` only.
    """

    @abc.abstractmethod
    def init(self, xp: Any, like: Array) -> tuple[Array, ...]:
        """Initial per-lane memory for lanes shaped like ``like`` (an ``(L,)`` array)."""

    @abc.abstractmethod
    def adapt(
        self, xp: Any, error_norm: Array, h: Array, memory: tuple[Array, ...], error_order: int
    ) -> tuple[Array, Array, tuple[Array, ...]]:
        """Return ``(accept, h_next, memory)`` for step sizes ``h`` (``(L,)``, positive).

        ``error_order`` is the order of the method's error estimate (so the error scales like
        ``h ** (error_order + 1)``).
        """
