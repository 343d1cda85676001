"""Chunked gated delta rule (hidden-state pass) cases: scalar gates, per-key gates with an
initial state, varlen sequences with the final state, without the new values, fp16, head dims
64 and 128, sequence lengths that end inside a chunk.

Tolerance: the reference (op_tests/chunk_gdn_h/reference.py, rounded=True) rounds where the
kernel does (the state to the input dtype before w h and when stored, v_new before k^T v_new),
so what remains is fp32 sums in another order and the odd value rounding the other way: 2
ROUNDOFF of the input dtype.
"""

from __future__ import annotations

import torch

from op_tests.chunk_gdn_h.reference import chunk_states
from op_tests.emulated.suite import ROUNDOFF, CaseContext, case


def _gdn(
    ctx: CaseContext,
    what,
    b,
    t,
    hg,
    h,
    dk,
    dv,
    *,
    dtype=torch.bfloat16,
    scalar_g=True,
    key_g=False,
    initial=False,
    final=False,
    save_new=True,
    cu=None,
) -> None:
    import aiter

    k = ctx.randn(b, t, hg, dk, dtype=dtype, scale=dk**-0.5)
    w = ctx.randn(b, t, h, dk, dtype=dtype, scale=dk**-0.5)
    u = ctx.randn(b, t, h, dv, dtype=dtype, scale=0.5)
    g = -(torch.rand(b, t, h, generator=ctx.gen) * 0.05).cumsum(1) if scalar_g else None
    gk = -(torch.rand(b, t, h, dk, generator=ctx.gen) * 0.05).cumsum(1) if key_g else None
    cu_seqlens = torch.tensor(cu, dtype=torch.int32) if cu else None
    n = len(cu) - 1 if cu else b
    h0 = ctx.randn(n, h, dk, dv, scale=0.1) if initial else None
    args = dict(g=g, gk=gk, initial_state=h0, output_final_state=final, save_new_value=save_new,
                cu_seqlens=cu_seqlens)  # fmt: skip
    got = aiter.chunk_gated_delta_rule_fwd_h(k, w, u, **args)
    ref = chunk_states(k, w, u, **args)
    tol = 2 * ROUNDOFF[dtype]
    for name, out, expected in zip(("h", "v_new", "final_state"), got, ref, strict=True):
        if expected is None:
            assert out is None, f"{what}: {name} returned where none was asked for"
            continue
        ctx.check(f"{what} {name}", out.float(), expected.float(), tol)


@case("chunk_gdn_h")
def scalar_gate_final_state(ctx: CaseContext) -> None:
    _gdn(ctx, "gdn g, final", 1, 100, 1, 2, 128, 128, final=True)


@case("chunk_gdn_h")
def key_gate_initial_state_d128(ctx: CaseContext) -> None:
    _gdn(ctx, "gdn gk, h0, d 128", 1, 70, 2, 2, 128, 128, scalar_g=False, key_g=True,
         initial=True, final=True)  # fmt: skip


@case("chunk_gdn_h")
def varlen_without_new_values(ctx: CaseContext) -> None:
    _gdn(ctx, "gdn varlen, no v_new", 1, 150, 1, 2, 128, 64, cu=[0, 40, 150],
         save_new=False, final=True, initial=True)  # fmt: skip


@case("chunk_gdn_h")
def fp16_batch(ctx: CaseContext) -> None:
    _gdn(ctx, "gdn fp16 batch 2", 2, 65, 1, 1, 64, 128, dtype=torch.float16)
