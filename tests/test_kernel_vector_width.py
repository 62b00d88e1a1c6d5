"""The compiled kernels give the same bits whatever vector width numba compiles them for.

The AVX2 reruns (``test_numerics_without_avx512``) load the kernels this run compiled for
the host, on the argument that without ``fastmath`` the kernels' arithmetic is IEEE, one
operation at a time, so 4-lane (AVX2) and 8-lane (AVX-512) vectors compute the same. This
checks the argument itself: one process compiles a kernel for the host, another with
numba's CPU features stripped of AVX-512 (``NUMBA_CPU_FEATURES``; ``NUMBA_CPU_NAME`` alone
leaves them on), each reads its attempt's assembly, and their results must agree bit for
bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[1]

# 37 Lorenz trajectories (not a multiple of any vector width: the scalar remainder runs
# too), per-trajectory p, saves, a tstop; the attempt's assembly says which registers ran.
SCRIPT = """
import json, sys
import numpy as np
import dxode

def lorenz(u, p, t):
    x, y, z = u
    sigma, rho, beta = p
    return [sigma * (y - x), x * (rho - z) - y, x * y - beta * z]

n = 37
p = np.column_stack([np.full(n, 10.0), np.linspace(20.0, 30.0, n), np.full(n, 8 / 3)])
prob = dxode.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 3.0), (10.0, 28.0, 8 / 3))
sim = dxode.solve(
    dxode.EnsembleProblem(prob, p=p), "tsit5", dxode.EnsembleKernel(threads=1),
    saveat=0.5, tstops=[1.25], rtol=1e-8, atol=1e-8,
)
np.save(sys.argv[1], np.asarray(sim.u))
kernel = next(m for name, m in sys.modules.items() if name.startswith("_dxode_kernel_"))
asm = "".join(kernel.attempt.inspect_asm().values())
print(json.dumps({"zmm": "zmm" in asm, "ymm": "ymm" in asm}))
"""


def _host_features() -> str:
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_features().flatten()


def _without_avx512(features: str) -> str:
    """The feature string with every AVX-512 feature (and EVEX512) turned off."""
    flags = features.split(",")
    off = lambda f: "-" + f[1:] if ("avx512" in f or "evex512" in f) else f
    return ",".join(off(f) for f in flags if f)


def _run(tmp: Path, name: str, features: str) -> tuple[np.ndarray, dict]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DXODE_KERNEL_CACHE": str(tmp / f"cache-{name}"),  # compiled here, not loaded
        "NUMBA_CPU_FEATURES": features,
    }
    out = tmp / f"{name}.npy"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out), json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_avx2_and_avx512_kernels_give_the_same_bits(tmp_path):
    host = _host_features()
    if "+avx512f" not in host.split(","):
        pytest.skip("this CPU has no AVX-512: the suite's kernels are AVX2 code already")
    wide, wide_asm = _run(tmp_path, "avx512", host)
    narrow, narrow_asm = _run(tmp_path, "avx2", _without_avx512(host))
    assert wide_asm["zmm"], "the host kernel should use 512-bit vectors"
    assert not narrow_asm["zmm"] and narrow_asm["ymm"], "the AVX2 kernel should use ymm only"
    np.testing.assert_array_equal(wide, narrow)
