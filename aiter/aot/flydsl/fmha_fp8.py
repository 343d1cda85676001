"""AOT replay of the fp8 attention shapes: each row becomes calls of `flash_attn_fp8` with
FakeTensors at the points of (batch, query length, key length) that decide its kernels, for
each return_lse choice; each point is probed once.

Why those points decide every call inside a row's ranges. Each compile-time choice of the
launcher is a function of one axis (fmha_plan.ONE_AXIS: query block and the split gate by query
length, rescale threshold and the split gate by key length) or the split predicate P (whether KV
splits are used), which never turns on as batch or query length grow and, beyond the key
length's split gate, does not depend on the key length (kv_splits: the work-groups and the
workspace follow batch x query length). Cut each sequence axis into the maximal runs over which
its one-axis functions are constant (found by asking them); in a region, one query run times
one key run, every one-axis choice is fixed, so a call's kernels are those of P's value there.
P is largest at (batch 1, the run's fewest queries, its most keys) and smallest at (the fewest
batches P is false at with the run's most queries and fewest keys, found by asking kv_splits;
the row's largest batch if P holds throughout): so every value P takes in the region it takes
at one of those two points, and they are all the region needs. `--check --sample N` audits the
claim at random points of every region.

A caller may force the split count (`num_kv_splits`): each row is also replayed with 1 and with 2
splits (the count is a runtime argument, whether it splits is compiled), one point per region at
batch 1, since a forced count leaves batch and P out of every choice.

Run `python -m aiter.aot.flydsl.fmha_fp8 [--list | --check]` (or `python -m aiter.aot.flydsl`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiter.aot.flydsl.jobs.axes import Along, along_dims, tensor, with_host_values, with_sizes
from aiter.aot.flydsl.jobs.family import Call, CapturedOp, Family
from aiter.ops.fmha_fp8.table import FMHA_FP8
from aiter.tuning import Row, TableSpec

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


@functools.cache
def runs(axis: str, top: int) -> list[tuple[int, int]]:
    """The maximal runs of 1..top over which every one-axis function of `axis` is constant."""
    from aiter.ops.fmha_fp8.plan import ONE_AXIS

    functions = ONE_AXIS.get(axis, ())
    found, start = [], 1
    previous = [f(1) for f in functions]
    for length in range(2, top + 1):
        current = [f(length) for f in functions]
        if current != previous:
            found.append((start, length - 1))
            start = length
        previous = current
    return [*found, (start, top)]


def fewest_unsplit_batches(row: Row, seqlen_q: int, seqlen_k: int) -> int | None:
    """The smallest batch (up to the row's) at which the plan does not split, by bisection:
    splitting never turns on as batch grows. None when it splits up to the row's batch."""
    from aiter.ops.fmha_fp8.plan import kv_splits

    heads, head_dim_v, cu_num = row.int("num_heads"), row.int("head_dim_v"), row.int("cu_num")

    def splits(batch: int) -> bool:
        rows = batch * seqlen_q  # what the entry counts, dense and varlen alike
        return kv_splits(batch, heads, seqlen_q, seqlen_k, rows, head_dim_v, cu_num) > 1

    lo, hi = 1, row.int("max_batch")
    if splits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if splits(mid) else (lo, mid)
    return lo


def points(
    spec: TableSpec, row: Row, variant: Mapping[str, str], maxima: Mapping[str, int]
) -> list[tuple[dict[str, int], dict[str, list[int]]]]:
    """The points that decide a row's kernels (see the module's docstring), each region's first
    point with the region as its cell; with a forced split count one point per region."""
    top = min(row.int("max_seqlen"), maxima.get(spec.axis.name, spec.axis.default_max))
    most_batches = row.int("max_batch")
    found: list[tuple[dict[str, int], dict[str, list[int]]]] = []
    for q_lo, q_hi in runs("seqlen_q", top):
        for k_lo, k_hi in runs("seqlen_k", top):
            cell = {"batch": [1, most_batches], "seqlen_q": [q_lo, q_hi], "seqlen_k": [k_lo, k_hi]}
            if variant["kv_splits"] != PLANNED:
                found.append(({"batch": 1, "seqlen_q": q_lo, "seqlen_k": k_lo}, cell))
                continue
            largest = {"batch": 1, "seqlen_q": q_lo, "seqlen_k": k_hi}
            batch = fewest_unsplit_batches(row, q_hi, k_lo) or most_batches
            smallest = {"batch": batch, "seqlen_q": q_hi, "seqlen_k": k_lo}
            found.append((largest, cell))
            if smallest != largest:
                found.append((smallest, {}))
    return found


def variants(spec: TableSpec, row: Row) -> list[dict[str, str]]:
    """The spec's caller variants, each with the split count the plan chooses and with the
    counts a caller may force (`num_kv_splits`): 1, and 2 for every count above 1 (the count is
    a runtime argument; only whether it splits is compiled)."""
    return [v | {"kv_splits": s} for v in spec.variants() for s in KV_SPLITS]


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
    points=points,
)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.fmha_fp8"], argv)


if __name__ == "__main__":
    sys.exit(run())
