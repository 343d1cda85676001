"""Public MoE routing entries with aiter's signatures: `grouped_topk` (softmax or sigmoid scores,
expert groups ranked by their best score) and `biased_grouped_topk` (DeepSeek-V3's rule:
sigmoid scores plus `e_score_correction_bias` to choose, groups ranked by their two best
biased scores, the unbiased scores as weights), both writing `topk_weights` and `topk_ids`.

One FlyDSL kernel serves them (aiter.ops.moe.kernels.routing) where its layout allows the
expert count and grouping on the arch's wave; torch serves the rest, and the dispatch record
says why.
"""

from __future__ import annotations

import torch

from aiter import capture, device, dispatch
from aiter.ops.moe import reference

__all__ = ["biased_grouped_topk", "grouped_topk"]

GATING_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _validate(op, gating, bias, topk_weights, topk_ids, groups, topk_group) -> tuple[int, int]:
    """(E, topk) of a valid call; an error naming the argument otherwise."""
    for name, t in (("gating_output", gating), ("topk_weights", topk_weights),
                    ("topk_ids", topk_ids)):  # fmt: skip
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {list(t.shape)}")
        if not device.on_gpu(t):
            raise ValueError(f"{name} must be on a GPU device, got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    tokens, experts = (int(d) for d in gating.shape)
    if gating.dtype not in GATING_DTYPES:
        raise TypeError(f"gating_output must have dtype in {GATING_DTYPES}, got {gating.dtype}")
    if topk_weights.dtype != torch.float32 or topk_ids.dtype != torch.int32:
        raise TypeError(
            f"topk_weights must be float32 and topk_ids int32, got {topk_weights.dtype} and "
            f"{topk_ids.dtype}"
        )
    topk = int(topk_ids.shape[1])
    for name, t in (("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if tuple(t.shape) != (tokens, topk):
            raise ValueError(f"{name} must have shape [{tokens}, {topk}], got {list(t.shape)}")
    for name, value in (("num_expert_group", groups), ("topk_group", topk_group)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if experts % groups:
        raise ValueError(
            f"{op}: num_experts = {experts} must be a multiple of num_expert_group = {groups}"
        )
    if topk_group > groups:
        raise ValueError(f"topk_group = {topk_group} must be at most num_expert_group = {groups}")
    if not 1 <= topk <= topk_group * (experts // groups):
        raise ValueError(
            f"topk = {topk} must be in [1, {topk_group * (experts // groups)}] (the experts of "
            "the chosen groups)"
        )
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype not in BIAS_DTYPES:
            raise TypeError(f"correction_bias must be a float tensor, got {bias!r:.60}")
        if tuple(bias.shape) != (experts,):
            raise ValueError(f"correction_bias must have shape [{experts}], got {list(bias.shape)}")
    return experts, topk


def _route(op, gating, bias, topk_weights, topk_ids, groups, topk_group, renormalize, scoring,
           scaling) -> None:  # fmt: skip
    from aiter.ops.moe.kernels.routing import launch_moe_grouped_topk, routing_problem

    experts, topk = _validate(op, gating, bias, topk_weights, topk_ids, groups, topk_group)
    problem = routing_problem(experts, groups, topk_group, topk, device.arch())

    def record() -> dispatch.DispatchRecord:
        args = {
            "gating_output": dispatch.tensor_arg(gating),
            "correction_bias": dispatch.tensor_arg(bias),
            "topk_ids": dispatch.tensor_arg(topk_ids),
            "num_expert_group": str(groups),
            "topk_group": str(topk_group),
            "renormalize": str(bool(renormalize)),
        }
        if problem is not None:
            return dispatch.DispatchRecord(
                op, dispatch.BACKEND_TORCH, None, "heuristic", None, {"reason": problem},
                args=args,
            )  # fmt: skip
        return dispatch.DispatchRecord(
            op, dispatch.BACKEND_FLYDSL, "moe_grouped_topk", "heuristic", None,
            {"scoring": scoring}, args=args,
        )  # fmt: skip

    dispatch.report(record)
    bias32 = bias.to(torch.float32) if bias is not None else None
    if problem is not None:
        weights, ids = reference.grouped_topk(
            gating, bias32, topk, groups, topk_group, scoring, bool(renormalize), scaling
        )
        topk_weights.copy_(weights)
        topk_ids.copy_(ids)
        return
    launch_moe_grouped_topk(
        gating, bias32, topk_weights, topk_ids, groups=groups, topk_group=topk_group,
        scoring=scoring, renormalize=bool(renormalize), routed_scaling_factor=float(scaling),
        stream=device.current_stream(),
    )  # fmt: skip


@capture.entry("grouped_topk")
def grouped_topk(
    gating_output: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    need_renorm: bool,
    is_softmax: bool = True,
    routed_scaling_factor: float = 1.0,
) -> None:
    """Grouped top-k routing into topk_weights (float32) and topk_ids (int32), both [M, topk].

    Scores are softmax(gating_output) over a token's E experts (sigmoid when not is_softmax);
    the E experts form num_expert_group groups of consecutive experts, ranked by their best
    score; the topk best scores among the topk_group best groups are chosen (ties to the lower
    index), their scores the weights, divided by their sum when need_renorm, times
    routed_scaling_factor. With one group this is the softmax top-k of Qwen and gpt-oss.
    """
    scoring = "softmax" if is_softmax else "sigmoid"
    _route("grouped_topk", gating_output, None, topk_weights, topk_ids, num_expert_group,
           topk_group, need_renorm, scoring, routed_scaling_factor)  # fmt: skip


@capture.entry("biased_grouped_topk")
def biased_grouped_topk(
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    need_renorm: bool,
    routed_scaling_factor: float = 1.0,
) -> None:
    """DeepSeek-V3's routing into topk_weights (float32) and topk_ids (int32), [M, topk].

    s = sigmoid(gating_output); experts are chosen by s + correction_bias [E]: groups of E /
    num_expert_group consecutive experts ranked by the sum of their two best biased scores, the
    topk_group best kept, then the topk best biased scores among their experts (ties to the
    lower index). The weights are s of the chosen experts (without the bias), divided by their
    sum when need_renorm, times routed_scaling_factor (2.5 for DeepSeek-V3).
    """
    if correction_bias is None:
        raise TypeError("correction_bias must be a tensor [E], got None")
    _route("biased_grouped_topk", gating_output, correction_bias, topk_weights, topk_ids,
           num_expert_group, topk_group, need_renorm, "sigmoid", routed_scaling_factor)  # fmt: skip
