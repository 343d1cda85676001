"""Torch reference of flash_attn_fp8, written from the math, not from the kernel's index
arithmetic: fp32 attention on the dequantised fp8 inputs, sequence by sequence (GQA by repeating
the kv heads, the causal mask bottom-right), with the log-sum-exp of the scaled scores."""

from __future__ import annotations

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def rows_view(x: torch.Tensor, varlen: bool) -> torch.Tensor:
    """[rows, heads, dim] float32 view of a dense [B, S, H, dim] or varlen [T, H, dim] tensor."""
    return x.float().reshape(-1, x.shape[-2], x.shape[-1]) if not varlen else x.float()


def reference(q, k, v, descales, softmax_scale, causal, cu_q=None, cu_k=None):
    """out [rows, Hq, Dv], lse [Hq, rows] and the visible-pair mask [Hq, rows, key rows] of
    attention over q, k, v (dense, or varlen with the cumulative lengths cu_q and cu_k as lists)
    dequantised by `descales` (q's, k's, v's). A row that sees no key has out 0 and lse -inf."""
    varlen = cu_q is not None
    qf, kf, vf = (rows_view(x, varlen) * d for x, d in zip((q, k, v), descales, strict=True))
    rows, hq, _ = qf.shape
    hkv, dv = kf.shape[1], vf.shape[2]
    if not varlen:
        batch, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        cu_q = [b * sq for b in range(batch + 1)]
        cu_k = [b * sk for b in range(batch + 1)]
    out = torch.zeros(rows, hq, dv)
    lse = torch.full((hq, rows), NEG_INF)
    visible = torch.zeros(hq, rows, kf.shape[0], dtype=torch.int32)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        sq, sk = q1 - q0, k1 - k0
        if sq == 0 or sk == 0:
            continue
        qs = qf[q0:q1].transpose(0, 1)
        ks = kf[k0:k1].repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        vs = vf[k0:k1].repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        mask = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            mask = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=softmax_scale)
        any_key = mask.any(dim=1)
        out[q0:q1] = torch.where(any_key[None, :, None], o, 0.0).transpose(0, 1)
        s = (qs @ ks.transpose(1, 2)) * softmax_scale
        lse[:, q0:q1] = torch.logsumexp(s.masked_fill(~mask, NEG_INF), dim=-1)
        visible[:, q0:q1, k0:k1] = mask.int()[None]
    return out, lse, visible
