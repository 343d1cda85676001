"""fp8 prefill attention cases: dense causal and not, GQA, key lengths past the query's
(bottom-right causal), head dims 64 and 128, varlen, the log-sum-exp, and KV splits merged by the
combine kernel; sequence lengths that leave partial query and key blocks.

Tolerance: aiter/ops/fmha_fp8/reach.py (OUT_TOLERANCE, LSE_TOLERANCE).
"""

from __future__ import annotations

import torch

from aiter.ops.fmha_fp8.reach import LSE_TOLERANCE, OUT_TOLERANCE, descales_of, fp8_tensor
from aiter.ops.fmha_fp8.reference import reference
from op_tests.emulated.suite import CaseContext, case


def _dense(ctx: CaseContext, b, sq, sk, hq, hkv, d, causal, lse=False, splits=None) -> None:
    import aiter

    q = fp8_tensor(ctx, b, sq, hq, d)
    k, v = fp8_tensor(ctx, b, sk, hkv, d), fp8_tensor(ctx, b, sk, hkv, d)
    qd, kd, vd = descales_of(ctx)
    result = aiter.flash_attn_fp8(q, k, v, causal=causal, q_descale=qd, k_descale=kd,
                                  v_descale=vd, return_lse=lse, num_kv_splits=splits)  # fmt: skip
    out, out_lse = result if lse else (result, None)
    ref, ref_lse, _ = reference(q, k, v, (qd, kd, vd), d**-0.5, causal)
    what = f"flash_attn_fp8 {b}x{sq}x{sk} h {hq}/{hkv} d {d} causal {causal}"
    ctx.check(what, out.reshape(b * sq, hq, d), ref, OUT_TOLERANCE)
    if lse:
        # lse [B, Hq, Sq] against the reference's [Hq, B * Sq]
        ctx.check(what + " lse", out_lse.permute(1, 0, 2).reshape(hq, b * sq), ref_lse,
                  LSE_TOLERANCE)  # fmt: skip


@case("fmha_fp8")
def dense_causal_d64(ctx: CaseContext) -> None:
    _dense(ctx, 1, 70, 70, 2, 2, 64, causal=True)


@case("fmha_fp8")
def gqa_longer_keys_with_lse_d128(ctx: CaseContext) -> None:
    _dense(ctx, 2, 33, 90, 4, 2, 128, causal=True, lse=True)


@case("fmha_fp8")
def non_causal_d128(ctx: CaseContext) -> None:
    _dense(ctx, 1, 40, 72, 2, 1, 128, causal=False)


@case("fmha_fp8")
def kv_splits_combined(ctx: CaseContext) -> None:
    _dense(ctx, 1, 16, 200, 2, 2, 64, causal=False, splits=2)


@case("fmha_fp8")
def varlen_causal(ctx: CaseContext) -> None:
    import aiter

    q_lens, k_lens, hq, hkv, d = [20, 37], [30, 37], 4, 2, 64
    cu_q = torch.tensor([0, 20, 57], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 67], dtype=torch.int32)
    q = fp8_tensor(ctx, 57, hq, d)
    k, v = fp8_tensor(ctx, 67, hkv, d), fp8_tensor(ctx, 67, hkv, d)
    qd, kd, vd = descales_of(ctx)
    out = aiter.flash_attn_fp8(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                               cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, max_seqlen_q=max(q_lens),
                               max_seqlen_kv=max(k_lens))  # fmt: skip
    ref, _, _ = reference(q, k, v, (qd, kd, vd), d**-0.5, True, cu_q.tolist(), cu_k.tolist())
    ctx.check("flash_attn_fp8 varlen causal", out, ref, OUT_TOLERANCE)
