"""Scalar memory loads (s_load_*, s_buffer_load_*): memory is read at issue, and the SGPRs
receive the data when an s_waitcnt lgkmcnt retires the load.
"""

from __future__ import annotations

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import Pending, Wave

_DWORDS = {"dword": 1, "dwordx2": 2, "dwordx4": 4, "dwordx8": 8, "dwordx16": 16}


def _offset(w: Wave, i: Instruction, dwords: int = 1) -> int:
    """The byte offset: an immediate, an SGPR, or (gfx9 soffset form) an SGPR plus offset:;
    gfx1250's scale_offset multiplies the SGPR by the bytes loaded."""
    off = i.operands[2]
    value = w.read_scalar(off) if off.kind == "s" else int(off.value)
    if i.has("scale_offset"):
        value *= 4 * dwords
    return value + i.mod_int("offset")


def _load(w: Wave, i: Instruction, address: int, dwords: int, ctx: Ctx) -> None:
    # SMEM ignores the two low address bits (CDNA3 ISA, "Scalar Memory Operations").
    address &= ~3
    data = np.frombuffer(ctx.memory.read_scalar(address, 4 * dwords), np.uint32).copy()
    dst = i.operands[0].index

    def land() -> None:
        w.sgpr[dst : dst + dwords] = data

    w.issue(Pending("smem", sgprs=tuple(range(dst, dst + dwords)), apply=land, pc=i.address))
    ctx.counts["smem_bytes"] = ctx.counts.get("smem_bytes", 0) + 4 * dwords


def _s_load(dwords: int):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        base = w.read_scalar(i.operands[1], 2)
        _load(w, i, base + _offset(w, i, dwords), dwords, ctx)

    return run


def _s_buffer_load(dwords: int):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        rsrc = w.read_vector(i.operands[1], 4)[:, 0]
        base = int(rsrc[0]) | (int(rsrc[1]) & 0xFFFF) << 32
        offset = _offset(w, i)
        num_records = int(rsrc[2])
        if offset + 4 * dwords > num_records:
            # Out of range dwords read as zero (CDNA3 ISA, "Scalar Memory Operations").
            valid = max(0, (num_records - offset) // 4)
            data = np.zeros(dwords, np.uint32)
            if valid:
                raw = ctx.memory.read_scalar((base + offset) & ~3, 4 * valid)
                data[:valid] = np.frombuffer(raw, np.uint32)
            dst = i.operands[0].index

            def land() -> None:
                w.sgpr[dst : dst + dwords] = data

            w.issue(Pending("smem", sgprs=tuple(range(dst, dst + dwords)), apply=land))
            return
        _load(w, i, base + offset, dwords, ctx)

    return run


for _name, _n in _DWORDS.items():
    op(f"s_load_{_name}", mods=("glc", "offset"))(_s_load(_n))
    op(f"s_buffer_load_{_name}", mods=("glc", "offset"))(_s_buffer_load(_n))
