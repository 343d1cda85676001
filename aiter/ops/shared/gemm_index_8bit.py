"""Index arithmetic of the a8w8 GEMM kernels (fp8/int8 inputs): the preshuffled weight layout,
each lane's K runs, the scale tensors, split-K ranges and the split-K semaphore slots.
"""

# Only +, -, *, //, %, & and comparisons appear below, so the same functions run on Python
# ints (CPU tests) and on FlyDSL Int32/Int64 values (inside the kernels). Operands are never
# negative, so floor and truncating division agree. The block, wave and accumulator mapping is
# the a16w16 one and is imported from there unchanged.

from aiter.ops.shared.gemm_index import (
    MMA_MN,
    WAVE_SIZE,
    WAVES_PER_BLOCK,
    acc_col,
    acc_row,
    acc_rows_per_lane,
    block_origin,
    c_coord,
    c_offset,
    grid_size,
    in_bounds,
    k_loop_counts,
    lane_operand_row,
    mma_repeats,
    operand_row,
    split_k_range,
    wave_layout,
    wave_origin,
    wave_tile,
    workspace_offset,
)

__all__ = [
    "MMA_MN",
    "WAVE_SIZE",
    "WAVES_PER_BLOCK",
    "acc_col",
    "acc_row",
    "acc_rows_per_lane",
    "block_origin",
    "c_coord",
    "c_offset",
    "grid_size",
    "in_bounds",
    "k_loop_counts",
    "lane_operand_row",
    "mma_repeats",
    "operand_row",
    "split_k_range",
    "wave_layout",
    "wave_origin",
    "wave_tile",
    "workspace_offset",
]

# K (one byte per element) consumed per k-block: two 16x16x32 MFMAs or one 16x16x64 WMMA.
K_BLOCK = 64
# K of one MMA instruction: v_mfma_*_16x16x32_{fp8_fp8,i8} and v_wmma_*_16x16x64_{fp8_fp8,iu8}.
MMA_K = {"mfma": 32, "wmma": 64}
# The preshuffled weight layout the kernel reads: 16 rows of N by 16 contiguous bytes of K.
SHUFFLE_N = 16
SHUFFLE_K = 16
# Side of the DeepSeek-V3 scale blocks: activations 1 x 128, weights 128 x 128.
SCALE_BLOCK = 128
K_BLOCKS_PER_SCALE_BLOCK = SCALE_BLOCK // K_BLOCK


def k_run(wave_size: int) -> int:
    """Contiguous K bytes one lane loads per k-block (16 for wave64, 32 for wave32)."""
    return K_BLOCK * MMA_MN // wave_size


def mma_steps(mma: str) -> int:
    """MMA instructions per 16x16 tile per k-block; step s takes the s-th slice of a lane's run."""
    return K_BLOCK // MMA_K[mma]


def lane_k_offset(lane, wave_size: int):
    """Start of a lane's contiguous K run inside a k-block.

    Lanes sharing an operand row split the k-block into runs, and A and B use the same split,
    so every MMA K slot pairs the A and B elements of the same k (the MMA's own K order inside
    an instruction does not matter because both operands follow it).
    """
    return (lane // MMA_MN) * k_run(wave_size)


def a_offset(row, k, kb, lane, wave_size: int):
    """Element offset into a row-major [rows, K] matrix of a lane's K run in k-block kb."""
    return row * k + kb * K_BLOCK + lane_k_offset(lane, wave_size)


def shuffled_offset(n, kk, k, layout_n: int = SHUFFLE_N, layout_k: int = SHUFFLE_K):
    """Element offset of W[n, kk] in a weight preshuffled with layout (layout_n, layout_k).

    The shuffled tensor is W viewed as [N / ln, ln, K / lk, lk], permuted to
    [N / ln, K / lk, ln, lk] and made contiguous: a group of ln rows stores its K in chunks of
    lk contiguous elements per row, the ln rows of one chunk side by side.
    """
    group = (n // layout_n) * (k // layout_k) + kk // layout_k
    return group * (layout_n * layout_k) + (n % layout_n) * layout_k + kk % layout_k


def chunks_per_run(wave_size: int) -> int:
    """16-byte chunks of the shuffled weight that make up one lane's K run (1 or 2)."""
    return k_run(wave_size) // SHUFFLE_K


def b_chunk_offset(row, k, kb, lane, wave_size: int, chunk: int):
    """Element offset of chunk `chunk` of a lane's K run of weight row `row` (shuffled)."""
    kk = kb * K_BLOCK + lane_k_offset(lane, wave_size) + chunk * SHUFFLE_K
    return shuffled_offset(row, kk, k)


def x_scale_offset(row, scale_kb, num_scale_kb):
    """Offset of x_scale[row, scale_kb] in a contiguous [M, K / 128] tensor."""
    return row * num_scale_kb + scale_kb


def w_scale_offset(col, scale_kb, num_scale_kb):
    """Offset of w_scale[col // 128, scale_kb] in a contiguous [N / 128, K / 128] tensor."""
    return (col // SCALE_BLOCK) * num_scale_kb + scale_kb


def num_tiles(m, n, tile_m: int, tile_n: int):
    """Output tiles of the launch grid, one split-K semaphore slot each."""
    grid_x, grid_y, _ = grid_size(m, n, tile_m, tile_n, 1)
    return grid_x * grid_y


def semaphore_slot(bid_m, bid_n, grid_x):
    """Semaphore slot of the output tile (bid_m, bid_n); grid_x is the count of N tiles."""
    return bid_m * grid_x + bid_n


def is_last_arrival(previous_count, split_k: int):
    """Whether the block whose atomic increment returned previous_count arrived last."""
    return previous_count == split_k - 1
