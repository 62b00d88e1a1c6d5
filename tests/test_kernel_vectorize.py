"""The process that compiles a CPU kernel runs its lane loop vectorized (``vectorize``).

Without ``vectorized_compiles`` the forward-sensitivity kernel of Lorenz (12 components
``[u, S]``, complex step) kept a scalar lane loop in the compiling process (338 packed
arithmetic instructions against 1077 scalar ones in its ``attempt``), and ran 3.6 times
slower there than in any process that loaded it from numba's cache.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import autograd  # noqa: E402
import autograd.numpy as anp  # noqa: E402

import dxode  # noqa: E402
from dxode.kernels import compiler  # noqa: E402
from dxode.kernels.vectorize import needs_compile, vectorized_compiles  # noqa: E402


def _settings() -> tuple[bool, int]:
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    return codegen._loopvect, codegen._opt_level


def test_vectorized_compiles_sets_the_cheap_round_and_restores_it_after_the_last_user():
    before = _settings()
    with vectorized_compiles():
        assert _settings() == (True, 3)
        with vectorized_compiles():
            assert _settings() == (True, 3)
        assert _settings() == (True, 3)  # the outer user is still compiling
    assert _settings() == before


def test_vectorized_compiles_restores_the_settings_when_the_compile_raises():
    before = _settings()
    with pytest.raises(RuntimeError), vectorized_compiles():
        raise RuntimeError("numba refused f")
    assert _settings() == before


def test_needs_compile_only_for_a_dispatcher_without_signatures():
    dispatcher = numba.njit(lambda x: x + 1.0)
    assert needs_compile(dispatcher)
    dispatcher(1.0)
    assert not needs_compile(dispatcher)
    assert not needs_compile(lambda x: x)  # a CUDA launch configuration, say


def _lorenz_vectorized(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]


@pytest.mark.slow
def test_the_compiling_process_runs_the_forward_sensitivity_lane_loop_vectorized(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))  # compiled here, not loaded

    def loss(theta):
        prob = dxode.ODEProblem(_lorenz_vectorized, [1.0, 0.0, 0.0], (0.0, 1.0), (10.0, 28.0, 2.0))
        sim = dxode.solve(
            dxode.EnsembleProblem(prob, p=theta[None, :] * np.ones((40, 1))),
            dxode.Tsit5(),
            dxode.EnsembleKernel(threads=1),
            trajectories=40,
            saveat=0.5,
        )
        return anp.sum(sim.u**2)

    autograd.grad(loss)(np.array([10.0, 28.0, 8 / 3]))
    (kernel,) = [
        k
        for k in compiler._COMPILED.values()
        if k.source_path.parent == tmp_path and k.layout.n == 12
    ]
    asm = "".join(kernel.module.attempt.inspect_asm().values())
    ops = re.findall(r"\tv?(?:add|sub|mul|div|f\w*)(pd|sd)\s", asm)
    packed, scalar = ops.count("pd"), ops.count("sd")
    assert packed > scalar, (packed, scalar)
