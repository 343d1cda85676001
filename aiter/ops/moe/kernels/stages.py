"""FlyDSL kernels and launchers of the two MoE expert GEMM stages over sorted token blocks.

Stage 1: out1[t * topk + k] = act(x_t . w1[e, gate rows], x_t . w1[e, up rows]) (* weight) for
every routed (token t, slot k, expert e); with ksplit > 1 the splits add scaled partials into an
fp32 workspace and an activation kernel finishes. Stage 2: y = out1 row . w2[e] (+ bias)
(* weight), added atomically into out[t] ("atomic") or written per routed row to an fp32
workspace that a top-k reduction sums into out ("reduce"). Both GEMMs run the shared main loop
(aiter/ops/shared/mainloop.py) with A's rows gathered from the sorted token ids: bf16/fp16 on
row-major weights, fp8 on preshuffled weights; MFMA on gfx942/gfx950, WMMA on gfx1250.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.arch import ARCHS
from aiter.ops.moe.kernels.sorting_index import MAX_TOKENS, MAX_TOPK
from aiter.ops.moe.kernels.stages_index import (
    ACTIVATIONS,
    ATOMIC_PAIR,
    ELEMENTWISE_BLOCK,
    GATE_MODES,
    MODEL_DIM_MULTIPLE,
    SWIGLU_ALPHA,
    SWIGLU_LIMIT,
    activate,
    atomic_pair_starts,
    block_active,
    elementwise_grid,
    elementwise_index,
    entry_slot,
    entry_token,
    entry_valid,
    expert_row,
    expert_valid,
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
    stage_k_blocks,
    topk_ws_offset,
    up_row,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared import mainloop
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.gemm_blocks import check_mma, load_run, to_stream
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
    "PACKED_ATOMIC_DTYPES",
    "STAGE_MODES",
    "STAGE_TILES",
    "SWIGLU_ALPHA",
    "SWIGLU_LIMIT",
    "WORKSPACE_DTYPE",
    "atomic_mode_problem",
    "inter_dim_multiple",
    "launch_moe_stage1",
    "launch_moe_stage2",
    "stage1_workspace_shape",
    "stage2_workspace_shape",
]

# tile_m is the sorting block size (block_m); tile_k is a multiple of both k-blocks (32, 64).
CANDIDATE_TILES = tile_grid((16, 32, 64), (64, 128), (64, 128, 256))


def tile_problem(tile: GemmTile, mma: str) -> str | None:
    """Why a tile cannot run both stages, bf16/fp16 and fp8, on every arch of the flavour, or
    None. Stage 1 streams the gate and the up rows of its tile_n columns (2 * tile_n B rows per
    block, the widest main loop); stage 2's reduce mode stages fp32 (the widest epilogue)."""
    for elem_bytes in (2, 1):
        problem = mx.budget_problem(tile.tile_m, 2 * tile.tile_n, tile.tile_k, elem_bytes, 4, mma)
        if problem is not None:
            return f"{elem_bytes}-byte inputs: {problem}"
    return None


STAGE_TILES: dict[str, tuple[GemmTile, ...]] = {
    mma: tuple(t for t in CANDIDATE_TILES if tile_problem(t, mma) is None)
    for mma in ("mfma", "wmma")
}
MMA_FLAVOURS = tuple(STAGE_TILES)
STAGE_MODES = ("atomic", "reduce")
# The bf16/fp16 outputs each arch has a packed atomic add for (global_atomic_pk_add_bf16 /
# _f16, read from the stage-2 listings; test_isa_listing holds every arch to it). "atomic"
# mode adds through them only: a 16-bit scalar atomic add is a compare-and-swap loop.
PACKED_ATOMIC_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "gfx942": (torch.bfloat16, torch.float16),
    "gfx950": (torch.bfloat16, torch.float16),
    "gfx1250": (torch.bfloat16, torch.float16),
}
WORKSPACE_DTYPE = torch.float32
A16_DTYPES = (torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
# Stage-2 output and fp8 stage-1 output dtypes.
OUT_DTYPES = (torch.bfloat16, torch.float16)

_LOG2E = 1.4426950408889634


def atomic_mode_problem(mma: str, out_dtype: torch.dtype) -> str | None:
    """Why stage 2's "atomic" mode cannot add `out_dtype` rows on every arch of the MMA flavour
    (as with tiles, what a flavour offers holds on all its archs), or None."""
    for name, info in ARCHS.items():
        if info.mma == mma and out_dtype not in PACKED_ATOMIC_DTYPES.get(name, ()):
            return (
                f"{name} has no packed {out_dtype} atomic add (global_atomic_pk_add), so stage "
                "2's 'atomic' mode is not offered there; use 'reduce'"
            )
    return None


# The main loop is the shared one; around it sit the routing (A's rows are the sorted block's
# tokens, read once per copied row through the Pipeline hooks), the expert's weight rows and
# the epilogues. Every load of a row that does not exist (padding, a column past the end, a K
# chunk past inter) is a buffer load out of range and reads zeros. Helpers hold no dynamic `if`
# or runtime loop: FlyDSL rewrites those only inside the kernel functions themselves.


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


def _uniform(value):
    """An Int32 every lane of the block holds (a loaded routing word), said to be uniform so
    the descriptors built from it stay in SGPRs (no waterfall loop around the loads)."""
    return fx.Int32(rocdl.readfirstlane(fx.Int32.ir_type, value))


def _k_block(quant: bool) -> int:
    return mx.k_block(1 if quant else 2)


def _block_ids(sorted_ids, origin_m):
    """The sorted block's first entry of sorted_ids (its rows r < tile_m are read)."""
    return fx.get_iter(sorted_ids) + fx.Int64(origin_m)


def _entry(sid, r, tile_m: int, m, topk):
    """(token, slot, valid) of block row r (a row past the block reads entry 0: the callers
    never use it)."""
    entry = mainloop.load_scalar(sid, r < tile_m, r, fx.Int32)
    token, slot = entry_token(entry), entry_slot(entry)
    return token, slot, entry_valid(token, slot, m, topk)


def _sorted_entry(psid, row, m, topk):
    """(token, slot, valid) of sorted row `row` (the elementwise activation kernel)."""
    entry = _scalar(psid, row, fx.Int32)
    token, slot = entry_token(entry), entry_slot(entry)
    return token, slot, entry_valid(token, slot, m, topk)


def _stage1_a_hooks(sid, tile_m: int, m, model_dim):
    """Pipeline hooks of stage 1's A: block row r is row `token` of x (zeros for padding)."""

    def rows(r):
        token = entry_token(mainloop.load_scalar(sid, r < tile_m, r, fx.Int32))
        return token * model_dim, token < m

    def chunk(info, kk):
        return info[0] + kk, info[1]

    return rows, chunk


def _stage2_a_hooks(sid, tile_m: int, m, topk, inter):
    """Pipeline hooks of stage 2's A: block row r is the routed row of a2 (zeros for padding)."""

    def rows(r):
        token, slot, valid = _entry(sid, r, tile_m, m, topk)
        return routed_row(token, slot, topk) * inter, valid

    def chunk(info, kk):
        return info[0] + kk, info[1]

    return rows, chunk


def _stage1_b_rows(p, inter, gate_mode: str):
    """(row of the expert's w1 slab, valid) the lane feeds each B repeat with: its reps_n gate
    rows, then its reps_n up rows (stage1_acc_index's order); columns past inter load zeros."""
    gates, ups = [], []
    for j in range_constexpr(p.reps_n):
        col = p.origin_n + p.b_row0 + mx.operand_row(j, p.lane)
        valid = col < inter
        gates.append((gate_row(col, inter, gate_mode), valid))
        ups.append((up_row(col, inter, gate_mode), valid))
    return gates + ups


def _row_values(p, sid, rep_m: int, tile_m: int, m, topk, scale_buf, weight_buf,
                routed_scale: bool, with_scale: bool, with_weight: bool):  # fmt: skip
    """Per accumulator element of A repeat rep_m: (token, slot, valid) of its row and the fp32
    vectors of the rows' scales and routing weights (None when unused). The scale of a row is
    at its routed row (stage 2's a2_scale) or at its token (stage 1's a_scale)."""
    entries, scales, weights = [], [], []
    for r in mainloop.lane_rows(p, rep_m):
        token, slot, valid = _entry(sid, r, tile_m, m, topk)
        entries.append((token, slot, valid))
        if const_expr(with_scale):
            scale_row = routed_row(token, slot, topk) if const_expr(routed_scale) else token
            scales.append(mainloop.load_scalar(scale_buf, valid, scale_row, fx.Float32))
        if const_expr(with_weight):
            weights.append(mainloop.load_scalar(weight_buf, r < tile_m, r, fx.Float32))
    scale_vec = fx.Vector.from_elements(scales, fx.Float32) if const_expr(with_scale) else None
    weight_vec = fx.Vector.from_elements(weights, fx.Float32) if const_expr(with_weight) else None
    return entries, scale_vec, weight_vec


def _column_values(ptr, rows, enabled: bool):
    """fp32 value per (row, valid) of a per-row tensor at ptr (w scales, biases), or None."""
    if const_expr(not enabled):
        return [None for _ in rows]
    return [mainloop.load_scalar(ptr, valid, row, fx.Float32) for row, valid in rows]


def _stage1_tile(activation: str, g, u, x_scales, weights, g_ws, u_ws, g_b, u_b, quant: bool,
                 has_bias: bool, doweight: bool, count: int):  # fmt: skip
    """The lane's fp32 stage-1 outputs of one MMA tile from its gate and up accumulators:
    g * x_scale * w_scale (fp8), + bias, the activation, * weight."""
    if const_expr(quant):
        g = g * x_scales * g_ws
        u = u * x_scales * u_ws
    if const_expr(has_bias):
        g = g + g_b
        u = u + u_b
    values = []
    for e in range_constexpr(count):
        y = _activate(activation, g[e], u[e])
        if const_expr(doweight):
            y = y * weights[e]
        values.append(y)
    return fx.Vector.from_elements(values, fx.Float32)


def _stage2_tile(acc, x_scales, weights, w_scale, bias, quant: bool, has_bias: bool,
                 apply_weight: bool):  # fmt: skip
    """acc * x_scale * w_scale (fp8), + bias, * weight: the lane's fp32 values of one tile."""
    y = acc
    if const_expr(quant):
        y = y * x_scales * w_scale
    if const_expr(has_bias):
        y = y + bias
    if const_expr(apply_weight):
        y = y * weights
    return y


def _atomic_add_run(ptr, values, out_bytes: int):
    """Add a staged 16-byte run of bf16/fp16 into out at ptr, one packed 2-element atomic per
    32-bit word (global_atomic_pk_add_bf16/_f16; a 16-bit scalar add is a compare-and-swap
    loop). The run starts at an even column of a row of even length, so each pair is a whole
    word; the raw pointer has no alignment of its own, so LLVM takes the pair's natural 4."""
    for c in atomic_pair_starts(mx.CHUNK_BYTES // out_bytes):
        pair = values.shuffle(values, [c + h for h in range_constexpr(ATOMIC_PAIR)])
        fx.atomic_add((ptr + c).llvm_ptr, pair, syncscope=rocdl.SyncScope.Agent)


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
    y over split z's k-blocks, through the shared main loop: A = the block's tokens' rows of x
    (gathered), B = the expert's gate rows and up rows of the block's columns (each wave its
    own), 2 * reps_n B repeats per wave. ksplit == 1 finishes out1 (16 rows per wave staged
    through LDS, 16-byte stores), else `out` is the fp32 workspace the splits add into."""
    split = fx.block_idx.z
    block = fx.block_idx.y
    out_bytes = mainloop.element_bytes(out.dtype)
    lds = mainloop.allocate_lds(
        fx.SharedAllocator(), tile_m, tile_n, tile_k, a.dtype, out_bytes, mma
    )
    num_valid_rows = _uniform(_scalar(fx.get_iter(num_valid_ids), 0, fx.Int32))
    expert = _uniform(_scalar(fx.get_iter(sorted_expert_ids), block, fx.Int32))
    if block_active(block, tile_m, num_valid_rows) & expert_valid(expert, num_experts):
        eb = mainloop.element_bytes(a.dtype)
        two_inter = inter * 2
        origin_m = block * tile_m
        sid = _block_ids(sorted_ids, origin_m)
        a_rows, a_chunk = _stage1_a_hooks(sid, tile_m, m, model_dim)
        w_buf = mainloop.buffer_rows(
            fx.get_iter(w1), expert * two_inter, two_inter, model_dim, eb, mx.OFFSET_LIMIT
        )
        p = mainloop.Pipeline(
            mma, tile_m, tile_n, tile_k, a, w1, m, inter, model_dim, lds, b_shuffled=quant,
            a_rows=a_rows, a_chunk=a_chunk,
            a_buffer=mainloop.buffer_rows(fx.get_iter(a), 0, m, model_dim, eb, MAX_TOKENS), b_buffer=w_buf,
            b_rows_left=inter - fx.block_idx.x * tile_n,
        )  # fmt: skip
        b_rows = _stage1_b_rows(p, inter, gate_mode)
        reps_b = 2 * p.reps_n
        kb_begin, kb_end = k_split_range(split, model_dim // _k_block(quant), ksplit)
        tiles = mx.k_tiles(kb_begin, kb_end, p.blocks)

        accs = mainloop.zero_accs(p, count=p.reps_m * reps_b)
        a_copy = mainloop.load_a_k_tile(p, kb_begin, kb_end)
        b_next = mainloop.load_b_rows(p, b_rows, kb_begin, kb_end)
        # Runtime loop; accs, a_copy and b_next are reassigned, so they are carried.
        for t in range(fx.Int32(1), tiles, fx.Int32(1), unroll=1):
            b_cur = b_next
            fx.barrier()
            mainloop.store_a(p, a_copy)
            fx.barrier()
            a_copy = mainloop.load_a_k_tile(p, kb_begin + t * p.blocks, kb_end)
            b_next = mainloop.load_b_rows(p, b_rows, kb_begin + t * p.blocks, kb_end)
            rocdl.sched_barrier(0)  # keep the next k-tile's loads ahead of this one's MMAs
            accs = mainloop.mma_k_tile_wide(p, b_cur, accs, reps_b)
        # The last k-tile (zeros when the split owns no k-block).
        fx.barrier()
        mainloop.store_a(p, a_copy)
        fx.barrier()
        accs = mainloop.mma_k_tile_wide(p, b_next, accs, reps_b)

        # Per lane column j: gate and up rows of the expert (w1_scale, bias1 are indexed alike).
        col_rows = [(expert * two_inter + row, valid) for row, valid in b_rows]
        w_scales = _column_values(fx.get_iter(w1_scale), col_rows, quant)
        biases = _column_values(fx.get_iter(bias1), col_rows, has_bias and ksplit == 1)
        scale_buf = fx.get_iter(a_scale)
        weight_buf = fx.get_iter(sorted_weights) + fx.Int64(origin_m)
        pout = fx.get_iter(out)
        if const_expr(ksplit == 1):
            # 16 rows per wave through its LDS staging area (reusing the A stage), stored as
            # 16-byte runs of out1's routed rows (inter is a multiple of a run).
            out_lds = fx.recast_iter(out.dtype, lds)
            fx.barrier()  # every wave is done reading the A stage the staging areas reuse
            for i in range_constexpr(p.reps_m):
                _, x_scales, weights = _row_values(
                    p, sid, i, tile_m, m, topk, scale_buf, weight_buf,
                    False, quant, doweight,
                )  # fmt: skip
                row_tiles = []
                for j in range_constexpr(p.reps_n):
                    g = accs[stage1_acc_index(i, j, p.reps_n, 0)]
                    u = accs[stage1_acc_index(i, j, p.reps_n, 1)]
                    row_tiles.append(_stage1_tile(
                        activation, g, u, x_scales, weights, w_scales[j],
                        w_scales[p.reps_n + j], biases[j], biases[p.reps_n + j], quant,
                        has_bias, doweight, mx.acc_rows_per_lane(mma),
                    ))  # fmt: skip
                mainloop.stage_out_rows(p, row_tiles, out_lds, out.dtype)
                for values, row16, col, real in mainloop.staged_runs(p, out_lds, out.dtype):
                    token, slot, valid = _entry(sid, i * mx.MMA_MN + row16, tile_m, m, topk)
                    gcol = p.origin_n + col
                    off = matrix_offset(
                        fx.Int64(routed_row(token, slot, topk)), fx.Int64(gcol), fx.Int64(inter)
                    )
                    if real & valid & (gcol < inter):
                        fx.ptr_store(values, pout + off)
        else:
            # Split partials: fp32 atomic adds of the scaled gate and up partials, per element.
            for i in range_constexpr(p.reps_m):
                entries, x_scales, _ = _row_values(
                    p, sid, i, tile_m, m, topk, scale_buf, weight_buf,
                    False, quant, False,
                )  # fmt: skip
                for j in range_constexpr(p.reps_n):
                    g = accs[stage1_acc_index(i, j, p.reps_n, 0)]
                    u = accs[stage1_acc_index(i, j, p.reps_n, 1)]
                    if const_expr(quant):
                        g = g * x_scales * w_scales[j]
                        u = u * x_scales * w_scales[p.reps_n + j]
                    gcol = p.origin_n + mainloop.lane_col(p, j)
                    for e in range_constexpr(mx.acc_rows_per_lane(mma)):
                        token, slot, valid = entries[e]
                        routed = fx.Int64(routed_row(token, slot, topk))
                        g_off = matrix_offset(
                            routed, fx.Int64(stage1_ws_gate_col(gcol)), fx.Int64(two_inter)
                        )
                        u_off = matrix_offset(
                            routed, fx.Int64(stage1_ws_up_col(gcol, inter)), fx.Int64(two_inter)
                        )
                        if valid & (gcol < inter):
                            fx.atomic_add(pout + g_off, g[e], syncscope=rocdl.SyncScope.Agent)
                            fx.atomic_add(pout + u_off, u[e], syncscope=rocdl.SyncScope.Agent)


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
        block=(mx.threads(mma), 1, 1),
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
        token, slot, valid = _sorted_entry(fx.get_iter(sorted_ids), row, m, topk)
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
    """Block (x, y) computes tile_n columns of model_dim for the rows of sorted block y through
    the shared main loop (A = the routed rows of a2, gathered; B = the expert's w2 rows of the
    block's columns), stages them through LDS (16 rows per wave) and adds each 16-byte run into
    out[token] as packed 2-element atomics ("atomic") or stores it to the fp32 workspace row
    ("reduce"); with k_tail, inter ends inside its last k-block and the chunks past it load
    zeros."""
    block = fx.block_idx.y
    out_bytes = mainloop.element_bytes(out.dtype)
    lds = mainloop.allocate_lds(
        fx.SharedAllocator(), tile_m, tile_n, tile_k, a2.dtype, out_bytes, mma
    )
    num_valid_rows = _uniform(_scalar(fx.get_iter(num_valid_ids), 0, fx.Int32))
    expert = _uniform(_scalar(fx.get_iter(sorted_expert_ids), block, fx.Int32))
    if block_active(block, tile_m, num_valid_rows) & expert_valid(expert, num_experts):
        eb = mainloop.element_bytes(a2.dtype)
        origin_m = block * tile_m
        origin_n = fx.block_idx.x * tile_n
        rows_left = model_dim - origin_n
        sid = _block_ids(sorted_ids, origin_m)
        a_rows, a_chunk = _stage2_a_hooks(sid, tile_m, m, topk, inter)
        w_buf = mainloop.buffer_rows(
            fx.get_iter(w2), expert * model_dim + origin_n, rows_left, inter, eb, tile_n
        )
        p = mainloop.Pipeline(
            mma, tile_m, tile_n, tile_k, a2, w2, m * topk, model_dim, inter, lds,
            b_shuffled=quant, k_tail=k_tail, a_rows=a_rows, a_chunk=a_chunk,
            a_buffer=mainloop.buffer_rows(
                fx.get_iter(a2), 0, m * topk, inter, eb, MAX_TOKENS * MAX_TOPK
            ),
            b_buffer=w_buf, b_rows_left=rows_left,
        )  # fmt: skip
        kb_end = stage_k_blocks(inter, _k_block(quant))
        tiles = mx.k_tiles(0, kb_end, p.blocks)

        accs = mainloop.zero_accs(p)
        a_copy, b_next = mainloop.load_k_tile(p, 0, kb_end)
        # Runtime loop; accs, a_copy and b_next are reassigned, so they are carried.
        for t in range(fx.Int32(1), tiles, fx.Int32(1), unroll=1):
            b_cur = b_next
            fx.barrier()
            mainloop.store_a(p, a_copy)
            fx.barrier()
            a_copy, b_next = mainloop.load_k_tile(p, t * p.blocks, kb_end)
            rocdl.sched_barrier(0)  # keep the next k-tile's loads ahead of this one's MMAs
            accs = mainloop.mma_k_tile(p, b_cur, accs)
        fx.barrier()
        mainloop.store_a(p, a_copy)
        fx.barrier()
        accs = mainloop.mma_k_tile(p, b_next, accs)

        col_rows = []
        for j in range_constexpr(p.reps_n):
            col = mainloop.lane_col(p, j)
            col_rows.append((col, col < rows_left))
        col0 = fx.Int64(expert * model_dim + origin_n)
        w_scales = _column_values(fx.get_iter(w2_scale) + col0, col_rows, quant)
        biases = _column_values(fx.get_iter(bias2) + col0, col_rows, has_bias)
        scale_buf = fx.get_iter(a2_scale)
        weight_buf = fx.get_iter(sorted_weights) + fx.Int64(origin_m)
        pout = fx.get_iter(out)
        dim64 = fx.Int64(model_dim)
        # 16 rows per wave through its LDS staging area (reusing the A stage), read back as
        # 16-byte runs of consecutive columns of one row (wholly inside or past model_dim):
        # "atomic" adds a run into out[token] a column pair at a time (a block holds each token
        # once, so its adds never collide with each other), "reduce" stores it to the routed row.
        out_lds = fx.recast_iter(out.dtype, lds)
        fx.barrier()  # every wave is done reading the A stage the staging areas reuse
        for i in range_constexpr(p.reps_m):
            _, x_scales, weights = _row_values(
                p, sid, i, tile_m, m, topk, scale_buf, weight_buf, True, quant, apply_weight
            )
            row_tiles = [
                _stage2_tile(accs[i * p.reps_n + j], x_scales, weights, w_scales[j],
                             biases[j], quant, has_bias, apply_weight)
                for j in range_constexpr(p.reps_n)
            ]  # fmt: skip
            mainloop.stage_out_rows(p, row_tiles, out_lds, out.dtype)
            for values, row16, col, real in mainloop.staged_runs(p, out_lds, out.dtype):
                token, slot, valid = _entry(sid, i * mx.MMA_MN + row16, tile_m, m, topk)
                gcol = origin_n + col
                dst_row = routed_row(token, slot, topk)
                if const_expr(mode == "atomic"):
                    dst_row = token
                off = matrix_offset(fx.Int64(dst_row), fx.Int64(gcol), dim64)
                if real & valid & (gcol < model_dim):
                    if const_expr(mode == "atomic"):
                        _atomic_add_run(pout + off, values, out_bytes)
                    else:
                        fx.ptr_store(values, pout + off)


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
        block=(mx.threads(mma), 1, 1),
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


def _check_offsets(name: str, nbytes: int, what: str = "") -> None:
    """The kernels address a tensor (or one expert's weight slab) with 32-bit byte offsets."""
    if nbytes >= mx.OFFSET_LIMIT:
        raise ValueError(
            f"{name}: {what}{nbytes} bytes is too large for the kernels' 32-bit buffer offsets "
            f"(limit {mx.OFFSET_LIMIT})"
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
      accumulation, v_mfma_f32_16x16x16 on gfx942, v_mfma_f32_16x16x32 on gfx950,
      v_wmma_f32_16x16x32 on gfx1250, k-blocks of 32), or fp8
      (float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950/gfx1250; v_mfma_f32_16x16x32_fp8_fp8
      / v_wmma_f32_16x16x64_fp8_fp8, k-blocks of 64) with every expert's [2 * inter, model_dim]
      slab preshuffled by gemm_shuffle_weight(w1[e], (16, 16)), a_scale float32 [M, 1]
      (per token) and w1_scale float32 [E, 2 * inter, 1] (per w1 row). bf16/fp16 take no scales.
      model_dim is a positive multiple of 64; inter of 8 (bf16/fp16) or 16 (fp8): columns of a
      tile past inter load zeros and store nothing. 1 <= M < 2**24; 1 <= topk <= 127. The
      kernel addresses a and one expert's w1 slab with 32-bit byte offsets:
      M * model_dim * elem_bytes and 2 * inter * model_dim * elem_bytes < 2**31 - 16.
    - Routing (moe_sorting): sorted_ids int32 [P], entry (slot << 24) | token, padding
      (topk << 24) | M; sorted_weights float32 [P]; sorted_expert_ids int32 [num_blocks], the
      LOCAL expert (index into w1) of sorted block b (rows b * tile_m ... + tile_m - 1);
      num_valid_ids int32 [2], [0] = sorted rows in use (a multiple of tile_m), [1] = valid
      tokens (unused here). tile.tile_m MUST equal the sorting block size. A block at or past
      num_valid_ids[0], or whose expert is outside [0, E), does nothing; rows whose entry has
      token >= M or slot >= topk are padding: they load zeros and store nothing.
      P * inter + 255 < 2**31.
    - The GEMM: the shared main loop (aiter/ops/shared/mainloop.py); A's tile_m rows (the
      block's tokens' rows of a) go through LDS, each wave streams the gate and the up rows of
      its tile_n / 4 columns; ksplit == 1 stores out1 in 16-byte runs staged through LDS.
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
    _check_offsets("a", m * model_dim * a.element_size())
    _check_offsets("w1", two_inter * model_dim * w1.element_size(), "one expert's slab of ")
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
      inter of 8 (bf16/fp16) or 16 (fp8): when inter ends inside a k-block, its 16-byte
      chunks past inter load zeros (buffer range check). M = out.shape[0] in [1, 2**24);
      1 <= topk <= 127. 32-bit byte offsets: M * topk * inter * elem_bytes and
      model_dim * inter * elem_bytes < 2**31 - 16.
    - The GEMM: the shared main loop; A's rows (the routed rows of a2) go through LDS, each
      wave streams the w2 rows of its tile_n / 4 columns; the epilogue stages 16 rows per wave
      through LDS and reads them back as 16-byte runs: "reduce" stores fp32 runs, "atomic" adds
      each bf16/fp16 run as packed 2-element atomics (global_atomic_pk_add_bf16/_f16, one
      32-bit word each; out's start must be 4-byte aligned, as torch's allocations are).
    - Routing as for launch_moe_stage1 (tile.tile_m MUST equal the sorting block size; inactive
      blocks, blocks of experts outside [0, E) and padding rows store nothing).
    - bias2 float32 [E, model_dim] or None, added after the scales and before the weight.
    - apply_weight: multiply by sorted_weights of the row (pass not doweight_stage1).
    - out [M, model_dim]: bfloat16 or float16. mode "atomic": out must be ZEROED by the caller;
      each routed row is cast to out's dtype and added with packed atomic adds in that dtype
      (rows of tokens routed nowhere stay zero); workspace is ignored. Every arch here has them
      for both dtypes (PACKED_ATOMIC_DTYPES; the planner picks "reduce" where one lacks
      them). mode "reduce": workspace float32
      stage2_workspace_shape(M, topk, model_dim) = [M * topk, model_dim], ZEROED by the caller;
      the GEMM kernel stores each routed row's fp32 value at row t * topk + k, then
      moe_topk_reduce writes every element of out: out[t] = cast(sum_k workspace[t * topk + k]).
      M * model_dim + 255 < 2**31.
    - tile: one of STAGE_TILES[mma]; mma and stream as for launch_moe_stage1.

    Kernels (jit names): moe_stage2 (Constexpr tile_m, tile_n, tile_k, mode, has_bias,
    apply_weight, quant, mma, k_tail = inter % K_BLOCK != 0, so aligned shapes compile without
    the K checks; topk and the sizes are runtime int32) and, for "reduce",
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
    _check_offsets("a2", routed * inter * a2.element_size())
    _check_offsets("w2", model_dim * inter * w2.element_size(), "one expert's slab of ")
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
