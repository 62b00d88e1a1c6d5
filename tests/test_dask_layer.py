"""Only the Dask layer talks to a Dask client: every other module schedules batches through
an ensemble algorithm's ``map_batches``."""

from __future__ import annotations

import ast
from pathlib import Path

DXODE = Path(__file__).resolve().parent.parent / "dxode"
DASK_LAYER = {"ensemble/dask_ensemble.py", "ensemble/dask_cancel.py", "ensemble/cluster.py"}
CLIENT_CALLS = {"submit", "gather", "scatter", "map", "compute", "persist", "run", "cancel"}


def _client_calls(tree: ast.AST) -> list[str]:
    """``<name ending in client>.<client call>(...)`` in a module."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CLIENT_CALLS
        ):
            owner = ast.unparse(node.func.value)
            if owner.split(".")[-1].endswith("client"):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
    return found


def test_no_dask_client_call_outside_the_dask_layer():
    offenders = {}
    for path in sorted(DXODE.rglob("*.py")):
        name = path.relative_to(DXODE).as_posix()
        if name in DASK_LAYER or name.startswith("backends/"):
            continue
        calls = _client_calls(ast.parse(path.read_text()))
        if calls:
            offenders[name] = calls
    assert not offenders, offenders


def test_the_check_sees_a_client_call():
    assert _client_calls(ast.parse("static.client.submit(f, x)\nclient.gather(fs)")) == [
        "line 1: static.client.submit",
        "line 2: client.gather",
    ]
