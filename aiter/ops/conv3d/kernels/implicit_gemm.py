"""FlyDSL kernels and launchers of conv3d as an implicit GEMM (bf16/fp16, fp32 accumulation):
MFMA for gfx942/gfx950, WMMA for gfx1250, a split-K epilogue, and an NCDHW -> padded NDHWC
pre-transpose. Also the geometry, the weight packing and the torch fallbacks the host uses.

The GEMM of group g: out[m, g * Kg + kc] = sum_r A[m, r] * B[g * Kg + kc, r] (+ bias), where
row m of A is output position (n, od, oh, ow), A[m, r] the input element that tap
r // Cgp of output position m reads in channel r % Cgp of group g (zero in the padding and for
the padded channels), and B the packed weight (pack_conv3d_weight). The main loop is the shared
one (aiter/ops/shared/mainloop.py); implicit_gemm_index.py holds every conv formula.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.conv3d.kernels.implicit_gemm_index import (
    CHANNEL_VECTOR,
    ELEMENTWISE_BLOCK,
    K_STEP,
    MMA_MN,
    SMALL_TILE_K,
    TILE_K,
    WAVE_SIZE,
    WAVES_PER_BLOCK,
    a_chunk_element,
    a_row_info,
    a_wave_lds_byte,
    block_input_base,
    conv_grid,
    conv_lds_bytes,
    elementwise_grid,
    elementwise_index,
    group_and_split,
    group_channel,
    has_k_tail_taps,
    input_span_frames,
    out_channel,
    out_col_offset,
    out_element,
    out_offset,
    out_row_offset,
    out_size,
    padded_channels,
    pretranspose_element,
    reduction_size,
    split_blocks,
    stage_bytes,
    stage_read_coord,
    stage_read_passes,
    stage_write_byte,
    staging_offset,
    swizzle_period,
    tile_counts,
    tile_k_of,
    tile_of_block,
    tile_origin,
    wave_origin,
    wave_repeats,
    wave_tile,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared import mainloop
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.gemm_blocks import check_mma, load_run, to_stream
from aiter.ops.shared.kernel_tensors import kernel_tensor, kernel_tensors
from aiter.ops.shared.launch_args import check_choice, check_int, check_rank, check_tensor
from aiter.ops.shared.mainloop import element_bytes

__all__ = [
    "CHANNEL_VECTOR",
    "INPUT_DTYPES",
    "K_STEP",
    "LAYOUTS",
    "MMA_FLAVOURS",
    "SUPPORTED_TILES",
    "WAVE_LAYOUTS",
    "WGM_CHOICES",
    "WORKSPACE_DTYPE",
    "Conv3dGeometry",
    "ConvTile",
    "conv3d_geometry",
    "conv3d_workspace_shape",
    "launch_conv3d",
    "launch_conv3d_pretranspose",
    "ndhwc_input_ready",
    "pack_conv3d_weight",
    "padded_channels",
    "pretranspose_supported",
    "to_padded_ndhwc_torch",
]

INPUT_DTYPES = (torch.bfloat16, torch.float16)
WORKSPACE_DTYPE = torch.float32
LAYOUTS = ("NCDHW", "NDHWC")
# Every index the kernels compute in 32 bits stays below this (offsets into tensors are 64-bit).
INDEX_LIMIT = 2**31


# --- geometry --------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _triple(name: str, value: Any, low: int) -> tuple[int, int, int]:
    """An int or a 3-sequence of ints, each >= low, as a (d, h, w) tuple."""
    items = (value,) * 3 if _is_int(value) else value
    if (
        not isinstance(items, (tuple, list))
        or len(items) != 3
        or not all(_is_int(v) and v >= low for v in items)
    ):
        raise ValueError(f"{name}: expected an int or a 3-tuple of ints >= {low}, got {value!r}")
    return tuple(items)


@dataclass(frozen=True)
class Conv3dGeometry:
    """One conv3d: input [N, C, D, H, W] (in either layout), weight [K, C / groups, kT, kH, kW],
    zeros padding, per-axis (d, h, w) stride, padding and dilation, and groups.

    Construction validates (ValueError naming the field); derived sizes are properties.
    """

    n: int
    c: int
    d: int
    h: int
    w: int
    k: int
    kt: int
    kh: int
    kw: int
    stride: tuple[int, int, int] = (1, 1, 1)
    padding: tuple[int, int, int] = (0, 0, 0)
    dilation: tuple[int, int, int] = (1, 1, 1)
    groups: int = 1

    def __post_init__(self) -> None:
        for name in ("n", "c", "d", "h", "w", "k", "kt", "kh", "kw", "groups"):
            check_int(name, getattr(self, name), 1)
        object.__setattr__(self, "stride", _triple("stride", self.stride, 1))
        object.__setattr__(self, "padding", _triple("padding", self.padding, 0))
        object.__setattr__(self, "dilation", _triple("dilation", self.dilation, 1))
        if self.c % self.groups:
            raise ValueError(f"groups: C = {self.c} is not divisible by groups = {self.groups}")
        if self.k % self.groups:
            raise ValueError(f"groups: K = {self.k} is not divisible by groups = {self.groups}")
        sizes = (self.d, self.h, self.w)
        for i, axis in enumerate("DHW"):
            if self.out_spatial[i] < 1:
                raise ValueError(
                    f"x: input too small for kernel/dilation along {axis}: {sizes[i]} + 2 * "
                    f"{self.padding[i]} padding < {self.dilation[i]} * "
                    f"({self.kernel_size[i]} - 1) + 1"
                )

    @property
    def kernel_size(self) -> tuple[int, int, int]:
        return self.kt, self.kh, self.kw

    @property
    def out_d(self) -> int:
        return out_size(self.d, self.kt, self.stride[0], self.padding[0], self.dilation[0])

    @property
    def out_h(self) -> int:
        return out_size(self.h, self.kh, self.stride[1], self.padding[1], self.dilation[1])

    @property
    def out_w(self) -> int:
        return out_size(self.w, self.kw, self.stride[2], self.padding[2], self.dilation[2])

    @property
    def out_spatial(self) -> tuple[int, int, int]:
        return self.out_d, self.out_h, self.out_w

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.c // self.groups

    @property
    def kg(self) -> int:
        """Output channels per group: the GEMM's N."""
        return self.k // self.groups

    @property
    def cgp(self) -> int:
        """Input channels per group padded to a multiple of CHANNEL_VECTOR."""
        return padded_channels(self.cg)

    @property
    def taps(self) -> int:
        return self.kt * self.kh * self.kw

    @property
    def reduction(self) -> int:
        """The GEMM's reduction length kT * kH * kW * Cgp."""
        return reduction_size(self.cgp, self.kt, self.kh, self.kw)

    @property
    def positions(self) -> int:
        """Output positions N * D' * H' * W': the GEMM's M."""
        return self.n * self.out_d * self.out_h * self.out_w

    @property
    def padded_c(self) -> int:
        """Channels of the padded NDHWC input: groups * Cgp."""
        return self.groups * self.cgp

    def x_padded_shape(self) -> tuple[int, int, int, int, int]:
        """[N, D, H, W, groups * Cgp]: the conv kernel's input."""
        return self.n, self.d, self.h, self.w, self.padded_c

    def packed_weight_shape(self) -> tuple[int, int]:
        """[K, kT * kH * kW * Cgp]: pack_conv3d_weight's result."""
        return self.k, self.reduction

    def out_shape(self, layout: str) -> tuple[int, int, int, int, int]:
        """[N, K, D', H', W'] for "NCDHW", [N, D', H', W', K] for "NDHWC"."""
        check_choice("output_layout", layout, LAYOUTS)
        if layout == "NCDHW":
            return self.n, self.k, self.out_d, self.out_h, self.out_w
        return self.n, self.out_d, self.out_h, self.out_w, self.k


def conv3d_geometry(
    x_shape: Any,
    weight_shape: Any,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    input_layout: str = "NCDHW",
) -> Conv3dGeometry:
    """The Conv3dGeometry of torch.nn.functional.conv3d(x, weight, stride=stride,
    padding=padding, dilation=dilation, groups=groups) (zeros padding; stride, padding and
    dilation an int or a (d, h, w) triple), x of `x_shape` in `input_layout` ("NCDHW" or
    "NDHWC") and weight of `weight_shape` = [K, C / groups, kT, kH, kW].

    Raises ValueError naming the argument: a shape that is not 5-D, a weight whose dim 1 is not
    C / groups, C or K not divisible by groups, stride/dilation < 1, padding < 0, or an input
    too small for the kernel and dilation.
    """
    check_choice("input_layout", input_layout, LAYOUTS)
    x_dims = _dims("x", x_shape)
    w_dims = _dims("weight", weight_shape)
    if input_layout == "NCDHW":
        n, c, d, h, w = x_dims
    else:
        n, d, h, w, c = x_dims
    check_int("groups", groups, 1)
    k, wc, kt, kh, kw = w_dims
    if c % groups == 0 and wc != c // groups:
        raise ValueError(
            f"weight: expected shape [K, C / groups = {c // groups}, kT, kH, kW], got {list(w_dims)}"
        )
    return Conv3dGeometry(n, c, d, h, w, k, kt, kh, kw, stride, padding, dilation, groups)


def _dims(name: str, shape: Any) -> tuple[int, ...]:
    dims = tuple(int(v) for v in shape)
    if len(dims) != 5:
        raise ValueError(f"{name}: expected a 5-D shape, got {list(dims)}")
    return dims


# --- tiles -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvTile:
    """Work-group tile of the conv kernel: tile_m output positions x tile_n output channels of
    one group, computed by four waves laid out wave_m x wave_n (each wave a multiple of 16x16),
    and wgm, the M tiles consecutive work-groups walk before moving to the next N tile. The
    reduction goes tile_k_of(...) deep per main-loop k-tile: TILE_K (64) when a wave holds 8 to
    15 MMA tiles, else SMALL_TILE_K (32)."""

    tile_m: int
    tile_n: int
    wave_m: int
    wave_n: int
    wgm: int


WAVE_LAYOUTS = ((1, 4), (2, 2), (4, 1))
WGM_CHOICES = (1, 2, 4, 8)


def tile_problem(tile: ConvTile, mma: str) -> str | None:
    """Why a tile does not fit the arch's LDS or registers, or None.

    Registers: a wave of a wave_m x wave_n layout holds what a wave of the shared loop's 1 x 4
    layout holds for a tile of its rows x 4 * its columns (mx.budget_problem of that tile; the
    A copy of the block's tile_m rows added). LDS: the A stage and the widest (fp32) staging.
    """
    shape = (tile.tile_m, tile.tile_n, tile.wave_m, tile.wave_n)
    rows, cols = wave_tile(*shape)
    tile_k = tile_k_of(*shape)
    problem = mx.budget_problem(rows, mx.WAVES_PER_BLOCK * cols, tile_k, 2, 4, mma)
    if problem is not None:
        return problem
    extra = mx.a_copy_passes(tile.tile_m, tile_k, 2, mma) - mx.a_copy_passes(rows, tile_k, 2, mma)
    vgprs = mx.estimated_vgprs(rows, mx.WAVES_PER_BLOCK * cols, tile_k, 2, mma) + extra * 5
    budget = int(mx.LANE_REGISTERS[mma] * mx.REGISTER_BUDGET)
    if vgprs > budget:
        return f"needs about {vgprs} VGPRs per lane (estimate), over the budget of {budget}"
    lds = max(conv_lds_bytes(*shape, ob, col, mma) for ob, col in ((4, False), (2, True)))
    for arch in mx.MMA_ARCHS[mma]:
        if lds > mx.LDS_BYTES[arch]:
            return f"needs {lds} bytes of LDS per block, {arch} has {mx.LDS_BYTES[arch]}"
    return None


def _tile_grid(mma: str) -> tuple[ConvTile, ...]:
    tiles = []
    for tile_m in (32, 64, 128):
        for tile_n in (32, 64, 128):
            for wave_m, wave_n in WAVE_LAYOUTS:
                if tile_m % (wave_m * MMA_MN) or tile_n % (wave_n * MMA_MN):
                    continue
                for g in WGM_CHOICES:
                    tile = ConvTile(tile_m, tile_n, wave_m, wave_n, g)
                    if tile_problem(tile, mma) is None:
                        tiles.append(tile)
    return tuple(tiles)


# The wave row offsets (multiples of 16) must keep the A stage's swizzle (a_wave_lds_byte).
assert MMA_MN % swizzle_period(TILE_K, 2) == 0 and MMA_MN % swizzle_period(SMALL_TILE_K, 2) == 0
SUPPORTED_TILES: dict[str, tuple[ConvTile, ...]] = {m: _tile_grid(m) for m in ("mfma", "wmma")}
MMA_FLAVOURS = tuple(SUPPORTED_TILES)


def conv3d_workspace_shape(geometry: Conv3dGeometry, split_k: int) -> tuple[int, int, int]:
    """The fp32 split-K staging buffer [split_k, M, K] (M = positions, K output channels)."""
    return split_k, geometry.positions, geometry.k


# --- weights and inputs (torch) ------------------------------------------------------------


def _copy_into_channels(dst_shape: tuple[int, ...], src: torch.Tensor, cg: int) -> torch.Tensor:
    """A new contiguous zero tensor of dst_shape whose last dim's first cg entries are src.

    Built from new_zeros, aten.slice and aten.copy_ so FakeTensors on "cuda" work too (no
    `.contiguous()` on a non-contiguous fake, no Python slicing).
    """
    dst = src.new_zeros(dst_shape)
    torch.ops.aten.copy_.default(torch.ops.aten.slice.Tensor(dst, -1, 0, cg), src)
    return dst


def pack_conv3d_weight(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """The conv kernel's B operand: [K, kT * kH * kW * Cgp], row-major, contiguous, weight's
    dtype and device, from weight [K, C / groups, kT, kH, kW] (any strides).

    Row k holds output channel k's taps in (t, h, w) order, each tap's Cgp channels fastest:
    packed[k, ((t * kH + h) * kW + w) * Cgp + c] = weight[k, c, t, h, w] for c < C / groups,
    0 for the padding channels. Pure torch; works on FakeTensors (the AOT dry run).
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 5:
        raise ValueError("weight: expected a 5-D [K, C / groups, kT, kH, kW] tensor")
    check_int("groups", groups, 1)
    k, cg, kt, kh, kw = (int(v) for v in weight.shape)
    if k % groups:
        raise ValueError(f"groups: K = {k} is not divisible by groups = {groups}")
    cgp = padded_channels(cg)
    taps_last = weight.permute(0, 2, 3, 4, 1)  # [K, kT, kH, kW, C / groups]
    return _copy_into_channels((k, kt, kh, kw, cgp), taps_last, cg).view(k, kt * kh * kw * cgp)


def to_padded_ndhwc_torch(x: torch.Tensor, groups: int, input_layout: str) -> torch.Tensor:
    """The conv kernel's input computed with torch: a new contiguous [N, D, H, W, groups * Cgp]
    tensor of x's dtype and device whose group g holds channels g * C/groups ... of x in its
    first C / groups channels and zeros in the rest.

    x is [N, C, D, H, W] ("NCDHW") or [N, D, H, W, C] ("NDHWC"), any strides. The host's path
    when the pre-transpose kernel is not supported, or when an NDHWC input is not usable as is
    (ndhwc_input_ready). Works on FakeTensors.
    """
    check_choice("input_layout", input_layout, LAYOUTS)
    if not isinstance(x, torch.Tensor) or x.dim() != 5:
        raise ValueError(f"x: expected a 5-D {input_layout} tensor")
    channels_last = x.permute(0, 2, 3, 4, 1) if input_layout == "NCDHW" else x
    n, d, h, w, c = (int(v) for v in channels_last.shape)
    if not _is_int(groups) or groups < 1 or c % groups:
        raise ValueError(f"groups: C = {c} is not divisible by groups = {groups!r}")
    cg = c // groups
    cgp = padded_channels(cg)
    grouped = channels_last.unflatten(4, (groups, cg))
    return _copy_into_channels((n, d, h, w, groups, cgp), grouped, cg).view(
        n, d, h, w, groups * cgp
    )


def ndhwc_input_ready(x: torch.Tensor, groups: int) -> bool:
    """Whether an NDHWC input [N, D, H, W, C] is already the conv kernel's input: contiguous,
    C divisible by groups and C / groups a multiple of CHANNEL_VECTOR (so Cgp = C / groups)."""
    if x.dim() != 5 or not _is_int(groups) or groups < 1:
        return False
    c = int(x.shape[4])
    return c % groups == 0 and (c // groups) % CHANNEL_VECTOR == 0 and x.is_contiguous()


def pretranspose_supported(x_shape: Any, groups: int) -> bool:
    """Whether launch_conv3d_pretranspose takes an NCDHW input of x_shape = [N, C, D, H, W].

    The kernel computes element indices in 32 bits: x's element count and the padded
    output's element count plus one work-group (ELEMENTWISE_BLOCK) must stay below 2**31.
    C must be divisible by groups. Otherwise the host uses to_padded_ndhwc_torch.
    """
    dims = tuple(int(v) for v in x_shape)
    if len(dims) != 5 or not _is_int(groups) or groups < 1 or min(dims) < 1:
        return False
    n, c, d, h, w = dims
    if c % groups:
        return False
    spatial = d * h * w
    padded = n * spatial * groups * padded_channels(c // groups)
    return n * c * spatial < INDEX_LIMIT and padded + ELEMENTWISE_BLOCK <= INDEX_LIMIT


# --- kernels ---------------------------------------------------------------------------------

# The conv kernel runs the shared main loop (aiter/ops/shared/mainloop.py): per k-tile of TILE_K
# reduction indices, A's tile_m rows (the im2col of the padded NDHWC input, gathered through the
# Pipeline's a_rows / a_chunk hooks) go through one swizzled LDS stage the four waves share,
# every wave streams its B rows (packed-weight rows) into registers, and the next k-tile's
# buffer loads are issued before the current k-tile's MMAs. A padding tap, a row past M, a column
# past the group's Kg and a k-block past the split's end load zeros through the buffer range
# check. The waves are laid out wave_m x wave_n over the tile (the shared loop's own layout is
# 1 x 4): each wave reads its rows of the A stage from its own offset and streams the B rows of
# its columns. Helpers hold no dynamic `if` or runtime loop: FlyDSL rewrites those only in
# kernel bodies.


def _select(cond, a, b):
    return cond.select(a, b)


class _ConvBlock:
    """Where a work-group's tile lies: its conv group and K split, the tile's first GEMM row
    and column (of the group), and the wave's place in the wave_m x wave_n layout."""

    def __init__(self, mma, tile_m, tile_n, wave_m, wave_n, wgm, split_k, positions, kg):
        self.group, self.split = group_and_split(fx.block_idx.y, split_k)
        m_tiles, n_tiles = tile_counts(positions, kg, tile_m, tile_n)
        tm, tn = tile_of_block(fx.block_idx.x, m_tiles, n_tiles, wgm, _select)
        self.origin_m, self.origin_n = tile_origin(tm, tn, tile_m, tile_n)
        wave = fx.thread_idx.x // WAVE_SIZE[mma]
        self.wave_row0, self.wave_col0 = wave_origin(wave, tile_m, tile_n, wave_m, wave_n)
        self.wave_cols = tile_n // wave_n


def _uniform_buffer(ptr, first_row, rows_left, row_elems, elem_bytes: int):
    """A buffer pointer at row `first_row` holding the `rows_left` rows of `row_elems` elements
    left there, its byte count capped below the out-of-range offset in 32-bit scalar arithmetic
    and marked uniform (a descriptor in VGPRs costs a waterfall loop around every load)."""
    base = ptr + fx.Int64(first_row) * fx.Int64(row_elems)
    row_bytes = row_elems * elem_bytes
    cap = mx.OFFSET_LIMIT // row_bytes
    rows = (rows_left < cap).select(rows_left, cap)
    rows = (rows > 0).select(rows, fx.Int32(0))
    nbytes = fx.Int32(rocdl.readfirstlane(fx.Int32.ir_type, fx.Int32(rows * row_bytes)))
    return rocdl.make_buffer_ptr(base, fx.Int64(nbytes))


def _a_row(ctx, r):
    """Pipeline hook a_rows: what a thread keeps of block row r (once, before the loop)."""
    origin_m, base, group_base, out_dhw, in_dhw, c_total, stride, padding, positions = ctx
    return a_row_info(origin_m + r, base, group_base, out_dhw, in_dhw, c_total, stride, padding,
                      positions)  # fmt: skip


def _a_chunk(ctx, info, kk):
    """Pipeline hook a_chunk: the element and validity of reduction index kk of a row."""
    cgp, in_dhw, c_total, kernel, dilation, padding = ctx
    return a_chunk_element(info, kk, cgp, in_dhw, c_total, kernel, dilation, padding)


def _wave_layout(p, blk: _ConvBlock, tile_m: int, tile_n: int, wave_m: int, wave_n: int):
    """Lay the Pipeline's waves out wave_m x wave_n: its MMA repeats and B rows become the
    wave's; returns the view the MMAs read A through (the A stage from the wave's first row)."""
    p.reps_m, p.reps_n = wave_repeats(tile_m, tile_n, wave_m, wave_n)
    p.b_row0 = blk.wave_col0
    p.origin_m, p.origin_n = blk.origin_m, blk.origin_n
    view = copy.copy(p)
    view.lds_a = p.lds_a + a_wave_lds_byte(blk.wave_row0, p.tile_k, p.elem_bytes) // p.elem_bytes
    return view


def _stage_tiles(p, blk: _ConvBlock, tiles, stage, out_dtype, by_column: bool):
    """Write the wave's accumulators of one A repeat (tiles[j]: B repeat j, fp32) into its
    staging area, cast to out_dtype: element by element along rows, or by column one vector of
    the lane's consecutive rows."""
    out_bytes = element_bytes(out_dtype)
    for j in range_constexpr(p.reps_n):
        vals = tiles[j].to(out_dtype)
        if const_expr(by_column):
            byte = stage_write_byte(p.wave, j, p.lane, 0, blk.wave_cols, out_bytes, True, p.mma)
            fx.ptr_store(vals, stage + byte // out_bytes)
        else:
            for e in range_constexpr(mx.acc_rows_per_lane(p.mma)):
                byte = stage_write_byte(p.wave, j, p.lane, e, blk.wave_cols, out_bytes, False,
                                        p.mma)  # fmt: skip
                fx.ptr_store(vals[e], stage + byte // out_bytes)


def _staged_run(p, blk: _ConvBlock, stage, out_dtype, store_pass: int, by_column: bool):
    """(values, row in the 16, column of the wave, real) of the 16-byte run a lane reads back."""
    out_bytes = element_bytes(out_dtype)
    row, col, real, byte = stage_read_coord(store_pass, p.lane, blk.wave_cols, out_bytes,
                                            by_column, p.mma)  # fmt: skip
    byte = p.wave * stage_bytes(blk.wave_cols, out_bytes, by_column) + byte
    vec = fx.Vector.make_type(mx.CHUNK_BYTES // out_bytes, out_dtype)
    return fx.ptr_load(stage + byte // out_bytes, result_type=vec), row, col, real


def _lane_bias(p, blk: _ConvBlock, bias, kg):
    """The lane's bias per B repeat in fp32 (zero for a column past the group's Kg)."""
    cols_left = kg - blk.origin_n
    first = out_channel(blk.group, kg, blk.origin_n)
    buf = _uniform_buffer(fx.get_iter(bias), first, cols_left, 1, element_bytes(bias.dtype))
    values = []
    for j in range_constexpr(p.reps_n):
        col = blk.wave_col0 + j * MMA_MN + mx.acc_col(p.lane)
        values.append(mainloop.load_scalar(buf, col < cols_left, col, bias.dtype).to(fx.Float32))
    return values


@flyc.kernel
def conv3d_implicit_kernel(
    x: fx.Tensor,
    weight: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    n: fx.Int32,
    groups: fx.Int32,
    cgp: fx.Int32,
    d: fx.Int32,
    h: fx.Int32,
    w: fx.Int32,
    kg: fx.Int32,
    out_d: fx.Int32,
    out_h: fx.Int32,
    out_w: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    wave_m: fx.Constexpr[int],
    wave_n: fx.Constexpr[int],
    wgm: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    kernel_size: fx.Constexpr[tuple],
    stride: fx.Constexpr[tuple],
    padding: fx.Constexpr[tuple],
    dilation: fx.Constexpr[tuple],
    output_layout: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
):
    """Work-group (x, y) computes a tile_m x tile_n tile of group y // split_k's GEMM over
    split y % split_k's k-blocks through the shared main loop; split_k == 1 writes out (+ bias),
    else `out` is the fp32 [split_k, M, K] staging buffer and has_bias is False."""
    spatial = out_d * out_h * out_w
    positions = n * spatial
    k = groups * kg
    reduction = reduction_size(cgp, *kernel_size)
    c_total = groups * cgp
    out_dhw, in_dhw = (out_d, out_h, out_w), (d, h, w)
    by_column = split_k == 1 and output_layout == "NCDHW"
    staged_dtype = out.dtype if const_expr(split_k == 1) else fx.Float32
    staged_bytes = element_bytes(staged_dtype)
    blk = _ConvBlock(mma, tile_m, tile_n, wave_m, wave_n, wgm, split_k, positions, kg)
    tile_k = tile_k_of(tile_m, tile_n, wave_m, wave_n)
    nbytes = conv_lds_bytes(tile_m, tile_n, wave_m, wave_n, staged_bytes, by_column, mma)
    lds = fx.SharedAllocator().allocate(fx.Array[fx.Uint8, nbytes, mx.CHUNK_BYTES]).peek().ptr

    # A: the padded input from the block's first frame (block_input_base), as frames of H * W
    # voxels; B: the packed weight from the tile's first output channel of the group.
    base = block_input_base(blk.origin_m, out_dhw, stride[0], padding[0], _select)
    first_frame = base[0] * d + base[1]
    a_buf = _uniform_buffer(fx.get_iter(x), first_frame, n * d - first_frame, h * w * c_total, 2)
    b_rows_left = kg - blk.origin_n
    b_buf = _uniform_buffer(fx.get_iter(weight), out_channel(blk.group, kg, blk.origin_n),
                            b_rows_left, reduction, 2)  # fmt: skip
    row_ctx = (blk.origin_m, base, group_channel(blk.group, cgp, 0), out_dhw, in_dhw, c_total,
               stride, padding, positions)  # fmt: skip
    chunk_ctx = (cgp, in_dhw, c_total, kernel_size, dilation, padding)
    p = mainloop.Pipeline(
        mma, tile_m, tile_n, tile_k, x, weight, positions, kg, reduction, lds,
        k_tail=has_k_tail_taps(kernel_size), a_rows=functools.partial(_a_row, row_ctx),
        a_chunk=functools.partial(_a_chunk, chunk_ctx), a_buffer=a_buf, b_buffer=b_buf,
        b_rows_left=b_rows_left,
    )  # fmt: skip
    pm = _wave_layout(p, blk, tile_m, tile_n, wave_m, wave_n)
    kb_begin, kb_end = split_blocks(blk.split, reduction, split_k)
    tiles = mx.k_tiles(kb_begin, kb_end, p.blocks)

    accs = mainloop.zero_accs(p)
    a_copy, b_next = mainloop.load_k_tile(p, kb_begin, kb_end)
    # Runtime loop; accs, a_copy and b_next are reassigned, so they are carried.
    for t in range(fx.Int32(1), tiles, fx.Int32(1), unroll=1):
        b_cur = b_next
        fx.barrier()
        mainloop.store_a(p, a_copy)
        fx.barrier()
        a_copy, b_next = mainloop.load_k_tile(p, kb_begin + t * p.blocks, kb_end)
        rocdl.sched_barrier(0)  # keep the next k-tile's loads ahead of this one's MMAs
        accs = mainloop.mma_k_tile(pm, b_cur, accs)
    # The last k-tile (zeros when the split owns no k-block).
    fx.barrier()
    mainloop.store_a(p, a_copy)
    fx.barrier()
    accs = mainloop.mma_k_tile(pm, b_next, accs)

    # Epilogue: 16 rows at a time through each wave's LDS staging area, stored as 16-byte runs:
    # along channels (NDHWC out, the workspace) or along output positions (NCDHW out); a run
    # crossing the group's Kg, M or a sample stores element by element.
    if const_expr(has_bias):
        bias_f32 = _lane_bias(p, blk, bias, kg)
    stage = fx.recast_iter(staged_dtype, lds)
    dst = fx.get_iter(out)
    vec = mx.CHUNK_BYTES // staged_bytes
    passes = stage_read_passes(blk.wave_cols, staged_bytes, by_column, mma)
    k64, spatial64 = fx.Int64(k), fx.Int64(spatial)
    fx.barrier()  # every wave is done reading the A stage the staging areas reuse
    for i in range_constexpr(p.reps_m):
        row_tiles = [accs[i * p.reps_n + j] for j in range_constexpr(p.reps_n)]
        if const_expr(has_bias):
            row_tiles = [row_tiles[j] + bias_f32[j] for j in range_constexpr(p.reps_n)]
        _stage_tiles(p, blk, row_tiles, stage, staged_dtype, by_column)
        for store_pass in range_constexpr(passes):
            values, row16, col, real = _staged_run(p, blk, stage, staged_dtype, store_pass,
                                                   by_column)  # fmt: skip
            row = blk.origin_m + blk.wave_row0 + i * MMA_MN + row16
            col = blk.origin_n + blk.wave_col0 + col
            channel64 = fx.Int64(out_channel(blk.group, kg, col))
            if const_expr(by_column):
                sample = row // spatial
                off = out_row_offset(fx.Int64(row), fx.Int64(sample), k64, spatial64, "NCDHW")
                off = off + out_col_offset(channel64, spatial64, "NCDHW")
                whole = (row + vec <= positions) & (row + vec <= (sample + 1) * spatial)
                if real & (col < kg) & whole:
                    fx.ptr_store(values, dst + off)
                else:
                    if real & (col < kg):
                        for e in range_constexpr(vec):
                            if row + e < positions:
                                m_e = row + e
                                off_e = out_offset(fx.Int64(m_e), fx.Int64(m_e // spatial),
                                                   channel64, k64, spatial64, "NCDHW")  # fmt: skip
                                fx.ptr_store(values[e], dst + off_e)
            else:
                if const_expr(split_k > 1):
                    off = staging_offset(fx.Int64(blk.split), fx.Int64(row), channel64,
                                         fx.Int64(positions), k64)  # fmt: skip
                else:
                    off = out_offset(fx.Int64(row), 0, channel64, k64, 0, "NDHWC")
                if real & (row < positions) & (col + vec <= kg):
                    fx.ptr_store(values, dst + off)
                else:
                    if real & (row < positions) & (col < kg):
                        for e in range_constexpr(vec):
                            if col + e < kg:
                                fx.ptr_store(values[e], dst + off + e)


@flyc.jit
def conv3d_implicit(
    x: fx.Tensor,
    weight: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    n: fx.Int32,
    groups: fx.Int32,
    cgp: fx.Int32,
    d: fx.Int32,
    h: fx.Int32,
    w: fx.Int32,
    kg: fx.Int32,
    out_d: fx.Int32,
    out_h: fx.Int32,
    out_w: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    wave_m: fx.Constexpr[int],
    wave_n: fx.Constexpr[int],
    wgm: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    kernel_size: fx.Constexpr[tuple],
    stride: fx.Constexpr[tuple],
    padding: fx.Constexpr[tuple],
    dilation: fx.Constexpr[tuple],
    output_layout: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    positions = n * out_d * out_h * out_w
    conv3d_implicit_kernel(
        x, weight, bias, out, n, groups, cgp, d, h, w, kg, out_d, out_h, out_w, tile_m, tile_n,
        wave_m, wave_n, wgm, split_k, kernel_size, stride, padding, dilation, output_layout,
        has_bias, mma,
    ).launch(
        grid=conv_grid(positions, kg, groups, tile_m, tile_n, split_k),
        block=(WAVES_PER_BLOCK * WAVE_SIZE[mma], 1, 1),
        stream=stream,
    )  # fmt: skip


@flyc.kernel
def conv3d_splitk_epilogue_kernel(
    staging: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    positions: fx.Int32,
    k: fx.Int32,
    spatial: fx.Int32,
    split_k: fx.Constexpr[int],
    output_layout: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
):
    """out = cast(sum over splits of staging[s, m, c] (+ bias[c])), one thread per element of
    out, in out's layout order (coalesced stores)."""
    idx = elementwise_index(fx.block_idx.x, fx.thread_idx.x)
    if idx < positions * k:
        m, channel = out_element(idx, k, spatial, output_layout)
        ps = fx.get_iter(staging)
        m64, channel64, positions64, k64 = (
            fx.Int64(m), fx.Int64(channel), fx.Int64(positions), fx.Int64(k)
        )  # fmt: skip
        total = load_run(ps, staging_offset(0, m64, channel64, positions64, k64), 1, fx.Float32)
        for s in range_constexpr(1, split_k):
            total = total + load_run(
                ps, staging_offset(s, m64, channel64, positions64, k64), 1, fx.Float32
            )
        if const_expr(has_bias):
            total = total + load_run(fx.get_iter(bias), channel64, 1, bias.dtype).to(fx.Float32)
        fx.ptr_store(total.to(out.dtype)[0], fx.get_iter(out) + fx.Int64(idx))


@flyc.jit
def conv3d_splitk_epilogue(
    staging: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    positions: fx.Int32,
    k: fx.Int32,
    spatial: fx.Int32,
    split_k: fx.Constexpr[int],
    output_layout: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    conv3d_splitk_epilogue_kernel(
        staging, bias, out, positions, k, spatial, split_k, output_layout, has_bias
    ).launch(
        grid=(elementwise_grid(positions * k), 1, 1),
        block=(ELEMENTWISE_BLOCK, 1, 1),
        stream=stream,
    )


@flyc.kernel
def conv3d_pretranspose_kernel(
    x: fx.Tensor,
    out: fx.Tensor,
    total: fx.Int32,
    spatial: fx.Int32,
    groups: fx.Int32,
    cgp: fx.Int32,
    cg: fx.Int32,
):
    """out[n, s, g * Cgp + c] = x[n, g * cg + c, s] (0 for c >= cg), one thread per element of
    out (coalesced stores)."""
    idx = elementwise_index(fx.block_idx.x, fx.thread_idx.x)
    if idx < total:
        real, src = pretranspose_element(idx, spatial, groups, cgp, cg, _select)
        value = load_run(fx.get_iter(x), fx.Int64(src), 1, x.dtype)
        value = real.select(value, fx.Vector.filled(1, 0, x.dtype))
        fx.ptr_store(value[0], fx.get_iter(out) + fx.Int64(idx))


@flyc.jit
def conv3d_pretranspose(
    x: fx.Tensor,
    out: fx.Tensor,
    total: fx.Int32,
    spatial: fx.Int32,
    groups: fx.Int32,
    cgp: fx.Int32,
    cg: fx.Int32,
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    conv3d_pretranspose_kernel(x, out, total, spatial, groups, cgp, cg).launch(
        grid=(elementwise_grid(total), 1, 1), block=(ELEMENTWISE_BLOCK, 1, 1), stream=stream
    )


# --- host launchers --------------------------------------------------------------------------


def _check_limit(name: str, what: str, value: int, limit: int = INDEX_LIMIT) -> None:
    if value >= limit:
        raise ValueError(f"{name}: {what} = {value} is too large for 32-bit indices")


def launch_conv3d(
    x_padded_ndhwc: torch.Tensor,
    packed_weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    workspace: torch.Tensor | None,
    *,
    geometry: Conv3dGeometry,
    tile: ConvTile,
    split_k: int,
    output_layout: str,
    mma: str,
    stream: Any | None = None,
) -> None:
    """Launch out = conv3d(x, weight, bias) as an implicit GEMM: the conv kernel, then the
    split-K epilogue kernel when split_k > 1.

    Contract (reads shapes and dtypes only, never data; CPU tensors or FakeTensors compile
    without running under COMPILE_ONLY=1):

    - geometry: the Conv3dGeometry of the call (conv3d_geometry). M = geometry.positions,
      Kg = K / groups, Cgp = C / groups rounded up to CHANNEL_VECTOR (16).
    - x_padded_ndhwc: contiguous [N, D, H, W, groups * Cgp], bfloat16 or float16
      (INPUT_DTYPES): launch_conv3d_pretranspose's or to_padded_ndhwc_torch's result, or an
      NDHWC input for which ndhwc_input_ready holds. Padding channels MUST be zero.
    - packed_weight: contiguous [K, kT * kH * kW * Cgp] of x's dtype (pack_conv3d_weight).
    - bias: None or contiguous [K] of x's dtype, added in fp32 before the cast.
    - out: contiguous, x's dtype, geometry.out_shape(output_layout): [N, K, D', H', W'] for
      "NCDHW", [N, D', H', W', K] for "NDHWC". Every element is written exactly once.
    - tile: one of SUPPORTED_TILES[mma] (tile_problem: every tile of the grid fits). The conv
      kernel runs the shared LDS-staged main loop (aiter/ops/shared/mainloop.py) over k-tiles
      of tile_k_of(tile) (64, or 32 for small waves) reduction indices; the im2col rows of A are gathered through its hooks
      (padding taps, rows past M, columns past Kg and k-blocks past a split load zeros through
      the buffer range check). split_k: an int >= 1; split s owns reduction k-blocks
      [s * nkb // split_k, (s + 1) * nkb // split_k) of the nkb = ceil(reduction / 32).
      split_k == 1: workspace is ignored and the conv kernel writes out with the bias.
      split_k > 1: workspace is a contiguous float32 conv3d_workspace_shape(geometry, split_k)
      = [split_k, M, K] tensor (need not be zeroed: every split stores its whole partial,
      zeros for an empty range); conv3d_splitk_epilogue sums it, adds the bias, casts, writes.
    - output_layout: one of LAYOUTS. The epilogue stages each wave's 16 rows in LDS and stores
      16-byte runs: along channels for "NDHWC" and the workspace, along output positions for
      "NCDHW" (element by element where a run crosses Kg, M or a sample). mma: "mfma" (wave64;
      gfx942 v_mfma_f32_16x16x16, gfx950 v_mfma_f32_16x16x32) or "wmma" (wave32
      v_wmma_f32_16x16x32, gfx1250 only).
    - Limits (ValueError): N * D * H * W, M, M tiles x N tiles < 2**31; groups * split_k <=
      65535 (grid y); for split_k > 1 also M * K + 256 <= 2**31 (the epilogue's flat index);
      the input frames one block can read (input_span_frames) x H x W x groups * Cgp x 2 bytes
      below 2**31 - 16 (32-bit buffer offsets from the block's first frame); the packed weight's
      Kg x reduction x 2 bytes per group below 2**31 - 16.
    - stream: None, an fx.Stream, a raw handle or an object with `cuda_stream`.

    Kernels (jit names): conv3d_implicit (Constexpr tile_m, tile_n, wave_m, wave_n, wgm,
    split_k, kernel_size, stride, padding, dilation, output_layout, has_bias, mma; N, groups,
    Cgp, D, H, W, Kg and the output dims are runtime int32, so the frame count D never changes
    a kernel; with split_k > 1 it is compiled with has_bias False and output_layout "NDHWC",
    which it does not use) and conv3d_splitk_epilogue (Constexpr split_k, output_layout,
    has_bias). Arguments a configuration does not read (an absent bias) are passed as out.
    """
    if not isinstance(geometry, Conv3dGeometry):
        raise TypeError(f"geometry: expected a Conv3dGeometry, got {type(geometry).__name__}")
    check_mma(mma, MMA_FLAVOURS)
    if tile not in SUPPORTED_TILES[mma]:
        raise ValueError(f"tile: {tile} is not supported for mma={mma!r} (see SUPPORTED_TILES)")
    check_int("split_k", split_k, 1)
    check_choice("output_layout", output_layout, LAYOUTS)
    g = geometry
    check_tensor("x_padded_ndhwc", x_padded_ndhwc, INPUT_DTYPES, g.x_padded_shape())
    dtype = x_padded_ndhwc.dtype
    check_tensor("packed_weight", packed_weight, (dtype,), g.packed_weight_shape())
    has_bias = bias is not None
    if has_bias:
        check_tensor("bias", bias, (dtype,), (g.k,))
    check_tensor("out", out, (dtype,), g.out_shape(output_layout))
    if split_k > 1:
        if workspace is None:
            raise ValueError(
                f"workspace: expected a float32 {list(conv3d_workspace_shape(g, split_k))} "
                "tensor when split_k > 1"
            )
        check_tensor("workspace", workspace, (WORKSPACE_DTYPE,), conv3d_workspace_shape(g, split_k))
    _check_limit("x_padded_ndhwc", "N * D * H * W", g.n * g.d * g.h * g.w)
    _check_limit("out", "M", g.positions)
    m_tiles, n_tiles = tile_counts(g.positions, g.kg, tile.tile_m, tile.tile_n)
    _check_limit("out", "M tiles x N tiles", m_tiles * n_tiles)
    if g.groups * split_k > 65535:
        raise ValueError(
            f"split_k: groups * split_k = {g.groups * split_k} exceeds the 65535 grid rows"
        )
    if split_k > 1:
        _check_limit("out", "M * K + 256", g.positions * g.k + ELEMENTWISE_BLOCK, INDEX_LIMIT + 1)
    frames = input_span_frames(tile.tile_m, g.n, g.d, g.out_d, g.out_h, g.out_w, g.kt,
                               g.stride[0], g.dilation[0])  # fmt: skip
    span = frames * g.h * g.w * g.padded_c * x_padded_ndhwc.element_size()
    _check_limit("x_padded_ndhwc", "bytes one block's input frames span", span, mx.OFFSET_LIMIT)
    weight_bytes = g.kg * g.reduction * x_padded_ndhwc.element_size()
    _check_limit("packed_weight", "bytes of one group's rows", weight_bytes, mx.OFFSET_LIMIT)

    bias_arg = bias if has_bias else out
    x_padded_ndhwc, packed_weight, bias_arg, out = kernel_tensors(
        x_padded_ndhwc, packed_weight, bias_arg, out
    )
    fx_stream = to_stream(stream)
    sizes = (g.n, g.groups, g.cgp, g.d, g.h, g.w, g.kg, g.out_d, g.out_h, g.out_w)
    common = dict(
        tile_m=tile.tile_m, tile_n=tile.tile_n, wave_m=tile.wave_m, wave_n=tile.wave_n,
        wgm=tile.wgm, split_k=split_k, kernel_size=g.kernel_size, stride=g.stride,
        padding=g.padding, dilation=g.dilation, mma=mma, stream=fx_stream,
    )  # fmt: skip
    if split_k == 1:
        conv3d_implicit(
            x_padded_ndhwc, packed_weight, bias_arg, out, *sizes, output_layout=output_layout,
            has_bias=has_bias, **common,
        )  # fmt: skip
        return
    workspace = kernel_tensor(workspace)
    conv3d_implicit(
        x_padded_ndhwc, packed_weight, out, workspace, *sizes, output_layout=LAYOUTS[1],
        has_bias=False, **common,
    )  # fmt: skip
    conv3d_splitk_epilogue(
        workspace, bias_arg, out, g.positions, g.k, g.out_d * g.out_h * g.out_w,
        split_k=split_k, output_layout=output_layout, has_bias=has_bias, stream=fx_stream,
    )  # fmt: skip


def launch_conv3d_pretranspose(
    x: torch.Tensor, out: torch.Tensor, *, groups: int, stream: Any | None = None
) -> None:
    """Launch out = x as the conv kernel's padded NDHWC input (conv3d_pretranspose).

    Contract: x contiguous [N, C, D, H, W], bfloat16 or float16, with
    pretranspose_supported(x.shape, groups); out contiguous [N, D, H, W, groups * Cgp] of x's
    dtype, Cgp = C / groups rounded up to CHANNEL_VECTOR. out[n, d, h, w, g * Cgp + c] =
    x[n, g * C / groups + c, d, h, w] for c < C / groups and 0 for the padding channels: every
    element of out is written (one thread each), so out need not be zeroed. Reads shapes and
    dtypes only; CPU tensors or FakeTensors compile without running under COMPILE_ONLY=1.
    Kernel (jit name): conv3d_pretranspose, no Constexpr (all sizes are runtime int32), so one
    kernel per dtype and arch. stream as for launch_conv3d.
    """
    check_rank("x", x, 5, "[N, C, D, H, W]")
    check_int("groups", groups, 1)
    n, c, d, h, w = (int(v) for v in x.shape)
    if c % groups:
        raise ValueError(f"groups: C = {c} is not divisible by groups = {groups}")
    check_tensor("x", x, INPUT_DTYPES, (n, c, d, h, w))
    if not pretranspose_supported(x.shape, groups):
        raise ValueError(
            f"x: {list(x.shape)} is too large for the pre-transpose's 32-bit indices "
            "(use to_padded_ndhwc_torch)"
        )
    cg = c // groups
    cgp = padded_channels(cg)
    check_tensor("out", out, (x.dtype,), (n, d, h, w, groups * cgp))
    spatial = d * h * w
    x, out = kernel_tensors(x, out)
    conv3d_pretranspose(
        x, out, n * spatial * groups * cgp, spatial, groups, cgp, cg, stream=to_stream(stream)
    )
