"""The emulator's entry: `launch` dispatches one kernel of a code object over a grid of
work-groups the way the hardware's dispatcher does, and returns what the run did.

Initial wave state follows LLVM AMDGPUUsage, "Initial Kernel Execution State".
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from aiter.emulator.codeobject import CodeObject, Kernel, load_code_object
from aiter.emulator.decode import TTMP0, Program, decode
from aiter.emulator.errors import EmulatorError, MissingWait, UnsupportedInstruction
from aiter.emulator.memory import Memory
from aiter.emulator.ops import Ctx
from aiter.emulator.races import GlobalWrites, LdsTracker, Race, RaceLog
from aiter.emulator.scheduler import Executor, run_workgroup
from aiter.emulator.state import (
    LANES,
    VGPR_FILE,
    Pending,
    WaitHazard,
    Wave,
    WorkGroup,
    isa_family,
    mask_to_bits,
)

_CODE_OBJECTS: dict[bytes, CodeObject] = {}
KERNARG_PAD = 256


@dataclass
class LaunchStats:
    """What one launch executed: instructions per mnemonic, bytes moved, wait hazards."""

    kernel: str
    arch: str
    workgroups: int
    waves: int
    instructions: int = 0
    by_mnemonic: Counter = field(default_factory=Counter)
    counts: dict[str, int] = field(default_factory=dict)
    hazards: list[WaitHazard] = field(default_factory=list)
    races: list[Race] = field(default_factory=list)


def _code_object(code: bytes) -> CodeObject:
    import hashlib

    key = hashlib.sha256(code).digest()
    if key not in _CODE_OBJECTS:
        _CODE_OBJECTS[key] = load_code_object(code)
    return _CODE_OBJECTS[key]


def dispatch_packet(kernel: Kernel, grid: tuple, block: tuple, kernarg_address: int) -> bytes:
    """An hsa_kernel_dispatch_packet_t for kernels that read their dispatch pointer (grid sizes
    in work-items, as HSA defines them)."""
    sizes = [g * b for g, b in zip(grid, block, strict=True)]
    return struct.pack(
        "<HHHHHHIIIIIQQQQ",
        0, 3, *block, 0, *sizes, kernel.private_segment_fixed_size,
        kernel.group_segment_fixed_size, 0, kernarg_address, 0, 0,
    )  # fmt: skip


def _user_sgprs(
    kernel: Kernel, kernarg_base: int, packet_base: int, kernarg: bytes
) -> dict[int, int]:
    """SGPR index -> value for the user SGPRs the descriptor enables, in set-up order."""
    kd = kernel.descriptor
    values: dict[int, int] = {}
    for name, first in kd.user_sgprs():
        if name == "kernarg_segment_ptr":
            value, count = kernarg_base, 2
        elif name == "dispatch_ptr":
            value, count = packet_base, 2
        elif name in ("dispatch_id", "private_segment_size", "flat_scratch_init") or (
            name == "private_segment_buffer" and kernel.private_segment_fixed_size == 0
        ):
            # No scratch is modelled: a kernel without private segment gets zeros here.
            value, count = 0, {"private_segment_buffer": 4, "private_segment_size": 1}.get(name, 2)
        else:
            raise UnsupportedInstruction(
                "(wave setup)", kernel.name, kernel.entry, f"user SGPR {name} is not modelled"
            )
        for k in range(count):
            values[first + k] = (value >> (32 * k)) & 0xFFFFFFFF
    if kd.kernarg_preload_length:
        first = sum(c for n, b, c in kd.USER_SGPRS if kd.kernel_code_properties >> b & 1)
        start = 4 * kd.kernarg_preload_offset
        for k in range(kd.kernarg_preload_length):
            chunk = kernarg[start + 4 * k : start + 4 * k + 4].ljust(4, b"\0")
            values[first + k] = struct.unpack("<I", chunk)[0]
    return values


def _make_waves(
    kernel: Kernel, arch: str, group_id: tuple, block: tuple, user: dict[int, int]
) -> list[Wave]:
    kd = kernel.descriptor
    size, family = kernel.wavefront_size, isa_family(arch)
    # gfx1250 addresses up to 1024 VGPRs per lane (s_set_vgpr_msb selects the upper ones).
    vgprs = max(VGPR_FILE, kernel.vgpr_count, 1024 if family == "gfx12" else 0)
    threads = block[0] * block[1] * block[2]
    system = [g for g, on in zip(group_id, kd.workgroup_id_enabled, strict=True) if on]
    if kd.workgroup_info_enabled or kd.private_segment_enabled:
        raise UnsupportedInstruction(
            "(wave setup)", kernel.name, kernel.entry, "workgroup info / scratch wave offset SGPR"
        )
    waves = []
    for index in range(-(-threads // size)):
        wave = Wave(index, kernel.entry, kd.accum_offset, size=size, vgprs=vgprs, family=family)
        for sgpr, value in user.items():
            wave.sgpr[sgpr] = value
        for k, value in enumerate(system):
            wave.sgpr[kd.user_sgpr_count + k] = value
        if family == "gfx12":
            # gfx12's architected SGPRs: the work-group ID in ttmp9 (X) and ttmp7 (Y in bits
            # 0-15, Z in 16-31); ttmp6 holds cluster IDs, all 0 outside a cluster launch
            # (LLVM AMDGPUUsage, "Initial Kernel Execution State", GFX12).
            wave.sgpr[TTMP0 + 9] = group_id[0]
            wave.sgpr[TTMP0 + 7] = group_id[1] | group_id[2] << 16
            wave.sgpr[TTMP0 + 6] = 0
        lane = np.arange(LANES)
        flat = index * size + lane
        x = flat % block[0]
        y = (flat // block[0]) % block[1]
        z = flat // (block[0] * block[1])
        dims = kd.workitem_id_dims
        # gfx90a and later pack the work-item IDs into v0: X in bits 0-9, Y in 10-19, Z in
        # 20-29 (AMDGPUUsage, "VGPR Register Set Up Order for Kernels", packed work-item IDs).
        wave.vgpr[0] = (x | (y << 10) * (dims > 1) | (z << 20) * (dims > 2)).astype(np.uint32)
        active = (flat < threads) & (lane < size)
        wave.exec = mask_to_bits(active)
        waves.append(wave)
    return waves


def launch(
    code_object: bytes,
    kernel_name: str,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    kernarg: bytes,
    memory: Memory,
    dynamic_lds: int = 0,
    seed: int = 0,
    *,
    strict_waits: bool = True,
    max_instructions: int = 5_000_000,
    races: str = "collect",
) -> LaunchStats:
    """Run `kernel_name` of `code_object` over `grid` work-groups of `block` work-items.

    kernarg: the kernel argument segment (pointers are addresses of `memory` regions).
    strict_waits: raise MissingWait at the first read of a load's destination that no
    s_waitcnt has retired; otherwise record it in LaunchStats.hazards and go on (the read sees
    the register's old value, as the hardware may).
    races: "raise" stops at the first data race (DataRace), "collect" lists them in
    LaunchStats.races, "off" skips the check. A race is an LDS byte two waves of a work-group
    touch in one barrier epoch (one access a write), or a global byte two work-groups write
    with plain stores.
    """
    if races not in ("raise", "collect", "off"):
        raise ValueError(f"races: expected 'raise', 'collect' or 'off', got {races!r}")
    co = _code_object(code_object)
    kernel = co.kernel(kernel_name)
    if (kernel.wavefront_size, isa_family(co.arch)) not in ((64, "gfx9"), (32, "gfx12")):
        raise UnsupportedInstruction(
            "(wave setup)", kernel.name, kernel.entry, f"wave{kernel.wavefront_size} ({co.arch})"
        )
    threads = block[0] * block[1] * block[2]
    if threads > kernel.max_flat_workgroup_size:
        raise EmulatorError(
            f"{kernel.name}: block {block} has {threads} work-items, more than the kernel's "
            f".max_flat_workgroup_size {kernel.max_flat_workgroup_size}"
        )
    needed = max((a.offset + a.size for a in kernel.args), default=0)
    if len(kernarg) < needed:
        raise EmulatorError(
            f"{kernel.name}: kernarg has {len(kernarg)} bytes, its arguments need {needed}"
        )
    program: Program = decode(co.data, co.arch, co.sha256)
    # The compiler widens scalar kernarg loads past the last argument (an s_load_dwordx4 that
    # ends beyond the segment); the runtime's kernarg blocks are padded, so pad here too.
    size = max(needed, kernel.kernarg_segment_size, 8)
    segment = np.zeros((size + KERNARG_PAD + 63) // 64 * 64, np.uint8)
    segment[: len(kernarg)] = np.frombuffer(kernarg, np.uint8)
    kernarg_base = memory.add(segment, f"{kernel.name} kernarg")
    packet = np.frombuffer(dispatch_packet(kernel, grid, block, kernarg_base), np.uint8).copy()
    packet_base = memory.add(packet, f"{kernel.name} dispatch packet")
    user = _user_sgprs(kernel, kernarg_base, packet_base, kernarg)

    stats = LaunchStats(kernel.name, co.arch, grid[0] * grid[1] * grid[2], 0)
    executor = Executor(program, kernel.name, kernel.entry, kernel.end)
    rng = random.Random(seed)
    groups = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    rng.shuffle(groups)  # work-groups run in no fixed order on the hardware either
    lds_bytes = kernel.group_segment_fixed_size + dynamic_lds
    log = RaceLog(kernel.name, races == "raise")
    writes = GlobalWrites() if races != "off" else None
    for group_id in groups:
        group = WorkGroup(group_id, np.zeros(lds_bytes, np.uint8))
        if races != "off":
            group.lds_races = LdsTracker(lds_bytes, group_id, log)
        group.waves = _make_waves(kernel, co.arch, group_id, block, user)
        stats.waves += len(group.waves)
        for wave in group.waves:
            wave.on_hazard = _hazard_reporter(stats, kernel, group, wave, program, strict_waits)
        ctx = Ctx(kernel, memory, group, stats.counts, writes)
        run_workgroup(executor, ctx, rng, max_instructions)
        if writes is not None:
            writes.end_group(group_id)
    if writes is not None:
        writes.check(log)
    stats.races = log.races
    for pc, n in executor.issued.items():
        stats.by_mnemonic[program.at(pc).mnemonic] += n
    stats.instructions = sum(executor.issued.values())
    return stats


def _hazard_reporter(
    stats: LaunchStats, kernel: Kernel, group: WorkGroup, wave: Wave, program: Program, strict: bool
):
    def report(register: str, pending: Pending) -> None:
        pc = wave.current
        text = program.at(pc).text if pc in program.by_address else "?"
        hazard = WaitHazard(kernel.name, group.id, wave.index, pc, pending.pc, register, text)
        stats.hazards.append(hazard)
        if strict:
            raise MissingWait(str(hazard))

    return report
