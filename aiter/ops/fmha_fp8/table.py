"""The table of fp8 attention shapes a deployment serves (`fmha_fp8_shapes.csv`). The launcher
needs no tuned choice from it; the AOT replay reads it to know which heads, layouts and ranges of
batch and sequence length to replay. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiter.tuning import BucketAxis, Column, Row, TableSpec
from aiter.tuning.kinds import PARSERS

LAYOUTS = ("dense", "varlen")

# The grid's largest sequence length comes from each row's max_seqlen; --max-seqlen caps it.
SEQLEN_AXIS = BucketAxis(name="seqlen", column="max_seqlen", default_max=1 << 20)

MAXIMA = ("max_batch", "max_seqlen")


def covers(row: Row, cells: Mapping[str, str]) -> bool:
    """Whether `row` covers a call whose own row would hold `cells`: the same heads, layout and
    masking, and maxima at least the call's."""
    kinds = {c.name: c.kind for c in FMHA_FP8.columns}
    for column in FMHA_FP8.key:
        parse = PARSERS[kinds[column]]
        mine, theirs = parse(row.cells[column]), parse(cells[column].strip())
        if (mine < theirs) if column in MAXIMA else (mine != theirs):
            return False
    return True


FMHA_FP8 = TableSpec(
    name="fmha_fp8_shapes.csv",
    short_name="fmha_fp8",
    aot_module="fmha_fp8",
    env_var="AITER_CONFIG_FMHA_FP8",
    columns=(
        Column("gfx", "str"),
        Column("cu_num", "int", minimum=1),
        Column("num_heads", "int", minimum=1),
        Column("num_kv_heads", "int", minimum=1),
        Column("head_dim", "int", minimum=64, maximum=256),
        Column("head_dim_v", "int", minimum=64, maximum=256),
        Column("layout", "str", choices=LAYOUTS),
        Column("causal", "bool01"),
        Column("max_batch", "int", minimum=1),
        Column("max_seqlen", "int", minimum=1),
        Column("model", "optional_str"),
    ),
    key=(
        "gfx", "cu_num", "num_heads", "num_kv_heads", "head_dim", "head_dim_v", "layout",
        "causal", "max_batch", "max_seqlen",
    ),  # fmt: skip
    axis=SEQLEN_AXIS,
    # The caller decides whether it wants the log-sum-exp; the replay calls both ways.
    open_choices={"return_lse": ("false", "true")},
    covers=covers,
)
