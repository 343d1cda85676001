"""Matrix-core semantics (v_mfma_*) for the 16x16 dense forms: operands gathered from the lanes
into matrices, multiplied with fp32 accumulation, and scattered back in the D lane layout.

Lane layouts (CDNA3 ISA, "Matrix Fused Multiply Add"; AMD's matrix instruction calculator) for
a 16x16xK MFMA with P = K / 4 elements per lane:
A[i][k] in lane i + 16 * (k // P), element k % P; B[k][j] in lane j + 16 * (k // P), element
k % P; C and D[i][j] in lane j + 16 * (i // 4), register i % 4.
"""

from __future__ import annotations

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.errors import UnsupportedInstruction
from aiter.emulator.ops.numeric import bf16_to_f32
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import LANES, MASK64, Wave

U32 = np.uint32
_LANE = np.arange(LANES)


def _elements(raw: np.ndarray, dtype: str) -> np.ndarray:
    """uint32 [dwords, 64] of packed 16-bit elements -> float64 [64, 2 * dwords]."""
    halves = np.stack([raw & U32(0xFFFF), raw >> U32(16)], axis=1).reshape(-1, LANES)
    f16 = halves.astype(np.uint16).view(np.float16)
    values = bf16_to_f32(halves) if dtype == "bf16" else f16
    return values.T.astype(np.float64)


def _mfma_16x16(k: int, dtype: str):
    per_lane = k // 4

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        for name in ("cbsz", "abid", "blgp"):
            if i.mod_int(name):
                raise UnsupportedInstruction(i.mnemonic, ctx.kernel.name, i.address, name)
        if w.exec != MASK64:
            # MFMA results with a partial EXEC are not modelled; FlyDSL never issues one.
            raise UnsupportedInstruction(
                i.mnemonic, ctx.kernel.name, i.address, f"EXEC {w.exec:#x} is not all lanes"
            )
        dst, src_a, src_b, src_c = i.operands
        a_lanes = _elements(w.read_vector(src_a, per_lane // 2), dtype)  # [64, P]
        b_lanes = _elements(w.read_vector(src_b, per_lane // 2), dtype)
        a = np.empty((16, k))
        b = np.empty((k, 16))
        row, group = _LANE % 16, _LANE // 16
        for e in range(per_lane):
            a[row, group * per_lane + e] = a_lanes[:, e]
            b[group * per_lane + e, row] = b_lanes[:, e]
        c_lanes = w.read_vector(src_c, 4, "f32").view(np.float32)  # [4, 64]
        c = np.empty((16, 16))
        for r in range(4):
            c[group * 4 + r, row] = c_lanes[r]
        d = (a @ b + c).astype(np.float32)
        out = np.empty((4, LANES), np.float32)
        for r in range(4):
            out[r] = d[group * 4 + r, row]
        w.write_vector(dst, out.view(U32), np.ones(LANES, bool))
        ctx.counts["mfma"] = ctx.counts.get("mfma", 0) + 1

    return run


_MODS = ("cbsz", "abid", "blgp")
op("v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x16bf16_1k", mods=_MODS)(_mfma_16x16(16, "bf16"))
op("v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16f16", mods=_MODS)(_mfma_16x16(16, "f16"))
op("v_mfma_f32_16x16x32_bf16", mods=_MODS)(_mfma_16x16(32, "bf16"))
op("v_mfma_f32_16x16x32_f16", mods=_MODS)(_mfma_16x16(32, "f16"))
