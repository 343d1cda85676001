"""Chunked gated delta rule (hidden-state pass) cases: scalar gates, per-key gates with an
initial state, varlen sequences with the final state, without the new values, fp16, head dims
64 and 128, sequence lengths that end inside a chunk.

Tolerance: aiter/ops/chunk_gdn_h/reach.py.
"""

from __future__ import annotations

import torch

from aiter.ops.chunk_gdn_h.reach import gdn_case
from op_tests.emulated.suite import CaseContext, case


@case("chunk_gdn_h")
def scalar_gate_final_state(ctx: CaseContext) -> None:
    gdn_case(ctx, "gdn g, final", 1, 100, 1, 2, 128, 128, final=True)


@case("chunk_gdn_h")
def key_gate_initial_state_d128(ctx: CaseContext) -> None:
    gdn_case(ctx, "gdn gk, h0, d 128", 1, 70, 2, 2, 128, 128, scalar_g=False, key_g=True,
         initial=True, final=True)  # fmt: skip


@case("chunk_gdn_h")
def varlen_without_new_values(ctx: CaseContext) -> None:
    gdn_case(ctx, "gdn varlen, no v_new", 1, 150, 1, 2, 128, 64, cu=[0, 40, 150],
         save_new=False, final=True, initial=True)  # fmt: skip


@case("chunk_gdn_h")
def fp16_batch(ctx: CaseContext) -> None:
    gdn_case(ctx, "gdn fp16 batch 2", 2, 65, 1, 1, 64, 128, dtype=torch.float16)
