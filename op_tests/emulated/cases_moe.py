"""Fused MoE cases: routing by fused_topk, sorting, both expert stages; silu and gpt-oss's swiglu
with expert biases, separated and interleaved gate/up rows, the routing weight after stage 1 or
2, expert parallelism's expert mask and local token count, per-token fp8 experts, and bf16 and
fp16 activations (stage 2 adds rows with packed atomics or by a reduction, per dtype).

Tolerance (fp32 reference without intermediate rounding): the kernels round the stage-1 rows
to the activations' dtype before stage 2 and the output once, so up to a few roundings of the
output dtype, 4 ROUNDOFF. With fp8 experts the reference quantises as the kernels do, but a
stage-1 value one bf16 ulp away from the reference's can round to the neighbouring fp8 value
(2^-4 relative for e4m3's 3 mantissa bits), diluted over the inter_dim terms of stage 2: 2^-6.
"""

from __future__ import annotations

import torch

from aiter.ops.moe.reach import EXPERTS, route, weights
from aiter.ops.moe.reference import fused_moe_reference
from op_tests.emulated.suite import ROUNDOFF, CaseContext, case

M, MODEL_DIM, INTER = 5, 128, 96


def _moe(ctx: CaseContext, what: str, dtype=torch.bfloat16, m=M, **kw) -> None:
    import aiter

    x = ctx.randn(m, MODEL_DIM, dtype=dtype)
    w1, w2 = weights(ctx, dtype)
    experts_global = kw.pop("experts_global", EXPERTS)
    tw, ti = route(ctx, x, experts_global)
    activation = kw.get("activation", "silu")
    if activation == "swiglu":
        kw["bias1"] = ctx.randn(EXPERTS, 2 * INTER, scale=0.1)
        kw["bias2"] = ctx.randn(EXPERTS, MODEL_DIM, scale=0.1)
    out = aiter.fused_moe(x, w1, w2, tw, ti, **kw)
    local_tokens = kw.get("num_local_tokens")
    ref = fused_moe_reference(
        x, w1, w2, tw, ti, activation=activation, gate_mode=kw.get("gate_mode", "separated"),
        bias1=kw.get("bias1"), bias2=kw.get("bias2"),
        doweight_stage1=kw.get("doweight_stage1", False), expert_mask=kw.get("expert_mask"),
        num_local_tokens=local_tokens,
    )  # fmt: skip
    ctx.check(what, out, ref, 4 * ROUNDOFF[dtype])


@case("moe")
def silu_separated_bf16(ctx: CaseContext) -> None:
    _moe(ctx, "fused_moe silu separated bf16")


@case("moe")
def silu_interleaved_fp16(ctx: CaseContext) -> None:
    _moe(ctx, "fused_moe silu interleave fp16", dtype=torch.float16, gate_mode="interleave")


@case("moe")
def swiglu_bias_interleaved(ctx: CaseContext) -> None:
    _moe(ctx, "fused_moe swiglu + biases interleave", activation="swiglu",
         gate_mode="interleave")  # fmt: skip


@case("moe")
def weight_after_stage1(ctx: CaseContext) -> None:
    _moe(ctx, "fused_moe doweight_stage1", m=9, doweight_stage1=True)


@case("moe")
def expert_mask_and_local_tokens(ctx: CaseContext) -> None:
    """8 global experts of which the 4 local ones are 1, 2, 5, 7; only 4 of 6 tokens routed."""
    mask = torch.zeros(8, dtype=torch.int32)
    mask[[1, 2, 5, 7]] = 1
    _moe(ctx, "fused_moe expert_mask + num_local_tokens", m=6, experts_global=8,
         expert_mask=mask, num_local_tokens=torch.tensor([4], dtype=torch.int32))  # fmt: skip


@case("moe")
def per_token_fp8(ctx: CaseContext) -> None:
    import aiter
    from aiter import device

    fp8 = device.fp8_dtype()
    x = ctx.randn(7, MODEL_DIM, dtype=torch.bfloat16)
    w1, w2 = weights(ctx, torch.float32)
    s1 = w1.abs().amax(dim=2, keepdim=True) / torch.finfo(fp8).max
    s2 = w2.abs().amax(dim=2, keepdim=True) / torch.finfo(fp8).max
    q1, q2 = (w1 / s1).to(fp8), (w2 / s2).to(fp8)
    tw, ti = route(ctx, x, EXPERTS)
    out = aiter.fused_moe(x, aiter.shuffle_weight(q1), aiter.shuffle_weight(q2), tw, ti,
                          quant_type="per_token", w1_scale=s1, w2_scale=s2)  # fmt: skip
    ref = fused_moe_reference(x, q1, q2, tw, ti, activation="silu", gate_mode="separated",
                              w1_scale=s1, w2_scale=s2, quant=True)  # fmt: skip
    ctx.check("fused_moe per_token fp8", out, ref, 2.0**-6)


# --- routing -----------------------------------------------------------------------------------


@case("moe")
def routing_deepseek_v3(ctx: CaseContext) -> None:
    """DeepSeek-V3/R1: 256 experts in 8 groups, 4 groups kept, top-8, sigmoid plus correction
    bias, renormalized, scaled by 2.5; bf16 logits; 33 tokens (a partial block of waves)."""
    from aiter.ops.moe.reach import routing_call

    routing_call(ctx, 33, 256, 8, 4, 8, "sigmoid", True, True, torch.bfloat16, 2.5)


@case("moe")
def routing_kimi_k2(ctx: CaseContext) -> None:
    """Kimi-K2: 384 experts, one group, top-8, sigmoid plus bias (six experts per lane)."""
    from aiter.ops.moe.reach import routing_call

    routing_call(ctx, 5, 384, 1, 1, 8, "sigmoid", True, True, scaling=2.827)


@case("moe")
def routing_softmax_topk(ctx: CaseContext) -> None:
    """Qwen3-MoE's softmax top-8 of 128 experts, not renormalized; and a plain grouped top-4
    (64 experts, 8 groups by their best score, 3 kept)."""
    from aiter.ops.moe.reach import routing_call

    routing_call(ctx, 7, 128, 1, 1, 8, "softmax", False, False)
    routing_call(ctx, 6, 64, 8, 3, 4, "softmax", False, True, torch.float16)
