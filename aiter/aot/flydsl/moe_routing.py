"""AOT replay of the MoE routing table: each row becomes calls of `aiter.grouped_topk` (or
`aiter.biased_grouped_topk` for a row with a correction bias) with FakeTensors, for each
renormalization and logits dtype, over the token counts up to the row's maximum.

The routing kernel's compile-time choices are the row's configuration and the caller's
choices, never the token count (a runtime argument that only sizes the grid), so bisection over
the tokens finds one run per job. Run `python -m aiter.aot.flydsl.moe_routing [--list |
--check]` (or `python -m aiter.aot.flydsl`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from aiter.aot.flydsl.jobs.axes import dims_along
from aiter.aot.flydsl.jobs.family import Call, CapturedOp, Family
from aiter.ops.moe.routing_table import MOE_ROUTING
from aiter.tuning import Row, TableSpec


def caller(spec: TableSpec, row: Row, variant: Mapping[str, str]) -> Call:
    from aiter.ops.moe import routing_entry

    experts, topk = row.int("num_experts"), row.int("topk")
    groups, topk_group = row.int("num_expert_group"), row.int("topk_group")
    biased = row.flag("correction_bias")
    softmax = row["scoring"] == "softmax"
    renormalize = variant["renormalize"] == "true"

    def call(tokens: int) -> None:
        import torch

        def empty(shape, dtype):
            return torch.empty(shape, dtype=dtype, device="cuda")

        gating = empty((tokens, experts), getattr(torch, variant["gating_dtype"]))
        weights, ids = empty((tokens, topk), torch.float32), empty((tokens, topk), torch.int32)
        if biased:
            bias = empty((experts,), torch.float32)
            routing_entry.biased_grouped_topk(gating, bias, weights, ids, groups, topk_group,
                                              renormalize)  # fmt: skip
        else:
            routing_entry.grouped_topk(gating, weights, ids, groups, topk_group, renormalize,
                                       softmax)  # fmt: skip

    return call


_ENTRY = "aiter.ops.moe.routing_entry"
_PER_TOKEN = {"gating_output": 0, "topk_weights": 0, "topk_ids": 0}
CAPTURED = {
    op: CapturedOp(f"{_ENTRY}:{op}", dims_along("tokens", _PER_TOKEN))
    for op in ("grouped_topk", "biased_grouped_topk")
}
FAMILY = Family(name="moe_routing", tables=(MOE_ROUTING,), caller=caller, captured=CAPTURED)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.moe_routing"], argv)


if __name__ == "__main__":
    sys.exit(run())
