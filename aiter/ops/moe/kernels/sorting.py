"""FlyDSL kernels and launcher of moe_sorting: group a top-k routing's (token, slot) entries
by expert into padded blocks for the MoE GEMMs.

Three plain kernels, every thread working alone: no LDS, no atomics, no barriers, no MMA, so
one source serves gfx942, gfx950 (wave64) and gfx1250 (wave32) and the result is
deterministic by construction. See moe_sorting_index.py for the algorithm and index math.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr

from aiter.ops.moe.kernels.sorting_index import (
    BLOCK_SIZE_MULTIPLE,
    EXPERT_THREADS,
    MAX_TOKENS,
    MAX_TOPK,
    block_range,
    capped,
    count_slot,
    entry_bound,
    entry_token_slot,
    expert_grid,
    expert_of_thread,
    is_expert,
    local_token_count,
    next_run,
    offset_slot,
    pack_sorted_id,
    padded_count,
    routed_entries,
    run_padding,
    sentinel_id,
    slot_in_range,
    sorting_sizes,
    valid_rows_cap,
    workspace_size,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared.gemm_blocks import to_stream
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.launch_args import check_int, check_rank, check_tensor

# dtype of the workspace (per-expert counts, then per-expert first slots).
WORKSPACE_DTYPE = torch.int32

# Helpers hold no dynamic `if` or runtime loop: FlyDSL rewrites those into scf ops only inside
# the kernel function itself.


def _flag(cond):
    """A comparison as an Int32 0 or 1, for the index functions' arithmetic choices."""
    return cond.select(1, 0)


def _load(tensor, offset):
    """tensor's element at flat offset (a scalar of its dtype)."""
    return fx.ptr_load(fx.get_iter(tensor) + fx.Int64(offset))


def _store(value, tensor, offset):
    fx.ptr_store(value, fx.get_iter(tensor) + fx.Int64(offset))


def _routed_tokens(num_local_tokens, m, has_num_local: bool):
    """T = min(M, max(num_local_tokens[0], 0)), or M without num_local_tokens."""
    if const_expr(not has_num_local):
        return m
    n = fx.Int32(_load(num_local_tokens, 0))
    return local_token_count(m, n, _flag(n < m), _flag(n < 0))


def _local_flag(expert_mask, g, has_mask: bool):
    """1 if global expert g is local (expert_mask[g] != 0; every expert without a mask)."""
    if const_expr(not has_mask):
        return fx.Int32(1)
    return _flag(fx.Int32(_load(expert_mask, g)) != 0)


@flyc.kernel
def moe_sorting_count_kernel(
    topk_ids: fx.Tensor,
    expert_mask: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    has_mask: fx.Constexpr[bool],
    has_num_local: fx.Constexpr[bool],
):
    """workspace[g] = routed entries of global expert g (0 for a non-local expert); one
    thread per expert scans the T * topk flat entries."""
    g = expert_of_thread(fx.block_idx.x, fx.thread_idx.x)
    if is_expert(g, num_experts):
        local = _local_flag(expert_mask, g, has_mask)
        t = _routed_tokens(num_local_tokens, m, has_num_local)
        end = entry_bound(routed_entries(t, topk), local)
        count = fx.Int32(0)
        for i in range(fx.Int32(0), end, fx.Int32(1)):
            count = count + _flag(fx.Int32(_load(topk_ids, i)) == g)
        _store(count, workspace, count_slot(g))


@flyc.jit
def moe_sorting_count(
    topk_ids: fx.Tensor,
    expert_mask: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    has_mask: fx.Constexpr[bool],
    has_num_local: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    grid = (expert_grid(num_experts), 1, 1)
    moe_sorting_count_kernel(
        topk_ids, expert_mask, num_local_tokens, workspace, m, topk, num_experts,
        has_mask, has_num_local,
    ).launch(grid=grid, block=(EXPERT_THREADS, 1, 1), stream=stream)  # fmt: skip


@flyc.kernel
def moe_sorting_scan_kernel(
    expert_mask: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    block_size: fx.Int32,
    has_mask: fx.Constexpr[bool],
    has_num_local: fx.Constexpr[bool],
):
    """One thread walks the experts in global id order: workspace[E + g] = first slot of
    expert g's run, sorted_expert_ids of its blocks, then num_valid_ids = [used slots, T]."""
    p, num_blocks = sorting_sizes(m, topk, num_experts, block_size)
    offset = fx.Int32(0)
    local_idx = fx.Int32(0)
    for g in range(fx.Int32(0), num_experts, fx.Int32(1)):
        padded = padded_count(fx.Int32(_load(workspace, count_slot(g))), block_size)
        _store(offset, workspace, offset_slot(g, num_experts))
        first_block, end_block = block_range(offset, padded, block_size)
        end_block = capped(end_block, num_blocks, _flag(end_block > num_blocks))
        for b in range(first_block, end_block, fx.Int32(1)):
            _store(local_idx, sorted_expert_ids, b)
        offset, local_idx = next_run(
            offset, local_idx, padded, _local_flag(expert_mask, g, has_mask)
        )
    cap = valid_rows_cap(p, block_size)
    _store(capped(offset, cap, _flag(offset > cap)), num_valid_ids, 0)
    _store(_routed_tokens(num_local_tokens, m, has_num_local), num_valid_ids, 1)


@flyc.jit
def moe_sorting_scan(
    expert_mask: fx.Tensor,
    num_local_tokens: fx.Tensor,
    workspace: fx.Tensor,
    sorted_expert_ids: fx.Tensor,
    num_valid_ids: fx.Tensor,
    m: fx.Int32,
    topk: fx.Int32,
    num_experts: fx.Int32,
    block_size: fx.Int32,
    has_mask: fx.Constexpr[bool],
    has_num_local: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_sorting_scan_kernel(
        expert_mask, num_local_tokens, workspace, sorted_expert_ids, num_valid_ids,
        m, topk, num_experts, block_size, has_mask, has_num_local,
    ).launch(grid=(1, 1, 1), block=(1, 1, 1), stream=stream)  # fmt: skip


@flyc.kernel
def moe_sorting_fill_kernel(
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
    has_num_local: fx.Constexpr[bool],
):
    """One thread per expert writes its entries, in flat order, from its first slot, then the
    sentinel padding of its run. A non-local expert or one with no entries writes nothing;
    nothing is written past P."""
    g = expert_of_thread(fx.block_idx.x, fx.thread_idx.x)
    if is_expert(g, num_experts):
        p, _ = sorting_sizes(m, topk, num_experts, block_size)
        count = fx.Int32(_load(workspace, count_slot(g)))
        first = fx.Int32(_load(workspace, offset_slot(g, num_experts)))
        t = _routed_tokens(num_local_tokens, m, has_num_local)
        end = entry_bound(routed_entries(t, topk), _flag(count > 0))
        pos = first
        for i in range(fx.Int32(0), end, fx.Int32(1)):
            hit = fx.Int32(_load(topk_ids, i)) == g
            if hit & slot_in_range(pos, p):
                token, slot = entry_token_slot(i, topk)
                _store(fx.Int32(pack_sorted_id(token, slot)), sorted_ids, pos)
                _store(fx.Float32(_load(topk_weights, i)), sorted_weights, pos)
            pos = pos + _flag(hit)
        pad_begin, pad_end = run_padding(first, count, block_size)
        pad_end = capped(pad_end, p, _flag(pad_end > p))
        sentinel = fx.Int32(sentinel_id(m, topk))
        for s in range(pad_begin, pad_end, fx.Int32(1)):
            _store(sentinel, sorted_ids, s)
            _store(fx.Float32(0.0), sorted_weights, s)


@flyc.jit
def moe_sorting_fill(
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
    has_num_local: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    grid = (expert_grid(num_experts), 1, 1)
    moe_sorting_fill_kernel(
        topk_ids, topk_weights, num_local_tokens, workspace, sorted_ids, sorted_weights,
        m, topk, num_experts, block_size, has_num_local,
    ).launch(grid=grid, block=(EXPERT_THREADS, 1, 1), stream=stream)  # fmt: skip


# --- host side ---------------------------------------------------------------------------------


def sorting_workspace_size(num_experts: int) -> int:
    """int32 elements of the workspace launch_moe_sorting needs (counts, then first slots)."""
    return workspace_size(num_experts)


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
    """Launch moe_sorting: the count, scan and fill kernels, in that order, on one stream.

    Contract (every tensor contiguous, its last axis of unit stride; the launcher reads shapes
    and strides only, never data):

    - topk_ids int32 [M, topk]: global expert ids in [0, E) (other values are routed nowhere);
      topk_weights float32 [M, topk]. 1 <= topk <= 127 and M < 2**24, so a sorted id fits.
    - num_experts E >= 1, the global expert count; block_size B, a positive multiple of 16
      (16, 32 and 64 are the usual ones).
    - expert_mask: None (every expert is local) or int32 [E] of 0/1, 1 marking a local expert
      (expert parallelism). num_local_tokens: None (T = M) or a device int32 [1]; only tokens
      t < T = min(M, num_local_tokens[0]) are routed (a negative value routes nothing).
    - P = M * topk + E * B - topk sorted slots, num_blocks = ceil(P / B) (sorting_sizes);
      P < 2**31. The caller allocates (torch.empty is enough; the kernels write):
      sorted_ids int32 [P], sorted_weights float32 [P], sorted_expert_ids int32 [num_blocks],
      num_valid_ids int32 [2], workspace WORKSPACE_DTYPE (int32)
      [sorting_workspace_size(E)] = [2 * E].
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
    - Deterministic: each output element has one writer, fixed by the routing alone.
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
    if p >= 2**31:
        raise ValueError(f"sorted_ids: P = M * topk + E * B - topk = {p} must be < 2**31")
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
        (workspace_size(e),),
        "[sorting_workspace_size(E)]",
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
    moe_sorting_count(
        topk_ids, mask_arg, local_arg, workspace, m, topk, e,
        has_mask=has_mask, has_num_local=has_num_local, stream=fx_stream,
    )  # fmt: skip
    moe_sorting_scan(
        mask_arg, local_arg, workspace, sorted_expert_ids, num_valid_ids, m, topk, e, b,
        has_mask=has_mask, has_num_local=has_num_local, stream=fx_stream,
    )  # fmt: skip
    moe_sorting_fill(
        topk_ids, topk_weights, local_arg, workspace, sorted_ids, sorted_weights, m, topk, e, b,
        has_num_local=has_num_local, stream=fx_stream,
    )  # fmt: skip
