"""Dense torch fp32 reference of a whole MoE layer (both expert GEMM stages), written without
the kernels' index math, for the FlyDSL MoE kernel tests, the host tests and the emulated
checks of aiter.ops.moe.reach."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_MAX = {torch.float8_e4m3fnuz: 240.0, torch.float8_e4m3fn: 448.0}
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def per_token_quant(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [rows, K] of fp8 `dtype`, scale float32 [rows, 1]) with x ~= q * scale per row."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-10)
    scale = amax / FP8_MAX[dtype]
    q = (xf / scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    return q, scale


def local_experts(num_global: int, expert_mask: torch.Tensor | None) -> torch.Tensor:
    """int64 [num_global]: the local weight index of each global expert, -1 if not local.

    The local index of a local expert is the number of local experts below it.
    """
    if expert_mask is None:
        return torch.arange(num_global)
    mask = expert_mask.to(torch.bool).reshape(-1)
    if mask.numel() != num_global:
        raise ValueError(f"expert_mask: expected {num_global} entries, got {mask.numel()}")
    return torch.where(mask, torch.cumsum(mask.to(torch.int64), 0) - 1, -1)


def act_reference(activation: str, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    if activation == "silu":
        return F.silu(g) * u
    if activation == "swiglu":
        g = g.clamp(max=SWIGLU_LIMIT)
        u = u.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
        return g * torch.sigmoid(SWIGLU_ALPHA * g) * (u + 1)
    raise ValueError(f"activation: expected 'silu' or 'swiglu', got {activation!r}")


def split_gate_up(h: torch.Tensor, gate_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) halves of h [rows, 2 * inter] laid out like the rows of w1."""
    inter = h.shape[-1] // 2
    if gate_mode == "separated":
        return h[..., :inter], h[..., inter:]
    if gate_mode == "interleave":
        return h[..., 0::2], h[..., 1::2]
    raise ValueError(f"gate_mode: expected 'separated' or 'interleave', got {gate_mode!r}")


def fused_moe_reference(
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str,
    gate_mode: str,
    bias1: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    doweight_stage1: bool = False,
    expert_mask: torch.Tensor | None = None,
    num_local_tokens: int | None = None,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    quant: bool = False,
) -> torch.Tensor:
    """out float32 [M, model_dim] of the MoE layer, looping over the local experts.

    - hidden [M, model_dim]; w1 [E, 2 * inter, model_dim] (gate and up rows as gate_mode says:
      "separated" rows n and inter + n, "interleave" rows 2n and 2n + 1); w2 [E, model_dim,
      inter]; topk_weights float [M, topk]; topk_ids int [M, topk] of GLOBAL expert ids.
    - expert_mask (bool/int [num_global]) or None: the local experts; w1/w2 hold them in order
      (local index = number of local experts below). Pairs routed to other experts add nothing.
    - num_local_tokens (int or a tensor whose first element counts): tokens at or past it add
      nothing (their rows of out are zero).
    - Stage 1: act(x . w1[e, gate] + bias1[e, gate], x . w1[e, up] + bias1[e, up]), times the
      routing weight when doweight_stage1; stage 2: that . w2[e]^T + bias2[e], times the routing
      weight unless doweight_stage1, summed over the token's slots.
    - quant: w1 and w2 are fp8 (row-major, NOT preshuffled) scaled per row by w1_scale
      [E, 2 * inter, 1] and w2_scale [E, model_dim, 1]; hidden is quantized per token to
      w1.dtype, and each stage-1 row is rounded to hidden's dtype (bfloat16 or float16;
      bfloat16 for an fp32 hidden) and quantized per row, as the fp8 kernels' host path does. Without quant everything is computed in fp32 from the inputs.
    """
    m, model_dim = hidden.shape
    num_experts, two_inter, _ = w1.shape
    inter = two_inter // 2
    topk = topk_ids.shape[1]
    num_global = num_experts if expert_mask is None else int(expert_mask.numel())
    local = local_experts(num_global, expert_mask)[topk_ids.long()]
    tokens = m
    if num_local_tokens is not None:
        count = num_local_tokens
        if isinstance(count, torch.Tensor):
            count = count.reshape(-1)[0]
        tokens = max(0, min(m, int(count)))

    if quant:
        xq, xs = per_token_quant(hidden, w1.dtype)
        x = xq.float() * xs
        wg1 = w1.float() * w1_scale.float()
        wg2 = w2.float() * w2_scale.float()
    else:
        x = hidden.float()
        wg1, wg2 = w1.float(), w2.float()
    weights = topk_weights.float()

    out1 = torch.zeros(m * topk, inter)
    for e in range(num_experts):
        t, k = torch.nonzero((local == e) & (torch.arange(m)[:, None] < tokens), as_tuple=True)
        if t.numel() == 0:
            continue
        h = x[t] @ wg1[e].T
        if bias1 is not None:
            h = h + bias1[e].float()
        g, u = split_gate_up(h, gate_mode)
        y = act_reference(activation, g, u)
        if doweight_stage1:
            y = y * weights[t, k][:, None]
        out1[t * topk + k] = y

    if quant:
        out1_dtype = (
            hidden.dtype if hidden.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        )
        aq, a_s = per_token_quant(out1.to(out1_dtype), w2.dtype)
        a2 = aq.float() * a_s
    else:
        a2 = out1
    out = torch.zeros(m, model_dim)
    for e in range(num_experts):
        t, k = torch.nonzero((local == e) & (torch.arange(m)[:, None] < tokens), as_tuple=True)
        if t.numel() == 0:
            continue
        z = a2[t * topk + k] @ wg2[e].T
        if bias2 is not None:
            z = z + bias2[e].float()
        if not doweight_stage1:
            z = z * weights[t, k][:, None]
        out.index_add_(0, t, z)
    return out


def grouped_topk(
    gating: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    groups: int,
    topk_group: int,
    scoring: str,
    renormalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k routing, written plainly after DeepSeek-V3's rule (vLLM's grouped_topk):
    (float32 weights, int32 ids) [M, topk], picks in descending order of the choice score."""
    logits = gating.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else logits.sigmoid()
    choice = scores + bias.float() if bias is not None else scores
    tokens, experts = choice.shape
    by_group = choice.view(tokens, groups, experts // groups)
    if bias is not None:
        group_scores = by_group.topk(min(2, experts // groups), dim=-1)[0].sum(dim=-1)
    else:
        group_scores = by_group.max(dim=-1).values
    chosen = group_scores.topk(topk_group, dim=-1)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen, True)
    keep = keep.unsqueeze(-1).expand(tokens, groups, experts // groups).reshape(tokens, experts)
    ids = choice.masked_fill(~keep, float("-inf")).topk(topk, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights * scaling).to(torch.float32), ids.to(torch.int32)
