"""GEMM cases: bf16/fp16 (split-K by the heuristic and by a tuned row, bias, fp32 output),
per-token fp8 with a preshuffled weight, and DeepSeek-V3 blockscale fp8, at M, N, K that are
not multiples of the tiles.

Tolerance: aiter.ops.gemm.reach.tolerance (one rounding to the output dtype plus fp32 sums in
another order).
"""

from __future__ import annotations

import torch

from aiter.ops.gemm.reach import blockscale_reference, tolerance
from op_tests.emulated.suite import CaseContext, case

BF16_TABLE = "AITER_CONFIG_GEMM_BF16"
BF16_HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,libtype,splitK,us,kernelName"


def _a16w16(ctx: CaseContext, m, n, k, bias, dtype, out_dtype) -> None:
    import aiter

    a, b = ctx.randn(m, k, dtype=dtype), ctx.randn(n, k, dtype=dtype)
    c = ctx.randn(n, dtype=out_dtype) if bias else None
    out = aiter.gemm_a16w16(a, b, c, out_dtype=out_dtype)
    ref = a.float() @ b.float().T + (c.float() if bias else 0)
    ctx.check(f"gemm_a16w16 {m}x{n}x{k}", out, ref, tolerance(out_dtype))


@case("gemm")
def a16w16_heuristic_split_k(ctx: CaseContext) -> None:
    """M = 5, K = 1024: the heuristic splits K in two (a GEMM and a reduction kernel)."""
    _a16w16(ctx, 5, 100, 1024, False, torch.bfloat16, torch.bfloat16)


@case("gemm")
def a16w16_bias_tails(ctx: CaseContext) -> None:
    _a16w16(ctx, 37, 200, 160, True, torch.bfloat16, torch.bfloat16)


@case("gemm")
def a16w16_fp16_to_fp32(ctx: CaseContext) -> None:
    _a16w16(ctx, 70, 72, 96, True, torch.float16, torch.float32)


@case("gemm")
def a16w16_tuned_split_k_3(ctx: CaseContext) -> None:
    """A tuned row: 32x64x128 tiles over K = 160 (a K tail inside the tile), split-K 3 over 5
    k-blocks (splits of one and two k-blocks)."""
    row = "{arch},{cu},20,130,160,1,torch.bfloat16,torch.bfloat16,flydsl,3,,flydsl_a16w16_{mma}_32x64x128"
    with ctx.table(BF16_TABLE, BF16_HEADER, [row]):
        _a16w16(ctx, 20, 130, 160, True, torch.bfloat16, torch.bfloat16)


# The blockscale GEMMs have MFMA kernels only: gfx1250 serves them with torch.
MFMA_ARCHS = ("gfx942", "gfx950")


def _fp8(ctx: CaseContext, *shape: int) -> torch.Tensor:
    from aiter import device

    return ctx.randn(*shape).to(device.fp8_dtype())


def _bpreshuffle(ctx: CaseContext, m: int, n: int, k: int, out_dtype=torch.bfloat16) -> None:
    import aiter

    x, w = _fp8(ctx, m, k), _fp8(ctx, n, k)
    xs = torch.rand(m, 1, generator=ctx.gen) + 0.5
    ws = torch.rand(1, n, generator=ctx.gen) + 0.5
    out = aiter.gemm_a8w8_bpreshuffle(x, aiter.shuffle_weight(w), xs, ws, out_dtype)
    ref = (x.float() @ w.float().T) * xs * ws
    ctx.check(f"gemm_a8w8_bpreshuffle {m}x{n}x{k}", out, ref, tolerance(out_dtype))


@case("gemm")
def a8w8_bpreshuffle_tails(ctx: CaseContext) -> None:
    _bpreshuffle(ctx, 33, 160, 256)


@case("gemm")
def a8w8_bpreshuffle_fp16_out(ctx: CaseContext) -> None:
    _bpreshuffle(ctx, 130, 96, 512, torch.float16)


def _blockscale(ctx: CaseContext, m: int, n: int, k: int, preshuffled: bool) -> None:
    import aiter

    x, w = _fp8(ctx, m, k), _fp8(ctx, n, k)
    xs = torch.rand(m, k // 128, generator=ctx.gen) + 0.5
    ws = torch.rand(n // 128, k // 128, generator=ctx.gen) + 0.5
    ref = blockscale_reference(x, w, xs, ws)
    if not preshuffled:
        out = aiter.gemm_a8w8_blockscale(x, w, xs, ws)
        ctx.check(f"gemm_a8w8_blockscale {m}x{n}x{k}", out, ref, tolerance(torch.bfloat16))
        return
    # the bpreshuffle entry reads x_scale block-major: the strided view of column-major scales,
    # or aiter's contiguous [M, K/128] view of the same bytes
    block_major = xs.T.contiguous()
    for layout, x_scale in (("strided", block_major.T), ("aiter view", block_major.view(m, -1))):
        out = aiter.gemm_a8w8_blockscale_bpreshuffle(x, aiter.shuffle_weight(w), x_scale, ws)
        ctx.check(f"gemm_a8w8_blockscale_bpreshuffle {m}x{n}x{k} x_scale {layout}", out, ref,
                  tolerance(torch.bfloat16))  # fmt: skip


@case("gemm", MFMA_ARCHS)
def a8w8_blockscale_tails(ctx: CaseContext) -> None:
    _blockscale(ctx, 33, 256, 384, preshuffled=False)


@case("gemm", MFMA_ARCHS)
def a8w8_blockscale_small_m_long_k(ctx: CaseContext) -> None:
    _blockscale(ctx, 3, 128, 1024, preshuffled=False)


@case("gemm", MFMA_ARCHS)
def a8w8_blockscale_bpreshuffle_tails(ctx: CaseContext) -> None:
    import aiter

    if "gemm_a8w8_blockscale_bpreshuffle" not in aiter._ENTRIES:
        raise NotImplementedError("aiter has no gemm_a8w8_blockscale_bpreshuffle")
    _blockscale(ctx, 33, 256, 384, preshuffled=True)


# --- microscaled GEMMs: gfx950's scaled MFMA -------------------------------------------------
MX_ARCHS = ("gfx950",)


def _mx(ctx: CaseContext, fmt: str, m: int, n: int, k: int, bias: bool, rows=(), scales=None):
    from aiter.ops.gemm.reach import mx_call

    a, b = ctx.randn(m, k), ctx.randn(n, k)
    if scales is not None:  # per row of A and of B, spreading the blocks' scales apart
        a, b = a * scales[0][:, None], b * scales[1][:, None]
    out, ref = mx_call(ctx, fmt, a, b, bias=bias, out_dtype=torch.bfloat16, rows=list(rows))
    return out, ref


@case("gemm", MX_ARCHS)
def mxfp4_tails_bias(ctx: CaseContext) -> None:
    """M, N off the tiles, K = 800 (25 MX blocks: a partial k-tile and a partial scale group),
    a bias, and weight rows whose scales span 2^-20 .. 2^20."""
    spread = 2.0 ** torch.linspace(-20, 20, 80)
    out, ref = _mx(ctx, "fp4", 37, 80, 800, True, scales=(torch.ones(37), spread))
    for col in (0, 40, 79):  # each column at its own magnitude
        what = f"gemm_a4w4 37x80x800 column {col}"
        ctx.check(what, out[:, col], ref[:, col], tolerance(torch.bfloat16))


@case("gemm", MX_ARCHS)
def mxfp8_tuned_split_k_3(ctx: CaseContext) -> None:
    """A tuned row: 32x64x256 tiles, split-K 3 over K = 1056 (five k-tiles, the last partial:
    splits of one and two k-tiles)."""
    row = "20,48,1056,mxfp8,flydsl,0,3,,flydsl_a8w8_mxfp8_{mma}_32x64x256"
    out, ref = _mx(ctx, "fp8", 20, 48, 1056, False, rows=[row])
    ctx.check("gemm_mxfp8 20x48x1056 split 3", out, ref, tolerance(torch.bfloat16))


@case("gemm", MX_ARCHS)
def mxfp4_edge_scales(ctx: CaseContext) -> None:
    """Rows of A at scales 2^-100 and 2^100 against columns of B at 2^100 and 2^-100: row 0
    by columns 0..15 and row 1 by columns 16..31 are near 1 only if each block's scale
    reaches its own lanes (the other pairs overflow or underflow, and are not compared); an
    all-zero row of A; and a NaN in one block of A: that output row is NaN, the others not."""
    m, n, k = 6, 32, 256
    a, b = ctx.randn(m, k), ctx.randn(n, k)
    a[0] *= 2.0**-100
    a[1] *= 2.0**100
    b[:16] *= 2.0**100
    b[16:] *= 2.0**-100
    a[2] = 0.0
    a[3, 70] = float("nan")
    from aiter.ops.gemm.reach import mx_call

    out, ref = mx_call(ctx, "fp4", a, b, bias=False, out_dtype=torch.bfloat16)
    nan_rows = out.float().isnan().any(dim=1)
    ctx.check("gemm_a4w4 NaN rows", nan_rows.float(), torch.tensor([0, 0, 0, 1, 0, 0.0]), 0.0)
    low, high = slice(0, 16), slice(16, 32)
    pairs = [(0, low), (1, high)] + [(row, cols) for row in (2, 4, 5) for cols in (low, high)]
    for row, cols in pairs:
        what = f"gemm_a4w4 edge scales row {row} columns {cols.start}..{cols.stop - 1}"
        ctx.check(what, out[row, cols], ref[row, cols], tolerance(torch.bfloat16))
