"""Compiled FlyDSL code objects executed end to end in the emulator and compared with torch: a
small buffer-load kernel of this directory, and aiter's bf16/f16 GEMM (with split-K and its
reduction kernel), for gfx942 and gfx950.
"""

from __future__ import annotations

import pytest
import torch

from aiter.emulator import Memory, launch, load_code_object, pack_kernargs
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.gemm_index import REDUCE_BLOCK, reduce_grid_size
from tests.emulator.conftest import GEMM_CONFIGS
from tests.emulator.emu_kernels import BLOCK
from tests.emulator.flydsl_args import place, tensor_args


def _only_kernel(code: bytes):
    (kernel,) = load_code_object(code).kernels.values()
    return kernel


# --- a kernel of our own ------------------------------------------------------------------------


def test_axpy_descriptor_is_read_as_the_dispatcher_reads_it(axpy_code) -> None:
    arch, code = axpy_code
    kernel = _only_kernel(code)
    kd = kernel.descriptor
    assert kernel.arch == arch and kernel.wavefront_size == 64
    assert kd.user_sgprs() == [("kernarg_segment_ptr", 0)] and kd.user_sgpr_count == 2
    assert kd.workgroup_id_enabled == (True, False, False) and kd.workitem_id_dims == 1
    assert [(a.offset, a.size, a.value_kind) for a in kernel.args][:2] == [
        (0, 8, "global_buffer"),
        (8, 4, "by_value"),
    ]
    assert kernel.entry < kernel.end and kernel.max_flat_workgroup_size == BLOCK


@pytest.mark.parametrize("n, seed", [(1000, 0), (1000, 1), (37, 2), (512, 3)])
def test_axpy_matches_torch(axpy_code, n: int, seed: int) -> None:
    """c = 2a + b with one element per work-item: the last work-group's lanes past n are clipped
    by the buffer range check (c's region is exactly n floats, so a store past it would fault)."""
    arch, code = axpy_code
    kernel = _only_kernel(code)
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    c = torch.full((n,), float("nan"))
    memory = Memory()
    values = [place(memory, a, "a"), n, place(memory, b, "b"), n, place(memory, c, "c"), n]
    stats = launch(
        code, kernel.name, (-(-n // BLOCK), 1, 1), (BLOCK, 1, 1), pack_kernargs(kernel, values),
        memory, seed=seed, races="raise",
    )  # fmt: skip
    torch.testing.assert_close(c, 2 * a + b, rtol=0, atol=0)
    assert stats.by_mnemonic["buffer_store_dword"] == 4 * -(-n // BLOCK)
    assert not stats.hazards


# --- aiter's GEMM -------------------------------------------------------------------------------


def _gemm(code: bytes, memory: Memory, a, b, bias, c, m, n, k, tile, split_k) -> None:
    kernel = _only_kernel(code)
    values = (
        tensor_args(memory, a, "a") + tensor_args(memory, b, "b")
        + tensor_args(memory, bias, "bias") + tensor_args(memory, c, "c") + [m, n, k]
    )  # fmt: skip
    grid = mx.grid_size(m, n, tile[0], tile[1], split_k)
    block = (mx.threads("mfma"), 1, 1)
    # races="raise": the epilogue's idle lanes once read the next wave's staging rows unfenced.
    launch(code, kernel.name, grid, block, pack_kernargs(kernel, values), memory, races="raise")


def _reduce(code: bytes, memory: Memory, ws, bias, out, m, n) -> None:
    kernel = _only_kernel(code)
    values = (
        tensor_args(memory, ws, "ws") + tensor_args(memory, bias, "bias")
        + tensor_args(memory, out, "out") + [m, n]
    )  # fmt: skip
    launch(code, kernel.name, (reduce_grid_size(m, n), 1, 1), (REDUCE_BLOCK, 1, 1),
           pack_kernargs(kernel, values), memory, races="raise")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(GEMM_CONFIGS)))
def test_gemm_a16w16_code_objects_match_torch(gemm_codes, index: int) -> None:
    """aiter's GEMM code objects (the launcher's exact kernels) at M, N not multiples of the
    tile and, with split-K 8 over 5 k-blocks, splits that own no k-block."""
    arch, codes = gemm_codes
    tile, split_k, dtype, out_dtype, with_bias = GEMM_CONFIGS[index]
    dtype, out_dtype = getattr(torch, dtype), getattr(torch, out_dtype)
    m, n, k = 37, 200, 160
    gen = torch.Generator().manual_seed(index)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(out_dtype) if with_bias else None
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    memory = Memory()
    entries = codes[index]
    bias_arg = bias if with_bias else out
    if split_k == 1:
        _gemm(entries["gemm_a16w16"], memory, a, b, bias_arg, out, m, n, k, tile, split_k)
    else:
        ws = torch.full((split_k, m, n), float("nan"))
        _gemm(entries["gemm_a16w16"], memory, a, b, out, ws, m, n, k, tile, split_k)
        _reduce(entries["gemm_a16w16_splitk_reduce"], memory, ws, bias_arg, out, m, n)
    ref = a.float() @ b.float().T + (bias.float() if with_bias else 0)
    tol = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 2e-2)}.get(out_dtype, (2e-3, 2e-3))
    torch.testing.assert_close(out.float(), ref.to(out_dtype).float(), rtol=tol[0], atol=tol[1])
