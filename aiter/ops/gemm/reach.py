"""Listed GEMM kernels reached by small calls: a tuned row names the listed tile and split-K
for the call's exact M, N, K, as a deployment's table does.

The shapes: M one row past the tile (a full block and a one-row tail), N the first multiple of
the family's N step past the tile, K two k-tiles per split, so every split has work and the
tails of M and N are exercised.
Tolerance: the kernels multiply exactly representable inputs (bf16, fp16, fp8 products are exact
in fp32), sum in fp32 and round once to the output dtype, so the error is one rounding
(ROUNDOFF, relative to the largest output bounds it) plus fp32 sums in another order (about
sqrt(K) 2^-24 relative, below 1e-5 at these K).
"""

from __future__ import annotations

import torch

from aiter.verify.checks import ROUNDOFF, CaseContext
from aiter.verify.reachers import Unreachable, as_bool, reaches

BF16_HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,libtype,splitK,us,kernelName"
BPRESHUFFLE_HEADER = "gfx,cu_num,M,N,K,q_dtype_w,libtype,kernelId,splitK,us,kernelName"
BLOCKSCALE_HEADER = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName"


def tolerance(out_dtype: torch.dtype) -> float:
    return 2 * ROUNDOFF[out_dtype] + 1e-5


def blockscale_reference(x, w, xs, ws) -> torch.Tensor:
    """x [M, K] scaled per 1 x 128 block by xs [M, K / 128], w [N, K] per 128 x 128 block by
    ws [N / 128, K / 128], multiplied in fp32."""
    xf = x.float() * xs.repeat_interleave(128, 1)
    wf = w.float() * ws.repeat_interleave(128, 0).repeat_interleave(128, 1)
    return xf @ wf.T


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _shape(family, params: dict[str, str]) -> tuple[int, int, int, int]:
    tile_m, tile_n, tile_k = (int(params[f"tile_{x}"]) for x in "mnk")
    split_k = int(params["split_k"])
    m = tile_m + 1
    step = max(family.n_multiple, 16)
    n = (tile_n // step + 1) * step
    k = tile_k * split_k * 2
    if k % family.k_multiple:
        raise Unreachable(f"K = {k} is not a multiple of {family.k_multiple}")
    return m, n, k, split_k


def _row(family, params: dict[str, str], m: int, n: int, k: int, split_k: int, cells: str) -> str:
    tile = "x".join(params[f"tile_{x}"] for x in "mnk")
    name = f"{family.prefix}_{params['mma']}_{tile}"
    return f"{{arch}},{{cu}},{m},{n},{k},{cells},{split_k},,{name}"


@reaches("gemm_a16w16")
def a16w16(ctx: CaseContext, params: dict[str, str]) -> None:
    """The GEMM kernel; with split_k > 1 its C is the fp32 workspace, and the output dtype (the
    reduction kernel's) is the bias's."""

    split = int(params["split_k"]) > 1
    out_dtype = _dtype(params["bias"] if split else params["c"])
    _a16w16_call(ctx, params, out_dtype, as_bool(params["has_bias"]))


@reaches("gemm_a16w16_splitk_reduce")
def a16w16_reduce(ctx: CaseContext, params: dict[str, str]) -> None:
    """The split-K reduction runs after any split GEMM of its split_k and output dtype: the
    16x64x128 tile, whose K step every arch has."""
    from aiter import device
    from aiter.ops.gemm import plan

    tile = plan.A16W16.heuristic_tile(17, 80, 512, device.cu_num(), device.arch_info().mma)
    gemm = {"tile_m": str(tile.tile_m), "tile_n": str(tile.tile_n), "tile_k": str(tile.tile_k)}
    gemm |= {"split_k": params["split_k"], "a": "bfloat16", "mma": device.arch_info().mma}
    _a16w16_call(ctx, gemm, _dtype(params["out"]), as_bool(params["has_bias"]))


def _a16w16_call(ctx: CaseContext, params, out_dtype: torch.dtype, bias: bool) -> None:
    import aiter
    from aiter.ops.gemm import plan

    dtype = _dtype(params["a"])
    m, n, k, split_k = _shape(plan.A16W16, params)
    cells = f"{int(bias)},{dtype},{out_dtype},flydsl"
    row = _row(plan.A16W16, params, m, n, k, split_k, cells)
    a, b = ctx.randn(m, k, dtype=dtype), ctx.randn(n, k, dtype=dtype)
    c = ctx.randn(n, dtype=out_dtype) if bias else None
    with ctx.table("AITER_CONFIG_GEMM_BF16", BF16_HEADER, [row]):
        out = aiter.gemm_a16w16(a, b, c, out_dtype=out_dtype)
    ref = a.float() @ b.float().T + (c.float() if bias else 0)
    ctx.check(f"gemm_a16w16 {m}x{n}x{k} split {split_k}", out, ref, tolerance(out_dtype))


def _fp8(ctx: CaseContext, params: dict[str, str], *shape: int) -> torch.Tensor:
    from aiter import device

    if _dtype(params["xq"]) != device.fp8_dtype():
        raise Unreachable(f"{params['xq']} is not {device.fp8_dtype()}, this arch's fp8")
    return ctx.randn(*shape).to(device.fp8_dtype())


@reaches("gemm_a8w8_bpreshuffle")
def a8w8_bpreshuffle(ctx: CaseContext, params: dict[str, str]) -> None:
    import aiter
    from aiter import device
    from aiter.ops.gemm import plan

    out_dtype = _dtype(params["out"])
    m, n, k, split_k = _shape(plan.BPRESHUFFLE, params)
    cells = f"{device.fp8_dtype()},flydsl,0"
    row = _row(plan.BPRESHUFFLE, params, m, n, k, split_k, cells)
    x, w = _fp8(ctx, params, m, k), _fp8(ctx, params, n, k)
    xs = torch.rand(m, 1, generator=ctx.gen) + 0.5
    ws = torch.rand(1, n, generator=ctx.gen) + 0.5
    with ctx.table("AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE", BPRESHUFFLE_HEADER, [row]):
        out = aiter.gemm_a8w8_bpreshuffle(x, aiter.shuffle_weight(w), xs, ws, out_dtype)
    ref = (x.float() @ w.float().T) * xs * ws
    what = f"gemm_a8w8_bpreshuffle {m}x{n}x{k} split {split_k}"
    ctx.check(what, out, ref, tolerance(out_dtype))


@reaches("gemm_a8w8_blockscale")
def a8w8_blockscale(ctx: CaseContext, params: dict[str, str]) -> None:
    _blockscale(ctx, params, preshuffled=False)


@reaches("gemm_a8w8_blockscale_bpreshuffle")
def a8w8_blockscale_bpreshuffle(ctx: CaseContext, params: dict[str, str]) -> None:
    """The preshuffled weight's kernel takes x_scale block-major, as aiter passes it."""
    _blockscale(ctx, params, preshuffled=True)


def _blockscale(ctx: CaseContext, params: dict[str, str], preshuffled: bool) -> None:
    import aiter
    from aiter.ops.gemm import plan

    family = plan.BLOCKSCALE_BPRESHUFFLE if preshuffled else plan.BLOCKSCALE
    out_dtype = _dtype(params["out"])
    m, n, k, split_k = _shape(family, params)
    row = _row(family, params, m, n, k, split_k, "flydsl,0")
    x, w = _fp8(ctx, params, m, k), _fp8(ctx, params, n, k)
    xs = torch.rand(m, k // 128, generator=ctx.gen) + 0.5
    ws = torch.rand(n // 128, k // 128, generator=ctx.gen) + 0.5
    if preshuffled:
        env, entry = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE", "bpreshuffle"
        with ctx.table(env, BLOCKSCALE_HEADER, [row]):
            out = aiter.gemm_a8w8_blockscale_bpreshuffle(
                x, aiter.shuffle_weight(w), xs.T.contiguous().T, ws, out_dtype
            )
    else:
        env, entry = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", ""
        with ctx.table(env, BLOCKSCALE_HEADER, [row]):
            out = aiter.gemm_a8w8_blockscale(x, w, xs, ws, out_dtype)
    what = f"gemm_a8w8_blockscale{'_' + entry if entry else ''} {m}x{n}x{k} split {split_k}"
    ctx.check(what, out, blockscale_reference(x, w, xs, ws), tolerance(out_dtype))


# --- the microscaled GEMMs (gfx950) ------------------------------------------------------------

MX_TABLES = {
    "fp4": ("AITER_CONFIG_GEMM_A4W4", "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName"),
    "fp8": (
        "AITER_CONFIG_GEMM_MXFP8",
        "gfx,cu_num,M,N,K,q_dtype_w,libtype,kernelId,splitK,us,kernelName",
    ),
}


def mx_call(ctx: CaseContext, fmt: str, a: torch.Tensor, b: torch.Tensor, *, bias: bool,
            out_dtype: torch.dtype, rows: list[str] = ()) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(out, reference) of gemm_a4w4 (fmt "fp4") or gemm_mxfp8 ("fp8") of fp32 a [M, K] and
    b [N, K], quantized by aiter's MX quantizers, the weight and the scales shuffled as a
    caller does; `rows` (cells after "{arch},{cu},", the table's header) installed as a user
    table. The reference multiplies the dequantized operands in fp32."""
    import aiter

    quantize = aiter.mxfp4_quantize if fmt == "fp4" else aiter.mxfp8_quantize
    (aq, a_scale), (bq, b_scale) = quantize(a), quantize(b)
    b_shuffled = aiter.shuffle_weight(bq.view(torch.uint8)).view(bq.dtype)
    c = ctx.randn(b.shape[0], dtype=out_dtype) if bias else None
    entry = aiter.gemm_a4w4 if fmt == "fp4" else aiter.gemm_mxfp8
    env, header = MX_TABLES[fmt]
    with ctx.table(env, header, [f"{{arch}},{{cu}},{cells}" for cells in rows]):
        out = entry(aq, b_shuffled, aiter.shuffle_mx_scale(a_scale),
                    aiter.shuffle_mx_scale(b_scale), c, out_dtype=out_dtype)  # fmt: skip
    ref = aiter.mx_dequantize(aq, a_scale) @ aiter.mx_dequantize(bq, b_scale).T
    return out, ref + (c.float() if bias else 0)


def _mx_listed(ctx: CaseContext, params: dict[str, str], fmt: str) -> None:
    from aiter.ops.gemm import plan
    from aiter.ops.gemm.kernels.mx import MX_ELEMENTS_PER_BYTE

    family = plan.A4W4 if fmt == "fp4" else plan.MXFP8
    tile_m, tile_n = int(params["tile_m"]), int(params["tile_n"])
    tile_k = int(params["tile_k_bytes"]) * MX_ELEMENTS_PER_BYTE[fmt]
    split_k = int(params["split_k"])
    m, n, k = tile_m + 1, (tile_n // 16 + 1) * 16, tile_k * split_k * 2
    name = f"{family.prefix}_{params['mma']}_{tile_m}x{tile_n}x{tile_k}"
    cells = "flydsl,0" if fmt == "fp4" else "mxfp8,flydsl,0"
    row = f"{m},{n},{k},{cells},{split_k},,{name}"
    out_dtype = _dtype(params["out"])
    out, ref = mx_call(ctx, fmt, ctx.randn(m, k), ctx.randn(n, k),
                       bias=as_bool(params["has_bias"]), out_dtype=out_dtype, rows=[row])  # fmt: skip
    ctx.check(f"{family.prefix} {m}x{n}x{k} split {split_k}", out, ref, tolerance(out_dtype))


@reaches("gemm_a4w4")
def a4w4(ctx: CaseContext, params: dict[str, str]) -> None:
    _mx_listed(ctx, params, "fp4")


@reaches("gemm_mxfp8")
def mxfp8(ctx: CaseContext, params: dict[str, str]) -> None:
    _mx_listed(ctx, params, "fp8")
