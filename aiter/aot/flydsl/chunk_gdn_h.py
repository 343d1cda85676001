"""AOT replay of the chunk_gdn_h table: each layer of the table becomes calls of
`chunk_gated_delta_rule_fwd_h` with FakeTensors at the batch shapes that decide its kernels, for
every number of sequences N and every total token count up to the deployment's maximum tokens
(`--max-tokens`, 32768 unless set; N sequences hold at least N tokens); each is probed once.

Why those shapes decide every batch shape: the kernel's one compile-time choice that varies with
the batch shape is BV, and it is the tuned row's where a row of the layer has the call's N and a
T_flat bucket holding its tokens, else the grid-fill rule's, a function of N alone
(chunk_gdn_h.plan). So the sequence counts split into runs: each tabled N alone, and between and
above them the maximal runs over which the rule is constant (its switches asked of
plan.block_v_switch_points). Over an untabled run BV is the rule's one value: one shape stands
for the run. At a tabled N the tokens split into the layer's buckets of that N (each row's job)
and the run above its largest T_flat up to the deployment's maximum (the rule's): one shape per
bucket whose total a call can reach (a dense batch holds N x its length tokens). The layer's
first row carries the runs no row serves. `--check --sample N` audits the claim at random points
of every run.

Run `python -m aiter.aot.flydsl.chunk_gdn_h [--list | --check]` (or `python -m aiter.aot.flydsl`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiter.aot.flydsl.jobs.axes import Along, along_dims, tensor, with_host_values, with_sizes
from aiter.aot.flydsl.jobs.family import Call, CapturedOp, Family
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H, LAYER_COLUMNS
from aiter.tuning import Row, TableSpec


def _flag(row: Row, name: str) -> bool:
    return row.flag(name)


def caller(spec: TableSpec, row: Row, variant: Mapping[str, str]) -> Call:
    """chunk_gated_delta_rule_fwd_h as a caller of this row's layer calls it, at N sequences
    and about `tokens` tokens (a dense batch: N sequences of tokens // N, at least 1)."""
    from aiter.ops.chunk_gdn_h.entry import chunk_gated_delta_rule_fwd_h

    heads, key_heads = row.int("H"), row.int("Hg")
    head_dim, head_dim_v = row.int("K"), row.int("V")
    varlen = _flag(row, "is_varlen")

    def call(seqs: int, tokens: int) -> None:
        import torch

        from aiter.aot.flydsl.dry_run import host_tensor

        dtype = getattr(torch, row["dtype"].removeprefix("torch."))

        def empty(*shape, dtype=dtype):
            return torch.empty(shape, dtype=dtype, device="cuda")

        cu_seqlens = None
        if varlen:
            batch, seqlen = 1, tokens
            # The lengths do not enter any choice: the tokens split as evenly as they go.
            bounds = [tokens * i // seqs for i in range(seqs + 1)]
            cu_seqlens = host_tensor(bounds, torch.int32)
        else:
            batch, seqlen = seqs, max(1, tokens // seqs)
        chunk_gated_delta_rule_fwd_h(
            empty(batch, seqlen, key_heads, head_dim),
            empty(batch, seqlen, heads, head_dim),
            empty(batch, seqlen, heads, head_dim_v),
            g=empty(batch, seqlen, heads, dtype=torch.float32) if _flag(row, "use_g") else None,
            gk=(empty(batch, seqlen, heads, head_dim, dtype=torch.float32)
                if _flag(row, "use_gk") else None),
            initial_state=(empty(seqs, heads, head_dim, head_dim_v, dtype=torch.float32)
                           if _flag(row, "use_h0") else None),
            output_final_state=_flag(row, "store_fs"),
            chunk_size=row.int("BT"),
            save_new_value=_flag(row, "save_vn"),
            cu_seqlens=cu_seqlens,
        )  # fmt: skip

    return call


def _layer_rows(spec: TableSpec, row: Row) -> list[Row]:
    return [r for r in spec.load().rows if all(r[c] == row[c] for c in LAYER_COLUMNS)]


def seqs_runs(row: Row, tabled: Sequence[int], top: int) -> list[tuple[int, int]]:
    """1..top sequences of the row's layer cut into runs: each tabled N alone, and the runs
    between over which the grid-fill rule is constant."""
    from aiter.ops.chunk_gdn_h.plan import block_v_switch_points

    starts = {1, *block_v_switch_points(row.int("H"), row.int("V"), row.int("cu_num"))}
    for n in tabled:
        starts.update((n, n + 1))
    starts = sorted(s for s in starts if 1 <= s <= top)
    return [(a, b - 1) for a, b in zip(starts, [*starts[1:], top + 1], strict=True)]


def reachable_total(row: Row, seqs: int, lo: int, hi: int) -> int | None:
    """A total of tokens in lo..hi a call of `seqs` sequences can have (varlen: any; dense: a
    multiple of `seqs`), the largest; None when none can."""
    if _flag(row, "is_varlen"):
        return hi
    total = seqs * (hi // seqs)
    return total if total >= max(lo, seqs) else None


def points(
    spec: TableSpec, row: Row, variant: Mapping[str, str], maxima: Mapping[str, int]
) -> list[tuple[dict[str, int], dict[str, list[int]]]]:
    """The batch shapes that decide a layer's kernels (see the module's docstring), each with the
    run of shapes it stands for as its cell. A row stands for its own bucket (its N, the tokens
    above the previous row of that N up to its T_flat); the layer's first row also for every
    shape no row serves, up to the deployment's maximum tokens (N sequences hold at least N)."""
    top = maxima.get(spec.axis.name, spec.axis.default_max)
    layer = _layer_rows(spec, row)
    buckets: dict[int, list[int]] = {}
    for other in layer:
        buckets.setdefault(other.int("N"), []).append(other.int("T_flat"))
    seqs, tokens = row.int("N"), row.int("T_flat")
    found = []
    below = max((t for t in buckets[seqs] if t < tokens), default=0)
    total = reachable_total(row, seqs, below + 1, min(tokens, top)) if below < top else None
    if total is not None:
        cell = {"seqs": [seqs, seqs], "tokens": [below + 1, min(tokens, top)]}
        found.append(({"seqs": seqs, "tokens": total}, cell))
    first = min((r.int("N"), r.int("T_flat")) for r in layer)
    if (seqs, tokens) != first:
        return found
    for a, b in seqs_runs(row, sorted(buckets), top):
        if a != b or a not in buckets:
            total = reachable_total(row, a, 1, top) or a  # any shape: BV is the rule's
            found.append(({"seqs": a, "tokens": total}, {"seqs": [a, b], "tokens": [1, top]}))
            continue
        above = max(buckets[a]) + 1
        total = reachable_total(row, a, above, top) if above <= top else None
        if total is not None:
            found.append(({"seqs": a, "tokens": total}, {"seqs": [a, a], "tokens": [above, top]}))
    return found


# The batch shape enters the choice through N and the tokens together (and a varlen batch's
# through cu_seqlens' values): a captured call is replayed as it was made.
# The arguments that hold the tokens, in dimension 1 ([B, T, ...]).
_PER_TOKEN = {name: 1 for name in ("k", "w", "u", "g", "gk")}


def tokens_along(arguments: Mapping[str, Any]) -> Along | None:
    """A dense batch of B sequences moves along their length T, up to `--max-tokens` / B; a
    varlen batch (B = 1) along its total tokens, cu_seqlens's bounds scaled with it (the same N
    sequences, none decreasing). The kernels depend on N and the tokens alone (plan.py)."""
    k, cu_seqlens = tensor(arguments, "k"), tensor(arguments, "cu_seqlens")
    if k is None:
        return None
    if cu_seqlens is None:
        batch = max(1, int(k["shape"][0]))
        return along_dims(arguments, "seqlen", _PER_TOKEN, top=lambda most: max(1, most // batch))
    bounds = cu_seqlens.get("values")
    if not bounds or bounds[-1] < 1:
        return None  # no lengths to move (the entry rejects such a call: its job says why)
    total = bounds[-1]

    def at(tokens: int) -> dict[str, Any]:
        moved = with_sizes(arguments, _PER_TOKEN, tokens)
        return with_host_values(moved, "cu_seqlens", [b * tokens // total for b in bounds])

    return Along("tokens", total, at)


CAPTURED = {
    "chunk_gated_delta_rule_fwd_h": CapturedOp(
        "aiter.ops.chunk_gdn_h.entry:chunk_gated_delta_rule_fwd_h", tokens_along
    )
}
FAMILY = Family(
    name="chunk_gdn_h", tables=(CHUNK_GDN_H,), caller=caller, points=points, captured=CAPTURED
)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.chunk_gdn_h"], argv)


if __name__ == "__main__":
    sys.exit(run())
