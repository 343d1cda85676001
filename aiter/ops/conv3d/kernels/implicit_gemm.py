"""FlyDSL kernels and launchers of conv3d as an implicit GEMM (bf16/fp16, fp32 accumulation):
MFMA for gfx942/gfx950, WMMA for gfx1250, a split-K epilogue, and an NCDHW -> padded NDHWC
pre-transpose. Also the geometry, the weight packing and the torch fallbacks the host uses.

The GEMM of group g: out[m, g * Kg + kc] = sum_r A[m, r] * B[g * Kg + kc, r] (+ bias), where
row m of A is output position (n, od, oh, ow), A[m, r] the input element that tap
r // Cgp of output position m reads in channel r % Cgp of group g (zero in the padding and for
the padded channels), and B the packed weight (pack_conv3d_weight). conv3d_index.py holds every
formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr

from aiter.ops.conv3d.kernels.implicit_gemm_index import (
    BLOCKS_PER_STEP,
    CHANNEL_VECTOR,
    ELEMENTWISE_BLOCK,
    K_STEP,
    MMA_MN,
    WAVE_SIZE,
    WAVES_PER_BLOCK,
    acc_coord,
    acc_origin,
    conv_grid,
    elementwise_grid,
    elementwise_index,
    group_and_split,
    group_channel,
    input_origin,
    inside,
    out_channel,
    out_col_offset,
    out_element,
    out_row_offset,
    out_size,
    padded_channels,
    position_coords,
    pretranspose_element,
    reduction_coords,
    reduction_size,
    run_start,
    split_range,
    staging_offset,
    staging_row_offset,
    step_block,
    tap_coord,
    tile_counts,
    tile_of_block,
    tile_origin,
    voxel_index,
    wave_origin,
    wave_repeats,
    weight_offset,
    x_offset,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared import mma_16bit
from aiter.ops.shared.gemm_blocks import check_mma, load_run, to_stream, zero_accs
from aiter.ops.shared.gemm_index import acc_rows_per_lane, k_run, operand_row
from aiter.ops.shared.kernel_tensors import kernel_tensor, kernel_tensors
from aiter.ops.shared.launch_args import check_choice, check_int, check_rank, check_tensor

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
    and wgm, the M tiles consecutive work-groups walk before moving to the next N tile."""

    tile_m: int
    tile_n: int
    wave_m: int
    wave_n: int
    wgm: int


WAVE_LAYOUTS = ((1, 4), (2, 2), (4, 1))
WGM_CHOICES = (1, 2, 4, 8)


def _tile_grid() -> tuple[ConvTile, ...]:
    tiles = []
    for tile_m in (32, 64, 128):
        for tile_n in (32, 64, 128):
            for wave_m, wave_n in WAVE_LAYOUTS:
                if tile_m % (wave_m * MMA_MN) or tile_n % (wave_n * MMA_MN):
                    continue
                tiles.extend(ConvTile(tile_m, tile_n, wave_m, wave_n, g) for g in WGM_CHOICES)
    return tuple(tiles)


SUPPORTED_TILES: dict[str, tuple[ConvTile, ...]] = {"mfma": _tile_grid(), "wmma": _tile_grid()}
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

# Every lane loads its MMA operands straight from global memory (one contiguous run of the
# reduction per operand row per k-block, as the GEMM kernels do): no LDS, no barrier. The
# reduction is one runtime loop over steps of K_STEP; only the step body (BLOCKS_PER_STEP
# k-blocks x the wave's MMA repeats) is unrolled at trace time, never the taps or channels.
# Helpers hold no dynamic `if` or runtime loop: FlyDSL rewrites those only in kernel bodies.


def _select(cond, a, b):
    return cond.select(a, b)


def _clamp(index, bound):
    """index, or bound - 1 past the end (loads stay in bounds; stores are predicated)."""
    return (index < bound).select(index, bound - 1)


class _WaveTile:
    """Where a lane's work lies: the work-group's tile, group and split, the wave's origin."""

    def __init__(self, mma: str, tile_m, tile_n, wave_m, wave_n, wgm, split_k, positions, kg):
        self.wsz = WAVE_SIZE[mma]
        self.reps_m, self.reps_n = wave_repeats(tile_m, tile_n, wave_m, wave_n)
        self.rows_per_lane = acc_rows_per_lane(self.wsz)
        tid = fx.thread_idx.x
        self.lane = tid % self.wsz
        wave = tid // self.wsz
        self.group, self.split = group_and_split(fx.block_idx.y, split_k)
        m_tiles, n_tiles = tile_counts(positions, kg, tile_m, tile_n)
        tm, tn = tile_of_block(fx.block_idx.x, m_tiles, n_tiles, wgm, _select)
        self.origin_m, self.origin_n = tile_origin(tm, tn, tile_m, tile_n)
        self.wave_m, self.wave_n = wave_origin(wave, tile_m, tile_n, wave_m, wave_n)
        self.row0, self.col0 = acc_origin(
            self.origin_m, self.origin_n, self.wave_m, self.wave_n, self.lane, self.wsz
        )


def _out_columns(t: _WaveTile, kg, spatial, bias, has_bias: bool, split_k: int, layout: str):
    """Per B repeat j: (whether the lane's column exists, its part of the destination offset,
    its fp32 bias or None). The destination is out (split_k == 1) or the staging buffer."""
    columns = []
    for j in range_constexpr(t.reps_n):
        _, col = acc_coord(t.row0, t.col0, 0, j, 0)
        channel = out_channel(t.group, kg, _clamp(col, kg))
        if const_expr(split_k > 1):
            part = fx.Int64(channel)
        else:
            part = out_col_offset(fx.Int64(channel), fx.Int64(spatial), layout)
        bias_f32 = None
        if const_expr(has_bias):
            bias_f32 = load_run(fx.get_iter(bias), fx.Int64(channel), 1, bias.dtype)
            bias_f32 = bias_f32.to(fx.Float32)[0]
        columns.append((col < kg, part, bias_f32))
    return columns


def _out_row(t: _WaveTile, i: int, e: int, positions, spatial, k, split_k: int, layout: str):
    """(whether the row of accumulator element e of A repeat i exists, its part of the
    destination offset)."""
    row, _ = acc_coord(t.row0, t.col0, i, 0, e)
    k64 = fx.Int64(k)
    row64 = fx.Int64(row)
    if const_expr(split_k > 1):
        part = staging_row_offset(fx.Int64(t.split), row64, fx.Int64(positions), k64)
    elif const_expr(layout == "NCDHW"):
        part = out_row_offset(row64, fx.Int64(row // spatial), k64, fx.Int64(spatial), layout)
    else:
        part = out_row_offset(row64, 0, k64, 0, layout)
    return row < positions, part


def _a_rows(t: _WaveTile, positions, out_dhw, stride, padding):
    """Per A repeat: (n, d origin, h origin, w origin) of the lane's (clamped) output position."""
    rows = []
    for i in range_constexpr(t.reps_m):
        m = _clamp(operand_row(t.origin_m, t.wave_m, i, t.lane), positions)
        n, od, oh, ow = position_coords(m, *out_dhw)
        rows.append(
            (
                n,
                input_origin(od, stride[0], padding[0]),
                input_origin(oh, stride[1], padding[1]),
                input_origin(ow, stride[2], padding[2]),
            )
        )
    return rows


def _b_rows(t: _WaveTile, kg, reduction):
    """Per B repeat: the element offset of the lane's packed-weight row (clamped channel)."""
    rows = []
    for j in range_constexpr(t.reps_n):
        col = _clamp(operand_row(t.origin_n, t.wave_n, j, t.lane), kg)
        rows.append(weight_offset(fx.Int64(out_channel(t.group, kg, col)), reduction, 0))
    return rows


def _load_step(t: _WaveTile, in_dtype, px, pw, a_rows, b_rows, kb_begin, step, r_end, sizes,
               ks, dil):  # fmt: skip
    """(A runs, B runs) of the BLOCKS_PER_STEP k-blocks of main-loop step `step`: each lane's
    run of every repeat, zero for padding taps and for runs at or past r_end."""
    cgp, d, h, w, c_total = sizes
    run = k_run(t.wsz)
    zero = fx.Vector.filled(run, 0, in_dtype)
    a_runs, b_runs = [], []
    for sub in range_constexpr(BLOCKS_PER_STEP):
        r = run_start(step_block(kb_begin, step, sub), t.lane, t.wsz)
        live = r < r_end
        r = live.select(r, 0)
        tap_t, tap_h, tap_w, c = reduction_coords(r, cgp, ks[1], ks[2])
        c_index = fx.Int64(group_channel(t.group, cgp, c))
        runs = []
        for n, d0, h0, w0 in a_rows:
            di, hi, wi = (
                tap_coord(d0, tap_t, dil[0]),
                tap_coord(h0, tap_h, dil[1]),
                tap_coord(w0, tap_w, dil[2]),
            )
            ok = live & inside(di, d) & inside(hi, h) & inside(wi, w)
            voxel = ok.select(voxel_index(n, di, hi, wi, d, h, w), 0)
            off = x_offset(fx.Int64(voxel), c_index, c_total)
            runs.append(ok.select(load_run(px, off, run, in_dtype), zero))
        a_runs.append(runs)
        r64 = fx.Int64(r)
        b_runs.append([live.select(load_run(pw, row + r64, run, in_dtype), zero) for row in b_rows])
    return a_runs, b_runs


def _mma_step(mma: str, in_dtype, a_runs, b_runs, accs):
    reps_n = len(b_runs[0])
    accs = list(accs)
    for sub in range_constexpr(BLOCKS_PER_STEP):
        for i, a_run in enumerate(a_runs[sub]):
            for j, b_run in enumerate(b_runs[sub]):
                acc = i * reps_n + j
                accs[acc] = mma_16bit.mma_step(mma, in_dtype, a_run, b_run, accs[acc])
    return accs


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
    split y % split_k's k-blocks; split_k == 1 writes out (+ bias), else `out` is the fp32
    staging buffer and has_bias is False."""
    spatial = out_d * out_h * out_w
    positions = n * spatial
    k = groups * kg
    reduction = reduction_size(cgp, *kernel_size)
    t = _WaveTile(mma, tile_m, tile_n, wave_m, wave_n, wgm, split_k, positions, kg)
    in_dtype = x.dtype
    px = fx.get_iter(x)
    pw = fx.get_iter(weight)
    a_rows = _a_rows(t, positions, (out_d, out_h, out_w), stride, padding)
    b_rows = _b_rows(t, kg, fx.Int64(reduction))
    sizes = (cgp, d, h, w, fx.Int64(groups * cgp))
    kb_begin, steps, r_end = split_range(t.split, reduction, split_k, _select)

    accs = zero_accs(t.reps_m * t.reps_n, t.rows_per_lane, fx.Float32)
    # One runtime loop over the split's steps; `accs` is reassigned, so it is loop-carried.
    for step in range(fx.Int32(0), steps, fx.Int32(1)):
        a_runs, b_runs = _load_step(
            t, in_dtype, px, pw, a_rows, b_rows, kb_begin, step, r_end, sizes, kernel_size,
            dilation,
        )  # fmt: skip
        accs = _mma_step(mma, in_dtype, a_runs, b_runs, accs)

    # Epilogue: bias and cast per 16x16 tile, then one predicated store per accumulator
    # element at a row part (per row) plus a column part (per column) of its offset.
    columns = _out_columns(t, kg, spatial, bias, has_bias, split_k, output_layout)
    values = []
    for i in range_constexpr(t.reps_m):
        for j in range_constexpr(t.reps_n):
            acc = accs[i * t.reps_n + j]
            if const_expr(has_bias):
                acc = acc + columns[j][2]
            if const_expr(split_k == 1):
                acc = acc.to(out.dtype)
            values.append(acc)
    pout = fx.get_iter(out)
    for i in range_constexpr(t.reps_m):
        for e in range_constexpr(t.rows_per_lane):
            row_ok, row_part = _out_row(t, i, e, positions, spatial, k, split_k, output_layout)
            for j in range_constexpr(t.reps_n):
                col_ok, col_part, _ = columns[j]
                if row_ok & col_ok:
                    fx.ptr_store(values[i * t.reps_n + j][e], pout + (row_part + col_part))


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
    - tile: one of SUPPORTED_TILES[mma]. split_k: an int >= 1; split s owns reduction k-blocks
      [s * nkb // split_k, (s + 1) * nkb // split_k) of the nkb = ceil(reduction / 32).
      split_k == 1: workspace is ignored and the conv kernel writes out with the bias.
      split_k > 1: workspace is a contiguous float32 conv3d_workspace_shape(geometry, split_k)
      = [split_k, M, K] tensor (need not be zeroed: every split stores its whole partial,
      zeros for an empty range); conv3d_splitk_epilogue sums it, adds the bias, casts, writes.
    - output_layout: one of LAYOUTS. mma: "mfma" (wave64 v_mfma_f32_16x16x16, gfx942/gfx950
      only) or "wmma" (wave32 v_wmma_f32_16x16x32, gfx1250 only).
    - Limits (ValueError): N * D * H * W, M, M tiles x N tiles < 2**31; groups * split_k <=
      65535 (grid y); for split_k > 1 also M * K + 256 <= 2**31 (the epilogue's flat index).
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
