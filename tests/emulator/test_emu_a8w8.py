"""aiter's fp8 GEMMs (bpreshuffle with a preshuffled weight, and 128-blockscale; split-K with its
semaphore atomics) executed from their compiled code objects and compared with torch, for
gfx942 (FNUZ fp8, v_mfma_f32_16x16x32_fp8_fp8) and gfx950 (OCP fp8, the scaled f8f6f4 MFMA).
"""

from __future__ import annotations

import pytest
import torch

from aiter.emulator import Memory, launch, load_code_object, pack_kernargs
from aiter.ops.gemm.kernels import a8w8
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.preshuffle import shuffle_weight
from tests.emulator.conftest import A8W8_CONFIGS, FP8_DTYPE
from tests.emulator.flydsl_args import tensor_args

# Tolerance: fp8 x fp8 products and their fp32 sums are exact up to fp32 rounding of a
# different summation order (relative ~1e-6), so the difference is the final bf16 rounding: at
# most one bf16 ulp, 2 ** -7 relative; rtol 1e-2 covers that, atol the values near zero.
RTOL, ATOL = 1e-2, 1e-2


def _inputs(arch: str, family: str, m: int, n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, FP8_DTYPE[arch])
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    if family == "bpreshuffle":
        xs = torch.rand(m, 1, generator=gen) + 0.5
        ws = torch.rand(1, n, generator=gen) + 0.5
        ref = (x.float() @ w.float().T) * xs * ws
    else:
        xs = torch.rand(m, k // 128, generator=gen) + 0.5
        ws = torch.rand(n // 128, k // 128, generator=gen) + 0.5
        ref = torch.zeros(m, n)
        for kb in range(k // 128):
            part = (
                x[:, kb * 128 : (kb + 1) * 128].float() @ w[:, kb * 128 : (kb + 1) * 128].float().T
            )
            ref += part * xs[:, kb : kb + 1] * ws[:, kb].repeat_interleave(128)[None, :]
    return x, w, xs, ws, ref


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(A8W8_CONFIGS)))
def test_a8w8_code_objects_match_torch(a8w8_codes, index: int) -> None:
    arch, codes = a8w8_codes
    family, tile, split_k, (m, n, k) = A8W8_CONFIGS[index]
    x, w, xs, ws, ref = _inputs(arch, family, m, n, k, index)
    wq = shuffle_weight(w, a8w8.BPRESHUFFLE_LAYOUT) if family == "bpreshuffle" else w
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    memory = Memory()
    work = torch.full((split_k, m, n), float("nan")) if split_k > 1 else xs
    sem = (torch.zeros(a8w8.semaphore_size(m, n, a8w8.A8W8Tile(*tile)), dtype=torch.int32)
           if split_k > 1 else xs)  # fmt: skip
    placed: dict[int, list] = {}  # with split_k 1, workspace and semaphore are x_scale
    values = []
    # The kernel's bias (MX mode) is never read here: x_scale stands in, as the launchers do.
    for name, t in (("xq", x), ("wq", wq.contiguous()), ("x_scale", xs), ("w_scale", ws),
                    ("bias", xs), ("out", out), ("workspace", work),
                    ("semaphore", sem)):  # fmt: skip
        if id(t) not in placed:
            placed[id(t)] = tensor_args(memory, t, name)
        values += placed[id(t)]
    (kernel,) = load_code_object(codes[index]).kernels.values()
    grid = mx.grid_size(m, n, tile[0], tile[1], split_k)
    stats = launch(codes[index], kernel.name, grid, (mx.threads("mfma"), 1, 1),
                   pack_kernargs(kernel, values + [m, n, k]), memory, races="raise")  # fmt: skip
    err = (out.float() - ref.to(torch.bfloat16).float()).abs().max().item()
    print(f"{arch} {family} tile {tile} split_k {split_k}: max abs error {err:.3g}")
    torch.testing.assert_close(out.float(), ref, rtol=RTOL, atol=ATOL)
    if split_k > 1:
        assert not sem.any(), "the last block of every tile re-zeroes its semaphore slot"
    # gfx942 has only the FNUZ fp8 MFMA; gfx950 uses the scaled f8f6f4 form for k-tiles of 128
    # and the plain OCP fp8 one for k-tiles of 64.
    used = {m for m, count in stats.by_mnemonic.items() if "mfma" in m and count}
    allowed = {
        "gfx942": {"v_mfma_f32_16x16x32_fp8_fp8"},
        "gfx950": {"v_mfma_f32_16x16x32_fp8_fp8", "v_mfma_scale_f32_16x16x128_f8f6f4"},
    }
    assert used and used <= allowed[arch], used
