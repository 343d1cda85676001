"""The chunk_gdn_h launcher's compile-time choice, the V-tile width BV: a tuned row's when one
serves the call (table.py), else the grid-fill rule, a function of the number of sequences,
heads, V and the CU count.

The pass is a serial walk over chunks per work-group, so its time is the chunks of one
work-group times their cost, times how many rounds of work-groups the GPU needs. A wider V tile
costs less per value column (k and w are read once per tile), a narrower one makes more
work-groups: the grid-fill rule takes the widest BV whose grid still gives every CU a
work-group, and the narrowest when none does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiter import dispatch
from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import BLOCK_VS, grid_size
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from aiter.tuning import Row

if TYPE_CHECKING:
    from aiter.ops.chunk_gdn_h.arguments import ChunkHCall

OP = "chunk_gated_delta_rule_fwd_h"


def legal_block_vs(head_dim_v: int) -> tuple[int, ...]:
    """The widths a V of head_dim_v can use: those dividing V (the kernel has no partial V
    tile; V is a multiple of the narrowest)."""
    return tuple(b for b in BLOCK_VS if head_dim_v % b == 0)


GRID_FILL = 1  # work-groups per CU the rule asks of a wider V tile


def grid_fill_block_v(num_seqs: int, heads: int, head_dim_v: int, cu_num: int) -> int:
    """The widest legal BV with num_seqs * heads * V / BV >= GRID_FILL * cu_num, else the
    narrowest (the grid is then as large as the kernel can make it)."""
    legal = legal_block_vs(head_dim_v)
    for block_v in reversed(legal):
        if grid_size(num_seqs, heads, head_dim_v, block_v) >= GRID_FILL * cu_num:
            return block_v
    return legal[0]


def block_v_switch_points(heads: int, head_dim_v: int, cu_num: int) -> list[int]:
    """The sequence counts at which grid_fill_block_v changes, ascending: the smallest N whose
    grid at each wider BV reaches GRID_FILL * cu_num. The AOT grid puts these on the N axis."""
    points = []
    for block_v in legal_block_vs(head_dim_v)[1:]:
        per_seq = grid_size(1, heads, head_dim_v, block_v)
        point = -(-(GRID_FILL * cu_num) // per_seq)
        if point > 1:
            points.append(point)
    return sorted(set(points))


KERNELS = "flydsl_chunk_gdn_h"


@dataclass(frozen=True)
class BlockVChoice:
    block_v: int
    row: Row | None  # the tuned row that chose it; None: the grid-fill rule
    mma: str = "mfma"
    head_dim: int = 128

    @property
    def name(self) -> str:
        return f"{KERNELS}_{self.mma}_k{self.head_dim}_bv{self.block_v}"

    def report(self, args: Callable[[], dict[str, str]], axis: dict[str, int],
               table_row: Callable[[], dict[str, str]] | None = None,
               **params: object) -> None:  # fmt: skip
        """Tell aiter.dispatch how the call is served (the record built only when someone
        listens); `table_row` gives the cells of a row that would serve an untuned call."""
        dispatch.report(
            lambda: dispatch.DispatchRecord(
                OP,
                dispatch.BACKEND_FLYDSL,
                self.name,
                "table" if self.row is not None else "heuristic",
                f"{self.row.source}:{self.row.line}" if self.row is not None else None,
                {"block_v": self.block_v, **params},
                args=args(),
                table=CHUNK_GDN_H.short_name,
                table_row=table_row() if table_row is not None and self.row is None else None,
                axis=axis,
            )
        )


def describe(choice: BlockVChoice) -> str:
    return choice.name


def equivalent_choices(choice: BlockVChoice, head_dim_v: int) -> list[BlockVChoice]:
    """The other legal V-tile widths, widest first: each computes every output element with
    the same arithmetic (a V tile only groups value columns), so any serves the call."""
    return [
        dataclasses.replace(choice, block_v=b)
        for b in reversed(legal_block_vs(head_dim_v))
        if b != choice.block_v
    ]


def table_key(call: ChunkHCall, gfx: str, cu_num: int) -> dict[str, object]:
    """The call's cells in the table's key columns (T_flat, the axis, aside)."""
    return {
        "gfx": gfx,
        "cu_num": cu_num,
        "dtype": str(call.dtype),
        "K": call.head_dim,
        "V": call.head_dim_v,
        "BT": call.chunk_size,
        "H": call.heads,
        "Hg": call.key_heads,
        "is_varlen": int(call.varlen),
        "use_g": int(call.use_g),
        "use_gk": int(call.use_gk),
        "use_h0": int(call.use_h0),
        "store_fs": int(call.store_final_state),
        "save_vn": int(call.save_new_value),
        "N": call.num_seqs,
    }


def total_tokens(call: ChunkHCall) -> int:
    return call.batch * call.seqlen


def row_as_served(call: ChunkHCall, choice: BlockVChoice, gfx: str, cu_num: int) -> dict[str, str]:
    """The cells of a tuned row that would serve `call` with `choice`'s BV: its layer, its N
    and its tokens as T_flat (what `capture suggest` prints)."""
    cells = {name: str(value) for name, value in table_key(call, gfx, cu_num).items()}
    cells.update(T_flat=str(total_tokens(call)), BV=str(choice.block_v), us="")
    return cells


def choose_block_v(call: ChunkHCall, gfx: str, cu_num: int, mma: str = "mfma") -> BlockVChoice:
    """The tuned row's BV when a row serves the call's layer, sequences and tokens, else the
    grid-fill rule's."""
    row = CHUNK_GDN_H.lookup(table_key(call, gfx, cu_num), total_tokens(call))
    if row is not None:
        return BlockVChoice(row.int("BV"), row, mma, call.head_dim)
    block_v = grid_fill_block_v(call.num_seqs, call.heads, call.head_dim_v, cu_num)
    return BlockVChoice(block_v, None, mma, call.head_dim)
