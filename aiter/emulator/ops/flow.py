"""Program-flow semantics (SOPP): branches, s_endpgm, s_barrier, s_waitcnt and the hints that
change nothing a CPU run can observe (s_nop, s_setprio, s_sleep, cache invalidates).
"""

from __future__ import annotations

from aiter.emulator.decode import VCC, Instruction
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import Wave


def _jump(w: Wave, i: Instruction, taken: bool) -> None:
    if taken:
        w.pc = int(i.operands[0].value)


@op("s_branch")
def _branch(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _jump(w, i, True)


@op("s_cbranch_scc0")
def _scc0(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _jump(w, i, w.scc == 0)


@op("s_cbranch_scc1")
def _scc1(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _jump(w, i, w.scc == 1)


@op("s_cbranch_vccz")
def _vccz(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _jump(w, i, w.s64(VCC) == 0)


@op("s_cbranch_vccnz")
def _vccnz(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _jump(w, i, w.s64(VCC) != 0)


@op("s_cbranch_execz")
def _execz(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _jump(w, i, w.exec == 0)


@op("s_cbranch_execnz")
def _execnz(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _jump(w, i, w.exec != 0)


@op("s_endpgm")
def _endpgm(ctx: Ctx, w: Wave, i: Instruction) -> None:
    # Stores in flight still land: their data was taken at issue.
    for counter in w.queues:
        w.retire(counter, 0)
    w.done = True


@op("s_barrier")
def _barrier(ctx: Ctx, w: Wave, i: Instruction) -> None:
    # The scheduler releases the wave when every live wave of the group has arrived.
    ctx.group.signal(w)
    ctx.group.wait(w)


# gfx12 splits the barrier: a wave signals, may go on working, and waits later. The operand
# names the barrier; -1 is the work-group's own, the only one the kernels here use.
@op("s_barrier_signal")
def _barrier_signal(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _own_barrier(i)
    ctx.group.signal(w)


@op("s_barrier_wait")
def _barrier_wait(ctx: Ctx, w: Wave, i: Instruction) -> None:
    _own_barrier(i)
    ctx.group.wait(w)


def _own_barrier(i: Instruction) -> None:
    barrier = int(i.operands[0].value) if i.operands else -1
    if barrier not in (-1, 0xFFFF):
        raise ValueError(f"named barrier {barrier}: only the work-group barrier (-1) is modelled")


# gfx9 encodes "no wait" as the counter's maximum (CDNA3 ISA, S_WAITCNT).
_MAX_COUNT = {"vmcnt": 63, "lgkmcnt": 15, "expcnt": 7}


def waitcnt_counts(i: Instruction) -> dict[str, int]:
    """vmcnt, lgkmcnt and expcnt of an s_waitcnt, from its named counters or its raw simm16
    (vmcnt = bits 3:0 and 15:14, expcnt = bits 6:4, lgkmcnt = bits 11:8)."""
    counts = dict(_MAX_COUNT)
    if i.operands and not i.modifiers:
        raw = int(i.operands[0].value)
        counts["vmcnt"] = (raw & 0xF) | ((raw >> 14) & 3) << 4
        counts["expcnt"] = (raw >> 4) & 7
        counts["lgkmcnt"] = (raw >> 8) & 0xF
    for name in _MAX_COUNT:
        if name in i.modifiers:
            counts[name] = int(i.modifiers[name])
    return counts


@op("s_waitcnt", mods=("vmcnt", "lgkmcnt", "expcnt"))
def _waitcnt(ctx: Ctx, w: Wave, i: Instruction) -> None:
    counts = waitcnt_counts(i)
    w.retire("vm", counts["vmcnt"])
    w.retire("lgkm", counts["lgkmcnt"])


@op("s_waitcnt_vmcnt")
def _waitcnt_vm(ctx: Ctx, w: Wave, i: Instruction) -> None:
    # S_WAITCNT_VMCNT waits until vmcnt <= SGPR + simm16; the disassembler prints both.
    base = w.read_scalar(i.operands[0]) if i.operands[0].kind == "s" else 0
    w.retire("vm", base + int(i.operands[-1].value))


@op("s_waitcnt_lgkmcnt")
def _waitcnt_lgkm(ctx: Ctx, w: Wave, i: Instruction) -> None:
    base = w.read_scalar(i.operands[0]) if i.operands[0].kind == "s" else 0
    w.retire("lgkm", base + int(i.operands[-1].value))


def _nothing(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """Scheduling hints and cache maintenance: no effect on any result."""


op("s_nop", "s_setprio", "s_sleep", "s_icache_inv", "s_dcache_inv", "s_dcache_wb")(_nothing)
op("buffer_wbl2", "buffer_inv", mods=("sc0", "sc1", "nt", "glc", "slc"))(_nothing)
