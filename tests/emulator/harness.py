"""Runs a few hand-written instructions on the emulator's waves without a code object, so each
hardware rule can be tested on the instruction that implements it.

Lines are written as llvm-objdump prints them; every instruction takes 4 bytes here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from aiter.emulator.codeobject import Kernel, KernelDescriptor
from aiter.emulator.decode import parse_disassembly
from aiter.emulator.memory import Memory
from aiter.emulator.ops import Ctx
from aiter.emulator.races import LdsTracker, Race, RaceLog
from aiter.emulator.scheduler import Executor, run_workgroup
from aiter.emulator.state import MASK64, WaitHazard, Wave, WorkGroup, isa_family

ENTRY = 0x1000


def program_text(lines: list[str]) -> str:
    """Objdump-shaped text: one instruction per line with its address and a dummy word."""
    return "\n".join(
        f"\t{line:<56}// {ENTRY + 4 * n:012X}: 00000000" for n, line in enumerate(lines)
    )


@dataclass
class Run:
    waves: list[Wave]
    group: WorkGroup
    memory: Memory
    hazards: list[WaitHazard]
    counts: dict[str, int]
    races: list[Race]


def run(
    lines: list[str],
    memory: Memory | None = None,
    waves: int = 1,
    lds_bytes: int = 0,
    setup=None,
    seed: int = 0,
    strict_waits: bool = True,
    lds_init: np.ndarray | None = None,
    arch: str = "gfx942",
    races: str = "raise",
) -> Run:
    """Execute `lines` (ending in s_endpgm) on `waves` waves of one work-group; `setup(wave)`
    fills registers first. EXEC starts all ones (32 lanes on gfx1250, 64 elsewhere)."""
    family = isa_family(arch)
    size = 32 if family == "gfx12" else 64
    program = parse_disassembly(program_text(lines), arch)
    kd = KernelDescriptor(lds_bytes, 0, 0, 0, 0, 0, 0, 0, 0)
    kernel = Kernel(
        name="test_kernel", arch=arch, descriptor=kd, entry=ENTRY,
        end=ENTRY + 4 * len(lines), args=(), kernarg_segment_size=0,
        group_segment_fixed_size=lds_bytes, private_segment_fixed_size=0, wavefront_size=size,
        sgpr_count=0, vgpr_count=0, agpr_count=0, max_flat_workgroup_size=1024, metadata={},
    )  # fmt: skip
    memory = memory or Memory()
    group = WorkGroup((0, 0, 0), np.zeros(lds_bytes, np.uint8))
    log = RaceLog("test_kernel", races == "raise")
    if races != "off":
        group.lds_races = LdsTracker(lds_bytes, group.id, log)
    if lds_init is not None:
        group.lds[: lds_init.size] = lds_init
    hazards: list[WaitHazard] = []
    for index in range(waves):
        wave = Wave(index, ENTRY, 256, size=size, vgprs=1024, family=family)
        wave.exec = MASK64
        if setup is not None:
            setup(wave)
        wave.on_hazard = _reporter(hazards, wave, program, strict_waits)
        group.waves.append(wave)
    ctx = Ctx(kernel, memory, group)
    executor = Executor(program, kernel.name, ENTRY, kernel.end)
    run_workgroup(executor, ctx, random.Random(seed), 10_000)
    return Run(group.waves, group, memory, hazards, ctx.counts, log.races)


def _reporter(hazards, wave, program, strict):
    from aiter.emulator.errors import MissingWait

    def report(register, pending):
        hazard = WaitHazard(
            "test_kernel", (0, 0, 0), wave.index, wave.current, pending.pc, register,
            program.at(wave.current).text,
        )  # fmt: skip
        hazards.append(hazard)
        if strict:
            raise MissingWait(str(hazard))

    return report


def buffer_descriptor(wave: Wave, first_sgpr: int, base: int, num_records: int) -> None:
    """A raw (stride 0) V# in s[first:first+3], as FlyDSL builds one (dword3 0x27000)."""
    wave.sgpr[first_sgpr] = base & 0xFFFFFFFF
    wave.sgpr[first_sgpr + 1] = (base >> 32) & 0xFFFF
    wave.sgpr[first_sgpr + 2] = num_records
    wave.sgpr[first_sgpr + 3] = 0x27000


def buffer_descriptor_gfx1250(wave: Wave, first_sgpr: int, base: int, num_records: int) -> None:
    """A raw V# as LLVM lowers make.buffer.rsrc for gfx1250: a 57-bit base, a 45-bit
    num_records from bit 57, stride 0."""
    value = (base & ((1 << 57) - 1)) | num_records << 57
    for k in range(4):
        wave.sgpr[first_sgpr + k] = (value >> (32 * k)) & 0xFFFFFFFF
