"""The chunk_gdn_h launcher's compile-time choice without a tuned row: the V-tile width BV, a
function of the batch shape (sequences), heads, V and the CU count.

The pass is a serial walk over chunks per work-group, so its time is the chunks of one
work-group times their cost, times how many rounds of work-groups the GPU needs. A wider V tile
costs less per value column (k and w are read once per tile), a narrower one makes more
work-groups: the grid-fill rule takes the widest BV whose grid still gives every CU a
work-group, and the narrowest when none does.
"""

from __future__ import annotations

from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import grid_size

BLOCK_VS = (16, 32, 64)  # the V-tile widths the kernel is compiled for
CHUNK_SIZES = (64,)  # the chunk length BT the kernel walks in


def legal_block_vs(head_dim_v: int) -> tuple[int, ...]:
    """The widths a V of head_dim_v can use: a tile no wider than V."""
    return tuple(b for b in BLOCK_VS if b <= head_dim_v) or BLOCK_VS[:1]


def grid_fill_block_v(num_seqs: int, heads: int, head_dim_v: int, cu_num: int) -> int:
    """The widest legal BV with num_seqs * heads * ceil(V / BV) >= cu_num, else the narrowest
    (the grid is then as large as the kernel can make it)."""
    legal = legal_block_vs(head_dim_v)
    for block_v in reversed(legal):
        if grid_size(num_seqs, heads, head_dim_v, block_v) >= cu_num:
            return block_v
    return legal[0]


def block_v_switch_points(heads: int, head_dim_v: int, cu_num: int) -> list[int]:
    """The sequence counts at which grid_fill_block_v changes, ascending: the smallest N whose
    grid at each wider BV reaches cu_num. The AOT grid puts these on the N axis."""
    points = []
    for block_v in legal_block_vs(head_dim_v)[1:]:
        per_seq = grid_size(1, heads, head_dim_v, block_v)
        point = -(-cu_num // per_seq)
        if point > 1:
            points.append(point)
    return sorted(set(points))
