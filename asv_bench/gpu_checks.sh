#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU, CuPy, numba-cuda and the test
# extra installed: the environment, the tests that need a GPU (CuPy backend, CUDA kernels,
# dask-cuda), DiffEqGPU's benchmark through the CUDA kernel with its peers on the same GPU and
# a profile of the largest solve. Each step has its own time limit, so one failure does not
# hide the others; logs go to $OUT (default ./gpu-results). Wheels in ./.whl (for a machine
# that cannot reach a package index) are installed into /tmp/site first.
#
#     bash asv_bench/gpu_checks.sh [SIZES...]     # default sizes: 1000000 8388608
#
# STEPS picks and orders the steps (default "env pytest diffeqgpu profile"), GPU_TESTS the test
# files (default: every module with GPU tests), PEERS the benchmark's peers ("array diffrax").
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
SIZES=${*:-1000000 8388608}
export PYTHONUNBUFFERED=1 DXODE_KERNEL_CACHE=${DXODE_KERNEL_CACHE:-/tmp/dxode-kernels}
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX (Diffrax) shares the GPU with CuPy and numba
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit} s)"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name.log"
  echo "=== $name: rc=$rc, $((SECONDS - start)) s"
}

env_step() {
  step env 60 bash -c 'nvidia-smi; python3 -c "
import importlib, platform
print(platform.python_version())
for m in (\"numpy\", \"numba\", \"numba.cuda\", \"cupy\", \"llvmlite\", \"dask\", \"distributed\",
          \"dask_cuda\", \"autograd\", \"array_api_compat\", \"jax\", \"diffrax\", \"scipy\"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, \"__version__\", \"?\"), getattr(mod, \"__file__\", \"\"))
    except Exception as exc:
        print(m, \"MISSING\", exc)
from numba import cuda
print(\"numba.cuda available:\", cuda.is_available())
cuda.detect()
"'
}

# the GPU-marked tests (collected from the modules that have them, so that a module needing
# something this machine lacks cannot stop the collection); a failure is rerun with warnings
# shown, not raised, to tell a warning from a wrong result
GPU_TESTS=${GPU_TESTS:-"tests/test_kernel_gpu.py tests/test_kernel_gpu_features.py
  tests/test_dask_cuda.py tests/test_backends.py tests/test_ensembles.py tests/test_events.py
  tests/test_inputs.py tests/test_gradients_backends.py tests/test_lanes.py tests/test_stiff.py
  tests/test_stiff_problems.py tests/test_trbdf2.py"}
pytest_step() {
  local run="python3 -m pytest -p no:benchmark -m gpu -n 8 --maxprocesses 8"
  step pytest 240 $run --durations=15 $GPU_TESTS
  if grep -q " failed\| error" "$OUT/pytest.log"; then
    step pytest-rerun 90 $run --lf -W default $GPU_TESTS
  fi
}

diffeqgpu_step() {
  step diffeqgpu 200 python3 asv_bench/diffeqgpu_kernel.py --device cuda --repeats 2 \
    --sizes $SIZES --peers ${PEERS:-array diffrax}
}

# where the largest solve's time goes (host work, transfers, the kernel), and the kernel in
# float32 against float64
profile_step() {
  step profile 90 python3 - <<'EOF'
import cProfile, pstats, sys, time
sys.path.insert(0, "asv_bench")
import cupy
import numpy as np
import dxode
from diffeqgpu_kernel import options, paper_inputs, solve_end_to_end, solve_lanes
kernel = dxode.EnsembleKernel(device="cuda")
n = 8_388_608
for mode in ("adaptive", "fixed"):
    solve_end_to_end(n, mode, kernel, cupy)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(solve_end_to_end, n, mode, kernel, cupy)
    print(f"{mode}: {time.perf_counter() - start:.4f} s under the profiler")
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(15)
for dtype in (np.float32, np.float64):
    u0, p = (cupy.asarray(a.astype(dtype)) for a in paper_inputs(n))
    for mode in ("adaptive", "fixed"):
        solve_lanes(u0, p, kernel, **options(mode))
        start = time.perf_counter()
        solve_lanes(u0, p, kernel, **options(mode))
        seconds = time.perf_counter() - start
        print(f"{np.dtype(dtype).name} {mode}: {seconds:.4f} s from inputs on the GPU")
EOF
}

for name in ${STEPS:-env pytest diffeqgpu profile}; do
  "${name}_step"
done
