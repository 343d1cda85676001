"""Index arithmetic and activation formulas of the MoE stage kernels (expert GEMMs over sorted
token blocks): which token, slot and expert a sorted row stands for, which weight rows hold the
gate and up projections, where stage outputs and workspaces live, and the launch grids.
"""

# The index functions use only + - * // % & | << >> and comparisons, so the same code runs on
# Python ints (CPU tests), on torch integer tensors (vectorised emulation) and on FlyDSL
# Int32/Int64 values (inside the kernels). Operands are never negative, so floor and truncating
# division agree. Nothing is clamped: the kernels load a row that does not exist as zeros
# (buffer loads out of range). `gate_mode` is a compile-time string everywhere.
#
# The activation formulas take their transcendental and min/max operations as arguments, so
# the kernels, torch and plain Python floats all evaluate the same expression.

import math

from aiter.ops.moe.kernels.sorting_index import TOKEN_BITS, TOKEN_MASK
from aiter.ops.shared.mainloop_index import split_k_range

# --- the routing format --------------------------------------------------------------------

# sorted_ids entries are (slot << TOKEN_BITS) | token; padding is (topk << TOKEN_BITS) | M
# (moe_sorting_index defines the format and its limits MAX_TOKENS and MAX_TOPK).

GATE_MODES = ("separated", "interleave")

# Elements per block of the one-element-per-thread kernels (activation, top-k reduce).
ELEMENTWISE_BLOCK = 256

# --- shape rules -----------------------------------------------------------------------------

# model_dim is stage 1's K and stage 2's N: a multiple of the fp8 k-block, so stage 1 has no K
# tail. Every MoE model's hidden size is one (gpt-oss 2880 = 45 * 64, DeepSeek-V3 7168).
MODEL_DIM_MULTIPLE = 64
# inter_dim is stage 1's N (columns past it load zeros and store nothing) and stage 2's K, whose
# last k-block may end early: it is read in 16-byte chunks (TAIL_CHUNK_BYTES), each wholly
# inside or past inter_dim, so inter_dim * element size must be a multiple of it; so is every
# 16-byte store run of out1. fp8 also needs
# it for the (16, 16) preshuffle of w2, whose K is inter_dim.
TAIL_CHUNK_BYTES = 16
INTER_DIM_MULTIPLE = {2: 8, 1: 16}  # by element bytes: bf16/fp16, fp8


def inter_dim_multiple(element_bytes: int) -> int:
    """What inter_dim must be a positive multiple of, for inputs of `element_bytes` per element."""
    return INTER_DIM_MULTIPLE[element_bytes]


def entry_token(entry):
    """Token of a sorted_ids entry (>= M for padding)."""
    return entry & TOKEN_MASK


def entry_slot(entry):
    """Top-k slot of a sorted_ids entry (topk for padding)."""
    return entry >> TOKEN_BITS


def entry_valid(token, slot, m, topk):
    """Whether an entry stands for a routed pair rather than padding."""
    return (token < m) & (slot < topk)


def sorted_row(block, tile_m: int, row_in_block):
    """Index into sorted_ids of row `row_in_block` of sorted block `block`."""
    return block * tile_m + row_in_block


def row_block(row, tile_m: int):
    """The sorted block a sorted row belongs to (index into sorted_expert_ids)."""
    return row // tile_m


def block_active(block, tile_m: int, num_valid_rows):
    """Whether a sorted block holds rows in use (num_valid_rows = num_valid_ids[0])."""
    return block * tile_m < num_valid_rows


def expert_valid(expert, num_experts):
    """Whether a local expert index names a weight slab of w1 / w2."""
    return (expert >= 0) & (expert < num_experts)


def routed_row(token, slot, topk):
    """Row of a routed pair in out1, a2, a2_scale and the stage workspaces: token * topk + slot."""
    return token * topk + slot


# --- weights ---------------------------------------------------------------------------------


def gate_row(n, inter, gate_mode: str):
    """Row of an expert's [2 * inter, model_dim] w1 slab (and of bias1, w1_scale) that holds the
    gate projection of output column n."""
    if gate_mode == "interleave":
        return 2 * n
    return n


def up_row(n, inter, gate_mode: str):
    """Row of an expert's w1 slab that holds the up projection of output column n."""
    if gate_mode == "interleave":
        return 2 * n + 1
    return inter + n


def expert_row(expert, row, rows_per_expert):
    """Row of the [E * rows_per_expert, K] view of a per-expert weight (or of its per-row scale
    and bias). A per-expert preshuffle with 16-row groups equals the preshuffle of this view,
    since rows_per_expert is a multiple of 16."""
    return expert * rows_per_expert + row


# --- tiles and grids -----------------------------------------------------------------------


def stage1_grid(inter, num_blocks, tile_n: int, ksplit: int):
    """Stage-1 launch grid (x: tile_n-wide column tiles of inter, y: sorted blocks, z: splits)."""
    return (inter + tile_n - 1) // tile_n, num_blocks, ksplit


def stage2_grid(model_dim, num_blocks, tile_n: int):
    """Stage-2 launch grid (x: tile_n-wide column tiles of model_dim, y: sorted blocks)."""
    return (model_dim + tile_n - 1) // tile_n, num_blocks, 1


def tile_origin(bid_block, bid_n, tile_m: int, tile_n: int):
    """(first sorted row, first output column) of work-group (bid_n, bid_block)."""
    return bid_block * tile_m, bid_n * tile_n


def stage1_acc_index(rep_m: int, rep_n: int, reps_n: int, half: int) -> int:
    """Accumulator of stage-1 MMA tile (rep_m, rep_n): half 0 gate, half 1 up.

    The weight rows of a lane are its reps_n gate rows followed by its reps_n up rows, and the
    GEMM k-block loop keeps the tile of A repeat i and weight row j at i * (2 * reps_n) + j.
    """
    return rep_m * 2 * reps_n + half * reps_n + rep_n


def k_split_range(split, num_k_blocks, ksplit: int):
    """Half-open range of k-blocks of split `split` (the GEMM split-K rule)."""
    return split_k_range(split, num_k_blocks, ksplit)


# --- stage 2's K tail ------------------------------------------------------------------------


def has_k_tail(k: int, k_block: int) -> bool:
    """Whether K ends inside a k-block: the kernel then checks every K chunk against K (a
    compile-time choice, so aligned shapes compile without the checks); a chunk past K loads
    zeros. The rule on inter_dim makes every 16-byte chunk wholly inside K or wholly past it."""
    return k % k_block != 0


def stage_k_blocks(k, k_block: int):
    """k-blocks the main loop walks over K: the full ones, then the one K ends inside."""
    return (k + k_block - 1) // k_block


# --- outputs and workspaces ----------------------------------------------------------------


def matrix_offset(row, col, ld):
    """Element offset of [row, col] in a contiguous row-major matrix of ld columns."""
    return row * ld + col


def stage1_ws_gate_col(n):
    """Column of the stage-1 workspace [M * topk, 2 * inter] holding the gate of column n."""
    return n


def stage1_ws_up_col(n, inter):
    """Column of the stage-1 workspace holding the up projection of column n."""
    return inter + n


def stage1_workspace_shape(m: int, topk: int, inter: int) -> tuple[int, int]:
    """fp32 workspace of stage 1 with ksplit > 1: scaled gate and up partial sums per routed row."""
    return m * topk, 2 * inter


def stage2_workspace_shape(m: int, topk: int, model_dim: int) -> tuple[int, int]:
    """fp32 workspace of stage 2 in "reduce" mode: one weighted row per routed pair."""
    return m * topk, model_dim


# Stage 2's "atomic" mode adds each 16-byte run of a routed row into out[token] as packed
# atomics of ATOMIC_PAIR bf16/fp16 elements (one 32-bit word: global_atomic_pk_add_bf16/_f16).
# A run starts at a multiple of its length, model_dim is a multiple of MODEL_DIM_MULTIPLE, so
# every pair is a whole word of a row and no add reaches past model_dim.
ATOMIC_PAIR = 2


def atomic_pair_starts(run: int) -> list[int]:
    """First element (in the run) of each packed add of a run of `run` elements."""
    return list(range(0, run, ATOMIC_PAIR))


def elementwise_grid(count):
    """Blocks of a one-element-per-thread kernel over `count` elements."""
    return (count + ELEMENTWISE_BLOCK - 1) // ELEMENTWISE_BLOCK


def elementwise_index(bid, tid, ld):
    """(flat index, row, column) of the element a thread owns in a [rows, ld] grid."""
    idx = bid * ELEMENTWISE_BLOCK + tid
    return idx, idx // ld, idx % ld


def topk_ws_offset(token, slot, col, topk, model_dim):
    """Offset of workspace[token * topk + slot, col] in the stage-2 workspace."""
    return matrix_offset(routed_row(token, slot, topk), col, model_dim)


# --- activations -----------------------------------------------------------------------------

ACTIVATIONS = ("silu", "swiglu")
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def sigmoid(x, exp=math.exp):
    return 1.0 / (1.0 + exp(-x))


def silu_mul(g, u, exp=math.exp):
    """silu(g) * u."""
    return g * sigmoid(g, exp) * u


def swiglu_mul(g, u, exp=math.exp, minimum=min, maximum=max):
    """gpt-oss SwiGLU: g = min(g, 7); u = clamp(u, -7, 7); g * sigmoid(1.702 * g) * (u + 1)."""
    g = minimum(g, SWIGLU_LIMIT)
    u = maximum(minimum(u, SWIGLU_LIMIT), -SWIGLU_LIMIT)
    return g * sigmoid(SWIGLU_ALPHA * g, exp) * (u + 1.0)


def activate(activation: str, g, u, exp=math.exp, minimum=min, maximum=max):
    """The stage-1 output of gate g and up u (before the optional routing weight)."""
    if activation == "swiglu":
        return swiglu_mul(g, u, exp, minimum, maximum)
    return silu_mul(g, u, exp)
