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


def buffer_rows(ptr, first_row, rows_left, row_elems, elem_bytes: int):
    """A buffer pointer at row `first_row` of a row-major matrix, holding `rows_left` rows of
    `row_elems` elements (capped below the out-of-range offset)."""
    base = ptr + fx.Int64(first_row) * fx.Int64(row_elems)
    nbytes = fx.Int64(rows_left) * fx.Int64(row_elems) * elem_bytes
    nbytes = (nbytes > 0).select(nbytes, fx.Int64(0))
    nbytes = (nbytes < mx.OFFSET_LIMIT).select(nbytes, fx.Int64(mx.OFFSET_LIMIT))
    return rocdl.make_buffer_ptr(base, nbytes)


def load_chunk(buf, valid, element, dtype, elem_bytes: int):
    """16 bytes at `element` of a buffer, or zeros where not `valid`."""
    offset = valid.select(fx.Int32(element), fx.Int32(mx.OUT_OF_RANGE // elem_bytes))
    vec = fx.Vector.make_type(mx.CHUNK_BYTES // elem_bytes, dtype)
    return fx.ptr_load(buf + offset, result_type=vec)


class Pipeline:
    """Everything the main loop's helpers read: compile-time shape and runtime bases.

    Built once before the loop; the helpers only read it.
    """

    def __init__(self, mma: str, tile_m: int, tile_n: int, tile_k: int, a, b, m, n, k, lds):
        self.mma = mma
        self.mma_k = mma_k(mma)
        self.dtype = a.dtype
        self.elem_bytes = element_bytes(a.dtype)
        self.tile_m, self.tile_n, self.tile_k = tile_m, tile_n, tile_k
        self.reps_m, self.reps_n = mx.mma_repeats(tile_m, tile_n)
        self.blocks = tile_k // mx.k_block(self.elem_bytes)
        self.cpr = mx.chunks_per_row(tile_k, self.elem_bytes)
        self.passes = mx.a_copy_passes(tile_m, tile_k, self.elem_bytes, mma)
        self.idle_threads = self.passes * mx.threads(mma) > mx.a_stage_chunks(
            tile_m, tile_k, self.elem_bytes
        )
        self.k = k
        tid = fx.thread_idx.x
        self.tid = tid
        self.lane = tid % mx.WAVE_SIZE[mma]
        self.wave = tid // mx.WAVE_SIZE[mma]
        self.origin_m, self.origin_n = mx.block_origin(
            fx.block_idx.y, fx.block_idx.x, tile_m, tile_n
        )
        self.rows_m = m - self.origin_m
        self.rows_n = n - self.origin_n
        self.a_buf = buffer_rows(fx.get_iter(a), self.origin_m, self.rows_m, k, self.elem_bytes)
        self.b_buf = buffer_rows(fx.get_iter(b), self.origin_n, self.rows_n, k, self.elem_bytes)
        self.b_row0 = mx.wave_col0(self.wave, tile_n)
        self.lds_a = fx.recast_iter(a.dtype, lds)


def allocate_lds(tile_m: int, tile_n: int, tile_k: int, in_dtype, out_bytes: int, mma: str):
    """The block's LDS: the A stage, reused by the epilogue."""
    nbytes = mx.lds_bytes(tile_m, tile_n, tile_k, element_bytes(in_dtype), out_bytes, mma)
    storage = fx.SharedAllocator().allocate(fx.Array[fx.Uint8, nbytes, mx.CHUNK_BYTES])
    return storage.peek().ptr


def load_k_tile(p: Pipeline, kb0, kb_end):
    """Issue the global loads of the k-tile starting at k-block kb0: this thread's chunks of
    A (for LDS) and this lane's B runs. Returns (a_copy, b_runs)."""
    kb_elems = mx.k_block(p.elem_bytes)
    k0 = kb0 * kb_elems
    a_copy = []
    for copy_pass in range_constexpr(p.passes):
        q = mx.a_copy_chunk(p.tid, copy_pass, p.mma)
        row, chunk = mx.a_copy_coord(q, p.cpr)
        valid = (row < p.rows_m) & (mx.chunk_k_block(kb0, chunk) < kb_end)
        if const_expr(p.idle_threads):
            valid = valid & (q < mx.a_stage_chunks(p.tile_m, p.tile_k, p.elem_bytes))
        element = mx.a_global_element(row, chunk, p.k, k0, p.elem_bytes)
        a_copy.append(load_chunk(p.a_buf, valid, element, p.dtype, p.elem_bytes))
    b_runs = []
    pieces = mx.operand_chunks(p.mma)
    for j in range_constexpr(p.reps_n):
        row = p.b_row0 + mx.operand_row(j, p.lane)
        row_valid = row < p.rows_n
        for kb in range_constexpr(p.blocks):
            valid = row_valid & (kb0 + kb < kb_end)
            for piece in range_constexpr(pieces):
                chunk = mx.operand_chunk(kb, p.lane, piece, p.mma)
                element = mx.b_global_element(row, chunk, p.k, k0, p.elem_bytes)
                b_runs.append(load_chunk(p.b_buf, valid, element, p.dtype, p.elem_bytes))
    return a_copy, b_runs


def store_a(p: Pipeline, a_copy):
    """Write this thread's A chunks into their swizzled LDS places."""
    for copy_pass in range_constexpr(p.passes):
        q = mx.a_copy_chunk(p.tid, copy_pass, p.mma)
        real, slot, idle_slot = mx.a_copy_slot_byte(q, p.tile_m, p.tile_k, p.elem_bytes)
        if const_expr(p.idle_threads):
            slot = real.select(slot, idle_slot)
        fx.ptr_store(a_copy[copy_pass], p.lds_a + slot // p.elem_bytes)


def _a_operand(p: Pipeline, rep: int, kb: int):
    """A lane's K run of A row repeat `rep` in k-block kb, read from the LDS stage."""
    row = mx.operand_row(rep, p.lane)
    vec = fx.Vector.make_type(mx.CHUNK_BYTES // p.elem_bytes, p.dtype)
    pieces = []
    for piece in range_constexpr(mx.operand_chunks(p.mma)):
        chunk = mx.operand_chunk(kb, p.lane, piece, p.mma)
        byte = mx.a_lds_byte(row, chunk, p.cpr)
        pieces.append(fx.ptr_load(p.lds_a + byte // p.elem_bytes, result_type=vec))
    if const_expr(len(pieces) == 1):
        return pieces[0]
    return pieces[0].shuffle(pieces[1], list(range(2 * (mx.CHUNK_BYTES // p.elem_bytes))))


def _b_operand(p: Pipeline, b_runs, rep: int, kb: int):
    pieces = mx.operand_chunks(p.mma)
    first = (rep * p.blocks + kb) * pieces
    if const_expr(pieces == 1):
        return b_runs[first]
    run = b_runs[first]
    return run.shuffle(b_runs[first + 1], list(range(2 * (mx.CHUNK_BYTES // p.elem_bytes))))


def _sub_vector(vec, start: int, length: int):
    return vec.shuffle(vec, [start + i for i in range(length)])


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


def mma_k_tile(p: Pipeline, b_runs, accs):
    """Every MMA of one k-tile: A operands from the LDS stage, B from this lane's runs.
    accs[i * reps_n + j] is the tile of A repeat i and B repeat j."""
    accs = list(accs)
    for kb in range_constexpr(p.blocks):
        for i in range_constexpr(p.reps_m):
            a_run = _a_operand(p, i, kb)
            for j in range_constexpr(p.reps_n):
                t = i * p.reps_n + j
                accs[t] = mma_16bit(p, a_run, _b_operand(p, b_runs, j, kb), accs[t])
    return accs


def zero_accs(p: Pipeline):
    zero = fx.Vector.filled(mx.acc_rows_per_lane(p.mma), 0, fx.Float32)
    return [zero for _ in range_constexpr(p.reps_m * p.reps_n)]


# --- the epilogue ----------------------------------------------------------------------------


def stage_out_rows(p: Pipeline, accs, rep_m: int, out_ptr, out_dtype, bias_f32):
    """Write the wave's 16 rows of C of A repeat rep_m (bias added, cast) into its staging
    area; `bias_f32[j]` is the lane's bias for B repeat j, or None."""
    out_bytes = element_bytes(out_dtype)
    for j in range_constexpr(p.reps_n):
        acc = accs[rep_m * p.reps_n + j]
        if const_expr(bias_f32 is not None):
            acc = acc + bias_f32[j]
        vals = acc.to(out_dtype)
        for e in range_constexpr(mx.acc_rows_per_lane(p.mma)):
            byte = mx.out_write_byte(p.wave, j, p.lane, e, p.tile_n, out_bytes, p.mma)
            fx.ptr_store(vals[e], out_ptr + byte // out_bytes)


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


def lane_bias(p: Pipeline, bias, n):
    """This lane's bias per B repeat, in fp32 (a column past N reads zero)."""
    buf = buffer_rows(fx.get_iter(bias), p.origin_n, p.rows_n, 1, element_bytes(bias.dtype))
    values = []
    for j in range_constexpr(p.reps_n):
        col = p.b_row0 + j * mx.MMA_MN + mx.acc_col(p.lane)
        offset = (col < p.rows_n).select(fx.Int32(col), fx.Int32(mx.OUT_OF_RANGE // 4))
        value = fx.ptr_load(buf + offset, result_type=bias.dtype)
        values.append(value.to(fx.Float32))
    return values
