"""fp8/bf8 conversions (v_cvt_pk_fp8_f32, v_cvt_f32_fp8, ...) in the flavour of the kernel's
arch: FNUZ on gfx942 (CDNA3 ISA), OCP on gfx950 (CDNA4 ISA).

f32 -> fp8 rounds to nearest even and does not saturate unless `clamp` is set: past max + half
a step the result is NaN (E4M3, FNUZ E5M2) or inf (OCP E5M2). ROCm/rocm-systems#9556 measured
this on MI300X/MI355X (448 + 18 -> 0x7f on gfx950); triton-lang/triton#7327 quotes the ISA.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.ops.minifloat import fp8_formats
from aiter.emulator.ops.numeric import op_sel, source
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.ops.vector import LANE_OPS, LaneOp
from aiter.emulator.state import Wave

U32 = np.uint32


def _pack(which: int) -> Callable[[Ctx, Wave, Instruction], None]:
    """V_CVT_PK_{FP8,BF8}_F32: D.b16[op_sel dst] = {cvt(S1), cvt(S0)}, the other half kept."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        fmt = fp8_formats(ctx.kernel.arch)[which]
        a = source(w, i.operands[1], "f32")
        b = source(w, i.operands[2], "f32")
        saturate = i.has("clamp")
        pair = fmt.encode(a, saturate) | (fmt.encode(b, saturate) << U32(8))
        old = w.vgpr[w.vrow(i.operands[0])]
        high = op_sel(i)[2]  # which 16-bit half takes the pair; the other is kept
        keep = U32(0xFFFF) if high else U32(0xFFFF0000)
        out = (old & keep) | (pair << U32(16 * high))
        w.write_vector(i.operands[0], out, w.exec_mask())

    return run


op("v_cvt_pk_fp8_f32", mods=("op_sel", "clamp"))(_pack(0))
op("v_cvt_pk_bf8_f32", mods=("op_sel", "clamp"))(_pack(1))


def _to_f32(which: int, packed: bool) -> Callable[[str], Callable[..., np.ndarray]]:
    """V_CVT_F32_{FP8,BF8}: byte 0 of S0 (SDWA src0_sel picks another byte);
    V_CVT_PK_F32_{FP8,BF8}: bytes 0 and 1 (src0_sel WORD_1 picks the high half)."""

    def bind(arch: str) -> Callable[..., np.ndarray]:
        fmt = fp8_formats(arch)[which]

        def fn(raw: np.ndarray) -> np.ndarray:
            lo = fmt.decode(raw & U32(0xFF))
            if not packed:
                return lo
            return np.stack([lo, fmt.decode((raw >> U32(8)) & U32(0xFF))])

        return fn

    return bind


def _unpack_run(name: str) -> Callable[[Ctx, Wave, Instruction], None]:
    spec = LANE_OPS[name]

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        raw = source(w, i.operands[1], "u32")
        value = spec.bind(ctx.kernel.arch)(raw).astype(np.float32)
        w.write_vector(i.operands[0], value.view(U32), w.exec_mask())

    return run


for _which, _fp in enumerate(("fp8", "bf8")):
    LANE_OPS[f"v_cvt_f32_{_fp}"] = LaneOp("f32", ("u32",), arch_fn=_to_f32(_which, False))
    LANE_OPS[f"v_cvt_pk_f32_{_fp}"] = LaneOp("f32x2", ("u32",), arch_fn=_to_f32(_which, True))
    # The e32 form reads byte/word 0; the op_sel byte select of the e64 form is refused.
    op(f"v_cvt_f32_{_fp}")(_unpack_run(f"v_cvt_f32_{_fp}"))
    op(f"v_cvt_pk_f32_{_fp}")(_unpack_run(f"v_cvt_pk_f32_{_fp}"))
