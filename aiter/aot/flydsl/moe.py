"""AOT replay of the fused-MoE table: each shape's token range, cut where the runtime's own padded
token count changes, becomes calls of `fused_moe` with FakeTensors for every caller variant.

Run `python -m aiter.aot.flydsl.moe [--list | --check]` (or `python -m aiter.aot.flydsl` for all).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from aiter.aot.flydsl.jobs import Call, Family, Job
from aiter.aot.flydsl.protocol import JobInfo
from aiter.ops.moe.table import ACT_SWIGLU, FMOE, QUANT_PER_TOKEN, SWIGLU_VARIANTS
from aiter.tuning import Row
from aiter.tuning.spec import describe_variant

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


def _variants(row: Row) -> list[dict[str, str]]:
    """The spec's caller variants, and for swiglu rows with and without expert biases."""
    base = FMOE.variants()
    if row["act_type"] != ACT_SWIGLU:
        return base
    return [v | {"bias": b} for v in base for b in SWIGLU_VARIANTS["bias"]]


def caller(row: Row, variant: Mapping[str, str]) -> Call:
    """fused_moe as a caller of this row's layer calls it, at a given token count."""
    from aiter.ops.moe.entry import fused_moe

    model_dim, inter = row.int("model_dim"), row.int("inter_dim")
    experts, topk = row.int("expert"), row.int("topk")
    quantized = row["q_type"] == QUANT_PER_TOKEN
    masked = variant["experts"] == "masked"
    local = max(1, experts // EP_DEGREE) if masked else experts
    with_bias = variant.get("bias") == "both"

    def call(tokens: int) -> None:
        import torch

        act_dtype, w_dtype = _dtype(row["dtype"]), _dtype(row["q_dtype_w"])
        kwargs = {}
        if quantized:
            kwargs["w1_scale"] = _empty((local, 2 * inter, 1), torch.float32)
            kwargs["w2_scale"] = _empty((local, model_dim, 1), torch.float32)
        if with_bias:
            kwargs["bias1"] = _empty((local, 2 * inter), torch.float32)
            kwargs["bias2"] = _empty((local, model_dim), torch.float32)
        if masked:
            kwargs["expert_mask"] = _empty((experts,), torch.int32)
        if variant["local_tokens"] == "given":
            kwargs["num_local_tokens"] = _empty((1,), torch.int32)
        fused_moe(
            _empty((tokens, model_dim), act_dtype),
            _empty((local, 2 * inter, model_dim), w_dtype),  # preshuffled keeps the shape
            _empty((local, model_dim, inter), w_dtype),
            _empty((tokens, topk), torch.float32),
            _empty((tokens, topk), torch.int32),
            activation=ACTIVATIONS[row["act_type"]],
            quant_type="per_token" if quantized else None,
            gate_mode=variant["gate_mode"],
            doweight_stage1=row.int("doweight_stage1") == 1,
            **kwargs,
        )

    return call


def token_segments(top: int) -> list[tuple[int, int, int]]:
    """(lo, hi, padded): the runs of 1..top over which the runtime's get_padded_M is constant."""
    from aiter.ops.moe.host_planner import get_padded_M

    segments = []
    lo = 1
    while lo <= top:
        padded = get_padded_M(lo)
        # get_padded_M never decreases: bisect for the last token count with the same value.
        hi, step_hi = lo, top
        while hi < step_hi:
            mid = (hi + step_hi + 1) // 2
            if get_padded_M(mid) == padded:
                hi = mid
            else:
                step_hi = mid - 1
        segments.append((lo, hi, padded))
        lo = hi + 1
    return segments


def _shape_key(row: Row) -> tuple[str, ...]:
    return tuple(row[name] for name in FMOE.key if name != FMOE.axis.column)


def make_jobs(
    family: Family, arch: str, cu_nums: frozenset[int] | None, maxima: Mapping[str, int]
) -> list[Job]:
    """For each shape of `arch`, one job per padded-token run from 1 to the deployment's maximum
    and caller variant; the run is attributed to the row the runtime's lookup picks there (or,
    where no row serves, to the shape's nearest row: the planner serves it)."""
    from aiter.ops.moe.plan import tuned_row

    table = FMOE.load()
    top = maxima.get(FMOE.axis.name, FMOE.axis.default_max)
    shapes: dict[tuple[str, ...], list[Row]] = {}
    for row in table.rows:
        if row["gfx"] == arch and (cu_nums is None or row.int("cu_num") in cu_nums):
            shapes.setdefault(_shape_key(row), []).append(row)
    segments = token_segments(top)
    jobs = []
    for rows in shapes.values():
        rows.sort(key=lambda r: r.int("token"))
        key = {name: rows[0][name] for name in FMOE.key if name != FMOE.axis.column}
        for lo, hi, _padded in segments:
            _, served = tuned_row(key, lo)
            row = served or min(rows, key=lambda r: abs(r.int("token") - lo))
            tabled = row.int("token") if served is not None else None
            for variant in _variants(row):
                info = JobInfo(
                    module=family.module,
                    table=FMOE.name,
                    row=f"{row.source}:{row.line}",
                    arch=arch,
                    cu_num=row.int("cu_num"),
                    variant=describe_variant(variant),
                    axis=FMOE.axis.name,
                    lo=lo,
                    hi=hi,
                    tabled=tabled if tabled is not None and lo <= tabled <= hi else None,
                )
                jobs.append(Job(info, caller(row, variant)))
    return jobs


FAMILY = Family(module="moe", tables=(FMOE,), make_jobs=make_jobs)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.moe"], argv)


if __name__ == "__main__":
    sys.exit(run())
