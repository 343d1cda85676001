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


def _mma_atom(mma: str, mma_k: int):
    """[lane][value] -> (row, k) of the A/B operand and (row, col) of C, for one MMA step."""
    wsz = mx.WAVE_SIZE[mma]
    per_lane = 16 * mma_k // wsz
    operand = [
        [(lane % 16, (lane // 16) * per_lane + v) for v in range(per_lane)] for lane in range(wsz)
    ]
    rows = mx.acc_rows_per_lane(mma)
    c = [[(mx.acc_row(lane, e, mma), mx.acc_col(lane)) for e in range(rows)] for lane in range(wsz)]
    return operand, c


def _mma(acc, a_runs, b_runs, mma: str, mma_k: int):
    """acc[lane][e] += one k-block of the lanes' runs, as the kernel's MMA steps do."""
    wsz = mx.WAVE_SIZE[mma]
    operand, c_map = _mma_atom(mma, mma_k)
    per_step = 16 * mma_k // wsz
    run = len(a_runs[0])
    for step in range(run // per_step):
        a_tile = torch.zeros(16, mma_k, dtype=torch.float64)
        b_tile = torch.zeros(16, mma_k, dtype=torch.float64)
        for lane in range(wsz):
            for v, (r, kk) in enumerate(operand[lane]):
                a_tile[r, kk] = a_runs[lane][step * per_step + v]
                b_tile[r, kk] = b_runs[lane][step * per_step + v]
        c_tile = a_tile @ b_tile.T
        for lane in range(wsz):
            for e, (r, col) in enumerate(c_map[lane]):
                acc[lane][e] += float(c_tile[r, col])


@dataclass
class Emulation:
    out: torch.Tensor
    writes: torch.Tensor
    workspace_writes: torch.Tensor | None
    races: list[str]
    stats: dict[str, AccessStats]


def emulate_a16w16(a, b, bias, out_dtype, tile, split_k: int, mma: str, mma_k: int) -> Emulation:
    """The a16w16 GEMM (main kernel, then the reduction when split_k > 1), every work-group
    emulated thread by thread and phase by phase."""
    m, k = a.shape
    n = b.shape[0]
    eb = a.element_size()
    tm, tn = tile.tile_m, tile.tile_n
    af, bf = a.double().reshape(-1), b.double().reshape(-1)
    ws_dtype = torch.float32
    dst_dtype = out_dtype if split_k == 1 else ws_dtype
    ob = torch.empty((), dtype=dst_dtype).element_size()
    dst = torch.zeros((split_k * m * n) if split_k > 1 else (m * n), dtype=torch.float64)
    dst_writes = torch.zeros_like(dst, dtype=torch.int32)
    gx, gy, gz = mx.grid_size(m, n, tm, tn, split_k)
    races: list[str] = []
    stats: dict[str, AccessStats] = defaultdict(AccessStats)
    for split in range(gz):
        for bid_m in range(gy):
            for bid_n in range(gx):
                lds = _work_group(
                    af, bf, bias, dst, dst_writes, (bid_m, bid_n, split), (m, n, k), tile,
                    split_k, mma, mma_k, eb, dst_dtype, ob,
                )  # fmt: skip
                races += lds.races
                for kind, s in lds.stats.items():
                    stats[kind].instructions += s.instructions
                    stats[kind].cycles += s.cycles
                    stats[kind].ideal_cycles += s.ideal_cycles
    if split_k == 1:
        return Emulation(dst.view(m, n).to(out_dtype), dst_writes.view(m, n), None, races, stats)
    out = dst.view(split_k, m, n).to(ws_dtype).double().sum(0)
    if bias is not None:
        out = out + bias.double()
    out = out.to(ws_dtype).to(out_dtype)
    return Emulation(out, torch.ones(m, n, dtype=torch.int32), dst_writes.view(split_k, m, n),
                     races, stats)  # fmt: skip


def _work_group(af, bf, bias, dst, dst_writes, bid, shape, tile, split_k, mma, mma_k, eb,
                dst_dtype, ob) -> Lds:  # fmt: skip
    bid_m, bid_n, split = bid
    m, n, k = shape
    tm, tn, tk = tile.tile_m, tile.tile_n, tile.tile_k
    wsz = mx.WAVE_SIZE[mma]
    nthreads = mx.threads(mma)
    reps_m, reps_n = mx.mma_repeats(tm, tn)
    blocks = tk // mx.k_block(eb)
    cpr = mx.chunks_per_row(tk, eb)
    passes = mx.a_copy_passes(tm, tk, eb, mma)
    stage_chunks = mx.a_stage_chunks(tm, tk, eb)
    per_chunk = mx.CHUNK_BYTES // eb
    pieces = mx.operand_chunks(mma)
    origin_m, origin_n = mx.block_origin(bid_m, bid_n, tm, tn)
    rows_m, rows_n = m - origin_m, n - origin_n
    a_base, b_base = origin_m * k, origin_n * k
    a_limit, b_limit = max(rows_m, 0) * k, max(rows_n, 0) * k
    lds = Lds(mx.lds_bytes(tm, tn, tk, eb, ob, mma))
    kb_begin, kb_end = mx.split_k_range(split, k // mx.k_block(eb), split_k)
    tiles = mx.k_tiles(kb_begin, kb_end, blocks)

    def load_k_tile(kb0):
        k0 = kb0 * mx.k_block(eb)
        a_copy = []
        for tid in range(nthreads):
            runs = []
            for p in range(passes):
                q = mx.a_copy_chunk(tid, p, mma)
                row, chunk = mx.a_copy_coord(q, cpr)
                valid = row < rows_m and mx.chunk_k_block(kb0, chunk) < kb_end and q < stage_chunks
                element = mx.a_global_element(row, chunk, k, k0, eb)
                runs.append(_buffer_load(af, a_base, a_limit, valid, element, per_chunk))
            a_copy.append(runs)
        b_runs = []
        for tid in range(nthreads):
            lane, wave = tid % wsz, tid // wsz
            runs = []
            for j in range(reps_n):
                row = mx.wave_col0(wave, tn) + mx.operand_row(j, lane)
                for kb in range(blocks):
                    valid = row < rows_n and kb0 + kb < kb_end
                    for piece in range(pieces):
                        chunk = mx.operand_chunk(kb, lane, piece, mma)
                        element = mx.b_global_element(row, chunk, k, k0, eb)
                        runs.append(_buffer_load(bf, b_base, b_limit, valid, element, per_chunk))
            b_runs.append(runs)
        return a_copy, b_runs

    def store_a(a_copy):
        for p in range(passes):
            for wave in range(mx.WAVES_PER_BLOCK):
                lane_bytes = []
                for lane in range(wsz):
                    q = mx.a_copy_chunk(wave * wsz + lane, p, mma)
                    real, slot, idle = mx.a_copy_slot_byte(q, tm, tk, eb)
                    byte = slot if real else idle
                    lane_bytes.append(byte)
                    lds.store(wave, byte, a_copy[wave * wsz + lane][p], eb)
                lds.instruction("A write", wave, lane_bytes, mx.CHUNK_BYTES)

    def mma_k_tile(b_runs, accs):
        for wave in range(mx.WAVES_PER_BLOCK):
            for kb in range(blocks):
                for i in range(reps_m):
                    a_runs = []
                    for piece in range(pieces):
                        lane_bytes = []
                        for lane in range(wsz):
                            row = mx.operand_row(i, lane)
                            chunk = mx.operand_chunk(kb, lane, piece, mma)
                            lane_bytes.append(mx.a_lds_byte(row, chunk, cpr))
                        lds.instruction("A read", wave, lane_bytes, mx.CHUNK_BYTES)
                        for lane, byte in enumerate(lane_bytes):
                            values = lds.load(byte, per_chunk, eb)
                            if piece == 0:
                                a_runs.append(values)
                            else:
                                a_runs[lane] = a_runs[lane] + values
                    for j in range(reps_n):
                        first = (j * blocks + kb) * pieces
                        b_lane = [
                            sum((b_runs[wave * wsz + lane][first + p] for p in range(pieces)), [])
                            for lane in range(wsz)
                        ]
                        _mma(accs[wave][i * reps_n + j], a_runs, b_lane, mma, mma_k)

    rows_per_lane = mx.acc_rows_per_lane(mma)
    accs = [
        [[[0.0] * rows_per_lane for _ in range(wsz)] for _ in range(reps_m * reps_n)]
        for _ in range(mx.WAVES_PER_BLOCK)
    ]
    a_copy, b_next = load_k_tile(kb_begin)
    for t in range(1, tiles):
        b_cur = b_next
        lds.barrier()
        store_a(a_copy)
        lds.barrier()
        a_copy, b_next = load_k_tile(kb_begin + t * blocks)
        mma_k_tile(b_cur, accs)
    lds.barrier()
    store_a(a_copy)
    lds.barrier()
    mma_k_tile(b_next, accs)
    lds.barrier()
    _epilogue(lds, accs, bias, dst, dst_writes, (origin_m, origin_n, split), (m, n), tile,
              split_k, mma, dst_dtype, ob)  # fmt: skip
    lds.barrier()
    return lds


def _round_to(value: float, dtype) -> float:
    return float(torch.tensor(value, dtype=torch.float32).to(dtype).double())


def _epilogue(lds, accs, bias, dst, dst_writes, origin, shape, tile, split_k, mma, dst_dtype, ob):
    origin_m, origin_n, split = origin
    m, n = shape
    tn = tile.tile_n
    wsz = mx.WAVE_SIZE[mma]
    reps_m, reps_n = mx.mma_repeats(tile.tile_m, tn)
    vec = mx.CHUNK_BYTES // ob
    for wave in range(mx.WAVES_PER_BLOCK):
        col0 = mx.wave_col0(wave, tn)
        lane_bias = []
        for j in range(reps_n):
            cols = [origin_n + col0 + j * 16 + mx.acc_col(lane) for lane in range(wsz)]
            lane_bias.append([float(bias[c]) if bias is not None and c < n else 0.0 for c in cols])
        for i in range(reps_m):
            for j in range(reps_n):
                for e in range(mx.acc_rows_per_lane(mma)):
                    lane_bytes = []
                    for lane in range(wsz):
                        byte = mx.out_write_byte(wave, j, lane, e, tn, ob, mma)
                        value = accs[wave][i * reps_n + j][lane][e]
                        value = _round_to(value, torch.float32)
                        if bias is not None and split_k == 1:
                            value = _round_to(value + lane_bias[j][lane], torch.float32)
                        lds.store(wave, byte, [_round_to(value, dst_dtype)], ob)
                        lane_bytes.append(byte)
                    lds.instruction("C write", wave, lane_bytes, ob)
            for store_pass in range(mx.out_store_passes(tn, ob, mma)):
                lane_bytes = []
                for lane in range(wsz):
                    row16, col, real = mx.out_read_coord(store_pass, lane, tn, ob, mma)
                    byte = mx.out_read_byte(wave, row16, col, tn, ob)
                    lane_bytes.append(byte if real else None)
                    if not real:
                        continue
                    values = lds.load(byte, vec, ob)
                    row = origin_m + i * 16 + row16
                    col = origin_n + col0 + col
                    for e in range(vec):
                        if row < m and col + e < n:
                            if split_k > 1:
                                off = mx.workspace_offset(split, row, col + e, m, n)
                            else:
                                off = mx.c_offset(row, col + e, n)
                            dst[off] = values[e]
                            dst_writes[off] += 1
                lds.instruction("C read", wave, lane_bytes, mx.CHUNK_BYTES)


def conflict_summary(stats: dict[str, AccessStats]) -> dict[str, str]:
    """Per access kind: instructions, cycles under the model, and the extra cycles conflicts
    cost, as text for a report."""
    return {
        kind: f"{s.instructions} instructions, {s.cycles} cycles ({s.extra_cycles} from conflicts)"
        for kind, s in sorted(stats.items())
    }
