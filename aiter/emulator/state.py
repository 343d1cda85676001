"""Architectural state of waves and work-groups: SGPRs (with VCC, M0 and EXEC at their
hardware indices), the unified VGPR/AccVGPR file as uint32 [registers, 64 lanes], SCC, PC, the
work-group's LDS, and the loads in flight per wait counter.

A load's data lands in its registers only when an s_waitcnt retires it (Pending), so a kernel
that reads a load's destination without the wait reads the old value, and the read is reported.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from aiter.emulator.decode import EXEC, SGPR_FILE, Operand, float_bits32
from aiter.emulator.races import LdsTracker

LANES = 64
VGPR_FILE = 512  # 256 arch VGPRs + 256 AccVGPRs: the unified file of gfx90a and later
_LANE_BITS = np.left_shift(np.uint64(1), np.arange(LANES, dtype=np.uint64))
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF


def mask_to_bits(mask: np.ndarray) -> int:
    """A lane mask (bool[64]) as the 64-bit value of EXEC or VCC."""
    return int(np.bitwise_or.reduce(np.where(mask, _LANE_BITS, np.uint64(0))))


def bits_to_mask(bits: int) -> np.ndarray:
    return (np.uint64(bits & MASK64) & _LANE_BITS) != 0


def float_const_bits(value: float, ftype: str | None, words: int) -> int:
    """Bits of an inline float constant for an operand of type `ftype` (None: integer operand,
    which takes the f32 pattern, or the f64 one for 64-bit operands)."""
    if ftype == "f16":
        return int(np.float16(value).view(np.uint16))
    if ftype == "bf16":
        return float_bits32(value) >> 16
    if ftype == "f64" or (ftype is None and words == 2):
        return int(np.float64(value).view(np.uint64))
    return float_bits32(value)


# The wait counter each kind of memory instruction counts on: gfx9 counts loads and stores on
# vmcnt, LDS and scalar loads on lgkmcnt; gfx12 has a counter per kind (s_wait_loadcnt,
# s_wait_storecnt, s_wait_dscnt, s_wait_kmcnt).
COUNTERS = {
    "gfx9": {"load": "vm", "store": "vm", "ds": "lgkm", "smem": "lgkm"},
    "gfx12": {"load": "load", "store": "store", "ds": "ds", "smem": "km"},
}


def isa_family(arch: str) -> str:
    return "gfx12" if arch.startswith("gfx12") else "gfx9"


@dataclass
class Pending:
    """Results of one memory instruction in flight: `apply` writes them to registers."""

    counter: str  # its kind: "load", "store", "ds" or "smem" (COUNTERS maps it to a counter)
    vgprs: tuple[int, ...] = ()
    sgprs: tuple[int, ...] = ()
    apply: Callable[[], None] | None = None
    pc: int = 0


@dataclass
class WaitHazard:
    """A register read or overwritten while a load into it was still in flight."""

    kernel: str
    workgroup: tuple[int, int, int]
    wave: int
    pc: int
    load_pc: int
    register: str
    instruction: str

    def __str__(self) -> str:
        return (
            f"{self.kernel} work-group {self.workgroup} wave {self.wave} pc {self.pc:#x} "
            f"({self.instruction}): {self.register} is the destination of the load at pc "
            f"{self.load_pc:#x}, which no s_waitcnt has retired yet"
        )


class Wave:
    """One wave: its registers, its PC and the loads it has in flight. A wave32 (gfx12) keeps
    the same 64-lane arrays with lanes 32..63 never enabled: EXEC's high half stays 0."""

    def __init__(
        self,
        index: int,
        entry: int,
        accum_offset: int,
        *,
        size: int = LANES,
        vgprs: int = VGPR_FILE,
        family: str = "gfx9",
    ) -> None:
        self.index = index
        self.size = size
        self.lane_bits = MASK64 if size == 64 else MASK32
        self.counters = COUNTERS[family]
        self.sgpr = np.zeros(SGPR_FILE, np.uint32)
        self.vgpr = np.zeros((vgprs, LANES), np.uint32)
        self.scc = 0
        self.pc = entry
        self.current = entry  # address of the instruction being executed
        self.accum_offset = accum_offset
        self.done = False
        self.at_barrier = False
        self.issued = 0
        self.queues: dict[str, deque[Pending]] = {c: deque() for c in set(self.counters.values())}
        self.signal_epoch: int | None = None  # the barrier phase this wave last signaled in
        self.hwregs: dict[str, int] = {}  # s_setreg/s_getreg state the emulator does not model
        self.pending_v: dict[int, Pending] = {}
        self.pending_s: dict[int, Pending] = {}
        self.on_hazard: Callable[[str, Pending], None] | None = None

    # --- scalar registers ------------------------------------------------------------------

    @property
    def exec(self) -> int:
        return int(self.sgpr[EXEC]) | int(self.sgpr[EXEC + 1]) << 32

    @exec.setter
    def exec(self, value: int) -> None:
        self.set_s64(EXEC, value & self.lane_bits)

    def exec_mask(self) -> np.ndarray:
        return bits_to_mask(self.exec)

    def s32(self, index: int) -> int:
        if self.pending_s and index in self.pending_s:
            self._hazard(f"s{index}", self.pending_s[index])
        return int(self.sgpr[index])

    def s64(self, index: int) -> int:
        return self.s32(index) | self.s32(index + 1) << 32

    def set_s32(self, index: int, value: int) -> None:
        if self.pending_s and index in self.pending_s:
            self._hazard(f"s{index}", self.pending_s[index])
        self.sgpr[index] = value & MASK32

    def set_s64(self, index: int, value: int) -> None:
        self.set_s32(index, value)
        self.set_s32(index + 1, value >> 32)

    def read_scalar(self, op: Operand, words: int = 1, ftype: str | None = None) -> int:
        """A scalar source of 1 or 2 dwords: an SGPR, an integer or float constant or SCC."""
        if op.kind == "s":
            return self.s32(op.index) if words == 1 else self.s64(op.index)
        if op.kind == "imm":
            return op.value & (MASK32 if words == 1 else MASK64)
        if op.kind == "float":
            return float_const_bits(op.value, ftype, words)
        if op.kind == "scc":
            return self.scc
        if op.kind == "null":
            return 0
        raise ValueError(f"operand {op.text!r} is not a scalar source")

    def read_lane_mask(self, op: Operand) -> np.ndarray:
        """A lane-mask source (a select condition, a carry-in): an SGPR pair on wave64, one
        SGPR on wave32 (its VCC is vcc_lo), as bool per lane."""
        return bits_to_mask(self.read_scalar(op, 2 if self.size == 64 else 1))

    def write_scalar(self, op: Operand, value: int) -> None:
        if op.kind == "null":
            return
        if op.kind != "s":
            raise ValueError(f"operand {op.text!r} is not a scalar destination")
        if op.count == 1:
            self.set_s32(op.index, value)
        else:
            for i in range(op.count):
                self.set_s32(op.index + i, value >> (32 * i))

    # --- vector registers ------------------------------------------------------------------

    def vrow(self, op: Operand) -> int:
        """First row of a VGPR or AccVGPR operand in the unified file."""
        return op.index + (self.accum_offset if op.kind == "a" else 0)

    def read_vector(self, op: Operand, words: int = 1, ftype: str | None = None) -> np.ndarray:
        """`words` dwords per lane, as uint32 [words, 64]; scalars and constants broadcast."""
        if op.kind in ("v", "a"):
            row = self.vrow(op)
            if self.pending_v:
                for r in range(row, row + words):
                    if r in self.pending_v:
                        self._hazard(f"v{r}", self.pending_v[r])
            if op.half == "h":
                return self.vgpr[row : row + words] >> np.uint32(16)
            return self.vgpr[row : row + words]
        if op.kind == "s" and words > 1:
            values = [self.s32(op.index + i) for i in range(words)]
            return np.repeat(np.array(values, np.uint32)[:, None], LANES, axis=1)
        value = self.read_scalar(op, 2 if words > 1 else 1, ftype)
        dwords = [(value >> (32 * i)) & MASK32 for i in range(words)]
        if words > 1 and op.kind == "imm" and op.value < 0:
            dwords = [(op.value >> (32 * i)) & MASK32 for i in range(words)]
        return np.repeat(np.array(dwords, np.uint32)[:, None], LANES, axis=1)

    def write_vector(self, op: Operand, values: np.ndarray, mask: np.ndarray) -> None:
        """Write uint32 [words, 64] (or [64]) to the lanes of `mask`."""
        if op.kind == "null":
            return
        values = np.asarray(values)
        if values.ndim == 1:
            values = values[None, :]
        row = self.vrow(op)
        if op.half:
            # A true16 half: the other half of the register keeps its bits.
            old = self.vgpr[row]
            low = values[0] & np.uint32(0xFFFF)
            merged = (old & np.uint32(0xFFFF0000)) | low
            if op.half == "h":
                merged = (old & np.uint32(0xFFFF)) | (low << np.uint32(16))
            values = merged[None, :]
        if self.pending_v:
            for r in range(row, row + values.shape[0]):
                if r in self.pending_v:
                    self._hazard(f"v{r}", self.pending_v[r])
        np.copyto(self.vgpr[row : row + values.shape[0]], values.astype(np.uint32), where=mask)

    # --- loads in flight -------------------------------------------------------------------

    def issue(self, pending: Pending) -> None:
        self.queues[self.counters[pending.counter]].append(pending)
        for r in pending.vgprs:
            self.pending_v[r] = pending
        for r in pending.sgprs:
            self.pending_s[r] = pending

    def retire(self, counter: str, keep: int) -> None:
        """Retire the oldest loads of `counter` until at most `keep` remain in flight."""
        queue = self.queues[counter]
        while len(queue) > keep:
            pending = queue.popleft()
            for r in pending.vgprs:
                if self.pending_v.get(r) is pending:
                    del self.pending_v[r]
            for r in pending.sgprs:
                if self.pending_s.get(r) is pending:
                    del self.pending_s[r]
            if pending.apply is not None:
                pending.apply()

    def _hazard(self, register: str, pending: Pending) -> None:
        if self.on_hazard is not None:
            self.on_hazard(register, pending)


@dataclass
class WorkGroup:
    id: tuple[int, int, int]
    lds: np.ndarray
    waves: list[Wave] = field(default_factory=list)
    epoch: int = 0  # barrier phases completed so far
    signaled: set[int] = field(default_factory=set)  # waves that signaled the current phase

    def signal(self, wave: Wave) -> None:
        """The wave arrives at the barrier (s_barrier, s_barrier_signal)."""
        self.signaled.add(wave.index)
        wave.signal_epoch = self.epoch

    def wait(self, wave: Wave) -> None:
        """The wave waits for the phase it signaled in to complete (s_barrier,
        s_barrier_wait); it goes on at once if it already has."""
        wave.at_barrier = wave.signal_epoch is not None and wave.signal_epoch == self.epoch

    def complete_phase(self, live: list[Wave]) -> bool:
        """End the phase when every live wave has signaled: its waiters go on."""
        if not self.signaled or any(w.index not in self.signaled for w in live):
            return False
        self.signaled.clear()
        self.epoch += 1
        for w in live:
            w.at_barrier = False
        return True

    lds_races: LdsTracker | None = None
