"""The compile-time tile of every GEMM kernel here: C rows, C columns and K depth per block
per main-loop iteration, and the grid of tiles a kernel supports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmTile:
    tile_m: int
    tile_n: int
    tile_k: int


def tile_grid(
    ms: tuple[int, ...], ns: tuple[int, ...], ks: tuple[int, ...]
) -> tuple[GemmTile, ...]:
    """Every (tile_m, tile_n, tile_k) combination, tile_m slowest."""
    return tuple(GemmTile(m, n, k) for m in ms for n in ns for k in ks)
