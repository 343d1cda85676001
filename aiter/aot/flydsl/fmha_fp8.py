"""AOT replay of the fp8 attention shapes: each row becomes calls of `flash_attn_fp8` with
FakeTensors over a grid of batch sizes, query lengths and key lengths up to the row's maxima, for
each return_lse choice, with bisection along every grid edge.

Why every point inside the ranges is served, not only grid points: each compile-time choice of
the launcher is either a function of one axis (fmha_plan.ONE_AXIS: query block and the split
gate by query length, rescale threshold and the split gate by key length) or a predicate that
never turns on as batch or query length grow (whether KV splits are used). The grid holds every
switch point of the one-axis functions (both sides), found by asking those functions, so inside a
grid cell they are constant; the monotone predicate then takes inside a cell only values it takes
at the cell's corners; every corner is probed; so every point of a cell needs the kernels of one
of its corners. `--check --sample N` audits that claim at random points of every cell.

A caller may force the split count (`num_kv_splits`): each row is also replayed with 1 and with 2
splits (the count is a runtime argument, whether it splits is compiled), over the grid's query
and key lengths at one batch size, since a forced count leaves batch out of every choice.

Run `python -m aiter.aot.flydsl.fmha_fp8 [--list | --check]` (or `python -m aiter.aot.flydsl`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiter.aot.flydsl.capture_axis import Along, along_dims, tensor, with_host_values, with_sizes
from aiter.aot.flydsl.jobs import Call, CapturedOp, Family
from aiter.ops.fmha_fp8.table import FMHA_FP8
from aiter.tuning import Row, TableSpec

SEQLEN_GRID_BASE = 4  # grid sequence lengths at powers of 4 (and the switch points)
PLANNED = "planned"  # the split count the launcher's plan chooses
KV_SPLITS = (PLANNED, "1", "2")


def caller(spec: TableSpec, row: Row, variant: Mapping[str, str]) -> Call:
    """flash_attn_fp8 as a caller of this row's heads calls it, at (batch, query len, key len)."""
    from aiter.ops.fmha_fp8.entry import flash_attn_fp8

    hq, hkv = row.int("num_heads"), row.int("num_kv_heads")
    d, dv = row.int("head_dim"), row.int("head_dim_v")
    varlen = row["layout"] == "varlen"
    causal = row["causal"].strip().lower() in ("1", "true", "1.0")
    return_lse = variant["return_lse"] == "true"
    splits = variant.get("kv_splits", PLANNED)
    num_kv_splits = None if splits == PLANNED else int(splits)

    def call(batch: int, seqlen_q: int, seqlen_k: int) -> None:
        import torch

        from aiter import device

        fp8 = device.fp8_dtype()

        def empty(shape, dtype=fp8):
            return torch.empty(shape, dtype=dtype, device="cuda")

        descales = {n: empty((1,), torch.float32) for n in ("q_descale", "k_descale", "v_descale")}
        if varlen:
            flash_attn_fp8(
                empty((batch * seqlen_q, hq, d)),
                empty((batch * seqlen_k, hkv, d)),
                empty((batch * seqlen_k, hkv, dv)),
                causal=causal,
                cu_seqlens_q=empty((batch + 1,), torch.int32),
                cu_seqlens_kv=empty((batch + 1,), torch.int32),
                max_seqlen_q=seqlen_q,
                max_seqlen_kv=seqlen_k,
                num_kv_splits=num_kv_splits,
                return_lse=return_lse,
                **descales,
            )
        else:
            flash_attn_fp8(
                empty((batch, seqlen_q, hq, d)),
                empty((batch, seqlen_k, hkv, d)),
                empty((batch, seqlen_k, hkv, dv)),
                causal=causal,
                num_kv_splits=num_kv_splits,
                return_lse=return_lse,
                **descales,
            )

    return call


def axis_points(axis: str, top: int) -> list[int]:
    """Grid values of a sequence axis: powers of SEQLEN_GRID_BASE up to `top`, `top`, and both
    sides of every switch of the launcher's one-axis functions of this axis."""
    from aiter.ops.fmha_fp8.plan import ONE_AXIS

    points = {1, top}
    value = 1
    while value < top:
        points.add(value)
        value *= SEQLEN_GRID_BASE
    functions = ONE_AXIS.get(axis, ())
    previous = [f(1) for f in functions]
    for length in range(2, top + 1):
        current = [f(length) for f in functions]
        if current != previous:
            points.update((length - 1, length))
        previous = current
    return sorted(points)


def batch_points(top: int) -> list[int]:
    points, value = {1, top}, 1
    while value < top:
        points.add(value)
        value *= 2
    return sorted(points)


def grid(spec: TableSpec, row: Row, maxima: Mapping[str, int]) -> dict[str, list[int]]:
    """A row's grid: batch sizes up to its max_batch, both sequence lengths up to its max_seqlen
    (cut at the deployment's maximum)."""
    top = min(row.int("max_seqlen"), maxima.get(spec.axis.name, spec.axis.default_max))
    return {
        "batch": batch_points(row.int("max_batch")),
        "seqlen_q": axis_points("seqlen_q", top),
        "seqlen_k": axis_points("seqlen_k", top),
    }


def variants(spec: TableSpec, row: Row) -> list[dict[str, str]]:
    """The spec's caller variants, each with the split count the plan chooses and with the
    counts a caller may force (`num_kv_splits`): 1, and 2 for every count above 1 (the count is
    a runtime argument; only whether it splits is compiled)."""
    return [v | {"kv_splits": s} for v in spec.variants() for s in KV_SPLITS]


def variant_grid(
    variant: Mapping[str, str], grid: Mapping[str, Sequence[int]]
) -> Mapping[str, Sequence[int]]:
    """With a forced split count the batch size enters no choice (only the plan's split
    decision, and the batch interleave, a runtime flag): one batch size is replayed."""
    if variant["kv_splits"] == PLANNED:
        return grid
    return {**grid, "batch": [1]}


def key_length_along(arguments: Mapping[str, Any]) -> Along | None:
    """The key length: dimension 1 of k and v in the batch layout. In the varlen layout it is
    max_seqlen_kv, which with the batch and max_seqlen_q is all the plan reads of the lengths;
    moved to L, the batch holds one sequence of L keys and the others of one key each (k's and
    v's rows, and cu_seqlens_kv's values where it was recorded by value), a ragged batch whose
    longest key sequence is L."""
    cu_seqlens = tensor(arguments, "cu_seqlens_kv")
    if cu_seqlens is None:
        return along_dims(arguments, "seqlen_k", {"k": 1, "v": 1})
    longest = arguments.get("max_seqlen_kv")
    if not isinstance(longest, int) or isinstance(longest, bool):
        return None  # the entry rejects the call: its job says why
    batch = max(1, int(cu_seqlens["shape"][0]) - 1)

    def at(length: int) -> dict[str, Any]:
        moved = with_sizes(arguments, {"k": 0, "v": 0}, length + batch - 1)
        bounds = [0, *range(length, length + batch)]
        return with_host_values(moved, "cu_seqlens_kv", bounds) | {"max_seqlen_kv": length}

    return Along("seqlen_k", longest, at)


CAPTURED = {
    "flash_attn_fp8": CapturedOp("aiter.ops.fmha_fp8.entry:flash_attn_fp8", key_length_along)
}
FAMILY = Family(
    name="fmha_fp8",
    captured=CAPTURED,
    tables=(FMHA_FP8,),
    caller=caller,
    variants=variants,
    grid=grid,
    variant_grid=variant_grid,
)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.fmha_fp8"], argv)


if __name__ == "__main__":
    sys.exit(run())
