"""AOT replay of the chunk_gdn_h table: each row becomes calls of
`chunk_gated_delta_rule_fwd_h` with FakeTensors over a grid of batch shapes (sequences N up
to the row's, total tokens up to the row's T_flat, cut at the deployment's maximum), with
bisection along every grid edge.

Why every batch shape inside a row's ranges is served, not only grid points: the kernel's one
compile-time choice that varies with the batch shape is BV, and it is the tuned row's where a
row of the layer has the call's N and a T_flat bucket holding its tokens, else the grid-fill
rule's, a function of N alone (chunk_gdn_h.plan). The grid holds both sides of every switch of
the rule (asked of the rule: plan.block_v_switch_points), every tabled N with its neighbours,
and both sides of every tabled T_flat of the layer; so inside a grid cell a point either shares
a tabled corner's N and bucket, or has an untabled N between two switch-free grid values, and
needs the kernels of one of the cell's corners. Every corner is probed; `--check --sample N`
audits the claim at random points of every cell.

Run `python -m aiter.aot.flydsl.chunk_gdn_h [--list | --check]` (or `python -m aiter.aot.flydsl`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiter.aot.flydsl.capture_axis import Along, along_dims, tensor, with_host_values, with_sizes
from aiter.aot.flydsl.jobs import Call, CapturedOp, Family
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H, LAYER_COLUMNS
from aiter.tuning import Row, TableSpec

GRID_BASE = 4  # grid token counts at powers of 4 (besides the switch points)


def _flag(row: Row, name: str) -> bool:
    return row.int(name) == 1


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


def _powers(top: int, base: int) -> set[int]:
    points, value = {1, top}, 1
    while value < top:
        points.add(value)
        value *= base
    return points


def _layer_rows(spec: TableSpec, row: Row) -> list[Row]:
    return [r for r in spec.load().rows if all(r[c] == row[c] for c in LAYER_COLUMNS)]


def seqs_points(spec: TableSpec, row: Row) -> list[int]:
    """N up to the row's: powers of 2, both sides of every switch of the grid-fill rule, and
    every tabled N of the layer with its neighbours."""
    from aiter.ops.chunk_gdn_h.plan import block_v_switch_points

    top = row.int("N")
    points = _powers(top, 2)
    for switch in block_v_switch_points(row.int("H"), row.int("V"), row.int("cu_num")):
        points.update((switch - 1, switch))
    for other in _layer_rows(spec, row):
        n = other.int("N")
        points.update((n - 1, n, n + 1))
    return sorted(p for p in points if 1 <= p <= top)


def tokens_points(spec: TableSpec, row: Row, top: int) -> list[int]:
    """Total tokens up to `top`: powers of GRID_BASE and both sides of every tabled T_flat of
    the layer (where a row's bucket starts and ends)."""
    points = _powers(top, GRID_BASE)
    for other in _layer_rows(spec, row):
        t = other.int("T_flat")
        points.update((t, t + 1))
    return sorted(p for p in points if 1 <= p <= top)


def grid(spec: TableSpec, row: Row, maxima: Mapping[str, int]) -> dict[str, list[int]]:
    """A row's grid: sequences up to its N, tokens up to its T_flat (cut at the deployment's
    maximum)."""
    top = min(row.int("T_flat"), maxima.get(spec.axis.name, spec.axis.default_max))
    return {"seqs": seqs_points(spec, row), "tokens": tokens_points(spec, row, top)}


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
    name="chunk_gdn_h", tables=(CHUNK_GDN_H,), caller=caller, grid=grid, captured=CAPTURED
)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.chunk_gdn_h"], argv)


if __name__ == "__main__":
    sys.exit(run())
