"""The kernel discrete adjoint's compiled backward sweep, one lane at a time.

``lane_sweep(n, ...)`` writes (and imports) a module whose ``lanes`` runs ``sweep`` for every
lane of a batch (on the CPU in a loop, on CUDA one thread per lane: one generated source,
the target choosing the work arrays' allocation and the lane loop's head); ``sweep``
replays one lane's
recorded accepted steps backward. For step ``k`` (from ``T[k]``, ``U[k]`` to ``T[k+1]``,
``U[k+1]``, step size ``h = T[k+1] - T[k]`` held fixed) it recomputes the stages
``y_i = U[k] + h Σ_j a_ij k_j``, ``k_i = f(y_i, t + c_i h)`` (and, where a save point falls in
the step, the method's extra interpolation stages), then runs their derivative backward:

* ``k̄_j += h b_j ū`` (``ū``: the cotangent of ``U[k+1]``) and, for each save point at
  ``θ = (t_s - t) / h`` in the step, ``ū_k += ḡ_s`` and ``k̄_j += h w_j(θ) ḡ_s`` (the dense
  output ``u + h Σ w_j(θ) k_j``; ``θ = 1`` is the step's end itself);
* stages in reverse: ``ȳ_i = J(y_i)ᵀ k̄_i``, ``ū_k += ȳ_i``, ``k̄_j += h a_ij ȳ_i`` (``j < i``).

``J(y)ᵀ v`` comes from ``n`` complex-step JVPs (``Im f(y + i h e_m) / h`` is column ``m`` of
``J``, exact to rounding), or the problem's ``jac``. Every stage's ``(y_i, t_i, k_i, k̄_i)``
is written out: the parameter cotangent ``Σ (∂f/∂p)ᵀ k̄_i`` is linear in the ``k̄_i`` and is
computed afterwards over the whole record (``adjoint_params``). The sweep runs in float64
whatever the state's dtype.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .codegen import CODEGEN_VERSION
from .compiler import _import, _write_source
from .complex_step import STEP, check_compiles, complex_copy
from .errors import CUDA_GRADIENT_U, KernelUnsupportedError
from .rhs_source import function_key, numba_ready, where_defined
from .sensitivity_rhs import _RowsToTuples

__all__ = ["lane_sweep"]

_MODULES: dict[str, Any] = {}

# The generic backward sweep, one lane (n-independent; ``call`` and ``jt`` are generated per
# n). ``VECTOR``/``MATRIX`` allocate its work arrays (``_ALLOCATIONS``: per target).
_SWEEP = '''
def sweep(T, U, nst, p, TS, G, A, BW, C, WI, S, E, D, UBAR, YS, TT, KB, KS, base):
    """One lane: cotangent of U[0] into UBAR (n,); stage k, i into row base + k NS + i of
    YS, TT, KB, KS."""
    n = U.shape[1]
    NS = S + E
    ub = VECTOR
    un = VECTOR
    yb = VECTOR
    K = MATRIX
    Y = MATRIX
    kb = MATRIX
    for m in range(n):
        ub[m] = 0.0
    si = TS.shape[0] - 1
    while si >= 0 and D * (TS[si] - T[nst]) > 0.0:  # never reached (a failed lane)
        si -= 1
    for k in range(nst - 1, -1, -1):
        t = T[k]
        h = T[k + 1] - t
        last = si
        while si >= 0 and D * (TS[si] - t) > 0.0:
            si -= 1
        stages = NS if last > si else S
        for i in range(stages):
            for m in range(n):
                acc = 0.0
                for j in range(i):
                    acc += A[i, j] * K[j, m]
                Y[i, m] = U[k, m] + h * acc
            call(Y[i], p, t + C[i] * h, K[i])
        for m in range(n):
            un[m] = 0.0
            for i in range(NS):
                kb[i, m] = 0.0
        for q in range(si + 1, last + 1):
            theta = (TS[q] - t) / h
            if theta == 1.0:
                for m in range(n):
                    ub[m] += G[q, m]
                continue
            for m in range(n):
                un[m] += G[q, m]
            for i in range(NS):
                w = 0.0
                for c in range(WI.shape[1] - 1, -1, -1):
                    w = (w + WI[i, c]) * theta
                for m in range(n):
                    kb[i, m] += h * w * G[q, m]
        for i in range(S):
            for m in range(n):
                kb[i, m] += h * BW[i] * ub[m]
        for m in range(n):
            un[m] += ub[m]
        for i in range(stages - 1, -1, -1):
            jt(Y[i], p, t + C[i] * h, kb[i], yb)
            row = base + k * NS + i
            for m in range(n):
                un[m] += yb[m]
                YS[row, m] = Y[i, m]
                KB[row, m] = kb[i, m]
                KS[row, m] = K[i, m]
            TT[row] = t + C[i] * h
            for j in range(i):
                for m in range(n):
                    kb[j, m] += h * A[i, j] * yb[m]
        for i in range(stages, NS):
            row = base + k * NS + i
            for m in range(n):
                KB[row, m] = 0.0
                YS[row, m] = Y[0, m]
                KS[row, m] = K[0, m]
            TT[row] = t
        for m in range(n):
            ub[m] = un[m]
    while si >= 0:  # saves at the start (t_s == t0)
        for m in range(n):
            ub[m] += G[si, m]
        si -= 1
    for m in range(n):
        UBAR[m] = ub[m]

'''

# ``lanes``: every lane's steps TA[OFF[g]:OFF[g+1]], UA[...] and its p from P[:, g] (PARAMS),
# in a loop (CPU) or one thread each (CUDA); LANES is the loop's head.
_LANES = """
def lanes(TA, UA, OFF, P, TSG, G, A, BW, C, WI, S, E, DIRS, UBAR, YS, TT, KB, KS):
    NS = S + E
    LANES
        first = OFF[g]
        end = OFF[g + 1]
        p = PARAMS
        base = (first - g) * NS
        T = TA[first:end]
        U = UA[first:end]
        sweep(T, U, end - first - 1, p, TSG[g], G[g], A, BW, C, WI, S, E, DIRS[g], UBAR[g],
              YS, TT, KB, KS, base)
"""

# Per target: the work arrays (``N``, ``NSTAGES``: constants of the CUDA module) and the
# lane loop's head.
_ALLOCATIONS = {
    "cpu": ("np.empty(n)", "np.empty((NS, n))", "for g in range(OFF.shape[0] - 1):"),
    "cuda": (
        "cuda.local.array(N, np.float64)",
        "cuda.local.array((NSTAGES, N), np.float64)",
        "g = cuda.grid(1)\n    if g < OFF.shape[0] - 1:",
    ),
}


def _state(n: int, values: list[str], kind: str, as_array: bool, lines: list[str]) -> str:
    """Source of ``f``'s ``u`` from ``values``: a tuple, or an array built line by line
    (CPU only: ``lane_sweep`` refuses array ``u`` on CUDA)."""
    if not as_array:
        return "(" + "".join(f"{v}, " for v in values) + ")"
    name = f"a{len(lines)}"
    lines.append(f"    {name} = np.empty({n}, np.{kind})")
    lines += [f"    {name}[{m}] = {v}" for m, v in enumerate(values)]
    return name


def _source(
    n: int, as_array: bool, jacobian: bool, params: str, keys: str, target: str, stages: int
) -> str:
    """The sweep module's source for ``target``: ``call``, ``jt``, the generic ``sweep``
    and the lane loop ``lanes`` (``params``: one lane's ``p`` from ``P[k, g]``; ``stages``:
    the method's main and extra stages, a constant of the CUDA module only)."""
    lines = [
        f'"""dxode kernel discrete adjoint sweep: n={n}, target {target} '
        f'(generated; codegen {CODEGEN_VERSION})."""',
        "import numpy as np",
        f"H = {STEP!r}",
        "user_real = user_cplx = user_jac = None  # bound after import",
        f"# {keys}",
    ]
    if target == "cuda":
        lines += ["from numba import cuda", f"N = {n}", f"NSTAGES = {stages}"]
    else:
        lines += ["from dxode.kernels.returned_rows import rows_of  # f's array rows, checked"]
    lines += ["", "def call(y, p, t, out):"]
    u = _state(n, [f"y[{m}]" for m in range(n)], "float64", as_array, lines)
    lines.append(f"    r = user_real({u}, p, t)")
    if target != "cuda":
        lines.append(f"    r = rows_of(r, {n})")
    lines += [f"    out[{m}] = r[{m}]" for m in range(n)]
    lines += ["", "def jt(y, p, t, v, out):"]
    if jacobian:
        u = _state(n, [f"y[{m}]" for m in range(n)], "float64", as_array, lines)
        lines.append(f"    J = user_jac({u}, p, t)")
        for k in range(n):
            terms = " + ".join(f"J[{m}][{k}] * v[{m}]" for m in range(n))
            lines.append(f"    out[{k}] = {terms}")
    else:
        for k in range(n):
            values = [f"complex(y[{m}], {'H' if m == k else '0.0'})" for m in range(n)]
            z = _state(n, values, "complex128", as_array, lines)
            lines.append(f"    c = user_cplx({z}, p, t)")
            terms = " + ".join(f"(c[{m}].imag / H) * v[{m}]" for m in range(n))
            lines.append(f"    out[{k}] = {terms}")
    vector, matrix, head = _ALLOCATIONS[target]
    sweep = _SWEEP.replace("VECTOR", vector).replace("MATRIX", matrix)
    lanes = _LANES.replace("LANES", head).replace("PARAMS", params)
    return "\n".join(lines) + "\n" + sweep + lanes


def lane_sweep(
    f: Callable[..., Any],
    n: int,
    as_array: bool,
    params: str,
    p_example: Any,
    jac: Callable[..., Any] | None = None,
    target: str = "cpu",
    stages: int = 0,
) -> Callable[..., Any]:
    """The compiled lane loop ``lanes`` for ``f`` with ``n`` components on ``target``
    (``"cpu"``, or ``"cuda"``: one thread per lane, called with host arrays like the CPU's;
    ``stages``: the method's main and extra stages) (``u`` as an array with ``as_array``,
    CPU only; one lane's ``p`` is the source ``params`` in ``P[k, g]``); ``jac`` (per lane,
    ``J[i][k]``) replaces complex step when given; ``p_example`` is one lane's ``p`` (for
    type checks)."""
    if as_array and target == "cuda":
        raise KernelUnsupportedError(CUDA_GRADIENT_U)
    keys = f"f={function_key(f)}@{where_defined(f)}" + (
        f" jac={function_key(jac)}" if jac is not None else ""
    )
    source = _source(n, as_array, jac is not None, params, keys, target, stages)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    module = _MODULES.get(digest)
    if module is None:
        path = _write_source(source, f"dxode_adjoint_{digest}.py")
        module = _import(path, f"_dxode_adjoint_{digest}")
        if jac is None:  # type-checked on the CPU for either target
            copy = complex_copy(f)
            check_compiles(copy, f, n, as_array, p_example)
        _compile(module, f, jac if jac is not None else copy, jac is not None, target)
        _MODULES[digest] = module
    if target == "cuda":
        return functools.partial(_on_device, module.lanes)
    return module.lanes


def _compile(
    module: Any, f: Callable[..., Any], derivative: Any, jacobian: bool, target: str
) -> None:
    """Bind the user's functions (``derivative``: ``jac``, or ``f``'s complex copy) and
    compile the module's functions for ``target``."""
    import numba

    if target == "cuda":
        from numba import cuda

        # As compile_kernel compiles f for CUDA: device functions, inlined.
        inline = lambda fn: cuda.jit(device=True, inline=True)(fn)
        compiled = lambda fn: cuda.jit(device=True)(fn)
        driver = cuda.jit
    else:
        # Inlined as compile_kernel inlines f (no function of their own whose environment a
        # cached load would have to import: f's module may be one numba cannot import).
        inline = numba.njit(inline="always", error_model="numpy")
        compiled = numba.njit(cache=True, nogil=True, error_model="numpy")
        driver = compiled
    module.user_real = inline(numba_ready(f))
    if jacobian:
        module.user_jac = inline(numba_ready(derivative, _RowsToTuples()))
    else:
        module.user_cplx = inline(derivative)
    module.call = inline(module.call)
    module.jt = inline(module.jt)
    module.sweep = compiled(module.sweep)
    module.lanes = driver(module.lanes)


# The arguments of ``lanes`` the sweep writes: UBAR, YS, TT, KB, KS.
_WRITTEN = (13, 14, 15, 16, 17)


def _on_device(kernel: Any, *arrays: Any) -> None:
    """Run the CUDA ``lanes`` on host arrays: inputs copied to the device, one thread per
    lane, the written arrays copied back into theirs."""
    from .cuda import launch, require_gpu

    cuda = require_gpu()
    on_device = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in arrays]
    lanes = arrays[2].shape[0] - 1
    launch(kernel, lanes)(*on_device)
    cuda.synchronize()
    for i in _WRITTEN:
        arrays[i][...] = on_device[i].copy_to_host()
