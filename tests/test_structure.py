"""The shape of the code: no import cycles, short functions, Dask only in the Dask layer.

Read from the source with ``ast`` (nothing is imported), over ``dxode/`` and the top-level
``backends/`` (shipped as ``dxode.backends``). Every import counts, function-level (lazy)
ones included; imports under ``if TYPE_CHECKING:`` do not, since they never run.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

from dxode.solvers import ALGORITHMS

from matrix import METHODS

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 100
# The Dask layer: the only modules that may talk to a Dask client.
DASK_LAYER = (
    "dxode/ensemble/dask_ensemble.py",
    "dxode/ensemble/dask_cancel.py",
    "dxode/ensemble/cluster.py",
    "dxode/demo/",
)
# Client calls recognised by name alone, and generic names that count only on a client.
CLIENT_CALLS = {"submit", "gather", "scatter", "as_completed", "fire_and_forget", "wait_for"}
CLIENT_ONLY_CALLS = {"map", "run", "cancel", "compute", "persist", "replicate", "rebalance"}


# ---- the sources --------------------------------------------------------------------------


def source_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name: ``dxode/**`` and ``backends/**`` as
    ``dxode.backends.**`` (whether or not the ``dxode/backends`` link exists)."""
    modules: dict[str, Path] = {}
    for top, prefix in ((root / "dxode", ("dxode",)), (root / "backends", ("dxode", "backends"))):
        for path in sorted(top.rglob("*.py")):
            relative = path.relative_to(top)
            if relative.parts[0] == "backends" and top.name == "dxode":
                continue  # the link to the top-level backends/, read under its own name
            parts = (*prefix, *relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:``."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return hidden


def imported_modules(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """The package-internal modules that module ``name`` imports, with the line, anywhere in
    its body (top level, functions, methods), relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    hidden = _type_checking_blocks(tree)
    package = name.split(".") if _is_package(path) else name.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in known:
                    yield submodule, node.lineno
                elif target in known:
                    yield target, node.lineno


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` over the package."""
    modules = source_modules(root)
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in imported_modules(name, path, known):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component with more than one module, as
    the path ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_shortest_cycle(graph, component) for component in components]


def _shortest_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    best: list[str] = []
    for start in sorted(component):
        paths = {start: [start]}
        frontier = [start]
        while frontier and not (best and len(paths[frontier[0]]) >= len(best)):
            following = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start and (not best or len(paths[v]) + 1 < len(best)):
                        best = [*paths[v], start]
                    elif w in component and w not in paths:
                        paths[w] = [*paths[v], w]
                        following.append(w)
            frontier = following
    return best


def describe_cycle(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return (
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
    )


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> Iterator[tuple[str, int]]:
    """``(qualified name, body lines)`` of each function in ``path`` whose body, from the
    first statement after the docstring to the function's last line, is over ``limit``."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                body = child.body
                if ast.get_docstring(child, clean=False) is not None:
                    body = body[1:]
                if body:
                    lines = child.end_lineno - body[0].lineno + 1
                    if lines > limit:
                        yield name, lines
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def client_calls(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, call)`` of each Dask client call in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = ast.unparse(func.value)
            on_client = "client" in receiver.lower()
            if func.attr in CLIENT_CALLS or (func.attr in CLIENT_ONLY_CALLS and on_client):
                yield node.lineno, f"{receiver}.{func.attr}(...)"
        elif isinstance(func, ast.Name) and func.id in CLIENT_CALLS:
            yield node.lineno, f"{func.id}(...)"


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _own_files() -> list[Path]:
    """Every source file once: ``dxode/`` without the ``dxode/backends`` link, and ``backends/``."""
    link = ROOT / "dxode" / "backends"
    package = [
        path for path in ROOT.joinpath("dxode").rglob("*.py") if not path.is_relative_to(link)
    ]
    return sorted([*package, *ROOT.joinpath("backends").rglob("*.py")])


# ---- the checks' own tests: each one catches what it is for --------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cycle_finder_sees_lazy_and_relative_imports(tmp_path):
    root = _write(
        tmp_path,
        {
            "dxode/__init__.py": "from ._a import A\n",
            "dxode/_a.py": "from .sub.b import B\nA = 1\n",
            "dxode/sub/__init__.py": "",
            "dxode/sub/b.py": "def later():\n    from .. import _a\n    return _a\nB = 2\n",
            "dxode/_c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import _a\n"
            ),
            "backends/__init__.py": "def f():\n    from dxode import _c\n",
        },
    )
    graph = import_graph(root)
    assert graph["dxode.sub.b"] == {"dxode._a": 2}
    assert graph["dxode._c"] == {}  # TYPE_CHECKING imports never run
    assert graph["dxode.backends"] == {"dxode._c": 2}
    [cycle] = find_cycles(graph)
    assert cycle in (
        ["dxode._a", "dxode.sub.b", "dxode._a"],
        ["dxode.sub.b", "dxode._a", "dxode.sub.b"],
    )
    assert "dxode._a (line 1) -> dxode.sub.b (line 2) -> dxode._a" in describe_cycle(
        graph, ["dxode._a", "dxode.sub.b", "dxode._a"]
    )


def test_function_length_counts_from_the_first_statement_after_the_docstring(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    path = tmp_path / "m.py"
    path.write_text(
        'def exactly_100():\n    """Doc\n\n    string."""\n'
        + body
        + 'def only_a_docstring():\n    """Doc."""\n'
        + "class C:\n    def over(self):\n"
        + body.replace("    ", "        ")
        + "        return 1\n"
    )
    assert dict(long_functions(path)) == {"C.over": 101}


def test_client_call_finder(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "def f(static, pool, client):\n"
        "    static.client.submit(g)\n"
        "    x = client.gather(y)\n"
        "    as_completed(z)\n"
        "    client.map(g, [1])\n"
        "    pool.map(g, [1])\n"  # not a client
        "    subprocess.run(['ls'])\n"
    )
    assert [line for line, _ in client_calls(path)] == [2, 3, 4, 5]


# ---- the package ---------------------------------------------------------------------------


def test_every_method_is_in_the_test_matrix():
    missing = sorted(name for name, cls in ALGORITHMS.items() if cls not in METHODS)
    assert not missing, f"add {missing} to METHODS in tests/matrix.py"


def test_no_import_cycles():
    graph = import_graph()
    cycles = [describe_cycle(graph, cycle) for cycle in find_cycles(graph)]
    assert not cycles, "import cycles (lazy imports count):\n" + "\n".join(cycles)


def test_no_function_body_over_100_lines():
    found = [
        f"{_relative(path)}: {name} has {lines} lines"
        for path in _own_files()
        for name, lines in long_functions(path)
    ]
    assert not found, f"function bodies over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


def test_no_dask_client_calls_outside_the_dask_layer():
    found = [
        f"{_relative(path)}:{line}: {call}"
        for path in _own_files()
        if not _relative(path).startswith(DASK_LAYER)
        for line, call in sorted(client_calls(path))
    ]
    assert not found, "Dask client calls outside the Dask layer:\n" + "\n".join(found)
