"""FlyDSL kernel and launcher of moe_quant_per_token: the fp8 MoE stages' per-token quantization
of their activations, x ~= q * scale with one fp32 scale per row, in one launch.

One block per row; the row is read once into registers and q written once (quant_index.py has
the layout and the reduction). One source serves gfx942 (FNUZ fp8, wave64), gfx950 (OCP fp8,
wave64) and gfx1250 (OCP fp8, wave32).
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import math as fxmath
from flydsl.expr import range_constexpr, rocdl
from flydsl.runtime.device import get_rocm_arch

from aiter.arch import get_arch
from aiter.ops.moe.kernels.quant_index import (
    K_MULTIPLE,
    MAX_K,
    SCALE_FLOOR,
    THREADS,
    VEC,
    chunks_for,
    run_start,
    waves_per_block,
    xor_offsets,
)
from aiter.ops.shared import SOURCES_DIGEST as SHARED_HELPERS
from aiter.ops.shared.fp8_pack import pack_fp8
from aiter.ops.shared.gemm_blocks import to_stream
from aiter.ops.shared.kernel_tensors import kernel_tensors
from aiter.ops.shared.launch_args import check_int, check_rank, check_tensor
from aiter.ops.shared.mainloop import buffer_rows, load_chunk
from aiter.ops.shared.mainloop_index import OUT_OF_RANGE

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


def _fp8_dtype() -> torch.dtype:
    """The fp8 the target arch's v_cvt_pk_fp8_f32 writes (FNUZ on gfx942, OCP elsewhere)."""
    return get_arch(get_rocm_arch()).fp8_dtype


def _store_words(buf, valid, byte, words):
    """Store 32-bit words at a byte offset of a buffer where valid (elsewhere dropped)."""
    offset = valid.select(fx.Int32(byte), fx.Int32(OUT_OF_RANGE))
    value = fx.Vector.from_elements(words, fx.Int32) if len(words) > 1 else words[0]
    rocdl.raw_ptr_buffer_store(
        value.ir_value(), rocdl.get_buffer_rsrc(buf), fx.Int32(offset).ir_value(),
        fx.Int32(0).ir_value(),
    )  # fmt: skip


@flyc.kernel
def moe_quant_per_token_kernel(
    x: fx.Tensor,
    q: fx.Tensor,
    scale: fx.Tensor,
    k: fx.Int32,
    chunks: fx.Constexpr[int],
):
    """Block r: scale[r] = max(max |x[r]|, SCALE_FLOOR) / fp8_max, q[r] = fp8(x[r] / scale[r])."""
    wave_size = get_arch(get_rocm_arch()).wave_size
    tid, row = fx.thread_idx.x, fx.block_idx.x
    one = fx.Int32(1)
    x_row = buffer_rows(fx.get_iter(x), row, one, k, 2, tile_rows=1)
    loaded = []
    for c in range_constexpr(chunks):
        start = run_start(c, tid)
        loaded.append(load_chunk(x_row, start < k, start, x.dtype, 2))
    rocdl.sched_barrier(0)  # every load issued before the first wait (gfx1250 interleaves them)
    runs = [run.to(fx.Float32) for run in loaded]
    amax = fx.Float32(0.0)
    for run in runs:
        for v in range_constexpr(VEC):
            amax = fx.maxnumf(amax, fxmath.absf(run[v]))
    for offset in xor_offsets(wave_size):
        amax = fx.maxnumf(amax, amax.shuffle_xor(offset, wave_size))
    waves = waves_per_block(wave_size)
    storage = fx.SharedAllocator().allocate(fx.Array[fx.Uint8, 4 * waves, 16])
    lds = fx.recast_iter(fx.Float32, storage.peek().ptr)
    # Every lane holds its wave's maximum: the lanes' writes of the word agree.
    fx.ptr_store(amax, lds + tid // wave_size)
    fx.barrier()
    amax = fx.Float32(fx.ptr_load(lds))
    for w in range_constexpr(1, waves):
        amax = fx.maxnumf(amax, fx.Float32(fx.ptr_load(lds + w)))
    fp8_max = torch.finfo(_fp8_dtype()).max
    row_scale = fx.maxnumf(amax, fx.Float32(SCALE_FLOOR)) / fx.Float32(fp8_max)
    scale_row = buffer_rows(fx.get_iter(scale), row, one, one, 4, tile_rows=1)
    _store_words(scale_row, tid == 0, 0, [row_scale.bitcast(fx.Int32)])
    q_row = buffer_rows(fx.get_iter(q), row, one, k, 1, tile_rows=1)
    for c in range_constexpr(chunks):
        start = run_start(c, tid)
        values = [runs[c][v] / row_scale for v in range_constexpr(VEC)]
        _store_words(q_row, start < k, start, pack_fp8(values))


@flyc.jit
def moe_quant_per_token(
    x: fx.Tensor,
    q: fx.Tensor,
    scale: fx.Tensor,
    rows: fx.Int32,
    k: fx.Int32,
    chunks: fx.Constexpr[int],
    stream: fx.Stream = fx.Stream(None),
):
    _ = SHARED_HELPERS  # FlyDSL keys this kernel by the shared helpers' sources
    moe_quant_per_token_kernel(x, q, scale, k, chunks).launch(
        grid=(rows, 1, 1), block=(THREADS, 1, 1), stream=stream
    )


# --- host side ---------------------------------------------------------------------------------


def launch_moe_quant_per_token(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, *, stream: Any | None = None
) -> None:
    """Launch moe_quant_per_token: per-row fp8 quantization, x ~= q * scale.

    Contract (the launcher reads shapes and strides only, never data):

    - x bfloat16 or float16 [rows, K], K a positive multiple of 8 and at most MAX_K (16384);
      q [rows, K] of the arch's fp8 (float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950 and
      gfx1250); scale float32 [rows, 1]. Each laid out contiguously, last axis unit stride.
    - scale[r] = max(max_k |x[r, k]|, 1e-10) / fp8_max and q[r, k] = x[r, k] / scale[r] in
      fp32, rounded to nearest even: the torch reference's arithmetic exactly (fp8_max is
      240 for FNUZ, 448 for OCP). rows == 0 launches nothing.
    - stream: None (default stream), an fx.Stream, a raw handle int, or any object with a
      `cuda_stream` attribute.
    - Tensors may be CPU tensors or FakeTensors when COMPILE_ONLY=1: the kernel compiles and
      nothing runs.
    """
    rows, k = check_rank("x", x, 2, "[rows, K]")
    check_int("x: K = x.shape[1]", k, 1, MAX_K)
    if k % K_MULTIPLE:
        raise ValueError(f"x: K = x.shape[1] must be a multiple of {K_MULTIPLE}, got {k}")
    check_tensor("x", x, ACTIVATION_DTYPES, (rows, k), "[rows, K]")
    check_tensor("q", q, _fp8_dtype(), (rows, k), "[rows, K]")
    check_tensor("scale", scale, torch.float32, (rows, 1), "[rows, 1]")
    if rows == 0:
        return
    x, q, scale = kernel_tensors(x, q, scale)
    moe_quant_per_token(x, q, scale, rows, k, chunks_for(k), stream=to_stream(stream))
