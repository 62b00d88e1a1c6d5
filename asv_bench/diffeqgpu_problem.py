"""DiffEqGPU's Lorenz benchmark problem, shared by ``diffeqgpu_lorenz.py`` (the array path
against Diffrax on the CPU) and ``diffeqgpu_kernel.py`` (the compiled kernels, and their peers
on a GPU): the constants, ``f``, the parameters and Diffrax's compiled solve.

Lorenz with ``sigma = 10``, ``beta = 8/3``, ``rho = linspace(0, 21, N)``, ``u0 = (1, 0, 0)``,
``t in [0, 1]``, float32, Tsit5 with a fixed step ``dt = 0.001`` (1,000 steps) and adaptive
with the paper's ``rtol = atol = 1e-8``. That ``rtol`` is below float32's machine epsilon, which
dxode refuses (an error estimate in float32 cannot resolve it), so the adaptive runs use
``rtol`` = float32's epsilon (1.19e-7) and the paper's ``atol``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

DTYPE = np.float32
FIXED_DT = 0.001
ADAPTIVE_TOL = 1e-8
ADAPTIVE_RTOL = float(np.finfo(DTYPE).eps)


def lorenz(u: Any, p: Any, t: Any) -> list[Any]:
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


def parameters(n: int) -> np.ndarray:
    """(N, 3): sigma = 10, rho = linspace(0, 21, N), beta = 8/3, float32."""
    rho = np.linspace(0.0, 21.0, n)
    return np.column_stack([np.full(n, 10.0), rho, np.full(n, 8 / 3)]).astype(DTYPE)


def diffrax_solver(n: int, adaptive: bool) -> tuple[Callable[[], Any], float]:
    """Diffrax's ``jit(vmap)`` Tsit5 over the ``n`` trajectories, compiled, and its compile
    time (s); the call returns the saved states ``(n, 1, 3)`` once computed. Its parameters
    are put on JAX's default device (a GPU where JAX has one) before the call."""
    import diffrax
    import jax
    import jax.numpy as jnp

    term = diffrax.ODETerm(lambda t, u, p: jnp.stack(lorenz(u, p, t)))
    y0 = jnp.asarray([1.0, 0.0, 0.0], dtype=jnp.float32)
    controller = (
        diffrax.PIDController(rtol=ADAPTIVE_RTOL, atol=ADAPTIVE_TOL)
        if adaptive
        else diffrax.ConstantStepSize()
    )

    def solve_one(p):
        return diffrax.diffeqsolve(
            term,
            diffrax.Tsit5(),
            t0=0.0,
            t1=1.0,
            dt0=None if adaptive else FIXED_DT,
            y0=y0,
            args=p,
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=controller,
            max_steps=100_000,
        ).ys

    p = jnp.asarray(parameters(n))
    start = time.perf_counter()
    compiled = jax.jit(jax.vmap(solve_one)).lower(p).compile()
    compile_s = time.perf_counter() - start
    return (lambda: jax.block_until_ready(compiled(p))), compile_s
