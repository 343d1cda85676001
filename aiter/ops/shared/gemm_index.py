"""Index arithmetic of the a16w16 GEMM kernels: which A, B and C elements each block, wave
and lane touches, and which k-blocks each split-K slice owns.
"""

# Only +, -, *, //, %, & and comparisons appear below, so the same functions run on Python
# ints (CPU tests) and on FlyDSL Int32/Int64 values (inside the kernels). Operands are never
# negative, so floor and truncating division agree.

# M and N of one MMA instruction (v_mfma_f32_16x16x16_* and v_wmma_f32_16x16x32_*).
MMA_MN = 16
# K consumed per k-block: two 16x16x16 MFMAs or one 16x16x32 WMMA.
K_BLOCK = 32
WAVES_PER_BLOCK = 4
WAVE_SIZE = {"mfma": 64, "wmma": 32}
# Elements per thread in the split-K reduction kernel's one-element-per-thread grid.
REDUCE_BLOCK = 256


def wave_layout(tile_m: int) -> tuple[int, int]:
    """(waves along M, waves along N) of the four waves of a block."""
    waves_m = 1 if tile_m == MMA_MN else 2
    return waves_m, WAVES_PER_BLOCK // waves_m


def wave_tile(tile_m: int, tile_n: int) -> tuple[int, int]:
    """Rows and columns of C computed by one wave."""
    waves_m, waves_n = wave_layout(tile_m)
    return tile_m // waves_m, tile_n // waves_n


def mma_repeats(tile_m: int, tile_n: int) -> tuple[int, int]:
    """16x16 MMA tiles per wave along M and along N."""
    wave_m, wave_n = wave_tile(tile_m, tile_n)
    return wave_m // MMA_MN, wave_n // MMA_MN


def grid_size(m, n, tile_m: int, tile_n: int, split_k: int):
    """Launch grid (x: N tiles, y: M tiles, z: K splits)."""
    return (n + tile_n - 1) // tile_n, (m + tile_m - 1) // tile_m, split_k


def block_origin(bid_m, bid_n, tile_m: int, tile_n: int):
    """First row and first column of C owned by block (bid_m, bid_n)."""
    return bid_m * tile_m, bid_n * tile_n


def wave_origin(wave, tile_m: int, tile_n: int):
    """Row and column offsets of a wave's C tile inside its block's tile."""
    _, waves_n = wave_layout(tile_m)
    wave_m, wave_n = wave_tile(tile_m, tile_n)
    return (wave // waves_n) * wave_m, (wave % waves_n) * wave_n


def k_run(wave_size: int) -> int:
    """Contiguous K elements one lane loads per k-block (8 for wave64, 16 for wave32)."""
    return K_BLOCK * MMA_MN // wave_size


def lane_operand_row(lane):
    """Row of the 16-row A slab (or of the 16-row B slab) that a lane loads."""
    return lane % MMA_MN


def lane_k_offset(lane, wave_size: int):
    """Start of a lane's contiguous K run inside a k-block.

    The lanes sharing an operand row split the k-block into runs; A and B use the same
    split, so each MMA K slot pairs A and B elements of the same k.
    """
    return (lane // MMA_MN) * k_run(wave_size)


def operand_row(origin, wave_off, rep, lane):
    """Row of A (or of B, i.e. column of C) whose K run a lane loads for MMA repeat rep."""
    return origin + wave_off + rep * MMA_MN + lane_operand_row(lane)


def operand_offset(row, ld, kb, lane, wave_size: int):
    """Element offset into a row-major [rows, ld] matrix of a lane's K run in k-block kb."""
    return row * ld + kb * K_BLOCK + lane_k_offset(lane, wave_size)


def acc_rows_per_lane(wave_size: int) -> int:
    """Accumulator elements per lane per 16x16 tile (4 for MFMA, 8 for WMMA)."""
    return MMA_MN * MMA_MN // wave_size


def acc_row(lane, e, wave_size: int):
    """Row inside a 16x16 C tile held by accumulator element e of a lane."""
    return (lane // MMA_MN) * acc_rows_per_lane(wave_size) + e


def acc_col(lane):
    """Column inside a 16x16 C tile held by a lane."""
    return lane % MMA_MN


def c_coord(origin_m, origin_n, wave_m, wave_n, rep_m, rep_n, lane, e, wave_size: int):
    """(row, column) of C for accumulator element e of a lane in MMA tile (rep_m, rep_n)."""
    row = origin_m + wave_m + rep_m * MMA_MN + acc_row(lane, e, wave_size)
    col = origin_n + wave_n + rep_n * MMA_MN + acc_col(lane)
    return row, col


def split_k_range(split, num_k_blocks, split_k: int):
    """Half-open range of k-blocks owned by one split.

    Splits own contiguous ranges whose sizes differ by at most one; together they cover
    every k-block once. With more splits than k-blocks some ranges are empty.
    """
    return (split * num_k_blocks) // split_k, ((split + 1) * num_k_blocks) // split_k


def k_loop_counts(kb_begin, kb_end, blocks_per_iter: int):
    """(main iterations of blocks_per_iter k-blocks, first k-block of the tail loop)."""
    iters = (kb_end - kb_begin) // blocks_per_iter
    return iters, kb_begin + iters * blocks_per_iter


def in_bounds(row, col, m, n):
    """Whether C element (row, col) exists."""
    return (row < m) & (col < n)


def c_offset(row, col, n):
    """Element offset of C[row, col] in a row-major [M, N] matrix."""
    return row * n + col


def workspace_offset(split, row, col, m, n):
    """Element offset of workspace[split, row, col] in a contiguous [split_k, M, N] tensor."""
    return (split * m + row) * n + col


def reduce_grid_size(m, n):
    """Blocks of the split-K reduction kernel (one thread per C element)."""
    return (m * n + REDUCE_BLOCK - 1) // REDUCE_BLOCK


def reduce_element(bid, tid, n):
    """(flat C index, column) of the element a reduction thread owns."""
    idx = bid * REDUCE_BLOCK + tid
    return idx, idx % n
