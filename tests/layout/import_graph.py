"""The static import graph of the `aiter` package: every import statement of every module, at
module level or inside a function (lazy imports count), resolved to modules of the package."""

from __future__ import annotations

import ast
from pathlib import Path


def package_modules(root: Path, package: str = "aiter") -> dict[str, Path]:
    """Dotted name -> source file of every module under `root` (the package directory)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    # Compiled extensions are modules too (leaves: they import nothing of the package).
    for path in sorted(root.rglob("*.so")):
        parts = list(path.relative_to(root.parent).parts)
        parts[-1] = parts[-1].split(".", 1)[0]
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports (a `from pkg import name` edge goes to the
    submodule `pkg.name` when there is one, else to `pkg`)."""
    modules = package_modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        graph[name] = edges
        if path.suffix != ".py":
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name:
                    edges.add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
