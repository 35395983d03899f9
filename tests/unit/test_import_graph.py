"""The import graph of ``runner/``: no cycles, and no private name imported from another module.

Every import counts: at module level, inside functions (deferred for cold start) and under
``TYPE_CHECKING``, absolute and relative. A deferred import hides a cycle from Python, not
from the reader: the two modules still cannot be understood, tested or moved one without the
other.

How an import becomes an edge:
- ``import runner.a.b`` and ``from runner.a import b`` (``b`` a submodule) give an edge to
  ``runner.a.b``; ``from runner.a.b import name`` gives an edge to ``runner.a.b``.
- A package counts as its ``__init__`` module: its own imports, lazy re-exports included
  (``runner/__init__`` naming ``runner.tasks``), are its edges, and ``from runner import task``
  is an edge to ``runner``.
- Importing a submodule also runs its parents' ``__init__``; that implicit edge is not
  counted, or every package that re-exports one of its modules would be a cycle by
  construction. The ``__init__`` modules here re-export lazily, on first use, so the edge
  would not be real at import time either.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import runner

ROOT = Path(runner.__file__).parent


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module, as resolved above
    names: tuple[str, ...]  # names taken from it (`from target import a, b`), else ()
    line: int

    def where(self) -> str:
        return f"{self.source}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.append(Import(name, alias.name, (), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                frm = ".".join([*base, node.module] if node.module else base)
            else:
                frm = node.module or ""
            if frm not in modules:
                continue
            taken: list[str] = []
            for alias in node.names:
                sub = f"{frm}.{alias.name}"
                if sub in modules:
                    found.append(Import(name, sub, (), node.lineno))
                else:
                    taken.append(alias.name)
            if taken:
                found.append(Import(name, frm, tuple(taken), node.lineno))
    return found


def _all_imports() -> list[Import]:
    modules = _modules()
    return [i for name, path in modules.items() for i in _imports(name, path, modules)]


def _cycles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    graph: dict[str, set[str]] = {}
    for i in imports:
        if i.source != i.target:
            graph.setdefault(i.source, set()).add(i.target)
            graph.setdefault(i.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def test_the_graph_sees_every_kind_of_import() -> None:
    """The walk finds deferred, TYPE_CHECKING and package-level imports (or the test below
    would pass on a graph with holes)."""
    edges = {(i.source, i.target) for i in _all_imports()}
    assert ("runner", "runner.tasks") in edges  # under TYPE_CHECKING, and inside __getattr__
    assert ("runner.queue", "runner.queue.producer") in edges  # inside a function
    assert len(edges) > 200


def test_no_import_cycles() -> None:
    imports = _all_imports()
    cycles = _cycles(imports)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines.extend(
            f"    {i.where()} imports {i.target}"
            for i in imports
            if i.source in members and i.target in members and i.source != i.target
        )
    assert not cycles, f"{len(cycles)} import cycle(s) in runner/:\n" + "\n".join(lines)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_attributes(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """``module._name`` where ``module`` is another runner module imported whole (``import
    runner.x as m``, ``from runner import x``): the same reach as importing ``_name``."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if f"{node.module}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return [
        f"{name}:{node.lineno} uses {bound[node.value.id]}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and bound.get(node.value.id, name) != name
        and _private(node.attr)
    ]


def test_no_private_name_imported_from_another_module() -> None:
    modules = _modules()
    private = [
        f"{i.where()} imports {name} from {i.target}"
        for i in _all_imports()
        for name in i.names
        if _private(name)
    ]
    private += [
        use for name, path in modules.items() for use in _private_attributes(name, path, modules)
    ]
    assert not private, "private names used across modules:\n" + "\n".join(private)
