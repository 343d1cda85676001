"""Which FlyDSL kernel serves a bf16/fp16 GEMM: the kernel-name grammar and the heuristic.

A tuned row names a tile (kernelName) and a split-K; splitK 0 and untuned shapes use `heuristic`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiter.ops.flydsl.gemm_a16w16 import SUPPORTED_TILES, GemmTile

NAME_PREFIX = "flydsl_a16w16"
_NAME = re.compile(r"^flydsl_a16w16_(?P<mma>[a-z]+)_(?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+)$")
MAX_SPLIT_K = 8
MIN_K_TILES_PER_SPLIT = 4  # a split shorter than this costs more in reduction than it saves


@dataclass(frozen=True)
class KernelChoice:
    mma: str
    tile: GemmTile
    split_k: int

    @property
    def name(self) -> str:
        return kernel_name(self.mma, self.tile)


def kernel_name(mma: str, tile: GemmTile) -> str:
    return f"{NAME_PREFIX}_{mma}_{tile.tile_m}x{tile.tile_n}x{tile.tile_k}"


def example_names(mma: str) -> str:
    return ", ".join(kernel_name(mma, t) for t in SUPPORTED_TILES[mma][:2])


def parse_kernel_name(name: str, mma: str) -> GemmTile:
    """The tile a kernelName names; ValueError saying what a name looks like otherwise."""
    match = _NAME.match(name.strip())
    if not match:
        raise ValueError(
            f"{name!r} is not an a16w16 kernel name: expected "
            f"{NAME_PREFIX}_<mfma|wmma>_<tile_m>x<tile_n>x<tile_k>, e.g. {example_names(mma)}"
        )
    if match["mma"] != mma:
        raise ValueError(
            f"{name!r} names a {match['mma']} kernel, but this arch uses {mma} kernels"
        )
    tile = GemmTile(int(match["m"]), int(match["n"]), int(match["k"]))
    if tile not in SUPPORTED_TILES[mma]:
        supported = ", ".join(f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in SUPPORTED_TILES[mma])
        raise ValueError(
            f"{name!r}: tile not supported by the {mma} kernel; supported: {supported}"
        )
    return tile


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def heuristic_tile(m: int, n: int, k: int, cu_num: int, mma: str) -> GemmTile:
    """Tile for an untuned shape.

    tile_m: the smallest supported tile_m >= M (capped at the largest), so small-M decode
    shapes waste no rows. tile_n: the widest supported tile_n that still gives at least one
    block per CU, else the narrowest. tile_k: the largest supported tile_k dividing K.
    """
    tiles = SUPPORTED_TILES[mma]
    tile_ms = sorted({t.tile_m for t in tiles})
    tile_m = next((tm for tm in tile_ms if tm >= m), tile_ms[-1])
    tile_ns = sorted({t.tile_n for t in tiles if t.tile_m == tile_m})
    tile_n = tile_ns[0]
    for tn in reversed(tile_ns):
        if _ceil_div(m, tile_m) * _ceil_div(n, tn) >= cu_num:
            tile_n = tn
            break
    tile_ks = sorted(
        {t.tile_k for t in tiles if t.tile_m == tile_m and t.tile_n == tile_n}, reverse=True
    )
    tile_k = next((tk for tk in tile_ks if k % tk == 0), tile_ks[-1])
    return GemmTile(tile_m, tile_n, tile_k)


def heuristic_split_k(m: int, n: int, k: int, cu_num: int, tile: GemmTile) -> int:
    """Split K when the output has fewer blocks than the GPU has CUs.

    The largest power of two s <= MAX_SPLIT_K such that blocks * s <= cu_num and each split
    keeps at least MIN_K_TILES_PER_SPLIT k-tiles; 1 when the output alone fills the GPU.
    """
    blocks = _ceil_div(m, tile.tile_m) * _ceil_div(n, tile.tile_n)
    k_tiles = _ceil_div(k, tile.tile_k)
    split = 1
    while (
        split * 2 <= MAX_SPLIT_K
        and blocks * split * 2 <= cu_num
        and k_tiles // (split * 2) >= MIN_K_TILES_PER_SPLIT
    ):
        split *= 2
    return split


def choose(
    m: int, n: int, k: int, cu_num: int, mma: str, tile: GemmTile | None, split_k: int
) -> KernelChoice:
    """The kernel for one call: the row's tile and split-K where given, the heuristic elsewhere."""
    if tile is None:
        tile = heuristic_tile(m, n, k, cu_num, mma)
    if split_k <= 0:
        split_k = heuristic_split_k(m, n, k, cu_num, tile)
    return KernelChoice(mma, tile, split_k)
