"""Which FlyDSL kernel serves a bf16/fp16 GEMM: the kernel-name grammar and the heuristic.

A tuned row names a tile (kernelName) and a split-K; splitK 0 and untuned shapes use the heuristic
of aiter.ops.gemm_config.
"""

from __future__ import annotations

from aiter.ops.flydsl.gemm_a16w16 import SUPPORTED_TILES, GemmTile
from aiter.ops.gemm_config import KernelChoice, KernelFamily

FAMILY = KernelFamily("flydsl_a16w16", SUPPORTED_TILES)
NAME_PREFIX = FAMILY.prefix

__all__ = ["FAMILY", "KernelChoice", "choose", "heuristic_split_k", "heuristic_tile"]


def kernel_name(mma: str, tile: GemmTile) -> str:
    return FAMILY.kernel_name(mma, tile)


def parse_kernel_name(name: str, mma: str) -> GemmTile:
    return FAMILY.parse_kernel_name(name, mma)


def heuristic_tile(m: int, n: int, k: int, cu_num: int, mma: str) -> GemmTile:
    return FAMILY.heuristic_tile(m, n, k, cu_num, mma)


def heuristic_split_k(m: int, n: int, k: int, cu_num: int, tile: GemmTile) -> int:
    return FAMILY.heuristic_split_k(m, n, k, cu_num, tile)


def choose(
    m: int, n: int, k: int, cu_num: int, mma: str, tile: GemmTile | None, split_k: int
) -> KernelChoice:
    return FAMILY.choose(m, n, k, cu_num, mma, tile, split_k)
