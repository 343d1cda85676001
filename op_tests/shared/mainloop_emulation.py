"""A CPU emulation of one GEMM work-group running the shared main loop (aiter/ops/shared/
mainloop.py), phase by phase, from the same index functions the kernels call.

Every thread of the block does what the kernel's code does, in the kernel's order; the LDS is a
byte-addressed memory that records, per phase (barrier to barrier), which wave read and wrote
each byte, and, per LDS instruction, how many cycles its lanes need under the bank model:

- 32 banks of 4 bytes; a 16-byte access (b128) is served eight lanes per cycle, an 8-byte
  access sixteen, a 4-byte or narrower access thirty-two;
- in one cycle, lanes that touch the same bank at different 4-byte words conflict; the cycles
  a group needs are the most distinct words any bank holds for it (a word several lanes touch
  counts once: a broadcast).

This is a model of the LDS, stated here so the counts it gives can be read; the GPU's own
counters are the truth and nothing here ran on one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from aiter.ops.shared import mainloop_index as mx


@dataclass
class AccessStats:
    instructions: int = 0
    cycles: int = 0
    ideal_cycles: int = 0

    @property
    def extra_cycles(self) -> int:
        return self.cycles - self.ideal_cycles


@dataclass
class Lds:
    """Byte-addressed LDS holding one value per element start address."""

    nbytes: int
    values: dict[int, float] = field(default_factory=dict)
    phase: int = 0
    readers: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    writers: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    races: list[str] = field(default_factory=list)
    stats: dict[str, AccessStats] = field(default_factory=lambda: defaultdict(AccessStats))

    def barrier(self) -> None:
        for byte in set(self.readers) | set(self.writers):
            writers, readers = self.writers.get(byte, set()), self.readers.get(byte, set())
            if len(writers) > 1 or (writers and readers - writers):
                self.races.append(
                    f"phase {self.phase}: LDS byte {byte} written by waves {sorted(writers)}"
                    f" and read by waves {sorted(readers)}"
                )
        self.readers.clear()
        self.writers.clear()
        self.phase += 1

    def _touch(self, log, wave: int, byte: int, width: int) -> None:
        if byte < 0 or byte + width > self.nbytes:
            raise AssertionError(f"LDS access [{byte}, {byte + width}) outside {self.nbytes} bytes")
        for b in range(byte, byte + width):
            log[b].add(wave)

    def instruction(self, kind: str, wave: int, lane_bytes: list[int | None], width: int):
        """Account one wave-wide LDS instruction: lane_bytes[lane] is the lane's first byte, or
        None for a lane that takes no part."""
        lanes_per_cycle = {16: 8, 8: 16}.get(width, 32)
        stats = self.stats[kind]
        stats.instructions += 1
        active = [(lane, b) for lane, b in enumerate(lane_bytes) if b is not None]
        for start in range(0, len(lane_bytes), lanes_per_cycle):
            group = [b for lane, b in active if start <= lane < start + lanes_per_cycle]
            if not group:
                continue
            words_per_bank: dict[int, set[int]] = defaultdict(set)
            for byte in group:
                for word in range(byte // mx.BANK_BYTES, (byte + width - 1) // mx.BANK_BYTES + 1):
                    words_per_bank[word % mx.LDS_BANKS].add(word)
            stats.cycles += max(len(words) for words in words_per_bank.values())
            stats.ideal_cycles += 1
        for _, byte in active:
            self._touch(self.writers if kind.endswith("write") else self.readers, wave, byte, width)

    def store(self, wave: int, byte: int, values, elem_bytes: int) -> None:
        for i, value in enumerate(values):
            self.values[byte + i * elem_bytes] = value

    def load(self, byte: int, count: int, elem_bytes: int) -> list[float]:
        return [self.values[byte + i * elem_bytes] for i in range(count)]


def _buffer_load(flat: torch.Tensor, base: int, limit: int, valid: bool, element: int, count: int):
    """What a buffer load of `count` elements returns: zeros out of range, as the hardware."""
    if not valid or element < 0 or element + count > limit:
        return [0.0] * count
    return flat[base + element : base + element + count].tolist()


_ATOMS: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _mma_atom(mma: str, mma_k: int):
    """Flat index, in a [16, mma_k] operand tile, of each lane's operand value ([wsz, per
    lane]), and flat index in the [16, 16] C tile of each lane's accumulator element."""
    if (mma, mma_k) not in _ATOMS:
        wsz = mx.WAVE_SIZE[mma]
        per_lane = 16 * mma_k // wsz
        operand = torch.tensor(
            [[(lane % 16) * mma_k + (lane // 16) * per_lane + v for v in range(per_lane)]
             for lane in range(wsz)]
        )  # fmt: skip
        rows = mx.acc_rows_per_lane(mma)
        c = torch.tensor(
            [[mx.acc_row(lane, e, mma) * 16 + mx.acc_col(lane) for e in range(rows)]
             for lane in range(wsz)]
        )  # fmt: skip
        _ATOMS[(mma, mma_k)] = (operand, c, torch.arange(wsz))
    return _ATOMS[(mma, mma_k)]


def _mma(acc, a_runs, b_runs, mma: str, mma_k: int):
    """acc[lane][e] += one k-block of the lanes' runs, as the kernel's MMA steps do."""
    wsz = mx.WAVE_SIZE[mma]
    operand, c_map, _ = _mma_atom(mma, mma_k)
    per_step = 16 * mma_k // wsz
    a = torch.tensor(a_runs, dtype=torch.float64)
    b = torch.tensor(b_runs, dtype=torch.float64)
    total = torch.tensor(acc, dtype=torch.float64)
    for step in range(a.shape[1] // per_step):
        part = slice(step * per_step, (step + 1) * per_step)
        a_tile = torch.zeros(16 * mma_k, dtype=torch.float64)
        b_tile = torch.zeros(16 * mma_k, dtype=torch.float64)
        a_tile[operand] = a[:, part]
        b_tile[operand] = b[:, part]
        c_tile = a_tile.view(16, mma_k) @ b_tile.view(16, mma_k).T
        total += c_tile.reshape(-1)[c_map]
    for lane, values in enumerate(total.tolist()):
        acc[lane][:] = values


def round_to(value: float, dtype) -> float:
    """value rounded to dtype (through fp32, as the kernels convert)."""
    return float(torch.tensor(value, dtype=torch.float32).to(dtype).double())


def wide_8bit_mma(arch: str, elem_bytes: int, int8: bool) -> bool:
    """Whether the kernels feed an arch's 16x16x128 fp8 MFMA (two k-blocks per call)."""
    return arch == "gfx950" and elem_bytes == 1 and not int8


def mma_k_of(arch: str, elem_bytes: int, int8: bool = False, kb_per_mma: int = 1) -> int:
    """K of the MMA instruction the kernels use on an arch for an operand width (kb_per_mma:
    the k-blocks one call consumes, mx.k_blocks_per_mma)."""
    if elem_bytes == 1:
        if arch == "gfx950":
            return 64 if int8 else (128 if kb_per_mma == 2 else 32)
        return {"gfx942": 32, "gfx1250": 64}[arch]
    return {"gfx942": 16, "gfx950": 32, "gfx1250": 32}[arch]


class WorkGroup:
    """One work-group of a kernel built on the shared main loop, emulated thread by thread.

    a_flat/b_flat: the operands' elements (float64, flattened). a_rows(r) -> info and
    a_chunk(info, kk) -> (element of a_flat, valid) are the kernel Pipeline's hooks (by
    default a row-major matrix: info = (start of row r, whether it exists)). B is row-major
    [N, K] from element b_base, or preshuffled (b_shuffled); b_rows rows of it exist. int8:
    the operands are int8 (gfx950 has a 16x16x64 MFMA for them, not the 16x16x128 fp8 one).
    """

    def __init__(self, *, mma, arch, tile, elem_bytes, a_flat, a_rows, b_flat, b_base, b_rows,
                 b_shuffled, k, origin, lds_bytes, a_chunk=None, k_tail=False,
                 int8=False):  # fmt: skip
        self.mma, self.tile, self.eb, self.k = mma, tile, elem_bytes, k
        self.wsz = mx.WAVE_SIZE[mma]
        self.nthreads = mx.threads(mma)
        self.reps_m, self.reps_n = mx.mma_repeats(tile.tile_m, tile.tile_n)
        self.blocks = tile.tile_k // mx.k_block(elem_bytes)
        self.kb_per_mma = mx.k_blocks_per_mma(self.blocks, wide_8bit_mma(arch, elem_bytes, int8))
        self.mma_k = mma_k_of(arch, elem_bytes, int8, self.kb_per_mma)
        self.calls = self.blocks // self.kb_per_mma
        self.cpr = mx.chunks_per_row(tile.tile_k, elem_bytes)
        self.passes = mx.a_copy_passes(tile.tile_m, tile.tile_k, elem_bytes, mma)
        self.stage_chunks = mx.a_stage_chunks(tile.tile_m, tile.tile_k, elem_bytes)
        self.per_chunk = mx.CHUNK_BYTES // elem_bytes
        self.pieces = mx.operand_chunks(mma)
        self.a_flat, self.a_rows = a_flat, a_rows
        self.a_chunk = a_chunk or (lambda info, kk: (info[0] + kk, info[1]))
        self.k_tail = k_tail
        self.b_flat, self.b_base, self.b_rows, self.b_shuffled = b_flat, b_base, b_rows, b_shuffled
        self.origin_m, self.origin_n = origin
        self.lds = Lds(lds_bytes)
        rows_per_lane = mx.acc_rows_per_lane(mma)
        self.zero = lambda count: [[[0.0] * rows_per_lane for _ in range(self.wsz)]
                                   for _ in range(count)]  # fmt: skip

    # the main loop, step by step as mainloop.py issues it ------------------------------

    def load_a(self, element: int, valid: bool) -> list[float]:
        """One 16-byte chunk of A's buffer (zeros where not valid)."""
        return _buffer_load(self.a_flat, 0, len(self.a_flat), valid, element, self.per_chunk)

    def load_a_k_tile(self, kb0, kb_end):
        k0 = kb0 * mx.k_block(self.eb)
        a_copy = []
        for tid in range(self.nthreads):
            runs = []
            for p in range(self.passes):
                q = mx.a_copy_chunk(tid, p, self.mma)
                row, chunk = mx.a_copy_coord(q, self.cpr)
                kk = k0 + chunk * self.per_chunk
                element, valid = self.a_chunk(self.a_rows(row), kk)
                valid = valid and q < self.stage_chunks
                valid = valid and mx.chunk_k_block(kb0, chunk) < kb_end
                valid = valid and (not self.k_tail or kk < self.k)
                runs.append(self.load_a(element, valid))
            a_copy.append(runs)
        return a_copy

    def b_rows_of(self, wave: int, lane: int) -> list[tuple[int, bool]]:
        """(row of B, valid) a lane feeds each B repeat with: the block's next tile_n rows."""
        rows = []
        for j in range(self.reps_n):
            row = mx.wave_col0(wave, self.tile.tile_n) + mx.operand_row(j, lane)
            rows.append((row, row < self.b_rows))
        return rows

    def load_b_rows(self, kb0, kb_end):
        """Per thread, one run per B repeat and MMA call (load_b_rows' order)."""
        k0 = kb0 * mx.k_block(self.eb)
        b_runs = []
        for tid in range(self.nthreads):
            lane, wave = tid % self.wsz, tid // self.wsz
            runs = []
            for row, row_valid in self.b_rows_of(wave, lane):
                for first in range(0, self.blocks, self.kb_per_mma):
                    run = []
                    for kb in range(first, first + self.kb_per_mma):
                        valid = row_valid and kb0 + kb < kb_end
                        for piece in range(self.pieces):
                            chunk = mx.operand_chunk(kb, lane, piece, self.mma)
                            kk = k0 + chunk * self.per_chunk
                            if self.b_shuffled:
                                element = mx.shuffled_element(row, kk, self.k)
                            else:
                                element = row * self.k + kk
                            chunk_valid = valid and (not self.k_tail or kk < self.k)
                            limit = self.b_rows * self.k
                            run += _buffer_load(self.b_flat, self.b_base, limit, chunk_valid,
                                                element, self.per_chunk)  # fmt: skip
                    runs.append(run)
            b_runs.append(runs)
        return b_runs

    def load_k_tile(self, kb0, kb_end):
        return self.load_a_k_tile(kb0, kb_end), self.load_b_rows(kb0, kb_end)

    def store_a(self, a_copy):
        tm, tk = self.tile.tile_m, self.tile.tile_k
        for p in range(self.passes):
            for wave in range(mx.WAVES_PER_BLOCK):
                lane_bytes = []
                for lane in range(self.wsz):
                    q = mx.a_copy_chunk(wave * self.wsz + lane, p, self.mma)
                    real, slot, idle = mx.a_copy_slot_byte(q, tm, tk, self.eb)
                    byte = slot if real else idle
                    lane_bytes.append(byte)
                    self.lds.store(wave, byte, a_copy[wave * self.wsz + lane][p], self.eb)
                self.lds.instruction("A write", wave, lane_bytes, mx.CHUNK_BYTES)

    def a_read_offset(self, wave: int) -> int:
        """LDS byte the wave's A operand rows start at (every wave reads the whole stage)."""
        return 0

    def _a_runs(self, wave, rep, kb):
        """Per lane, the A run of the MMA call at k-block kb: its pieces of each k-block."""
        offset = self.a_read_offset(wave)
        a_runs = [[] for _ in range(self.wsz)]
        for block in range(kb, kb + self.kb_per_mma):
            for piece in range(self.pieces):
                lane_bytes = []
                for lane in range(self.wsz):
                    row = mx.operand_row(rep, lane)
                    chunk = mx.operand_chunk(block, lane, piece, self.mma)
                    lane_bytes.append(offset + mx.a_lds_byte(row, chunk, self.cpr))
                self.lds.instruction("A read", wave, lane_bytes, mx.CHUNK_BYTES)
                for lane, byte in enumerate(lane_bytes):
                    a_runs[lane] += self.lds.load(byte, self.per_chunk, self.eb)
        return a_runs

    def _b_lanes(self, b_runs, wave, rep, kb):
        call = rep * self.calls + kb // self.kb_per_mma
        return [b_runs[wave * self.wsz + lane][call] for lane in range(self.wsz)]

    def mma_calls(self):
        return range(0, self.blocks, self.kb_per_mma)

    def mma_k_tile_rep(self, b_runs, wave, rep, tiles):
        for kb in self.mma_calls():
            a_runs = self._a_runs(wave, rep, kb)
            for j in range(self.reps_n):
                _mma(tiles[j], a_runs, self._b_lanes(b_runs, wave, j, kb), self.mma, self.mma_k)

    def mma_k_tile(self, b_runs, accs, reps_n=None):
        """accs[wave][i * reps_n + j] += A repeat i x B repeat j (reps_n: mma_k_tile_wide's)."""
        reps_n = reps_n or self.reps_n
        for wave in range(mx.WAVES_PER_BLOCK):
            for kb in self.mma_calls():
                for i in range(self.reps_m):
                    a_runs = self._a_runs(wave, i, kb)
                    for j in range(reps_n):
                        _mma(accs[wave][i * reps_n + j], a_runs,
                             self._b_lanes(b_runs, wave, j, kb), self.mma, self.mma_k)  # fmt: skip

    def main_loop(self, kb_begin, kb_end, k_tile=None, on_store=None):
        """The kernel's loop: prologue load, then per k-tile barrier, A to LDS, barrier, next
        loads, MMAs; `k_tile(wg, b_runs, accs, t)` replaces the plain MMAs (blockscale) and
        `on_store(wg, t)` stages what the kernel stores beside A."""
        accs = [self.zero(self.reps_m * self.reps_n) for _ in range(mx.WAVES_PER_BLOCK)]
        tiles = mx.k_tiles(kb_begin, kb_end, self.blocks)
        step = k_tile or (lambda wg, b_runs, accs, t: wg.mma_k_tile(b_runs, accs))
        a_copy, b_next = self.load_k_tile(kb_begin, kb_end)
        for t in range(1, tiles):
            b_cur = b_next
            self.lds.barrier()
            self.store_a(a_copy)
            if on_store:
                on_store(self, t - 1)
            self.lds.barrier()
            a_copy, b_next = self.load_k_tile(kb_begin + t * self.blocks, kb_end)
            step(self, b_cur, accs, t - 1)
        self.lds.barrier()
        self.store_a(a_copy)
        if on_store:
            on_store(self, tiles - 1)
        self.lds.barrier()
        step(self, b_next, accs, tiles - 1)
        self.lds.barrier()
        return accs

    # the epilogue --------------------------------------------------------------------

    def stage_and_store(self, accs, value_fn, staged_dtype, store):
        """Per A repeat: each wave stages its 16 rows (value_fn(wave, i, j, lane, e, acc) ->
        fp32, then cast to staged_dtype), reads them back as 16-byte runs and calls
        store(row, col, values) with block-relative coordinates."""
        tn = self.tile.tile_n
        ob = torch.empty((), dtype=staged_dtype).element_size()
        vec = mx.CHUNK_BYTES // ob
        for wave in range(mx.WAVES_PER_BLOCK):
            col0 = mx.wave_col0(wave, tn)
            for i in range(self.reps_m):
                for j in range(self.reps_n):
                    for e in range(mx.acc_rows_per_lane(self.mma)):
                        lane_bytes = []
                        for lane in range(self.wsz):
                            byte = mx.out_write_byte(wave, j, lane, e, tn, ob, self.mma)
                            acc = accs[wave][i * self.reps_n + j][lane][e]
                            value = value_fn(wave, i, j, lane, e, round_to(acc, torch.float32))
                            self.lds.store(wave, byte, [round_to(value, staged_dtype)], ob)
                            lane_bytes.append(byte)
                        self.lds.instruction("C write", wave, lane_bytes, ob)
                for store_pass in range(mx.out_store_passes(tn, ob, self.mma)):
                    lane_bytes = []
                    for lane in range(self.wsz):
                        row16, col, real = mx.out_read_coord(store_pass, lane, tn, ob, self.mma)
                        byte = mx.out_read_byte(wave, row16, col, tn, ob)
                        lane_bytes.append(byte if real else None)
                        if real:
                            store(i * 16 + row16, col0 + col, self.lds.load(byte, vec, ob))
                    self.lds.instruction("C read", wave, lane_bytes, mx.CHUNK_BYTES)

    def lane_col(self, wave, j, lane):
        return mx.wave_col0(wave, self.tile.tile_n) + j * 16 + mx.acc_col(lane)

    def lane_row(self, i, lane, e):
        return i * 16 + mx.acc_row(lane, e, self.mma)


@dataclass
class Emulation:
    out: torch.Tensor
    writes: torch.Tensor
    workspace_writes: torch.Tensor | None
    races: list[str]
    stats: dict[str, AccessStats]


def _merge(stats, races, wg: WorkGroup) -> None:
    races += wg.lds.races
    for kind, s in wg.lds.stats.items():
        stats[kind].instructions += s.instructions
        stats[kind].cycles += s.cycles
        stats[kind].ideal_cycles += s.ideal_cycles


def emulate_a16w16(a, b, bias, out_dtype, tile, split_k: int, arch: str) -> Emulation:
    """The a16w16 GEMM (main kernel, then the reduction when split_k > 1), every work-group
    emulated thread by thread and phase by phase."""
    m, k = a.shape
    n = b.shape[0]
    eb = a.element_size()
    mma = "wmma" if arch == "gfx1250" else "mfma"
    tm, tn = tile.tile_m, tile.tile_n
    af, bf = a.double().reshape(-1), b.double().reshape(-1)
    staged_dtype = out_dtype if split_k == 1 else torch.float32
    ob = torch.empty((), dtype=staged_dtype).element_size()
    dst = torch.zeros((split_k * m * n) if split_k > 1 else (m * n), dtype=torch.float64)
    dst_writes = torch.zeros_like(dst, dtype=torch.int32)
    gx, gy, gz = mx.grid_size(m, n, tm, tn, split_k)
    races: list[str] = []
    stats: dict[str, AccessStats] = defaultdict(AccessStats)
    for split in range(gz):
        for bid_m in range(gy):
            for bid_n in range(gx):
                origin_m, origin_n = mx.block_origin(bid_m, bid_n, tm, tn)
                wg = WorkGroup(
                    mma=mma, arch=arch, tile=tile, elem_bytes=eb, a_flat=af,
                    a_rows=lambda r, o=origin_m: ((o + r) * k, r < m - o),
                    b_flat=bf, b_base=origin_n * k, b_rows=n - origin_n, b_shuffled=False, k=k,
                    origin=(origin_m, origin_n), lds_bytes=mx.lds_bytes(tm, tn, tile.tile_k, eb,
                                                                        ob, mma),
                )  # fmt: skip
                kb_begin, kb_end = mx.split_k_range(split, k // mx.k_block(eb), split_k)
                accs = wg.main_loop(kb_begin, kb_end)

                def value_fn(wave, i, j, lane, e, acc, wg=wg, origin_n=origin_n):
                    col = origin_n + wg.lane_col(wave, j, lane)
                    if bias is not None and split_k == 1:
                        lane_bias = float(bias[col]) if col < n else 0.0
                        return round_to(acc + lane_bias, torch.float32)
                    return acc

                def store(row, col, values, origin_m=origin_m, origin_n=origin_n, split=split):
                    row, col = origin_m + row, origin_n + col
                    for e, value in enumerate(values):
                        if row < m and col + e < n:
                            if split_k > 1:
                                off = mx.workspace_offset(split, row, col + e, m, n)
                            else:
                                off = mx.c_offset(row, col + e, n)
                            dst[off] = value
                            dst_writes[off] += 1

                wg.stage_and_store(accs, value_fn, staged_dtype, store)
                _merge(stats, races, wg)
    if split_k == 1:
        return Emulation(dst.view(m, n).to(out_dtype), dst_writes.view(m, n), None, races, stats)
    out = dst.view(split_k, m, n).to(torch.float32).double().sum(0)
    if bias is not None:
        out = out + bias.double()
    out = out.to(torch.float32).to(out_dtype)
    return Emulation(out, torch.ones(m, n, dtype=torch.int32), dst_writes.view(split_k, m, n),
                     races, stats)  # fmt: skip


def conflict_summary(stats: dict[str, AccessStats]) -> dict[str, str]:
    """Per access kind: instructions, cycles under the model, and the extra cycles conflicts
    cost, as text for a report."""
    return {
        kind: f"{s.instructions} instructions, {s.cycles} cycles ({s.extra_cycles} from conflicts)"
        for kind, s in sorted(stats.items())
    }


def fast_first(cases, fast, ids=None):
    """pytest params of `cases`: the first `fast` (an int), or the cases at the indices `fast`
    (a set), in the inner loop, the rest marked slow (a thread-by-thread emulation of a
    work-group costs seconds; `make test` runs them all)."""
    import pytest

    in_inner_loop = set(range(fast)) if isinstance(fast, int) else set(fast)
    ids = ids or [None] * len(cases)
    return [
        pytest.param(*(case if isinstance(case, tuple) else (case,)), id=ident,
                     marks=() if i in in_inner_loop else pytest.mark.slow)  # fmt: skip
        for i, (case, ident) in enumerate(zip(cases, ids, strict=True))
    ]
