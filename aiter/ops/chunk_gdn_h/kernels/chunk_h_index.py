"""Index arithmetic of the chunk_gdn_h hidden-state pass, in plain Python: which sequence, head
and V tile a work-group owns, where its chunks start and end, and the element offsets of every
tensor it reads and writes. The FlyDSL kernel and the CPU emulation both call these.

Layouts (contiguous, innermost last):
- k [B, T, Hg, K], w [B, T, H, K], u and v_new [B, T, H, V], g [B, T, H], gk [B, T, H, K];
- h [B, NT, H, K, V]: the state at the start of each chunk;
- initial and final states [N, H, K, V].
Varlen batches have B = 1 and the sequences laid end to end; their chunks are numbered across
sequences (chunk_offsets), so h holds NT = sum of each sequence's chunk count.
"""

from __future__ import annotations

# Only +, -, *, //, % and comparisons appear below (min through a `select(cond, a, b)` the
# caller passes: Python's conditional expression on the CPU, a select in the kernel), so the
# same formulas run on ints, torch tensors and FlyDSL values.

BLOCK_VS = (16, 32, 64)  # the V-tile widths the kernel is compiled for
CHUNK_SIZES = (64,)  # the chunk lengths BT it walks in
HEAD_DIMS = (64, 128, 192, 256)  # K: the kernel holds the state in 64-row blocks


def num_chunks(seqlen, chunk_size: int):
    return (seqlen + chunk_size - 1) // chunk_size


def chunk_offsets(cu_seqlens: list[int], chunk_size: int) -> list[int]:
    """The first chunk of each sequence in h's chunk axis, and the total at the end."""
    offsets = [0]
    for start, end in zip(cu_seqlens, cu_seqlens[1:], strict=False):
        offsets.append(offsets[-1] + num_chunks(end - start, chunk_size))
    return offsets


def v_tiles(head_dim_v: int, block_v: int) -> int:
    return (head_dim_v + block_v - 1) // block_v


def grid_size(num_seqs: int, heads: int, head_dim_v: int, block_v: int) -> int:
    """Work-groups: one per (sequence, value head, V tile)."""
    return num_seqs * heads * v_tiles(head_dim_v, block_v)


def work_group(pid, heads: int, head_dim_v: int, block_v: int):
    """(sequence, value head, V tile) of work-group pid; the V tile varies fastest, so the
    work-groups of one head, which read the same k and w, run side by side."""
    nv = v_tiles(head_dim_v, block_v)
    tile, rest = pid % nv, pid // nv
    return rest // heads, rest % heads, tile


def key_head(head, heads: int, key_heads: int):
    """The key head of a value head: value heads share one in groups of H // Hg."""
    return head // (heads // key_heads)


def dense_sequence(seq, seqlen, chunk_size: int):
    """(first token row, tokens, first chunk row) of sequence seq of a dense batch: token rows
    are [B, T] flattened, chunk rows [B, NT]."""
    return seq * seqlen, seqlen, seq * num_chunks(seqlen, chunk_size)


def varlen_sequence(start, end, first_chunk):
    """The same for a varlen sequence, from cu_seqlens[seq], cu_seqlens[seq + 1] and
    chunk_offsets[seq]."""
    return start, end - start, first_chunk


def token_row(bos, t):
    """Row of token t of a sequence starting at row bos of the flattened [B * T] token axis."""
    return bos + t


def chunk_tokens(chunk, seqlen, chunk_size: int, select):
    """Tokens of a chunk: chunk_size, fewer in a sequence's last chunk."""
    rest = seqlen - chunk * chunk_size
    return select(rest < chunk_size, rest, chunk_size)


def last_token(chunk, seqlen, chunk_size: int, select):
    """The chunk's last token, in the sequence: its gates decay the whole chunk."""
    return chunk * chunk_size + chunk_tokens(chunk, seqlen, chunk_size, select) - 1


def k_offset(row, key_head_index, kk, key_heads: int, head_dim: int):
    return (row * key_heads + key_head_index) * head_dim + kk


def w_offset(row, head, kk, heads: int, head_dim: int):
    """w and gk: [rows, H, K]."""
    return (row * heads + head) * head_dim + kk


def u_offset(row, head, vv, heads: int, head_dim_v: int):
    """u and v_new: [rows, H, V]."""
    return (row * heads + head) * head_dim_v + vv


def g_offset(row, head, heads: int):
    return row * heads + head


def h_offset(chunk_row, head, kk, vv, heads: int, head_dim: int, head_dim_v: int):
    """h [chunk rows, H, K, V], chunk_row the chunk's index in h's flattened [B * NT] axis."""
    return ((chunk_row * heads + head) * head_dim + kk) * head_dim_v + vv


def state_offset(seq, head, kk, vv, heads: int, head_dim: int, head_dim_v: int):
    """Initial and final states [N, H, K, V]."""
    return ((seq * heads + head) * head_dim + kk) * head_dim_v + vv


# --- the work-group's lanes -------------------------------------------------------------------
#
# A work-group has one wave per 16 value columns of its V tile: the wave owns that strip of the
# state, [K, 16], as K / 16 MMA accumulator tiles, and computes v_new for it. Both products of a
# chunk run on 16x16 MMA tiles, contracting 32 indices per MMA call:
#   v_new[t, :] = u - w h       (rows t, contraction over K),
#   h += k^T v_new'             (rows of K, contraction over the chunk's tokens),
# and each takes one operand straight from the other's accumulators: a lane holds column
# lane % 16 and rows (lane // 16) * rpl + e (e < rpl = 256 / wave size) of each tile. So a
# contraction block b of 32 indices pairs MMA slot j of lane group lane // 16 with index
# contraction_index(b, lane, j): the lane's rows of tile 2b, then of tile 2b + 1. The other
# operand (w's rows, k^T's rows from LDS) is read in that order: two runs of rpl per block.

WAVE_SIZE = {"mfma": 64, "wmma": 32}
MMA_MN = 16
CONTRACTION_BLOCK = 32
KT_PAD = 4  # elements of padding per row of the k^T tile in LDS (spreads rows over banks)
K_PIECE = 8  # k's elements per 16-byte piece: a thread copies 4 tokens x 8 of them
TOKEN_QUAD = 4


def waves(block_v: int) -> int:
    return block_v // MMA_MN


def threads(block_v: int, mma: str) -> int:
    return waves(block_v) * WAVE_SIZE[mma]


def rows_per_lane(wave_size: int) -> int:
    """Accumulator elements a lane holds per 16x16 tile."""
    return MMA_MN * MMA_MN // wave_size


def lane_row(lane, e, wave_size: int):
    """Row inside a 16x16 accumulator tile of a lane's element e."""
    return (lane // MMA_MN) * rows_per_lane(wave_size) + e


def lane_col(lane):
    """Column inside a 16x16 tile a lane holds (accumulators), or the operand row it feeds."""
    return lane % MMA_MN


def contraction_index(block, lane, j, wave_size: int):
    """The contraction index of MMA slot j of a lane in contraction block `block`."""
    rpl = rows_per_lane(wave_size)
    return block * CONTRACTION_BLOCK + (j // rpl) * MMA_MN + lane_row(lane, j % rpl, wave_size)


def value_col(tile, wave, lane, block_v: int):
    """The value column of V a lane's accumulators hold: its wave's strip of the V tile."""
    return tile * block_v + wave * MMA_MN + lane_col(lane)


def kt_lds_offset(kk, t, chunk_size: int):
    """Element offset of k^T[kk, t] in the LDS tile: K rows of chunk_size tokens, padded."""
    return kk * (chunk_size + KT_PAD) + t


def kt_lds_elements(head_dim: int, chunk_size: int) -> int:
    return head_dim * (chunk_size + KT_PAD)


def k_copy_items(head_dim: int, chunk_size: int) -> int:
    """Pieces of a chunk's k tile: 4 tokens x 8 key columns each."""
    return (chunk_size // TOKEN_QUAD) * (head_dim // K_PIECE)


def k_copy_steps(head_dim: int, chunk_size: int, block_threads: int) -> int:
    return -(-k_copy_items(head_dim, chunk_size) // block_threads)


def k_copy_item(step, tid, block_threads: int, head_dim: int, chunk_size: int):
    """(first token, first key column, real) of a thread's copy item at `step`: the token
    quads vary fastest. Past the last item (real false) the column is clamped into the tile:
    the thread loads but does not write."""
    item = step * block_threads + tid
    quads = chunk_size // TOKEN_QUAD
    real = item < k_copy_items(head_dim, chunk_size)
    octet = (item // quads) % (head_dim // K_PIECE)
    return (item % quads) * TOKEN_QUAD, octet * K_PIECE, real
