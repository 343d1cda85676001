"""FlyDSL kernels and launchers of the two MoE expert GEMM stages over sorted token blocks.

Stage 1: out1[t * topk + k] = act(x_t . w1[e, gate rows], x_t . w1[e, up rows]) (* weight) for
every routed (token t, slot k, expert e); with ksplit > 1 the splits add scaled partials into an
fp32 workspace and an activation kernel finishes. Stage 2: y = out1 row . w2[e] (+ bias)
(* weight), added atomically into out[t] ("atomic") or written per routed row to an fp32
workspace that a top-k reduction sums into out ("reduce"). bf16/fp16 inputs use the a16w16
MMAs, fp8 inputs the a8w8 MMAs on preshuffled weights; MFMA on gfx942/gfx950, WMMA on gfx1250.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.moe.kernels.sorting_index import MAX_TOKENS, MAX_TOPK
from aiter.ops.moe.kernels.stages_index import (
    ACTIVATIONS,
    ELEMENTWISE_BLOCK,
    GATE_MODES,
    MODEL_DIM_MULTIPLE,
    SWIGLU_ALPHA,
    SWIGLU_LIMIT,
    a1_row,
    a2_row,
    activate,
    block_active,
    chunk_inside,
    chunk_source,
    clamp_col,
    elementwise_grid,
    elementwise_index,
    entry_slot,
    entry_token,
    entry_valid,
    expert_row,
    expert_valid,
    full_k_blocks,
    gate_row,
    has_k_tail,
    inter_dim_multiple,
    k_split_range,
    matrix_offset,
    routed_row,
    row_block,
    stage1_acc_index,
    stage1_grid,
    stage1_workspace_shape,
    stage1_ws_gate_col,
    stage1_ws_up_col,
    stage2_grid,
    stage2_workspace_shape,
    tail_chunk,
    tail_chunk_k,
    topk_ws_offset,
    up_row,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared import gemm_blocks, mma_8bit, mma_16bit
from aiter.ops.shared import gemm_index as a16_index
from aiter.ops.shared import gemm_index_8bit as fp8_index
from aiter.ops.shared.gemm_blocks import Tile, check_mma, coord, load_run, to_stream, zero_accs
from aiter.ops.shared.gemm_index import K_BLOCK as A16_K_BLOCK
from aiter.ops.shared.gemm_index import WAVE_SIZE, WAVES_PER_BLOCK, k_loop_counts, operand_row
from aiter.ops.shared.gemm_index_8bit import K_BLOCK as FP8_K_BLOCK
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.launch_args import (
    check_bool,
    check_choice,
    check_int,
    check_rank,
    check_tensor,
)
from aiter.ops.shared.tiles import GemmTile, tile_grid

__all__ = [
    "ACTIVATIONS",
    "A16_DTYPES",
    "FP8_DTYPES",
    "GATE_MODES",
    "MMA_FLAVOURS",
    "MODEL_DIM_MULTIPLE",
    "OUT_DTYPES",
    "STAGE_MODES",
    "STAGE_TILES",
    "SWIGLU_ALPHA",
    "SWIGLU_LIMIT",
    "WORKSPACE_DTYPE",
    "inter_dim_multiple",
    "launch_moe_stage1",
    "launch_moe_stage2",
    "stage1_workspace_shape",
    "stage2_workspace_shape",
]

# tile_m is the sorting block size (block_m); tile_k is a multiple of both K blocks (32, 64).
STAGE_TILES: dict[str, tuple[GemmTile, ...]] = {
    "mfma": tile_grid((16, 32, 64), (64, 128), (64, 128)),
    "wmma": tile_grid((16, 32, 64), (64, 128), (64, 128)),
}
MMA_FLAVOURS = tuple(STAGE_TILES)
STAGE_MODES = ("atomic", "reduce")
WORKSPACE_DTYPE = torch.float32
A16_DTYPES = (torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
# Stage-2 output and fp8 stage-1 output dtypes.
OUT_DTYPES = (torch.bfloat16, torch.float16)

_LOG2E = 1.4426950408889634

# Every lane loads its MMA operands straight from global memory (one contiguous K run of one A
# row and of one weight row per MMA repeat), as the GEMM kernels do: no LDS, no barrier. Helpers
# hold no dynamic `if` or runtime loop: FlyDSL rewrites those only inside kernel functions.


def _select(cond, a, b):
    return cond.select(a, b)


def _scalar(base, offset, dtype):
    """One element at base + offset."""
    return load_run(base, fx.Int64(offset), 1, dtype)[0]


def _exp(x):
    """e**x through the hardware base-2 exponential (v_exp_f32)."""
    return fx.Float32(rocdl.exp2(fx.Float32.ir_type, (x * _LOG2E).ir_value()))


def _fmin(x, bound):
    return fx.min(x, fx.Float32(bound))


def _fmax(x, bound):
    return fx.max(x, fx.Float32(bound))


def _activate(activation: str, g, u):
    return activate(activation, g, u, _exp, _fmin, _fmax)


def _k_block(quant: bool) -> int:
    return FP8_K_BLOCK if quant else A16_K_BLOCK


def _k_step(quant, mma, in_dtype, pa, pb, a_rows, b_rows, k, kb0, count: int, lane, accs):
    """`count` k-blocks from kb0 over every MMA tile of the wave (fp8: preshuffled weights)."""
    if const_expr(quant):
        return mma_8bit.k_blocks(
            mma, in_dtype, True, pa, pb, a_rows, b_rows, k, kb0, count, lane, accs
        )
    return mma_16bit.k_blocks(mma, in_dtype, pa, pb, a_rows, b_rows, k, kb0, count, lane, accs)


def _tail_run(base, offset, row, k, kb, k_block: int, lane_offset, run: int, chunk: int, dtype):
    """A lane's K run of `row` in the k-block kb that K ends inside, `chunk` elements per load:
    a chunk past K loads element 0 of the row (in bounds) and is zeroed. offset(row, kk) is the
    element offset of [row, kk]."""
    zero = fx.Vector.filled(chunk, 0, dtype)
    parts = []
    for c in range_constexpr(run // chunk):
        kk = tail_chunk_k(kb, k_block, lane_offset, chunk, c)
        part = load_run(base, offset(row, chunk_source(kk, k, _select)), chunk, dtype)
        parts.append(_select(chunk_inside(kk, k), part, zero))
    whole = parts[0]
    for c in range_constexpr(1, len(parts)):
        whole = whole.shuffle(parts[c], list(range(chunk * (c + 1))))
    return whole


def _k_tail_step(quant, mma, in_dtype, pa, pb, a_rows, b_rows, k, kb, lane, accs):
    """The k-block kb that K ends inside, over every MMA tile of the wave: the full k-block
    step with every lane's chunks past K zeroed in both operands (fp8: preshuffled weights)."""
    wsz = WAVE_SIZE[mma]
    index, mma_steps = (fp8_index, mma_8bit) if const_expr(quant) else (a16_index, mma_16bit)
    run = index.k_run(wsz)
    chunk = tail_chunk(run, 1 if const_expr(quant) else 2)
    lane_offset = index.lane_k_offset(lane, wsz)

    def step(a_run, b_run, acc):
        return mma_steps.mma_step(mma, in_dtype, a_run, b_run, acc)

    def row_major(row, kk):
        return matrix_offset(row, kk, k)

    def weight(row, kk):
        if const_expr(quant):
            return fp8_index.shuffled_offset(row, kk, k)
        return matrix_offset(row, kk, k)

    def loader(base, offset):
        def load(row, kb_):
            return _tail_run(
                base, offset, row, k, kb_, index.K_BLOCK, lane_offset, run, chunk, in_dtype
            )

        return load

    return gemm_blocks.k_blocks(
        step, loader(pa, row_major), loader(pb, weight), a_rows, b_rows, kb, 1, accs
    )


def _entry(psid, row, m, topk):
    """(token, slot, valid) of sorted row `row`."""
    entry = _scalar(psid, row, fx.Int32)
    token, slot = entry_token(entry), entry_slot(entry)
    return token, slot, entry_valid(token, slot, m, topk)


def _stage1_operand_rows(tile: Tile, psid, expert, m, inter, gate_mode: str):
    """(A rows, weight rows) of the lane's K runs: hidden rows of the block's tokens, then the
    gate rows and the up rows of the expert for the lane's columns (clamped past inter)."""
    a_rows = []
    for i in range_constexpr(tile.reps_m):
        entry = _scalar(psid, operand_row(tile.origin_m, tile.wave_m, i, tile.lane), fx.Int32)
        a_rows.append(fx.Int64(a1_row(entry_token(entry), m, _select)))
    two_inter = inter * 2
    gate_rows, up_rows = [], []
    for j in range_constexpr(tile.reps_n):
        col = clamp_col(operand_row(tile.origin_n, tile.wave_n, j, tile.lane), inter, _select)
        gate_rows.append(fx.Int64(expert_row(expert, gate_row(col, inter, gate_mode), two_inter)))
        up_rows.append(fx.Int64(expert_row(expert, up_row(col, inter, gate_mode), two_inter)))
    return a_rows, gate_rows + up_rows


def _stage1_column_info(tile: Tile, expert, inter, gate_mode: str, pws, pbias, quant: bool,
                        bias: bool):  # fmt: skip
    """Per MMA repeat j: (the lane's column, gate and up w1_scale, gate and up bias), the
    scales and biases None when unused."""
    two_inter = inter * 2
    columns = []
    for j in range_constexpr(tile.reps_n):
        _, col = coord(tile, 0, j, 0)
        ccol = clamp_col(col, inter, _select)
        g_row = expert_row(expert, gate_row(ccol, inter, gate_mode), two_inter)
        u_row = expert_row(expert, up_row(ccol, inter, gate_mode), two_inter)
        g_scale = u_scale = g_bias = u_bias = None
        if const_expr(quant):
            g_scale, u_scale = _scalar(pws, g_row, fx.Float32), _scalar(pws, u_row, fx.Float32)
        if const_expr(bias):
            g_bias, u_bias = _scalar(pbias, g_row, fx.Float32), _scalar(pbias, u_row, fx.Float32)
        columns.append((col, g_scale, u_scale, g_bias, u_bias))
    return columns


def _stage2_column_info(tile: Tile, expert, model_dim, pws, pbias, quant: bool, bias: bool):
    """Per MMA repeat j: (the lane's column, its w2_scale, its bias2), None when unused."""
    columns = []
    for j in range_constexpr(tile.reps_n):
        _, col = coord(tile, 0, j, 0)
        w_row = expert_row(expert, clamp_col(col, model_dim, _select), model_dim)
        scale = _scalar(pws, w_row, fx.Float32) if const_expr(quant) else None
        bias_value = _scalar(pbias, w_row, fx.Float32) if const_expr(bias) else None
        columns.append((col, scale, bias_value))
    return columns


def _stage2_operand_rows(tile: Tile, psid, expert, m, topk, model_dim):
    """(a2 rows of the block's routed pairs, w2 rows of the lane's columns)."""
    a_rows = []
    for i in range_constexpr(tile.reps_m):
        token, slot, _ = _entry(
            psid, operand_row(tile.origin_m, tile.wave_m, i, tile.lane), m, topk
        )
        a_rows.append(fx.Int64(a2_row(token, slot, m, topk, _select)))
    b_rows = []
    for j in range_constexpr(tile.reps_n):
        col = clamp_col(operand_row(tile.origin_n, tile.wave_n, j, tile.lane), model_dim, _select)
        b_rows.append(fx.Int64(expert_row(expert, col, model_dim)))
    return a_rows, b_rows


@flyc.kernel
def moe_stage1_kernel(
    a: fx.Tensor,
    w1: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    out: fx.Tensor,
    a_scale: fx.Tensor,
    w1_scale: fx.Tensor,
    bias1: fx.Tensor,
    m: fx.Int32,
    inter: fx.Int32,
    model_dim: fx.Int32,
    num_experts: fx.Int32,
    topk: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    ksplit: fx.Constexpr[int],
    activation: fx.Constexpr[str],
    gate_mode: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    doweight: fx.Constexpr[bool],
    quant: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
):
    """Block (x, y, z) computes tile_n columns of gate and up for the tile_m rows of sorted block
    y over split z's k-blocks; ksplit == 1 finishes out1, else `out` is the fp32 workspace."""
    split = fx.block_idx.z
    tile = Tile(mma, tile_m, tile_n, m, inter)
    block = fx.block_idx.y
    psid = fx.get_iter(sorted_ids)
    num_valid_rows = _scalar(fx.get_iter(num_valid_ids), 0, fx.Int32)
    expert = _scalar(fx.get_iter(sorted_expert_ids), block, fx.Int32)
    if block_active(block, tile_m, num_valid_rows) & expert_valid(expert, num_experts):
        in_dtype = a.dtype
        k64 = fx.Int64(model_dim)
        pa = fx.get_iter(a)
        pb = fx.get_iter(w1)
        a_rows, b_rows = _stage1_operand_rows(tile, psid, expert, m, inter, gate_mode)
        k_block = _k_block(quant)
        blocks_per_iter = tile_k // k_block
        kb_begin, kb_end = k_split_range(split, model_dim // k_block, ksplit)
        iters, tail_begin = k_loop_counts(kb_begin, kb_end, blocks_per_iter)
        accs = zero_accs(tile.reps_m * 2 * tile.reps_n, tile.rows_per_lane, fx.Float32)
        for it in range(fx.Int32(0), iters, fx.Int32(1)):
            accs = _k_step(
                quant, mma, in_dtype, pa, pb, a_rows, b_rows, k64,
                kb_begin + it * blocks_per_iter, blocks_per_iter, tile.lane, accs,
            )  # fmt: skip
        if const_expr(blocks_per_iter > 1):
            for kb in range(tail_begin, kb_end, fx.Int32(1)):
                accs = _k_step(
                    quant, mma, in_dtype, pa, pb, a_rows, b_rows, k64, kb, 1, tile.lane, accs
                )

        pout = fx.get_iter(out)
        psw = fx.get_iter(sorted_weights)
        pas = fx.get_iter(a_scale)
        inter64 = fx.Int64(inter)
        two_inter64 = inter64 * 2
        columns = _stage1_column_info(
            tile, expert, inter, gate_mode, fx.get_iter(w1_scale), fx.get_iter(bias1), quant,
            has_bias and ksplit == 1,
        )  # fmt: skip
        for i in range_constexpr(tile.reps_m):
            for e in range_constexpr(tile.rows_per_lane):
                row, _ = coord(tile, i, 0, e)
                token, slot, valid = _entry(psid, row, m, topk)
                routed = fx.Int64(routed_row(token, slot, topk))
                if const_expr(quant):
                    x_scale = _scalar(pas, a1_row(token, m, _select), fx.Float32)
                if const_expr(doweight and ksplit == 1):
                    weight = _scalar(psw, row, fx.Float32)
                for j in range_constexpr(tile.reps_n):
                    col, g_wscale, u_wscale, g_bias, u_bias = columns[j]
                    g = accs[stage1_acc_index(i, j, tile.reps_n, 0)][e]
                    u = accs[stage1_acc_index(i, j, tile.reps_n, 1)][e]
                    if const_expr(quant):
                        g = g * x_scale * g_wscale
                        u = u * x_scale * u_wscale
                    if const_expr(ksplit == 1):
                        if const_expr(has_bias):
                            g = g + g_bias
                            u = u + u_bias
                        y = _activate(activation, g, u)
                        if const_expr(doweight):
                            y = y * weight
                        y_out = y.to(out.dtype)
                        off = matrix_offset(routed, fx.Int64(col), inter64)
                        if valid & (col < inter):
                            fx.ptr_store(y_out, pout + off)
                    else:
                        g_off = matrix_offset(
                            routed, fx.Int64(stage1_ws_gate_col(col)), two_inter64
                        )
                        u_off = matrix_offset(
                            routed, fx.Int64(stage1_ws_up_col(col, inter)), two_inter64
                        )
                        if valid & (col < inter):
                            fx.atomic_add(pout + g_off, g, syncscope=rocdl.SyncScope.Agent)
                            fx.atomic_add(pout + u_off, u, syncscope=rocdl.SyncScope.Agent)


@flyc.jit
def moe_stage1(
    a: fx.Tensor,
    w1: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    out: fx.Tensor,
    a_scale: fx.Tensor,
    w1_scale: fx.Tensor,
    bias1: fx.Tensor,
    m: fx.Int32,
    inter: fx.Int32,
    model_dim: fx.Int32,
    num_experts: fx.Int32,
    topk: fx.Int32,
    num_blocks: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    ksplit: fx.Constexpr[int],
    activation: fx.Constexpr[str],
    gate_mode: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    doweight: fx.Constexpr[bool],
    quant: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_stage1_kernel(
        a, w1, sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, out, a_scale,
        w1_scale, bias1, m, inter, model_dim, num_experts, topk, tile_m, tile_n, tile_k, ksplit,
        activation, gate_mode, has_bias, doweight, quant, mma,
    ).launch(
        grid=stage1_grid(inter, num_blocks, tile_n, ksplit),
        block=(WAVES_PER_BLOCK * WAVE_SIZE[mma], 1, 1),
        stream=stream,
    )  # fmt: skip


@flyc.kernel
def moe_stage1_activation_kernel(
    workspace: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    bias1: fx.Tensor,
    out: fx.Tensor,
    m: fx.Int32,
    inter: fx.Int32,
    num_rows: fx.Int32,
    num_experts: fx.Int32,
    topk: fx.Int32,
    tile_m: fx.Constexpr[int],
    activation: fx.Constexpr[str],
    gate_mode: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    doweight: fx.Constexpr[bool],
):
    """One thread per (sorted row, column): out1 = act(ws gate + bias, ws up + bias) (* weight)."""
    idx, row, col = elementwise_index(fx.block_idx.x, fx.thread_idx.x, inter)
    num_valid_rows = _scalar(fx.get_iter(num_valid_ids), 0, fx.Int32)
    if (idx < num_rows * inter) & (row < num_valid_rows):
        token, slot, valid = _entry(fx.get_iter(sorted_ids), row, m, topk)
        expert = _scalar(fx.get_iter(sorted_expert_ids), row_block(row, tile_m), fx.Int32)
        if valid & expert_valid(expert, num_experts):
            routed = fx.Int64(routed_row(token, slot, topk))
            inter64 = fx.Int64(inter)
            pws = fx.get_iter(workspace)
            g = _scalar(
                pws,
                matrix_offset(routed, fx.Int64(stage1_ws_gate_col(col)), inter64 * 2),
                fx.Float32,
            )
            u = _scalar(
                pws,
                matrix_offset(routed, fx.Int64(stage1_ws_up_col(col, inter)), inter64 * 2),
                fx.Float32,
            )
            if const_expr(has_bias):
                pbias = fx.get_iter(bias1)
                g = g + _scalar(
                    pbias,
                    expert_row(expert, gate_row(col, inter, gate_mode), inter * 2),
                    fx.Float32,
                )
                u = u + _scalar(
                    pbias, expert_row(expert, up_row(col, inter, gate_mode), inter * 2), fx.Float32
                )
            y = _activate(activation, g, u)
            if const_expr(doweight):
                y = y * _scalar(fx.get_iter(sorted_weights), row, fx.Float32)
            fx.ptr_store(
                y.to(out.dtype), fx.get_iter(out) + matrix_offset(routed, fx.Int64(col), inter64)
            )


@flyc.jit
def moe_stage1_activation(
    workspace: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    bias1: fx.Tensor,
    out: fx.Tensor,
    m: fx.Int32,
    inter: fx.Int32,
    num_rows: fx.Int32,
    num_experts: fx.Int32,
    topk: fx.Int32,
    tile_m: fx.Constexpr[int],
    activation: fx.Constexpr[str],
    gate_mode: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    doweight: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_stage1_activation_kernel(
        workspace, sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, bias1, out, m,
        inter, num_rows, num_experts, topk, tile_m, activation, gate_mode, has_bias, doweight,
    ).launch(
        grid=(elementwise_grid(num_rows * inter), 1, 1),
        block=(ELEMENTWISE_BLOCK, 1, 1),
        stream=stream,
    )  # fmt: skip


@flyc.kernel
def moe_stage2_kernel(
    a2: fx.Tensor,
    w2: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    out: fx.Tensor,
    a2_scale: fx.Tensor,
    w2_scale: fx.Tensor,
    bias2: fx.Tensor,
    m: fx.Int32,
    model_dim: fx.Int32,
    inter: fx.Int32,
    num_experts: fx.Int32,
    topk: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    mode: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    apply_weight: fx.Constexpr[bool],
    quant: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    k_tail: fx.Constexpr[bool],
):
    """Block (x, y) computes tile_n columns of model_dim for the rows of sorted block y and adds
    them into out[token] ("atomic") or stores them to the fp32 workspace row ("reduce"); with
    k_tail, inter ends inside its last k-block, which a predicated step adds."""
    tile = Tile(mma, tile_m, tile_n, m, model_dim)
    block = fx.block_idx.y
    psid = fx.get_iter(sorted_ids)
    num_valid_rows = _scalar(fx.get_iter(num_valid_ids), 0, fx.Int32)
    expert = _scalar(fx.get_iter(sorted_expert_ids), block, fx.Int32)
    if block_active(block, tile_m, num_valid_rows) & expert_valid(expert, num_experts):
        in_dtype = a2.dtype
        k64 = fx.Int64(inter)
        pa = fx.get_iter(a2)
        pb = fx.get_iter(w2)
        a_rows, b_rows = _stage2_operand_rows(tile, psid, expert, m, topk, model_dim)
        k_block = _k_block(quant)
        blocks_per_iter = tile_k // k_block
        num_kb = full_k_blocks(inter, k_block)
        iters, tail_begin = k_loop_counts(0, num_kb, blocks_per_iter)
        accs = zero_accs(tile.reps_m * tile.reps_n, tile.rows_per_lane, fx.Float32)
        for it in range(fx.Int32(0), iters, fx.Int32(1)):
            accs = _k_step(
                quant, mma, in_dtype, pa, pb, a_rows, b_rows, k64,
                it * blocks_per_iter, blocks_per_iter, tile.lane, accs,
            )  # fmt: skip
        if const_expr(blocks_per_iter > 1):
            for kb in range(tail_begin, num_kb, fx.Int32(1)):
                accs = _k_step(
                    quant, mma, in_dtype, pa, pb, a_rows, b_rows, k64, kb, 1, tile.lane, accs
                )
        if const_expr(k_tail):
            accs = _k_tail_step(
                quant, mma, in_dtype, pa, pb, a_rows, b_rows, k64, num_kb, tile.lane, accs
            )

        pout = fx.get_iter(out)
        psw = fx.get_iter(sorted_weights)
        pas = fx.get_iter(a2_scale)
        dim64 = fx.Int64(model_dim)
        columns = _stage2_column_info(
            tile, expert, model_dim, fx.get_iter(w2_scale), fx.get_iter(bias2), quant, has_bias
        )
        for i in range_constexpr(tile.reps_m):
            for e in range_constexpr(tile.rows_per_lane):
                row, _ = coord(tile, i, 0, e)
                token, slot, valid = _entry(psid, row, m, topk)
                if const_expr(mode == "atomic"):
                    dst_row = fx.Int64(token)
                else:
                    dst_row = fx.Int64(routed_row(token, slot, topk))
                if const_expr(quant):
                    x_scale = _scalar(pas, a2_row(token, slot, m, topk, _select), fx.Float32)
                if const_expr(apply_weight):
                    weight = _scalar(psw, row, fx.Float32)
                for j in range_constexpr(tile.reps_n):
                    col, w_scale, bias = columns[j]
                    y = accs[i * tile.reps_n + j][e]
                    if const_expr(quant):
                        y = y * x_scale * w_scale
                    if const_expr(has_bias):
                        y = y + bias
                    if const_expr(apply_weight):
                        y = y * weight
                    off = matrix_offset(dst_row, fx.Int64(col), dim64)
                    if const_expr(mode == "atomic"):
                        y_out = y.to(out.dtype)
                        if valid & (col < model_dim):
                            fx.atomic_add(pout + off, y_out, syncscope=rocdl.SyncScope.Agent)
                    else:
                        if valid & (col < model_dim):
                            fx.ptr_store(y, pout + off)


@flyc.jit
def moe_stage2(
    a2: fx.Tensor,
    w2: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    out: fx.Tensor,
    a2_scale: fx.Tensor,
    w2_scale: fx.Tensor,
    bias2: fx.Tensor,
    m: fx.Int32,
    model_dim: fx.Int32,
    inter: fx.Int32,
    num_experts: fx.Int32,
    topk: fx.Int32,
    num_blocks: fx.Int32,
    tile_m: fx.Constexpr[int],
    tile_n: fx.Constexpr[int],
    tile_k: fx.Constexpr[int],
    mode: fx.Constexpr[str],
    has_bias: fx.Constexpr[bool],
    apply_weight: fx.Constexpr[bool],
    quant: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    k_tail: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_stage2_kernel(
        a2, w2, sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, out, a2_scale,
        w2_scale, bias2, m, model_dim, inter, num_experts, topk, tile_m, tile_n, tile_k, mode,
        has_bias, apply_weight, quant, mma, k_tail,
    ).launch(
        grid=stage2_grid(model_dim, num_blocks, tile_n),
        block=(WAVES_PER_BLOCK * WAVE_SIZE[mma], 1, 1),
        stream=stream,
    )  # fmt: skip


@flyc.kernel
def moe_topk_reduce_kernel(
    workspace: fx.Tensor,
    out: fx.Tensor,
    m: fx.Int32,
    model_dim: fx.Int32,
    topk: fx.Constexpr[int],
):
    """out[t, c] = cast(sum_k workspace[t * topk + k, c]), one thread per element of out."""
    idx, token, col = elementwise_index(fx.block_idx.x, fx.thread_idx.x, model_dim)
    if idx < m * model_dim:
        pws = fx.get_iter(workspace)
        token64, col64, dim64 = fx.Int64(token), fx.Int64(col), fx.Int64(model_dim)
        total = _scalar(pws, topk_ws_offset(token64, 0, col64, topk, dim64), fx.Float32)
        for slot in range_constexpr(1, topk):
            total = total + _scalar(
                pws, topk_ws_offset(token64, slot, col64, topk, dim64), fx.Float32
            )
        fx.ptr_store(total.to(out.dtype), fx.get_iter(out) + fx.Int64(idx))


@flyc.jit
def moe_topk_reduce(
    workspace: fx.Tensor,
    out: fx.Tensor,
    m: fx.Int32,
    model_dim: fx.Int32,
    topk: fx.Constexpr[int],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_topk_reduce_kernel(workspace, out, m, model_dim, topk).launch(
        grid=(elementwise_grid(m * model_dim), 1, 1), block=(ELEMENTWISE_BLOCK, 1, 1), stream=stream
    )


# --- host launchers ------------------------------------------------------------------------


def _check_model_dim(name: str, what: str, value: int) -> None:
    if value <= 0 or value % MODEL_DIM_MULTIPLE:
        raise ValueError(
            f"{name}: {what} must be a positive multiple of {MODEL_DIM_MULTIPLE}, got {value}"
        )


def _check_inter(name: str, what: str, value: int, dtype: torch.dtype) -> None:
    multiple = inter_dim_multiple(dtype.itemsize)
    if value <= 0 or value % multiple:
        raise ValueError(
            f"{name}: {what} must be a positive multiple of {multiple} for {dtype} inputs, "
            f"got {value}"
        )


def _check_routing(sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids) -> tuple[int, int]:
    """(sorted rows P, sorted blocks) of the routing tensors."""
    (rows,) = check_rank("sorted_ids", sorted_ids, 1, "[P] int32")
    (blocks,) = check_rank("sorted_expert_ids", sorted_expert_ids, 1, "[num_blocks] int32")
    if rows < 1:
        raise ValueError("sorted_ids: expected at least one sorted row")
    if blocks < 1:
        raise ValueError("sorted_expert_ids: expected at least one sorted block")
    check_tensor("sorted_ids", sorted_ids, (torch.int32,), (rows,))
    check_tensor("sorted_weights", sorted_weights, (torch.float32,), (rows,))
    check_tensor("sorted_expert_ids", sorted_expert_ids, (torch.int32,), (blocks,))
    check_tensor("num_valid_ids", num_valid_ids, (torch.int32,), (2,))
    return rows, blocks


def _check_tile(tile: Any, mma: str) -> None:
    if tile not in STAGE_TILES[mma]:
        supported = ", ".join(f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in STAGE_TILES[mma])
        raise ValueError(f"tile: {tile} is not supported for mma={mma!r}; supported: {supported}")


def _input_kind(a_name: str, a, w_name: str, w, mma: str) -> bool:
    """Whether the GEMM inputs are fp8 (True) or bf16/fp16 (False); both share one dtype."""
    if a.dtype in A16_DTYPES:
        quant = False
    elif a.dtype in FP8_DTYPES:
        quant = True
        if mma == "wmma" and a.dtype == torch.float8_e4m3fnuz:
            raise ValueError(
                f"{a_name}: mma='wmma' (gfx1250) takes float8_e4m3fn, got {a.dtype} "
                "(the gfx942 flavour)"
            )
    else:
        raise ValueError(f"{a_name}: expected dtype in {A16_DTYPES + FP8_DTYPES}, got {a.dtype}")
    if w.dtype != a.dtype:
        raise ValueError(f"{w_name}: expected dtype {a.dtype} (same as {a_name}), got {w.dtype}")
    return quant


def _check_scales(quant: bool, named: list[tuple[str, Any, tuple[int, ...]]], kind: str) -> None:
    """fp8: every scale is a contiguous fp32 tensor of its shape; bf16/fp16: every one is None."""
    for name, scale, shape in named:
        if quant:
            if scale is None:
                raise ValueError(f"{name}: expected a float32 {list(shape)} tensor for fp8 {kind}")
            check_tensor(name, scale, (torch.float32,), shape)
        elif scale is not None:
            raise ValueError(f"{name}: expected None for bf16/fp16 {kind} (scales are fp8 only)")


def launch_moe_stage1(
    a: torch.Tensor,
    w1: torch.Tensor,
    sorted_ids: torch.Tensor,
    sorted_weights: torch.Tensor,
    sorted_expert_ids: torch.Tensor,
    num_valid_ids: torch.Tensor,
    out: torch.Tensor,
    *,
    topk: int,
    tile: GemmTile,
    ksplit: int,
    activation: str,
    gate_mode: str,
    doweight: bool,
    mma: str,
    a_scale: torch.Tensor | None = None,
    w1_scale: torch.Tensor | None = None,
    bias1: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    stream: Any | None = None,
) -> None:
    """Launch MoE stage 1: out[t * topk + k, n] = act(g, u) (* routing weight) for every routed
    (token t, slot k, local expert e) of the sorted routing, n < inter.

    Contract (reads shapes and dtypes only, never data; all tensors contiguous; CPU tensors or
    FakeTensors compile without running under COMPILE_ONLY=1):

    - a [M, model_dim] and w1 [E, 2 * inter, model_dim], one dtype: bfloat16/float16 (fp32
      accumulation, v_mfma_f32_16x16x16 / v_wmma_f32_16x16x32, k-blocks of 32), or fp8
      (float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950/gfx1250; v_mfma_f32_16x16x32_fp8_fp8
      / v_wmma_f32_16x16x64_fp8_fp8, k-blocks of 64) with every expert's [2 * inter, model_dim]
      slab preshuffled by gemm_shuffle_weight(w1[e], (16, 16)), a_scale float32 [M, 1]
      (per token) and w1_scale float32 [E, 2 * inter, 1] (per w1 row). bf16/fp16 take no scales.
      model_dim is a positive multiple of 64; inter of 8 (bf16/fp16) or 16 (fp8): column tiles
      past inter load clamped rows and store nothing. 1 <= M < 2**24; 1 <= topk <= 127.
    - Routing (moe_sorting): sorted_ids int32 [P], entry (slot << 24) | token, padding
      (topk << 24) | M; sorted_weights float32 [P]; sorted_expert_ids int32 [num_blocks], the
      LOCAL expert (index into w1) of sorted block b (rows b * tile_m ... + tile_m - 1);
      num_valid_ids int32 [2], [0] = sorted rows in use (a multiple of tile_m), [1] = valid
      tokens (unused here). tile.tile_m MUST equal the sorting block size. A block at or past
      num_valid_ids[0], or whose expert is outside [0, E), does nothing; rows whose entry has
      token >= M or slot >= topk are padding: their loads are clamped, nothing is stored.
      P * inter + 255 < 2**31.
    - gate_mode "separated": gate of column n is w1 row n, up is row inter + n; "interleave":
      rows 2n and 2n + 1. bias1 float32 [E, 2 * inter] (indexed like the w1 rows) or None,
      added to g and u (after the fp8 scales) before the activation.
    - activation "silu": silu(g) * u; "swiglu": g = min(g, 7), u = clamp(u, -7, 7),
      g * sigmoid(1.702 * g) * (u + 1); sigmoid(x) = 1 / (1 + 2**(-x * log2(e))) with the
      hardware exp2 (v_exp_f32). doweight: multiply by sorted_weights of the row.
    - out [M * topk, inter]: a's dtype for bf16/fp16 a; bfloat16 or float16 (the unquantized
      hidden dtype) for fp8 a. Rows of pairs not routed to a local expert are not written.
    - tile: one of STAGE_TILES[mma]. ksplit >= 1: split s of the model_dim / K_BLOCK k-blocks
      owns [s * nkb // ksplit, (s + 1) * nkb // ksplit). ksplit == 1: the GEMM kernel applies
      scales, bias, activation, weight and writes out; workspace is ignored. ksplit > 1:
      workspace float32 stage1_workspace_shape(M, topk, inter) = [M * topk, 2 * inter], ZEROED
      by the caller; every split atomically adds its scaled fp32 gate partial at column n and
      up partial at column inter + n (whatever gate_mode) of row t * topk + k, then
      moe_stage1_activation (one thread per sorted row and column) adds the bias, applies the
      activation and weight and writes out.
    - mma: "mfma" (wave64; gfx942/gfx950 only) or "wmma" (wave32; gfx1250 only).
    - stream: None, an fx.Stream, a raw handle or an object with `cuda_stream`.

    Kernels (jit names = cache directory prefixes): moe_stage1 (Constexpr tile_m, tile_n,
    tile_k, ksplit, activation, gate_mode, has_bias, doweight, quant, mma; with ksplit > 1 it is
    compiled with activation "silu", has_bias and doweight False, which it does not use) and
    moe_stage1_activation (Constexpr tile_m, activation, gate_mode, has_bias, doweight;
    gate_mode is "separated" when there is no bias, which is the only use of it). quant is
    True for fp8 a. M, inter, model_dim, E, topk, P and num_blocks are runtime int32 arguments,
    so they never change a cache key; tensor dtypes do. Tensors a configuration does not read
    (scales of bf16/fp16, an absent bias) are passed as sorted_weights.
    """
    check_mma(mma, MMA_FLAVOURS)
    _check_tile(tile, mma)
    check_int("ksplit", ksplit, 1)
    check_int("topk", topk, 1, MAX_TOPK)
    check_choice("activation", activation, ACTIVATIONS)
    check_choice("gate_mode", gate_mode, GATE_MODES)
    check_bool("doweight", doweight)
    m, model_dim = check_rank("a", a, 2, "[M, model_dim]")
    num_experts, two_inter, w_k = check_rank("w1", w1, 3, "[E, 2 * inter, model_dim]")
    quant = _input_kind("a", a, "w1", w1, mma)
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"a: M = a.shape[0] must be in [1, {MAX_TOKENS}], got {m}")
    _check_model_dim("a", "model_dim = a.shape[1]", model_dim)
    if num_experts < 1 or two_inter % 2 or w_k != model_dim:
        raise ValueError(
            f"w1: expected shape [E >= 1, 2 * inter, {model_dim}], got {list(w1.shape)}"
        )
    inter = two_inter // 2
    _check_inter("w1", "inter = w1.shape[1] / 2", inter, w1.dtype)
    check_tensor("a", a, (a.dtype,), (m, model_dim))
    check_tensor("w1", w1, (w1.dtype,), (num_experts, two_inter, model_dim))
    rows, blocks = _check_routing(sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids)
    if rows * inter + ELEMENTWISE_BLOCK > 2**31:
        raise ValueError(f"sorted_ids: P * inter = {rows * inter} is too large for int32 indices")
    out_dtypes = OUT_DTYPES if quant else (a.dtype,)
    check_tensor("out", out, out_dtypes, (m * topk, inter))
    _check_scales(
        quant,
        [("a_scale", a_scale, (m, 1)), ("w1_scale", w1_scale, (num_experts, two_inter, 1))],
        "a and w1",
    )
    has_bias = bias1 is not None
    if has_bias:
        check_tensor("bias1", bias1, (torch.float32,), (num_experts, two_inter))
    if ksplit > 1:
        if workspace is None:
            raise ValueError(
                f"workspace: expected a zeroed float32 {list(stage1_workspace_shape(m, topk, inter))}"
                " tensor when ksplit > 1"
            )
        check_tensor(
            "workspace", workspace, (WORKSPACE_DTYPE,), stage1_workspace_shape(m, topk, inter)
        )

    # Tensors a configuration does not read are replaced by sorted_weights (a float32 vector).
    stand_in = sorted_weights
    scale_a = a_scale if quant else stand_in
    scale_w = w1_scale if quant else stand_in
    bias_arg = bias1 if has_bias else stand_in
    fx_stream = to_stream(stream)
    routing = kernel_tensors(sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids)
    a, w1, out, scale_a, scale_w, bias_arg, stand_in = kernel_tensors(
        a, w1, out, scale_a, scale_w, bias_arg, stand_in
    )
    tiles = dict(tile_m=tile.tile_m, tile_n=tile.tile_n, tile_k=tile.tile_k)
    sizes = (m, inter, model_dim, num_experts, topk, blocks)
    if ksplit == 1:
        moe_stage1(
            a, w1, *routing, out, scale_a, scale_w, bias_arg, *sizes, **tiles, ksplit=1,
            activation=activation, gate_mode=gate_mode, has_bias=has_bias, doweight=doweight,
            quant=quant, mma=mma, stream=fx_stream,
        )  # fmt: skip
        return
    (workspace,) = kernel_tensors(workspace)
    moe_stage1(
        a, w1, *routing, workspace, scale_a, scale_w, stand_in, *sizes, **tiles, ksplit=ksplit,
        activation=ACTIVATIONS[0], gate_mode=gate_mode, has_bias=False, doweight=False,
        quant=quant, mma=mma, stream=fx_stream,
    )  # fmt: skip
    moe_stage1_activation(
        workspace, *routing, bias_arg, out, m, inter, rows, num_experts, topk,
        tile_m=tile.tile_m, activation=activation,
        gate_mode=gate_mode if has_bias else GATE_MODES[0], has_bias=has_bias,
        doweight=doweight, stream=fx_stream,
    )  # fmt: skip


def launch_moe_stage2(
    a2: torch.Tensor,
    w2: torch.Tensor,
    sorted_ids: torch.Tensor,
    sorted_weights: torch.Tensor,
    sorted_expert_ids: torch.Tensor,
    num_valid_ids: torch.Tensor,
    out: torch.Tensor,
    *,
    topk: int,
    tile: GemmTile,
    mode: str,
    apply_weight: bool,
    mma: str,
    a2_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    stream: Any | None = None,
) -> None:
    """Launch MoE stage 2: out[t] += (a2[t * topk + k] . w2[e, c] (+ bias2[e, c])) (* weight)
    for every routed (token t, slot k, local expert e) of the sorted routing, c < model_dim.

    Contract (reads shapes and dtypes only, never data; all tensors contiguous; CPU tensors or
    FakeTensors compile without running under COMPILE_ONLY=1):

    - a2 [M * topk, inter] (stage 1's out, or its per-token fp8 quantization) and w2
      [E, model_dim, inter], one dtype: bfloat16/float16, or fp8 (float8_e4m3fnuz on gfx942,
      float8_e4m3fn on gfx950/gfx1250) with every expert's [model_dim, inter] slab preshuffled
      by gemm_shuffle_weight(w2[e], (16, 16)), a2_scale float32 [M * topk, 1] and
      w2_scale float32 [E, model_dim, 1]; bf16/fp16 take no scales. fp32 accumulation; the
      scales multiply the accumulator in the epilogue. model_dim is a positive multiple of 64,
      inter of 8 (bf16/fp16) or 16 (fp8): when inter ends inside a k-block, that k-block is
      added in 16-byte chunks per lane, those past inter zeroed (loaded from column 0, in
      bounds). M = out.shape[0] in [1, 2**24); 1 <= topk <= 127.
    - Routing as for launch_moe_stage1 (tile.tile_m MUST equal the sorting block size; inactive
      blocks, blocks of experts outside [0, E) and padding rows store nothing).
    - bias2 float32 [E, model_dim] or None, added after the scales and before the weight.
    - apply_weight: multiply by sorted_weights of the row (pass not doweight_stage1).
    - out [M, model_dim]: bfloat16 or float16. mode "atomic": out must be ZEROED by the caller;
      each routed row is cast to out's dtype and added with atomic adds in that dtype (rows of
      tokens routed nowhere stay zero); workspace is ignored. mode "reduce": workspace float32
      stage2_workspace_shape(M, topk, model_dim) = [M * topk, model_dim], ZEROED by the caller;
      the GEMM kernel stores each routed row's fp32 value at row t * topk + k, then
      moe_topk_reduce writes every element of out: out[t] = cast(sum_k workspace[t * topk + k]).
      M * model_dim + 255 < 2**31.
    - tile: one of STAGE_TILES[mma]; mma and stream as for launch_moe_stage1.

    Kernels (jit names): moe_stage2 (Constexpr tile_m, tile_n, tile_k, mode, has_bias,
    apply_weight, quant, mma, k_tail = inter % K_BLOCK != 0, so aligned shapes compile without
    the tail step; topk and the sizes are runtime int32) and, for "reduce",
    moe_topk_reduce (Constexpr topk: its sum is unrolled).
    """
    check_mma(mma, MMA_FLAVOURS)
    _check_tile(tile, mma)
    check_int("topk", topk, 1, MAX_TOPK)
    check_choice("mode", mode, STAGE_MODES)
    check_bool("apply_weight", apply_weight)
    routed, inter = check_rank("a2", a2, 2, "[M * topk, inter]")
    num_experts, model_dim, w_k = check_rank("w2", w2, 3, "[E, model_dim, inter]")
    m, out_dim = check_rank("out", out, 2, "[M, model_dim]")
    quant = _input_kind("a2", a2, "w2", w2, mma)
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"out: M = out.shape[0] must be in [1, {MAX_TOKENS}], got {m}")
    _check_inter("a2", "inter = a2.shape[1]", inter, a2.dtype)
    _check_model_dim("w2", "model_dim = w2.shape[1]", model_dim)
    if num_experts < 1 or w_k != inter:
        raise ValueError(f"w2: expected shape [E >= 1, model_dim, {inter}], got {list(w2.shape)}")
    if routed != m * topk:
        raise ValueError(f"a2: expected {m} * {topk} = {m * topk} rows, got {routed}")
    check_tensor("a2", a2, (a2.dtype,), (routed, inter))
    check_tensor("w2", w2, (w2.dtype,), (num_experts, model_dim, inter))
    check_tensor("out", out, OUT_DTYPES, (m, model_dim))
    if m * model_dim + ELEMENTWISE_BLOCK > 2**31:
        raise ValueError(f"out: M * model_dim = {m * model_dim} is too large for int32 indices")
    _, blocks = _check_routing(sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids)
    _check_scales(
        quant,
        [("a2_scale", a2_scale, (routed, 1)), ("w2_scale", w2_scale, (num_experts, model_dim, 1))],
        "a2 and w2",
    )
    has_bias = bias2 is not None
    if has_bias:
        check_tensor("bias2", bias2, (torch.float32,), (num_experts, model_dim))
    if mode == "reduce":
        if workspace is None:
            raise ValueError(
                "workspace: expected a zeroed float32 "
                f"{list(stage2_workspace_shape(m, topk, model_dim))} tensor for mode 'reduce'"
            )
        check_tensor(
            "workspace", workspace, (WORKSPACE_DTYPE,), stage2_workspace_shape(m, topk, model_dim)
        )

    stand_in = sorted_weights
    dst = out if mode == "atomic" else workspace
    fx_stream = to_stream(stream)
    k_tail = has_k_tail(inter, _k_block(quant))
    tensors = kernel_tensors(
        a2, w2, sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, dst,
        a2_scale if quant else stand_in, w2_scale if quant else stand_in,
        bias2 if has_bias else stand_in,
    )  # fmt: skip
    moe_stage2(
        *tensors, m, model_dim, inter, num_experts, topk, blocks, tile_m=tile.tile_m,
        tile_n=tile.tile_n, tile_k=tile.tile_k, mode=mode, has_bias=has_bias,
        apply_weight=apply_weight, quant=quant, mma=mma, k_tail=k_tail, stream=fx_stream,
    )  # fmt: skip
    if mode == "reduce":
        workspace, out = kernel_tensors(workspace, out)
        moe_topk_reduce(workspace, out, m, model_dim, topk=topk, stream=fx_stream)
