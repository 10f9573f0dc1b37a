"""No import cycles inside omnictl/.

The graph is built statically (``ast`` over every ``.py`` file), so an import inside a
function counts as much as one at the top: a cycle hidden in a function only moves the
failure to the first call. Imports under ``if TYPE_CHECKING:`` are ignored (they never
run). ``from package import name`` is an edge to ``package.name`` when that is a module,
else to the package. ``importlib.import_module("omnictl.x")`` and ``__import__("omnictl.x")``
with a literal name count too: a lazy import by name is still an import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "omnictl"
ROOT = PACKAGE.parent


@dataclass(frozen=True)
class Import:
    target: str
    file: Path
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node that can run: the bodies of ``if TYPE_CHECKING:`` left out."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    """``importlib.import_module``, ``import_module`` (imported from importlib) or ``__import__``."""
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def imports_of(path: Path, modules: set[str], this: str | None = None) -> list[Import]:
    """The package-internal imports of ``path`` (module ``this``, by default its own name)."""
    this = this or module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[Import] = []
    for node in _runtime_nodes(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the containing package, `level - 1` further up
                package = this.split(".") if is_package else this.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in modules else base)
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                targets = [name.value]
        for target in targets:
            known = _known(target, modules)
            if known is not None and known != this:
                found.append(Import(known, path, node.lineno))  # type: ignore[attr-defined]
    return found


def import_graph() -> dict[str, list[Import]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def find_cycle(graph: dict[str, list[Import]]) -> list[Import] | None:
    """One cycle as the imports that close it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[Import] = []

    def visit(module: str) -> list[Import] | None:
        state[module] = 1
        for edge in graph.get(module, []):
            if state.get(edge.target) == 1:
                start = next((i for i, e in enumerate(path) if e.target == edge.target), None)
                return [*path[start + 1 if start is not None else 0:], edge] if start is not None \
                    else [*path, edge]
            if edge.target not in state:
                path.append(edge)
                cycle = visit(edge.target)
                if cycle is not None:
                    return cycle
                path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle is not None:
                return cycle
    return None


def describe(cycle: list[Import]) -> str:
    first = cycle[-1].target
    hops = [f"  {edge.file}:{edge.line} imports {edge.target}" for edge in cycle]
    names = " -> ".join([first, *(e.target for e in cycle)])
    return f"import cycle {names}\n" + "\n".join(hops)


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, describe(cycle)


def test_the_checker_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import omnictl.b\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import omnictl.a\n"
                 "def f():\n    from omnictl import a\n")
    modules = {"omnictl", "omnictl.a", "omnictl.b"}
    graph = {"omnictl.a": imports_of(a, modules, "omnictl.a"),
             "omnictl.b": imports_of(b, modules, "omnictl.b")}
    assert [(e.target, e.line) for e in graph["omnictl.b"]] == [("omnictl.a", 5)]  # not line 3
    cycle = find_cycle(graph)
    assert cycle is not None
    message = describe(cycle)
    assert "import cycle omnictl.a -> omnictl.b -> omnictl.a" in message or \
        "import cycle omnictl.b -> omnictl.a -> omnictl.b" in message
    assert f"{b}:5 imports omnictl.a" in message


def test_the_checker_follows_imports_by_literal_name(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import omnictl.b\n")
    b.write_text("import importlib\nname = 'omnictl.a'\n"
                 "def f():\n    importlib.import_module(name)\n"  # not a literal: not followed
                 "def g():\n    return importlib.import_module('omnictl.a')\n"
                 "def h():\n    __import__('omnictl.a')\n")
    modules = {"omnictl", "omnictl.a", "omnictl.b"}
    graph = {"omnictl.a": imports_of(a, modules, "omnictl.a"),
             "omnictl.b": imports_of(b, modules, "omnictl.b")}
    assert sorted((e.target, e.line) for e in graph["omnictl.b"]) == [("omnictl.a", 6), ("omnictl.a", 8)]
    assert find_cycle(graph) is not None
