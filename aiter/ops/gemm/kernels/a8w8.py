"""FlyDSL kernels and launchers for C[M, N] = XQ[M, K] @ WQ[N, K]^T with fp8/int8 inputs, scaled
per token and channel (preshuffled WQ) or per 128-block (DeepSeek-V3, WQ row-major or
preshuffled), split-K in one launch. The same kernel serves the microscaled (MX) GEMMs, whose
launchers are in mx.py.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared import mainloop
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.gemm_blocks import check_mma, check_tile_and_split_k, to_stream
from aiter.ops.shared.gemm_index_8bit import (
    K_BLOCKS_PER_SCALE_BLOCK,
    SCALE_BLOCK,
    SHUFFLE_K,
    SHUFFLE_N,
    is_last_arrival,
    semaphore_slot,
)
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.tiles import GemmTile, tile_grid

A8W8Tile = GemmTile  # the a8w8 kernels take the same tiles
K_BLOCK = mx.k_block(1)
MX_ELEMENTS_PER_BYTE = {"fp8": 1, "fp4": 2}


# Compiled, 256x64x256 and 256x128x256 (a 64 KiB A stage) spill 33 to 40 SGPRs into VGPR lanes
# on gfx942 and gfx1250; every 8-bit tile with a stage of 32 KiB or less compiles without.
MAX_A_STAGE_BYTES = 32 * 1024


def bpreshuffle_tile_problem(tile: A8W8Tile, mma: str) -> str | None:
    """Why a tile does not fit the arch's LDS or registers, or None."""
    stage = mx.a_stage_bytes(tile.tile_m, tile.tile_k, 1)
    if stage > MAX_A_STAGE_BYTES:
        return (
            f"stages {stage} bytes of A per k-tile: over {MAX_A_STAGE_BYTES}, the kernel runs out "
            "of SGPRs"
        )
    return mx.budget_problem(tile.tile_m, tile.tile_n, tile.tile_k, 1, 4, mma)


def blockscale_tile_problem(tile: A8W8Tile, mma: str) -> str | None:
    """As for bpreshuffle, with the k-tile's x scales staged in LDS (a slot per thread) and
    one A repeat's partial live beside the accumulators."""
    if SCALE_BLOCK % tile.tile_n:
        return (
            f"has {tile.tile_n} columns: a block must lie in one {SCALE_BLOCK}-column weight block"
        )
    if tile.tile_m > mx.threads(mma):
        return (
            f"has {tile.tile_m} rows, more than the {mx.threads(mma)} threads that stage x scales"
        )
    extra_lds = 4 * mx.threads(mma)
    extra_vgprs = mx.mma_repeats(tile.tile_m, tile.tile_n)[1] * mx.acc_rows_per_lane(mma)
    return mx.budget_problem(tile.tile_m, tile.tile_n, tile.tile_k, 1, 4, mma, extra_lds,
                             extra_vgprs)  # fmt: skip


BPRESHUFFLE_CANDIDATES = tile_grid((16, 32, 64, 128, 256), (64, 128, 256), (64, 128, 256))
BPRESHUFFLE_TILES: dict[str, tuple[A8W8Tile, ...]] = {
    mma: tuple(t for t in BPRESHUFFLE_CANDIDATES if bpreshuffle_tile_problem(t, mma) is None)
    for mma in ("mfma", "wmma")
}
# One scale block per k-tile (the kernel applies one x and one w scale per k-tile, so tile_k is
# the scale block); there is no gfx1250 (WMMA) blockscale kernel.
BLOCKSCALE_CANDIDATES = tile_grid((16, 32, 64, 128, 256), (64, 128), (SCALE_BLOCK,))
BLOCKSCALE_TILES: dict[str, tuple[A8W8Tile, ...]] = {
    "mfma": tuple(t for t in BLOCKSCALE_CANDIDATES if blockscale_tile_problem(t, "mfma") is None)
}
MMA_FLAVOURS = ("mfma", "wmma")
BPRESHUFFLE_K_MULTIPLE = K_BLOCK
BPRESHUFFLE_N_MULTIPLE = SHUFFLE_N
# The (rows of N, contiguous bytes of K) layout shuffle_weight must be called with for the kernel.
BPRESHUFFLE_LAYOUT = (SHUFFLE_N, SHUFFLE_K)
BLOCKSCALE_BLOCK = SCALE_BLOCK

INPUT_DTYPES = (torch.float8_e4m3fnuz, torch.float8_e4m3fn, torch.int8)
BLOCKSCALE_INPUT_DTYPES = (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
OUTPUT_DTYPES = (torch.bfloat16, torch.float16)
SEMAPHORE_DTYPES = (torch.int32, torch.int64)
SEMAPHORE_DTYPE_DOC = (
    "semaphore: a contiguous torch.int64 or torch.int32 tensor of semaphore_size(M, N, tile) "
    "entries, zeroed by the host once; the kernel increments and resets it in its own dtype "
    "(the dtype is part of the kernel's cache key, so each dtype compiles its own kernel)."
)


def k_major_x_scale_problem(m: int, k: int) -> str | None:
    """Why [K / 128, M] x scales are too many for the kernel's 32-bit buffer offsets, or None."""
    scales = m * (k // SCALE_BLOCK)
    if scales * 4 < mx.OFFSET_LIMIT:
        return None
    return (
        f"M * K / {SCALE_BLOCK} = {scales} scales are too many for the kernel's 32-bit buffer "
        f"offsets (at most {(mx.OFFSET_LIMIT - 1) // 4})"
    )


def semaphore_size(m: int, n: int, tile: A8W8Tile) -> int:
    """Entries of the split-K semaphore: one per output tile of the launch grid."""
    grid_x, grid_y, _ = mx.grid_size(m, n, tile.tile_m, tile.tile_n, 1)
    return grid_x * grid_y


# --- kernel building blocks ----------------------------------------------------------------

# The main loop is the shared one (aiter/ops/shared/mainloop.py); around it sit the scales, the
# split-K hand-off (one LDS word and two block barriers) and the epilogue. Helpers hold no
# dynamic `if` or runtime loop: FlyDSL rewrites those only inside the kernel function itself.


class Scales:
    """Where x_scale (from the block's first row) and w_scale start.

    Blockscale x scales are row-major [M, K / 128], or scale-block-major [K / 128, M]
    (x_k_major): there x_scale[row, sb] sits at sb * M + row, and the buffer runs from the
    block's first row to the end of the tensor (the launcher keeps its bytes below the
    out-of-range offset). MX: x_scale and w_scale are the shuffled E8M0 scales of A and B
    (mx.mx_scale_byte), buffers from the block's first row and column."""

    def __init__(self, p, x_scale, w_scale, num_sb, m, x_k_major: bool, mx_format: str = ""):
        if const_expr(mx_format):
            k_elems = p.k * MX_ELEMENTS_PER_BYTE[mx_format]
            self.mx_row_bytes = mx.mx_scale_groups(k_elems) * mx.MX_GROUP_BYTES
            self.mx_a = mainloop.buffer_rows(
                fx.get_iter(x_scale), p.origin_m, p.rows_m, self.mx_row_bytes, 1, p.tile_m
            )
            self.mx_b = mainloop.buffer_rows(
                fx.get_iter(w_scale), p.origin_n, p.rows_n, self.mx_row_bytes, 1, p.tile_n
            )
        self.x_buf = fx.get_iter(x_scale) + fx.Int64(p.origin_m) * fx.Int64(num_sb)
        if const_expr(x_k_major):
            nbytes = fx.Int32((num_sb * m - p.origin_m) * 4)
            # Uniform: the descriptor stays in SGPRs.
            nbytes = fx.Int32(rocdl.readfirstlane(fx.Int32.ir_type, nbytes))
            base = fx.get_iter(x_scale) + fx.Int64(p.origin_m)
            self.x_rows = rocdl.make_buffer_ptr(base, fx.Int64(nbytes))
        else:
            self.x_rows = mainloop.buffer_rows(
                fx.get_iter(x_scale), p.origin_m, p.rows_m, num_sb, 4, p.tile_m
            )
        self.w_buf = fx.get_iter(w_scale)
        self.num_sb = num_sb
        self.m = m
        self.x_k_major = x_k_major


def _load_x_scale(p, sc: Scales, sb):
    """x_scale[row, sb] of block row `tid` (thread tid < tile_m), for the LDS copy."""
    row = p.tid
    valid = (row < p.tile_m) & (row < p.rows_m)
    if const_expr(sc.x_k_major):
        return mainloop.load_word(sc.x_rows, valid, sb * sc.m + row)
    return mainloop.load_word(sc.x_rows, valid, row * sc.num_sb + sb)


def _store_x_scale(p, xs_lds, value):
    """Thread tid's slot of the k-tile's x scales in LDS (slots past tile_m are never read)."""
    fx.ptr_store(value, xs_lds + p.tid)


def _read_x_scales(p, xs_lds, rep_m: int):
    """x scales of the lane's accumulator rows of A repeat rep_m (consecutive rows), from LDS."""
    rows = mx.acc_rows_per_lane(p.mma)
    first = rep_m * mx.MMA_MN + mx.acc_row(p.lane, 0, p.mma)
    return fx.ptr_load(xs_lds + first, result_type=fx.Vector.make_type(rows, fx.Float32))


def _lane_x_scales(p, sc: Scales, sb):
    """x_scale[row, sb] of the lane's accumulator rows, per A repeat: [reps_m] fp32 vectors."""
    per_rep = []
    for i in range_constexpr(p.reps_m):
        elems = []
        for row in mainloop.lane_rows(p, i):
            elem = row * sc.num_sb + sb
            elems.append(mainloop.load_scalar(sc.x_buf, row < p.rows_m, elem, fx.Float32))
        per_rep.append(fx.Vector.from_elements(elems, fx.Float32))
    return per_rep


def _lane_w_scales(p, sc: Scales):
    """The lane's per-channel w_scale[0, col] per B repeat (bpreshuffle)."""
    values = []
    for j in range_constexpr(p.reps_n):
        col = p.origin_n + mainloop.lane_col(p, j)
        valid = mainloop.lane_col(p, j) < p.rows_n
        values.append(mainloop.load_scalar(sc.w_buf, valid, col, fx.Float32))
    return values


def _block_w_scale(p, sc: Scales, sb):
    """w_scale[origin_n // 128, sb]: a blockscale tile (tile_n <= 128, aligned) lies in one
    128-column weight block, so the block shares one w scale per k-tile (a uniform load)."""
    return fx.ptr_load(sc.w_buf + fx.Int64((p.origin_n // SCALE_BLOCK) * sc.num_sb + sb),
                       result_type=fx.Float32)  # fmt: skip


def _k_tile_scales(p, sc: Scales, sb, kb, kb_end, blockscale: bool, mx_format: str):
    """What this thread loads of the k-tile's scales (k-tile sb, first k-block kb) with the
    k-tile: blockscale, its x_scale for the LDS copy and the block's w scale; MX, the lane's
    E8M0 scale registers; bpreshuffle: nothing."""
    if const_expr(mx_format):
        return mainloop.load_mx_scales(p, sc.mx_a, sc.mx_b, sc.mx_row_bytes, kb, kb_end)
    if const_expr(not blockscale):
        return []
    return [_load_x_scale(p, sc, sb), _block_w_scale(p, sc, sb)]


def _k_tile(p, b_runs, accs, xs_lds, scales, blockscale: bool):
    """The MMAs of one k-tile; blockscale adds each A repeat's partial scaled by the x scales
    staged in LDS with the k-tile and the lane's w scales; MX scales each call's blocks."""
    if const_expr(p.mx_format is not None):
        return mainloop.mma_k_tile_mx(p, b_runs, accs, scales)
    if const_expr(not blockscale):
        return mainloop.mma_k_tile(p, b_runs, accs)
    w_scale = scales[1]
    accs = list(accs)
    for i in range_constexpr(p.reps_m):
        partial = mainloop.mma_k_tile_rep(p, b_runs, i, mainloop.zero_accs(p, count=p.reps_n))
        x_scales = _read_x_scales(p, xs_lds, i)
        for j in range_constexpr(p.reps_n):
            t = i * p.reps_n + j
            accs[t] = accs[t] + partial[j] * x_scales * w_scale
    return accs


def _row_tiles(p, accs, i: int, x_scales, w_scales, biases):
    """The fp32 tiles of A repeat i, scaled per token and channel when scales are given, plus
    the bias when given."""
    tiles = [accs[i * p.reps_n + j] for j in range_constexpr(p.reps_n)]
    if const_expr(x_scales is not None):
        tiles = [tiles[j] * x_scales[i] * w_scales[j] for j in range_constexpr(p.reps_n)]
    if const_expr(biases is not None):
        tiles = [tiles[j] + biases[j] for j in range_constexpr(p.reps_n)]
    return tiles


def _run_bias(p, bias, col):
    """bias[col..col+4] in fp32 for a 4-column run of the reduction (zeros past N)."""
    base = fx.get_iter(bias) + fx.Int64(p.origin_n)
    values = [
        mainloop.load_scalar(base, col + e < p.rows_n, col + e, bias.dtype).to(fx.Float32)
        for e in range_constexpr(4)
    ]
    return fx.Vector.from_elements(values, fx.Float32)


def _split_units(p, k, blockscale: bool, mx_format: str):
    """(units, k-blocks per unit) the splits divide: blockscale, its 128-wide scale blocks (a
    k-tile each); MX, whole k-tiles (K's tail is a k-tile loaded in part: each k-tile's
    scales are one load); else k-blocks."""
    if const_expr(mx_format):
        return (k + p.tile_k - 1) // p.tile_k, p.blocks
    if const_expr(blockscale):
        return k // SCALE_BLOCK, K_BLOCKS_PER_SCALE_BLOCK
    return k // K_BLOCK, 1


def _run_scales(p, sc: Scales, row, col):
    """(x_scale[row], w_scale[0, col..col+4]) for a 4-column fp32 run of the reduction."""
    x = mainloop.load_scalar(sc.x_buf, row < p.rows_m, row, fx.Float32)
    ws = [
        mainloop.load_scalar(sc.w_buf, col + e < p.rows_n, p.origin_n + col + e, fx.Float32)
        for e in range_constexpr(4)
    ]
    return x, fx.Vector.from_elements(ws, fx.Float32)


def _sum_partials(workspace, split_k: int, row, col, m, n):
    """sum over splits, in split order, of workspace[s, row, col..col+4] (fp32 run)."""
    pws = fx.get_iter(workspace)
    vec = fx.Vector.make_type(4, fx.Float32)
    total = None
    for s in range_constexpr(split_k):
        off = mx.workspace_offset(fx.Int64(s), fx.Int64(row), fx.Int64(col), fx.Int64(m),
                                  fx.Int64(n))  # fmt: skip
        part = fx.ptr_load(pws + off, result_type=vec)
        total = part if total is None else total + part
    return total


# --- the kernel: both families ---------------------------------------------------------------


@flyc.kernel
def gemm_a8w8_kernel(
    xq: fx.Tensor,
    wq: fx.Tensor,
    x_scale: fx.Tensor,
    w_scale: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    workspace: fx.Tensor,
    semaphore: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    blockscale: fx.Constexpr[bool],
    b_shuffled: fx.Constexpr[bool],
    x_k_major: fx.Constexpr[bool],
    mx_format: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
):
    """One block computes a tile_m x tile_n tile of C over split block_idx.z's share of K,
    through the shared main loop.

    bpreshuffle (blockscale False): WQ preshuffled, out = acc * x_scale[m] * w_scale[n], split
    partials unscaled. blockscale: each 128-wide scale block's partial is scaled by
    x_scale[m, kb] * w_scale[n // 128, kb] as it is added (its scales loaded with the k-tile,
    one k-tile ahead), so split partials are scaled. b_shuffled: WQ preshuffled (else
    row-major); x_k_major: blockscale's x_scale laid out [K / 128, M] (else [M, K / 128]).
    mx_format ("fp8", "fp4"; "" otherwise): XQ and WQ hold MX elements as bytes (K counted in
    bytes, tile_k too), x_scale and w_scale their shuffled E8M0 scales, applied by the scaled
    MFMA; split partials unscaled. has_bias: bias[n] (out's dtype) is added to the fp32 sum.

    Split-K hand-off for output tile T (semaphore slot T), split_k > 1:
    1. every thread stores its fp32 partials to workspace[split] and issues a release fence at
       agent scope, so its stores are visible device-wide before its later accesses;
    2. block barrier; thread 0 adds 1 to semaphore[T] (acq_rel, agent scope) and shares
       "previous count == split_k - 1" through one LDS word; block barrier;
    3. the last block to arrive issues an acquire fence at agent scope in every thread, sums
       workspace[0], ..., workspace[split_k - 1] in that order, applies the epilogue, stores C,
       and thread 0 resets semaphore[T] to 0 (atomic exchange). The other blocks exit.
    """
    split = fx.block_idx.z
    staged_dtype = out.dtype if const_expr(split_k == 1) else fx.Float32
    staged_bytes = mainloop.element_bytes(staged_dtype)
    allocator = fx.SharedAllocator()
    lds = mainloop.allocate_lds(allocator, tile_m, tile_n, tile_k, xq.dtype, 4, mma)
    p = mainloop.Pipeline(mma, tile_m, tile_n, tile_k, xq, wq, m, n, k, lds, b_shuffled=b_shuffled,
                          k_tail=bool(mx_format), mx_format=mx_format or None)  # fmt: skip
    if const_expr(split_k > 1):
        # Allocated up front: LDS is static for the whole kernel.
        flag = allocator.allocate(fx.Int32)
    xs_lds = None
    if const_expr(blockscale):
        # The k-tile's x scales, one slot per thread, staged beside A.
        slots = fx.Array[fx.Float32, mx.threads(mma), mx.CHUNK_BYTES]
        xs_lds = allocator.allocate(slots).peek().ptr
    num_sb = k // SCALE_BLOCK
    sc = Scales(p, x_scale, w_scale, num_sb if const_expr(blockscale) else 1, m, x_k_major,
                mx_format)  # fmt: skip
    units, unit_blocks = _split_units(p, k, blockscale, mx_format)
    sb_begin, sb_end = mx.split_k_range(split, units, split_k)
    kb_begin = sb_begin * unit_blocks
    kb_end = sb_end * unit_blocks
    tiles = mx.k_tiles(kb_begin, kb_end, p.blocks)

    accs = mainloop.zero_accs(p, fx.Float32 if const_expr(blockscale) else None)
    a_copy, b_next = mainloop.load_k_tile(p, kb_begin, kb_end)
    scales_next = _k_tile_scales(p, sc, sb_begin, kb_begin, kb_end, blockscale, mx_format)
    # Runtime loop; the reassigned values are carried across iterations.
    for t in range(fx.Int32(1), tiles, fx.Int32(1), unroll=1):
        b_cur = b_next
        scales_cur = scales_next
        fx.barrier()
        mainloop.store_a(p, a_copy)
        if const_expr(blockscale):
            _store_x_scale(p, xs_lds, scales_cur[0])
        fx.barrier()
        a_copy, b_next = mainloop.load_k_tile(p, kb_begin + t * p.blocks, kb_end)
        rocdl.sched_barrier(0)  # the scales after the operands: the youngest loads in flight
        kb_next = kb_begin + t * p.blocks
        scales_next = _k_tile_scales(p, sc, sb_begin + t, kb_next, kb_end, blockscale, mx_format)
        rocdl.sched_barrier(0)  # keep the next k-tile's loads ahead of this one's MMAs
        accs = _k_tile(p, b_cur, accs, xs_lds, scales_cur, blockscale)
    # The last k-tile (zeros when the split owns no k-block).
    fx.barrier()
    mainloop.store_a(p, a_copy)
    if const_expr(blockscale):
        _store_x_scale(p, xs_lds, scales_next[0])
    fx.barrier()
    accs = _k_tile(p, b_next, accs, xs_lds, scales_next, blockscale)
    if const_expr(xq.dtype == fx.Int8 and not mx_format):
        accs = [acc.to(fx.Float32) for acc in accs]

    # Epilogue: 16 rows at a time through each wave's LDS staging area, stored as 16-byte runs
    # (C, or the fp32 partial of this split); runs crossing column N store element by element.
    x_scales = None
    w_scales = None
    biases = None
    if const_expr(split_k == 1 and not blockscale and not mx_format):
        x_scales = _lane_x_scales(p, sc, 0)
        w_scales = _lane_w_scales(p, sc)
    if const_expr(split_k == 1 and has_bias):
        biases = mainloop.lane_bias(p, bias)
    out_lds = fx.recast_iter(staged_dtype, lds)
    dst = fx.get_iter(out) if const_expr(split_k == 1) else fx.get_iter(workspace)
    vec = mx.CHUNK_BYTES // staged_bytes
    fx.barrier()  # every wave is done reading the A stage the staging areas reuse
    for i in range_constexpr(p.reps_m):
        row_tiles = _row_tiles(p, accs, i, x_scales, w_scales, biases)
        mainloop.stage_out_rows(p, row_tiles, out_lds, staged_dtype)
        for values, row16, col, real in mainloop.staged_runs(p, out_lds, staged_dtype):
            row = p.origin_m + i * mx.MMA_MN + row16
            col = p.origin_n + col
            if const_expr(split_k > 1):
                off = mx.workspace_offset(
                    fx.Int64(split), fx.Int64(row), fx.Int64(col), fx.Int64(m), fx.Int64(n)
                )
            else:
                off = mx.c_offset(fx.Int64(row), fx.Int64(col), fx.Int64(n))
            if real & (row < m) & (col + vec <= n):
                fx.ptr_store(values, dst + off)
            else:
                if real & (row < m) & (col < n):
                    for e in range_constexpr(vec):
                        if col + e < n:
                            fx.ptr_store(values[e], dst + off + e)

    if const_expr(split_k > 1):
        fx.memory_fence(syncscope=rocdl.SyncScope.Agent, ordering=fx.AtomicOrdering.Release)
        fx.barrier()
        # grid_x from N, not gpu.grid_dim, which would need the ROCm device libraries.
        grid_x, _, _ = mx.grid_size(m, n, tile_m, tile_n, split_k)
        slot = fx.Int64(semaphore_slot(fx.block_idx.y, fx.block_idx.x, grid_x))
        sem_ptr = fx.get_iter(semaphore) + slot
        if p.tid == 0:
            previous = fx.atomic_add(
                sem_ptr,
                semaphore.dtype(1),
                syncscope=rocdl.SyncScope.Agent,
                ordering=fx.AtomicOrdering.AcqRel,
            )
            flag.poke(is_last_arrival(previous, split_k).select(fx.Int32(1), fx.Int32(0)))
        fx.barrier()
        if flag.peek() != 0:
            fx.memory_fence(syncscope=rocdl.SyncScope.Agent, ordering=fx.AtomicOrdering.Acquire)
            pout = fx.get_iter(out)
            for ri in range_constexpr(p.reps_m):
                for store_pass in range_constexpr(mx.out_store_passes(tile_n, 4, mma)):
                    rrow16, rcol, rreal = mx.out_read_coord(store_pass, p.lane, tile_n, 4, mma)
                    rrow = ri * mx.MMA_MN + rrow16  # block-relative
                    rcol = p.b_row0 + rcol
                    grow = p.origin_m + rrow
                    gcol = p.origin_n + rcol
                    if rreal & (grow < m) & (gcol < n):
                        total = _sum_partials(workspace, split_k, grow, gcol, m, n)
                        if const_expr(not blockscale and not mx_format):
                            xsv, wsv = _run_scales(p, sc, rrow, rcol)
                            total = total * xsv * wsv
                        if const_expr(has_bias):
                            total = total + _run_bias(p, bias, rcol)
                        cast = total.to(out.dtype)
                        roff = mx.c_offset(fx.Int64(grow), fx.Int64(gcol), fx.Int64(n))
                        if gcol + 4 <= n:
                            fx.ptr_store(cast, pout + roff)
                        else:
                            for re in range_constexpr(4):
                                if gcol + re < n:
                                    fx.ptr_store(cast[re], pout + roff + re)
            if p.tid == 0:
                fx.atomic_xchg(
                    sem_ptr,
                    semaphore.dtype(0),
                    syncscope=rocdl.SyncScope.Agent,
                    ordering=fx.AtomicOrdering.Monotonic,
                )


def launch_kernel(xq, wq, x_scale, w_scale, bias, out, workspace, semaphore, m, n, k, tile_m,
                  tile_n, tile_k, split_k, blockscale, b_shuffled, x_k_major, mx_format, has_bias,
                  mma, stream):  # fmt: skip
    """Launch gemm_a8w8_kernel over its grid (called inside a jit function)."""
    gemm_a8w8_kernel(
        xq, wq, x_scale, w_scale, bias, out, workspace, semaphore, m, n, k,
        tile_m, tile_n, tile_k, split_k, blockscale, b_shuffled, x_k_major, mx_format, has_bias,
        mma,
    ).launch(
        grid=mx.grid_size(m, n, tile_m, tile_n, split_k),
        block=(mx.threads(mma), 1, 1),
        stream=stream,
    )  # fmt: skip


@flyc.jit
def gemm_a8w8_bpreshuffle(
    xq: fx.Tensor,
    wq: fx.Tensor,
    x_scale: fx.Tensor,
    w_scale: fx.Tensor,
    out: fx.Tensor,
    workspace: fx.Tensor,
    semaphore: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    launch_kernel(xq, wq, x_scale, w_scale, x_scale, out, workspace, semaphore, m, n, k,
                  tile_m, tile_n, tile_k, split_k, False, True, False, "", False, mma, stream)  # fmt: skip


@flyc.jit
def gemm_a8w8_blockscale(
    xq: fx.Tensor,
    wq: fx.Tensor,
    x_scale: fx.Tensor,
    w_scale: fx.Tensor,
    out: fx.Tensor,
    workspace: fx.Tensor,
    semaphore: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    launch_kernel(xq, wq, x_scale, w_scale, x_scale, out, workspace, semaphore, m, n, k,
                  tile_m, tile_n, tile_k, split_k, True, False, False, "", False, mma, stream)  # fmt: skip


@flyc.jit
def gemm_a8w8_blockscale_bpreshuffle(
    xq: fx.Tensor,
    wq: fx.Tensor,
    x_scale: fx.Tensor,
    w_scale: fx.Tensor,
    out: fx.Tensor,
    workspace: fx.Tensor,
    semaphore: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    launch_kernel(xq, wq, x_scale, w_scale, x_scale, out, workspace, semaphore, m, n, k,
                  tile_m, tile_n, tile_k, split_k, True, True, True, "", False, mma, stream)  # fmt: skip


# --- host launchers ------------------------------------------------------------------------


def _check_common(
    family: str,
    tiles: dict[str, tuple[A8W8Tile, ...]],
    xq: torch.Tensor,
    wq: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor | None,
    semaphore: torch.Tensor | None,
    tile: A8W8Tile,
    split_k: int,
    mma: str,
) -> tuple[int, int, int]:
    """Checks shared by both families; returns (M, N, K)."""
    check_mma(mma, MMA_FLAVOURS)
    if mma not in tiles:
        raise NotImplementedError(
            f"mma: the {family} kernels exist for {tuple(tiles)} only, not {mma!r} "
            "(there is no gfx1250 WMMA blockscale kernel)"
        )
    check_tile_and_split_k(tiles, tile, split_k, mma)
    if xq.dim() != 2 or wq.dim() != 2:
        raise ValueError(
            f"xq, wq: expected 2-D [M, K] and [N, K], got {list(xq.shape)} and {list(wq.shape)}"
        )
    if xq.dtype not in INPUT_DTYPES:
        raise ValueError(f"xq: expected dtype in {INPUT_DTYPES}, got {xq.dtype}")
    if wq.dtype != xq.dtype:
        raise ValueError(f"wq: expected dtype {xq.dtype} (same as xq), got {wq.dtype}")
    if out.dtype not in OUTPUT_DTYPES:
        raise ValueError(f"out: expected dtype in {OUTPUT_DTYPES}, got {out.dtype}")
    m, k = (int(d) for d in xq.shape)
    n = int(wq.shape[0])
    for name, tensor in (("xq", xq), ("wq", wq), ("out", out)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
    if m < 1 or n < 1:
        raise ValueError(f"xq, wq: M and N must be >= 1, got M = {m}, N = {n}")
    if int(wq.shape[1]) != k:
        raise ValueError(f"wq: expected shape [N, {k}], got {list(wq.shape)}")
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out: expected shape [{m}, {n}], got {list(out.shape)}")
    if max(tile.tile_m, tile.tile_n) * k >= mx.OFFSET_LIMIT:
        raise ValueError(
            f"xq: K = {k} is too large for 32-bit buffer offsets within a {tile.tile_m}x"
            f"{tile.tile_n} tile (tile rows x K bytes must stay below {mx.OFFSET_LIMIT})"
        )
    check_split_buffers(split_k, workspace, semaphore, m, n, tile)
    return m, n, k


def check_split_buffers(split_k: int, workspace, semaphore, m: int, n: int, tile) -> None:
    """With split_k > 1: workspace float32 [split_k, M, N] and a 1-D semaphore of at least
    semaphore_size(M, N, tile) entries (SEMAPHORE_DTYPES), both contiguous."""
    if split_k == 1:
        return
    if workspace is None or workspace.dtype != torch.float32:
        raise ValueError(
            f"workspace: expected a float32 [split_k, M, N] tensor when split_k > 1, got "
            f"{None if workspace is None else workspace.dtype}"
        )
    if tuple(workspace.shape) != (split_k, m, n):
        raise ValueError(
            f"workspace: expected shape [{split_k}, {m}, {n}], got {list(workspace.shape)}"
        )
    if semaphore is None or semaphore.dtype not in SEMAPHORE_DTYPES:
        raise ValueError(
            f"semaphore: expected an int64 or int32 tensor when split_k > 1, got "
            f"{None if semaphore is None else semaphore.dtype}"
        )
    if not (workspace.is_contiguous() and semaphore.is_contiguous()):
        raise ValueError("workspace, semaphore: expected contiguous tensors")
    slots = semaphore_size(m, n, tile)
    if semaphore.dim() != 1 or int(semaphore.shape[0]) < slots:
        raise ValueError(
            f"semaphore: expected a 1-D tensor of at least {slots} entries "
            f"(semaphore_size), got shape {list(semaphore.shape)}"
        )


def _check_scale(name: str, scale: torch.Tensor, shape: tuple[int, int]) -> None:
    if not scale.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")
    if scale.dtype != torch.float32:
        raise ValueError(f"{name}: expected dtype torch.float32, got {scale.dtype}")
    if tuple(scale.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(scale.shape)}")


def launch_gemm_a8w8_bpreshuffle(
    xq: torch.Tensor,
    wq: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor | None,
    semaphore: torch.Tensor | None,
    *,
    tile: A8W8Tile,
    split_k: int,
    mma: str,
    stream: Any | None = None,
) -> None:
    """Launch out = (XQ @ WQ^T) * x_scale[m] * w_scale[n] cast to out.dtype, in one kernel.

    Contract (the host picks the flavour for the arch):

    - xq [M, K]: float8_e4m3fnuz (gfx942), float8_e4m3fn (gfx950, gfx1250) or int8, row-major.
      wq [N, K]: same dtype, preshuffled by shuffle_weight(w, BPRESHUFFLE_LAYOUT).
    - x_scale float32 [M, 1], w_scale float32 [1, N]. Accumulation is fp32 (int8: exact i32,
      converted to fp32), then acc * x_scale[m] * w_scale[n] (left to right) is cast to out.
    - out [M, N]: bfloat16 or float16. Any M >= 1 (rows past M are never stored).
      N % BPRESHUFFLE_N_MULTIPLE (16) == 0, K % BPRESHUFFLE_K_MULTIPLE (64) == 0, K > 0.
    - split_k == 1: workspace and semaphore are None. split_k > 1: workspace float32
      [split_k, M, N] and semaphore (SEMAPHORE_DTYPE_DOC) of semaphore_size(M, N, tile) zeroed
      entries. Split s owns k-blocks [s * nkb // split_k, (s + 1) * nkb // split_k) of the
      nkb = K / 64 k-blocks and stores its UNSCALED fp32 partial; the last block of each tile to
      arrive sums the partials in split order, scales, casts, stores and re-zeroes its slot.
    - mma: "mfma" (gfx942/gfx950: v_mfma_f32_16x16x32_fp8_fp8, v_mfma_i32_16x16x32_i8) or
      "wmma" (gfx1250: v_wmma_f32_16x16x64_fp8_fp8, v_wmma_i32_16x16x64_iu8).
    - All tensors contiguous; they may be CPU tensors or FakeTensors when COMPILE_ONLY=1.
    """
    m, n, k = _check_common(
        "bpreshuffle", BPRESHUFFLE_TILES, xq, wq, out, workspace, semaphore, tile, split_k, mma
    )
    if k <= 0 or k % BPRESHUFFLE_K_MULTIPLE:
        raise ValueError(
            f"xq: K = xq.shape[1] must be a positive multiple of {BPRESHUFFLE_K_MULTIPLE}, got {k}"
        )
    if n % BPRESHUFFLE_N_MULTIPLE:
        raise ValueError(
            f"wq: N = wq.shape[0] must be a multiple of {BPRESHUFFLE_N_MULTIPLE}, got {n}"
        )
    _check_scale("x_scale", x_scale, (m, 1))
    _check_scale("w_scale", w_scale, (1, n))
    # With split_k == 1 the kernel never touches workspace or semaphore; x_scale stands in.
    ws_arg = workspace if split_k > 1 else x_scale
    sem_arg = semaphore if split_k > 1 else x_scale
    xq, wq, x_scale, w_scale, out, ws_arg, sem_arg = kernel_tensors(
        xq, wq, x_scale, w_scale, out, ws_arg, sem_arg
    )
    gemm_a8w8_bpreshuffle(
        xq, wq, x_scale, w_scale, out, ws_arg, sem_arg, m, n, k,
        tile_m=tile.tile_m, tile_n=tile.tile_n, tile_k=tile.tile_k, split_k=split_k, mma=mma,
        stream=to_stream(stream),
    )  # fmt: skip


def launch_gemm_a8w8_blockscale(
    xq: torch.Tensor,
    wq: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor | None,
    semaphore: torch.Tensor | None,
    *,
    tile: A8W8Tile,
    split_k: int,
    mma: str,
    stream: Any | None = None,
) -> None:
    """Launch out = sum_kb (XQ @ WQ^T over k-block kb) * x_scale[m, kb] * w_scale[n // 128, kb].

    Contract:

    - xq [M, K] and wq [N, K]: both float8_e4m3fnuz (gfx942) or both float8_e4m3fn (gfx950),
      row-major (WQ is NOT preshuffled).
    - x_scale float32 [M, K / 128] (1 x 128 activation blocks), w_scale float32
      [N / 128, K / 128] (128 x 128 weight blocks). Each 128-wide block's fp32 partial is
      multiplied by x_scale then w_scale (left to right) and accumulated in fp32.
    - out [M, N]: bfloat16 or float16. Any M >= 1; N % 128 == 0 and K % 128 == 0, K > 0.
    - split_k as for the bpreshuffle launcher, except that splits own whole 128-wide scale
      blocks and store ALREADY SCALED fp32 partials.
    - mma: "mfma" only (gfx942/gfx950, v_mfma_f32_16x16x32_fp8_fp8); "wmma" raises
      NotImplementedError.
    """
    _launch_blockscale(gemm_a8w8_blockscale, "blockscale", xq, wq, x_scale, w_scale, out,
                       workspace, semaphore, tile, split_k, mma, stream)  # fmt: skip


def launch_gemm_a8w8_blockscale_bpreshuffle(
    xq: torch.Tensor,
    wq: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor | None,
    semaphore: torch.Tensor | None,
    *,
    tile: A8W8Tile,
    split_k: int,
    mma: str,
    stream: Any | None = None,
) -> None:
    """Launch the blockscale GEMM with a preshuffled WQ and scale-block-major x scales.

    Contract: as launch_gemm_a8w8_blockscale, except that
    - wq is preshuffled by shuffle_weight(w, BPRESHUFFLE_LAYOUT) (N and K multiples of 128
      include its 16x16 blocks);
    - x_scale is float32 [K / 128, M], contiguous: x_scale[kb, m] scales row m's k-block kb
      (aiter's bpreshuffle layout of the [M, K / 128] scales), and its bytes stay below the
      32-bit buffer offsets (M * K / 128 * 4 < OFFSET_LIMIT).
    """
    _launch_blockscale(gemm_a8w8_blockscale_bpreshuffle, "blockscale_bpreshuffle", xq, wq,
                       x_scale, w_scale, out, workspace, semaphore, tile, split_k, mma, stream,
                       x_k_major=True)  # fmt: skip


def _launch_blockscale(jit_fn, family: str, xq, wq, x_scale, w_scale, out, workspace, semaphore,
                       tile, split_k, mma, stream, *, x_k_major: bool = False) -> None:  # fmt: skip
    m, n, k = _check_common(
        family, BLOCKSCALE_TILES, xq, wq, out, workspace, semaphore, tile, split_k, mma
    )
    if xq.dtype not in BLOCKSCALE_INPUT_DTYPES:
        raise ValueError(f"xq: expected dtype in {BLOCKSCALE_INPUT_DTYPES}, got {xq.dtype}")
    if k <= 0 or k % BLOCKSCALE_BLOCK:
        raise ValueError(
            f"xq: K = xq.shape[1] must be a positive multiple of {BLOCKSCALE_BLOCK}, got {k}"
        )
    if n % BLOCKSCALE_BLOCK:
        raise ValueError(f"wq: N = wq.shape[0] must be a multiple of {BLOCKSCALE_BLOCK}, got {n}")
    num_sb = k // BLOCKSCALE_BLOCK
    if x_k_major:
        _check_scale("x_scale", x_scale, (num_sb, m))
        problem = k_major_x_scale_problem(m, k)
        if problem is not None:
            raise ValueError(f"x_scale: {problem}")
    else:
        _check_scale("x_scale", x_scale, (m, num_sb))
    _check_scale("w_scale", w_scale, (n // BLOCKSCALE_BLOCK, num_sb))
    ws_arg = workspace if split_k > 1 else x_scale
    sem_arg = semaphore if split_k > 1 else x_scale
    xq, wq, x_scale, w_scale, out, ws_arg, sem_arg = kernel_tensors(
        xq, wq, x_scale, w_scale, out, ws_arg, sem_arg
    )
    jit_fn(
        xq, wq, x_scale, w_scale, out, ws_arg, sem_arg, m, n, k,
        tile_m=tile.tile_m, tile_n=tile.tile_n, tile_k=tile.tile_k, split_k=split_k, mma=mma,
        stream=to_stream(stream),
    )  # fmt: skip
