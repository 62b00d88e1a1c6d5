"""DiffEqGPU's Lorenz benchmark through dxode's compiled kernels (``EnsembleKernel``).

The problem of DiffEqGPU's paper (Utkarsh et al. 2024, "Automated translation and accelerated
solving of differential equations on multiple GPU platforms"): Lorenz with ``sigma = 10``,
``beta = 8/3``, ``rho = linspace(0, 21, N)``, ``u0 = (1, 0, 0)``, ``t in [0, 1]``, float32,
Tsit5 adaptive with ``rtol = atol = 1e-8`` (here ``rtol`` = float32's machine epsilon,
1.19e-7, the smallest that dxode accepts in float32, and ``atol = 1e-8``) and with a fixed
step ``dt = 0.001`` (1,000 steps), only the final state kept. Each timed run is end to end
from Python: the per-trajectory ``u0`` and ``p`` arrays (no ``prob_func``; built with CuPy on
the GPU for ``--device cuda``, as a CuPy user would), the problems and the solve; the first
call (compile, or numba's cache load) is reported apart.

    python asv_bench/diffeqgpu_kernel.py --device cpu [--sizes 1000 100000]
    python asv_bench/diffeqgpu_kernel.py --device cuda [--sizes 1000000 8388608]
    NUMBA_ENABLE_CUDASIM=1 python asv_bench/diffeqgpu_kernel.py --device cuda --sizes 8
    python asv_bench/diffeqgpu_kernel.py --device cuda --peers   # + array path, Diffrax

``--device cpu`` runs the CPU kernel on one and on two threads. ``--device cuda`` runs
``EnsembleKernel(device="cuda")``, with CuPy arrays in and out on a real GPU (NumPy under
numba-cuda's simulator), and checks the final states against the CPU kernel's (exit status 1
when the check fails). Under the simulator the two must agree bitwise. On a GPU they cannot:
numba-cuda leaves libNVVM's FMA contraction on (``a * b + c`` is rounded once, not twice), so
the last bits differ and an adaptive trajectory may take other steps. There the check is
accuracy: against a float64 solve at ``rtol = atol = 1e-12``, on up to ``CHECKED`` evenly spaced
trajectories, the GPU's error must be at most twice the CPU kernel's (plus a float32 ulp).

``--peers`` (with ``--device cuda`` on a GPU) adds, in the same process and on the same GPU,
dxode's array path on CuPy (``EnsembleArray(backend="cupy")``, end to end like the kernel)
and Diffrax's ``jit(vmap)`` Tsit5 (compiled first; its timed call starts from parameters
already on the GPU), each with its largest difference from the kernel's final states.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import sys
import time
from typing import Any

import numpy as np
from bench_timing import best_of
from diffeqgpu_problem import ADAPTIVE_RTOL, ADAPTIVE_TOL, DTYPE, FIXED_DT, diffrax_solver, lorenz

import dxode

PAPER_N = 8_388_608
PAPER_V100_S = {"adaptive": 0.0695, "fixed": 0.145}  # DiffEqGPU EnsembleGPUKernel, V100
CHECKED = 100_000  # trajectories checked against the CPU kernel and the float64 reference


def on_simulator() -> bool:
    """Whether numba-cuda runs on its CPU simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def array_module(device: str) -> Any:
    """CuPy for a real GPU, NumPy for the CPU and for the simulator."""
    if device == "cuda" and not on_simulator():
        import cupy

        return cupy
    return np


def options(mode: str) -> dict[str, Any]:
    """Tsit5's solve options for ``mode``; only the final state is saved."""
    step = (
        {"rtol": ADAPTIVE_RTOL, "atol": ADAPTIVE_TOL}
        if mode == "adaptive"
        else {"dt": FIXED_DT, "adaptive": False}
    )
    return {"saveat": [1.0], **step}


def describe(mode: str) -> str:
    """The table's name for ``mode``, with its tolerances or step."""
    if mode == "adaptive":
        return f"adaptive {ADAPTIVE_RTOL:.3g}/{ADAPTIVE_TOL:g}"
    return f"fixed dt {FIXED_DT:g}"


def paper_inputs(n: int, dtype: Any = DTYPE, xp: Any = np) -> tuple[Any, Any]:
    """The paper's initial states ``(n, 3)`` and parameters ``(n, 3)``, built with ``xp``
    (NumPy on the host, CuPy on the GPU)."""
    rho = xp.linspace(0.0, 21.0, n, dtype=dtype)
    p = xp.stack([xp.full(n, 10.0, dtype=dtype), rho, xp.full(n, 8 / 3, dtype=dtype)], axis=1)
    u0 = xp.zeros((n, 3), dtype=dtype)
    u0[:, 0] = 1.0
    return u0, p


def solve_lanes(u0: Any, p: Any, alg: dxode.EnsembleKernel, **opts: Any) -> Any:
    """Solve the trajectories of ``u0`` and ``p`` (one batch); the final states ``(N, 3)``."""
    prob = dxode.ODEProblem(lorenz, u0[0], (0.0, 1.0), p[0])
    eprob = dxode.EnsembleProblem(prob, u0=u0, p=p)
    n = u0.shape[0]
    sim = dxode.solve(eprob, dxode.Tsit5(), alg, trajectories=n, batch_size=n, **opts)
    return sim.u[:, -1, :]


def solve_end_to_end(n: int, mode: str, alg: dxode.EnsembleKernel, xp: Any) -> Any:
    """Build the N problems' arrays with ``xp`` (on the GPU for CuPy) and solve; the final
    states."""
    u0, p = paper_inputs(n, xp=xp)
    return solve_lanes(u0, p, alg, **options(mode))


def host(x: Any) -> np.ndarray:
    """``x`` as a NumPy array (copied from the GPU for CuPy)."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


def check_against_cpu(final: np.ndarray, n: int, mode: str) -> tuple[bool, str]:
    """Whether the CUDA kernel's final states ``(n, 3)`` pass (see the module docstring), and
    the table's cell saying how they compare with the CPU kernel's."""
    rows = np.unique(np.linspace(0, n - 1, min(n, CHECKED)).round().astype(np.int64))
    u0, p = (a[rows] for a in paper_inputs(n))
    cpu = dxode.EnsembleKernel()  # all of numba's threads: the same bits as one
    expected = host(solve_lanes(u0, p, cpu, **options(mode)))
    gpu = final[rows]
    if on_simulator():
        equal = np.array_equal(gpu, expected)
        return (
            equal,
            "bitwise equal" if equal else f"DIFFERENT: {np.max(np.abs(gpu - expected)):.1e}",
        )
    precise = {"saveat": [1.0], "rtol": 1e-12, "atol": 1e-12}
    exact = host(solve_lanes(u0.astype(np.float64), p.astype(np.float64), cpu, **precise))
    scale = np.maximum(np.abs(exact), 1.0)
    err_gpu = float(np.max(np.abs(gpu - exact) / scale))
    err_cpu = float(np.max(np.abs(expected - exact) / scale))
    passed = err_gpu <= 2 * err_cpu + float(np.finfo(DTYPE).eps)
    diff = float(np.max(np.abs(gpu - expected) / scale))
    verdict = "ok" if passed else "WORSE"
    cell = f"error {err_gpu:.1e} vs CPU's {err_cpu:.1e} ({verdict}); differ {diff:.1e}"
    return passed, cell


def peer_rows(sizes: list[int], repeats: int, peers: list[str]) -> None:
    """Print the rows of ``peers`` (``"array"``: the array path on CuPy, ``"diffrax"``) on the
    GPU (see ``--peers``)."""
    import cupy

    kernel = dxode.EnsembleKernel(device="cuda")
    array = dxode.EnsembleArray(backend="cupy")
    for mode in ("adaptive", "fixed"):
        if "array" in peers:
            solve_end_to_end(2, mode, array, cupy)  # CuPy's kernels compile on first use
        for n in sizes:
            reference = host(solve_end_to_end(n, mode, kernel, cupy))
            if "array" in peers:
                run = functools.partial(solve_end_to_end, n, mode, array, cupy)
                seconds, final = best_of(run, repeats)
                cells = ["array path (CuPy)", "-", seconds, host(final)[:, None, :]]
                _print_peer(n, mode, *cells, reference)
            if "diffrax" in peers:
                run, compile_s = diffrax_solver(n, mode == "adaptive")
                seconds, ys = best_of(run, repeats, warm_up=True)
                cells = ["Diffrax jit(vmap), GPU", f"{compile_s:.2f}", seconds, np.asarray(ys)]
                _print_peer(n, mode, *cells, reference)


def _print_peer(
    n: int, mode: str, name: str, first: str, seconds: float, ys: np.ndarray, ref: np.ndarray
) -> None:
    """One peer's row: its final states ``ys`` ``(n, 1, 3)`` against the kernel's ``ref``."""
    diff = float(np.max(np.abs(ys[:, -1, :] - ref)))
    cells = [f"{n:,}", describe(mode), name, first, f"{seconds:.4f}", f"{seconds / n * 1e6:.2f}"]
    cells += [f"{PAPER_V100_S[mode]:.4f}", f"differ {diff:.1e}"]
    print("| " + " | ".join(cells) + " |", flush=True)


def configurations(device: str) -> list[tuple[str, dxode.EnsembleKernel]]:
    if device == "cuda":
        return [("cuda", dxode.EnsembleKernel(device="cuda"))]
    return [(f"cpu, {t} thread{'s' * (t > 1)}", dxode.EnsembleKernel(threads=t)) for t in (1, 2)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=["array", "diffrax"],
        help="add these peers on the GPU (no names: both)",
    )
    args = parser.parse_args()
    if args.peers is not None and (args.device != "cuda" or on_simulator()):
        parser.error("--peers compares on a GPU: it needs --device cuda and no simulator")
    xp = array_module(args.device)
    where = "numba-cuda simulator" if args.device == "cuda" and on_simulator() else args.device
    print(
        f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, {where}, Python "
        f"{platform.python_version()}, NumPy {np.__version__}, dxode {dxode.__version__}"
    )
    print(
        f"DiffEqGPU paper, EnsembleGPUKernel on a V100, N = {PAPER_N:,}: adaptive "
        f"{PAPER_V100_S['adaptive'] * 1e3:g} ms, fixed {PAPER_V100_S['fixed'] * 1e3:g} ms"
    )
    print(
        "| N | mode (rtol/atol) | device | first call (s) | end to end (s) | per trajectory (us) | "
        "paper V100 at its N (s) | vs CPU kernel |"
    )
    print("|---|---|---|---|---|---|---|---|")
    all_passed = True
    for mode in ("adaptive", "fixed"):
        for name, alg in configurations(args.device):
            start = time.perf_counter()
            solve_end_to_end(2, mode, alg, xp)
            first_call = time.perf_counter() - start
            for n in args.sizes:
                run = functools.partial(solve_end_to_end, n, mode, alg, xp)
                seconds, final = best_of(run, args.repeats)
                check = "-"
                if args.device == "cuda":
                    passed, check = check_against_cpu(host(final), n, mode)
                    all_passed &= passed
                cells = [
                    f"{n:,}",
                    describe(mode),
                    name,
                    f"{first_call:.2f}",
                    f"{seconds:.4f}",
                    f"{seconds / n * 1e6:.2f}",
                    f"{PAPER_V100_S[mode]:.4f}",
                    check,
                ]
                print("| " + " | ".join(cells) + " |", flush=True)
    if args.peers is not None:
        peer_rows(args.sizes, args.repeats, args.peers or ["array", "diffrax"])
    if args.device == "cuda":
        print("cuda kernel vs CPU kernel:", "passed" if all_passed else "FAILED")
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
