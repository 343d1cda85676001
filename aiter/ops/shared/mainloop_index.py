"""Index arithmetic of the shared GEMM main loop (mainloop.py): where each thread copies the A
tile from global memory into LDS, where each lane reads its MMA operands back, where each lane
streams its B operands from global memory, and how the epilogue turns accumulators into
16-byte row stores.

The block is four waves side by side along N: every wave computes all tile_m rows of C for its
own tile_n / 4 columns. So A is the operand the waves share, and it goes through LDS; each B
row is used by one wave only, and goes straight to that wave's registers.
"""

# Only +, -, *, //, %, &, ^ and comparisons appear below, so the same functions run on Python
# ints (CPU tests, the work-group emulation) and on FlyDSL Int32 values (inside the kernels).
# Operands are never negative, so floor and truncating division agree.

WAVES_PER_BLOCK = 4
WAVE_SIZE = {"mfma": 64, "wmma": 32}
MMA_MN = 16
# Bytes of every global load, LDS write and LDS read of an operand (one dwordx4 / b128).
CHUNK_BYTES = 16
# The LDS serves 128 bytes (32 banks of 4 bytes) per cycle: eight 16-byte chunks.
LDS_BANKS = 32
BANK_BYTES = 4
CHUNKS_PER_LINE = LDS_BANKS * BANK_BYTES // CHUNK_BYTES
# LDS bytes per work-group the archs offer (gfx942: 64 KiB; gfx950 and gfx1250: 160 KiB).
LDS_BYTES = {"gfx942": 64 * 1024, "gfx950": 160 * 1024, "gfx1250": 160 * 1024}
# A buffer offset past every tensor's byte count: the hardware returns zeros for it. Block
# bases keep real offsets below it (the launchers check tile rows x K fits).
OUT_OF_RANGE = 0x7FFFFFF0
OFFSET_LIMIT = 0x7FFFFFF0


# --- the block and its waves ----------------------------------------------------------------


def threads(mma: str) -> int:
    return WAVES_PER_BLOCK * WAVE_SIZE[mma]


def wave_cols(tile_n: int) -> int:
    """Columns of C one wave computes."""
    return tile_n // WAVES_PER_BLOCK


def mma_repeats(tile_m: int, tile_n: int) -> tuple[int, int]:
    """16x16 MMA tiles per wave along M and along N."""
    return tile_m // MMA_MN, wave_cols(tile_n) // MMA_MN


def grid_size(m, n, tile_m: int, tile_n: int, split_k: int):
    """Launch grid (x: N tiles, y: M tiles, z: K splits)."""
    return (n + tile_n - 1) // tile_n, (m + tile_m - 1) // tile_m, split_k


def block_origin(bid_m, bid_n, tile_m: int, tile_n: int):
    """First row and first column of C owned by block (bid_m, bid_n)."""
    return bid_m * tile_m, bid_n * tile_n


def wave_col0(wave, tile_n: int):
    """First column of a wave's C columns inside its block's tile."""
    return wave * wave_cols(tile_n)


def lane_run(mma: str) -> int:
    """Elements of one K run a lane feeds one MMA k-block with (8 on wave64, 16 on wave32)."""
    return 32 * MMA_MN // WAVE_SIZE[mma]


# --- K: k-blocks, k-tiles and splits ---------------------------------------------------------


def k_block(elem_bytes: int) -> int:
    """K elements of one k-block: 64 bytes of each operand row."""
    return 64 // elem_bytes


def chunks_per_k_block() -> int:
    return 64 // CHUNK_BYTES


def k_blocks_per_mma(blocks: int, wide_mma: bool) -> int:
    """k-blocks one MMA call consumes: gfx950's 16x16x128 fp8 MFMA (wide_mma) takes a lane's
    runs of two consecutive k-blocks, where the k-tile holds an even number of them; every
    other MMA takes one. A and B runs are paired alike, so the MMA's K order is a permutation
    of the k-tile's that both operands share, and the sum is unchanged."""
    return 2 if wide_mma and blocks % 2 == 0 else 1


def split_k_range(split, num_k_blocks, split_k: int):
    """Half-open range of k-blocks owned by one split: contiguous, sizes differing by at most
    one, together covering every k-block once (some empty with more splits than k-blocks)."""
    return (split * num_k_blocks) // split_k, ((split + 1) * num_k_blocks) // split_k


def k_tiles(kb_begin, kb_end, blocks_per_tile: int):
    """k-tiles the main loop walks for k-blocks [kb_begin, kb_end): the last one may be
    partial, and its k-blocks past kb_end load as zeros."""
    return (kb_end - kb_begin + blocks_per_tile - 1) // blocks_per_tile


# --- A: global -> LDS ------------------------------------------------------------------------


def chunks_per_row(tile_k: int, elem_bytes: int) -> int:
    """16-byte chunks of one A row of a k-tile (a power of two: 4, 8 or 16)."""
    return tile_k * elem_bytes // CHUNK_BYTES


def a_stage_chunks(tile_m: int, tile_k: int, elem_bytes: int) -> int:
    return tile_m * chunks_per_row(tile_k, elem_bytes)


def a_copy_passes(tile_m: int, tile_k: int, elem_bytes: int, mma: str) -> int:
    """16-byte loads each thread issues per k-tile to bring A into LDS."""
    nthreads = threads(mma)
    return (a_stage_chunks(tile_m, tile_k, elem_bytes) + nthreads - 1) // nthreads


def a_copy_chunk(tid, copy_pass, mma: str):
    """The flat chunk index a thread copies in one pass: consecutive threads take consecutive
    chunks, so the lanes of a wave read whole rows of A (coalesced)."""
    return copy_pass * threads(mma) + tid


def a_copy_coord(q, cpr: int):
    """(row, chunk) of A's k-tile that flat chunk q is."""
    return q // cpr, q % cpr


def swizzle(row, chunk, cpr: int):
    """The LDS chunk slot of logical chunk `chunk` of A row `row`.

    Eight consecutive lanes share one LDS cycle (CHUNKS_PER_LINE chunks). Reading an MMA
    operand they take the same chunk of eight consecutive rows; copying they take the chunks
    of one row (or of a few rows). XOR-ing the chunk with a function of the row that walks all
    line positions gives both access patterns eight distinct bank groups.
    """
    rows_per_line = max(1, CHUNKS_PER_LINE // cpr)
    return chunk ^ ((row // rows_per_line) % min(cpr, CHUNKS_PER_LINE))


def a_lds_byte(row, chunk, cpr: int):
    """Byte offset of A's chunk (row, chunk) in the A stage."""
    return (row * cpr + swizzle(row, chunk, cpr)) * CHUNK_BYTES


def rep_stride_bytes(cpr: int) -> int:
    """Bytes between the same chunk of rows r and r + 16: the swizzle's pattern repeats every
    16 rows (16 is a multiple of the rows a pattern spans), so a_lds_byte(r + 16 * i, c) ==
    a_lds_byte(r, c) + i * rep_stride_bytes(cpr)."""
    return MMA_MN * cpr * CHUNK_BYTES


def a_stage_bytes(tile_m: int, tile_k: int, elem_bytes: int) -> int:
    return a_stage_chunks(tile_m, tile_k, elem_bytes) * CHUNK_BYTES


def a_copy_slot_byte(q, tile_m: int, tile_k: int, elem_bytes: int):
    """LDS byte a copy chunk lands at: its swizzled place, or, for the threads a small tile
    leaves without a chunk, a slot of their own past the stage (never read)."""
    cpr = chunks_per_row(tile_k, elem_bytes)
    row, chunk = a_copy_coord(q, cpr)
    real = q < a_stage_chunks(tile_m, tile_k, elem_bytes)
    return real, a_lds_byte(row, chunk, cpr), q * CHUNK_BYTES


def a_global_element(row, chunk, k, k0, elem_bytes: int):
    """Element offset, from the block's first A row, of A chunk (row, chunk) of the k-tile
    starting at element k0 of a row-major [M, k] matrix."""
    return row * k + k0 + chunk * (CHUNK_BYTES // elem_bytes)


def chunk_k_block(kt_block0, chunk):
    """k-block index of a chunk of a k-tile whose first k-block is kt_block0."""
    return kt_block0 + chunk // chunks_per_k_block()


# --- LDS -> registers (A) and global -> registers (B) ---------------------------------------


def operand_chunks(mma: str) -> int:
    """16-byte chunks of a lane's K run per k-block (1 on wave64, 2 on wave32)."""
    return lane_run(mma) * 2 // CHUNK_BYTES


def operand_row(rep, lane):
    """Row (of A's tile, or of a wave's B rows) whose K run a lane feeds MMA repeat rep."""
    return rep * MMA_MN + lane % MMA_MN


def operand_chunk(kb, lane, piece: int, mma: str):
    """Chunk of the k-tile row holding piece `piece` of a lane's K run in k-block kb."""
    return kb * chunks_per_k_block() + (lane // MMA_MN) * operand_chunks(mma) + piece


def mx_run_chunk(first_kb, lane, piece: int, kb_per_mma: int):
    """Chunk of the k-tile row holding piece `piece` of a lane's K run in the MMA call at
    k-block first_kb, where the run must be one 32-element MX block (it shares one E8M0
    scale): lane group g = lane // 16 takes the g-th run of kb_per_mma consecutive chunks
    (fp4: one 16-byte chunk of 32 elements; fp8: two chunks of 16)."""
    return first_kb * chunks_per_k_block() + (lane // MMA_MN) * kb_per_mma + piece


# --- MX scales: one E8M0 byte per 32 elements of K, shuffled by MMA call ---------------------
# A 16x16x128 scaled MFMA call c covers K elements [128 c, 128 c + 128): lane group g (lane //
# 16) holds block 4 c + g and takes its scale from the lane's scale register, byte op_sel. The
# shuffled layout stores a row's blocks in groups of 16 (four calls): byte 4 g + c % 4 of
# group c // 4 holds block 4 c + g. A lane's scales for calls c0 .. c0 + n - 1 (n dividing 4,
# c0 a multiple of n) are then n consecutive bytes: one load per k-tile, byte j for call j.
MX_BLOCK = 32
MX_BLOCKS_PER_CALL = 4
MX_GROUP_BYTES = 16


def mx_scale_groups(k_elems):
    """Groups of 16 scale bytes per row of a K-element row (the last one padded)."""
    blocks = k_elems // MX_BLOCK
    return (blocks + MX_GROUP_BYTES - 1) // MX_GROUP_BYTES


def mx_scale_byte(row, first_call, lane, row_bytes):
    """Byte offset of the scale of lane group lane // 16 for MMA call first_call, in row
    `row` of the shuffled scales of row_bytes bytes per row."""
    group = first_call // MX_BLOCKS_PER_CALL
    return (
        row * row_bytes
        + group * MX_GROUP_BYTES
        + (lane // MMA_MN) * MX_BLOCKS_PER_CALL
        + first_call % MX_BLOCKS_PER_CALL
    )


def mx_shuffled_position(block):
    """(group, byte in the group) of scale block `block` of a row in the shuffled layout."""
    call, lane_group = block // MX_BLOCKS_PER_CALL, block % MX_BLOCKS_PER_CALL
    return call // MX_BLOCKS_PER_CALL, lane_group * MX_BLOCKS_PER_CALL + call % MX_BLOCKS_PER_CALL


def b_global_element(row, chunk, k, k0, elem_bytes: int):
    """Element offset, from the wave's first B row, of a lane's 8-element (16-byte) piece."""
    return row * k + k0 + chunk * (CHUNK_BYTES // elem_bytes)


def shuffled_element(row, kk, k):
    """Element offset, from the block's first row, of W[row, kk..kk+16) in a weight
    preshuffled as [N / 16, K / 16, 16, 16] (the block starts at a multiple of 16 rows)."""
    group = (row // 16) * (k // 16) + kk // 16
    return group * 256 + (row % 16) * 16 + kk % 16


# --- the epilogue: accumulators -> LDS -> 16-byte stores -------------------------------------


def acc_rows_per_lane(mma: str) -> int:
    """Accumulator elements per lane per 16x16 tile (4 for MFMA, 8 for WMMA)."""
    return MMA_MN * MMA_MN // WAVE_SIZE[mma]


def acc_row(lane, e, mma: str):
    """Row inside a 16x16 C tile held by accumulator element e of a lane."""
    return (lane // MMA_MN) * acc_rows_per_lane(mma) + e


def acc_col(lane):
    """Column inside a 16x16 C tile held by a lane."""
    return lane % MMA_MN


# Each row of a wave's staging area is padded by one chunk: rows 4 (MFMA) or 8 (WMMA) apart,
# written in one cycle, then fall on different banks.
def out_pitch(tile_n: int, out_bytes: int) -> int:
    return wave_cols(tile_n) * out_bytes + CHUNK_BYTES


def out_stage_bytes(tile_n: int, out_bytes: int) -> int:
    """LDS bytes of the epilogue: 16 rows of C per wave at a time."""
    return WAVES_PER_BLOCK * MMA_MN * out_pitch(tile_n, out_bytes)


def out_write_byte(wave, rep_n, lane, e, tile_n: int, out_bytes: int, mma: str):
    """Where accumulator element e of MMA tile (., rep_n) goes in the wave's staging area."""
    row = acc_row(lane, e, mma)
    col = rep_n * MMA_MN + acc_col(lane)
    base = wave * MMA_MN * out_pitch(tile_n, out_bytes)
    return base + row * out_pitch(tile_n, out_bytes) + col * out_bytes


def out_lanes_per_row(tile_n: int, out_bytes: int) -> int:
    return wave_cols(tile_n) * out_bytes // CHUNK_BYTES


def out_store_passes(tile_n: int, out_bytes: int, mma: str) -> int:
    """16-byte stores each lane issues per 16 rows of C."""
    chunks = MMA_MN * out_lanes_per_row(tile_n, out_bytes)
    return (chunks + WAVE_SIZE[mma] - 1) // WAVE_SIZE[mma]


def out_read_coord(store_pass, lane, tile_n: int, out_bytes: int, mma: str):
    """(row in the 16, first column, real) of the 16-byte run a lane stores in a pass."""
    q = store_pass * WAVE_SIZE[mma] + lane
    per_row = out_lanes_per_row(tile_n, out_bytes)
    runs = MMA_MN * per_row
    real = q < runs
    # An idle lane (not real) still reads, and its value is dropped: it reads a run of its own
    # wave's staging area, never the next wave's, which that wave may be writing.
    q = q % runs
    return q // per_row, (q % per_row) * (CHUNK_BYTES // out_bytes), real


def out_read_byte(wave, row, col, tile_n: int, out_bytes: int):
    return (
        wave * MMA_MN * out_pitch(tile_n, out_bytes)
        + row * out_pitch(tile_n, out_bytes)
        + (col * out_bytes)
    )


def c_offset(row, col, n):
    """Element offset of C[row, col] in a row-major [M, N] matrix."""
    return row * n + col


def workspace_offset(split, row, col, m, n):
    """Element offset of workspace[split, row, col] in a contiguous [split_k, M, N] tensor."""
    return (split * m + row) * n + col


# --- budgets ---------------------------------------------------------------------------------


def lds_bytes(tile_m: int, tile_n: int, tile_k: int, elem_bytes: int, out_bytes: int, mma: str):
    """LDS one block allocates: the A stage (with the idle copy slots of small tiles) and,
    reusing it, the epilogue's staging area."""
    stage = max(
        a_stage_bytes(tile_m, tile_k, elem_bytes),
        a_copy_passes(tile_m, tile_k, elem_bytes, mma) * threads(mma) * CHUNK_BYTES,
    )
    return max(stage, out_stage_bytes(tile_n, out_bytes))


def estimated_vgprs(tile_m: int, tile_n: int, tile_k: int, elem_bytes: int, mma: str) -> int:
    """Registers a lane holds in the main loop, as the compiled kernels hold them: the
    accumulators, the current and the next k-tile's B runs, the next k-tile's A copy, one
    k-block's A operands of every repeat, and one offset register per load.

    An estimate: kernel_profile.py reports the compiled counts (gfx942 128x128x64: 152
    estimated, 164 compiled; 256x256x32: 376 and 348; 256x128x64: 268 and 256)."""
    reps_m, reps_n = mma_repeats(tile_m, tile_n)
    words = CHUNK_BYTES // 4
    blocks = tile_k // k_block(elem_bytes)
    passes = a_copy_passes(tile_m, tile_k, elem_bytes, mma)
    b_loads = reps_n * blocks * operand_chunks(mma)
    accs = reps_m * reps_n * acc_rows_per_lane(mma)
    a_ops = reps_m * operand_chunks(mma) * words
    return accs + 2 * b_loads * words + passes * words + a_ops + passes + b_loads


# Registers per lane: 512 on gfx942/gfx950 (VGPRs and AGPRs together); LLVM allocates up to
# 1024 for gfx1250 (a 798-register WMMA kernel compiled there without spilling).
LANE_REGISTERS = {"mfma": 512, "wmma": 1024}
# The share of them a tile's estimate may take: the rest is the estimate's error and the
# scheduler's room (gfx942 256x256x64, estimated at 432, spilled).
REGISTER_BUDGET = 0.78
MMA_ARCHS = {"mfma": ("gfx942", "gfx950"), "wmma": ("gfx1250",)}


def budget_problem(tile_m, tile_n, tile_k, elem_bytes: int, out_bytes: int, mma: str,
                   extra_lds: int = 0, extra_vgprs: int = 0):  # fmt: skip
    """Why a tile cannot run on every arch of its MMA flavour (LDS or registers), or None;
    extra_lds and extra_vgprs are what a kernel keeps beside the main loop's."""
    lds = lds_bytes(tile_m, tile_n, tile_k, elem_bytes, out_bytes, mma) + extra_lds
    for arch in MMA_ARCHS[mma]:
        if lds > LDS_BYTES[arch]:
            return f"needs {lds} bytes of LDS per block, {arch} has {LDS_BYTES[arch]}"
    vgprs = estimated_vgprs(tile_m, tile_n, tile_k, elem_bytes, mma) + extra_vgprs
    budget = int(LANE_REGISTERS[mma] * REGISTER_BUDGET)
    if vgprs > budget:
        return (
            f"needs about {vgprs} VGPRs per lane (estimate), over the budget of {budget} of "
            f"the {LANE_REGISTERS[mma]} a lane has"
        )
    return None
