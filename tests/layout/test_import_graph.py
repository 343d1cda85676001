"""aiter's import graph, lazy imports included: no cycle anywhere, and nothing the serving path
loads reaches the AOT builder (`aiter.aot`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layout.import_graph import cycles, import_graph, reachable

ROOT = Path(__file__).resolve().parents[2] / "aiter"
GRAPH = import_graph(ROOT)
BUILDER = "aiter.aot"
# Commands run by developers and the wheel build, not by a serving process.
TOOLS = ("aiter.aot", "aiter.configs")


def _is_builder(module: str) -> bool:
    return module == BUILDER or module.startswith(BUILDER + ".")


def test_the_graph_is_the_whole_package() -> None:
    assert {"aiter", "aiter.dispatch", "aiter.jit_monitor", "aiter.flydsl_bridge"} <= set(GRAPH)
    assert (
        "aiter.ops.moe.entry" in GRAPH and "aiter._moe_host" in GRAPH["aiter.ops.moe.host_planner"]
    )
    # A lazy import inside a function is an edge: the dispatch observer's monitor once was one.
    assert "aiter.ops.gemm.entry" in GRAPH["aiter.aot.flydsl.gemm"]


def test_no_import_cycle() -> None:
    assert cycles(GRAPH) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "module", sorted(m for m in GRAPH if not m.startswith(TOOLS)), ids=lambda m: m
)
def test_serving_modules_never_reach_the_builder(module: str) -> None:
    assert not [m for m in reachable(GRAPH, module) if _is_builder(m)]


def test_the_bridge_needs_neither_the_builder_nor_the_operators() -> None:
    bridge = [m for m in GRAPH if m.startswith("aiter.flydsl_bridge")]
    for module in bridge:
        assert not [m for m in reachable(GRAPH, module) if m.startswith(("aiter.aot", "aiter.ops"))]
