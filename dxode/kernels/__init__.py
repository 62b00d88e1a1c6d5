"""Compiled whole-trajectory kernels: the integration of each trajectory compiled by numba.

The array path (``dxode._integrator``) steps batches of lanes with array operations; this
package compiles the same method (from its ``ButcherTableau``, or its Rosenbrock tableau), the
same step-size control and the user's unchanged ``f(u, p, t)`` into one loop per trajectory,
on the CPU (lanes in SIMD blocks, blocks over threads) or on a CUDA GPU (one thread per
trajectory).

Modules, one job each:

``description``
    ``StepperDescription``: what a method is, as data (from its tableau).
``rhs_source``
    The user's ``f`` made ready for numba (list results become tuples), its parameter layout.
``codegen``
    Python source of the per-lane integration, generated from a description.
``rosenbrock_description`` / ``rosenbrock_codegen``
    The same for Rosenbrock23, Rodas4, Rodas5P and TRBDF2: per-lane Jacobians and LU.
``stiff_lanes`` / ``rosenbrock_stages``
    The stiff attempt vectorized across a chunk of lanes: its workspace rows and dense LU
    with branch-free pivoting, and the derivatives, stages and error norm written in them.
``events_codegen`` / ``events``
    Callbacks in the kernels: their generated code, and the user's functions checked and
    compiled, the event arrays and the event records.
``compiler``
    Compiles generated source once per signature (in memory and on disk), with clear errors.
``cache``
    The kernel cache directory, and the remembered answers of the probe compilations.
``cpu`` / ``cuda``
    Run a batch of lanes on a device.
``vectorize``
    numba's first optimization round with the loop vectorizer while a CPU kernel compiles,
    so that the compiling process runs the vectorized code numba caches.
``ensemble`` / ``single``
    ``EnsembleKernel`` and ``solve(prob, alg, kernel=True)``.
``complex_step`` / ``sensitivity_rhs`` / ``gradients``
    Gradients: a complex copy of ``f`` (refusing what complex step cannot differentiate),
    the forward-sensitivity RHS generated from it (or from ``jac``/``paramjac``), and the
    sensitivity algorithm that integrates it with the kernel for autograd.
``adjoint`` / ``adjoint_sweep`` / ``adjoint_backward`` / ``adjoint_params``
    The kernel's discrete adjoint: recorded steps per lane and the compiled backward sweep.
``event_pass``
    A differentiated solve's event pass (the events without gradients) run by the kernel.

numba is imported lazily: importing this package does not need it.
"""

from __future__ import annotations

from .ensemble import EnsembleKernel

__all__ = ["EnsembleKernel"]
