"""Kernel-name grammars of the fp8/int8 GEMM families; tiles come from their FlyDSL kernels.

flydsl_a8w8_bpreshuffle_<mma>_<m>x<n>x<k> and flydsl_a8w8_blockscale_<mma>_<m>x<n>x<k>.
"""

from __future__ import annotations

from aiter.ops.flydsl.gemm_a8w8 import BLOCKSCALE_TILES, BPRESHUFFLE_TILES
from aiter.ops.gemm_config import KernelFamily

BPRESHUFFLE = KernelFamily("flydsl_a8w8_bpreshuffle", BPRESHUFFLE_TILES)
BLOCKSCALE = KernelFamily("flydsl_a8w8_blockscale", BLOCKSCALE_TILES)
