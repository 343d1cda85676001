"""FlyDSL kernel and launcher of MoE routing: the grouped top-k of DeepSeek-V3 (sigmoid scores
plus a correction bias, expert groups ranked by their two best biased scores, a routed scaling
factor), the plain grouped top-k (groups ranked by their best score) and, with one group, the
softmax top-k of Qwen, Mixtral and gpt-oss. One wave per token (routing_index.py has the
layout); every choice is made in registers by butterflies, nothing goes through LDS.
"""

from __future__ import annotations

import math
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.runtime.device import get_rocm_arch

from aiter.arch import get_arch
from aiter.ops.moe.kernels.routing_index import (
    WAVES_PER_BLOCK,
    blocks_for,
    experts_per_lane,
    group_offsets,
    layout_problem,
    token_of,
    wave_offsets,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared.gemm_blocks import to_stream
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.launch_args import (
    check_bool,
    check_choice,
    check_int,
    check_rank,
    check_tensor,
)

SCORINGS = ("softmax", "sigmoid")
GATING_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LOG2E = math.log2(math.e)
NEG_INF = float("-inf")


def _exp(x):
    """e ** x by the hardware's exp2 (v_exp_f32), as the attention kernels compute it."""
    scaled = fx.Float32(x) * fx.Float32(LOG2E)
    return fx.Float32(rocdl.exp2(fx.Float32.ir_type, scaled.ir_value()))


def _better(value, index, other_value, other_index):
    """Whether (value, index) ranks above (other_value, other_index): larger, ties to the lower
    index."""
    return (value > other_value) | ((value == other_value) & (index < other_index))


def _arg_max(value, index, payload, offsets, wave_size: int):
    """The best (value, index) of the lanes a butterfly over `offsets` joins, with the
    winner's payload: every lane of them ends holding it."""
    for offset in offsets:
        other_value = value.shuffle_xor(offset, wave_size)
        other_index = index.shuffle_xor(offset, wave_size)
        other_payload = payload.shuffle_xor(offset, wave_size)
        take = _better(other_value, other_index, value, index)
        value = take.select(other_value, value)
        index = take.select(other_index, index)
        payload = take.select(other_payload, payload)
    return value, index, payload


def _scores(logits, scoring: str, wave_size: int):
    """Per-expert scores: sigmoid(x), or softmax over the token's experts (a wave max and sum)."""
    if scoring == "sigmoid":
        return [fx.Float32(1.0) / (fx.Float32(1.0) + _exp(-x)) for x in logits]
    top = logits[0]
    for x in logits[1:]:
        top = fx.maxnumf(top, x)
    for offset in wave_offsets(wave_size):
        top = fx.maxnumf(top, top.shuffle_xor(offset, wave_size))
    exps = [_exp(x - top) for x in logits]
    total = exps[0]
    for e in exps[1:]:
        total = total + e
    for offset in wave_offsets(wave_size):
        total = total + total.shuffle_xor(offset, wave_size)
    return [e / total for e in exps]


def _min(a, b):
    return (a < b).select(a, b)


def _group_score(choice, biased: bool, experts: int, groups: int, wave_size: int):
    """The lane's group's score, in every lane of the group: the sum of its two best choice
    scores (biased, DeepSeek-V3's rule), or its best."""
    first, second = choice[0], fx.Float32(NEG_INF)
    for x in choice[1:]:
        second = fx.maxnumf(second, _min(first, x))
        first = fx.maxnumf(first, x)
    for offset in group_offsets(experts, groups, wave_size):
        other_first = first.shuffle_xor(offset, wave_size)
        other_second = second.shuffle_xor(offset, wave_size)
        second = fx.maxnumf(_min(first, other_first), fx.maxnumf(second, other_second))
        first = fx.maxnumf(first, other_first)
    return first + second if biased else first


def _chosen_group(choice, group, biased: bool, experts: int, groups: int, topk_group: int,
                  wave_size: int):  # fmt: skip
    """Whether the lane's group is one of the topk_group best (topk_group wave-wide picks)."""
    if topk_group == groups:
        return group >= 0
    score = _group_score(choice, biased, experts, groups, wave_size)
    neg = fx.Float32(NEG_INF)
    chosen = group < 0
    for _ in range_constexpr(topk_group):
        candidate = chosen.select(neg, score)
        _, best, _ = _arg_max(candidate, group, candidate, wave_offsets(wave_size), wave_size)
        chosen = chosen | (group == best)
    return chosen


def _pick_experts(masked, scores, first_expert, topk: int, wave_size: int):
    """topk wave-wide picks of the best masked choice score; each pick's weight is the
    winner's score. Returns ([weight], [expert id]) in pick order, in every lane."""
    neg = fx.Float32(NEG_INF)
    weights, ids = [], []
    for _ in range_constexpr(topk):
        value, index, score = masked[0], fx.Int32(first_expert), scores[0]
        for j in range_constexpr(1, len(masked)):
            take = _better(masked[j], first_expert + j, value, index)
            value = take.select(masked[j], value)
            index = take.select(fx.Int32(first_expert + j), index)
            score = take.select(scores[j], score)
        _, index, score = _arg_max(value, index, score, wave_offsets(wave_size), wave_size)
        masked = [(first_expert + j == index).select(neg, m) for j, m in enumerate(masked)]
        weights.append(score)
        ids.append(index)
    return weights, ids


@flyc.kernel
def moe_grouped_topk_kernel(
    gating: fx.Tensor,
    bias: fx.Tensor,
    topk_weights: fx.Tensor,
    topk_ids: fx.Tensor,
    tokens: fx.Int32,
    scaling: fx.Float32,
    experts: fx.Constexpr[int],
    groups: fx.Constexpr[int],
    topk_group: fx.Constexpr[int],
    topk: fx.Constexpr[int],
    scoring: fx.Constexpr[str],
    biased: fx.Constexpr[bool],
    renormalize: fx.Constexpr[bool],
):
    """Wave w of block b routes token b * WAVES_PER_BLOCK + w (a wave past the last token
    routes the last one and stores nothing)."""
    wave_size = get_arch(get_rocm_arch()).wave_size
    per = experts_per_lane(experts, wave_size)
    tid = fx.thread_idx.x
    lane = tid % wave_size
    token = token_of(fx.block_idx.x, tid // wave_size)
    live = token < tokens
    row = live.select(token, tokens - 1)
    first_expert = lane * per
    base = fx.get_iter(gating) + fx.Int64(row) * fx.Int64(experts)
    logits = []
    for j in range_constexpr(per):
        value = fx.ptr_load(base + fx.Int64(first_expert + j), result_type=gating.dtype)
        logits.append(fx.Float32(value.to(fx.Float32)))
    scores = _scores(logits, scoring, wave_size)
    choice = scores
    if const_expr(biased):
        choice = []
        for j in range_constexpr(per):
            offset = fx.Int64(first_expert + j)
            correction = fx.ptr_load(fx.get_iter(bias) + offset, result_type=fx.Float32)
            choice.append(scores[j] + fx.Float32(correction))
    group = first_expert // (experts // groups)
    chosen = _chosen_group(choice, group, biased, experts, groups, topk_group, wave_size)
    masked = [chosen.select(c, fx.Float32(NEG_INF)) for c in choice]
    weights, ids = _pick_experts(masked, scores, first_expert, topk, wave_size)
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    if const_expr(renormalize):
        weights = [w / total for w in weights]
    # Lane i < topk stores pick i.
    mine_w, mine_id = weights[0] * scaling, ids[0]
    for i in range_constexpr(1, topk):
        mine_w = (lane == i).select(weights[i] * scaling, mine_w)
        mine_id = (lane == i).select(ids[i], mine_id)
    if live & (lane < topk):
        offset = fx.Int64(token) * fx.Int64(topk) + fx.Int64(lane)
        fx.ptr_store(mine_w, fx.get_iter(topk_weights) + offset)
        fx.ptr_store(mine_id, fx.get_iter(topk_ids) + offset)


@flyc.jit
def moe_grouped_topk(
    gating: fx.Tensor,
    bias: fx.Tensor,
    topk_weights: fx.Tensor,
    topk_ids: fx.Tensor,
    tokens: fx.Int32,
    scaling: fx.Float32,
    experts: fx.Constexpr[int],
    groups: fx.Constexpr[int],
    topk_group: fx.Constexpr[int],
    topk: fx.Constexpr[int],
    scoring: fx.Constexpr[str],
    biased: fx.Constexpr[bool],
    renormalize: fx.Constexpr[bool],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    wave_size = get_arch(get_rocm_arch()).wave_size
    moe_grouped_topk_kernel(
        gating, bias, topk_weights, topk_ids, tokens, scaling,
        experts, groups, topk_group, topk, scoring, biased, renormalize,
    ).launch(
        grid=(blocks_for(tokens), 1, 1), block=(WAVES_PER_BLOCK * wave_size, 1, 1), stream=stream
    )  # fmt: skip


# --- host side ---------------------------------------------------------------------------------


def routing_problem(experts: int, groups: int, topk_group: int, topk: int, arch: str):
    """Why the kernel cannot route this configuration on `arch`, or None."""
    return layout_problem(experts, groups, topk_group, topk, get_arch(arch).wave_size)


def launch_moe_grouped_topk(
    gating: torch.Tensor,
    bias: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    groups: int,
    topk_group: int,
    scoring: str,
    renormalize: bool,
    routed_scaling_factor: float = 1.0,
    stream: Any | None = None,
) -> None:
    """Launch moe_grouped_topk: per token, the `topk` experts of the `topk_group` best of
    `groups` expert groups.

    Contract (shapes and strides only are read on the host):

    - gating [M, E] float32, bfloat16 or float16 logits; bias None or float32 [E] (the
      correction bias added to the scores to choose, not to the weights); topk_weights float32
      and topk_ids int32 [M, topk], written.
    - scores: sigmoid(gating) or softmax over the token's E logits (scoring). Groups are E / G
      consecutive experts; a group's rank is the sum of its two best choice scores when bias is
      given (DeepSeek-V3), else its best. The topk best choice scores of the chosen groups'
      experts are picked, ties to the lower index; their weights are the scores (without bias),
      divided by their sum when renormalize, then times routed_scaling_factor.
    - E, G, topk_group, topk as routing_problem allows on the target arch.
    """
    tokens, experts = check_rank("gating", gating, 2, "[M, E]")
    check_tensor("gating", gating, GATING_DTYPES, (tokens, experts), "[M, E]")
    check_choice("scoring", scoring, SCORINGS)
    check_bool("renormalize", renormalize)
    check_int("groups", groups, 1)
    check_int("topk_group", topk_group, 1)
    topk = int(topk_ids.shape[-1]) if isinstance(topk_ids, torch.Tensor) else 0
    problem = routing_problem(experts, groups, topk_group, topk, get_rocm_arch())
    if problem is not None:
        raise ValueError(f"gating: {problem}")
    if bias is not None:
        check_tensor("bias", bias, torch.float32, (experts,), "[E]")
    check_tensor("topk_weights", topk_weights, torch.float32, (tokens, topk), "[M, topk]")
    check_tensor("topk_ids", topk_ids, torch.int32, (tokens, topk), "[M, topk]")
    if tokens == 0:
        return
    bias_arg = bias if bias is not None else topk_weights  # never read without bias
    args = kernel_tensors(gating, bias_arg, topk_weights, topk_ids)
    moe_grouped_topk(
        *args, tokens, float(routed_scaling_factor), experts, groups, topk_group, topk,
        scoring, bias is not None, renormalize, stream=to_stream(stream),
    )  # fmt: skip
