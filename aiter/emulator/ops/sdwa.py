"""SDWA (sub-dword addressing) forms of VOP1/VOP2/VOPC: each source is a byte or word of its
register (zero- or sign-extended), and the result goes to a byte or word of the destination.

Rules from the CDNA3 ISA, "Sub-Dword Addressing" (src0_sel/src1_sel, sext, dst_sel,
dst_unused: UNUSED_PAD zeroes the other bits, UNUSED_SEXT sign-extends the result into the
bits above it, UNUSED_PRESERVE keeps them).
"""

from __future__ import annotations

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.ops.numeric import FLOATS, WORDS, typed, words_of
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.ops.vector import COMPARES, LANE_OPS
from aiter.emulator.state import Wave, mask_to_bits

U32 = np.uint32
# Selector -> (bit offset, width).
_SEL = {
    "BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
    "WORD_0": (0, 16), "WORD_1": (16, 16), "DWORD": (0, 32),
}  # fmt: skip
_MODS = ("dst_sel", "dst_unused", "src0_sel", "src1_sel", "clamp")


def _field(raw: np.ndarray, sel: str, sext: bool) -> np.ndarray:
    shift, width = _SEL[sel]
    if width == 32:
        return raw
    value = (raw >> U32(shift)) & U32((1 << width) - 1)
    if sext:
        sign = (value >> U32(width - 1)) & U32(1)
        value = value | (sign * U32((0xFFFFFFFF << width) & 0xFFFFFFFF))
    return value


def _sources(w: Wave, i: Instruction, types: tuple[str, ...], first: int) -> list[np.ndarray]:
    args = []
    for k, t in enumerate(types):
        operand = i.operands[first + k]
        raw = w.read_vector(operand, 1, t if t in FLOATS else None)[0]
        raw = _field(raw, i.mod(f"src{k}_sel", "DWORD"), operand.sext)
        value = typed(raw[None, :], t if WORDS.get(t) == 1 else "u32")
        if operand.abs:
            value = np.abs(value)
        if operand.neg:
            value = -value
        args.append(value)
    return args


def _place(w: Wave, i: Instruction, result: np.ndarray) -> np.ndarray:
    shift, width = _SEL[i.mod("dst_sel", "DWORD")]
    if width == 32:
        return result
    mask = U32(((1 << width) - 1) << shift)
    placed = (result << U32(shift)) & mask
    unused = i.mod("dst_unused", "UNUSED_PAD")
    if unused == "UNUSED_PRESERVE":
        return placed | (w.vgpr[w.vrow(i.operands[0])] & ~mask)
    if unused == "UNUSED_SEXT":
        sign = (result >> U32(width - 1)) & U32(1)
        above = U32((0xFFFFFFFF << (shift + width)) & 0xFFFFFFFF)
        return placed | (sign * above)
    return placed


def _lane(name: str):
    spec = LANE_OPS[name]

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        if i.has("clamp"):
            raise ValueError("clamp on an SDWA form is not modelled")
        args = _sources(w, i, spec.srcs, 1)
        with np.errstate(all="ignore"):
            result = spec.bind(ctx.kernel.arch)(*args)
        if spec.dst == "f32x2":
            if i.mod("dst_sel", "DWORD") != "DWORD":
                raise ValueError("a two-dword result takes dst_sel:DWORD")
            out = np.asarray(result, np.float32).view(U32)
        else:
            t = "f32" if spec.dst == "bf16" else spec.dst
            out = _place(w, i, words_of(result, t)[0])
        w.write_vector(i.operands[0], out, w.exec_mask())

    return run


def _compare(name: str):
    t, fn = COMPARES[name]

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        a, b = _sources(w, i, (t, t), 1)
        with np.errstate(all="ignore"):
            result = fn(a, b) & mask
        # VOPC SDWA on gfx9 writes the SGPR pair named first (VCC when it is vcc).
        w.write_scalar(i.operands[0], mask_to_bits(result))

    return run


def register_sdwa() -> None:
    """Register `<name>_sdwa` for every one-dword lane-wise operation and compare (SDWA has
    no 64-bit operands)."""
    for name, spec in LANE_OPS.items():
        if spec.dst == "f32x2" or all(WORDS.get(t) == 1 for t in (spec.dst, *spec.srcs)):
            op(f"{name}_sdwa", mods=_MODS)(_lane(name))
    for name, (t, _) in COMPARES.items():
        if WORDS[t] == 1:
            op(f"{name}_sdwa", mods=_MODS)(_compare(name))
