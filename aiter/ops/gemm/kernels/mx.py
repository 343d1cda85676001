"""FlyDSL launchers of the microscaled (OCP MX) GEMMs on gfx950: C[M, N] = A[M, K] @ B[N, K]^T
with MXFP4 (E2M1, two per byte) or MXFP8 (E4M3) elements, each 32 elements along K sharing one
E8M0 scale, (+ bias[N]), split-K in one launch.

The kernel is the 8-bit GEMM kernel of a8w8.py in its MX mode: A staged through LDS, the
preshuffled B streamed into registers, and gfx950's v_mfma_scale_f32_16x16x128_f8f6f4 taking
each lane's 32-element block with its scale byte (mainloop.mma_mx). The scales are shuffled
(shuffle_mx_scale) so that a lane's scales of one k-tile are one 1-, 2- or 4-byte load.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch

from aiter.ops.gemm.kernels.a8w8 import (
    MAX_A_STAGE_BYTES,
    MX_ELEMENTS_PER_BYTE,
    check_split_buffers,
    launch_kernel,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.gemm_blocks import check_mma, check_tile_and_split_k, to_stream
from aiter.ops.shared.gemm_index_8bit import SHUFFLE_K, SHUFFLE_N
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.tiles import GemmTile, tile_grid

MXTile = GemmTile  # tile_k counts K elements (fp4: two per byte)
MX_FORMATS = ("fp4", "fp8")
# K elements one 16x16x128 scaled MFMA takes; a k-tile holds 1, 2 or 4 of them (its scales are
# one load of that many bytes).
CALL_K = 128
MAX_CALLS_PER_K_TILE = 4
# The shuffled weight: 16 rows by 16 bytes, as the other 8-bit kernels read it.
MX_WEIGHT_LAYOUT = (SHUFFLE_N, SHUFFLE_K)
MX_N_MULTIPLE = SHUFFLE_N
# K granularity of the entries: the MX block, and whole 16-byte rows of the shuffled weight.
MX_K_MULTIPLE = {"fp4": 32, "fp8": 32}
OUTPUT_DTYPES = (torch.bfloat16, torch.float16)
SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu)


def k_tile_bytes(tile: MXTile, fmt: str) -> int:
    return tile.tile_k // MX_ELEMENTS_PER_BYTE[fmt]


def mx_tile_problem(tile: MXTile, fmt: str, mma: str = "mfma") -> str | None:
    """Why a tile does not fit the kernel (whole scaled-MFMA calls per k-tile, at most four),
    its LDS or its registers, or None."""
    calls, rest = divmod(tile.tile_k, CALL_K)
    if rest or calls not in (1, 2, MAX_CALLS_PER_K_TILE):
        return f"has tile_k {tile.tile_k}: a k-tile is 1, 2 or 4 scaled MFMA calls of {CALL_K}"
    stage = mx.a_stage_bytes(tile.tile_m, k_tile_bytes(tile, fmt), 1)
    if stage > MAX_A_STAGE_BYTES:
        return (
            f"stages {stage} bytes of A per k-tile: over {MAX_A_STAGE_BYTES}, the kernel runs out "
            "of SGPRs"
        )
    reps_m, reps_n = mx.mma_repeats(tile.tile_m, tile.tile_n)
    return mx.budget_problem(tile.tile_m, tile.tile_n, k_tile_bytes(tile, fmt), 1, 4, mma,
                             extra_vgprs=reps_m + reps_n)  # fmt: skip


CANDIDATES = tile_grid((16, 32, 64, 128, 256), (64, 128, 256), (128, 256, 512))
# Only gfx950 has the scaled MFMA; the tiles are keyed by its MMA flavour like every GEMM's.
MX_TILES: dict[str, dict[str, tuple[MXTile, ...]]] = {
    fmt: {"mfma": tuple(t for t in CANDIDATES if mx_tile_problem(t, fmt) is None)}
    for fmt in MX_FORMATS
}
MX_ARCHS = ("gfx950",)


def arch_problem(arch: str) -> str | None:
    """Why the MX GEMMs have no kernel for `arch`, or None."""
    if arch in MX_ARCHS:
        return None
    if arch == "gfx942":
        return "gfx942 has no MX instructions (the scaled MFMA is gfx950's)"
    return f"no MX GEMM kernel for {arch} yet (only {', '.join(MX_ARCHS)})"


def shuffle_mx_scale(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 scales [rows, K / 32] (uint8 or float8_e8m0fnu) in the layout the MX kernels read:
    [rows, ceil(K / 512), 16] of the same dtype. Group g of a row holds blocks 16 g .. 16 g + 15,
    block 16 g + 4 c + q at byte 4 q + c (lane group q of MMA call c reads it); the padding
    past K / 32 holds 127 (a scale of 1.0; the elements there are zero)."""
    if not isinstance(scale, torch.Tensor) or scale.dtype not in SCALE_DTYPES:
        raise TypeError(f"scale: expected a uint8 or float8_e8m0fnu tensor, got {_what(scale)}")
    if scale.dim() != 2:
        raise ValueError(f"scale: expected a 2-D [rows, K / 32] tensor, got {list(scale.shape)}")
    rows, blocks = (int(d) for d in scale.shape)
    groups = -(-blocks // mx.MX_GROUP_BYTES)
    raw = scale.view(torch.uint8)
    padded = torch.full((rows, groups * mx.MX_GROUP_BYTES), 127, dtype=torch.uint8,
                        device=scale.device)  # fmt: skip
    padded[:, :blocks] = raw
    calls = padded.view(rows, groups, mx.MX_BLOCKS_PER_CALL, mx.MX_BLOCKS_PER_CALL)
    shuffled = calls.transpose(2, 3).contiguous()  # [.., call c, lane group q] -> [.., q, c]
    return shuffled.view(rows, groups, mx.MX_GROUP_BYTES).view(scale.dtype)


def unshuffle_mx_scale(shuffled: torch.Tensor, blocks: int) -> torch.Tensor:
    """Inverse of shuffle_mx_scale: the [rows, blocks] scales."""
    rows, groups, _ = shuffled.shape
    raw = shuffled.view(torch.uint8).view(rows, groups, mx.MX_BLOCKS_PER_CALL, -1)
    plain = raw.transpose(2, 3).reshape(rows, groups * mx.MX_GROUP_BYTES)[:, :blocks]
    return plain.contiguous().view(shuffled.dtype)


def mx_scale_shape(rows: int, k: int) -> tuple[int, int, int]:
    """Shape of the shuffled scales of `rows` rows of K elements."""
    return rows, mx.mx_scale_groups(k), mx.MX_GROUP_BYTES


def _what(t: object) -> str:
    return f"{t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__


# --- the jit functions -----------------------------------------------------------------------


@flyc.jit
def gemm_a4w4(
    a: fx.Tensor,
    b: fx.Tensor,
    a_scale: fx.Tensor,
    b_scale: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    workspace: fx.Tensor,
    semaphore: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k_bytes: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k_bytes: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    has_bias: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    launch_kernel(a, b, a_scale, b_scale, bias, out, workspace, semaphore, m, n, k_bytes,
                  tile_m, tile_n, tile_k_bytes, split_k, False, True, False, "fp4", has_bias,
                  mma, stream)  # fmt: skip


@flyc.jit
def gemm_mxfp8(
    a: fx.Tensor,
    b: fx.Tensor,
    a_scale: fx.Tensor,
    b_scale: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    workspace: fx.Tensor,
    semaphore: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k_bytes: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k_bytes: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    has_bias: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    launch_kernel(a, b, a_scale, b_scale, bias, out, workspace, semaphore, m, n, k_bytes,
                  tile_m, tile_n, tile_k_bytes, split_k, False, True, False, "fp8", has_bias,
                  mma, stream)  # fmt: skip


_JIT = {"fp4": gemm_a4w4, "fp8": gemm_mxfp8}
ELEMENT_DTYPES = {"fp4": (torch.uint8, torch.float4_e2m1fn_x2), "fp8": (torch.float8_e4m3fn,)}


# --- host launcher ---------------------------------------------------------------------------


def launch_gemm_mx(
    fmt: str,
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    workspace: torch.Tensor | None,
    semaphore: torch.Tensor | None,
    *,
    tile: MXTile,
    split_k: int,
    mma: str,
    stream: Any | None = None,
) -> None:
    """Launch out = dequant(A) @ dequant(B)^T (+ bias) cast to out.dtype, in one kernel.

    Contract (gfx950):

    - fmt "fp4": a [M, K / 2] and b [N, K / 2] packed E2M1 (uint8 or float4_e2m1fn_x2, the
      element of even K in the low nibble); fmt "fp8": a [M, K] and b [N, K] float8_e4m3fn.
      b preshuffled by shuffle_weight(b, MX_WEIGHT_LAYOUT) on its bytes; N % 16 == 0; K % 32
      == 0 (a k-tile past K loads zeros: any K the format allows).
    - a_scale [M, ceil(K / 512), 16] and b_scale [N, ceil(K / 512), 16]: E8M0 (uint8 or
      float8_e8m0fnu) scales of the 32-element blocks, shuffled by shuffle_mx_scale.
    - bias None or [N] of out's dtype; out [M, N] bfloat16 or float16. fp32 accumulation; the
      bias is added to the fp32 sum before the cast.
    - split_k as for the a8w8 launchers: split s owns k-tiles [s * T // split_k, (s + 1) * T //
      split_k) of the T = ceil(K / tile_k) k-tiles; workspace float32 [split_k, M, N] and a
      zeroed semaphore of semaphore_size(M, N, tile) entries; partials are unscaled sums.
    - mma: "mfma" (v_mfma_scale_f32_16x16x128_f8f6f4).
    """
    if fmt not in MX_FORMATS:
        raise ValueError(f"fmt: expected one of {MX_FORMATS}, got {fmt!r}")
    check_mma(mma, ("mfma",))
    check_tile_and_split_k(MX_TILES[fmt], tile, split_k, mma)
    per_byte = MX_ELEMENTS_PER_BYTE[fmt]
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2 or t.dtype not in ELEMENT_DTYPES[fmt] or not t.is_contiguous():
            raise ValueError(
                f"{name}: expected a contiguous 2-D tensor of {ELEMENT_DTYPES[fmt]}, got "
                f"{t.dtype} {list(t.shape)}"
            )
    m, k_bytes = (int(d) for d in a.shape)
    n = int(b.shape[0])
    k = k_bytes * per_byte
    if int(b.shape[1]) != k_bytes:
        raise ValueError(f"b: expected shape [N, {k_bytes}] (a's K), got {list(b.shape)}")
    if m < 1 or n < 1 or k < 1 or k % MX_K_MULTIPLE[fmt] or n % MX_N_MULTIPLE:
        raise ValueError(
            f"a, b: need M, N, K >= 1, K % {MX_K_MULTIPLE[fmt]} == 0, N % {MX_N_MULTIPLE} == 0; "
            f"got M={m}, N={n}, K={k}"
        )
    if max(tile.tile_m, tile.tile_n) * k_bytes >= mx.OFFSET_LIMIT:
        raise ValueError(f"a: K = {k} is too large for the kernel's 32-bit buffer offsets")
    for name, scale, rows in (("a_scale", a_scale, m), ("b_scale", b_scale, n)):
        shape = mx_scale_shape(rows, k)
        if scale.dtype not in SCALE_DTYPES or tuple(scale.shape) != shape:
            raise ValueError(
                f"{name}: expected shuffled E8M0 scales {list(shape)} of {SCALE_DTYPES}, got "
                f"{scale.dtype} {list(scale.shape)}"
            )
        if not scale.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
    if out.dtype not in OUTPUT_DTYPES or tuple(out.shape) != (m, n) or not out.is_contiguous():
        raise ValueError(
            f"out: expected a contiguous [{m}, {n}] tensor of {OUTPUT_DTYPES}, got {out.dtype} "
            f"{list(out.shape)}"
        )
    if bias is not None and (
        bias.dtype != out.dtype or tuple(bias.shape) != (n,) or not bias.is_contiguous()
    ):
        raise ValueError(f"bias: expected a contiguous [{n}] tensor of {out.dtype}")
    check_split_buffers(split_k, workspace, semaphore, m, n, tile)
    # The kernel reads bytes; a tensor the kernel never touches stands in for an absent one.
    a, b, a_scale, b_scale = (t.view(torch.uint8) for t in (a, b, a_scale, b_scale))
    ws_arg = workspace if split_k > 1 else a_scale
    sem_arg = semaphore if split_k > 1 else a_scale
    bias_arg = bias if bias is not None else a_scale
    args = kernel_tensors(a, b, a_scale, b_scale, bias_arg, out, ws_arg, sem_arg)
    _JIT[fmt](
        *args, m, n, k_bytes,
        tile_m=tile.tile_m, tile_n=tile.tile_n, tile_k_bytes=k_tile_bytes(tile, fmt),
        split_k=split_k, has_bias=bias is not None, mma=mma, stream=to_stream(stream),
    )  # fmt: skip
