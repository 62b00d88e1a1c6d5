"""Compiled whole-trajectory kernels: the integration of each trajectory compiled by numba.

The array path (``dxode._integrator``) steps batches of lanes with array operations; this
package compiles the same method (from its ``ButcherTableau``), the same step-size control and
the user's unchanged ``f(u, p, t)`` into one loop per trajectory, on the CPU (lanes in SIMD
blocks, blocks over threads) or on a CUDA GPU (one thread per trajectory).

Modules, one job each:

``description``
    ``StepperDescription``: what a method is, as data (from its tableau).
``rhs_source``
    The user's ``f`` made ready for numba (list results become tuples), its parameter layout.
``codegen``
    Python source of the per-lane integration, generated from a description.
``events_codegen`` / ``events``
    Callbacks in the kernels: their generated code, and the user's functions checked and
    compiled, the event arrays and the event records.
``compiler``
    Compiles generated source once per signature (in memory and on disk), with clear errors.
``cpu`` / ``cuda``
    Run a batch of lanes on a device.
``ensemble`` / ``single``
    ``EnsembleKernel`` and ``solve(prob, alg, kernel=True)``.

numba is imported lazily: importing this package does not need it.
"""

from __future__ import annotations

from .ensemble import EnsembleKernel

__all__ = ["EnsembleKernel"]
