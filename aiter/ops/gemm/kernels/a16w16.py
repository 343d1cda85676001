"""FlyDSL kernels and launchers for C[M, N] = A[M, K] @ B[N, K]^T (+ bias[N]) with bf16/fp16
inputs: MFMA for gfx942/gfx950, WMMA for gfx1250, and a split-K reduction kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared import mainloop
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.gemm_blocks import check_mma, check_tile_and_split_k, load_run, to_stream
from aiter.ops.shared.gemm_index import REDUCE_BLOCK, reduce_element, reduce_grid_size
from aiter.ops.shared.kernel_tensors import kernel_tensor, kernel_tensors
from aiter.ops.shared.tiles import GemmTile, tile_grid

if TYPE_CHECKING:
    import torch

K_BLOCK = mx.k_block(2)
# Tiles the kernel is written for; SUPPORTED_TILES keeps those that fit every arch of a flavour.
CANDIDATE_TILES = tile_grid((16, 32, 64, 128, 256), (64, 128, 256), (32, 64, 128, 256))


def tile_problem(tile: GemmTile, mma: str) -> str | None:
    """Why a tile does not fit the arch's LDS or registers (fp32 epilogue, the widest), or None."""
    return mx.budget_problem(tile.tile_m, tile.tile_n, tile.tile_k, 2, 4, mma)


SUPPORTED_TILES: dict[str, tuple[GemmTile, ...]] = {
    mma: tuple(t for t in CANDIDATE_TILES if tile_problem(t, mma) is None)
    for mma in ("mfma", "wmma")
}
MMA_FLAVOURS = tuple(SUPPORTED_TILES)
N_MULTIPLE = 1
K_MULTIPLE = K_BLOCK
BIAS_DTYPE_RULE = "same dtype as out"


@flyc.kernel
def gemm_a16w16_kernel(
    a: fx.Tensor,
    b: fx.Tensor,
    bias: fx.Tensor,
    c: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    has_bias: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
):
    """One block computes a tile_m x tile_n tile of C (or of split `block_idx.z`'s partial
    when split_k > 1, then `c` is the fp32 workspace and has_bias is False), through the
    shared main loop (aiter/ops/shared/mainloop.py)."""
    split = fx.block_idx.z
    out_dtype = c.dtype
    out_bytes = mainloop.element_bytes(out_dtype)
    lds = mainloop.allocate_lds(
        fx.SharedAllocator(), tile_m, tile_n, tile_k, a.dtype, out_bytes, mma
    )
    p = mainloop.Pipeline(mma, tile_m, tile_n, tile_k, a, b, m, n, k, lds)
    kb_begin, kb_end = mx.split_k_range(split, k // K_BLOCK, split_k)
    tiles = mx.k_tiles(kb_begin, kb_end, p.blocks)

    if const_expr(has_bias):
        bias_f32 = mainloop.lane_bias(p, bias)  # loaded first, used by the epilogue
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
        accs = mainloop.mma_k_tile(p, b_cur, accs)
    # The last k-tile (zeros when the split owns no k-block).
    fx.barrier()
    mainloop.store_a(p, a_copy)
    fx.barrier()
    accs = mainloop.mma_k_tile(p, b_next, accs)
    rocdl.sched_barrier(0)  # the epilogue's conversions after the MMAs: fewer live registers

    # Epilogue: 16 rows at a time through each wave's own LDS staging area, stored as
    # 16-byte runs along rows; runs that cross column N store element by element.
    out_lds = fx.recast_iter(out_dtype, lds)
    pc = fx.get_iter(c)
    vec = mx.CHUNK_BYTES // out_bytes
    fx.barrier()  # every wave is done reading the A stage the staging areas reuse
    for i in range_constexpr(p.reps_m):
        tiles = [accs[i * p.reps_n + j] for j in range_constexpr(p.reps_n)]
        if const_expr(has_bias):
            tiles = [tiles[j] + bias_f32[j] for j in range_constexpr(p.reps_n)]
        mainloop.stage_out_rows(p, tiles, out_lds, out_dtype)
        for values, row16, col, real in mainloop.staged_runs(p, out_lds, out_dtype):
            row = p.origin_m + i * mx.MMA_MN + row16
            col = p.origin_n + col
            if const_expr(split_k > 1):
                off = mx.workspace_offset(
                    fx.Int64(split), fx.Int64(row), fx.Int64(col), fx.Int64(m), fx.Int64(n)
                )
            else:
                off = mx.c_offset(fx.Int64(row), fx.Int64(col), fx.Int64(n))
            if real & (row < m) & (col + vec <= n):
                fx.ptr_store(values, pc + off)
            else:
                if real & (row < m) & (col < n):
                    for e in range_constexpr(vec):
                        if col + e < n:
                            fx.ptr_store(values[e], pc + off + e)


@flyc.jit
def gemm_a16w16(
    a: fx.Tensor,
    b: fx.Tensor,
    bias: fx.Tensor,
    c: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    split_k: fx.Constexpr[int],
    has_bias: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    grid = mx.grid_size(m, n, tile_m, tile_n, split_k)
    gemm_a16w16_kernel(
        a, b, bias, c, m, n, k, tile_m, tile_n, tile_k, split_k, has_bias, mma
    ).launch(grid=grid, block=(mx.threads(mma), 1, 1), stream=stream)


@flyc.kernel
def gemm_a16w16_splitk_reduce_kernel(
    ws: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    split_k: fx.Constexpr[int],
    has_bias: fx.Constexpr[bool],
):
    """out[r, c] = cast(sum_s ws[s, r, c] + bias[c]), one thread per element of out."""
    idx, col = reduce_element(fx.block_idx.x, fx.thread_idx.x, n)
    if idx < m * n:
        pws = fx.get_iter(ws)
        plane = fx.Int64(m) * fx.Int64(n)
        total = load_run(pws, fx.Int64(idx), 1, fx.Float32)
        for s in range_constexpr(1, split_k):
            total = total + load_run(pws, plane * s + fx.Int64(idx), 1, fx.Float32)
        if const_expr(has_bias):
            total = total + load_run(fx.get_iter(bias), fx.Int64(col), 1, bias.dtype).to(fx.Float32)
        fx.ptr_store(total.to(out.dtype)[0], fx.get_iter(out) + fx.Int64(idx))


@flyc.jit
def gemm_a16w16_splitk_reduce(
    ws: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    split_k: fx.Constexpr[int],
    has_bias: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    gemm_a16w16_splitk_reduce_kernel(ws, bias, out, m, n, split_k, has_bias).launch(
        grid=(reduce_grid_size(m, n), 1, 1), block=(REDUCE_BLOCK, 1, 1), stream=stream
    )


def launch_gemm_a16w16(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    workspace: torch.Tensor | None,
    *,
    tile: GemmTile,
    split_k: int,
    mma: str,
    stream: Any | None = None,
) -> None:
    """Launch out = A @ B^T (+ bias): the GEMM kernel, then the reduction when split_k > 1.

    Contract (the host validates dtypes and contiguity; this checks tile, split_k and shapes):

    - a [M, K] and b [N, K]: both bfloat16 or both float16, row-major contiguous; fp32
      accumulation.
    - out [M, N], contiguous, bfloat16, float16 or float32: its dtype decides the cast.
    - bias [N] or None: same dtype as out (BIAS_DTYPE_RULE), added in fp32 before the cast.
    - M >= 1 and N >= 1 are any values (N_MULTIPLE is 1): rows past M and columns past N are
      never written, and loads read row M - 1 (N - 1) in their place. K is a positive
      multiple of K_MULTIPLE (32). M * N + 255 < 2**31.
    - split_k == 1: workspace is None and the GEMM kernel writes out with the bias epilogue.
      split_k > 1: workspace is a contiguous float32 [split_k, M, N] tensor. K is cut into
      32-wide k-blocks and split s owns k-blocks [s * nkb // split_k, (s + 1) * nkb // split_k),
      so any split_k works for any valid K; every split writes its whole partial (zeros for
      an empty range), and the reduction sums them, adds the bias, casts and writes out.
    - mma: "mfma" (wave64, v_mfma_f32_16x16x16) for gfx942/gfx950 only, "wmma" (wave32,
      v_wmma_f32_16x16x32) for gfx1250 only; an MFMA kernel built for gfx1250 aborts LLVM.
    - stream: None (default stream), an fx.Stream, a raw handle int, or any object with a
      `cuda_stream` attribute (torch.cuda.Stream, the dry run's stand-in).
    - a, b, bias, out and workspace may be CPU tensors or FakeTensors when COMPILE_ONLY=1:
      the kernels compile and nothing runs.
    """
    check_mma(mma, MMA_FLAVOURS)
    check_tile_and_split_k(SUPPORTED_TILES, tile, split_k, mma)
    if split_k > 1 and workspace is None:
        raise ValueError("workspace: expected an fp32 [split_k, M, N] tensor when split_k > 1")
    m, k = (int(d) for d in a.shape)
    n = int(b.shape[0])
    if k <= 0 or k % K_MULTIPLE:
        raise ValueError(f"a: K = a.shape[1] must be a positive multiple of {K_MULTIPLE}, got {k}")
    if tuple(b.shape) != (n, k):
        raise ValueError(f"b: expected shape [N, {k}], got {list(b.shape)}")
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out: expected shape [{m}, {n}], got {list(out.shape)}")
    if max(tile.tile_m, tile.tile_n) * k * a.element_size() >= mx.OFFSET_LIMIT:
        raise ValueError(
            f"a: K = {k} is too large for 32-bit buffer offsets within a {tile.tile_m}x"
            f"{tile.tile_n} tile (tile rows x K x {a.element_size()} bytes must stay below "
            f"{mx.OFFSET_LIMIT})"
        )
    if m * n + REDUCE_BLOCK > 2**31:
        raise ValueError(f"out: M * N = {m * n} is too large for 32-bit element indices")
    has_bias = bias is not None
    # Without a bias the kernel never reads its bias argument; `out` stands in for it.
    bias_arg = bias if has_bias else out
    fx_stream = to_stream(stream)
    common = dict(tile_m=tile.tile_m, tile_n=tile.tile_n, tile_k=tile.tile_k, split_k=split_k)
    a, b, bias_arg, out = kernel_tensors(a, b, bias_arg, out)
    if split_k == 1:
        gemm_a16w16(
            a, b, bias_arg, out, m, n, k, **common, has_bias=has_bias, mma=mma, stream=fx_stream
        )
        return
    workspace = kernel_tensor(workspace)
    gemm_a16w16(a, b, out, workspace, m, n, k, **common, has_bias=False, mma=mma, stream=fx_stream)
    gemm_a16w16_splitk_reduce(
        workspace, bias_arg, out, m, n, split_k=split_k, has_bias=has_bias, stream=fx_stream
    )
