"""The builder's layout as the README draws it: at the top of `aiter/aot/flydsl` only what a user
runs or edits, the machinery in subpackages that import only those below them; the tables'
generator imports the families, never the other way; the benchmarks import each other without a
cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layout.import_graph import cycles, import_graph

REPO = Path(__file__).resolve().parents[2]
GRAPH = import_graph(REPO / "aiter")
BUILDER = "aiter.aot.flydsl"
TOP = {
    "__init__",
    "__main__",
    "driver",
    "registry",
    "wheel",
    "cache_wheels",
    "gemm",
    "moe",
    "moe_routing",
    "conv3d",
    "fmha_fp8",
    "chunk_gdn_h",
}
# From the bottom up: a subpackage imports only itself, those before it, and the top's registry.
SUBPACKAGES = ("jobs", "dry_run", "audit", "capture", "execution", "replay", "distribution")


def _part(module: str) -> str | None:
    """The builder subpackage (or top-level module) a module belongs to."""
    if not module.startswith(BUILDER + "."):
        return None
    return module[len(BUILDER) + 1 :].split(".")[0]


def test_the_top_holds_only_what_a_user_names() -> None:
    root = REPO / "aiter" / "aot" / "flydsl"
    files = {p.stem for p in root.glob("*.py")}
    folders = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert files == TOP
    assert folders == set(SUBPACKAGES)


def _wrong_arrows(graph: dict[str, set[str]], subpackage: str) -> list[str]:
    """Imports of a subpackage's modules that reach a subpackage above it (or the top)."""
    allowed = set(SUBPACKAGES[: SUBPACKAGES.index(subpackage) + 1]) | {"registry"}
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _part(module) == subpackage
        for target in targets
        if _part(target) is not None and _part(target) not in allowed
    )


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_a_subpackage_imports_only_those_below_it(subpackage: str) -> None:
    assert _wrong_arrows(GRAPH, subpackage) == []


def test_the_order_check_sees_an_arrow_up() -> None:
    graph = {
        "aiter.aot.flydsl.jobs.family": {"aiter.aot.flydsl.replay.naming"},
        "aiter.aot.flydsl.replay.naming": {"aiter.aot.flydsl.jobs.family", "aiter.aot.flydsl.gemm"},
    }
    assert _wrong_arrows(graph, "jobs") == [
        "aiter.aot.flydsl.jobs.family -> aiter.aot.flydsl.replay.naming"
    ]
    assert _wrong_arrows(graph, "replay") == [
        "aiter.aot.flydsl.replay.naming -> aiter.aot.flydsl.gemm"
    ]


def test_the_families_never_import_the_tables_generator() -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.startswith("aiter.ops.")
        for target in targets
        if target.startswith("aiter.configs")
    )
    assert wrong == []


def _benchmark_graph() -> dict[str, set[str]]:
    scripts = {p.stem: p for p in (REPO / "benchmarks").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in scripts.items():
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (node.module or "").removeprefix("benchmarks").lstrip(".")
                targets = [base] if base else [alias.name for alias in node.names]
            else:
                continue
            edges.update(t.split(".")[0] for t in targets if t.split(".")[0] in scripts)
        edges.discard(name)
    return graph


def test_the_benchmarks_have_no_import_cycle() -> None:
    graph = _benchmark_graph()
    assert "compile_env" in graph["kernel_profile"] and "compile_env" in graph["sorting_profile"]
    assert cycles(graph) == []
