"""fp8 prefill attention cases: dense causal and not, GQA, key lengths past the query's
(bottom-right causal), head dims 64 and 128, varlen, the log-sum-exp, and KV splits merged by the
combine kernel; sequence lengths that leave partial query and key blocks.

Tolerance: the reference is fp32 attention on the same fp8 inputs. The kernel rounds the
probabilities to the arch's fp8 flavour before P V (3 mantissa bits: 2^-4 relative per weight,
averaging out over the keys) and the output to bf16: 2^-5 of the largest output. The
log-sum-exp is computed in fp32 from the same scores: 1e-4 relative.
"""

from __future__ import annotations

import torch

from op_tests.emulated.suite import CaseContext, case

OUT_TOLERANCE = 2.0**-5
LSE_TOLERANCE = 1e-4


def _fp8(ctx: CaseContext, *shape: int) -> torch.Tensor:
    from aiter import device

    return ctx.randn(*shape).to(device.fp8_dtype())


def _descales(ctx: CaseContext) -> list[torch.Tensor]:
    return [torch.rand(1, generator=ctx.gen) * 0.5 + 0.5 for _ in range(3)]


def _dense(ctx: CaseContext, b, sq, sk, hq, hkv, d, causal, lse=False, splits=None) -> None:
    import aiter
    from op_tests.fmha_fp8.test_fmha_fp8_kernels import reference

    q, k, v = _fp8(ctx, b, sq, hq, d), _fp8(ctx, b, sk, hkv, d), _fp8(ctx, b, sk, hkv, d)
    qd, kd, vd = _descales(ctx)
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
    from op_tests.fmha_fp8.test_fmha_fp8_kernels import reference

    q_lens, k_lens, hq, hkv, d = [20, 37], [30, 37], 4, 2, 64
    cu_q = torch.tensor([0, 20, 57], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 67], dtype=torch.int32)
    q, k, v = _fp8(ctx, 57, hq, d), _fp8(ctx, 67, hkv, d), _fp8(ctx, 67, hkv, d)
    qd, kd, vd = _descales(ctx)
    out = aiter.flash_attn_fp8(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                               cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, max_seqlen_q=max(q_lens),
                               max_seqlen_kv=max(k_lens))  # fmt: skip
    ref, _, _ = reference(q, k, v, (qd, kd, vd), d**-0.5, True, cu_q.tolist(), cu_k.tolist())
    ctx.check("flash_attn_fp8 varlen causal", out, ref, OUT_TOLERANCE)
