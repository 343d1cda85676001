"""AOT replay of the fused-MoE table: each shape's token range, cut where the runtime's own padded
token count changes, becomes calls of `fused_moe` with FakeTensors for every caller variant.

Run `python -m aiter.aot.flydsl.moe [--list | --check]` (or `python -m aiter.aot.flydsl` for all).

Why bisection inside a run finds every kernel: the kernels are a function of the plan's block
size, K split and tiles; the planner's block size never shrinks as tokens grow, and with one
block size its K split never grows; so each choice holds on one run of tokens, and two probes
asking for the same kernels bound a run of them (tests/replay/test_bisection_exact.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from aiter.aot.flydsl.jobs.axes import dims_along
from aiter.aot.flydsl.jobs.family import Call, CapturedOp, Family
from aiter.aot.flydsl.jobs.fixed_inputs import FixedInputs
from aiter.ops.moe.table import ACT_SWIGLU, FMOE, QUANT_PER_TOKEN, SWIGLU_VARIANTS
from aiter.tuning import Row, TableSpec

# The expert-parallel variant keeps 1 in EP_DEGREE experts local (at least one); how many does
# not enter any kernel's key, only that a mask is passed.
EP_DEGREE = 8
ACTIVATIONS = {"ActivationType.Silu": "silu", ACT_SWIGLU: "swiglu"}


def _dtype(name: str):
    import torch

    return getattr(torch, name.removeprefix("torch."))  # the table's spec vetted the name


def _empty(shape: tuple[int, ...], dtype):
    import torch

    return torch.empty(shape, dtype=dtype, device="cuda")


def variants(spec: TableSpec, row: Row) -> list[dict[str, str]]:
    """The spec's caller variants, and for swiglu rows with and without expert biases."""
    base = spec.variants()
    if row["act_type"] != ACT_SWIGLU:
        return base
    return [v | {"bias": b} for v in base for b in SWIGLU_VARIANTS["bias"]]


def caller(spec: TableSpec, row: Row, variant: Mapping[str, str]) -> Call:
    """fused_moe as a caller of this row's layer calls it, at a given token count."""
    from aiter.ops.moe.entry import fused_moe

    model_dim, inter = row.int("model_dim"), row.int("inter_dim")
    experts, topk = row.int("expert"), row.int("topk")
    quantized = row["q_type"] == QUANT_PER_TOKEN
    masked = variant["experts"] == "masked"
    local = max(1, experts // EP_DEGREE) if masked else experts
    with_bias = variant.get("bias") == "both"
    fixed = FixedInputs()  # the layer's weights, scales, biases and mask, kept across calls

    def call(tokens: int) -> None:
        import torch

        act_dtype, w_dtype = _dtype(row["dtype"]), _dtype(row["q_dtype_w"])
        kwargs = {}
        if quantized:
            kwargs["w1_scale"] = fixed.empty("w1_scale", (local, 2 * inter, 1), torch.float32)
            kwargs["w2_scale"] = fixed.empty("w2_scale", (local, model_dim, 1), torch.float32)
        if with_bias:
            kwargs["bias1"] = fixed.empty("bias1", (local, 2 * inter), torch.float32)
            kwargs["bias2"] = fixed.empty("bias2", (local, model_dim), torch.float32)
        if masked:
            kwargs["expert_mask"] = fixed.empty("expert_mask", (experts,), torch.int32)
        if variant["local_tokens"] == "given":
            kwargs["num_local_tokens"] = _empty((1,), torch.int32)
        fused_moe(
            _empty((tokens, model_dim), act_dtype),
            fixed.empty("w1", (local, 2 * inter, model_dim), w_dtype),  # preshuffled: same shape
            fixed.empty("w2", (local, model_dim, inter), w_dtype),
            _empty((tokens, topk), torch.float32),
            _empty((tokens, topk), torch.int32),
            activation=ACTIVATIONS[row["act_type"]],
            quant_type="per_token" if quantized else None,
            gate_mode=variant["gate_mode"],
            doweight_stage1=row.flag("doweight_stage1"),
            **kwargs,
        )

    return call


def padded_tokens(tokens: int) -> int:
    """The token count the runtime's table lookup uses (get_padded_M): each run of one padded
    count is a job. get_padded_M never decreases, so bisection finds every run exactly."""
    from aiter.ops.moe.host_planner import get_padded_M

    return get_padded_M(tokens)


def serving(spec: TableSpec, rows: Sequence[Row], tokens: int) -> Row | None:
    """The row of a shape the runtime's lookup serves `tokens` with; None: the planner serves
    (its run is then a job of the shape's nearest row)."""
    from aiter.ops.moe.plan import tuned_row

    key = {name: rows[0][name] for name in spec.key if name != spec.axis.column}
    return tuned_row(key, tokens)[1]


# Each shape's tokens from 1 to the deployment's maximum, one job per padded-token run and caller
# variant, of the row the runtime's lookup picks there.
_ENTRY = "aiter.ops.moe.entry"
_PER_TOKEN = {"hidden_states": 0, "topk_weights": 0, "topk_ids": 0, "gating_output": 0}
# Every per-token argument has the tokens in its rows.
CAPTURED = {
    op: CapturedOp(f"{_ENTRY}:{op}", dims_along("tokens", _PER_TOKEN))
    for op in ("fused_moe", "moe_sorting", "fused_topk")
}
FAMILY = Family(
    name="moe",
    captured=CAPTURED,
    tables=(FMOE,),
    caller=caller,
    variants=variants,
    serving=serving,
    segment_by=padded_tokens,
)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.moe"], argv)


if __name__ == "__main__":
    sys.exit(run())
