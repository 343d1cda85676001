"""Moves of data between the lanes of a wave: ds_swizzle_b32, ds_bpermute_b32, ds_permute_b32
(LDS hardware, no LDS memory; results land at lgkmcnt) and the gfx950 v_permlane{16,32}_swap.

Rules: CDNA3 ISA, "DS_SWIZZLE_B32" / "DS_BPERMUTE_B32" / "DS_PERMUTE_B32", and LLVM
AMDGPUModifierSyntax, "swizzle pattern" (the offset encodings); CDNA4 ISA pseudocode of
V_PERMLANE16_SWAP_B32 / V_PERMLANE32_SWAP_B32.
"""

from __future__ import annotations

import re

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.ops.lds import _pending
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import LANES, Wave

U32 = np.uint32
LANE = np.arange(LANES)


def swizzle_offset(text: str) -> int:
    """The 16-bit offset of ds_swizzle_b32 from its printed form: a number, or one of LLVM's
    swizzle(QUAD_PERM|BITMASK_PERM|BROADCAST|SWAP|REVERSE, ...) macros."""
    m = re.fullmatch(r"swizzle\((\w+)((?:,[^,)]+)*)\)", text.replace(" ", ""))
    if m is None:
        return int(text, 0)
    mode, args = m.group(1), [a for a in m.group(2).split(",") if a]
    if mode == "QUAD_PERM":
        return 0x8000 | sum(int(a) << (2 * k) for k, a in enumerate(args))
    if mode == "BITMASK_PERM":
        and_mask = or_mask = xor_mask = 0
        for k, ch in enumerate(args[0].strip('"')):
            bit = 1 << (4 - k)  # the first character is lane-id bit 4
            and_mask |= bit if ch in "pi" else 0
            or_mask |= bit if ch == "1" else 0
            xor_mask |= bit if ch == "i" else 0
        return and_mask | or_mask << 5 | xor_mask << 10
    size = int(args[0])
    if mode == "BROADCAST":
        return (0x1F & ~(size - 1)) | int(args[1]) << 5
    if mode == "SWAP":
        return 0x1F | size << 10
    if mode == "REVERSE":
        return 0x1F | (size - 1) << 10
    raise ValueError(f"swizzle mode {mode} is not modelled")


def swizzle_sources(offset: int) -> np.ndarray:
    """Source lane of every lane: offset[15] set is quad-permute mode (lane 4q + j reads lane
    4q + offset[2j+1:2j]); clear is bitmask mode within each 32 lanes (source = ((lane &
    and_mask) | or_mask) ^ xor_mask, masks in offset[4:0], [9:5], [14:10])."""
    if offset & 0x8000:
        return (LANE & ~3) | ((offset >> (2 * (LANE & 3))) & 3)
    and_mask, or_mask, xor_mask = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
    return (LANE & 32) | (((LANE & 31) & and_mask) | or_mask) ^ xor_mask


def _gather(w: Wave, data: np.ndarray, sources: np.ndarray) -> np.ndarray:
    # A lane whose source lane is inactive reads 0.
    active = w.exec_mask()
    return np.where(active[sources], data[sources], U32(0))


@op("ds_swizzle_b32", mods=("offset", "gds"))
def _swizzle(ctx: Ctx, w: Wave, i: Instruction) -> None:
    sources = swizzle_sources(swizzle_offset(i.mod("offset", "0")))
    data = w.read_vector(i.operands[1])[0]
    _pending(w, i, _gather(w, data, sources)[None, :], w.exec_mask())


@op("ds_bpermute_b32", mods=("offset", "gds"))
def _bpermute(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """Lane i reads lane ((addr[i] + offset) / 4) % 64 of data (a backward permute)."""
    addr = w.read_vector(i.operands[1])[0].astype(np.int64) + i.mod_int("offset")
    data = w.read_vector(i.operands[2])[0]
    _pending(w, i, _gather(w, data, (addr // 4) % LANES)[None, :], w.exec_mask())


@op("ds_permute_b32", mods=("offset", "gds"))
def _permute(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """Active lane i writes its data to lane ((addr[i] + offset) / 4) % 64 (a forward
    permute; a later lane wins a collision); lanes nobody writes read 0."""
    active = w.exec_mask()
    addr = w.read_vector(i.operands[1])[0].astype(np.int64) + i.mod_int("offset")
    data = w.read_vector(i.operands[2])[0]
    out = np.zeros(LANES, U32)
    targets = (addr // 4) % LANES
    out[targets[active]] = data[active]
    _pending(w, i, out[None, :], active)


def _swap(rows: int):
    """Swap lanes of VDST and SRC0: for permlane16, VDST lanes 16-31 / 48-63 with SRC0 lanes
    0-15 / 32-47; for permlane32, VDST lanes 32-63 with SRC0 lanes 0-31 (no EXEC term)."""
    low = (LANE // rows) % 2 == 0  # SRC0's lanes that move

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        a = w.read_vector(i.operands[0])[0].copy()
        b = w.read_vector(i.operands[1])[0].copy()
        partner = np.where(low, LANE + rows, LANE - rows)
        new_b = np.where(low, a[partner], b)
        new_a = np.where(~low, b[partner], a)
        everywhere = np.ones(LANES, bool)
        w.write_vector(i.operands[0], new_a, everywhere)
        w.write_vector(i.operands[1], new_b, everywhere)

    return run


op("v_permlane16_swap_b32", mods=("fi", "bound_ctrl"))(_swap(16))
op("v_permlane32_swap_b32", mods=("fi", "bound_ctrl"))(_swap(32))
