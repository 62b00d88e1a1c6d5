"""The generated kernel source, read as Python (no numba needed).

A conditional expression in a generated lane loop costs compile time, not run time: numba's
IR makes three blocks of it (a call to ``select`` is one), and type inference and SSA grow
with blocks times names, so a few hundred of them cost seconds of every cold compile. The
vectorized lane loops therefore select through ``select``/``maximum``/``minimum``, which are
compiled once and called (LLVM inlines them as select instructions).
"""

from __future__ import annotations

import ast

import pytest

import dxode
from dxode.kernels.autoswitch_codegen import generate as generate_autoswitch
from dxode.kernels.codegen import CALLED, HELPERS, KernelLayout, generate, pool_constants
from dxode.kernels.description import describe
from dxode.kernels.rosenbrock_codegen import generate as generate_rosenbrock

LAYOUT = KernelLayout(
    n=3,
    dtype="float64",
    params="(P[0, COL], P[1, COL], P[2, COL], )",
    u_as_array=False,
    block=32,
    target="cpu",
    adaptive=True,
    controller=(0.7, -0.4, 0.0, 0.9, 0.2, 10.0),
    param_rows=3,
)


def _source(alg: object, layout: KernelLayout = LAYOUT) -> str:
    desc = describe(alg)
    if isinstance(alg, dxode.AutoSwitch):
        return generate_autoswitch(desc, layout)  # type: ignore[arg-type]
    if isinstance(alg, (dxode.Tsit5, dxode.Vern7, dxode.RK4)):
        return generate(desc, layout)  # type: ignore[arg-type]
    return generate_rosenbrock(desc, layout)  # type: ignore[arg-type]


def _functions(source: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Vern7(), dxode.RK4()], ids=repr)
def test_the_explicit_attempt_has_no_conditional_expressions(alg):
    attempt = _functions(_source(alg))["attempt"]
    found = [ast.unparse(node) for node in ast.walk(attempt) if isinstance(node, ast.IfExp)]
    assert found == []


@pytest.mark.parametrize("alg", [dxode.Rodas5P(), dxode.AutoSwitch()], ids=repr)
def test_the_stiff_attempts_have_no_conditional_expressions(alg):
    functions = _functions(_source(alg))
    attempts = [f for name, f in functions.items() if name.startswith("attempt")]
    assert attempts
    for attempt in attempts:
        found = [ast.unparse(node) for node in ast.walk(attempt) if isinstance(node, ast.IfExp)]
        assert found == [], attempt.name


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Rodas5P(), dxode.AutoSwitch()], ids=repr)
def test_every_module_lists_its_inlined_and_called_helpers(alg):
    source = _source(alg)
    namespace: dict[str, object] = {}
    exec(compile(source, "<kernel>", "exec"), namespace)  # defines functions only
    assert set(HELPERS) <= set(namespace["HELPERS"])  # type: ignore[arg-type]
    assert set(CALLED) <= set(namespace["CALLED"])  # type: ignore[arg-type]
    for name in (*namespace["HELPERS"], *namespace["CALLED"]):  # type: ignore[misc]
        assert callable(namespace[name]), name


@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Rodas5P(), dxode.AutoSwitch()], ids=repr)
@pytest.mark.parametrize("record", [False, True], ids=["saveat", "every-step"])
def test_no_slice_assignment_in_the_generated_code(alg, record):
    """``A[:k] = B`` makes numba compile its shape-mismatch error message (string formatting:
    ``str``, ``join``, f-strings), which took about 2.5 of a cold single solve's 5.5 s of CPU;
    the record buffers grow by element loops instead."""
    import dataclasses

    layout = dataclasses.replace(LAYOUT, record=record)
    source = _source(alg, layout)
    found = [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Assign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Subscript)
        and any(isinstance(part, ast.Slice) for part in ast.walk(target.slice))
    ]
    assert found == []
    if record:
        assert "TREC2[rcopy] = TREC[rcopy]" in source


def _literal_casts(tree: ast.AST) -> list[ast.Call]:
    """The calls ``DT(x)`` in ``tree`` whose ``x`` names nothing but ``np``."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "DT"
        if all(part.id == "np" for part in ast.walk(node.args[0]) if isinstance(part, ast.Name))
    ]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("alg", [dxode.Tsit5(), dxode.Rodas5P(), dxode.AutoSwitch()], ids=repr)
def test_cast_literals_become_module_constants_of_the_same_value_and_dtype(alg, dtype):
    """numba types a call ``DT(0.161)`` at each use (about 450 in a Tsit5 ensemble kernel)
    but reads a module constant as a literal: the pooled source defines each literal once,
    with the value and dtype of the cast it replaces."""
    import dataclasses

    import numpy as np

    layout = dataclasses.replace(LAYOUT, dtype=dtype)
    source = _source(alg, layout)
    pooled = pool_constants(source)
    casts = _literal_casts(ast.parse(source))
    assert len(casts) > 50
    left = [ast.unparse(c) for f in _functions(pooled).values() for c in _literal_casts(f)]
    assert left == []
    namespace: dict[str, object] = {}
    exec(compile(pooled, "<kernel>", "exec"), namespace)
    values = {ast.unparse(node.args[0]): node for node in casts}
    pool = {name: value for name, value in namespace.items() if name.startswith("DT_")}
    assert len(pool) == len(values)  # each literal once
    expected = {np.dtype(dtype).type(eval(text, {"np": np})) for text in values}
    assert all(type(value) is np.dtype(dtype).type for value in pool.values())
    assert set(map(float, pool.values())) == set(map(float, expected))
    if "-0.0" in values:
        assert any(np.signbit(value) and value == 0 for value in pool.values())
