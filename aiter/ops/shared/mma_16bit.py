"""The 16-bit (bf16/fp16) MMA step every GEMM-shaped kernel shares: one k-block of a lane's
operand runs into a 16x16 fp32 tile (MFMA on gfx942/gfx950, WMMA on gfx1250).
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.shared import gemm_blocks
from aiter.ops.shared.gemm_blocks import row_loader
from aiter.ops.shared.gemm_index import WAVE_SIZE, k_run, operand_offset


def sub_vector(vec, start: int, length: int):
    return vec.shuffle(vec, [start + i for i in range(length)])


def mma_step(flavour: str, in_dtype, a_run, b_run, acc):
    """Accumulate one k-block (K_BLOCK elements of each lane's run) into a 16x16 tile."""
    if const_expr(flavour == "mfma"):
        acc_ty = fx.Vector.make_type(4, fx.Float32)
        # Two 16x16x16 steps; step s uses elements [4s, 4s + 4) of the 8-element run.
        for step in range_constexpr(2):
            a4 = sub_vector(a_run, 4 * step, 4)
            b4 = sub_vector(b_run, 4 * step, 4)
            if const_expr(in_dtype == fx.BFloat16):
                res = rocdl.mfma_f32_16x16x16bf16_1k(
                    acc_ty, [a4.bitcast(fx.Int16), b4.bitcast(fx.Int16), acc]
                )
            else:
                res = rocdl.mfma_f32_16x16x16f16(acc_ty, [a4, b4, acc])
            acc = fx.Vector(res)
        return acc
    acc_ty = fx.Vector.make_type(8, fx.Float32)
    if const_expr(in_dtype == fx.BFloat16):
        op = rocdl.wmma_f32_16x16x32_bf16
    else:
        op = rocdl.wmma_f32_16x16x32_f16
    return fx.Vector(op(acc_ty, a_run.ir_value(), b_run.ir_value(), acc.ir_value()).result)


def k_blocks(flavour, in_dtype, pa, pb, a_rows, b_rows, k, kb0, count: int, lane, accs):
    """Run `count` consecutive k-blocks starting at kb0 over all MMA tiles of a wave."""
    wsz = WAVE_SIZE[flavour]
    run = k_run(wsz)
    return gemm_blocks.k_blocks(
        lambda a_run, b_run, acc: mma_step(flavour, in_dtype, a_run, b_run, acc),
        row_loader(pa, operand_offset, k, lane, wsz, run, in_dtype),
        row_loader(pb, operand_offset, k, lane, wsz, run, in_dtype),
        a_rows,
        b_rows,
        kb0,
        count,
        accs,
    )
