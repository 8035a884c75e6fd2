"""The package's import graph has no cycle, and the config checker imports no science module.

Every import of src/truthflow counts: at module level, inside functions, and `importlib.import_module` with a
literal name. A cycle hidden inside a function still ties the modules together: the rules' code inputs are
derived from the scripts' imports (workflow/rules/common.smk, `code()`), so a ring makes an edit of one
stage's module rerun another stage's jobs."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
PKG = "truthflow"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / PKG).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _resolve(name: str, package: str) -> str:
    """An absolute module name from a relative one (`.twins`, `..config`) inside `package`."""
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([name.lstrip(".")] if name.lstrip(".") else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The truthflow modules `module` imports, wherever in the file and however (see the module docstring)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve("." * node.level + (node.module or ""), package)
            for alias in node.names:  # `from . import registry`: the submodule, else the package itself
                sub = f"{base}.{alias.name}"
                names.add(sub if sub in known else base)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            name = _literal(node.args[0]) if node.args else None
            if name:
                names.add(_resolve(name, package if len(node.args) > 1 or node.keywords else ""))
    return {n for n in names if n in known and n != module}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: imports_of(m, p, set(modules)) for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            ring = []
            while not ring or ring[-1] != v:
                ring.append(stack.pop())
            if len(ring) > 1:
                found.append(sorted(ring))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_imports_inside_functions_and_through_importlib():
    graph = import_graph()
    assert "truthflow.errors" in graph["truthflow.models"]  # module level
    assert "truthflow.engine.backend" in graph["truthflow.models"]  # inside load_model
    assert "truthflow.twins" in graph["truthflow.models"]  # importlib.import_module(".twins", __package__)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_config_checker_imports_no_science_module():
    """truthflow.config reads the schema and the registry only: a science module it imported would count its
    whole import tree as the code of every rule whose script checks a config key."""
    graph = import_graph()
    reached, todo = set(), ["truthflow.config"]
    while todo:
        for dep in graph[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    assert reached <= {"truthflow.registry", "truthflow.errors"}, sorted(reached)
