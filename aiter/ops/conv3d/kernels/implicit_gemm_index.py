"""Index arithmetic of the conv3d implicit-GEMM kernels: the GEMM view of a convolution, which
input element (im2col) the shared main loop's A hooks read for a block row and a reduction index,
where results and split-K partials live, the conv epilogue's LDS staging, the work-group order,
and the pre-transpose and split-K epilogue grids.

The GEMM: row m of A is output position (n, od, oh, ow) (M = N * D' * H' * W' rows), row kc of
B is output channel g * Kg + kc of group g (Kg = K / groups), and the reduction index r runs
over the taps in (t, h, w) order with the group's Cgp padded channels fastest:
r = ((t * kH + h) * kW + w) * Cgp + c. Cgp = C / groups rounded up to CHANNEL_VECTOR.

The main loop is the shared one (aiter/ops/shared/mainloop.py, mainloop_index.py): A's k-tile
of TILE_K reduction indices goes through LDS, gathered by a_row_info (once per copied row) and
a_chunk_element (per 16-byte chunk: the tap's address and whether it is in the padding).
"""

# Only + - * // % & | and comparisons appear below, so the same functions run on Python ints
# (CPU tests), on torch integer tensors (vectorised emulation) and on FlyDSL Int32/Int64 values
# (inside the kernels). Divisions and remainders only ever see operands >= 0, so floor and
# truncating division agree; input coordinates may be negative (padding taps) but only meet
# + - * and comparisons. A minimum takes the caller's `select(cond, a, b)`: `cond.select(a, b)`
# in a kernel, torch.where in a test, a conditional expression on ints. Kernel sizes, strides,
# paddings, dilations, split_k and tile fields are compile-time Python ints everywhere.

from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.mainloop_index import MMA_MN, WAVE_SIZE, WAVES_PER_BLOCK

K_BLOCK = mx.k_block(2)  # 32 bf16/fp16 reduction indices: one 64-byte MMA k-block

# Channels of a group are padded to a multiple of this many. Every 16-byte chunk of A the main
# loop copies (8 elements) and every lane's MMA run (8 or 16 elements) starts at a multiple of
# its own length, so with Cgp a multiple of 16 none crosses from one tap (t, h, w) into the next.
CHANNEL_VECTOR = 16
# Reduction depth of one main-loop k-tile: two 32-deep MMA k-blocks. The reduction's last
# k-block may be half full (Cgp * taps a multiple of 16 only): its missing chunks load zeros.
TILE_K = 64
# The heuristic's unit of reduction work (plan.heuristic_split_k counts steps of it).
K_STEP = TILE_K
# A wave holding fewer MMA tiles than this runs k-tiles of one k-block (SMALL_TILE_K): half the
# B runs, A copy and LDS stage in flight, so small tiles keep their occupancy.
DEEP_TILE_MMAS = 8
SMALL_TILE_K = 32
# Threads per work-group of the one-element-per-thread kernels (pre-transpose, epilogue).
ELEMENTWISE_BLOCK = 256

__all__ = [
    "CHANNEL_VECTOR",
    "ELEMENTWISE_BLOCK",
    "K_BLOCK",
    "K_STEP",
    "SMALL_TILE_K",
    "TILE_K",
    "MMA_MN",
    "WAVES_PER_BLOCK",
    "WAVE_SIZE",
]


# --- geometry ------------------------------------------------------------------------------


def padded_channels(cg):
    """Cgp: a group's C / groups channels rounded up to a multiple of CHANNEL_VECTOR."""
    return (cg + CHANNEL_VECTOR - 1) // CHANNEL_VECTOR * CHANNEL_VECTOR


def out_size(size, kernel: int, stride: int, padding: int, dilation: int):
    """Output extent along one axis (torch's formula; <= 0 when the input is too small)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def reduction_size(cgp, kt: int, kh: int, kw: int):
    """Length of the GEMM reduction: every tap of every padded channel of a group."""
    return kt * kh * kw * cgp


def num_k_blocks(reduction):
    """K_BLOCK-deep blocks covering the reduction (the last one partial when it is not a
    multiple of K_BLOCK; its missing part is masked)."""
    return (reduction + K_BLOCK - 1) // K_BLOCK


# --- work-groups -----------------------------------------------------------------------------


def tile_counts(m, kg, tile_m: int, tile_n: int):
    """(M tiles, N tiles) of one group's GEMM."""
    return (m + tile_m - 1) // tile_m, (kg + tile_n - 1) // tile_n


def conv_grid(m, kg, groups, tile_m: int, tile_n: int, split_k: int):
    """Launch grid of the conv kernel (x: M tiles x N tiles, y: groups x splits)."""
    m_tiles, n_tiles = tile_counts(m, kg, tile_m, tile_n)
    return m_tiles * n_tiles, groups * split_k, 1


def tile_of_block(bid, m_tiles, n_tiles, wgm: int, select):
    """(M tile, N tile) of linear work-group id `bid` (block_idx.x).

    Work-groups are grouped wgm M tiles at a time: consecutive ids walk the (up to) wgm M tiles
    of a group for one N tile, then the same M tiles for the next N tile, so nearby work-groups
    share input rows and weight rows. The last group may hold fewer than wgm M tiles.
    """
    if wgm == 1:
        return bid // n_tiles, bid % n_tiles
    span = wgm * n_tiles
    group = bid // span
    first_m = group * wgm
    left = m_tiles - first_m
    rows = select(left < wgm, left, wgm)
    local = bid - group * span
    return first_m + local % rows, local // rows


def group_and_split(bid_y, split_k: int):
    """(conv group, K split) of block_idx.y."""
    return bid_y // split_k, bid_y % split_k


def wave_tile(tile_m: int, tile_n: int, wave_m: int, wave_n: int):
    """Rows and columns of the work-group tile computed by one wave."""
    return tile_m // wave_m, tile_n // wave_n


def wave_repeats(tile_m: int, tile_n: int, wave_m: int, wave_n: int):
    """16x16 MMA tiles per wave along M and along N."""
    rows, cols = wave_tile(tile_m, tile_n, wave_m, wave_n)
    return rows // MMA_MN, cols // MMA_MN


def tile_k_of(tile_m: int, tile_n: int, wave_m: int, wave_n: int) -> int:
    """Reduction depth of the main loop's k-tile for a tile (a function of the tile alone, so
    the tile the plan chooses decides it): TILE_K for a wave of DEEP_TILE_MMAS up to twice as
    many 16x16 MMA tiles, else SMALL_TILE_K: a small wave's deep k-tile holds registers its
    few MMAs cannot use, a big wave's two deep B stages cost a wave per SIMD (128x128 w2x2:
    192 VGPRs, 2 waves per SIMD at 64, 140 and 3 at 32)."""
    reps_m, reps_n = wave_repeats(tile_m, tile_n, wave_m, wave_n)
    return TILE_K if DEEP_TILE_MMAS <= reps_m * reps_n < 2 * DEEP_TILE_MMAS else SMALL_TILE_K


def wave_origin(wave, tile_m: int, tile_n: int, wave_m: int, wave_n: int):
    """Row and column offsets of a wave's sub-tile inside the work-group tile (waves are laid
    out wave_n per row of waves)."""
    rows, cols = wave_tile(tile_m, tile_n, wave_m, wave_n)
    return (wave // wave_n) * rows, (wave % wave_n) * cols


def tile_origin(tile_m_id, tile_n_id, tile_m: int, tile_n: int):
    """First GEMM row (output position) and first column (channel of the group) of a tile."""
    return tile_m_id * tile_m, tile_n_id * tile_n


# --- the A operand: im2col of the padded NDHWC input -----------------------------------------


def position_coords(m, out_d, out_h, out_w):
    """(n, od, oh, ow) of output position m."""
    ow = m % out_w
    rest = m // out_w
    oh = rest % out_h
    rest = rest // out_h
    return rest // out_d, rest % out_d, oh, ow


def input_origin(o, stride: int, padding: int):
    """Input coordinate read by tap 0 at output coordinate o (negative inside the padding)."""
    return o * stride - padding


def reduction_coords(r, cgp, kh: int, kw: int):
    """(t, h, w, c): the tap and the padded channel of reduction index r."""
    tap = r // cgp
    c = r - tap * cgp
    return tap // (kh * kw), (tap // kw) % kh, tap % kw, c


def tap_coord(origin, tap, dilation: int):
    """Input coordinate of tap index `tap` from an output position's origin."""
    return origin + tap * dilation


def inside(coord, size):
    """Whether an input coordinate lies in the input volume (outside: a zero padding tap)."""
    return (coord >= 0) & (coord < size)


def voxel_index(n, di, hi, wi, d, h, w):
    """Index of input voxel (n, di, hi, wi) among the N * D * H * W voxels."""
    return ((n * d + di) * h + hi) * w + wi


def x_offset(voxel, c_index, c_total):
    """Element offset of channel c_index of a voxel in a contiguous [N, D, H, W, c_total]."""
    return voxel * c_total + c_index


def group_channel(g, cgp, c):
    """Channel of the padded input (or column of the packed row) of group g's channel c."""
    return g * cgp + c


# --- the main loop's A hooks: im2col through the buffer range check ---------------------------


def block_input_base(origin_m, out_dhw, stride_d: int, pad_d: int, select):
    """(sample n0, input frame f0) the block's input buffer starts at: the first frame any valid
    tap of the block's rows (output positions origin_m, origin_m + 1, ...) can read. Later rows
    are later output positions, so their valid taps never lie before (n0, f0, 0, 0): every
    element offset a valid tap computes from this base is >= 0, and the 32-bit buffer offsets
    need only cover the block's own frames (input_span_frames)."""
    n0, od0, _, _ = position_coords(origin_m, *out_dhw)
    d0 = input_origin(od0, stride_d, pad_d)
    return n0, select(d0 > 0, d0, 0)


def input_span_frames(tile_m: int, n, d, out_d, out_h, out_w, kt: int, stride_d: int,
                      dilation_d: int):  # fmt: skip
    """An upper bound of the input frames (of H * W voxels) between a block's base
    (block_input_base) and the last voxel any valid tap of its tile_m rows reads."""
    out_frames = (tile_m - 1) // (out_h * out_w) + 2  # output frames the rows can touch
    reach = (out_frames - 1) * stride_d + (kt - 1) * dilation_d + 1
    samples = (tile_m - 1) // (out_d * out_h * out_w) + 1 if n > 1 else 0
    return min(n * d, reach + samples * d)


def a_row_info(m, base, group_base, out_dhw, in_dhw, c_total, stride, padding, positions):
    """What the main loop keeps of A row m (output position m), once per copied row: the element
    offset, from the block's base (n0, f0), of its tap (0, 0, 0) channel 0 of the group (negative
    where that tap lies in the padding), its tap-0 input coordinates (d0, h0, w0), and whether
    the row exists (m < M). Rows past M are not clamped: their loads are masked."""
    n0, f0 = base
    d, h, w = in_dhw
    n, od, oh, ow = position_coords(m, *out_dhw)
    d0 = input_origin(od, stride[0], padding[0])
    h0 = input_origin(oh, stride[1], padding[1])
    w0 = input_origin(ow, stride[2], padding[2])
    row = x_offset(voxel_index(n - n0, d0 - f0, h0, w0, d, h, w), group_base, c_total)
    return row, d0, h0, w0, m < positions


def a_chunk_element(info, r, cgp, in_dhw, c_total, kernel, dilation, padding):
    """(element offset from the block's base, valid) of reduction index r of a row (a_row_info):
    the input element its tap reads, invalid where the tap falls in the padding (the load then
    returns zeros). An axis without padding needs no check: its taps always lie inside."""
    row, d0, h0, w0, valid = info
    d, h, w = in_dhw
    t, th, tw, c = reduction_coords(r, cgp, kernel[1], kernel[2])
    dd, dh, dw = (
        tap_coord(0, t, dilation[0]),
        tap_coord(0, th, dilation[1]),
        tap_coord(0, tw, dilation[2]),
    )
    element = row + x_offset(voxel_index(0, dd, dh, dw, d, h, w), c, c_total)
    if padding[0]:
        valid = valid & inside(d0 + dd, d)
    if padding[1]:
        valid = valid & inside(h0 + dh, h)
    if padding[2]:
        valid = valid & inside(w0 + dw, w)
    return element, valid


# --- the B operand: the packed weight --------------------------------------------------------


def out_channel(g, kg, col):
    """Output channel of column col of group g's GEMM."""
    return g * kg + col


def weight_offset(channel, reduction, r):
    """Element offset of packed[channel, r] in the row-major [K, reduction] packed weight."""
    return channel * reduction + r


def packed_weight_index(k, t, h, w, c, kh: int, kw: int, cgp):
    """(row, column) of the packed weight holding weight[k, c, t, h, w] (c < C / groups)."""
    return k, ((t * kh + h) * kw + w) * cgp + c


# --- the reduction loop ----------------------------------------------------------------------


def split_blocks(split, reduction, split_k: int):
    """[first, end) k-blocks of split s: split s owns k-blocks [s * nkb // split_k,
    (s + 1) * nkb // split_k) of the nkb = ceil(reduction / K_BLOCK) (mx.split_k_range)."""
    return mx.split_k_range(split, num_k_blocks(reduction), split_k)


def has_k_tail_taps(kernel) -> bool:
    """Whether a reduction of these taps can end inside a k-block: Cgp is a multiple of 16, so
    kT * kH * kW * Cgp is a multiple of K_BLOCK (32) whenever the tap count is even. Decided by
    the kernel size alone (a compile-time choice), not by the runtime Cgp."""
    kt, kh, kw = kernel
    return (kt * kh * kw) % 2 == 1


# --- outputs ---------------------------------------------------------------------------------


def spatial_index(od, oh, ow, out_h, out_w):
    """Index of an output position inside its sample (D' * H' * W' per sample)."""
    return (od * out_h + oh) * out_w + ow


def out_row_offset(m, n, k, spatial, layout: str):
    """The part of out_offset that depends on the output position m only; n = m // spatial is
    its sample, read for "NCDHW" only (the "NDHWC" part needs no division)."""
    if layout == "NCDHW":
        return m + n * (k - 1) * spatial
    return m * k


def out_col_offset(channel, spatial, layout: str):
    """The part of out_offset that depends on the channel only."""
    if layout == "NCDHW":
        return channel * spatial
    return channel


def out_offset(m, n, channel, k, spatial, layout: str):
    """Element offset of output position m (sample n = m // spatial of `spatial` positions
    each), channel `channel`, in out: [N, K, D', H', W'] for "NCDHW" ((n * K + channel) *
    spatial + m - n * spatial), [N, D', H', W', K] for "NDHWC" (m * K + channel)."""
    return out_row_offset(m, n, k, spatial, layout) + out_col_offset(channel, spatial, layout)


def staging_row_offset(split, m, positions, k):
    """Offset of staging[split, m, 0] in the fp32 [split_k, M, K] buffer."""
    return (split * positions + m) * k


def staging_offset(split, m, channel, positions, k):
    """Element offset of staging[split, m, channel] in the fp32 [split_k, M, K] buffer."""
    return staging_row_offset(split, m, positions, k) + channel


def elementwise_grid(count):
    """Work-groups of a one-element-per-thread kernel over `count` elements."""
    return (count + ELEMENTWISE_BLOCK - 1) // ELEMENTWISE_BLOCK


def elementwise_index(bid, tid):
    """Flat element index of a thread of a one-element-per-thread kernel."""
    return bid * ELEMENTWISE_BLOCK + tid


def out_element(idx, k, spatial, layout: str):
    """(output position m, channel) of flat element idx of out in `layout` (the inverse of
    out_offset)."""
    if layout == "NCDHW":
        per_sample = k * spatial
        n = idx // per_sample
        rest = idx - n * per_sample
        channel = rest // spatial
        return n * spatial + (rest - channel * spatial), channel
    return idx // k, idx % k


# --- the pre-transpose: NCDHW -> padded NDHWC ----------------------------------------------


def pretranspose_element(idx, spatial, groups, cgp, cg, select):
    """For flat element idx of the padded [N, D, H, W, groups * Cgp] output: (whether it is
    a real channel, offset of its source in the contiguous [N, C, D, H, W] x, C = groups * cg).

    Padding channels (c >= cg inside a group) are zero; their source offset is 0.
    """
    c_total = groups * cgp
    per_sample = spatial * c_total
    n = idx // per_sample
    rest = idx - n * per_sample
    s = rest // c_total
    cc = rest - s * c_total
    g = cc // cgp
    c = cc - g * cgp
    real = c < cg
    src = ((n * groups + g) * cg + c) * spatial + s
    return real, select(real, src, 0)


# --- the epilogue: accumulators -> LDS -> 16-byte runs ----------------------------------------

# A wave's accumulators of one A repeat (16 rows x wave_cols columns) are staged in the wave's
# own LDS area, then read back as 16-byte runs: along a row of C for the [M, K]-shaped
# destinations (NDHWC out, the split-K workspace), along a column of C (16 consecutive output
# positions of one channel) for NCDHW out. Each staged row (column) is padded by one chunk.


def row_pitch(wave_cols: int, out_bytes: int) -> int:
    return wave_cols * out_bytes + mx.CHUNK_BYTES


def col_pitch(out_bytes: int) -> int:
    return MMA_MN * out_bytes + mx.CHUNK_BYTES


def stage_bytes(wave_cols: int, out_bytes: int, by_column: bool) -> int:
    """LDS bytes of one wave's staging area."""
    if by_column:
        return wave_cols * col_pitch(out_bytes)
    return MMA_MN * row_pitch(wave_cols, out_bytes)


def stage_write_byte(wave, rep_n, lane, e, wave_cols: int, out_bytes: int, by_column: bool,
                     mma: str):  # fmt: skip
    """Where accumulator element e of B repeat rep_n of a lane goes in its wave's area (by
    column: the lane's elements are consecutive rows, so element 0's place starts a vector)."""
    row = mx.acc_row(lane, e, mma)
    col = rep_n * MMA_MN + mx.acc_col(lane)
    base = wave * stage_bytes(wave_cols, out_bytes, by_column)
    if by_column:
        return base + col * col_pitch(out_bytes) + row * out_bytes
    return base + row * row_pitch(wave_cols, out_bytes) + col * out_bytes


def stage_runs(wave_cols: int, out_bytes: int, by_column: bool) -> int:
    """16-byte runs in a wave's staged 16 rows."""
    return MMA_MN * wave_cols * out_bytes // mx.CHUNK_BYTES


def stage_read_passes(wave_cols: int, out_bytes: int, by_column: bool, mma: str) -> int:
    runs = stage_runs(wave_cols, out_bytes, by_column)
    return (runs + WAVE_SIZE[mma] - 1) // WAVE_SIZE[mma]


def stage_read_coord(store_pass, lane, wave_cols: int, out_bytes: int, by_column: bool,
                     mma: str):  # fmt: skip
    """(row in the 16, column in the wave's columns, real, LDS byte in the wave's area) of the
    run a lane reads in a pass: its first element; the run goes along the row (by_column False)
    or down the column."""
    vec = mx.CHUNK_BYTES // out_bytes
    q = store_pass * WAVE_SIZE[mma] + lane
    runs = stage_runs(wave_cols, out_bytes, by_column)
    real = q < runs
    # An idle lane (not real) still reads, and its value is dropped: it reads a run of its own
    # wave's area, never the next wave's, which that wave may be writing.
    q = q % runs
    if by_column:
        per_col = MMA_MN // vec
        row, col = (q % per_col) * vec, q // per_col
        return row, col, real, col * col_pitch(out_bytes) + row * out_bytes
    per_row = wave_cols // vec
    row, col = q // per_row, (q % per_row) * vec
    return row, col, real, row * row_pitch(wave_cols, out_bytes) + col * out_bytes


def conv_lds_bytes(tile_m: int, tile_n: int, wave_m: int, wave_n: int, out_bytes: int,
                   by_column: bool, mma: str) -> int:  # fmt: skip
    """LDS a block allocates: the A stage of the shared main loop (with the idle copy slots of
    small tiles), reused by the four waves' staging areas."""
    tile_k = tile_k_of(tile_m, tile_n, wave_m, wave_n)
    stage = max(
        mx.a_stage_bytes(tile_m, tile_k, 2),
        mx.a_copy_passes(tile_m, tile_k, 2, mma) * mx.threads(mma) * mx.CHUNK_BYTES,
    )
    wave_cols = tile_n // wave_n
    return max(stage, WAVES_PER_BLOCK * stage_bytes(wave_cols, out_bytes, by_column))


def a_wave_lds_byte(wave_row0, tile_k: int, elem_bytes: int):
    """Byte offset of a wave's first A row in the A stage. A wave reads its rows through the
    shared operand reads of rows 0, 1, ... from this offset: the swizzle repeats every
    swizzle_period rows, and wave row offsets are multiples of 16, so the bytes agree."""
    return wave_row0 * mx.chunks_per_row(tile_k, elem_bytes) * mx.CHUNK_BYTES


def swizzle_period(tile_k: int, elem_bytes: int) -> int:
    """Rows after which the A stage's swizzle repeats."""
    cpr = mx.chunks_per_row(tile_k, elem_bytes)
    return max(1, mx.CHUNKS_PER_LINE // cpr) * min(cpr, mx.CHUNKS_PER_LINE)
