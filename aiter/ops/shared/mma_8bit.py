"""The 8-bit (fp8/int8) MMA step every GEMM-shaped kernel shares: one k-block of a lane's
operand runs (the weight row-major or preshuffled) into a 16x16 fp32/int32 tile.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl

from aiter.ops.shared import gemm_blocks
from aiter.ops.shared.gemm_blocks import load_run, row_loader
from aiter.ops.shared.gemm_index_8bit import (
    SHUFFLE_K,
    WAVE_SIZE,
    a_offset,
    b_chunk_offset,
    chunks_per_run,
    k_run,
    mma_steps,
)


def acc_dtype(in_dtype):
    return fx.Int32 if const_expr(in_dtype == fx.Int8) else fx.Float32


def mma_step(mma: str, in_dtype, a_run, b_run, acc):
    """Accumulate one k-block (each lane's K_BLOCK-wide run slice) into a 16x16 tile."""
    is_int = in_dtype == fx.Int8
    if const_expr(mma == "mfma"):
        acc_ty = fx.Vector.make_type(4, acc_dtype(in_dtype))
        # Step s feeds bytes [8s, 8s + 8) of the 16-byte run to one 16x16x32 MFMA.
        a64 = a_run.bitcast(fx.Int64)
        b64 = b_run.bitcast(fx.Int64)
        for step in range_constexpr(mma_steps(mma)):
            if const_expr(is_int):
                res = rocdl.mfma_i32_16x16x32_i8(acc_ty, [a64[step], b64[step], acc])
            else:
                res = rocdl.mfma_f32_16x16x32_fp8_fp8(acc_ty, [a64[step], b64[step], acc])
            acc = fx.Vector(res)
        return acc
    acc_ty = fx.Vector.make_type(8, acc_dtype(in_dtype))
    a32 = a_run.bitcast(fx.Int32).ir_value()
    b32 = b_run.bitcast(fx.Int32).ir_value()
    if const_expr(is_int):
        op = rocdl.wmma_i32_16x16x64_iu8(acc_ty, a32, b32, acc.ir_value(), signA=True, signB=True)
    else:
        op = rocdl.wmma_f32_16x16x64_fp8_fp8(acc_ty, a32, b32, acc.ir_value())
    return fx.Vector(op.result)


def load_b_run(pb, row, k, kb, lane, wsz: int, shuffled: bool, dtype):
    """A lane's K run of weight row `row` in k-block kb (preshuffled or row-major WQ)."""
    if const_expr(not shuffled):
        return load_run(pb, a_offset(row, k, kb, lane, wsz), k_run(wsz), dtype)
    parts = [
        load_run(pb, b_chunk_offset(row, k, kb, lane, wsz, c), SHUFFLE_K, dtype)
        for c in range_constexpr(chunks_per_run(wsz))
    ]
    run = parts[0]
    for c in range_constexpr(1, len(parts)):
        run = run.shuffle(parts[c], list(range(SHUFFLE_K * (c + 1))))
    return run


def k_blocks(mma, in_dtype, shuffled, pa, pb, a_rows, b_rows, k, kb0, count: int, lane, accs):
    """Run `count` consecutive k-blocks starting at kb0 over all MMA tiles of a wave."""
    wsz = WAVE_SIZE[mma]
    return gemm_blocks.k_blocks(
        lambda a_run, b_run, acc: mma_step(mma, in_dtype, a_run, b_run, acc),
        row_loader(pa, a_offset, k, lane, wsz, k_run(wsz), in_dtype),
        lambda row, kb: load_b_run(pb, row, k, kb, lane, wsz, shuffled, in_dtype),
        a_rows,
        b_rows,
        kb0,
        count,
        accs,
    )
