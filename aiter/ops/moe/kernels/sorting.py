"""FlyDSL kernels and launcher of moe_sorting: group a top-k routing's (token, slot) entries
by expert into padded blocks for the MoE GEMMs.

A stable counting sort in three launches (count, scan, scatter): LDS histograms per chunk of
entries, LDS prefix sums across experts, and a scatter that ranks each entry among its
expert's with ballots. No atomics anywhere: each wave keeps its own row of counts in LDS, so
the result is deterministic. One source serves gfx942, gfx950 (wave64) and gfx1250 (wave32).
See sorting_index.py for the algorithm and the index math.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr import math as fxmath
from flydsl.runtime.device import get_rocm_arch

from aiter.ops.moe.kernels import sorting_index as ix
from aiter.ops.moe.kernels.sorting_index import (
    BLOCK_SIZE_MULTIPLE,
    MAX_EXPERTS,
    MAX_SLOTS,
    MAX_TOKENS,
    MAX_TOPK,
    ROUNDS,
    SCAN_BATCH,
    SCAN_THREADS,
    THREADS,
    capped,
    chunk_entry,
    count_slot,
    entry_token_slot,
    experts_of_thread,
    first_slot_index,
    local_token_count,
    num_chunks,
    pack_sorted_id,
    padded_count,
    routed_entries,
    run_padding,
    scan_steps,
    search_steps,
    sentinel_id,
    sorting_sizes,
    spare_word,
    table_word,
    table_words,
    valid_rows_cap,
    waves_per_block,
    workspace_size,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared.gemm_blocks import to_stream
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.launch_args import check_int, check_rank, check_tensor
from aiter.ops.shared.wave_vote import ballot, lane_mask_type

# dtype of the workspace (per-chunk counts, then per-expert first slots).
WORKSPACE_DTYPE = torch.int32
# A byte offset past every buffer: buffer loads there return 0, stores there are dropped.
OUT_OF_RANGE = 0x7FFFFFF0

# Helpers hold no dynamic `if` or runtime loop: FlyDSL rewrites those into scf ops only inside
# the kernel function itself.


def _wave_size() -> int:
    return 32 if get_rocm_arch().startswith("gfx12") else 64


def _flag(cond):
    """A comparison as an Int32 0 or 1, for the index functions' arithmetic choices."""
    return cond.select(1, 0)


def _words(tensor, count):
    """A buffer over `count` 4-byte elements of a tensor."""
    nbytes = fx.Int64(fx.Int32(count) * 4)
    return rocdl.make_buffer_ptr(fx.get_iter(tensor), nbytes)


def _load_word(buf, valid, element):
    """The 4-byte element of a buffer as Int32, or 0 where not valid (the hardware's zero)."""
    byte = valid.select(fx.Int32(element) * 4, fx.Int32(OUT_OF_RANGE))
    word = rocdl.raw_ptr_buffer_load(fx.Int32.ir_type, rocdl.get_buffer_rsrc(buf), byte,
                                     fx.Int32(0), 0)  # fmt: skip
    return fx.Int32(word)


def _store_word(buf, valid, element, value):
    """Store a 4-byte Int32 where valid; elsewhere (or past the buffer) the store is dropped."""
    byte = valid.select(fx.Int32(element) * 4, fx.Int32(OUT_OF_RANGE))
    rocdl.raw_ptr_buffer_store(
        fx.Int32(value).ir_value(), rocdl.get_buffer_rsrc(buf), fx.Int32(byte).ir_value(),
        fx.Int32(0).ir_value(),
    )  # fmt: skip


def _lds_words(count: int):
    storage = fx.SharedAllocator().allocate(fx.Array[fx.Uint8, 4 * count, 16])
    return fx.recast_iter(fx.Int32, storage.peek().ptr)


def _lds_get(lds, word):
    return fx.Int32(fx.ptr_load(lds + word))


def _lds_set(lds, word, value):
    fx.ptr_store(fx.Int32(value), lds + word)


def _routed_tokens(num_local_tokens, m, has_num_local: bool):
    """T = min(M, max(num_local_tokens[0], 0)), or M without num_local_tokens."""
    if const_expr(not has_num_local):
        return m
    n = fx.Int32(fx.ptr_load(fx.get_iter(num_local_tokens)))
    return local_token_count(m, n, _flag(n < m), _flag(n < 0))


# --- ranking a wave's entries by expert ------------------------------------------------------


def _peers(valid, expert, wave_size: int):
    """Lane mask of the valid lanes whose expert equals this lane's: one ballot per bit of
    the expert id, kept where the bit agrees."""
    ty = lane_mask_type(wave_size)
    peers = ballot(valid, wave_size)
    for bit in range_constexpr(ix.EXPERT_BITS):
        on = ((expert >> bit) & 1) != 0
        lanes = ballot(on, wave_size)
        peers = peers & on.select(lanes, lanes ^ ty(-1))
    return peers


def _lanes_below(peers, wave_size: int):
    """How many lanes of `peers` sit below this lane."""
    i32 = fx.Int32.ir_type
    if const_expr(wave_size == 32):
        return fx.Int32(rocdl.mbcnt_lo(i32, peers.ir_value(), fx.Int32(0).ir_value()))
    lo = peers.to(fx.Int32)
    hi = (peers >> 32).to(fx.Int32)
    below_lo = rocdl.mbcnt_lo(i32, lo.ir_value(), fx.Int32(0).ir_value())
    return fx.Int32(rocdl.mbcnt_hi(i32, hi.ir_value(), below_lo))


def _popcount(peers):
    return type(peers)(fxmath.ctpop(peers)).to(fx.Int32)


def _rank_rounds(table, ids, chunk, tid, entries, num_experts, wave_size: int):
    """Count the wave's ROUNDS rounds of entries into its LDS row. Returns, per round, what
    the scatter needs: (flat entry, valid, LDS word, rank in the round, count in the round)."""
    wave, lane = tid // wave_size, tid % wave_size
    loaded = []
    for rnd in range_constexpr(ROUNDS):
        i = chunk_entry(chunk, wave, rnd, lane, wave_size)
        routed = i < entries
        loaded.append((i, routed, _load_word(ids, routed, i)))  # every load before any wait
    ranked = []
    for i, routed, expert in loaded:
        valid = routed & (expert >= 0) & (expert < num_experts)
        peers = _peers(valid, expert, wave_size)
        rank, count = _lanes_below(peers, wave_size), _popcount(peers)
        word = valid.select(table_word(wave, expert), spare_word(tid, wave_size))
        # Every lane of a group writes the same new count; the wave's LDS ops run in order.
        _lds_set(table, word, _lds_get(table, word) + count)
        ranked.append((i, valid, word, rank, count))
    return ranked


def _zero_table(table, tid, wave_size: int):
    for i in range_constexpr(table_words(wave_size) // THREADS):
        _lds_set(table, i * THREADS + tid, 0)


# --- the kernels -------------------------------------------------------------------------------


@flyc.kernel
def moe_sorting_count_kernel(
    topk_ids: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    chunks: fx.Int32,
    has_num_local: fx.Constexpr[bool],
):
    """Block c: workspace[c * E + g] = chunk c's routed entries of expert g."""
    wave_size = _wave_size()
    tid, chunk = fx.thread_idx.x, fx.block_idx.x
    table = _lds_words(table_words(wave_size))
    _zero_table(table, tid, wave_size)
    fx.barrier()
    entries = routed_entries(_routed_tokens(num_local_tokens, m, has_num_local), topk)
    ids = _words(topk_ids, m * topk)
    _rank_rounds(table, ids, chunk, tid, entries, num_experts, wave_size)
    fx.barrier()
    ws = _words(workspace, (chunks + 1) * num_experts)
    for g in experts_of_thread(tid):
        total = fx.Int32(0)
        for w in range_constexpr(waves_per_block(wave_size)):
            total = total + _lds_get(table, table_word(w, g))
        _store_word(ws, g < num_experts, count_slot(chunk, g, num_experts), total)


@flyc.jit
def moe_sorting_count(
    topk_ids: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    chunks: fx.Int32,
    has_num_local: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_sorting_count_kernel(
        topk_ids, num_local_tokens, workspace, m, topk, num_experts, chunks, has_num_local,
    ).launch(grid=(chunks, 1, 1), block=(THREADS, 1, 1), stream=stream)  # fmt: skip


def _prefix_batch(ws, first_chunk, chunks, g, num_experts, is_expert, running):
    """SCAN_BATCH chunk counts of expert g from first_chunk on: each replaced by the running
    sum before it (the chunk's start inside g's run). Returns the running sum after them."""
    batch = []
    for i in range_constexpr(SCAN_BATCH):
        slot = count_slot(first_chunk + i, g, num_experts)
        valid = is_expert & (first_chunk + i < chunks)
        batch.append((slot, valid, _load_word(ws, valid, slot)))  # one wait for the batch
    for slot, valid, count in batch:
        _store_word(ws, valid, slot, running)
        running = running + count
    return running


def _inclusive_scan(lds, tid, values):
    """Inclusive prefix sums over the block's threads of each of `values` (one LDS array of
    SCAN_THREADS words per value, Hillis-Steele: a barrier between every read and write)."""
    values = list(values)
    for step in scan_steps():
        for v, value in enumerate(values):
            _lds_set(lds, v * SCAN_THREADS + tid, value)
        fx.barrier()
        has = tid >= step
        src = has.select(tid - step, tid)
        values = [value + _flag(has) * _lds_get(lds, v * SCAN_THREADS + src)
                  for v, value in enumerate(values)]  # fmt: skip
        fx.barrier()
    return values


def _owner(lds, slot):
    """The largest expert g with first[g] <= slot (LDS words [0, SCAN_THREADS)): the one whose
    run holds a used slot. Experts past E have no run and first = the used slots, so they are
    never taken."""
    g = fx.Int32(0)
    for step in search_steps():
        cand = g + step
        g = (_lds_get(lds, cand) <= slot).select(cand, g)
    return g


@flyc.kernel
def moe_sorting_scan_kernel(
    expert_mask: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    block_size: fx.Int32,
    chunks: fx.Int32,
    has_mask: fx.Constexpr[bool],
    has_num_local: fx.Constexpr[bool],
):
    """One block, thread g for expert g: chunk prefixes and total of g, the experts' first
    slots (an LDS scan of the padded totals of local experts), g's sentinel padding,
    sorted_expert_ids of the used blocks, and num_valid_ids = [used slots, T]."""
    g = fx.thread_idx.x
    p, num_blocks = sorting_sizes(m, topk, num_experts, block_size)
    is_expert = g < num_experts
    ws = _words(workspace, (chunks + 1) * num_experts)
    total = fx.Int32(0)
    for first_chunk in range(fx.Int32(0), chunks, fx.Int32(SCAN_BATCH)):
        total = _prefix_batch(ws, first_chunk, chunks, g, num_experts, is_expert, total)
    local = _flag(is_expert)
    if const_expr(has_mask):
        local = _flag(_load_word(_words(expert_mask, num_experts), is_expert, g) != 0)
    padded = local * padded_count(total, block_size)

    lds = _lds_words(3 * SCAN_THREADS)
    ends, locals_through = _inclusive_scan(lds, g, [padded, local])
    first = ends - padded
    _lds_set(lds, g, first)
    _lds_set(lds, SCAN_THREADS + g, locals_through - local)  # g's local index
    _lds_set(lds, 2 * SCAN_THREADS + g, ends)
    fx.barrier()
    used = _lds_get(lds, 3 * SCAN_THREADS - 1)
    # A non-local expert starts at P: the scatter's stores of its entries are all dropped.
    first_or_p = (local != 0).select(first, p)
    _store_word(ws, is_expert, first_slot_index(g, num_experts, chunks), first_or_p)

    out_ids, out_weights = _words(sorted_ids, p), _words(sorted_weights, p)
    pad_begin, pad_end = run_padding(first, local * total, block_size)
    sentinel = fx.Int32(sentinel_id(m, topk))
    for j in range(fx.Int32(0), block_size, fx.Int32(1)):
        s = pad_begin + j
        keep = (s < pad_end) & (s < p)
        _store_word(out_ids, keep, s, sentinel)
        _store_word(out_weights, keep, s, 0)  # 0.0
    used_blocks = used // block_size
    expert_ids = _words(sorted_expert_ids, num_blocks)
    for first_block in range(fx.Int32(0), used_blocks, fx.Int32(SCAN_THREADS)):
        b = first_block + g
        owner = _owner(lds, b * block_size)
        keep = (b < used_blocks) & (b < num_blocks)
        _store_word(expert_ids, keep, b, _lds_get(lds, SCAN_THREADS + owner))
    cap = valid_rows_cap(p, block_size)
    valid_ids = _words(num_valid_ids, 2)
    _store_word(valid_ids, g == 0, 0, capped(used, cap, _flag(used > cap)))
    _store_word(valid_ids, g == 0, 1, _routed_tokens(num_local_tokens, m, has_num_local))


@flyc.jit
def moe_sorting_scan(
    expert_mask: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    block_size: fx.Int32,
    chunks: fx.Int32,
    has_mask: fx.Constexpr[bool],
    has_num_local: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_sorting_scan_kernel(
        expert_mask, num_local_tokens, workspace, sorted_ids, sorted_weights,
        sorted_expert_ids, num_valid_ids, m, topk, num_experts, block_size, chunks,
        has_mask, has_num_local,
    ).launch(grid=(1, 1, 1), block=(SCAN_THREADS, 1, 1), stream=stream)  # fmt: skip


def _scatter(table, ranked, weights, out_ids, out_weights, topk, p):
    """Store each ranked entry at its slot: the running count of its wave's expert (which
    starts at the expert's first slot + the chunk's prefix + the waves before) + its rank."""
    loaded = [_load_word(weights, valid, i) for i, valid, *_ in ranked]  # before any wait
    for (i, valid, word, rank, count), weight in zip(ranked, loaded, strict=True):
        before = _lds_get(table, word)
        _lds_set(table, word, before + count)
        pos = before + rank
        keep = valid & (pos < p)
        token, slot = entry_token_slot(i, topk)
        _store_word(out_ids, keep, pos, pack_sorted_id(token, slot))
        _store_word(out_weights, keep, pos, weight)


@flyc.kernel
def moe_sorting_scatter_kernel(
    topk_ids: fx.Tensor,
    topk_weights: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    block_size: fx.Int32,
    chunks: fx.Int32,
    has_num_local: fx.Constexpr[bool],
):
    """Block c writes chunk c's entries: it ranks them again as the count did, turns the
    waves' rows into running slots (expert's first slot + chunk prefix + earlier waves), and
    stores each entry's sorted id and weight there."""
    wave_size = _wave_size()
    tid, chunk = fx.thread_idx.x, fx.block_idx.x
    table = _lds_words(table_words(wave_size))
    _zero_table(table, tid, wave_size)
    fx.barrier()
    entries = routed_entries(_routed_tokens(num_local_tokens, m, has_num_local), topk)
    ranked = _rank_rounds(
        table, _words(topk_ids, m * topk), chunk, tid, entries, num_experts, wave_size
    )
    fx.barrier()
    ws = _words(workspace, (chunks + 1) * num_experts)
    for g in experts_of_thread(tid):
        is_expert = g < num_experts
        run = _load_word(ws, is_expert, first_slot_index(g, num_experts, chunks))
        run = run + _load_word(ws, is_expert, count_slot(chunk, g, num_experts))
        for w in range_constexpr(waves_per_block(wave_size)):
            word = table_word(w, g)
            count = _lds_get(table, word)
            _lds_set(table, word, run)
            run = run + count
    fx.barrier()
    p, _ = sorting_sizes(m, topk, num_experts, block_size)
    _scatter(table, ranked, _words(topk_weights, m * topk), _words(sorted_ids, p),
             _words(sorted_weights, p), topk, p)  # fmt: skip


@flyc.jit
def moe_sorting_scatter(
    topk_ids: fx.Tensor,
    topk_weights: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    sorted_ids: fx.Tensor,
    sorted_weights: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    block_size: fx.Int32,
    chunks: fx.Int32,
    has_num_local: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_sorting_scatter_kernel(
        topk_ids, topk_weights, num_local_tokens, workspace, sorted_ids, sorted_weights,
        m, topk, num_experts, block_size, chunks, has_num_local,
    ).launch(grid=(chunks, 1, 1), block=(THREADS, 1, 1), stream=stream)  # fmt: skip


# --- host side ---------------------------------------------------------------------------------


def sorting_workspace_size(m: int, topk: int, num_experts: int) -> int:
    """int32 elements of the workspace launch_moe_sorting needs for topk_ids [M, topk]: a row
    of E counts per chunk of entries, then the E first slots."""
    return workspace_size(m, topk, num_experts)


def launch_moe_sorting(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    sorted_weights: torch.Tensor,
    sorted_expert_ids: torch.Tensor,
    num_valid_ids: torch.Tensor,
    workspace: torch.Tensor,
    *,
    num_experts: int,
    block_size: int,
    expert_mask: torch.Tensor | None = None,
    num_local_tokens: torch.Tensor | None = None,
    stream: Any | None = None,
) -> None:
    """Launch moe_sorting: the count, scan and scatter kernels, in that order, on one stream.

    Contract (every tensor contiguous, its last axis of unit stride; the launcher reads shapes
    and strides only, never data):

    - topk_ids int32 [M, topk]: global expert ids in [0, E) (other values are routed nowhere);
      topk_weights float32 [M, topk]. 1 <= topk <= 127 and M < 2**24, so a sorted id fits.
    - num_experts E in [1, 512], the global expert count; block_size B, a positive multiple
      of 16 (16, 32 and 64 are the usual ones).
    - expert_mask: None (every expert is local) or int32 [E] of 0/1, 1 marking a local expert
      (expert parallelism). num_local_tokens: None (T = M) or a device int32 [1]; only tokens
      t < T = min(M, num_local_tokens[0]) are routed (a negative value routes nothing).
    - P = M * topk + E * B - topk sorted slots, num_blocks = ceil(P / B) (sorting_sizes);
      P < 2**29. The caller allocates (torch.empty is enough; the kernels write):
      sorted_ids int32 [P], sorted_weights float32 [P], sorted_expert_ids int32 [num_blocks],
      num_valid_ids int32 [2], workspace WORKSPACE_DTYPE (int32)
      [sorting_workspace_size(M, topk, E)] = [(ceil(M * topk / 2048) + 1) * E] (at least 2E).
    - Local experts come in increasing global id order; the local index of global expert g is
      the number of local experts with global id < g. Each local expert's entries (t, k), t < T
      and topk_ids[t, k] == g, in increasing flat order t * topk + k, are written consecutively:
      sorted_ids = (k << 24) | t (pack_sorted_id), sorted_weights = topk_weights[t, k]. Each
      expert's run is padded up to a multiple of B with the sentinel (topk << 24) | M and
      weight 0.0. Experts with no entries, and non-local experts, get no blocks. Runs follow
      each other in local-expert order from slot 0.
    - sorted_expert_ids[b] = the local index of the expert owning block b, for every block
      b < num_valid_ids[0] / B. num_valid_ids[0] = the padded rows used (a multiple of B),
      num_valid_ids[1] = T. Slots and blocks past the used ones are left unwritten: consumers
      stop at num_valid_ids[0].
    - Deterministic: each output element has one writer, fixed by the routing alone; no
      atomics are used.
    - With distinct expert ids in each row (as torch.topk gives) the used slots never exceed
      P. A row repeating an expert may need more: stores past P (past num_blocks) are then
      dropped and num_valid_ids[0] is capped at P // B * B, so nothing touches memory past
      the outputs.
    - stream: None (default stream), an fx.Stream, a raw handle int, or any object with a
      `cuda_stream` attribute.
    - Tensors may be CPU tensors or FakeTensors when COMPILE_ONLY=1: the kernels compile and
      nothing runs. Without expert_mask (num_local_tokens) the kernels do not read that
      argument: another tensor stands in for it.
    """
    e = check_int("num_experts", num_experts, 1)
    if e > MAX_EXPERTS:
        raise ValueError(f"num_experts: expected at most {MAX_EXPERTS} experts, got {e}")
    b = check_int("block_size", block_size, 1)
    if b % BLOCK_SIZE_MULTIPLE:
        raise ValueError(
            f"block_size: expected a positive multiple of {BLOCK_SIZE_MULTIPLE}, got {b}"
        )
    m, topk = check_rank("topk_ids", topk_ids, 2, "[M, topk]")
    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(
            f"topk_ids: topk = topk_ids.shape[1] must be in [1, {MAX_TOPK}], got {topk}"
        )
    if m > MAX_TOKENS:
        raise ValueError(f"topk_ids: M = topk_ids.shape[0] must be <= {MAX_TOKENS}, got {m}")
    p, num_blocks = sorting_sizes(m, topk, e, b)
    if p >= MAX_SLOTS:
        raise ValueError(f"sorted_ids: P = M * topk + E * B - topk = {p} must be < 2**29")
    check_tensor("topk_ids", topk_ids, torch.int32, (m, topk), "[M, topk]")
    check_tensor("topk_weights", topk_weights, torch.float32, (m, topk), "[M, topk]")
    check_tensor("sorted_ids", sorted_ids, torch.int32, (p,), "[P]")
    check_tensor("sorted_weights", sorted_weights, torch.float32, (p,), "[P]")
    check_tensor(
        "sorted_expert_ids", sorted_expert_ids, torch.int32, (num_blocks,), "[ceil(P / B)]"
    )
    check_tensor("num_valid_ids", num_valid_ids, torch.int32, (2,), "[2]")
    check_tensor(
        "workspace",
        workspace,
        WORKSPACE_DTYPE,
        (workspace_size(m, topk, e),),
        "[sorting_workspace_size(M, topk, E)]",
    )
    has_mask = expert_mask is not None
    if has_mask:
        check_tensor("expert_mask", expert_mask, torch.int32, (e,), "[E]")
    has_num_local = num_local_tokens is not None
    if has_num_local:
        check_tensor("num_local_tokens", num_local_tokens, torch.int32, (1,), "[1]")

    # A kernel without a mask (token count) never reads that argument; topk_ids stands in.
    mask_arg = expert_mask if has_mask else topk_ids
    local_arg = num_local_tokens if has_num_local else topk_ids
    fx_stream = to_stream(stream)
    # topk_ids [M, 1] and [1, topk] must key as [M, topk] does.
    topk_ids, topk_weights, mask_arg, local_arg = kernel_tensors(
        topk_ids, topk_weights, mask_arg, local_arg
    )
    sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, workspace = kernel_tensors(
        sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, workspace
    )
    chunks = num_chunks(m, topk)
    moe_sorting_count(
        topk_ids, local_arg, workspace, m, topk, e, chunks,
        has_num_local=has_num_local, stream=fx_stream,
    )  # fmt: skip
    moe_sorting_scan(
        mask_arg, local_arg, workspace, sorted_ids, sorted_weights, sorted_expert_ids,
        num_valid_ids, m, topk, e, b, chunks,
        has_mask=has_mask, has_num_local=has_num_local, stream=fx_stream,
    )  # fmt: skip
    moe_sorting_scatter(
        topk_ids, topk_weights, local_arg, workspace, sorted_ids, sorted_weights,
        m, topk, e, b, chunks, has_num_local=has_num_local, stream=fx_stream,
    )  # fmt: skip
