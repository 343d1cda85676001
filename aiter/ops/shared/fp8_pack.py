"""fp32 values to the arch's fp8 codes, four per 32-bit word (FlyDSL kernel helper)."""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import range_constexpr, rocdl


def pack_fp8(values):
    """fp32 values (a multiple of 4) rounded to the arch's fp8 (v_cvt_pk_fp8_f32, round to
    nearest even), four per 32-bit word in order."""
    words = []
    for w in range_constexpr(len(values) // 4):
        word = rocdl.cvt_pk_fp8_f32(
            fx.Int32.ir_type, values[4 * w].ir_value(), values[4 * w + 1].ir_value(),
            fx.Int32(0).ir_value(), False,
        )  # fmt: skip
        word = rocdl.cvt_pk_fp8_f32(
            fx.Int32.ir_type, values[4 * w + 2].ir_value(), values[4 * w + 3].ir_value(), word,
            True,
        )  # fmt: skip
        words.append(fx.Int32(word))
    return words
