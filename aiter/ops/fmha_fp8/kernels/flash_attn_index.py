"""Index arithmetic of the fp8 flash-attention forward and split-KV combine kernels: which batch,
head, query block and key split each work-group owns, which query rows, keys and value columns
each lane touches, the causal and sequence-end masks, the key-block ranges of the splits, the
tensor and workspace offsets, and the online-softmax and combine rules.
"""

# Only +, -, *, //, %, & and comparisons appear below (min and max through a `select(cond, a,
# b)` argument; exponentials and logarithms through function arguments), so the same functions
# run on Python ints and floats (CPU tests), on torch tensors (the CPU emulation) and on FlyDSL
# Int32/Int64/Float32 values (inside the kernels). Operands of // and % are never negative, so
# floor and truncating division agree.
#
# Layout of one work-group: block_m query rows of one query head, one wave per 16 rows. Each wave
# computes S^T = K Q^T for BLOCK_N keys as BLOCK_N / 16 MMA tiles of 16 keys x 16 queries (the
# 16x16 accumulator's rows are keys, its columns queries), so a lane holds one query (its column)
# and acc_rows_per_lane consecutive keys of every key tile. P^T keeps that layout and is the
# B operand of O^T = V^T P^T: a lane's P bytes are the keys its accumulators hold, and the A
# operand (V^T, staged transposed in LDS) supplies the same keys for one value column. O^T's
# accumulators then hold, per lane, one query and acc_rows_per_lane consecutive value columns.
# Each key block's K and V tiles are loaded once per work-group by all its threads, one block
# ahead of the MMAs (in registers), and written to LDS between two barriers.

# M and N of one MMA instruction (v_mfma_f32_16x16x32_fp8_fp8, v_wmma_f32_16x16x64_fp8_fp8).
MMA_MN = 16
# K (bytes of fp8) of one MMA instruction.
MMA_K = {"mfma": 32, "wmma": 64}
WAVE_SIZE = {"mfma": 64, "wmma": 32}
# Keys per inner step (one key block) and the 16-key MMA tiles it is made of.
BLOCK_N = 64
KEY_TILES = BLOCK_N // MMA_MN
BLOCK_MS = (64, 128)
HEAD_DIM_STEP = 32
HEAD_DIMS = tuple(range(64, 257, HEAD_DIM_STEP))
# The head dim is consumed in chunks of 64 bytes (two 16x16x32 MFMAs or one 16x16x64 WMMA), and
# a trailing half chunk of 32 when D % 64 == 32.
D_CHUNK = 64
# Bytes between consecutive value columns of the transposed V tile in LDS (BLOCK_N keys plus
# padding; a multiple of 8 so a lane's 4- or 8-byte key runs stay aligned).
V_LDS_STRIDE = BLOCK_N + 8
# V is staged in pieces of 4 keys x 4 value columns: four 4-byte loads (one per key), transposed
# in registers into four words of one column's 4 consecutive keys, written as 4-byte LDS words.
V_PIECE_KEYS = 4
V_PIECE_COLS = 4
V_COPY_BYTES = V_PIECE_KEYS * V_PIECE_COLS
# Pieces of consecutive threads: V_COL_RUN column groups by V_KEY_RUN key groups (v_copy_piece).
V_COL_RUN = 4
V_KEY_RUN = 8
# K is staged row-major in 16-byte pieces; rows are padded by 16 bytes so that the 8 lanes a
# 16-byte LDS read serves per cycle (8 consecutive keys, one head-dim offset) hit 8 distinct
# groups of 4 banks.
K_COPY_BYTES = 16
K_LDS_PAD = 16
# Bytes per wave of the slot that copy threads without a piece write to (never read).
IDLE_SLOT_BYTES = 16
# Buffer offset of the loads of threads without a piece: past any block's byte count
# (BLOCK_N rows of Hkv x D bytes).
IDLE_LOAD_OFFSET = 2**31 - 64
# Threads per work-group of the combine kernel (one thread per output element).
COMBINE_BLOCK = 256
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# --- work-groups -------------------------------------------------------------------------------


def waves_per_block(block_m: int) -> int:
    """Waves of a work-group: one per 16 query rows."""
    return block_m // MMA_MN


def block_threads(block_m: int, mma: str) -> int:
    return waves_per_block(block_m) * WAVE_SIZE[mma]


def num_q_blocks(max_seqlen_q, block_m: int):
    """Query blocks per (batch, head): enough for the longest query sequence."""
    return (max_seqlen_q + block_m - 1) // block_m


def grid_size(batch, hq, q_blocks, num_splits):
    """Work-groups of the forward kernel (a flat 1-D grid)."""
    return num_splits * hq * q_blocks * batch


def interleaved_batch(slot, batch, interleave):
    """The batch of batch slot `slot`: slot itself, or with interleave == 1 the order
    0, B - 1, 1, B - 2, ... (even slots count up from the front, odd slots down from the back)."""
    half = slot // 2
    odd = slot % 2
    alternate = half + odd * (batch - 1 - half - half)
    return slot + interleave * (alternate - slot)


def work_item(wg, batch, hq, q_blocks, interleave):
    """(batch, head, q block, split) of work-group wg.

    Innermost the batch slot (so consecutive work-groups alternate between batch b and B - 1 - b
    with interleave), then the query block counted from the last one (the longest causal rows
    start first), then the head, outermost the key split.
    """
    slot = wg % batch
    rest = wg // batch
    q_block = q_blocks - 1 - rest % q_blocks
    rest = rest // q_blocks
    return interleaved_batch(slot, batch, interleave), rest % hq, q_block, rest // hq


def kv_head(head, hq, hkv):
    """GQA: query head `head` reads kv head head // (Hq / Hkv)."""
    return head // (hq // hkv)


# --- sequences, rows and offsets ---------------------------------------------------------------


def dense_bounds(b, seqlen_q, seqlen_k):
    """(first query row, query count, first key row, key count) of batch b of a dense launch;
    rows count over the flattened [B * S] token dimension."""
    return b * seqlen_q, seqlen_q, b * seqlen_k, seqlen_k


def varlen_bounds(cu_q_b, cu_q_next, cu_k_b, cu_k_next):
    """The same from cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b], cu_seqlens_k[b + 1]."""
    return cu_q_b, cu_q_next - cu_q_b, cu_k_b, cu_k_next - cu_k_b


def head_offset(row, head, heads, dim):
    """Element offset of x[row, head, 0] in a contiguous [rows, heads, dim] tensor (dense
    [B, S, H, dim] tensors are that with rows = B * S)."""
    return (row * heads + head) * dim


def lse_offset(batch, head, pos, hq, length):
    """Offset of lse[batch, head, pos] in a contiguous [B, Hq, length] tensor: dense lse
    [B, Hq, Sq]; varlen lse [Hq, Tq] is batch 0, pos = the query's row, length Tq."""
    return (batch * hq + head) * length + pos


def query_pos(q_block, block_m: int, wave, lane):
    """Position in its sequence of the query a lane holds (the column of its 16x16 tiles)."""
    return q_block * block_m + wave * MMA_MN + lane % MMA_MN


def safe_row(valid, row, select):
    """row, or row 0 of the tensor for a lane whose query does not exist (loads stay in bounds;
    stores are predicated)."""
    return select(valid, row, 0)


def clamp_index(index, count, select):
    """index, or count - 1 past the end (count >= 1): loads stay in bounds, masks drop them."""
    return select(index < count, index, count - 1)


# --- keys: causal limit, split ranges, masks --------------------------------------------------


def key_limit(pos, seqlen_q, seqlen_k):
    """Bottom-right causal: query pos sees keys j <= pos + Sk - Sq (none when negative)."""
    return pos + seqlen_k - seqlen_q


def kv_end(q0, block_m: int, seqlen_q, seqlen_k, causal: bool, select):
    """Keys [0, kv_end) that the query block starting at q0 reads: every key without causal,
    up to the last row's causal limit with it, and none when the block holds no query."""
    active = q0 < seqlen_q
    if not causal:
        return select(active, seqlen_k, 0)
    last = select(q0 + block_m < seqlen_q, q0 + block_m, seqlen_q) - 1
    end = key_limit(last, seqlen_q, seqlen_k) + 1
    end = select(end < seqlen_k, end, seqlen_k)
    end = select(end > 0, end, 0)
    return select(active, end, 0)


def kv_blocks(end):
    """Key blocks covering keys [0, end)."""
    return (end + BLOCK_N - 1) // BLOCK_N


def split_range(split, num_blocks, num_splits):
    """Half-open range of key blocks owned by a split: contiguous ranges whose sizes differ by
    at most one and cover every block once (empty ranges when splits outnumber blocks)."""
    return (split * num_blocks) // num_splits, ((split + 1) * num_blocks) // num_splits


def key_valid(key, pos, seqlen_q, seqlen_k, causal: bool):
    """Whether query pos attends to key `key` (inside the sequence, and causal-visible)."""
    inside = key < seqlen_k
    if not causal:
        return inside
    return inside & (key <= key_limit(pos, seqlen_q, seqlen_k))


# --- lanes -------------------------------------------------------------------------------------


def acc_rows_per_lane(wave_size: int) -> int:
    """Consecutive accumulator rows one lane holds per 16x16 tile (4 MFMA, 8 WMMA)."""
    return MMA_MN * MMA_MN // wave_size


def lane_group(lane):
    """Which 16-lane group a lane is in: selects its accumulator rows and operand K run."""
    return lane // MMA_MN


def group_xor_offsets(wave_size: int) -> tuple[int, ...]:
    """Lane-xor distances that reach every lane holding the same query (lane % 16) from any of
    them: 16 and 32 in a wave64, 16 in a wave32."""
    return tuple(1 << s for s in range(4, wave_size.bit_length() - 1))


def operand_key(kv0, tile, lane):
    """Key whose K row a lane loads for key tile `tile` (the A operand of S^T = K Q^T)."""
    return kv0 + tile * MMA_MN + lane % MMA_MN


def acc_key(kv0, tile, lane, e, wave_size: int):
    """Key of accumulator element e of a lane in key tile `tile` of S^T (also the key of P
    byte `e` of that tile in the lane's P operand)."""
    return kv0 + tile * MMA_MN + lane_group(lane) * acc_rows_per_lane(wave_size) + e


def acc_value_col(d_tile, lane, e, wave_size: int):
    """Value column of accumulator element e of a lane in value tile d_tile of O^T."""
    return d_tile * MMA_MN + lane_group(lane) * acc_rows_per_lane(wave_size) + e


def operand_value_col(d_tile, lane):
    """Value column whose V^T row a lane supplies as the A operand of O^T = V^T P^T."""
    return d_tile * MMA_MN + lane % MMA_MN


def full_chunks(head_dim: int) -> int:
    """Whole 64-byte chunks of a head dim."""
    return head_dim // D_CHUNK


def has_half_chunk(head_dim: int) -> bool:
    """Whether a trailing 32-byte half chunk remains (D % 64 == 32)."""
    return head_dim % D_CHUNK != 0


def chunk_run(wave_size: int, half: bool) -> int:
    """Contiguous head-dim bytes one lane loads per chunk: a full chunk is 16 (wave64) or 32
    (wave32) bytes, a half chunk 8 or 16 (WMMA pads its half run with 16 zero bytes)."""
    run = D_CHUNK * MMA_MN // wave_size
    return run // 2 if half else run


def chunk_offset(chunk, lane, wave_size: int, half: bool):
    """Head-dim offset of a lane's run in chunk `chunk`. Q and K use the same runs, so every
    MMA K slot pairs q and k elements of the same head-dim index."""
    return chunk * D_CHUNK + lane_group(lane) * chunk_run(wave_size, half)


def pv_steps(mma: str) -> int:
    """P@V MMA instructions per key block and value tile (2 MFMA, 1 WMMA)."""
    return BLOCK_N // MMA_K[mma]


def pv_tiles_per_step(mma: str) -> int:
    """Key tiles whose P bytes (and V bytes) form one P@V MMA operand (2 MFMA, 4 WMMA)."""
    return MMA_K[mma] // MMA_MN


def k_copy_count(head_dim: int) -> int:
    """16-byte pieces of one key block of K (BLOCK_N keys x D bytes)."""
    return BLOCK_N * (head_dim // K_COPY_BYTES)


def k_copy_steps(head_dim: int, threads: int) -> int:
    """Copy steps per thread to stage a key block of K."""
    return (k_copy_count(head_dim) + threads - 1) // threads


def k_copy_piece(step: int, tid, threads: int, head_dim: int, select):
    """(key in the block, first head-dim byte, whether the piece exists) of the 16-byte K piece
    a thread copies in `step`; a thread past the last piece loads nothing (kv_piece_offset)
    and writes its wave's idle slot. Consecutive threads take consecutive pieces of a row."""
    count = k_copy_count(head_dim)
    piece = step * threads + tid
    real = piece < count
    piece = select(real, piece, count - 1)
    per_key = head_dim // K_COPY_BYTES
    return piece // per_key, (piece % per_key) * K_COPY_BYTES, real


def k_lds_stride(head_dim: int) -> int:
    return head_dim + K_LDS_PAD


def k_lds_offset(key_in_block, d, head_dim: int):
    """Byte offset of K[key, d] of the staged key block in its row-major LDS tile."""
    return key_in_block * k_lds_stride(head_dim) + d


def k_lds_bytes(head_dim: int) -> int:
    return BLOCK_N * k_lds_stride(head_dim)


def v_copy_count(head_dim_v: int) -> int:
    """4 x 4 pieces of one key block of V (BLOCK_N keys x Dv bytes)."""
    return (BLOCK_N // V_PIECE_KEYS) * (head_dim_v // V_PIECE_COLS)


def v_copy_steps(head_dim_v: int, threads: int) -> int:
    """Copy steps per thread to stage a key block of V."""
    return (v_copy_count(head_dim_v) + threads - 1) // threads


def v_copy_piece(step: int, tid, threads: int, head_dim_v: int, select):
    """(first key in the block, first value column, whether the piece exists) of the 4 x 4
    piece of V a thread copies in `step`. Within 32 consecutive threads, 4 take consecutive
    column groups (16 contiguous bytes of a key) and 8 consecutive key groups: their 4-byte LDS
    words (column stride V_LDS_STRIDE) then fall in 32 distinct banks, where 32 column groups
    of one key group would share 4."""
    count = v_copy_count(head_dim_v)
    piece = step * threads + tid
    real = piece < count
    piece = select(real, piece, count - 1)
    col_lo = piece % V_COL_RUN
    key_lo = piece // V_COL_RUN % V_KEY_RUN
    rest = piece // (V_COL_RUN * V_KEY_RUN)
    col_hi = rest % (head_dim_v // (V_PIECE_COLS * V_COL_RUN))
    key_hi = rest // (head_dim_v // (V_PIECE_COLS * V_COL_RUN))
    key = (key_hi * V_KEY_RUN + key_lo) * V_PIECE_KEYS
    return key, (col_hi * V_COL_RUN + col_lo) * V_PIECE_COLS, real


def v_transpose_source(i: int) -> int:
    """Byte of a loaded piece (key-major: key * 4 + column) that lands at byte i of the
    transposed piece (column-major: column * 4 + key)."""
    return (i % V_PIECE_KEYS) * V_PIECE_COLS + i // V_PIECE_KEYS


def v_lds_offset(col, key_in_block):
    """Byte offset of V[key, col] of the staged key block in the transposed LDS tile."""
    return col * V_LDS_STRIDE + key_in_block


def v_lds_bytes(head_dim_v: int) -> int:
    return head_dim_v * V_LDS_STRIDE


def lds_layout(head_dim: int, head_dim_v: int, waves: int) -> tuple[int, int, int, int]:
    """(K tile, V tile, idle slots, total) byte offsets and size of a work-group's LDS."""
    v_base = k_lds_bytes(head_dim)
    idle_base = v_base + v_lds_bytes(head_dim_v)
    return 0, v_base, idle_base, idle_base + waves * IDLE_SLOT_BYTES


def idle_slot(idle_base, wave):
    """Byte offset of a wave's idle slot (several lanes of one wave may write it at once)."""
    return idle_base + wave * IDLE_SLOT_BYTES


def kv_block_rows(kv0, seqlen_k, live, select):
    """Keys of the staged block at kv0 that exist: the buffer the block is loaded through holds
    that many token rows from the block's first, so loads of later keys (and of every key when
    no block is left to load, `live` false) return the hardware's zeros, which masks drop."""
    rows = select(kv0 + BLOCK_N < seqlen_k, BLOCK_N, seqlen_k - kv0)
    rows = select(rows > 0, rows, 0)
    return select(live, rows, 0)


def kv_piece_offset(key_in_block, col, head, heads, dim, real, select):
    """Element offset of x[key, head, col] from the staged block's first token row, or, for a
    thread without a piece (`real` false), an offset past every block's buffer: its load
    returns zeros without touching memory."""
    return select(real, head_offset(key_in_block, head, heads, dim) + col, IDLE_LOAD_OFFSET)


def block_needs_mask(kv0, q0, seqlen_q, seqlen_k, causal: bool):
    """Whether the key block at kv0 holds a key some query of the work-group starting at q0
    must not see: a key past the sequence end, or with causal a key past the first query's
    limit. Blocks that do not skip the mask evaluation."""
    tail = kv0 + BLOCK_N > seqlen_k
    if not causal:
        return tail
    return tail | (kv0 + BLOCK_N - 1 > key_limit(q0, seqlen_q, seqlen_k))


def unmasked_blocks(q0, seqlen_q, seqlen_k, causal: bool, select):
    """How many leading key blocks of the work-group at q0 need no mask: block kb needs none
    (block_needs_mask is false) exactly when kb < this, i.e. when the block ends inside the
    sequence and, with causal, at or before the first query's limit. The key loop runs these
    blocks without evaluating the mask, then the rest with it."""
    end = seqlen_k
    if causal:
        limit = key_limit(q0, seqlen_q, seqlen_k) + 1
        end = select(limit < end, limit, end)
    end = select(end > 0, end, 0)
    return end // BLOCK_N


# --- online softmax and the split-KV combine ---------------------------------------------------


def needs_rescale(m_used, m_candidate, threshold: float):
    """Whether a row moves its exponent base from m_used to m_candidate = max(m_used, tile max)
    (log2 units): only when the max grows by more than `threshold` (0.0: whenever it grows).
    Otherwise the row keeps m_used, so exponentials may exceed 1 by up to 2**threshold."""
    return (m_candidate > m_used) & (m_candidate - m_used > threshold)


def exp_base(m, neg_inf, select):
    """The max subtracted before exp2: m, or 0 while m is -inf (a row that has seen no key),
    so masked scores (-inf) give exp2(-inf) = 0 rather than NaN."""
    return select(m == neg_inf, 0.0, m)


def lse_from(m, total, neg_inf, log2, select):
    """Natural-log logsumexp of a row with base m (log2 units) and sum `total`: -inf for a row
    that saw no key (total 0)."""
    return select(total > 0.0, (m + log2(select(total > 0.0, total, 1.0))) * LN2, neg_inf)


def split_workspace_shapes(rows, hq, dv, num_kv_splits):
    """(out, lse) shapes of the fp32 split-KV workspaces: per split, row and head the
    unnormalised partial O [Dv] and the pair (m, l): base in log2 units and exp2 sum."""
    return (num_kv_splits, rows, hq, dv), (num_kv_splits, rows, hq, 2)


def ws_out_offset(split, row, head, col, rows, hq, dv):
    """Offset of workspace_out[split, row, head, col]."""
    return ((split * rows + row) * hq + head) * dv + col


def ws_lse_offset(split, row, head, rows, hq):
    """Offset of workspace_lse[split, row, head, 0] (m; l is the next element)."""
    return ((split * rows + row) * hq + head) * 2


def combine_grid(rows, hq, dv):
    """Work-groups of the combine kernel: one thread per element of out."""
    return (rows * hq * dv + COMBINE_BLOCK - 1) // COMBINE_BLOCK


def combine_element(bid, tid, hq, dv):
    """(flat index into out, row, head, value column) of a combine thread."""
    idx = bid * COMBINE_BLOCK + tid
    col = idx % dv
    rest = idx // dv
    return idx, rest // hq, rest % hq, col


def lse_position(row, length):
    """(batch, position) of an output row for lse_offset: dense rows are b * Sq + pos
    (length Sq); varlen rows are batch 0 of length Tq."""
    return row // length, row % length
