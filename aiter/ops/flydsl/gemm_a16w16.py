"""FlyDSL kernels and launchers for C[M, N] = A[M, K] @ B[N, K]^T (+ bias[N]) with bf16/fp16
inputs: MFMA for gfx942/gfx950, WMMA for gfx1250, and a split-K reduction kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl

from .gemm_a16w16_index import (
    K_BLOCK,
    REDUCE_BLOCK,
    WAVE_SIZE,
    WAVES_PER_BLOCK,
    acc_rows_per_lane,
    block_origin,
    c_coord,
    c_offset,
    grid_size,
    in_bounds,
    k_loop_counts,
    k_run,
    mma_repeats,
    operand_offset,
    operand_row,
    reduce_element,
    reduce_grid_size,
    split_k_range,
    wave_origin,
    workspace_offset,
)
from .tiles import GemmTile, tile_grid

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


def _load_run(base, offset, length: int, dtype):
    """Load `length` contiguous elements starting at base + offset as one vector."""
    return fx.ptr_load(base + offset, result_type=fx.Vector.make_type(length, dtype))


def _sub_vector(vec, start: int, length: int):
    return vec.shuffle(vec, [start + i for i in range(length)])


def _mma(flavour: str, in_dtype, a_run, b_run, acc):
    """Accumulate one k-block (K_BLOCK elements of each lane's run) into a 16x16 tile."""
    if const_expr(flavour == "mfma"):
        acc_ty = fx.Vector.make_type(4, fx.Float32)
        # Two 16x16x16 steps; step s uses elements [4s, 4s + 4) of the 8-element run.
        for step in range_constexpr(2):
            a4 = _sub_vector(a_run, 4 * step, 4)
            b4 = _sub_vector(b_run, 4 * step, 4)
            if const_expr(in_dtype == fx.BFloat16):
                res = rocdl.mfma_f32_16x16x16bf16_1k(
                    acc_ty, [a4.bitcast(fx.Int16), b4.bitcast(fx.Int16), acc]
                )
            else:
                res = rocdl.mfma_f32_16x16x16f16(acc_ty, [a4, b4, acc])
            acc = fx.Vector(res)
        return acc
    acc_ty = fx.Vector.make_type(8, fx.Float32)
    if const_expr(in_dtype == fx.BFloat16):
        op = rocdl.wmma_f32_16x16x32_bf16
    else:
        op = rocdl.wmma_f32_16x16x32_f16
    return fx.Vector(op(acc_ty, a_run.ir_value(), b_run.ir_value(), acc.ir_value()).result)


def _k_blocks(
    flavour, in_dtype, pa, pb, a_rows, b_rows, k, kb0, count: int, lane, accs, reps_m, reps_n
):
    """Run `count` consecutive k-blocks starting at kb0 over all MMA tiles of a wave."""
    wsz = WAVE_SIZE[flavour]
    run = k_run(wsz)
    kb0 = fx.Int64(kb0)
    a_runs = []
    b_runs = []
    # Issue every load of the step before the first MMA so they overlap.
    for kb in range_constexpr(count):
        a_runs.append(
            [
                _load_run(pa, operand_offset(a_rows[i], k, kb0 + kb, lane, wsz), run, in_dtype)
                for i in range_constexpr(reps_m)
            ]
        )
        b_runs.append(
            [
                _load_run(pb, operand_offset(b_rows[j], k, kb0 + kb, lane, wsz), run, in_dtype)
                for j in range_constexpr(reps_n)
            ]
        )
    accs = list(accs)
    for kb in range_constexpr(count):
        for i in range_constexpr(reps_m):
            for j in range_constexpr(reps_n):
                t = i * reps_n + j
                accs[t] = _mma(flavour, in_dtype, a_runs[kb][i], b_runs[kb][j], accs[t])
    return accs


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
    wsz = WAVE_SIZE[mma]
    reps_m, reps_n = mma_repeats(tile_m, tile_n)
    rows_per_lane = acc_rows_per_lane(wsz)
    in_dtype = a.dtype

    tid = fx.thread_idx.x
    wave = tid // wsz
    lane = tid % wsz
    split = fx.block_idx.z
    origin_m, origin_n = block_origin(fx.block_idx.y, fx.block_idx.x, tile_m, tile_n)
    wave_m, wave_n = wave_origin(wave, tile_m, tile_n)

    # Rows past M (columns past N) read the last valid row instead; their results are
    # dropped by the store predicate, so the clamp only keeps loads in bounds.
    k64 = fx.Int64(k)
    a_rows = []
    for i in range_constexpr(reps_m):
        r = operand_row(origin_m, wave_m, i, lane)
        a_rows.append(fx.Int64((r < m).select(r, m - 1)))
    b_rows = []
    for j in range_constexpr(reps_n):
        r = operand_row(origin_n, wave_n, j, lane)
        b_rows.append(fx.Int64((r < n).select(r, n - 1)))

    pa = fx.get_iter(a)
    pb = fx.get_iter(b)
    kb_begin, kb_end = split_k_range(split, k // K_BLOCK, split_k)
    blocks_per_iter = tile_k // K_BLOCK
    iters, tail_begin = k_loop_counts(kb_begin, kb_end, blocks_per_iter)

    zero = fx.Vector.filled(rows_per_lane, 0.0, fx.Float32)
    accs = [zero for _ in range_constexpr(reps_m * reps_n)]
    # Runtime loops; `accs` is reassigned in the body, so it is carried across iterations.
    for it in range(fx.Int32(0), iters, fx.Int32(1)):
        accs = _k_blocks(
            mma,
            in_dtype,
            pa,
            pb,
            a_rows,
            b_rows,
            k64,
            kb_begin + it * blocks_per_iter,
            blocks_per_iter,
            lane,
            accs,
            reps_m,
            reps_n,
        )
    if const_expr(blocks_per_iter > 1):
        # Fewer than blocks_per_iter k-blocks are left over: one block per iteration.
        for kb in range(tail_begin, kb_end, fx.Int32(1)):
            accs = _k_blocks(
                mma, in_dtype, pa, pb, a_rows, b_rows, k64, kb, 1, lane, accs, reps_m, reps_n
            )

    pc = fx.get_iter(c)
    out_dtype = c.dtype
    for j in range_constexpr(reps_n):
        if const_expr(has_bias):
            _, col = c_coord(origin_m, origin_n, wave_m, wave_n, 0, j, lane, 0, wsz)
            safe_col = (col < n).select(col, n - 1)
            bias_val = _load_run(fx.get_iter(bias), fx.Int64(safe_col), 1, bias.dtype)
            bias_f32 = bias_val.to(fx.Float32)[0]
        for i in range_constexpr(reps_m):
            acc = accs[i * reps_n + j]
            if const_expr(has_bias):
                acc = acc + bias_f32
            vals = acc.to(out_dtype)
            for e in range_constexpr(rows_per_lane):
                row, col = c_coord(origin_m, origin_n, wave_m, wave_n, i, j, lane, e, wsz)
                if in_bounds(row, col, m, n):
                    if const_expr(split_k > 1):
                        off = workspace_offset(
                            fx.Int64(split),
                            fx.Int64(row),
                            fx.Int64(col),
                            fx.Int64(m),
                            fx.Int64(n),
                        )
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
        total = _load_run(pws, fx.Int64(idx), 1, fx.Float32)
        for s in range_constexpr(1, split_k):
            total = total + _load_run(pws, plane * s + fx.Int64(idx), 1, fx.Float32)
        if const_expr(has_bias):
            total = total + _load_run(fx.get_iter(bias), fx.Int64(col), 1, bias.dtype).to(
                fx.Float32
            )
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
    if mma not in SUPPORTED_TILES:
        raise ValueError(f"mma: expected one of {MMA_FLAVOURS}, got {mma!r}")
    if tile not in SUPPORTED_TILES[mma]:
        supported = ", ".join(f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in SUPPORTED_TILES[mma])
        raise ValueError(f"tile: {tile} is not supported for mma={mma!r}; supported: {supported}")
    if not isinstance(split_k, int) or isinstance(split_k, bool) or split_k < 1:
        raise ValueError(f"split_k: expected an int >= 1, got {split_k!r}")
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
    fx_stream = stream if isinstance(stream, fx.Stream) else fx.Stream(stream)
    common = dict(tile_m=tile.tile_m, tile_n=tile.tile_n, tile_k=tile.tile_k, split_k=split_k)
    if split_k == 1:
        gemm_a16w16(
            a, b, bias_arg, out, m, n, k, **common, has_bias=has_bias, mma=mma, stream=fx_stream
        )
        return
    gemm_a16w16(a, b, out, workspace, m, n, k, **common, has_bias=False, mma=mma, stream=fx_stream)
    gemm_a16w16_splitk_reduce(
        workspace, bias_arg, out, m, n, split_k=split_k, has_bias=has_bias, stream=fx_stream
    )
