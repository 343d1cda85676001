"""Listed fmha_fp8 kernels reached by small calls (see aiter.verify.reachers).

The fp8 attention launcher takes no tuned choice: the query block follows the longest query and
the rescale threshold the longest key sequence (aiter/ops/fmha_fp8/plan.py), so a call reaches a
kernel's block_m and rescale_threshold by its lengths, and its use_split by num_kv_splits, which
it always passes (1 for no split: the plan would split long keys by itself). The key-length
switch sits at LAZY_RESCALE_KEYS, so a threshold-0 kernel runs over that many keys: one query
head, and in varlen only one sequence that long.

The forward of a split call takes the lse tensor in the place its stand-in takes without one,
so a return_lse call and one without name two cache entries with the same listed parameters
(has_lse is False in both); likewise the combine's output is [B, Sq, H, Dv] dense and
[T, H, Dv] varlen. A reacher cannot tell those apart from the parameters, so it makes both
calls: one is the target, the other is that target's twin, then done as well.

Tolerance: the reference is fp32 attention on the same fp8 inputs. The kernel rounds the
probabilities to the arch's fp8 flavour before P V (3 mantissa bits: 2^-4 relative per weight,
averaging out over the keys) and the output to bf16: 2^-5 of the largest output (OUT_TOLERANCE,
the small cases'). Over the thousands of outputs of the longer calls here the zero-mean sum of
those roundings (RMS about 2^-5 of the output's spread) passes 2^-5 of the largest output now
and then (by 1.4x at 257 x 4097, where the kernel equals the index-level emulation with P
rounded, to bf16 rounding), so they take 2^-4, the bound of one rounding. The log-sum-exp is
computed in fp32 from the same scores: 1e-4 relative.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from aiter.ops.fmha_fp8.reference import reference
from aiter.verify.checks import CaseContext
from aiter.verify.reachers import Unreachable, as_bool, reaches

OUT_TOLERANCE = 2.0**-5
OUT_TOLERANCE_MANY = 2 * OUT_TOLERANCE
LSE_TOLERANCE = 1e-4
SPLITS = 3  # several splits, one key block each at the shortest keys below
SHORT_KEYS_PAST_QUERIES = 70  # keys >= queries: every row sees a key, so its lse is finite
SHORT_QUERIES = 70  # two query blocks of 64, the second partial
FIRST_QUERIES = 30  # varlen: the other sequence's queries, one partial block


def fp8_tensor(ctx: CaseContext, *shape: int) -> torch.Tensor:
    """Normal values in this arch's fp8 flavour."""
    from aiter import device

    return ctx.randn(*shape).to(device.fp8_dtype())


def descales_of(ctx: CaseContext) -> list[torch.Tensor]:
    """q's, k's and v's descale, each in [0.5, 1)."""
    return [torch.rand(1, generator=ctx.gen) * 0.5 + 0.5 for _ in range(3)]


def _lengths(block_m: int, threshold: float) -> tuple[int, int]:
    """The longest query and key lengths whose plan picks `block_m` and `threshold`."""
    from aiter.ops.fmha_fp8 import plan

    if block_m not in plan.QUERY_BLOCKS:
        raise Unreachable(f"block_m={block_m}: the plan picks one of {plan.QUERY_BLOCKS}")
    if threshold not in (plan.LAZY_RESCALE_LOG2, 0.0):
        raise Unreachable(
            f"rescale_threshold={threshold}: the plan picks {plan.LAZY_RESCALE_LOG2} or 0"
        )
    sq = plan.SHORT_QUERIES + 1 if block_m == max(plan.QUERY_BLOCKS) else SHORT_QUERIES
    sk = plan.LAZY_RESCALE_KEYS + 1 if threshold == 0.0 else sq + SHORT_KEYS_PAST_QUERIES
    assert plan.query_block(sq) == block_m and plan.rescale_threshold(sk) == threshold
    return sq, sk


def _attention(
    ctx: CaseContext,
    *,
    block_m: int,
    head_dim: int,
    head_dim_v: int,
    causal: bool,
    varlen: bool,
    splits: int,
    threshold: float,
    return_lse: bool,
) -> None:
    """One flash_attn_fp8 call at the smallest lengths the plan serves with these choices,
    checked against the fp32 reference (out and, asked for, lse)."""
    import aiter

    sq, sk = _lengths(block_m, threshold)
    long_keys = threshold == 0.0
    hq, hkv = (1, 1) if long_keys else (2, 1)
    descales = descales_of(ctx)
    qd, kd, vd = descales
    if varlen:
        q_lens, k_lens = [FIRST_QUERIES, sq], [sk, sq + SHORT_KEYS_PAST_QUERIES // 2]
        cu_q = torch.tensor([0, *accumulate(q_lens)], dtype=torch.int32)
        cu_k = torch.tensor([0, *accumulate(k_lens)], dtype=torch.int32)
        q = fp8_tensor(ctx, int(cu_q[-1]), hq, head_dim)
        k = fp8_tensor(ctx, int(cu_k[-1]), hkv, head_dim)
        v = fp8_tensor(ctx, int(cu_k[-1]), hkv, head_dim_v)
        layout = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, max_seqlen_q=max(q_lens),
                      max_seqlen_kv=max(k_lens))  # fmt: skip
        ref_cu = (cu_q.tolist(), cu_k.tolist())
    else:
        q = fp8_tensor(ctx, 1, sq, hq, head_dim)
        k, v = fp8_tensor(ctx, 1, sk, hkv, head_dim), fp8_tensor(ctx, 1, sk, hkv, head_dim_v)
        layout, ref_cu = {}, (None, None)
    result = aiter.flash_attn_fp8(q, k, v, causal=causal, q_descale=qd, k_descale=kd,
                                  v_descale=vd, return_lse=return_lse, num_kv_splits=splits,
                                  **layout)  # fmt: skip
    out, lse = result if return_lse else (result, None)
    ref, ref_lse, _ = reference(q, k, v, descales, head_dim**-0.5, causal, *ref_cu)
    what = (
        f"flash_attn_fp8 {'varlen' if varlen else 'dense'} {sq}x{sk} h {hq}/{hkv} "
        f"d {head_dim}/{head_dim_v} causal {causal} splits {splits}"
    )
    ctx.check(what, out.reshape(ref.shape), ref, OUT_TOLERANCE_MANY)
    if lse is not None:
        # dense lse [1, Hq, Sq] against the reference's [Hq, Sq]
        ctx.check(what + " lse", lse.reshape(ref_lse.shape), ref_lse, LSE_TOLERANCE)


def _same_target(params: dict[str, str]) -> None:
    """Unreachable unless this arch runs kernels of the listed fp8 dtype and MMA flavour."""
    from aiter import device

    fp8 = str(device.fp8_dtype()).removeprefix("torch.")
    if params.get("q", fp8) != fp8:
        raise Unreachable(f"q={params['q']}: flash_attn_fp8 takes {fp8} on {device.arch()}")
    mma = device.arch_info().mma
    if params.get("mma", mma) != mma:
        raise Unreachable(f"mma={params['mma']}: {device.arch()} runs {mma}")


@reaches("flash_attn_fp8_fwd")
def forward(ctx: CaseContext, params: dict[str, str]) -> None:
    """The listed forward's block, head dims, mask, layout, split and threshold; with a split,
    without and with the lse (see the module docstring)."""
    _same_target(params)
    use_split, has_lse = as_bool(params["use_split"]), as_bool(params["has_lse"])
    if use_split and has_lse:
        raise Unreachable("a split forward is compiled without the lse, which the combine writes")
    for return_lse in (False, True) if use_split else (has_lse,):
        _attention(
            ctx,
            block_m=int(params["block_m"]),
            head_dim=int(params["head_dim"]),
            head_dim_v=int(params["head_dim_v"]),
            causal=as_bool(params["causal"]),
            varlen=as_bool(params["varlen"]),
            splits=SPLITS if use_split else 1,
            threshold=float(params["rescale_threshold"]),
            return_lse=return_lse,
        )


@reaches("flash_attn_fp8_combine")
def combine(ctx: CaseContext, params: dict[str, str]) -> None:
    """A split call dense and one varlen, with the listed lse, at the cheapest forward."""
    from aiter.ops.fmha_fp8 import plan

    for varlen in (False, True):
        _attention(ctx, block_m=min(plan.QUERY_BLOCKS), head_dim=64, head_dim_v=64, causal=True,
                   varlen=varlen, splits=SPLITS, threshold=plan.LAZY_RESCALE_LOG2,
                   return_lse=as_bool(params["has_lse"]))  # fmt: skip
