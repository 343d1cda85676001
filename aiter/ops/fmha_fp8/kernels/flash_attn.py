"""FlyDSL kernels and launcher of the fp8 flash-attention forward: online softmax over key blocks,
bottom-right causal masking, GQA, dense and varlen (cu_seqlens) batches, and split-KV with a
combine kernel. MFMA (wave64) for gfx942/gfx950, WMMA (wave32) for gfx1250.

flash_attn_index.py holds every index formula and the online-softmax rules.
"""

from __future__ import annotations

import math
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.fmha_fp8.kernels.flash_attn_index import (
    BLOCK_MS,
    BLOCK_N,
    COMBINE_BLOCK,
    HEAD_DIMS,
    IDLE_LOAD_OFFSET,
    K_COPY_BYTES,
    KEY_TILES,
    LOG2E,
    MMA_MN,
    V_COPY_BYTES,
    V_PIECE_COLS,
    V_PIECE_KEYS,
    WAVE_SIZE,
    acc_key,
    acc_rows_per_lane,
    acc_value_col,
    block_threads,
    chunk_offset,
    chunk_run,
    combine_element,
    combine_grid,
    dense_bounds,
    exp_base,
    full_chunks,
    grid_size,
    group_xor_offsets,
    has_half_chunk,
    head_offset,
    idle_slot,
    k_copy_count,
    k_copy_piece,
    k_copy_steps,
    k_lds_offset,
    key_valid,
    kv_block_rows,
    kv_blocks,
    kv_end,
    kv_head,
    kv_piece_offset,
    lane_group,
    lds_layout,
    lse_from,
    lse_offset,
    lse_position,
    needs_rescale,
    num_q_blocks,
    operand_key,
    operand_value_col,
    pv_steps,
    pv_tiles_per_step,
    query_pos,
    safe_row,
    split_range,
    split_workspace_shapes,
    unmasked_blocks,
    v_copy_count,
    v_copy_piece,
    v_copy_steps,
    v_lds_offset,
    v_transpose_source,
    varlen_bounds,
    work_item,
    ws_lse_offset,
    ws_out_offset,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared.fp8_pack import pack_fp8
from aiter.ops.shared.gemm_blocks import check_mma, load_run, to_stream
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.launch_args import check_rank, check_tensor
from aiter.ops.shared.wave_vote import any_lane

__all__ = [
    "BLOCK_MS",
    "BLOCK_N",
    "FP8_DTYPES",
    "HEAD_DIMS",
    "MAX_RESCALE_THRESHOLD",
    "MMA_FLAVOURS",
    "OUT_DTYPE",
    "WORKSPACE_DTYPE",
    "launch_flash_attn_fp8",
    "split_workspace_shapes",
]

MMA_FLAVOURS = ("mfma", "wmma")
FP8_DTYPES = (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
OUT_DTYPE = torch.bfloat16
WORKSPACE_DTYPE = torch.float32
DESCALE_DTYPE = torch.float32
CU_SEQLENS_DTYPE = torch.int32
# P = exp2(s - m) stays below 2**rescale_threshold; it must fit fp8 (e4m3fnuz max 240).
MAX_RESCALE_THRESHOLD = 7.0
# Every 32-bit index the kernels form stays below this (tensor offsets are 64-bit).
INDEX_LIMIT = 2**31
# A key block's buffer (BLOCK_N rows of Hkv x D bytes) stays below IDLE_LOAD_OFFSET.
MAX_KV_HEADS = IDLE_LOAD_OFFSET // (BLOCK_N * max(HEAD_DIMS)) + 1

_NEG_INF = float("-inf")

# Q operands come straight from global memory (one contiguous head-dim run per lane, as in the
# GEMM kernels). Each key block's K (row-major) and V (transposed) tiles are loaded by the whole
# work-group one block ahead, kept in registers over the current block's MMAs, and written to
# LDS between two barriers. Helpers hold no dynamic `if` or runtime loop: FlyDSL rewrites those
# only inside kernel functions.


def _select(cond, a, b):
    return cond.select(a, b)


def _scalar(base, offset, dtype):
    return load_run(base, fx.Int64(offset), 1, dtype)[0]


def _exp2(x):
    """2**x with the hardware exponential (v_exp_f32)."""
    return fx.Float32(rocdl.exp2(fx.Float32.ir_type, fx.Float32(x).ir_value()))


def _log2(x):
    """log2(x) with the hardware logarithm (v_log_f32)."""
    return fx.Float32(rocdl.log(fx.Float32.ir_type, fx.Float32(x).ir_value()))


def _operands(run, mma: str, half: bool):
    """The MMA operands of one lane's head-dim run: a 16-byte MFMA run feeds two 16x16x32 steps
    (8 bytes each), an 8-byte half run one; a 32-byte WMMA run feeds one 16x16x64, a 16-byte
    half run one after padding with zeros (the same zeros on both operands)."""
    if const_expr(mma == "mfma"):
        words = run.bitcast(fx.Int64)
        return [words[i] for i in range_constexpr(2 if not half else 1)]
    if const_expr(half):
        zeros = fx.Vector.filled(16, 0, fx.Uint8)
        run = run.bitcast(fx.Uint8).shuffle(zeros, list(range(32)))
    return [run.bitcast(fx.Int32).ir_value()]


def _mma(mma: str, a, b, acc):
    """acc + A B^T for one 16x16 tile; a and b are one MMA's operands."""
    if const_expr(mma == "mfma"):
        acc_ty = fx.Vector.make_type(4, fx.Float32)
        return fx.Vector(rocdl.mfma_f32_16x16x32_fp8_fp8(acc_ty, [a, b, acc]))
    acc_ty = fx.Vector.make_type(8, fx.Float32)
    return fx.Vector(rocdl.wmma_f32_16x16x64_fp8_fp8(acc_ty, a, b, acc.ir_value()).result)


def _head_runs(base, row_offset, lane, head_dim: int, mma: str, dtype):
    """Per 64-byte chunk of the head dim (and a trailing half chunk), the MMA operands of a
    lane's run of the row at element offset row_offset."""
    wsz = WAVE_SIZE[mma]
    operands = []
    for c in range_constexpr(full_chunks(head_dim)):
        off = row_offset + chunk_offset(c, lane, wsz, False)
        operands += _operands(load_run(base, off, chunk_run(wsz, False), dtype), mma, False)
    if const_expr(has_half_chunk(head_dim)):
        off = row_offset + chunk_offset(full_chunks(head_dim), lane, wsz, True)
        operands += _operands(load_run(base, off, chunk_run(wsz, True), dtype), mma, True)
    return operands


def _lds_head_runs(lds_ptr, k_base: int, key, lane, head_dim: int, mma: str):
    """_head_runs of key `key` of the K tile staged in LDS."""
    wsz = WAVE_SIZE[mma]
    operands = []
    for c in range_constexpr(full_chunks(head_dim) + has_half_chunk(head_dim)):
        half = c == full_chunks(head_dim)
        run_ty = fx.Vector.make_type(chunk_run(wsz, half), fx.Uint8)
        off = k_base + k_lds_offset(key, chunk_offset(c, lane, wsz, half), head_dim)
        operands += _operands(fx.ptr_load(lds_ptr + off, result_type=run_ty), mma, half)
    return operands


def _scores(mma: str, lds_ptr, k_base: int, head_dim: int, lane, q_ops):
    """S^T = K Q^T of one key block: KEY_TILES accumulators (keys x the wave's 16 queries),
    K read from its LDS tile."""
    rpl = acc_rows_per_lane(WAVE_SIZE[mma])
    accs = []
    for t in range_constexpr(KEY_TILES):
        k_ops = _lds_head_runs(lds_ptr, k_base, operand_key(0, t, lane), lane, head_dim, mma)
        acc = fx.Vector.filled(rpl, 0, fx.Float32)
        for s in range_constexpr(len(q_ops)):
            acc = _mma(mma, k_ops[s], q_ops[s], acc)
        accs.append(acc)
    return accs


def _words_operand(mma: str, words):
    """An MMA operand from 32-bit words: an i64 for MFMA (2 words), 8 x i32 for WMMA."""
    vec = fx.Vector.from_elements(words, fx.Int32)
    if const_expr(mma == "mfma"):
        return vec.bitcast(fx.Int64)[0]
    return vec.ir_value()


def _p_operands(mma: str, probs):
    """P^T operands of the P@V steps: step s takes the lane's probabilities of key tiles
    s * tiles_per_step ... in tile order (probs[t] lists the lane's elements of tile t)."""
    per = pv_tiles_per_step(mma)
    ops = []
    for s in range_constexpr(pv_steps(mma)):
        values = []
        for t in range_constexpr(s * per, (s + 1) * per):
            values += probs[t]
        ops.append(_words_operand(mma, pack_fp8(values)))
    return ops


def _v_operand(mma: str, lds_ptr, v_base: int, d_tile: int, step: int, lane):
    """V^T operand of P@V step `step` for value tile d_tile: the lane's value column, and per
    key tile of the step the acc_rows_per_lane keys its P bytes hold, read from LDS."""
    wsz = WAVE_SIZE[mma]
    rpl = acc_rows_per_lane(wsz)
    per = pv_tiles_per_step(mma)
    col = operand_value_col(d_tile, lane)
    words = []
    for t in range_constexpr(step * per, (step + 1) * per):
        off = v_base + v_lds_offset(col, acc_key(0, t, lane, 0, wsz))
        run = fx.ptr_load(lds_ptr + off, result_type=fx.Vector.make_type(rpl, fx.Uint8))
        bits = run.bitcast(fx.Int32)
        words += [bits[i] for i in range_constexpr(rpl // 4)]
    return _words_operand(mma, words)


def _pv_tile(mma: str, lds_ptr, v_base: int, d_tile: int, lane, p_ops, acc):
    """O^T tile d_tile += V^T P^T over the key block."""
    for s in range_constexpr(pv_steps(mma)):
        acc = _mma(mma, _v_operand(mma, lds_ptr, v_base, d_tile, s, lane), p_ops[s], acc)
    return acc


def _block_buffer(base, k_start, kv0, seqlen_k, live, row_elems):
    """A buffer over the token rows of the key block at kv0 that exist (kv_block_rows): loads
    past them return zeros. Its byte count is uniform, which keeps the descriptor in SGPRs."""
    rows = kv_block_rows(kv0, seqlen_k, live, _select)
    start = base + fx.Int64(k_start + kv0) * fx.Int64(row_elems)
    nbytes = fx.Int32(rocdl.readfirstlane(fx.Int32.ir_type, fx.Int32(rows * row_elems)))
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(start, fx.Int64(nbytes)))


def _buffer_words(rsrc, byte, count: int):
    """`count` dwords at `byte` of a buffer (zeros out of range), as i32 (count 1) or a
    vector."""
    ty = fx.Int32.ir_type if count == 1 else fx.Vector.make_type(count, fx.Int32)
    return rocdl.raw_ptr_buffer_load(ty, rsrc, fx.Int32(byte), fx.Int32(0), 0)


def _k_offsets(tid, threads: int, hk, hkv, head_dim: int):
    """Byte offsets of a thread's K pieces from a staged block's first token row (fp8)."""
    offsets = []
    for step in range_constexpr(k_copy_steps(head_dim, threads)):
        key, col, real = k_copy_piece(step, tid, threads, head_dim, _select)
        offsets.append(kv_piece_offset(key, col, hk, hkv, head_dim, real, _select))
    return offsets


def _v_offsets(tid, threads: int, hk, hkv, head_dim_v: int):
    """Byte offsets of the 4 keys of each of a thread's V pieces from a staged block's first
    token row."""
    offsets = []
    for step in range_constexpr(v_copy_steps(head_dim_v, threads)):
        key0, col, real = v_copy_piece(step, tid, threads, head_dim_v, _select)
        offsets.append([kv_piece_offset(key0 + k, col, hk, hkv, head_dim_v, real, _select)
                        for k in range_constexpr(V_PIECE_KEYS)])  # fmt: skip
    return offsets


def _load_k_pieces(rsrc, offsets):
    """The 16-byte K pieces of a thread (buffer loads of 4 dwords)."""
    return [fx.Vector(_buffer_words(rsrc, off, K_COPY_BYTES // 4)) for off in offsets]


def _load_v_pieces(rsrc, offsets):
    """The 4 keys x 4 columns V pieces of a thread: one dword per key, joined key-major."""
    pieces = []
    for keys in offsets:
        words = [fx.Int32(_buffer_words(rsrc, off, 1)) for off in keys]
        pieces.append(fx.Vector.from_elements(words, fx.Int32))
    return pieces


def _store_k_pieces(lds_ptr, k_base: int, idle, pieces, tid, threads: int, head_dim: int):
    """Write staged K pieces to their rows of the LDS tile (threads without a piece write to
    their wave's idle slot)."""
    for step in range_constexpr(len(pieces)):
        key, col, real = k_copy_piece(step, tid, threads, head_dim, _select)
        off = k_base + k_lds_offset(key, col, head_dim)
        if const_expr((step + 1) * threads > k_copy_count(head_dim)):
            off = real.select(off, idle)
        fx.ptr_store(pieces[step].bitcast(fx.Uint8), lds_ptr + off)


def _store_v_pieces(lds_ptr, v_base: int, idle, pieces, tid, threads: int, head_dim_v: int):
    """Transpose each staged V piece in registers (byte permutes) and write it as one 4-byte
    word of 4 consecutive keys per column (threads without a piece write to the idle slot)."""
    order = [v_transpose_source(i) for i in range(V_COPY_BYTES)]
    for step in range_constexpr(len(pieces)):
        key0, col, real = v_copy_piece(step, tid, threads, head_dim_v, _select)
        run = pieces[step].bitcast(fx.Uint8)
        moved = run.shuffle(run, order)
        for c in range_constexpr(V_PIECE_COLS):
            word = moved.shuffle(moved, list(range(c * V_PIECE_KEYS, (c + 1) * V_PIECE_KEYS)))
            off = v_base + v_lds_offset(col + c, key0)
            if const_expr((step + 1) * threads > v_copy_count(head_dim_v)):
                off = real.select(off, idle)
            fx.ptr_store(word, lds_ptr + off)


def _scaled_scores(accs, scale):
    """Per key tile, the lane's scores in log2 units (acc * scale), for a block without masked
    keys."""
    return [[acc[e] * scale for e in range_constexpr(len(acc))] for acc in accs]


def _masked_scores(accs, scale, kv0, lane, pos, seqlen_q, seqlen_k, causal: bool, wsz: int):
    """Per key tile, the lane's scores in log2 units (acc * scale), -inf where masked."""
    rpl = acc_rows_per_lane(wsz)
    neg_inf = fx.Float32(_NEG_INF)
    scores = []
    for t in range_constexpr(KEY_TILES):
        row = []
        for e in range_constexpr(rpl):
            key = acc_key(kv0, t, lane, e, wsz)
            valid = key_valid(key, pos, seqlen_q, seqlen_k, causal)
            row.append(valid.select(accs[t][e] * scale, neg_inf))
        scores.append(row)
    return scores


def _max(a, b):
    """max(a, b) as one v_max_f32 (fx.max propagates NaN: three instructions on gfx942). A NaN
    score still reaches the output through exp2 and the row sum."""
    return fx.maxnumf(a, b)


def _row_max(scores, wsz: int):
    """Max of a query's scores over the key block: the lane's own, then across the lanes that
    hold the same query (same lane % 16)."""
    m = scores[0][0]
    for row in scores:
        for value in row:
            m = _max(m, value)
    for offset in group_xor_offsets(wsz):
        m = _max(m, m.shuffle_xor(offset, wsz))
    return m


def _row_sum(x, wsz: int):
    """Sum over the lanes that hold the same query."""
    for offset in group_xor_offsets(wsz):
        x = x + x.shuffle_xor(offset, wsz)
    return x


def _probabilities(scores, base):
    """exp2(score - base) per element, and the lane's sum of them."""
    probs = []
    total = fx.Float32(0.0)
    for row in scores:
        out = []
        for value in row:
            p = _exp2(value - base)
            total = total + p
            out.append(p)
        probs.append(out)
    return probs, total


@flyc.kernel
def flash_attn_fp8_fwd_kernel(
    q: fx.Tensor,
    k: fx.Tensor,
    v: fx.Tensor,
    out: fx.Tensor,
    lse: fx.Tensor,
    q_descale: fx.Tensor,
    k_descale: fx.Tensor,
    v_descale: fx.Tensor,
    cu_seqlens_q: fx.Tensor,
    cu_seqlens_k: fx.Tensor,
    workspace_out: fx.Tensor,
    workspace_lse: fx.Tensor,
    batch: fx.Int32,
    seqlen_q: fx.Int32,
    seqlen_k: fx.Int32,
    hq: fx.Int32,
    hkv: fx.Int32,
    num_splits: fx.Int32,
    interleave: fx.Int32,
    rows: fx.Int32,
    softmax_scale: fx.Float32,
    block_m: fx.Constexpr[int],
    head_dim: fx.Constexpr[int],
    head_dim_v: fx.Constexpr[int],
    causal: fx.Constexpr[bool],
    has_lse: fx.Constexpr[bool],
    varlen: fx.Constexpr[bool],
    use_split: fx.Constexpr[bool],
    rescale_threshold: fx.Constexpr[float],
    mma: fx.Constexpr[str],
):
    """One work-group: block_m query rows of one head of one sequence, over its split's key
    blocks (all of them without use_split); one wave per 16 rows.

    Per key block: its K and V tiles (loaded into registers during the previous block) written
    to LDS between two barriers, K row-major and V transposed; the next block's loads issued;
    S^T = K Q^T (fp8 MMA, fp32 acc), scores in log2 units, masks (only in the second loop, over
    the blocks from unmasked_blocks on), the block max across the lanes of a query, the lazy
    rescale (needs_rescale; skipped by the wave while no lane needs it), P = exp2(s - base)
    rounded to fp8, O^T += V^T P^T. Finally out = O * v_descale / l (bf16) and lse, or with
    use_split the unnormalised O and (m, l) into the fp32 workspaces.
    """
    wsz = WAVE_SIZE[mma]
    rpl = acc_rows_per_lane(wsz)
    threads = block_threads(block_m, mma)
    d_tiles = head_dim_v // MMA_MN
    tid = fx.thread_idx.x
    lane = tid % wsz
    wave = tid // wsz
    k_base, v_base, idle_base, lds_total = lds_layout(head_dim, head_dim_v, threads // wsz)
    lds_ptr = fx.SharedAllocator().allocate(fx.Array[fx.Uint8, lds_total, 16])
    lds_ptr = lds_ptr.peek().ptr
    idle = idle_slot(idle_base, wave)

    q_blocks = num_q_blocks(seqlen_q, block_m)
    b, h, q_block, split = work_item(fx.block_idx.x, batch, hq, q_blocks, interleave)
    if const_expr(varlen):
        pcq = fx.get_iter(cu_seqlens_q)
        pck = fx.get_iter(cu_seqlens_k)
        q_start, sq, k_start, sk = varlen_bounds(
            _scalar(pcq, b, fx.Int32), _scalar(pcq, b + 1, fx.Int32),
            _scalar(pck, b, fx.Int32), _scalar(pck, b + 1, fx.Int32),
        )  # fmt: skip
    else:
        q_start, sq, k_start, sk = dense_bounds(b, seqlen_q, seqlen_k)
    hk = kv_head(h, hq, hkv)
    pos = query_pos(q_block, block_m, wave, lane)
    row_ok = pos < sq
    q_row = fx.Int64(safe_row(row_ok, q_start + pos, _select))

    pq = fx.get_iter(q)
    pk = fx.get_iter(k)
    pv = fx.get_iter(v)
    in_dtype = q.dtype
    q_ops = _head_runs(pq, head_offset(q_row, fx.Int64(h), fx.Int64(hq), head_dim), lane,
                       head_dim, mma, in_dtype)  # fmt: skip
    scale = (
        _scalar(fx.get_iter(q_descale), 0, fx.Float32)
        * _scalar(fx.get_iter(k_descale), 0, fx.Float32)
        * softmax_scale
        * LOG2E
    )

    q0 = q_block * block_m
    blocks = kv_blocks(kv_end(q0, block_m, sq, sk, causal, _select))
    if const_expr(use_split):
        kb_begin, kb_end = split_range(split, blocks, num_splits)
    else:
        kb_begin, kb_end = fx.Int32(0), blocks

    k_offsets = _k_offsets(tid, threads, hk, hkv, head_dim)
    v_offsets = _v_offsets(tid, threads, hk, hkv, head_dim_v)
    any_block = kb_begin < kb_end
    kv_first = kb_begin * BLOCK_N
    # (buffer descriptors are not loop-carried values: no name is shared with the loop's)
    k_next = _load_k_pieces(
        _block_buffer(pk, k_start, kv_first, sk, any_block, hkv * head_dim), k_offsets
    )
    v_next = _load_v_pieces(
        _block_buffer(pv, k_start, kv_first, sk, any_block, hkv * head_dim_v), v_offsets
    )
    m_used = fx.Float32(_NEG_INF)
    l_part = fx.Float32(0.0)
    o = [fx.Vector.filled(rpl, 0, fx.Float32) for _ in range_constexpr(d_tiles)]
    # Two loops: the leading blocks that need no mask, then the diagonal and tail blocks.
    mask_from = unmasked_blocks(q0, sq, sk, causal, _select)
    mask_from = _select(mask_from < kb_end, mask_from, kb_end)
    mask_from = _select(mask_from > kb_begin, mask_from, kb_begin)
    for masked in range_constexpr(2):
        lo, hi = (mask_from, kb_end) if masked else (kb_begin, mask_from)
        for kb in range(lo, hi, fx.Int32(1)):
            kv0 = kb * BLOCK_N
            fx.barrier()  # every wave is done reading the previous block's K and V
            _store_k_pieces(lds_ptr, k_base, idle, k_next, tid, threads, head_dim)
            _store_v_pieces(lds_ptr, v_base, idle, v_next, tid, threads, head_dim_v)
            fx.barrier()
            # The next block's loads fly during this block's MMAs; past the last block they
            # load nothing (an empty buffer) and are never stored.
            live = kb + 1 < kb_end
            k_buf = _block_buffer(pk, k_start, kv0 + BLOCK_N, sk, live, hkv * head_dim)
            v_buf = _block_buffer(pv, k_start, kv0 + BLOCK_N, sk, live, hkv * head_dim_v)
            k_next = _load_k_pieces(k_buf, k_offsets)
            v_next = _load_v_pieces(v_buf, v_offsets)
            rocdl.sched_barrier(0)  # issued before the block's first MMA, not among them
            accs = _scores(mma, lds_ptr, k_base, head_dim, lane, q_ops)

            if const_expr(masked):
                scores = _masked_scores(accs, scale, kv0, lane, pos, sq, sk, causal, wsz)
            else:
                scores = _scaled_scores(accs, scale)
            m_candidate = _max(m_used, _row_max(scores, wsz))
            rescale = needs_rescale(m_used, m_candidate, rescale_threshold)
            # A uniform branch: the wave skips the rescale while no row's max grew enough.
            if any_lane(rescale, wsz):
                factor = rescale.select(_exp2(m_used - m_candidate), fx.Float32(1.0))
                o = [acc * factor for acc in o]
                l_part = l_part * factor
                m_used = rescale.select(m_candidate, m_used)
            probs, block_sum = _probabilities(scores, exp_base(m_used, _NEG_INF, _select))
            l_part = l_part + block_sum
            p_ops = _p_operands(mma, probs)
            o = [_pv_tile(mma, lds_ptr, v_base, dt, lane, p_ops, o[dt])
                 for dt in range_constexpr(d_tiles)]  # fmt: skip

    total = _row_sum(l_part, wsz)
    first_col = [acc_value_col(dt, lane, 0, wsz) for dt in range_constexpr(d_tiles)]
    out_row = fx.Int64(q_start + pos)
    if const_expr(not use_split):
        v_scale = _scalar(fx.get_iter(v_descale), 0, fx.Float32)
        inv = (total > 0.0).select(v_scale / (total > 0.0).select(total, 1.0), 0.0)
        pout = fx.get_iter(out)
        base = head_offset(out_row, fx.Int64(h), fx.Int64(hq), head_dim_v)
        values = [(o[dt] * inv).to(fx.BFloat16) for dt in range_constexpr(d_tiles)]
        if row_ok:
            for dt in range_constexpr(d_tiles):
                fx.ptr_store(values[dt].ir_value(), pout + (base + fx.Int64(first_col[dt])))
        if const_expr(has_lse):
            value = lse_from(m_used, total, _NEG_INF, _log2, _select)
            if const_expr(varlen):
                off = lse_offset(0, fx.Int64(h), out_row, fx.Int64(hq), fx.Int64(rows))
            else:
                off = lse_offset(
                    fx.Int64(b), fx.Int64(h), fx.Int64(pos), fx.Int64(hq), fx.Int64(seqlen_q)
                )
            if row_ok & (lane_group(lane) == 0):
                fx.ptr_store(value, fx.get_iter(lse) + off)
    else:
        pws = fx.get_iter(workspace_out)
        r64, h64, hq64, rows64 = fx.Int64(out_row), fx.Int64(h), fx.Int64(hq), fx.Int64(rows)
        s64 = fx.Int64(split)
        offsets = [
            ws_out_offset(s64, r64, h64, fx.Int64(first_col[dt]), rows64, hq64, head_dim_v)
            for dt in range_constexpr(d_tiles)
        ]
        if row_ok:
            for dt in range_constexpr(d_tiles):
                fx.ptr_store(o[dt].ir_value(), pws + offsets[dt])
        pml = fx.get_iter(workspace_lse) + ws_lse_offset(s64, r64, h64, rows64, hq64)
        pair = fx.Vector.from_elements([m_used, total], fx.Float32)
        if row_ok & (lane_group(lane) == 0):
            fx.ptr_store(pair.ir_value(), pml)


@flyc.jit
def flash_attn_fp8_fwd(
    q: fx.Tensor,
    k: fx.Tensor,
    v: fx.Tensor,
    out: fx.Tensor,
    lse: fx.Tensor,
    q_descale: fx.Tensor,
    k_descale: fx.Tensor,
    v_descale: fx.Tensor,
    cu_seqlens_q: fx.Tensor,
    cu_seqlens_k: fx.Tensor,
    workspace_out: fx.Tensor,
    workspace_lse: fx.Tensor,
    batch: fx.Int32,
    seqlen_q: fx.Int32,
    seqlen_k: fx.Int32,
    hq: fx.Int32,
    hkv: fx.Int32,
    num_splits: fx.Int32,
    interleave: fx.Int32,
    rows: fx.Int32,
    softmax_scale: fx.Float32,
    block_m: fx.Constexpr[int],
    head_dim: fx.Constexpr[int],
    head_dim_v: fx.Constexpr[int],
    causal: fx.Constexpr[bool],
    has_lse: fx.Constexpr[bool],
    varlen: fx.Constexpr[bool],
    use_split: fx.Constexpr[bool],
    rescale_threshold: fx.Constexpr[float],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    flash_attn_fp8_fwd_kernel(
        q, k, v, out, lse, q_descale, k_descale, v_descale, cu_seqlens_q, cu_seqlens_k,
        workspace_out, workspace_lse, batch, seqlen_q, seqlen_k, hq, hkv, num_splits, interleave,
        rows, softmax_scale, block_m, head_dim, head_dim_v, causal, has_lse, varlen, use_split,
        rescale_threshold, mma,
    ).launch(
        grid=(grid_size(batch, hq, num_q_blocks(seqlen_q, block_m), num_splits), 1, 1),
        block=(block_threads(block_m, mma), 1, 1),
        stream=stream,
    )  # fmt: skip


@flyc.kernel
def flash_attn_fp8_combine_kernel(
    workspace_out: fx.Tensor,
    workspace_lse: fx.Tensor,
    v_descale: fx.Tensor,
    out: fx.Tensor,
    lse: fx.Tensor,
    rows: fx.Int32,
    hq: fx.Int32,
    head_dim_v: fx.Int32,
    num_splits: fx.Int32,
    lse_length: fx.Int32,
    has_lse: fx.Constexpr[bool],
):
    """One thread per element of out: M = max over splits of m_s, w_s = exp2(m_s - base(M)),
    out = sum w_s O_s * v_descale / sum w_s l_s (0 when the row saw no key), and the row's lse
    from (M, sum w_s l_s) by the thread of value column 0."""
    idx, row, head, col = combine_element(fx.block_idx.x, fx.thread_idx.x, hq, head_dim_v)
    if idx < rows * hq * head_dim_v:
        pml = fx.get_iter(workspace_lse)
        pws = fx.get_iter(workspace_out)
        r64, h64, hq64, rows64 = fx.Int64(row), fx.Int64(head), fx.Int64(hq), fx.Int64(rows)
        m_max = fx.Float32(_NEG_INF)
        for s in range(fx.Int32(0), num_splits, fx.Int32(1)):
            m_s = _scalar(pml, ws_lse_offset(fx.Int64(s), r64, h64, rows64, hq64), fx.Float32)
            m_max = fx.max(m_max, m_s)
        base = exp_base(m_max, _NEG_INF, _select)
        acc = fx.Float32(0.0)
        den = fx.Float32(0.0)
        for s in range(fx.Int32(0), num_splits, fx.Int32(1)):
            s64 = fx.Int64(s)
            ml = load_run(pml, ws_lse_offset(s64, r64, h64, rows64, hq64), 2, fx.Float32)
            w = _exp2(ml[0] - base)
            o_s = _scalar(
                pws, ws_out_offset(s64, r64, h64, fx.Int64(col), rows64, hq64,
                                   fx.Int64(head_dim_v)), fx.Float32,
            )  # fmt: skip
            acc = acc + w * o_s
            den = den + w * ml[1]
        v_scale = _scalar(fx.get_iter(v_descale), 0, fx.Float32)
        value = (den > 0.0).select(acc * (v_scale / (den > 0.0).select(den, 1.0)), 0.0)
        fx.ptr_store(value.to(fx.BFloat16), fx.get_iter(out) + fx.Int64(idx))
        if const_expr(has_lse):
            batch_of_row, pos = lse_position(row, lse_length)
            off = lse_offset(fx.Int64(batch_of_row), h64, fx.Int64(pos), hq64, fx.Int64(lse_length))
            lse_value = lse_from(m_max, den, _NEG_INF, _log2, _select)
            if col == 0:
                fx.ptr_store(lse_value, fx.get_iter(lse) + off)


@flyc.jit
def flash_attn_fp8_combine(
    workspace_out: fx.Tensor,
    workspace_lse: fx.Tensor,
    v_descale: fx.Tensor,
    out: fx.Tensor,
    lse: fx.Tensor,
    rows: fx.Int32,
    hq: fx.Int32,
    head_dim_v: fx.Int32,
    num_splits: fx.Int32,
    lse_length: fx.Int32,
    has_lse: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    flash_attn_fp8_combine_kernel(
        workspace_out, workspace_lse, v_descale, out, lse, rows, hq, head_dim_v, num_splits,
        lse_length, has_lse,
    ).launch(
        grid=(combine_grid(rows, hq, head_dim_v), 1, 1),
        block=(COMBINE_BLOCK, 1, 1),
        stream=stream,
    )  # fmt: skip


# --- host launcher -----------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_head_dim(name: str, what: str, value: int) -> None:
    if value not in HEAD_DIMS:
        raise ValueError(f"{name}: {what} = {value} must be one of {HEAD_DIMS}")


def _check_options(softmax_scale, causal, block_m, rescale_threshold, num_kv_splits, interleave,
                   mma) -> None:  # fmt: skip
    check_mma(mma, MMA_FLAVOURS)
    if not _is_real(softmax_scale):
        raise TypeError(
            f"softmax_scale: expected a Python float, got {type(softmax_scale).__name__}"
        )
    if not math.isfinite(float(softmax_scale)):
        raise ValueError(f"softmax_scale: expected a finite float, got {softmax_scale!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if not _is_int(block_m) or block_m not in BLOCK_MS:
        raise ValueError(f"block_m: expected one of {BLOCK_MS}, got {block_m!r}")
    if not _is_real(rescale_threshold):
        raise TypeError(
            f"rescale_threshold: expected a Python float, got {type(rescale_threshold).__name__}"
        )
    if not 0.0 <= float(rescale_threshold) <= MAX_RESCALE_THRESHOLD:
        raise ValueError(
            f"rescale_threshold: expected a float in [0.0, {MAX_RESCALE_THRESHOLD}] (P up to "
            f"2**threshold must fit fp8), got {rescale_threshold!r}"
        )
    if not _is_int(num_kv_splits) or num_kv_splits < 1:
        raise ValueError(f"num_kv_splits: expected an int >= 1, got {num_kv_splits!r}")
    if not (isinstance(interleave, bool) or (_is_int(interleave) and interleave in (0, 1))):
        raise ValueError(f"interleave: expected a bool or 0/1, got {interleave!r}")


def launch_flash_attn_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    q_descale: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    *,
    softmax_scale: float,
    causal: bool,
    block_m: int,
    rescale_threshold: float,
    num_kv_splits: int,
    interleave: bool | int,
    mma: str,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    workspace_out: torch.Tensor | None = None,
    workspace_lse: torch.Tensor | None = None,
    stream: Any | None = None,
) -> None:
    """Launch the fp8 flash-attention forward (and, with num_kv_splits > 1, the combine).

    Contract (reads shapes and dtypes only, never data; CPU tensors or FakeTensors compile
    without running under COMPILE_ONLY=1):

    - q, k, v: one fp8 dtype (FP8_DTYPES; float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950 and
      gfx1250: choosing it for the arch is the caller's business). q_descale, k_descale,
      v_descale: float32 [1]; the real values are x_fp8 * descale.
    - S = (q . k) * q_descale * k_descale * softmax_scale (a finite Python float, e.g.
      1 / sqrt(D)); causal is bottom-right aligned: query i of a sequence of Sq queries and Sk
      keys sees keys j <= i + Sk - Sq; a row that sees no key gets out 0 and lse -inf. GQA:
      query head h reads kv head h // (Hq / Hkv); Hq % Hkv == 0.
      out = softmax(S) @ (v * v_descale) in bfloat16; lse = logsumexp(S) (natural log, fp32).
    - dense (no varlen argument): q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv],
      out [B, Sq, Hq, Dv], lse None or [B, Hq, Sq]; B, Sq, Sk >= 1.
    - varlen (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k all given): q [Tq, Hq, D],
      k [Tk, Hkv, D], v [Tk, Hkv, Dv], out [Tq, Hq, Dv], lse None or [Hq, Tq]; cu_seqlens_q/_k
      int32 [B + 1], sequence b is rows cu[b] .. cu[b + 1] (zero-length sequences allowed; the
      values are the caller's promise: nondecreasing, cu[0] = 0, cu[B] = Tq / Tk);
      max_seqlen_q >= 1 and >= every query length (it sizes the grid), max_seqlen_k >= 0
      (not used by the kernels); Tq, Tk >= 1.
    - D and Dv (may differ, e.g. 192 / 128): HEAD_DIMS (64 .. 256, step 32).
    - Every tensor contiguous (the kernels address [rows, heads, dim] with dim innermost).
    - block_m: BLOCK_MS (query rows per work-group, one wave per 16). Key blocks of BLOCK_N.
    - rescale_threshold in [0, MAX_RESCALE_THRESHOLD]: a row rescales O and its sum only when
      its running max grows by more than this many log2 units (0.0: whenever it grows); until
      then exponentials keep the old max (P <= 2**threshold, which fp8 holds).
    - P is rounded to the arch's fp8 (round to nearest even) for the fp8 P@V MMA; the row sum
      l uses the unrounded fp32 P.
    - num_kv_splits >= 1. 1: the forward writes out and lse; workspaces are ignored. > 1:
      workspace_out and workspace_lse float32 contiguous, split_workspace_shapes(rows, Hq, Dv,
      num_kv_splits) = [splits, rows, Hq, Dv] and [splits, rows, Hq, 2] (rows = B * Sq or Tq;
      need not be zeroed). Split s owns key blocks [s * n // splits, (s + 1) * n // splits) of
      the n blocks its query block reads and stores the unnormalised O and (m, l) (log2 base,
      exp2 sum) of every existing row; flash_attn_fp8_combine merges them into out and lse.
    - interleave (bool or 0/1, runtime): consecutive work-groups alternate between batch b and
      B - 1 - b; it only changes the work-group -> (batch, head, q block) order.
    - mma: "mfma" (wave64 v_mfma_f32_16x16x32_fp8_fp8; gfx942/gfx950) or "wmma" (wave32
      v_wmma_f32_16x16x64_fp8_fp8; gfx1250).
    - Limits (ValueError): grid work-groups, rows * Hq * Dv and every row count < 2**31.
    - stream: None, an fx.Stream, a raw handle or an object with `cuda_stream`.

    Kernels (jit names): flash_attn_fp8_fwd (Constexpr block_m, head_dim, head_dim_v, causal,
    has_lse, varlen, use_split, rescale_threshold, mma; batch, Sq/max_seqlen_q, Sk/max_seqlen_k,
    Hq, Hkv, num_kv_splits, interleave, rows and softmax_scale are runtime, so they never change
    a cache key; with use_split it is compiled with has_lse False, which it does not use) and,
    for num_kv_splits > 1, flash_attn_fp8_combine (Constexpr has_lse). Tensors a configuration
    does not read are passed as q_descale.
    """
    _check_options(softmax_scale, causal, block_m, rescale_threshold, num_kv_splits, interleave,
                   mma)  # fmt: skip
    varlen_args = {
        "cu_seqlens_q": cu_seqlens_q,
        "cu_seqlens_k": cu_seqlens_k,
        "max_seqlen_q": max_seqlen_q,
        "max_seqlen_k": max_seqlen_k,
    }
    given = [name for name, value in varlen_args.items() if value is not None]
    varlen = bool(given)
    if varlen and len(given) != len(varlen_args):
        missing = [name for name in varlen_args if name not in given]
        raise ValueError(f"{', '.join(missing)}: varlen needs all of {list(varlen_args)}")

    if varlen:
        tq, hq, d = check_rank("q", q, 3, "[Tq, Hq, D]")
        tk, hkv, _ = check_rank("k", k, 3, "[Tk, Hkv, D]")
        dv = check_rank("v", v, 3, "[Tk, Hkv, Dv]")[2]
        if tq < 1 or tk < 1:
            raise ValueError(f"q, k: Tq and Tk must be >= 1, got {tq} and {tk}")
        batch = check_rank("cu_seqlens_q", cu_seqlens_q, 1, "[B + 1]")[0] - 1
        if batch < 1:
            raise ValueError("cu_seqlens_q: expected at least 2 entries (B >= 1)")
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            check_tensor(name, cu, (CU_SEQLENS_DTYPE,), (batch + 1,), "[B + 1]")
        for name, value, low in (
            ("max_seqlen_q", max_seqlen_q, 1),
            ("max_seqlen_k", max_seqlen_k, 0),
        ):
            if not _is_int(value) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        seqlen_q, seqlen_k, rows = max_seqlen_q, max_seqlen_k, tq
        q_shape, k_shape, v_shape = (tq, hq, d), (tk, hkv, d), (tk, hkv, dv)
        out_shape, lse_shape = (tq, hq, dv), (hq, tq)
        q_what, kv_what, o_what, lse_what = (
            "[Tq, Hq, D]",
            "[Tk, Hkv, D]",
            "[Tq, Hq, Dv]",
            "[Hq, Tq]",
        )
    else:
        batch, seqlen_q, hq, d = check_rank("q", q, 4, "[B, Sq, Hq, D]")
        _, seqlen_k, hkv, _ = check_rank("k", k, 4, "[B, Sk, Hkv, D]")
        dv = check_rank("v", v, 4, "[B, Sk, Hkv, Dv]")[3]
        if min(batch, seqlen_q, seqlen_k) < 1:
            raise ValueError(
                f"q, k: B, Sq and Sk must be >= 1, got {batch}, {seqlen_q}, {seqlen_k}"
            )
        rows = batch * seqlen_q
        q_shape, k_shape = (batch, seqlen_q, hq, d), (batch, seqlen_k, hkv, d)
        v_shape, out_shape = (batch, seqlen_k, hkv, dv), (batch, seqlen_q, hq, dv)
        lse_shape = (batch, hq, seqlen_q)
        q_what, kv_what, o_what, lse_what = (
            "[B, Sq, Hq, D]", "[B, Sk, Hkv, D]", "[B, Sq, Hq, Dv]", "[B, Hq, Sq]"
        )  # fmt: skip
    if q.dtype not in FP8_DTYPES:
        raise ValueError(f"q: expected dtype in {FP8_DTYPES}, got {q.dtype}")
    _check_head_dim("q", "D = q.shape[-1]", d)
    _check_head_dim("v", "Dv = v.shape[-1]", dv)
    if hkv < 1 or hq % hkv:
        raise ValueError(f"k: Hq = {hq} must be a multiple of Hkv = {hkv} (GQA)")
    if hkv >= MAX_KV_HEADS:
        raise ValueError(f"k: Hkv = {hkv} kv heads; at most {MAX_KV_HEADS - 1} are supported")
    check_tensor("q", q, FP8_DTYPES, q_shape, q_what)
    check_tensor("k", k, (q.dtype,), k_shape, kv_what)
    check_tensor("v", v, (q.dtype,), v_shape, kv_what.replace("D]", "Dv]"))
    check_tensor("out", out, (OUT_DTYPE,), out_shape, o_what)
    has_lse = lse is not None
    if has_lse:
        check_tensor("lse", lse, (torch.float32,), lse_shape, lse_what)
    for name, scale in (
        ("q_descale", q_descale),
        ("k_descale", k_descale),
        ("v_descale", v_descale),
    ):
        check_tensor(name, scale, (DESCALE_DTYPE,), (1,), "[1]")
    use_split = num_kv_splits > 1
    if use_split:
        ws_shapes = split_workspace_shapes(rows, hq, dv, num_kv_splits)
        for name, ws, shape in (("workspace_out", workspace_out, ws_shapes[0]),
                                ("workspace_lse", workspace_lse, ws_shapes[1])):  # fmt: skip
            if ws is None:
                raise ValueError(
                    f"{name}: expected a float32 {list(shape)} tensor when num_kv_splits > 1"
                )
            check_tensor(name, ws, (WORKSPACE_DTYPE,), shape, "split_workspace_shapes(...)")
    q_blocks = num_q_blocks(seqlen_q, block_m)
    if grid_size(batch, hq, q_blocks, num_kv_splits) >= INDEX_LIMIT:
        raise ValueError(
            f"num_kv_splits: {num_kv_splits} splits x {hq} heads x {q_blocks} query blocks x "
            f"{batch} batches is too many work-groups for 32-bit indices"
        )
    if rows * hq * dv + COMBINE_BLOCK >= INDEX_LIMIT:
        raise ValueError(f"out: rows * Hq * Dv = {rows * hq * dv} is too large for 32-bit indices")
    k_rows = int(k.shape[0]) if varlen else batch * seqlen_k
    # The key loop forms row indices up to two blocks past a sequence's end.
    if max(rows, k_rows + 2 * BLOCK_N) >= INDEX_LIMIT:
        raise ValueError(f"q, k: {max(rows, k_rows)} token rows are too many for 32-bit indices")

    stand_in = q_descale
    fx_stream = to_stream(stream)
    cu_q = cu_seqlens_q if varlen else stand_in
    cu_k = cu_seqlens_k if varlen else stand_in
    ws_out = workspace_out if use_split else stand_in
    ws_lse = workspace_lse if use_split else stand_in
    lse_arg = lse if has_lse else stand_in
    q, k, v, out, lse_arg, q_descale, k_descale, v_descale, cu_q, cu_k, ws_out, ws_lse = (
        kernel_tensors(
            q, k, v, out, lse_arg, q_descale, k_descale, v_descale, cu_q, cu_k, ws_out, ws_lse
        )
    )
    flash_attn_fp8_fwd(
        q, k, v, out, lse_arg, q_descale, k_descale, v_descale, cu_q, cu_k, ws_out, ws_lse,
        batch, seqlen_q, seqlen_k, hq, hkv, num_kv_splits, int(interleave), rows,
        float(softmax_scale), block_m=block_m, head_dim=d, head_dim_v=dv, causal=causal,
        has_lse=has_lse and not use_split, varlen=varlen, use_split=use_split,
        rescale_threshold=float(rescale_threshold), mma=mma, stream=fx_stream,
    )  # fmt: skip
    if use_split:
        flash_attn_fp8_combine(
            ws_out, ws_lse, v_descale, out, lse_arg, rows, hq, dv, num_kv_splits,
            rows if varlen else seqlen_q, has_lse=has_lse, stream=fx_stream,
        )  # fmt: skip
