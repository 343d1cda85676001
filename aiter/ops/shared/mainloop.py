"""The GEMM main loop every GEMM-shaped kernel here runs, as FlyDSL building blocks.

Per k-tile of tile_k: A's tile_m x tile_k tile goes through one swizzled LDS stage (the four
waves share it); each wave streams its own B rows straight into registers. The next k-tile's
loads are issued before the current k-tile's MMAs, so their latency hides behind the MMAs:

    a_copy, b_next = load_k_tile(p, kb_begin, kb_end)          # prologue
    for t in range(1, tiles):                                   # the kernel's own loop
        b_cur = b_next
        fx.barrier()                # every wave is done reading the previous k-tile's A
        store_a(p, a_copy)          # waits only on the loads of the previous pass
        fx.barrier()
        a_copy, b_next = load_k_tile(p, kb_begin + t * blocks, kb_end)  # in flight ...
        accs = mma_k_tile(p, b_cur, accs)                       # ... during these MMAs
    (the last k-tile: barrier, store_a, barrier, mma_k_tile)

Loads are buffer loads: a row past M (N) or a k-block past the split's end gets an offset
past the buffer's byte count, and the hardware returns zeros, so nothing is clamped in
software and a partial last k-tile adds nothing. mainloop_index.py holds every index formula.

FlyDSL rewrites runtime loops and dynamic `if`s only inside the kernel function itself, so the
loop lives in each kernel and these helpers hold neither; they are module functions (a method
call inside a loop would make FlyDSL carry its object through the loop).
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.runtime.device import get_rocm_arch

from aiter.ops.shared import mainloop_index as mx


def element_bytes(dtype) -> int:
    return dtype.width // 8


def mma_k(mma: str) -> int:
    """K of the arch's 16-bit MMA: gfx950 has the 16x16x32 MFMA, gfx942 only 16x16x16."""
    if mma == "wmma":
        return 32
    return 32 if get_rocm_arch().startswith("gfx95") else 16


def buffer_rows(ptr, first_row, rows_left, row_elems, elem_bytes: int, tile_rows=None):
    """A buffer pointer at row `first_row` of a row-major matrix, holding the `rows_left` rows
    of `row_elems` elements left there, or only the first `tile_rows` of them.

    With tile_rows (the block's rows; the launcher checks tile_rows x row bytes fits below the
    out-of-range offset) the byte count is 32-bit scalar arithmetic; a 64-bit clamp is a VALU
    min on gfx1250, and a descriptor in VGPRs costs a waterfall loop around every load."""
    base = ptr + fx.Int64(first_row) * fx.Int64(row_elems)
    if tile_rows is not None:
        rows = (rows_left < tile_rows).select(rows_left, fx.Int32(tile_rows))
        rows = (rows > 0).select(rows, fx.Int32(0))
        nbytes = fx.Int32(rows * row_elems * elem_bytes)
        # The count is uniform; saying so keeps the descriptor in SGPRs on every arch.
        nbytes = fx.Int32(rocdl.readfirstlane(fx.Int32.ir_type, nbytes))
        return rocdl.make_buffer_ptr(base, fx.Int64(nbytes))
    nbytes = fx.Int64(rows_left) * fx.Int64(row_elems) * elem_bytes
    nbytes = (nbytes > 0).select(nbytes, fx.Int64(0))
    nbytes = (nbytes < mx.OFFSET_LIMIT).select(nbytes, fx.Int64(mx.OFFSET_LIMIT))
    return rocdl.make_buffer_ptr(base, nbytes)


def load_chunk(buf, valid, element, dtype, elem_bytes: int):
    """16 bytes at `element` of a buffer, or zeros where not `valid`.

    Issued as a raw buffer load of four dwords: LLVM cannot split a 16 x i8 load, and a
    buffer pointer of 1-byte alignment cannot be recast to dwords."""
    byte = valid.select(fx.Int32(element) * elem_bytes, fx.Int32(mx.OUT_OF_RANGE))
    words_ty = fx.Vector.make_type(4, fx.Int32)
    words = rocdl.raw_ptr_buffer_load(words_ty, rocdl.get_buffer_rsrc(buf), byte, fx.Int32(0), 0)
    return fx.Vector(words).bitcast(dtype)


class Pipeline:
    """Everything the main loop's helpers read: the compile-time shape, the thread's place, and
    the operands' buffers and rows. Built once before the loop; the helpers only read it.

    A's source, by default a row-major [M, K] matrix from the block's first row. A kernel that
    gathers A passes `a_rows(r) -> info` (what it needs of block row r, computed once per
    thread, e.g. a token's row start and whether it exists) and `a_chunk(info, kk) ->
    (element, valid)` (the element of A's buffer holding K index kk of that row; an implicit
    GEMM computes a tap address there), with `a_buffer` the buffer pointer they index.
    B: row-major [N, K] from the block's first row, or preshuffled ([N / 16, K / 16, 16, 16],
    b_shuffled). k_tail: K is not a multiple of the k-block, so chunks past K load zeros.
    mx_format ("fp8" or "fp4"): the operands are MX elements as bytes (fp4: two per byte, K
    counted in bytes), multiplied by gfx950's scaled MFMA, each lane's run one 32-element
    block (mx.mx_run_chunk); the kernel's splits then own whole k-tiles.
    """

    def __init__(self, mma: str, tile_m: int, tile_n: int, tile_k: int, a, b, m, n, k, lds,
                 *, b_shuffled: bool = False, k_tail: bool = False, a_rows=None, a_chunk=None,
                 a_buffer=None, b_buffer=None, b_rows_left=None, mx_format=None):  # fmt: skip
        self.mma = mma
        self.dtype = a.dtype
        self.elem_bytes = element_bytes(a.dtype)
        self.mma_k = mma_k(mma) if self.elem_bytes == 2 else 32
        self.tile_m, self.tile_n, self.tile_k = tile_m, tile_n, tile_k
        self.reps_m, self.reps_n = mx.mma_repeats(tile_m, tile_n)
        self.blocks = tile_k // mx.k_block(self.elem_bytes)
        gfx950_8bit = (mma == "mfma" and self.elem_bytes == 1
                       and get_rocm_arch().startswith("gfx95"))  # fmt: skip
        self.int8_k64 = gfx950_8bit and a.dtype == fx.Int8
        self.kb_per_mma = mx.k_blocks_per_mma(self.blocks, gfx950_8bit and not self.int8_k64)
        self.mx_format = mx_format
        if mx_format is not None:
            # One 16x16x128 call: 32 bytes of fp8 per lane (two k-blocks), 16 of fp4 (one).
            self.kb_per_mma = MX_K_BLOCKS_PER_CALL[mx_format]
            self.int8_k64 = False
        self.cpr = mx.chunks_per_row(tile_k, self.elem_bytes)
        self.passes = mx.a_copy_passes(tile_m, tile_k, self.elem_bytes, mma)
        self.stage_chunks = mx.a_stage_chunks(tile_m, tile_k, self.elem_bytes)
        self.idle_threads = self.passes * mx.threads(mma) > self.stage_chunks
        self.b_shuffled = b_shuffled
        self.k_tail = k_tail
        self.k = k
        tid = fx.thread_idx.x
        self.tid = tid
        self.lane = tid % mx.WAVE_SIZE[mma]
        self.wave = tid // mx.WAVE_SIZE[mma]
        self.origin_m, self.origin_n = mx.block_origin(
            fx.block_idx.y, fx.block_idx.x, tile_m, tile_n
        )
        self.rows_m = m - self.origin_m
        self.rows_n = n - self.origin_n if b_rows_left is None else b_rows_left
        if a_rows is None:
            self.a_buf = buffer_rows(
                fx.get_iter(a), self.origin_m, self.rows_m, k, self.elem_bytes, tile_m
            )
            a_rows = lambda r: (r * k, r < self.rows_m)  # noqa: E731
            a_chunk = lambda info, kk: (info[0] + kk, info[1])  # noqa: E731
        else:
            self.a_buf = a_buffer
        self.a_chunk = a_chunk
        # What this thread needs of the rows it copies, once: the same for every k-tile.
        self.copy_rows = []
        for copy_pass in range_constexpr(self.passes):
            q = mx.a_copy_chunk(tid, copy_pass, mma)
            row, chunk = mx.a_copy_coord(q, self.cpr)
            self.copy_rows.append((a_rows(row), chunk, q < self.stage_chunks))
        if b_buffer is None:
            b_buffer = buffer_rows(
                fx.get_iter(b), self.origin_n, self.rows_n, k, self.elem_bytes, tile_n
            )
        self.b_buf = b_buffer
        self.b_row0 = mx.wave_col0(self.wave, tile_n)
        self.lds_a = fx.recast_iter(a.dtype, lds)


def allocate_lds(allocator, tile_m: int, tile_n: int, tile_k: int, in_dtype, out_bytes: int,
                 mma: str):  # fmt: skip
    """The block's LDS from the kernel's one SharedAllocator: the A stage, reused by the
    epilogue."""
    nbytes = mx.lds_bytes(tile_m, tile_n, tile_k, element_bytes(in_dtype), out_bytes, mma)
    storage = allocator.allocate(fx.Array[fx.Uint8, nbytes, mx.CHUNK_BYTES])
    return storage.peek().ptr


def load_k_tile(p: Pipeline, kb0, kb_end):
    """Issue the global loads of the k-tile starting at k-block kb0: this thread's chunks of
    A (for LDS) and this lane's B runs of the block's next tile_n rows. Returns (a_copy,
    b_runs)."""
    rows = []
    for j in range_constexpr(p.reps_n):
        row = p.b_row0 + mx.operand_row(j, p.lane)
        rows.append((row, row < p.rows_n))
    return load_a_k_tile(p, kb0, kb_end), load_b_rows(p, rows, kb0, kb_end)


def store_a(p: Pipeline, a_copy):
    """Write this thread's A chunks into their swizzled LDS places."""
    for copy_pass in range_constexpr(p.passes):
        q = mx.a_copy_chunk(p.tid, copy_pass, p.mma)
        real, slot, idle_slot = mx.a_copy_slot_byte(q, p.tile_m, p.tile_k, p.elem_bytes)
        if const_expr(p.idle_threads):
            slot = real.select(slot, idle_slot)
        fx.ptr_store(a_copy[copy_pass], p.lds_a + slot // p.elem_bytes)


def _a_operand(p: Pipeline, rep: int, kb: int):
    """A lane's K run of A row repeat `rep` for the MMA call at k-block kb (its
    p.kb_per_mma k-blocks from kb), read from the LDS stage.

    The swizzle repeats every 16 rows (mx.rep_stride_bytes), so every repeat reads at one
    per-lane address plus a constant: one address register, immediate offsets."""
    row = mx.operand_row(0, p.lane)
    vec = fx.Vector.make_type(mx.CHUNK_BYTES // p.elem_bytes, p.dtype)
    pieces = []
    for _, chunk in _run_chunks(p, kb):
        byte = mx.a_lds_byte(row, chunk, p.cpr) + rep * mx.rep_stride_bytes(p.cpr)
        pieces.append(fx.ptr_load(p.lds_a + byte // p.elem_bytes, result_type=vec))
    return _join(pieces, p.elem_bytes)


def run_pieces(p: Pipeline) -> int:
    """16-byte pieces of a lane's K run per MMA call (its LDS reads of A per call)."""
    if const_expr(p.mx_format is not None):
        return p.kb_per_mma
    return mx.operand_chunks(p.mma) * p.kb_per_mma


def _run_chunks(p: Pipeline, first: int):
    """(k-block, chunk of the k-tile row) of each 16-byte piece of a lane's K run for the MMA
    call at k-block `first`, in the run's order. An MX run is one scale block; it lies in the
    call's k-blocks, which the kernel's k-tile-aligned splits load or skip together."""
    if const_expr(p.mx_format is not None):
        return [(first, mx.mx_run_chunk(first, p.lane, piece, p.kb_per_mma))
                for piece in range_constexpr(p.kb_per_mma)]  # fmt: skip
    return [
        (block, mx.operand_chunk(block, p.lane, piece, p.mma))
        for block in range_constexpr(first, first + p.kb_per_mma)
        for piece in range_constexpr(mx.operand_chunks(p.mma))
    ]


def _join(pieces, elem_bytes: int):
    """One vector of the 16-byte pieces' elements in order (a power of two of them)."""
    length = mx.CHUNK_BYTES // elem_bytes
    while len(pieces) > 1:
        pieces = [pieces[i].shuffle(pieces[i + 1], list(range(2 * length)))
                  for i in range(0, len(pieces), 2)]  # fmt: skip
        length *= 2
    return pieces[0]


def _b_operand(p: Pipeline, b_runs, rep: int, kb: int):
    """A lane's K run of B repeat `rep` for the MMA call at k-block kb (load_b_rows' order)."""
    return b_runs[rep * len(mma_calls(p)) + kb // p.kb_per_mma]


def _sub_vector(vec, start: int, length: int):
    return vec.shuffle(vec, [start + i for i in range(length)])


def acc_dtype(p: Pipeline):
    """int8 accumulates exactly in i32; every other input (MX bytes included) in fp32."""
    return fx.Int32 if const_expr(p.dtype == fx.Int8 and p.mx_format is None) else fx.Float32


def mma_16bit(p: Pipeline, a_run, b_run, acc):
    """acc += one k-block of a lane's 16-bit runs: two 16x16x16 MFMAs on gfx942, one
    16x16x32 MFMA on gfx950, one 16x16x32 WMMA on gfx1250."""
    bf16 = p.dtype == fx.BFloat16
    if const_expr(p.mma == "wmma"):
        op = rocdl.wmma_f32_16x16x32_bf16 if bf16 else rocdl.wmma_f32_16x16x32_f16
        acc_ty = fx.Vector.make_type(8, fx.Float32)
        return fx.Vector(op(acc_ty, a_run.ir_value(), b_run.ir_value(), acc.ir_value()).result)
    acc_ty = fx.Vector.make_type(4, fx.Float32)
    if const_expr(p.mma_k == 32):
        if const_expr(bf16):
            res = rocdl.mfma_f32_16x16x32_bf16(acc_ty, [a_run, b_run, acc])
        else:
            res = rocdl.mfma_f32_16x16x32_f16(acc_ty, [a_run, b_run, acc])
        return fx.Vector(res)
    for step in range_constexpr(2):
        a4 = _sub_vector(a_run, 4 * step, 4)
        b4 = _sub_vector(b_run, 4 * step, 4)
        if const_expr(bf16):
            res = rocdl.mfma_f32_16x16x16bf16_1k(
                acc_ty, [a4.bitcast(fx.Int16), b4.bitcast(fx.Int16), acc]
            )
        else:
            res = rocdl.mfma_f32_16x16x16f16(acc_ty, [a4, b4, acc])
        acc = fx.Vector(res)
    return acc


# The scaled fp8 MFMA's E8M0 scale of 1.0 in every byte: the kernels scale after the MMAs.
UNIT_SCALES = 0x7F7F7F7F


def mma_8bit(p: Pipeline, a_run, b_run, acc):
    """acc += a lane's 8-bit runs of p.kb_per_mma k-blocks. gfx942: two 16x16x32 MFMAs (fp8
    or int8) per k-block. gfx950: one 16x16x64 int8 MFMA per k-block; one 16x16x128 fp8 MFMA
    per two k-blocks (two 16x16x32 where a k-tile has one). gfx1250: one 16x16x64 WMMA."""
    is_int = p.dtype == fx.Int8
    if const_expr(p.mma == "wmma"):
        acc_ty = fx.Vector.make_type(8, acc_dtype(p))
        a32 = a_run.bitcast(fx.Int32).ir_value()
        b32 = b_run.bitcast(fx.Int32).ir_value()
        if const_expr(is_int):
            op = rocdl.wmma_i32_16x16x64_iu8(
                acc_ty, a32, b32, acc.ir_value(), signA=True, signB=True
            )
        else:
            op = rocdl.wmma_f32_16x16x64_fp8_fp8(acc_ty, a32, b32, acc.ir_value())
        return fx.Vector(op.result)
    acc_ty = fx.Vector.make_type(4, acc_dtype(p))
    if const_expr(p.kb_per_mma == 2):
        # cbsz = blgp = 0: both operands fp8 E4M3; scales of 1.0 from lane 0 (op_sel 0).
        unit = fx.Int32(UNIT_SCALES)
        operands = [a_run.bitcast(fx.Int32), b_run.bitcast(fx.Int32), acc, 0, 0, 0, unit, 0, unit]
        return fx.Vector(rocdl.mfma_scale_f32_16x16x128_f8f6f4(acc_ty, operands))
    if const_expr(p.int8_k64):
        a, b = a_run.bitcast(fx.Int32).ir_value(), b_run.bitcast(fx.Int32).ir_value()
        no_broadcast = ir.Attribute.parse("#rocdl<mfma_perm_b none>")  # blgp = 0
        op = rocdl.mfma_i32_16x16x64_i8(acc_ty, a, b, acc.ir_value(), 0, 0, no_broadcast)
        return fx.Vector(op.result)
    a64 = a_run.bitcast(fx.Int64)
    b64 = b_run.bitcast(fx.Int64)
    for step in range_constexpr(2):
        if const_expr(is_int):
            res = rocdl.mfma_i32_16x16x32_i8(acc_ty, [a64[step], b64[step], acc])
        else:
            res = rocdl.mfma_f32_16x16x32_fp8_fp8(acc_ty, [a64[step], b64[step], acc])
        acc = fx.Vector(res)
    return acc


# Microscaled (MX) operands: the scaled MFMA's format codes (cbsz for A, blgp for B) and the
# k-blocks (64 bytes of a row) one 16x16x128 call consumes.
MX_FORMAT_CODES = {"fp8": 0, "fp4": 4}
MX_K_BLOCKS_PER_CALL = {"fp8": 2, "fp4": 1}


def mma_mx(p: Pipeline, a_run, b_run, acc, a_scale, b_scale, byte: int):
    """acc += one 16x16x128 scaled MFMA of MX runs: A and B elements in p.mx_format, each
    lane's 32-element block times 2 ** (byte `byte` of its scale register - 127)."""
    acc_ty = fx.Vector.make_type(4, fx.Float32)
    fmt = MX_FORMAT_CODES[p.mx_format]
    a, b = a_run.bitcast(fx.Int32), b_run.bitcast(fx.Int32)
    operands = [a, b, acc, fmt, fmt, byte, a_scale, byte, b_scale]
    return fx.Vector(rocdl.mfma_scale_f32_16x16x128_f8f6f4(acc_ty, operands))


def mx_calls_per_k_tile(p: Pipeline) -> int:
    return p.blocks // p.kb_per_mma


def load_mx_scales(p: Pipeline, a_scales, b_scales, row_bytes, kb0, kb_end):
    """This lane's E8M0 scales of the k-tile starting at k-block kb0 (a multiple of the
    k-tile), one register per A repeat then per B repeat: the tile's calls' bytes, loaded as
    one 1-, 2- or 4-byte load each. a_scales and b_scales are buffers of the shuffled scales
    from the block's first row (rows past M or N read zeros), row_bytes bytes per row."""
    calls = mx_calls_per_k_tile(p)
    first_call = (kb0 // p.blocks) * calls
    live = kb0 < kb_end
    width = {1: fx.Uint8, 2: fx.Uint16, 4: fx.Int32}[calls]
    regs = []
    rows = [(a_scales, mx.operand_row(i, p.lane)) for i in range_constexpr(p.reps_m)]
    rows += [(b_scales, p.b_row0 + mx.operand_row(j, p.lane)) for j in range_constexpr(p.reps_n)]
    for buf, row in rows:
        byte = mx.mx_scale_byte(row, first_call, p.lane, row_bytes)
        byte = live.select(fx.Int32(byte), fx.Int32(mx.OUT_OF_RANGE))
        raw = rocdl.raw_ptr_buffer_load(width.ir_type, rocdl.get_buffer_rsrc(buf), byte,
                                        fx.Int32(0), 0)  # fmt: skip
        regs.append(width(raw).to(fx.Int32))  # zero-extended: bytes past the calls are 0
    return regs


def mma_k_tile_mx(p: Pipeline, b_runs, accs, scales):
    """Every scaled MFMA of one k-tile (scales from load_mx_scales), A from the LDS stage."""
    accs = list(accs)
    for call, kb in enumerate(mma_calls(p)):
        for i in range_constexpr(p.reps_m):
            a_run = _a_operand(p, i, kb)
            for j in range_constexpr(p.reps_n):
                t = i * p.reps_n + j
                b_run = _b_operand(p, b_runs, j, kb)
                b_scale = scales[p.reps_m + j]
                accs[t] = mma_mx(p, a_run, b_run, accs[t], scales[i], b_scale, call)
    interleave_operand_reads(p, p.reps_m, p.reps_n)
    return accs


def mma_calls(p: Pipeline):
    """The first k-block of each MMA call of a k-tile."""
    return range_constexpr(0, p.blocks, p.kb_per_mma)


def mma_k_tile(p: Pipeline, b_runs, accs):
    """Every MMA of one k-tile: A operands from the LDS stage, B from this lane's runs.
    accs[i * reps_n + j] is the tile of A repeat i and B repeat j."""
    accs = mma_k_tile_wide(p, b_runs, accs, p.reps_n)
    interleave_operand_reads(p, p.reps_m, p.reps_n)
    return accs


def mma_instructions(p: Pipeline) -> int:
    """MMA instructions per 16x16 tile per MMA call: one WMMA; on MFMA, two 16x16x32 8-bit
    MFMAs per 16-byte run, or one (gfx950's int8 16x16x64 and fp8 16x16x128); for 16 bits,
    two 16x16x16 (gfx942) or one 16x16x32 (gfx950)."""
    if const_expr(p.mma == "wmma"):
        return 1
    if const_expr(p.elem_bytes == 1):
        wide = p.kb_per_mma == 2 or p.int8_k64 or p.mx_format is not None
        return 1 if const_expr(wide) else 2
    return 1 if const_expr(p.mma_k == 32) else 2


def interleave_operand_reads(p: Pipeline, reps_m: int, reps_n: int):
    """Scheduling hint: each A operand's LDS reads, then the MMAs that use it, in turn, for
    reps_m A repeats of a k-tile. The scheduler otherwise hoists every read of the k-tile
    ahead of the first MMA, which holds all their registers at once."""
    reads = run_pieces(p)
    for _ in range_constexpr(reps_m * len(mma_calls(p))):
        rocdl.sched_group_barrier(rocdl.mask_dsrd, reads, 0)
        rocdl.sched_group_barrier(rocdl.mask_mfma, reps_n * mma_instructions(p), 0)


def mma_k_tile_rep(p: Pipeline, b_runs, rep_m: int, tiles):
    """The MMAs of one k-tile for A repeat rep_m only; tiles[j] accumulates B repeat j. A
    kernel that scales each k-tile's partial (blockscale) keeps one repeat's partial live."""
    mma_fn = mma_16bit if const_expr(p.elem_bytes == 2) else mma_8bit
    tiles = list(tiles)
    for kb in mma_calls(p):
        a_run = _a_operand(p, rep_m, kb)
        for j in range_constexpr(p.reps_n):
            tiles[j] = mma_fn(p, a_run, _b_operand(p, b_runs, j, kb), tiles[j])
    interleave_operand_reads(p, 1, p.reps_n)
    return tiles


def zero_accs(p: Pipeline, dtype=None, count=None):
    zero = fx.Vector.filled(mx.acc_rows_per_lane(p.mma), 0, dtype or acc_dtype(p))
    return [zero for _ in range_constexpr(count or p.reps_m * p.reps_n)]


# --- the epilogue ----------------------------------------------------------------------------


def stage_out_rows(p: Pipeline, tiles, out_ptr, out_dtype):
    """Write the wave's 16 rows of C of one A repeat into its staging area, cast to out_dtype;
    tiles[j] is the lane's fp32 accumulator vector of B repeat j (bias or scales applied)."""
    out_bytes = element_bytes(out_dtype)
    for j in range_constexpr(p.reps_n):
        vals = tiles[j].to(out_dtype)
        for e in range_constexpr(mx.acc_rows_per_lane(p.mma)):
            byte = mx.out_write_byte(p.wave, j, p.lane, e, p.tile_n, out_bytes, p.mma)
            fx.ptr_store(vals[e], out_ptr + byte // out_bytes)


def lane_rows(p: Pipeline, rep_m: int):
    """Block-relative rows of C the lane's accumulator elements of A repeat rep_m hold."""
    return [
        rep_m * mx.MMA_MN + mx.acc_row(p.lane, e, p.mma)
        for e in range_constexpr(mx.acc_rows_per_lane(p.mma))
    ]


def lane_col(p: Pipeline, rep_n: int):
    """Block-relative column of C the lane's accumulators of B repeat rep_n hold."""
    return p.b_row0 + rep_n * mx.MMA_MN + mx.acc_col(p.lane)


def staged_runs(p: Pipeline, out_ptr, out_dtype):
    """The 16-byte runs this lane stores for the staged 16 rows: [(values, row in the 16,
    first column in the block, real)]."""
    out_bytes = element_bytes(out_dtype)
    vec = fx.Vector.make_type(mx.CHUNK_BYTES // out_bytes, out_dtype)
    runs = []
    for store_pass in range_constexpr(mx.out_store_passes(p.tile_n, out_bytes, p.mma)):
        row, col, real = mx.out_read_coord(store_pass, p.lane, p.tile_n, out_bytes, p.mma)
        byte = mx.out_read_byte(p.wave, row, col, p.tile_n, out_bytes)
        values = fx.ptr_load(out_ptr + byte // out_bytes, result_type=vec)
        runs.append((values, row, p.b_row0 + col, real))
    return runs


def load_word(buf, valid, element):
    """One 4-byte element of a buffer as fp32, or zero where not `valid` (the hardware's zero:
    nothing waits on the load until its value is used)."""
    byte = valid.select(fx.Int32(element) * 4, fx.Int32(mx.OUT_OF_RANGE))
    word = rocdl.raw_ptr_buffer_load(fx.Int32.ir_type, rocdl.get_buffer_rsrc(buf), byte,
                                     fx.Int32(0), 0)  # fmt: skip
    return fx.Int32(word).bitcast(fx.Float32)


def load_scalar(ptr, valid, element, dtype):
    """One element at ptr + element of a global tensor, or zero where not `valid`.

    A global load (the offset moved to 0 where not valid), not a buffer load: these side
    loads (bias, scales) are few, and on gfx1250 LLVM builds their buffer descriptors in VGPRs
    and wraps every one in a waterfall loop."""
    value = fx.ptr_load(ptr + fx.Int64(valid.select(element, fx.Int32(0))), result_type=dtype)
    return valid.select(value, dtype(0))


def lane_bias(p: Pipeline, bias):
    """This lane's bias per B repeat, in fp32 (a column past N reads zero)."""
    base = fx.get_iter(bias) + fx.Int64(p.origin_n)
    values = []
    for j in range_constexpr(p.reps_n):
        col = lane_col(p, j)
        values.append(load_scalar(base, col < p.rows_n, col, bias.dtype).to(fx.Float32))
    return values


# --- B rows of the kernel's choosing (added for the MoE stages) ------------------------------
# load_k_tile streams the block's next tile_n rows of B. A kernel whose B rows are elsewhere
# (MoE stage 1: the gate and the up rows of its columns, interleaved or apart) loads A with
# load_a_k_tile and its B runs with load_b_rows, then multiplies with mma_k_tile_wide.


def load_a_k_tile(p: Pipeline, kb0, kb_end):
    """The A half of load_k_tile: this thread's chunks of the k-tile starting at k-block kb0,
    for store_a."""
    kb_elems = mx.k_block(p.elem_bytes)
    k0 = kb0 * kb_elems
    per_chunk = mx.CHUNK_BYTES // p.elem_bytes
    a_copy = []
    for info, chunk, real in p.copy_rows:
        kk = k0 + chunk * per_chunk
        element, valid = p.a_chunk(info, kk)
        valid = valid & (mx.chunk_k_block(kb0, chunk) < kb_end)
        if const_expr(p.idle_threads):
            valid = valid & real
        if const_expr(p.k_tail):
            valid = valid & (kk < p.k)
        a_copy.append(load_chunk(p.a_buf, valid, element, p.dtype, p.elem_bytes))
    return a_copy


def load_b_rows(p: Pipeline, rows, kb0, kb_end):
    """This lane's B runs of the k-tile starting at k-block kb0 for B repeats of the kernel's
    choosing: rows[j] = (row of p.b_buf, valid) the lane feeds repeat j with (the row of
    mx.operand_row(j, lane) in the kernel's own numbering). A row not valid loads zeros.
    Returns one run per repeat and MMA call, each joined where it is loaded: a run carried
    through the loop as one vector needs no register copies to feed its MMA."""
    kb_elems = mx.k_block(p.elem_bytes)
    k0 = kb0 * kb_elems
    per_chunk = mx.CHUNK_BYTES // p.elem_bytes
    b_runs = []
    for row, row_valid in rows:
        for first in mma_calls(p):
            pieces = []
            for kb, chunk in _run_chunks(p, first):
                valid = row_valid & (kb0 + kb < kb_end)
                kk = k0 + chunk * per_chunk
                if const_expr(p.b_shuffled):
                    element = mx.shuffled_element(row, kk, p.k)
                else:
                    element = row * p.k + kk
                chunk_valid = valid & (kk < p.k) if const_expr(p.k_tail) else valid
                pieces.append(load_chunk(p.b_buf, chunk_valid, element, p.dtype, p.elem_bytes))
            b_runs.append(_join(pieces, p.elem_bytes))
    return b_runs


def mma_k_tile_wide(p: Pipeline, b_runs, accs, reps_n: int):
    """mma_k_tile over reps_n B repeats (load_b_rows of reps_n rows), each A operand read from
    LDS once for all of them: accs[i * reps_n + j] is the tile of A repeat i and B repeat j."""
    mma_fn = mma_16bit if const_expr(p.elem_bytes == 2) else mma_8bit
    accs = list(accs)
    for kb in mma_calls(p):
        for i in range_constexpr(p.reps_m):
            a_run = _a_operand(p, i, kb)
            for j in range_constexpr(reps_n):
                t = i * reps_n + j
                accs[t] = mma_fn(p, a_run, _b_operand(p, b_runs, j, kb), accs[t])
    return accs
