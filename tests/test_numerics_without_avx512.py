"""The numerical tests hold on a CPU without AVX-512 too.

NumPy's ``exp``, ``log`` and ``power`` round differently on AVX-512 and AVX2 machines (see
``cpu_features``); the step-size controller's ``err ** -beta`` and many right-hand sides go
through them, so a solve's bits, and rarely its digits, move with the CPU. A bound that a
result met only by the luck of one machine's rounding fails on the other (it happened: E5
and a float32 gradient passed here and failed on an AVX2-only CPU). On an AVX-512 machine
each module below runs again in a fresh interpreter with the AVX-512 kernels off, so the
suite sees what an AVX2-only CPU computes; on an AVX2-only machine the suite already does.
The compiled kernels run there too, against the array path: on an AVX2 CPU NumPy's
``power`` and the C library's ``pow`` can agree, so the array path and the kernel can give
the same bits where on AVX-512 they differ in the last place. The kernels themselves compute
the same on both CPUs (``avx2_environment``), so the reruns load those the first run compiled
(this run's kernel cache) instead of compiling each again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cpu_features import avx2_environment, avx512_dispatch_targets

ROOT = Path(__file__).resolve().parents[1]

# The modules whose assertions compare computed numbers with references or with each other
# at a tolerance (the rest check errors, plumbing, Dask, packaging and docs).
NUMERICAL_MODULES = [
    "test_accuracy.py",
    "test_bari.py",
    "test_controllers.py",
    "test_convergence.py",
    "test_events.py",
    "test_gradients.py",
    "test_kernel_agreement.py",
    "test_kernel_dask.py",
    "test_kernel_ensemble.py",
    "test_kernel_events.py",
    "test_saving.py",
    "test_sensealgs.py",
    "test_stiff.py",
    "test_stiff_gradients.py",
    "test_stiff_problems.py",
    "test_trbdf2.py",
]

needs_avx512 = pytest.mark.skipif(
    not avx512_dispatch_targets(), reason="no AVX-512: the suite already runs the AVX2 kernels"
)


@needs_avx512
def test_the_avx2_environment_changes_numpys_kernels():
    # Without this, the runs below would repeat the AVX-512 run and prove nothing.
    code = (
        "import numpy as np;"
        "x = np.linspace(0.5, 2.0, 20001);"
        "print(np.power(x, -0.2).tobytes().hex())"
    )
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    avx2 = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=avx2_environment(),
    )
    assert ours.stdout != avx2.stdout


@needs_avx512
@pytest.mark.slow
@pytest.mark.parametrize("module", NUMERICAL_MODULES)
def test_module_passes_with_avx2_kernels(module):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            f"tests/{module}",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
        ],
        cwd=ROOT,
        env=avx2_environment(),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
