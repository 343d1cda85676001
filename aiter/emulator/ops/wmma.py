"""gfx1250 matrix semantics (v_wmma_*, wave32): a 16x16xK product with fp32 accumulation.

Lane layouts (gfx12 ISA, "Dense Matrix Layouts"; the same layout composable_kernel's gfx12 WMMA
traits state: M lanes 16, K lanes 2, 8 contiguous K elements per group). A [16, K] holds
K / 2 elements per lane: lane l has row l % 16, and its element e is
K = 16 * (e // 8) + 8 * (l // 16) + e % 8; B [K, 16] alike with column l % 16. C and D
[16, 16] fp32 take 8 VGPRs: register r of lane l holds row 8 * (l // 16) + r, column l % 16.
"""

from __future__ import annotations

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.errors import UnsupportedInstruction
from aiter.emulator.ops.mfma import _BITS, decode_elements
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import LANES, MASK32, Wave

U32 = np.uint32
WAVE = 32
MN = 16
_LANE = np.arange(WAVE)


def k_index(k: int) -> np.ndarray:
    """K of element e of lane l of an A (or B) operand: [32, K / 2]."""
    e = np.arange(k // 2)
    return 16 * (e // 8)[None, :] + 8 * (_LANE // 16)[:, None] + (e % 8)[None, :]


def gather(lanes: np.ndarray, k: int) -> np.ndarray:
    """[32, K / 2] lane elements -> [16, K] (A's rows, or B's columns as rows)."""
    out = np.empty((MN, k), lanes.dtype)
    out[(_LANE % MN)[:, None], k_index(k)] = lanes
    return out


def d_index() -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of D held by [register, lane] (8 registers, 32 lanes)."""
    r = np.arange(8)[:, None]
    return 8 * (_LANE // 16)[None, :] + r, np.broadcast_to(_LANE % MN, (8, WAVE))


def wmma(k: int, kind: str, integer: bool = False):
    per_lane = k // 2
    dwords = per_lane * _BITS[kind] // 32

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        for name in ("neg_lo", "neg_hi"):
            if any(int(b) for b in (i.mod(name) or "[0]").strip("[]").split(",")):
                raise UnsupportedInstruction(i.mnemonic, ctx.kernel.name, i.address, name)
        if w.exec & MASK32 != MASK32:
            raise UnsupportedInstruction(
                i.mnemonic, ctx.kernel.name, i.address, f"EXEC {w.exec:#x} is not all lanes"
            )
        mats = []
        for n in (1, 2):
            raw = w.read_vector(i.operands[n], dwords)
            elements = decode_elements(raw, kind, per_lane, ctx.kernel.arch)[:WAVE]
            mats.append(gather(elements, k))
        row, col = d_index()
        raw_c = w.read_vector(i.operands[3], 8, None if integer else "f32")[:, :WAVE]
        c = np.zeros((MN, MN), np.int64 if integer else np.float64)
        c[row, col] = raw_c.view(np.int32) if integer else raw_c.view(np.float32)
        d = mats[0] @ mats[1].T + c
        if integer:
            lanes = (d & 0xFFFFFFFF).astype(np.uint64).astype(U32)[row, col]
        else:
            lanes = d.astype(np.float32)[row, col].view(U32)
        out = np.zeros((8, LANES), U32)
        out[:, :WAVE] = lanes
        w.write_vector(i.operands[0], out, np.arange(LANES) < WAVE)
        ctx.counts["mfma"] = ctx.counts.get("mfma", 0) + 1

    return run


# matrix_a_reuse / matrix_b_reuse are operand-cache hints.
_MODS = ("neg_lo", "neg_hi", "matrix_a_reuse", "matrix_b_reuse", "clamp")
op("v_wmma_f32_16x16x32_bf16", mods=_MODS)(wmma(32, "bf16"))
op("v_wmma_f32_16x16x32_f16", mods=_MODS)(wmma(32, "f16"))
op("v_wmma_f32_16x16x64_fp8_fp8", mods=_MODS)(wmma(64, "fp8"))
op("v_wmma_f32_16x16x64_bf8_bf8", mods=_MODS)(wmma(64, "bf8"))
