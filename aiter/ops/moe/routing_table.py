"""The table of MoE routing configurations a deployment serves (`moe_routing.csv`): the runtime
needs no tuned choice from it; the AOT replay reads it to know which expert counts, groupings,
scorings and top-k to build the routing kernel for. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiter.tuning import BucketAxis, Column, Row, TableSpec
from aiter.tuning.kinds import PARSERS

SCORINGS = ("softmax", "sigmoid")
TOKENS_AXIS = BucketAxis(name="tokens", column="max_tokens")


def covers(row: Row, cells: Mapping[str, str]) -> bool:
    """Whether `row` covers a call whose own row would hold `cells`: the same configuration and
    at least the call's tokens."""
    kinds = {c.name: c.kind for c in MOE_ROUTING.columns}
    for column in MOE_ROUTING.key:
        parse = PARSERS[kinds[column]]
        mine, theirs = parse(row.cells[column]), parse(cells[column].strip())
        if (mine < theirs) if column == "max_tokens" else (mine != theirs):
            return False
    return True


MOE_ROUTING = TableSpec(
    name="moe_routing.csv",
    short_name="moe_routing",
    aot_module="moe_routing",
    env_var="AITER_CONFIG_MOE_ROUTING",
    columns=(
        Column("gfx", "str"),
        Column("cu_num", "int", minimum=1),
        Column("num_experts", "int", minimum=1),
        Column("topk", "int", minimum=1),
        Column("num_expert_group", "int", minimum=1),
        Column("topk_group", "int", minimum=1),
        Column("scoring", "str", choices=SCORINGS),
        Column("correction_bias", "bool01"),  # biased_grouped_topk (sigmoid scoring)
        Column("max_tokens", "int", minimum=1),
        Column("model", "optional_str"),
    ),
    key=(
        "gfx", "cu_num", "num_experts", "topk", "num_expert_group", "topk_group", "scoring",
        "correction_bias", "max_tokens",
    ),  # fmt: skip
    axis=TOKENS_AXIS,
    # What a caller chooses that the table does not record: renormalization (a kernel of its
    # own) and the router logits' dtype.
    open_choices={"renormalize": ("false", "true"), "gating_dtype": ("float32", "bfloat16")},
    covers=covers,
)
