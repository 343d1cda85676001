"""Index arithmetic of the conv3d implicit-GEMM kernels: the GEMM view of a convolution, which
input element (im2col) and packed-weight element each lane loads, where results and split-K
partials live, the work-group order, and the pre-transpose and split-K epilogue grids.

The GEMM: row m of A is output position (n, od, oh, ow) (M = N * D' * H' * W' rows), row kc of
B is output channel g * Kg + kc of group g (Kg = K / groups), and the reduction index r runs
over the taps in (t, h, w) order with the group's Cgp padded channels fastest:
r = ((t * kH + h) * kW + w) * Cgp + c. Cgp = C / groups rounded up to CHANNEL_VECTOR.
"""

# Only + - * // % & | and comparisons appear below, so the same functions run on Python ints
# (CPU tests), on torch integer tensors (vectorised emulation) and on FlyDSL Int32/Int64 values
# (inside the kernels). Divisions and remainders only ever see operands >= 0, so floor and
# truncating division agree; input coordinates may be negative (padding taps) but only meet
# + - * and comparisons. A minimum takes the caller's `select(cond, a, b)`: `cond.select(a, b)`
# in a kernel, torch.where in a test, a conditional expression on ints. Kernel sizes, strides,
# paddings, dilations, split_k and tile fields are compile-time Python ints everywhere.

from aiter.ops.shared.gemm_index import (
    K_BLOCK,
    MMA_MN,
    WAVE_SIZE,
    WAVES_PER_BLOCK,
    c_coord,
    k_run,
    lane_k_offset,
    split_k_range,
)

# Channels of a group are padded to a multiple of this many. Every lane's contiguous reduction
# run (k_run: 8 elements for the wave64 MFMA kernels, 16 for the wave32 WMMA kernels) starts at
# a multiple of its own length, so with Cgp a multiple of 16 a run never crosses from one tap
# (t, h, w) into the next, and one constant serves both flavours.
CHANNEL_VECTOR = 16
# Reduction depth per main-loop iteration: two 32-deep MMA k-blocks (four v_mfma 16x16x16 or
# two v_wmma 16x16x32 per 16x16 tile). A partial last step is masked, so there is no tail loop.
K_STEP = 64
BLOCKS_PER_STEP = K_STEP // K_BLOCK
# Threads per work-group of the one-element-per-thread kernels (pre-transpose, epilogue).
ELEMENTWISE_BLOCK = 256

__all__ = [
    "BLOCKS_PER_STEP",
    "CHANNEL_VECTOR",
    "ELEMENTWISE_BLOCK",
    "K_BLOCK",
    "K_STEP",
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


def run_start(kb, lane, wave_size: int):
    """Reduction index where a lane's contiguous run starts in k-block kb."""
    return kb * K_BLOCK + lane_k_offset(lane, wave_size)


def run_fits_a_tap(wave_size: int) -> bool:
    """Whether a lane's run, which starts at a multiple of its length, stays in one tap."""
    return CHANNEL_VECTOR % k_run(wave_size) == 0


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


def split_range(split, reduction, split_k: int, select):
    """(first k-block, number of main-loop steps, end of the split's reduction range).

    Split s owns k-blocks [s * nkb // split_k, (s + 1) * nkb // split_k) (split_k_range); its
    steps of BLOCKS_PER_STEP k-blocks cover them, and a run starting at or past the end (the
    next split's blocks, or past the reduction) is masked to zero. The end is a multiple of
    CHANNEL_VECTOR, so a run is either wholly before it or wholly at or past it.
    """
    nkb = num_k_blocks(reduction)
    kb_begin, kb_end = split_k_range(split, nkb, split_k)
    steps = (kb_end - kb_begin + BLOCKS_PER_STEP - 1) // BLOCKS_PER_STEP
    end = kb_end * K_BLOCK
    return kb_begin, steps, select(end < reduction, end, reduction)


def step_block(kb_begin, step, sub: int):
    """K-block `sub` of main-loop step `step`."""
    return kb_begin + step * BLOCKS_PER_STEP + sub


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


def acc_origin(origin_m, origin_n, wave_m, wave_n, lane, wave_size: int):
    """(GEMM row, column of the group) of a lane's accumulator element 0 in MMA tile (0, 0)."""
    return c_coord(origin_m, origin_n, wave_m, wave_n, 0, 0, lane, 0, wave_size)


def acc_coord(row0, col0, rep_m: int, rep_n: int, e: int):
    """(GEMM row, column) of accumulator element e in MMA tile (rep_m, rep_n), from the lane's
    acc_origin: the a16w16 c_coord, with the lane's part computed once."""
    return row0 + rep_m * MMA_MN + e, col0 + rep_n * MMA_MN


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
