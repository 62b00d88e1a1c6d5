"""NumPy's CPU dispatch: which kernels a machine uses, and how to run as an AVX2-only CPU would.

NumPy compiles some loops (``exp``, ``log``, ``power`` among them) for several instruction
sets and picks one at import by the CPU; the AVX-512 and AVX2 versions round differently in
the last bit of about one result in twenty. ``NPY_DISABLE_CPU_FEATURES`` turns dispatch
targets off for a new process, and ``OPENBLAS_CORETYPE`` picks OpenBLAS's kernels.
"""

from __future__ import annotations

import os


def avx512_dispatch_targets() -> list[str]:
    """The AVX-512 dispatch targets NumPy uses on this machine (empty on an AVX2-only CPU).

    Named by NumPy's own table, which changed with NumPy 2.3 (``X86_V4``, ``AVX512_ICL``, ...
    where older releases say ``AVX512F``, ``AVX512_SKX``, ...).
    """
    from numpy._core import _multiarray_umath as umath

    return [
        name
        for name in umath.__cpu_dispatch__
        if ("AVX512" in name or name == "X86_V4") and umath.__cpu_features__.get(name)
    ]


def avx2_environment() -> dict[str, str]:
    """This process's environment, with NumPy's AVX-512 kernels and OpenBLAS's turned off.

    numba is left compiling for this CPU, so a process in this environment loads the kernels
    the others compiled (the same kernel cache keys). What numba's code computes does not
    depend on the vector width: without ``fastmath`` its arithmetic is IEEE, one operation
    at a time, and ``exp``, ``log`` and ``pow`` are the C library's, which picks the same
    (FMA) implementation on AVX2 and AVX-512 CPUs. ``NUMBA_CPU_NAME=haswell``, once set
    here, changed only those keys (every kernel compiled twice): numba still passed LLVM
    the host's features, AVX-512 among them, and the code kept its ``zmm`` vectors.
    """
    env = dict(os.environ)
    env["NPY_DISABLE_CPU_FEATURES"] = " ".join(avx512_dispatch_targets())
    env["OPENBLAS_CORETYPE"] = "Haswell"
    return env
