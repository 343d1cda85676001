"""FlyDSL kernels and launchers for C[M, N] = XQ[M, K] @ WQ[N, K]^T with fp8/int8 inputs, scaled
per token and channel (preshuffled WQ) or per 128-block (DeepSeek-V3), split-K in one launch.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared.gemm_blocks import (
    Tile,
    check_mma,
    check_tile_and_split_k,
    clamp,
    coord,
    load_run,
    to_stream,
    ws_offset,
    zero_accs,
)
from aiter.ops.shared.gemm_index_8bit import (
    K_BLOCK,
    K_BLOCKS_PER_SCALE_BLOCK,
    SCALE_BLOCK,
    SHUFFLE_K,
    SHUFFLE_N,
    WAVE_SIZE,
    WAVES_PER_BLOCK,
    c_offset,
    grid_size,
    in_bounds,
    is_last_arrival,
    k_loop_counts,
    num_tiles,
    semaphore_slot,
    split_k_range,
    w_scale_offset,
    x_scale_offset,
)
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.mma_8bit import acc_dtype as _acc_dtype
from aiter.ops.shared.mma_8bit import k_blocks as _k_blocks
from aiter.ops.shared.tiles import GemmTile, tile_grid

A8W8Tile = GemmTile  # the a8w8 kernels take the same tiles


BPRESHUFFLE_TILES: dict[str, tuple[A8W8Tile, ...]] = {
    "mfma": tile_grid((16, 32, 64, 128), (64, 128), (64, 128)),
    "wmma": tile_grid((16, 32, 64, 128), (64, 128), (64, 128)),
}
# One scale block per main-loop iteration; there is no gfx1250 (WMMA) blockscale kernel.
BLOCKSCALE_TILES: dict[str, tuple[A8W8Tile, ...]] = {
    "mfma": tile_grid((16, 32, 64, 128), (64, 128), (SCALE_BLOCK,)),
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


def semaphore_size(m: int, n: int, tile: A8W8Tile) -> int:
    """Entries of the split-K semaphore: one per output tile of the launch grid."""
    return num_tiles(m, n, tile.tile_m, tile.tile_n)


# --- kernel building blocks ----------------------------------------------------------------

# Every lane loads its MMA operands straight from global memory (a contiguous K run of one XQ
# row and of one WQ row per MMA repeat), so the main loops use no LDS and no barrier. Only the
# split-K hand-off uses one LDS word and two block barriers. Helpers hold no dynamic `if` or
# runtime loop: FlyDSL rewrites those into scf ops only inside the kernel function itself.


def _add_partials(tile: Tile, workspace, split, totals):
    """totals + workspace[split] at the lane's elements (clamped: past-the-end ones are dropped)."""
    pws = fx.get_iter(workspace)
    totals = list(totals)
    for i in range_constexpr(tile.reps_m):
        for j in range_constexpr(tile.reps_n):
            elems = []
            for e in range_constexpr(tile.rows_per_lane):
                row, col = coord(tile, i, j, e)
                off = ws_offset(tile, split, clamp(row, tile.m), clamp(col, tile.n))
                elems.append(load_run(pws, off, 1, fx.Float32)[0])
            t = i * tile.reps_n + j
            totals[t] = totals[t] + fx.Vector.from_elements(elems, fx.Float32)
    return totals


def _row_scales(tile: Tile, i: int, pxs, kb, num_scale_kb):
    """[rows_per_lane] vector of x_scale values of the lane's rows in MMA repeat i."""
    elems = []
    for e in range_constexpr(tile.rows_per_lane):
        row, _ = coord(tile, i, 0, e)
        off = x_scale_offset(fx.Int64(clamp(row, tile.m)), kb, num_scale_kb)
        elems.append(load_run(pxs, off, 1, fx.Float32)[0])
    return fx.Vector.from_elements(elems, fx.Float32)


def _col_scale(tile: Tile, j: int, pws, kb, num_scale_kb, per_block: bool):
    """w_scale of the lane's column in MMA repeat j (scalar fp32): w_scale[col // 128, kb] for
    128x128 weight blocks, else the per-channel w_scale[0, col]."""
    _, col = coord(tile, 0, j, 0)
    col = fx.Int64(clamp(col, tile.n))
    off = w_scale_offset(col, kb, num_scale_kb) if const_expr(per_block) else col
    return load_run(pws, off, 1, fx.Float32)[0]


def _scale_per_token_channel(tile: Tile, values, x_scale, w_scale):
    """values * x_scale[row] * w_scale[col] (bpreshuffle epilogue; scales [M, 1] and [1, N])."""
    pxs = fx.get_iter(x_scale)
    pws = fx.get_iter(w_scale)
    zero, one = fx.Int64(0), fx.Int64(1)
    col_scales = [_col_scale(tile, j, pws, zero, one, False) for j in range_constexpr(tile.reps_n)]
    scaled = []
    for i in range_constexpr(tile.reps_m):
        rows = _row_scales(tile, i, pxs, zero, one)
        for j in range_constexpr(tile.reps_n):
            scaled.append(values[i * tile.reps_n + j] * rows * col_scales[j])
    return scaled


def _scale_block(tile, mma, in_dtype, pa, pb, pxs, pws, a_rows, b_rows, k, sb, num_sb, accs):
    """accs + (XQ @ WQ^T over scale block sb) * x_scale[row, sb] * w_scale[col // 128, sb]."""
    partial = zero_accs(len(accs), tile.rows_per_lane, fx.Float32)
    partial = _k_blocks(
        mma, in_dtype, False, pa, pb, a_rows, b_rows, k,
        sb * K_BLOCKS_PER_SCALE_BLOCK, K_BLOCKS_PER_SCALE_BLOCK, tile.lane, partial,
    )  # fmt: skip
    sb64 = fx.Int64(sb)
    col_scales = [
        _col_scale(tile, j, pws, sb64, num_sb, True) for j in range_constexpr(tile.reps_n)
    ]
    accs = list(accs)
    for i in range_constexpr(tile.reps_m):
        rows = _row_scales(tile, i, pxs, sb64, num_sb)
        for j in range_constexpr(tile.reps_n):
            t = i * tile.reps_n + j
            accs[t] = accs[t] + partial[t] * rows * col_scales[j]
    return accs


# --- the kernel: both families ---------------------------------------------------------------


@flyc.kernel
def gemm_a8w8_kernel(
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
    blockscale: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
):
    """One block computes a tile_m x tile_n tile of C over split block_idx.z's share of K.

    bpreshuffle (blockscale False): WQ preshuffled, out = acc * x_scale[m] * w_scale[n], split
    partials unscaled. blockscale: WQ row-major, each 128-wide scale block's partial is scaled by
    x_scale[m, kb] * w_scale[n // 128, kb] as it is added, so split partials are scaled.

    Split-K hand-off for output tile T (semaphore slot T), split_k > 1:
    1. every thread stores its fp32 partials to workspace[split] and issues a release fence at
       agent scope, so its stores are visible device-wide before its later accesses;
    2. block barrier; thread 0 adds 1 to semaphore[T] (acq_rel, agent scope) and shares
       "previous count == split_k - 1" through one LDS word; block barrier;
    3. the last block to arrive issues an acquire fence at agent scope in every thread, sums
       workspace[0], ..., workspace[split_k - 1] in that order, applies the epilogue, stores C,
       and thread 0 resets semaphore[T] to 0 (atomic exchange). The other blocks exit.
    """
    tile = Tile(mma, tile_m, tile_n, m, n)
    in_dtype = xq.dtype
    a_rows, b_rows = tile.operand_rows()
    pa = fx.get_iter(xq)
    pb = fx.get_iter(wq)
    k64 = fx.Int64(k)
    if const_expr(split_k > 1):
        # Allocated up front: LDS is static for the whole kernel.
        flag = fx.SharedAllocator().allocate(fx.Int32)

    if const_expr(blockscale):
        pxs = fx.get_iter(x_scale)
        pws = fx.get_iter(w_scale)
        num_sb = k // SCALE_BLOCK
        num_sb64 = fx.Int64(num_sb)
        sb_begin, sb_end = split_k_range(fx.block_idx.z, num_sb, split_k)
        accs = zero_accs(tile.reps_m * tile.reps_n, tile.rows_per_lane, fx.Float32)
        for sb in range(sb_begin, sb_end, fx.Int32(1)):
            accs = _scale_block(
                tile, mma, in_dtype, pa, pb, pxs, pws, a_rows, b_rows, k64, sb, num_sb64, accs
            )
    else:
        kb_begin, kb_end = split_k_range(fx.block_idx.z, k // K_BLOCK, split_k)
        blocks_per_iter = tile_k // K_BLOCK
        iters, tail_begin = k_loop_counts(kb_begin, kb_end, blocks_per_iter)
        accs = zero_accs(tile.reps_m * tile.reps_n, tile.rows_per_lane, _acc_dtype(in_dtype))
        # Runtime loops; `accs` is reassigned in the body, so it is carried across iterations.
        for it in range(fx.Int32(0), iters, fx.Int32(1)):
            accs = _k_blocks(
                mma, in_dtype, True, pa, pb, a_rows, b_rows, k64,
                kb_begin + it * blocks_per_iter, blocks_per_iter, tile.lane, accs,
            )  # fmt: skip
        if const_expr(blocks_per_iter > 1):
            # Fewer than blocks_per_iter k-blocks are left over: one block per iteration.
            for kb in range(tail_begin, kb_end, fx.Int32(1)):
                accs = _k_blocks(
                    mma, in_dtype, True, pa, pb, a_rows, b_rows, k64, kb, 1, tile.lane, accs
                )
        if const_expr(in_dtype == fx.Int8):
            accs = [acc.to(fx.Float32) for acc in accs]

    pout = fx.get_iter(out)
    n64 = fx.Int64(n)
    if const_expr(split_k == 1):
        if const_expr(blockscale):
            final = accs
        else:
            final = _scale_per_token_channel(tile, accs, x_scale, w_scale)
        for i in range_constexpr(tile.reps_m):
            for j in range_constexpr(tile.reps_n):
                cast = final[i * tile.reps_n + j].to(out.dtype)
                for e in range_constexpr(tile.rows_per_lane):
                    row, col = coord(tile, i, j, e)
                    if in_bounds(row, col, m, n):
                        fx.ptr_store(cast[e], pout + c_offset(fx.Int64(row), fx.Int64(col), n64))
    else:
        pws_partial = fx.get_iter(workspace)
        for i in range_constexpr(tile.reps_m):
            for j in range_constexpr(tile.reps_n):
                acc = accs[i * tile.reps_n + j]
                for e in range_constexpr(tile.rows_per_lane):
                    row, col = coord(tile, i, j, e)
                    if in_bounds(row, col, m, n):
                        fx.ptr_store(
                            acc[e], pws_partial + ws_offset(tile, fx.block_idx.z, row, col)
                        )
        fx.memory_fence(syncscope=rocdl.SyncScope.Agent, ordering=fx.AtomicOrdering.Release)
        fx.barrier()
        # grid_x from N, not gpu.grid_dim, which would need the ROCm device libraries.
        grid_x, _, _ = grid_size(m, n, tile_m, tile_n, split_k)
        slot = fx.Int64(semaphore_slot(fx.block_idx.y, fx.block_idx.x, grid_x))
        sem_ptr = fx.get_iter(semaphore) + slot
        if tile.tid == 0:
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
            totals = zero_accs(tile.reps_m * tile.reps_n, tile.rows_per_lane, fx.Float32)
            for s in range(fx.Int32(0), fx.Int32(split_k), fx.Int32(1)):
                totals = _add_partials(tile, workspace, s, totals)
            if const_expr(blockscale):
                reduced = totals
            else:
                reduced = _scale_per_token_channel(tile, totals, x_scale, w_scale)
            for ri in range_constexpr(tile.reps_m):
                for rj in range_constexpr(tile.reps_n):
                    rcast = reduced[ri * tile.reps_n + rj].to(out.dtype)
                    for re in range_constexpr(tile.rows_per_lane):
                        rrow, rcol = coord(tile, ri, rj, re)
                        if in_bounds(rrow, rcol, m, n):
                            fx.ptr_store(
                                rcast[re], pout + c_offset(fx.Int64(rrow), fx.Int64(rcol), n64)
                            )
            if tile.tid == 0:
                fx.atomic_xchg(
                    sem_ptr,
                    semaphore.dtype(0),
                    syncscope=rocdl.SyncScope.Agent,
                    ordering=fx.AtomicOrdering.Monotonic,
                )


def _launch(xq, wq, x_scale, w_scale, out, workspace, semaphore, m, n, k, tile_m, tile_n,
            tile_k, split_k, blockscale, mma, stream):  # fmt: skip
    gemm_a8w8_kernel(
        xq, wq, x_scale, w_scale, out, workspace, semaphore, m, n, k,
        tile_m, tile_n, tile_k, split_k, blockscale, mma,
    ).launch(
        grid=grid_size(m, n, tile_m, tile_n, split_k),
        block=(WAVES_PER_BLOCK * WAVE_SIZE[mma], 1, 1),
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
    _launch(xq, wq, x_scale, w_scale, out, workspace, semaphore, m, n, k,
            tile_m, tile_n, tile_k, split_k, False, mma, stream)  # fmt: skip


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
    _launch(xq, wq, x_scale, w_scale, out, workspace, semaphore, m, n, k,
            tile_m, tile_n, tile_k, split_k, True, mma, stream)  # fmt: skip


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
    if split_k > 1:
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
    return m, n, k


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
    m, n, k = _check_common(
        "blockscale", BLOCKSCALE_TILES, xq, wq, out, workspace, semaphore, tile, split_k, mma
    )
    if xq.dtype not in BLOCKSCALE_INPUT_DTYPES:
        raise ValueError(f"xq: expected dtype in {BLOCKSCALE_INPUT_DTYPES}, got {xq.dtype}")
    if k <= 0 or k % BLOCKSCALE_BLOCK:
        raise ValueError(
            f"xq: K = xq.shape[1] must be a positive multiple of {BLOCKSCALE_BLOCK}, got {k}"
        )
    if n % BLOCKSCALE_BLOCK:
        raise ValueError(f"wq: N = wq.shape[0] must be a multiple of {BLOCKSCALE_BLOCK}, got {n}")
    _check_scale("x_scale", x_scale, (m, k // BLOCKSCALE_BLOCK))
    _check_scale("w_scale", w_scale, (n // BLOCKSCALE_BLOCK, k // BLOCKSCALE_BLOCK))
    ws_arg = workspace if split_k > 1 else x_scale
    sem_arg = semaphore if split_k > 1 else x_scale
    xq, wq, x_scale, w_scale, out, ws_arg, sem_arg = kernel_tensors(
        xq, wq, x_scale, w_scale, out, ws_arg, sem_arg
    )
    gemm_a8w8_blockscale(
        xq, wq, x_scale, w_scale, out, ws_arg, sem_arg, m, n, k,
        tile_m=tile.tile_m, tile_n=tile.tile_n, tile_k=tile.tile_k, split_k=split_k, mma=mma,
        stream=to_stream(stream),
    )  # fmt: skip
