"""How every GEMM family names its kernels and picks a tile and split-K for an untuned call.

One `KernelFamily` per kernel family (a16w16, a8w8 bpreshuffle and blockscale): a name grammar,
the tiles per MMA flavour from its FlyDSL kernel module, one heuristic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiter.ops import gemm_tables
from aiter.ops.flydsl.gemm_a8w8 import BLOCKSCALE_TILES, BPRESHUFFLE_TILES
from aiter.ops.flydsl.gemm_a16w16 import SUPPORTED_TILES as A16W16_TILES

MAX_SPLIT_K = 8
MIN_K_TILES_PER_SPLIT = 4  # a split shorter than this costs more in reduction than it saves
SPLIT_KS = tuple(1 << i for i in range(MAX_SPLIT_K.bit_length()))  # 1, 2, 4, 8: what fallbacks try


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KernelChoice:
    family: KernelFamily
    mma: str
    tile: Any  # the family's tile type: tile_m, tile_n, tile_k
    split_k: int

    @property
    def name(self) -> str:
        return self.family.kernel_name(self.mma, self.tile)


@dataclass(frozen=True)
class KernelFamily:
    """Kernel names `<prefix>_<mma>_<tile_m>x<tile_n>x<tile_k>` over the tiles each flavour has."""

    prefix: str
    tiles: Mapping[str, tuple[Any, ...]]  # MMA flavour -> supported tiles

    def kernel_name(self, mma: str, tile: Any) -> str:
        return f"{self.prefix}_{mma}_{tile.tile_m}x{tile.tile_n}x{tile.tile_k}"

    def example_names(self, mma: str) -> str:
        """Two real kernel names, of `mma` where the family has it, else of its first flavour."""
        if mma not in self.tiles:
            mma = next(iter(self.tiles))
        return ", ".join(self.kernel_name(mma, t) for t in self.tiles[mma][:2])

    def parse_kernel_name(self, name: str, mma: str) -> Any:
        """The tile a kernelName names; ValueError saying what a name looks like otherwise."""
        match = re.fullmatch(gemm_tables.kernel_name_pattern(self.prefix), name.strip(), re.ASCII)
        if not match:
            raise ValueError(
                f"{name!r} is not a {self.prefix} kernel name: expected "
                f"{self.prefix}_<{'|'.join(self.tiles)}>_<tile_m>x<tile_n>x<tile_k>, "
                f"e.g. {self.example_names(mma)}"
            )
        if match["mma"] != mma:
            raise ValueError(
                f"{name!r} names a {match['mma']} kernel, but this arch uses {mma} kernels"
            )
        if mma not in self.tiles:
            raise ValueError(f"{name!r}: {self.prefix} has no {mma} kernels")
        tile_type = type(self.tiles[mma][0])
        tile = tile_type(int(match["m"]), int(match["n"]), int(match["k"]))
        if tile not in self.tiles[mma]:
            supported = ", ".join(f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in self.tiles[mma])
            raise ValueError(
                f"{name!r}: tile not supported by the {mma} kernel; supported: {supported}"
            )
        return tile

    def heuristic_tile(self, m: int, n: int, k: int, cu_num: int, mma: str) -> Any:
        """Tile for an untuned shape.

        tile_m: the smallest supported tile_m >= M (capped at the largest), so small-M decode
        shapes waste no rows. tile_n: the widest supported tile_n that still gives at least one
        block per CU, else the narrowest. tile_k: the largest supported tile_k dividing K.
        """
        tiles = self.tiles[mma]
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
        return type(tiles[0])(tile_m, tile_n, tile_k)

    @staticmethod
    def heuristic_split_k(m: int, n: int, k: int, cu_num: int, tile: Any) -> int:
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
        self, m: int, n: int, k: int, cu_num: int, mma: str, tile: Any | None, split_k: int
    ) -> KernelChoice:
        """The kernel for one call: the row's tile and split-K where given, the heuristic else."""
        if tile is None:
            tile = self.heuristic_tile(m, n, k, cu_num, mma)
        if split_k <= 0:
            split_k = self.heuristic_split_k(m, n, k, cu_num, tile)
        return KernelChoice(self, mma, tile, split_k)

    def equivalent_choices(
        self, choice: KernelChoice, m: int, n: int, k: int, cu_num: int
    ) -> list[KernelChoice]:
        """Kernels that compute what `choice` computes, in the order a fallback tries them:
        `choice`'s tile with split_k 1, then with the other SPLIT_KS, then the heuristic's
        tile and split-K (`choice` itself left out).

        Every kernel of a family takes the same inputs and writes the same output for any tile
        and split_k (the launchers' contracts); the tile and split-K change only how the K sum
        is blocked and in which order its fp32 partial sums are added. So the result is the
        same product, equal to the planned kernel's up to that rounding, as between two rows.
        """
        variants = [KernelChoice(self, choice.mma, choice.tile, s) for s in SPLIT_KS]
        variants.append(self.choose(m, n, k, cu_num, choice.mma, None, 0))
        unique: list[KernelChoice] = []
        for variant in variants:
            if variant != choice and variant not in unique:
                unique.append(variant)
        return unique


A16W16 = KernelFamily(gemm_tables.A16W16_KERNELS, A16W16_TILES)
BPRESHUFFLE = KernelFamily(gemm_tables.BPRESHUFFLE_KERNELS, BPRESHUFFLE_TILES)
BLOCKSCALE = KernelFamily(gemm_tables.BLOCKSCALE_KERNELS, BLOCKSCALE_TILES)
