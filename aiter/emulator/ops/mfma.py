"""Matrix-core semantics (v_mfma_*): operands gathered from the lanes into matrices, multiplied
with fp32 accumulation (exact i32 for the int8 forms), and scattered back in the D layout.

Lane layouts (CDNA3/CDNA4 ISA, "Matrix Fused Multiply Add"; AMD's matrix instruction
calculator). An MxNxK MFMA with M = N = 16 or 32 holds P = K * M / 64 elements of A per lane:
A[i][k] in lane i + M * (k // P), element k % P; B[k][j] in lane j + N * (k // P), element k % P.
C and D: 16x16, D[i][j] in lane j + 16 * (i // 4), register i % 4; 32x32, D[i][j] in lane
j + 32 * ((i // 4) % 2), register 4 * (i // 8) + i % 4.

The scaled gfx950 forms (v_mfma_scale_f32_*_f8f6f4) take the A/B element formats from cbsz/blgp
(0 fp8, 1 bf8, 2 fp6, 3 bf6, 4 fp4; LLVM AMDGPUUsage and its mfma.scale tests) and one E8M0
scale per lane, byte op_sel[k] + 2 * op_sel_hi[k] of the scale operand, that multiplies the
lane's own block of 32 A (or B) elements (OCP MX: one scale per 32-element block).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.errors import UnsupportedInstruction
from aiter.emulator.ops.minifloat import E2M1, E2M3, E3M2, e8m0_to_f32, fp8_formats
from aiter.emulator.ops.numeric import bf16_to_f32, op_sel
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import LANES, MASK64, Wave

U32 = np.uint32
_LANE = np.arange(LANES)
# Element kinds: bits per element, and a decoder of the raw codes given the arch.
_BITS = {"bf16": 16, "f16": 16, "fp8": 8, "bf8": 8, "i8": 8, "fp6": 6, "bf6": 6, "fp4": 4}
_SCALED_KINDS = ("fp8", "bf8", "fp6", "bf6", "fp4")  # cbsz / blgp values 0..4


def unpack_bits(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint32 [dwords, 64] as `count` little-endian `bits`-wide codes per lane: [64, count]."""
    words = np.concatenate([raw, np.zeros((1, raw.shape[1]), U32)]).astype(np.uint64)
    start = np.arange(count) * bits
    word, shift = start // 32, (start % 32).astype(np.uint64)
    pairs = words[word] | (words[word + 1] << np.uint64(32))  # [count, 64]
    return ((pairs >> shift[:, None]) & np.uint64((1 << bits) - 1)).T


def decode_elements(raw: np.ndarray, kind: str, count: int, arch: str) -> np.ndarray:
    """Lane elements as float64 (int64 for i8): [64, count]."""
    codes = unpack_bits(raw, _BITS[kind], count)
    if kind == "bf16":
        return bf16_to_f32(codes.astype(U32)).astype(np.float64)
    if kind == "f16":
        return codes.astype(np.uint16).view(np.float16).astype(np.float64)
    if kind == "i8":
        return codes.astype(np.uint8).view(np.int8).astype(np.int64)
    fmt = {"fp6": E2M3, "bf6": E3M2, "fp4": E2M1}.get(kind)
    if fmt is None:
        fmt = fp8_formats(arch)[kind == "bf8"]
    return fmt.decode(codes).astype(np.float64)


def gather_a(lanes: np.ndarray, m: int) -> np.ndarray:
    """[64, P] lane elements -> A [m, K] (B^T [n, K] alike)."""
    per_lane = lanes.shape[1]
    groups = LANES // m
    out = np.empty((m, groups * per_lane), lanes.dtype)
    for g in range(groups):
        out[:, g * per_lane : (g + 1) * per_lane] = lanes[g * m : (g + 1) * m]
    return out


def d_index(m: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of D held by [register, lane]."""
    regs = m * m // LANES
    r = np.arange(regs)[:, None]
    col = np.broadcast_to(_LANE % m, (regs, LANES))
    if m == 16:
        row = 4 * (_LANE // 16)[None, :] + r
    else:
        row = 8 * (r // 4) + 4 * (_LANE // 32)[None, :] + r % 4
    return row, col


def _check(ctx: Ctx, w: Wave, i: Instruction, broadcast_mods: tuple[str, ...]) -> None:
    for name in broadcast_mods:
        if i.mod_int(name):
            raise UnsupportedInstruction(i.mnemonic, ctx.kernel.name, i.address, name)
    if w.exec != MASK64:
        # MFMA results with a partial EXEC are not modelled; FlyDSL never issues one.
        raise UnsupportedInstruction(
            i.mnemonic, ctx.kernel.name, i.address, f"EXEC {w.exec:#x} is not all lanes"
        )


def _finish(ctx: Ctx, w: Wave, i: Instruction, m: int, a, b, integer: bool) -> None:
    """D = A @ B^T + C, written in the D layout."""
    regs = m * m // LANES
    row, col = d_index(m)
    raw_c = w.read_vector(i.operands[3], regs, None if integer else "f32")
    c = np.zeros((m, m), np.int64 if integer else np.float64)
    c[row, col] = raw_c.view(np.int32) if integer else raw_c.view(np.float32)
    d = a @ b.T + c
    if integer:
        out = (d & 0xFFFFFFFF).astype(np.uint64).astype(U32)[row, col]
    else:
        out = d.astype(np.float32)[row, col].view(U32)
    w.write_vector(i.operands[0], out, np.ones(LANES, bool))
    ctx.counts["mfma"] = ctx.counts.get("mfma", 0) + 1


def mfma(m: int, k: int, kind: str, kind_b: str | None = None):
    """A dense MxMxK MFMA on elements of `kind` (B of `kind_b` when it differs)."""
    per_lane = k * m // LANES
    kinds = (kind, kind_b or kind)

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        _check(ctx, w, i, ("cbsz", "abid", "blgp"))
        mats = []
        for n, t in enumerate(kinds):
            raw = w.read_vector(i.operands[1 + n], per_lane * _BITS[t] // 32)
            mats.append(gather_a(decode_elements(raw, t, per_lane, ctx.kernel.arch), m))
        _finish(ctx, w, i, m, mats[0], mats[1], kind == "i8")

    return run


def mfma_scaled(m: int, k: int) -> Callable[[Ctx, Wave, Instruction], None]:
    """V_MFMA_SCALE_F32_MxMxK_F8F6F4: A in format cbsz, B in format blgp, each lane's elements
    times 2 ** (its scale byte - 127)."""
    per_lane = k * m // LANES

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        _check(ctx, w, i, ("abid",))
        sel, sel_hi = op_sel(i), op_sel(i, "op_sel_hi")
        operands = []
        for n, fmt_mod in ((0, "cbsz"), (1, "blgp")):
            kind = _SCALED_KINDS[i.mod_int(fmt_mod)]
            dwords = per_lane * _BITS[kind] // 32
            raw = w.read_vector(i.operands[1 + n], dwords)
            lanes = decode_elements(raw, kind, per_lane, ctx.kernel.arch)
            byte = sel[n] + 2 * sel_hi[n]
            scale_raw = w.read_vector(i.operands[4 + n])[0]
            scale = e8m0_to_f32((scale_raw >> U32(8 * byte)) & U32(0xFF))
            operands.append(gather_a(lanes * scale[:, None], m))
        _finish(ctx, w, i, m, operands[0], operands[1], False)

    return run


_MODS = ("cbsz", "abid", "blgp")
op("v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x16bf16_1k", mods=_MODS)(mfma(16, 16, "bf16"))
op("v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16f16", mods=_MODS)(mfma(16, 16, "f16"))
op("v_mfma_f32_16x16x32_bf16", mods=_MODS)(mfma(16, 32, "bf16"))
op("v_mfma_f32_16x16x32_f16", mods=_MODS)(mfma(16, 32, "f16"))
op("v_mfma_f32_32x32x8_bf16", "v_mfma_f32_32x32x8bf16_1k", mods=_MODS)(mfma(32, 8, "bf16"))
op("v_mfma_f32_32x32x8_f16", "v_mfma_f32_32x32x8f16", mods=_MODS)(mfma(32, 8, "f16"))
op("v_mfma_f32_32x32x16_bf16", mods=_MODS)(mfma(32, 16, "bf16"))
op("v_mfma_f32_32x32x16_f16", mods=_MODS)(mfma(32, 16, "f16"))
for _a in ("fp8", "bf8"):
    for _b in ("fp8", "bf8"):
        op(f"v_mfma_f32_16x16x32_{_a}_{_b}", mods=_MODS)(mfma(16, 32, _a, _b))
        op(f"v_mfma_f32_32x32x16_{_a}_{_b}", mods=_MODS)(mfma(32, 16, _a, _b))
op("v_mfma_i32_16x16x32_i8", mods=_MODS)(mfma(16, 32, "i8"))
op("v_mfma_i32_16x16x64_i8", mods=_MODS)(mfma(16, 64, "i8"))
op("v_mfma_i32_32x32x16_i8", mods=_MODS)(mfma(32, 16, "i8"))
op("v_mfma_i32_32x32x32_i8", mods=_MODS)(mfma(32, 32, "i8"))
_SCALE_MODS = ("cbsz", "abid", "blgp", "op_sel", "op_sel_hi")
op("v_mfma_scale_f32_16x16x128_f8f6f4", mods=_SCALE_MODS)(mfma_scaled(16, 128))
op("v_mfma_scale_f32_32x32x64_f8f6f4", mods=_SCALE_MODS)(mfma_scaled(32, 64))
