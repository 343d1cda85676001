"""FlyDSL kernels and launchers for C[M, N] = A[M, K] @ B[N, K]^T (+ bias[N]) with bf16/fp16
inputs: MFMA for gfx942/gfx950, WMMA for gfx1250, and a split-K reduction kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

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
from aiter.ops.shared.gemm_index import (
    K_BLOCK,
    REDUCE_BLOCK,
    WAVE_SIZE,
    WAVES_PER_BLOCK,
    c_offset,
    grid_size,
    in_bounds,
    k_loop_counts,
    reduce_element,
    reduce_grid_size,
    split_k_range,
)
from aiter.ops.shared.kernel_tensors import kernel_tensor, kernel_tensors
from aiter.ops.shared.mma_16bit import k_blocks as _k_blocks
from aiter.ops.shared.tiles import GemmTile, tile_grid

if TYPE_CHECKING:
    import torch


SUPPORTED_TILES: dict[str, tuple[GemmTile, ...]] = {
    "mfma": tile_grid((16, 32, 64, 128), (64, 128), (32, 64)),
    "wmma": tile_grid((16, 32, 64, 128), (64, 128), (32, 64)),
}
MMA_FLAVOURS = tuple(SUPPORTED_TILES)
N_MULTIPLE = 1
K_MULTIPLE = K_BLOCK
BIAS_DTYPE_RULE = "same dtype as out"

# Both flavours load each lane's MMA operands straight from global memory (a contiguous K run
# of one A row and of one B row per lane), so the kernels use no LDS and no barrier.


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
    when split_k > 1, then `c` is the fp32 workspace and has_bias is False)."""
    # block_idx.z is read before Tile reads block_idx.y and .x, as the kernel always did.
    split = fx.block_idx.z
    tile = Tile(mma, tile_m, tile_n, m, n)
    in_dtype = a.dtype
    k64 = fx.Int64(k)
    a_rows, b_rows = tile.operand_rows()

    pa = fx.get_iter(a)
    pb = fx.get_iter(b)
    kb_begin, kb_end = split_k_range(split, k // K_BLOCK, split_k)
    blocks_per_iter = tile_k // K_BLOCK
    iters, tail_begin = k_loop_counts(kb_begin, kb_end, blocks_per_iter)

    accs = zero_accs(tile.reps_m * tile.reps_n, tile.rows_per_lane, fx.Float32)
    # Runtime loops; `accs` is reassigned in the body, so it is carried across iterations.
    for it in range(fx.Int32(0), iters, fx.Int32(1)):
        accs = _k_blocks(
            mma, in_dtype, pa, pb, a_rows, b_rows, k64,
            kb_begin + it * blocks_per_iter, blocks_per_iter, tile.lane, accs,
        )  # fmt: skip
    if const_expr(blocks_per_iter > 1):
        # Fewer than blocks_per_iter k-blocks are left over: one block per iteration.
        for kb in range(tail_begin, kb_end, fx.Int32(1)):
            accs = _k_blocks(mma, in_dtype, pa, pb, a_rows, b_rows, k64, kb, 1, tile.lane, accs)

    pc = fx.get_iter(c)
    out_dtype = c.dtype
    for j in range_constexpr(tile.reps_n):
        if const_expr(has_bias):
            _, col = coord(tile, 0, j, 0)
            bias_val = load_run(fx.get_iter(bias), fx.Int64(clamp(col, n)), 1, bias.dtype)
            bias_f32 = bias_val.to(fx.Float32)[0]
        for i in range_constexpr(tile.reps_m):
            acc = accs[i * tile.reps_n + j]
            if const_expr(has_bias):
                acc = acc + bias_f32
            vals = acc.to(out_dtype)
            for e in range_constexpr(tile.rows_per_lane):
                row, col = coord(tile, i, j, e)
                if in_bounds(row, col, m, n):
                    if const_expr(split_k > 1):
                        off = ws_offset(tile, split, row, col)
                    else:
                        off = c_offset(fx.Int64(row), fx.Int64(col), fx.Int64(n))
                    fx.ptr_store(vals[e], pc + off)


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
    grid = grid_size(m, n, tile_m, tile_n, split_k)
    gemm_a16w16_kernel(
        a, b, bias, c, m, n, k, tile_m, tile_n, tile_k, split_k, has_bias, mma
    ).launch(grid=grid, block=(WAVES_PER_BLOCK * WAVE_SIZE[mma], 1, 1), stream=stream)


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
