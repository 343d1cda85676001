"""FlyDSL kernel and launcher of chunk_gdn_h, the chunked gated delta rule's hidden-state pass:
one work-group per (sequence, value head, V tile of block_v columns) walks the sequence's
chunks with the state tile [K, block_v] in fp32 registers. MFMA (wave64) on gfx942 and gfx950,
WMMA (wave32) on gfx1250; bf16 or fp16 inputs.

chunk_h_index.py holds every index formula; the lane layout is described there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import (
    BLOCK_VS,
    CHUNK_SIZES,
    CONTRACTION_BLOCK,
    HEAD_DIMS,
    K_PIECE,
    MMA_MN,
    TOKEN_QUAD,
    WAVE_SIZE,
    chunk_tokens,
    contraction_index,
    dense_sequence,
    g_offset,
    grid_size,
    h_offset,
    k_copy_item,
    k_copy_steps,
    k_offset,
    key_head,
    kt_lds_elements,
    kt_lds_offset,
    lane_col,
    lane_row,
    last_token,
    num_chunks,
    rows_per_lane,
    state_offset,
    threads,
    token_row,
    u_offset,
    value_col,
    varlen_sequence,
    w_offset,
    work_group,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared.gemm_blocks import check_mma, load_run, to_stream
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.mainloop import mma_16bit, mma_k

__all__ = ["MMA_FLAVOURS", "launch_chunk_gdn_h"]

MMA_FLAVOURS = ("mfma", "wmma")
INPUT_DTYPES = (torch.bfloat16, torch.float16)
GATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SEQLENS_DTYPES = (torch.int32,)

# Helpers hold no dynamic `if` or runtime loop: FlyDSL rewrites those only inside kernel
# functions.


@dataclass(frozen=True)
class _MmaStep:
    """What the shared 16-bit MMA step reads: the flavour, the input type and the arch's K."""

    mma: str
    dtype: Any
    mma_k: int


def _select(cond, a, b):
    return cond.select(a, b)


def _scalar(base, offset, dtype):
    return load_run(base, fx.Int64(offset), 1, dtype)[0]


def _exp2(x):
    """2**x with the hardware exponential (v_exp_f32)."""
    return fx.Float32(rocdl.exp2(fx.Float32.ir_type, fx.Float32(x).ir_value()))


def _concat(a, b, length: int):
    return a.shuffle(b, list(range(2 * length)))


def _operand_from_accs(tiles, block: int, dtype, rpl: int):
    """The MMA operand of contraction block `block` from accumulator tiles (tile 2 * block,
    then 2 * block + 1), rounded to the input type."""
    low = tiles[2 * block].to(dtype)
    high = tiles[2 * block + 1].to(dtype)
    return _concat(low, high, rpl)


def _w_operand(pw, row, head, heads, block: int, lane, head_dim: int, wsz: int, dtype):
    """w's operand of contraction block `block` for token row `row`: the lane's two runs of
    rows_per_lane key columns, in contraction_index order."""
    rpl = rows_per_lane(wsz)
    runs = []
    for sub in range_constexpr(2):
        kk = contraction_index(block, lane, sub * rpl, wsz)
        runs.append(load_run(pw, fx.Int64(w_offset(row, head, kk, heads, head_dim)), rpl, dtype))
    return _concat(runs[0], runs[1], rpl)


def _kt_operand(lds_k, kk, block: int, lane, chunk_size: int, wsz: int, dtype):
    """k^T's operand of contraction block `block` for key row kk, from the LDS tile."""
    rpl = rows_per_lane(wsz)
    runs = []
    for sub in range_constexpr(2):
        t = contraction_index(block, lane, sub * rpl, wsz)
        ty = fx.Vector.make_type(rpl, dtype)
        runs.append(fx.ptr_load(lds_k + kt_lds_offset(kk, t, chunk_size), result_type=ty))
    return _concat(runs[0], runs[1], rpl)


@flyc.kernel
def chunk_gdn_h_kernel(
    k: fx.Tensor,
    w: fx.Tensor,
    u: fx.Tensor,
    g: fx.Tensor,
    gk: fx.Tensor,
    h: fx.Tensor,
    v_new: fx.Tensor,
    h0: fx.Tensor,
    ht: fx.Tensor,
    cu_seqlens: fx.Tensor,
    chunk_offsets: fx.Tensor,
    seqlen: fx.Int32,
    heads: fx.Int32,
    key_heads: fx.Int32,
    head_dim_v: fx.Int32,
    head_dim: fx.Constexpr[int],
    chunk_size: fx.Constexpr[int],
    block_v: fx.Constexpr[int],
    use_g: fx.Constexpr[bool],
    use_gk: fx.Constexpr[bool],
    use_h0: fx.Constexpr[bool],
    store_final_state: fx.Constexpr[bool],
    save_new_value: fx.Constexpr[bool],
    varlen: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
):
    """One work-group: the state strip [K, 16] of each wave over one sequence's chunks.

    Per chunk: store the state (input type) to h; stage the chunk's k tile transposed in LDS
    (between two barriers); v_new = u - w h, w's runs from global memory and h's operand from
    the state's own accumulators; store v_new; with g, v_new' = v_new * exp2(g_last - g_t)
    and the state times exp2(g_last); with gk, each state row times exp2(gk_last); then the
    state += k^T v_new', v_new' as the operand straight from v_new's accumulators. Tokens past
    the sequence's end read as zeros and are never stored.
    """
    wsz = WAVE_SIZE[mma]
    rpl = rows_per_lane(wsz)
    block_threads = threads(block_v, mma)
    k_tiles = head_dim // MMA_MN
    t_tiles = chunk_size // MMA_MN
    tid = fx.thread_idx.x
    lane = tid % wsz
    wave = tid // wsz
    dtype = k.dtype
    step = _MmaStep(mma, dtype, mma_k(mma))

    lds = fx.SharedAllocator().allocate(
        fx.Array[fx.Uint8, 2 * kt_lds_elements(head_dim, chunk_size), 16]
    )
    lds_k = fx.recast_iter(dtype, lds.peek().ptr)

    seq, head, tile = work_group(fx.block_idx.x, heads, head_dim_v, block_v)
    if const_expr(varlen):
        pcu = fx.get_iter(cu_seqlens)
        bos, tokens, chunk0 = varlen_sequence(
            _scalar(pcu, seq, fx.Int32), _scalar(pcu, seq + 1, fx.Int32),
            _scalar(fx.get_iter(chunk_offsets), seq, fx.Int32),
        )  # fmt: skip
    else:
        bos, tokens, chunk0 = dense_sequence(seq, seqlen, chunk_size)
    kh = key_head(head, heads, key_heads)
    col = value_col(tile, wave, lane, block_v)

    pk, pw, pu = fx.get_iter(k), fx.get_iter(w), fx.get_iter(u)
    ph, pv = fx.get_iter(h), fx.get_iter(v_new)
    # The state strip: tile r holds rows 16 r + lane_row(lane, e) of column col.
    rows = [[r * MMA_MN + lane_row(lane, e, wsz) for e in range_constexpr(rpl)]
            for r in range_constexpr(k_tiles)]  # fmt: skip
    state = [fx.Vector.filled(rpl, 0, fx.Float32) for _ in range_constexpr(k_tiles)]
    if const_expr(use_h0):
        p0 = fx.get_iter(h0)
        state = [
            fx.Vector.from_elements(
                [_scalar(p0, state_offset(seq, head, rows[r][e], col, heads, head_dim,
                                          head_dim_v), fx.Float32)
                 for e in range_constexpr(rpl)], fx.Float32,
            )
            for r in range_constexpr(k_tiles)
        ]  # fmt: skip

    copy_steps = k_copy_steps(head_dim, chunk_size, block_threads)
    for c in range(fx.Int32(0), num_chunks(tokens, chunk_size), fx.Int32(1)):
        n = chunk_tokens(c, tokens, chunk_size, _select)
        t0 = c * chunk_size
        chunk_row = chunk0 + c

        # The state at the chunk's start, in the input type.
        for r in range_constexpr(k_tiles):
            values = state[r].to(dtype)
            for e in range_constexpr(rpl):
                off = h_offset(chunk_row, head, rows[r][e], col, heads, head_dim, head_dim_v)
                fx.ptr_store(values[e], ph + fx.Int64(off))

        # k's chunk tile, transposed into LDS: each item 4 tokens x 8 key columns.
        pieces = []
        for s in range_constexpr(copy_steps):
            tq, kk0, real = k_copy_item(s, tid, block_threads, head_dim, chunk_size)
            runs = []
            for i in range_constexpr(TOKEN_QUAD):
                live = tq + i < n
                row = token_row(bos, t0 + _select(live, tq + i, 0))
                run = load_run(pk, fx.Int64(k_offset(row, kh, kk0, key_heads, head_dim)),
                               K_PIECE, dtype)  # fmt: skip
                runs.append(live.select(run, fx.Vector.filled(K_PIECE, 0, dtype)))
            pieces.append((tq, kk0, real, runs))
        fx.barrier()  # every wave is done reading the previous chunk's tile
        for tq, kk0, real, runs in pieces:
            if real:
                for j in range_constexpr(K_PIECE):
                    column = fx.Vector.from_elements([runs[i][j] for i in range_constexpr(
                        TOKEN_QUAD)], dtype)  # fmt: skip
                    fx.ptr_store(column, lds_k + kt_lds_offset(kk0 + j, tq, chunk_size))
        fx.barrier()

        # v_new = u - w h over the chunk's 16-token tiles.
        h_ops = [_operand_from_accs(state, b, dtype, rpl)
                 for b in range_constexpr(head_dim // CONTRACTION_BLOCK)]  # fmt: skip
        last = token_row(bos, last_token(c, tokens, chunk_size, _select))
        if const_expr(use_g):
            pg = fx.get_iter(g)
            g_last = fx.Float32(_scalar(pg, g_offset(last, head, heads), g.dtype))
        news = []
        for tt in range_constexpr(t_tiles):
            t_op = tt * MMA_MN + lane_col(lane)
            op_row = token_row(bos, t0 + _select(t_op < n, t_op, 0))
            acc = fx.Vector.filled(rpl, 0, fx.Float32)
            for b in range_constexpr(head_dim // CONTRACTION_BLOCK):
                a_run = _w_operand(pw, op_row, head, heads, b, lane, head_dim, wsz, dtype)
                acc = mma_16bit(step, a_run, h_ops[b], acc)
            values = []
            for e in range_constexpr(rpl):
                t = tt * MMA_MN + lane_row(lane, e, wsz)
                live = t < n
                row = token_row(bos, t0 + _select(live, t, 0))
                off = u_offset(row, head, col, heads, head_dim_v)
                value = fx.Float32(_scalar(pu, off, dtype)) - acc[e]
                value = live.select(value, fx.Float32(0.0))
                if const_expr(save_new_value):  # noqa: SIM102 (a compile-time, then a runtime if)
                    if live:
                        fx.ptr_store(value.to(dtype), pv + fx.Int64(off))
                if const_expr(use_g):
                    g_t = fx.Float32(_scalar(pg, g_offset(row, head, heads), g.dtype))
                    value = value * _exp2(g_last - g_t)
                values.append(value)
            news.append(fx.Vector.from_elements(values, fx.Float32))

        # Decay, then state += k^T v_new'.
        if const_expr(use_g):
            decay = _exp2(g_last)
            state = [acc * decay for acc in state]
        if const_expr(use_gk):
            pgk = fx.get_iter(gk)
            state = [
                fx.Vector.from_elements(
                    [state[r][e] * _exp2(fx.Float32(_scalar(
                        pgk, w_offset(last, head, rows[r][e], heads, head_dim), gk.dtype)))
                     for e in range_constexpr(rpl)], fx.Float32,
                )
                for r in range_constexpr(k_tiles)
            ]  # fmt: skip
        v_ops = [_operand_from_accs(news, b, dtype, rpl)
                 for b in range_constexpr(chunk_size // CONTRACTION_BLOCK)]  # fmt: skip
        for r in range_constexpr(k_tiles):
            kk = r * MMA_MN + lane_col(lane)
            acc = state[r]
            for b in range_constexpr(chunk_size // CONTRACTION_BLOCK):
                a_run = _kt_operand(lds_k, kk, b, lane, chunk_size, wsz, dtype)
                acc = mma_16bit(step, a_run, v_ops[b], acc)
            state[r] = acc

    if const_expr(store_final_state):
        pt = fx.get_iter(ht)
        for r in range_constexpr(k_tiles):
            for e in range_constexpr(rpl):
                off = state_offset(seq, head, rows[r][e], col, heads, head_dim, head_dim_v)
                fx.ptr_store(state[r][e], pt + fx.Int64(off))


@flyc.jit
def chunk_gdn_h(
    k: fx.Tensor,
    w: fx.Tensor,
    u: fx.Tensor,
    g: fx.Tensor,
    gk: fx.Tensor,
    h: fx.Tensor,
    v_new: fx.Tensor,
    h0: fx.Tensor,
    ht: fx.Tensor,
    cu_seqlens: fx.Tensor,
    chunk_offsets: fx.Tensor,
    num_seqs: fx.Int32,
    seqlen: fx.Int32,
    heads: fx.Int32,
    key_heads: fx.Int32,
    head_dim_v: fx.Int32,
    head_dim: fx.Constexpr[int],
    chunk_size: fx.Constexpr[int],
    block_v: fx.Constexpr[int],
    use_g: fx.Constexpr[bool],
    use_gk: fx.Constexpr[bool],
    use_h0: fx.Constexpr[bool],
    store_final_state: fx.Constexpr[bool],
    save_new_value: fx.Constexpr[bool],
    varlen: fx.Constexpr[bool],
    mma: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    chunk_gdn_h_kernel(
        k, w, u, g, gk, h, v_new, h0, ht, cu_seqlens, chunk_offsets, seqlen, heads, key_heads,
        head_dim_v, head_dim, chunk_size, block_v, use_g, use_gk, use_h0, store_final_state,
        save_new_value, varlen, mma,
    ).launch(
        grid=(grid_size(num_seqs, heads, head_dim_v, block_v), 1, 1),
        block=(threads(block_v, mma), 1, 1),
        stream=stream,
    )  # fmt: skip


# --- host launcher -----------------------------------------------------------------------------


def _check(name: str, t: torch.Tensor, dtypes, shape: tuple[int, ...], form: str) -> None:
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {form} = {list(shape)}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {list(t.stride())}")


def launch_chunk_gdn_h(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: torch.Tensor | None,
    gk: torch.Tensor | None,
    h: torch.Tensor,
    v_new: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    final_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    chunk_offsets: torch.Tensor | None,
    *,
    num_seqs: int,
    chunk_size: int,
    block_v: int,
    mma: str,
    stream: Any | None = None,
) -> None:
    """Launch the pass on tensors the caller allocated (the entry's contract, checked again
    here: this is also what the AOT replay and the tests call)."""
    check_mma(mma, MMA_FLAVOURS)
    if block_v not in BLOCK_VS:
        raise ValueError(f"block_v: expected one of {BLOCK_VS}, got {block_v!r}")
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size: expected one of {CHUNK_SIZES}, got {chunk_size!r}")
    batch, seqlen, key_heads, head_dim = (int(d) for d in k.shape)
    heads, head_dim_v = int(u.shape[2]), int(u.shape[3])
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"k: head dim K = {head_dim} must be one of {HEAD_DIMS}")
    if head_dim_v % block_v:
        raise ValueError(f"block_v: {block_v} must divide V = {head_dim_v}")
    _check("k", k, INPUT_DTYPES, (batch, seqlen, key_heads, head_dim), "[B, T, Hg, K]")
    _check("w", w, (k.dtype,), (batch, seqlen, heads, head_dim), "[B, T, H, K]")
    _check("u", u, (k.dtype,), (batch, seqlen, heads, head_dim_v), "[B, T, H, V]")
    varlen = cu_seqlens is not None
    chunk_rows = int(h.shape[1]) if h.dim() == 5 else -1
    _check("h", h, (k.dtype,), (batch, chunk_rows, heads, head_dim, head_dim_v),
           "[B, NT, H, K, V]")  # fmt: skip
    if g is not None:
        _check("g", g, GATE_DTYPES, (batch, seqlen, heads), "[B, T, H]")
    if gk is not None:
        _check("gk", gk, GATE_DTYPES, (batch, seqlen, heads, head_dim), "[B, T, H, K]")
    if v_new is not None:
        _check("v_new", v_new, (k.dtype,), tuple(u.shape), "u's shape")
    state_shape = (num_seqs, heads, head_dim, head_dim_v)
    for name, t in (("initial_state", initial_state), ("final_state", final_state)):
        if t is not None:
            _check(name, t, (torch.float32,), state_shape, "[N, H, K, V]")
    if varlen:
        _check("cu_seqlens", cu_seqlens, SEQLENS_DTYPES, (num_seqs + 1,), "[N + 1]")
        if chunk_offsets is None:
            raise ValueError("chunk_offsets: expected an int32 [N + 1] tensor with cu_seqlens")
        _check("chunk_offsets", chunk_offsets, SEQLENS_DTYPES, (num_seqs + 1,), "[N + 1]")
    elif num_seqs != batch:
        raise ValueError(f"num_seqs: a dense batch has B = {batch} sequences, got {num_seqs}")

    stand_in = k
    tensors = kernel_tensors(
        k, w, u, g if g is not None else stand_in, gk if gk is not None else stand_in, h,
        v_new if v_new is not None else stand_in,
        initial_state if initial_state is not None else stand_in,
        final_state if final_state is not None else stand_in,
        cu_seqlens if varlen else stand_in, chunk_offsets if varlen else stand_in,
    )  # fmt: skip
    chunk_gdn_h(
        *tensors, num_seqs, seqlen, heads, key_heads, head_dim_v, head_dim=head_dim,
        chunk_size=chunk_size, block_v=block_v, use_g=g is not None, use_gk=gk is not None,
        use_h0=initial_state is not None, store_final_state=final_state is not None,
        save_new_value=v_new is not None, varlen=varlen, mma=mma, stream=to_stream(stream),
    )  # fmt: skip
