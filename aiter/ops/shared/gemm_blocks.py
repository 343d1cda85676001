"""Building blocks shared by the a16w16 and a8w8 FlyDSL GEMM kernels: operand loads, the k-block
MMA loop, accumulators, where a lane's accumulators live in C, and the launchers' common checks.
"""

from __future__ import annotations

from typing import Any

import flydsl.expr as fx
from flydsl.expr import range_constexpr

from aiter.ops.shared.gemm_index import (
    WAVE_SIZE,
    acc_rows_per_lane,
    block_origin,
    c_coord,
    mma_repeats,
    operand_row,
    wave_origin,
    workspace_offset,
)

# Helpers hold no dynamic `if` or runtime loop: FlyDSL rewrites those into scf ops only inside
# the kernel function itself.


def load_run(base, offset, length: int, dtype):
    """Load `length` contiguous elements starting at base + offset as one vector."""
    return fx.ptr_load(base + offset, result_type=fx.Vector.make_type(length, dtype))


def row_loader(base, offset_fn, k, lane, wave_size: int, length: int, dtype):
    """load(row, kb): a lane's `length`-element K run of row `row` of a row-major [rows, k]
    matrix in k-block kb, at offset_fn(row, k, kb, lane, wave_size)."""
    return lambda row, kb: load_run(base, offset_fn(row, k, kb, lane, wave_size), length, dtype)


def clamp(index, bound):
    """index, or bound - 1 past the end: loads stay in bounds, the store predicate drops them."""
    return (index < bound).select(index, bound - 1)


def zero_accs(count: int, rows_per_lane: int, dtype):
    """`count` zeroed accumulators of `rows_per_lane` elements each."""
    zero = fx.Vector.filled(rows_per_lane, 0, dtype)
    return [zero for _ in range_constexpr(count)]


def k_blocks(mma_fn, load_a, load_b, a_rows, b_rows, kb0, count: int, accs):
    """Run `count` consecutive k-blocks starting at kb0 over all MMA tiles of a wave.

    load_a(row, kb) and load_b(row, kb) return a lane's K run of one A (B) row in k-block kb;
    mma_fn(a_run, b_run, acc) accumulates one k-block into a 16x16 tile. accs[i * reps_n + j]
    is the tile of A row repeat i and B row repeat j.
    """
    reps_m, reps_n = len(a_rows), len(b_rows)
    kb0 = fx.Int64(kb0)
    a_runs = []
    b_runs = []
    # Issue every load of the step before the first MMA so they overlap.
    for kb in range_constexpr(count):
        a_runs.append([load_a(a_rows[i], kb0 + kb) for i in range_constexpr(reps_m)])
        b_runs.append([load_b(b_rows[j], kb0 + kb) for j in range_constexpr(reps_n)])
    accs = list(accs)
    for kb in range_constexpr(count):
        for i in range_constexpr(reps_m):
            for j in range_constexpr(reps_n):
                t = i * reps_n + j
                accs[t] = mma_fn(a_runs[kb][i], b_runs[kb][j], accs[t])
    return accs


class Tile:
    """Where one lane's accumulator elements live in C (compile-time shape, runtime origin)."""

    def __init__(self, mma: str, tile_m: int, tile_n: int, m, n):
        self.wsz = WAVE_SIZE[mma]
        self.reps_m, self.reps_n = mma_repeats(tile_m, tile_n)
        self.rows_per_lane = acc_rows_per_lane(self.wsz)
        tid = fx.thread_idx.x
        self.tid = tid
        self.lane = tid % self.wsz
        wave = tid // self.wsz
        self.origin_m, self.origin_n = block_origin(fx.block_idx.y, fx.block_idx.x, tile_m, tile_n)
        self.wave_m, self.wave_n = wave_origin(wave, tile_m, tile_n)
        self.m = m
        self.n = n

    def operand_rows(self):
        """(clamped A rows, clamped B rows) whose K runs this lane loads, as Int64.

        Rows past M (columns past N) read the last valid row instead; their results are
        dropped by the store predicate, so the clamp only keeps loads in bounds.
        """
        a_rows = [
            fx.Int64(clamp(operand_row(self.origin_m, self.wave_m, i, self.lane), self.m))
            for i in range_constexpr(self.reps_m)
        ]
        b_rows = [
            fx.Int64(clamp(operand_row(self.origin_n, self.wave_n, j, self.lane), self.n))
            for j in range_constexpr(self.reps_n)
        ]
        return a_rows, b_rows


def coord(tile: Tile, i: int, j: int, e: int):
    """(row, column) of C held by accumulator element e of the lane in MMA tile (i, j).

    A function rather than a method: a method call inside a dynamic `if` makes FlyDSL's AST
    rewriter carry the object through the scf.if, which a plain Python object cannot be.
    """
    return c_coord(
        tile.origin_m, tile.origin_n, tile.wave_m, tile.wave_n, i, j, tile.lane, e, tile.wsz
    )


def ws_offset(tile: Tile, split, row, col):
    """Element offset of workspace[split, row, col] in the fp32 [split_k, M, N] workspace."""
    return workspace_offset(
        fx.Int64(split), fx.Int64(row), fx.Int64(col), fx.Int64(tile.m), fx.Int64(tile.n)
    )


# --- host side ---------------------------------------------------------------------------------


def to_stream(stream: Any | None) -> fx.Stream:
    """An fx.Stream from None, an fx.Stream, a raw handle or an object with `cuda_stream`."""
    return stream if isinstance(stream, fx.Stream) else fx.Stream(stream)


def check_mma(mma: str, flavours: tuple[str, ...]) -> None:
    if mma not in flavours:
        raise ValueError(f"mma: expected one of {flavours}, got {mma!r}")


def check_tile_and_split_k(tiles: dict[str, tuple[Any, ...]], tile, split_k: int, mma: str) -> None:
    """tile is one of tiles[mma] and split_k an int >= 1."""
    if tile not in tiles[mma]:
        supported = ", ".join(f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in tiles[mma])
        raise ValueError(f"tile: {tile} is not supported for mma={mma!r}; supported: {supported}")
    if not isinstance(split_k, int) or isinstance(split_k, bool) or split_k < 1:
        raise ValueError(f"split_k: expected an int >= 1, got {split_k!r}")
