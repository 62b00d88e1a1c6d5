"""The kernels' vectorizable log/exp (the controller's powers): accurate, and the same bits
whether the exponent helpers are the generated chains (CUDA, simulator) or the CPU's bit-level
intrinsics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dxode.kernels.codegen_math import exponent_bounds, write_exp, write_helpers, write_log

FLOOR = 1e-10  # the controller's floor under the error


def _source(dtype: str, bounds: tuple[float, float]) -> str:
    lines: list[str] = []
    write_helpers(lambda line="": lines.append(line), dtype, FLOOR, bounds)
    body: list[str] = []
    write_log(body.append, "x", "lo", dtype)
    write_exp(body.append, "y", "ex", dtype, bounds)
    return "\n".join([*lines, "def f(x, y):", *(f"    {b}" for b in body), "    return lo, ex"])


def _namespace(dtype: str) -> dict:
    return {
        "DT": getattr(np, dtype),
        "np": np,
        "math": math,
        "maximum": lambda a, b: a if (a != a or a >= b) else b,
        "minimum": lambda a, b: a if (a != a or a <= b) else b,
        "select": lambda c, a, b: a if c else b,
    }


def _inputs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    big = float(np.finfo(dtype).max)
    xs = np.concatenate([10 ** rng.uniform(-10, 30, 2000), [FLOOR, 0.5, 1.0, 2.0, 1.41421356, big]])
    ys = np.concatenate([rng.uniform(-3.0, 3.0, 2003), [-50.0, 0.0, 50.0]])
    return xs.astype(dtype), ys.astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_log_and_exp_are_accurate_to_a_few_units_in_the_last_place(dtype):
    bounds = exponent_bounds(0.9, 0.2, 10.0, dtype)
    ns = _namespace(dtype)
    exec(_source(dtype, bounds), ns)
    xs, ys = _inputs(dtype)
    dt = getattr(np, dtype)
    for x, y in zip(xs, ys, strict=True):
        lo, ex = ns["f"](x, y)
        exact_log = math.log(float(x))
        assert abs(float(lo) - exact_log) <= 4 * np.spacing(dt(max(abs(exact_log), 1.0)))
        exact_exp = math.exp(min(max(float(y), bounds[0]), bounds[1]))  # clamped, by design
        assert abs(float(ex) - exact_exp) <= 4 * np.spacing(dt(exact_exp))


def test_the_clamp_is_outside_the_clipped_range():
    """Beyond the clamp the factor ``safety * exp(y)`` is clipped anyway: no result changes."""
    for safety, fmin, fmax in [(0.9, 0.2, 10.0), (1.0, 0.1, 5.0), (0.5, 1e-3, 1e3)]:
        ylo, yhi = exponent_bounds(safety, fmin, fmax, "float64")
        assert safety * math.exp(ylo) < fmin
        assert safety * math.exp(yhi) > fmax


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bit_intrinsics_give_the_chains_bits(dtype):
    numba = pytest.importorskip("numba")
    from dxode.kernels import float_bits

    bounds = exponent_bounds(0.9, 0.2, 10.0, dtype)
    source = _source(dtype, bounds)
    python = _namespace(dtype)
    exec(source, python)
    chains, bits = _namespace(dtype), _namespace(dtype)
    exec(source, chains)
    exec(source, bits)
    for ns in (chains, bits):
        for name in ("maximum", "minimum", "select", "split_exponent", "pow2"):
            ns[name] = numba.njit(inline="always")(ns[name])
    bits["split_exponent"] = float_bits.split_exponent
    bits["pow2"] = float_bits.pow2
    compiled_chains = numba.njit(error_model="numpy")(chains["f"])
    compiled_bits = numba.njit(error_model="numpy")(bits["f"])
    xs, ys = _inputs(dtype)
    for x, y in zip(xs, ys, strict=True):
        expected = python["f"](x, y)
        assert compiled_chains(x, y) == expected
        assert compiled_bits(x, y) == expected
