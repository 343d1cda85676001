"""Public GEMM entries: validate, look the shape up in the tuned table, allocate, launch.

`gemm_a16w16` serves bf16/fp16 GEMMs; `gemm_a8w8_bpreshuffle` fp8/int8 GEMMs scaled per token
and channel with a preshuffled weight, `gemm_a8w8_blockscale` DeepSeek-V3-style 1x128 / 128x128
block-scaled fp8 GEMMs, and `gemm_a8w8_blockscale_bpreshuffle` the same with a preshuffled
weight. FlyDSL kernels serve them, or torch where a row says so or where no FlyDSL kernel can
serve the shape (the dispatch record's params then give the reason).
"""

from __future__ import annotations

import torch

from aiter import capture, device, dispatch
from aiter.ops.gemm import plan as gemm_plan
from aiter.ops.gemm import table as gemm_table
from aiter.ops.gemm.kernels.a8w8 import (
    BLOCKSCALE_BLOCK,
    BPRESHUFFLE_LAYOUT,
    launch_gemm_a8w8_blockscale,
    launch_gemm_a8w8_blockscale_bpreshuffle,
    launch_gemm_a8w8_bpreshuffle,
    semaphore_size,
)
from aiter.ops.gemm.kernels.a16w16 import launch_gemm_a16w16
from aiter.ops.gemm.plan import Plan, plan
from aiter.ops.gemm.table import (
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A16W16,
)
from aiter.ops.shared.preshuffle import shuffle_weight, unshuffle_weight

A16W16_INPUT_DTYPES = tuple(getattr(torch, n) for n in gemm_table.A16W16_INPUT_DTYPES)
A16W16_OUT_DTYPES = tuple(getattr(torch, n) for n in gemm_table.A16W16_OUT_DTYPES)


def _check_matrix(name: str, t: object, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {dtypes}, got {t.dtype}")
    if not device.on_gpu(t):
        raise ValueError(f"{name} must be on a GPU device, got {t.device}")
    if t.stride(1) != 1 or t.stride(0) != t.shape[1]:
        raise ValueError(f"{name} must be row-major contiguous, got strides {t.stride()}")
    return t


def _validate_a16w16(A, B, bias, out_dtype) -> torch.dtype:
    _check_matrix("A", A, A16W16_INPUT_DTYPES)
    _check_matrix("B", B, A16W16_INPUT_DTYPES)
    if B.dtype != A.dtype:
        raise TypeError(f"B must have A's dtype {A.dtype}, got {B.dtype}")
    if A.shape[0] < 1:
        raise ValueError(f"A must have at least one row, got shape {tuple(A.shape)}")
    if A.shape[1] != B.shape[1]:
        raise ValueError(
            f"A is [M, K] and B is [N, K]: K differs, A {tuple(A.shape)} vs B {tuple(B.shape)}"
        )
    if A.device != B.device:
        raise ValueError(f"A and B must be on one device, got {A.device} and {B.device}")
    out_dtype = A.dtype if out_dtype is None else out_dtype
    if out_dtype not in A16W16_OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {A16W16_OUT_DTYPES} or None, got {out_dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dim() != 1 or bias.shape[0] != B.shape[0]:
            raise ValueError(f"bias must have shape [N] = [{B.shape[0]}], got {tuple(bias.shape)}")
        if bias.dtype != out_dtype:
            raise TypeError(f"bias must have the output dtype {out_dtype}, got {bias.dtype}")
        if bias.device != A.device or bias.stride(0) != 1:
            raise ValueError("bias must be contiguous and on A's device")
    return out_dtype


@capture.entry("gemm_a16w16")
def gemm_a16w16(
    A: torch.Tensor,
    B: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """out[M, N] = A[M, K] @ B[N, K]^T (+ bias[N]), bf16 or fp16 inputs, fp32 accumulation.

    out_dtype (bf16, fp16 or fp32) defaults to A's dtype; bias has the output dtype. Any N and
    K: a shape the FlyDSL kernels cannot serve (K not a multiple of 32, say) is served by torch.
    """
    out_dtype = _validate_a16w16(A, B, bias, out_dtype)
    m, k = A.shape
    n = B.shape[0]
    key = {
        "N": n,
        "K": k,
        "bias": int(bias is not None),
        "dtype": str(A.dtype),
        "outdtype": str(out_dtype),
    }
    served = plan("gemm_a16w16", A16W16, gemm_plan.A16W16, key, m, n, k)

    def args() -> dict[str, str]:
        return {
            "A": dispatch.tensor_arg(A, "row-major"),
            "B": dispatch.tensor_arg(B, "row-major"),
            "bias": dispatch.tensor_arg(bias),
            "out_dtype": str(out_dtype).replace("torch.", ""),
        }

    if served.use_torch:
        served.report(args)
        out = torch.matmul(A, B.mT).to(out_dtype)
        return out + bias if bias is not None else out

    def launch(choice: gemm_plan.KernelChoice) -> torch.Tensor:
        out = torch.empty((m, n), dtype=out_dtype, device=A.device)
        workspace = None
        if choice.split_k > 1:
            workspace = torch.empty((choice.split_k, m, n), dtype=torch.float32, device=A.device)
        launch_gemm_a16w16(
            A,
            B,
            bias,
            out,
            workspace,
            tile=choice.tile,
            split_k=choice.split_k,
            mma=choice.mma,
            stream=device.current_stream(),
        )
        return out

    return served.launch(launch, args)


__all__ = [
    "gemm_a8w8_blockscale",
    "gemm_a8w8_blockscale_bpreshuffle",
    "gemm_a8w8_bpreshuffle",
    "shuffle_weight",
    "unshuffle_weight",
]

OUT_DTYPES = tuple(getattr(torch, n) for n in gemm_table.A8W8_OUT_DTYPES)
# What the runtime allocates for split-K: fp32 partial sums, and one zeroed counter per output
# tile that the last split to finish uses to know it must reduce.
WORKSPACE_DTYPE = torch.float32
SEMAPHORE_DTYPE = torch.int64
SCALE_DTYPE = torch.float32


def bpreshuffle_scale_shapes(m: int, n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of x_scale (per token) and w_scale (per channel) for gemm_a8w8_bpreshuffle."""
    return (m, 1), (1, n)


def blockscale_scale_shapes(m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of x_scale (1 x 128 blocks) and w_scale (128 x 128 blocks) for the blockscale GEMM."""
    block = BLOCKSCALE_BLOCK
    return (m, k // block), (n // block, k // block)


def check_operand(name: str, t: object, dtypes: tuple, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {dtypes}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if not device.on_gpu(t):
        raise ValueError(f"{name} must be on a GPU device, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    return t


def _quant_dtypes(allow_int8: bool) -> tuple[torch.dtype, ...]:
    """The device's fp8 flavour (fnuz on gfx942, fn elsewhere), and int8 where allowed."""
    fp8 = device.fp8_dtype()
    return (fp8, torch.int8) if allow_int8 else (fp8,)


def _validate(XQ, WQ, out_dtype, allow_int8: bool) -> tuple[int, int, int]:
    for name, t, dims in (("XQ", XQ, "[M, K]"), ("WQ", WQ, "[N, K]")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor {dims}, got shape {list(t.shape)}")
    m, k = XQ.shape
    n = WQ.shape[0]
    if m < 1:
        raise ValueError(f"XQ must have at least one row, got shape {list(XQ.shape)}")
    dtypes = _quant_dtypes(allow_int8)
    if XQ.dtype not in dtypes:
        raise TypeError(
            f"XQ must have dtype in {dtypes} on {device.arch()} (its fp8 flavour), got {XQ.dtype}"
        )
    check_operand("XQ", XQ, dtypes, (m, k))
    check_operand("WQ", WQ, (XQ.dtype,), (n, k))
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    return m, n, k


def _launch(launcher, served: Plan, XQ, WQ, x_scale, w_scale, out_dtype, args) -> torch.Tensor:
    """Report, then allocate the output and, for split-K, the workspace and semaphore; launch."""
    m, n = XQ.shape[0], WQ.shape[0]

    def launch(choice: gemm_plan.KernelChoice) -> torch.Tensor:
        out = torch.empty((m, n), dtype=out_dtype, device=XQ.device)
        workspace = semaphore = None
        if choice.split_k > 1:
            workspace = torch.empty((choice.split_k, m, n), dtype=WORKSPACE_DTYPE, device=XQ.device)
            slots = semaphore_size(m, n, choice.tile)
            semaphore = torch.zeros((slots,), dtype=SEMAPHORE_DTYPE, device=XQ.device)
        launcher(
            XQ,
            WQ,
            x_scale,
            w_scale,
            out,
            workspace,
            semaphore,
            tile=choice.tile,
            split_k=choice.split_k,
            mma=choice.mma,
            stream=device.current_stream(),
        )
        return out

    return served.launch(launch, args)


def _args(XQ, WQ, x_scale, w_scale, out_dtype, weight_layout: str):
    """The call's arguments as dispatch records show them (built only when someone listens)."""

    def args() -> dict[str, str]:
        return {
            "XQ": dispatch.tensor_arg(XQ, "row-major"),
            "WQ": dispatch.tensor_arg(WQ, weight_layout),
            "x_scale": dispatch.tensor_arg(x_scale),
            "w_scale": dispatch.tensor_arg(w_scale),
            "out_dtype": str(out_dtype).replace("torch.", ""),
        }

    return args


@capture.entry("gemm_a8w8_bpreshuffle")
def gemm_a8w8_bpreshuffle(
    XQ: torch.Tensor,
    WQ: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """out[M, N] = (XQ @ WQ^T) * x_scale * w_scale, fp32 accumulation, bf16 or fp16 out.

    XQ[M, K] and WQ[N, K] are the device's fp8 flavour or int8; WQ is laid out by
    `shuffle_weight`, so N and K are multiples of its 16x16 blocks; K not a multiple of 64
    (what the FlyDSL kernels need) is served by torch. x_scale is per token [M, 1], w_scale per
    channel [1, N], both fp32.
    """
    m, n, k = _validate(XQ, WQ, out_dtype, allow_int8=True)
    x_shape, w_shape = bpreshuffle_scale_shapes(m, n)
    check_operand("x_scale", x_scale, (SCALE_DTYPE,), x_shape)
    check_operand("w_scale", w_scale, (SCALE_DTYPE,), w_shape)
    layout_n, layout_k = BPRESHUFFLE_LAYOUT
    if n % layout_n or k % layout_k:  # every backend reads the layout: torch unshuffles it
        raise ValueError(
            f"WQ is preshuffled in {layout_n}x{layout_k} blocks: N % {layout_n} == 0 and "
            f"K % {layout_k} == 0 are needed, got N={n}, K={k}"
        )
    key = {"N": n, "K": k, "q_dtype_w": str(WQ.dtype)}
    served = plan("gemm_a8w8_bpreshuffle", A8W8_BPRESHUFFLE, gemm_plan.BPRESHUFFLE, key, m, n, k)
    layout = f"preshuffled {layout_n}x{layout_k}"
    args = _args(XQ, WQ, x_scale, w_scale, out_dtype, layout)
    if served.use_torch:
        served.report(args)
        plain = unshuffle_weight(WQ, BPRESHUFFLE_LAYOUT)
        acc = torch.matmul(XQ.to(torch.float32), plain.to(torch.float32).mT)
        return (acc * x_scale * w_scale).to(out_dtype)
    return _launch(launch_gemm_a8w8_bpreshuffle, served, XQ, WQ, x_scale, w_scale, out_dtype, args)


@capture.entry("gemm_a8w8_blockscale")
def gemm_a8w8_blockscale(
    XQ: torch.Tensor,
    WQ: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """out[M, N] = sum over 128-wide K blocks of (XQ @ WQ^T) * x_scale * w_scale per block.

    XQ[M, K] and WQ[N, K] are the device's fp8 flavour; x_scale[M, K/128] scales 1x128
    activation blocks and w_scale[N/128, K/128] 128x128 weight blocks (DeepSeek-V3 style).
    N and K must be multiples of 128. No FlyDSL kernel exists for gfx1250 yet: torch serves
    every call there.
    """
    m, n, k = _validate_blockscale("gemm_a8w8_blockscale", XQ, WQ, out_dtype)
    x_shape, w_shape = blockscale_scale_shapes(m, n, k)
    check_operand("x_scale", x_scale, (SCALE_DTYPE,), x_shape)
    check_operand("w_scale", w_scale, (SCALE_DTYPE,), w_shape)
    key = {"N": n, "K": k}
    served = plan("gemm_a8w8_blockscale", A8W8_BLOCKSCALE, gemm_plan.BLOCKSCALE, key, m, n, k)
    args = _args(XQ, WQ, x_scale, w_scale, out_dtype, "row-major")
    if served.use_torch:
        served.report(args)
        return _blockscale_matmul(XQ, WQ, x_scale, w_scale, out_dtype)
    return _launch(launch_gemm_a8w8_blockscale, served, XQ, WQ, x_scale, w_scale, out_dtype, args)


@capture.entry("gemm_a8w8_blockscale_bpreshuffle")
def gemm_a8w8_blockscale_bpreshuffle(
    XQ: torch.Tensor,
    WQ: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """gemm_a8w8_blockscale with WQ laid out by `shuffle_weight` and aiter's x_scale layout.

    XQ[M, K] and WQ[N, K] are the device's fp8 flavour, WQ preshuffled in 16x16 blocks; N and K
    multiples of 128. w_scale[N/128, K/128] is fp32 row-major. x_scale is fp32 [M, K/128] whose
    bytes hold the [K/128, M] matrix (scale block-major, as aiter's bpreshuffle kernels read
    it), given either as the strided view `s.T.contiguous().T` (strides (1, M)) of the scales
    s, or as aiter's contiguous view `s.T.contiguous().view(M, K/128)` of the same bytes.
    No FlyDSL kernel exists for gfx1250 yet: torch serves every call there.
    """
    op = "gemm_a8w8_blockscale_bpreshuffle"
    m, n, k = _validate_blockscale(op, XQ, WQ, out_dtype)
    x_shape, w_shape = blockscale_scale_shapes(m, n, k)
    x_by_block = _block_major_x_scale(x_scale, x_shape)
    check_operand("w_scale", w_scale, (SCALE_DTYPE,), w_shape)
    key = {"N": n, "K": k}
    family = gemm_plan.BLOCKSCALE_BPRESHUFFLE
    served = plan(op, A8W8_BLOCKSCALE_BPRESHUFFLE, family, key, m, n, k)
    layout_n, layout_k = BPRESHUFFLE_LAYOUT
    args = _args(XQ, WQ, x_scale, w_scale, out_dtype, f"preshuffled {layout_n}x{layout_k}")
    if served.use_torch:
        served.report(args)
        plain = unshuffle_weight(WQ, BPRESHUFFLE_LAYOUT)
        return _blockscale_matmul(XQ, plain, x_by_block.mT, w_scale, out_dtype)
    launcher = launch_gemm_a8w8_blockscale_bpreshuffle
    return _launch(launcher, served, XQ, WQ, x_by_block, w_scale, out_dtype, args)


def _validate_blockscale(op: str, XQ, WQ, out_dtype) -> tuple[int, int, int]:
    m, n, k = _validate(XQ, WQ, out_dtype, allow_int8=False)
    block = BLOCKSCALE_BLOCK
    if n % block or k % block:  # the scales' shapes need it, whatever serves the call
        raise ValueError(f"{op} needs N and K multiples of {block}, got N={n}, K={k}")
    return m, n, k


def _block_major_x_scale(x_scale: object, shape: tuple[int, int]) -> torch.Tensor:
    """x_scale checked as the bpreshuffle entry takes it ([M, K/128] over the bytes of the
    [K/128, M] matrix), returned as that contiguous [K/128, M] matrix."""
    if not isinstance(x_scale, torch.Tensor):
        raise TypeError(f"x_scale must be a torch.Tensor, got {type(x_scale).__name__}")
    if x_scale.dtype != SCALE_DTYPE:
        raise TypeError(f"x_scale must have dtype {SCALE_DTYPE}, got {x_scale.dtype}")
    if tuple(x_scale.shape) != shape:
        raise ValueError(f"x_scale must have shape {list(shape)}, got {list(x_scale.shape)}")
    if not device.on_gpu(x_scale):
        raise ValueError(f"x_scale must be on a GPU device, got {x_scale.device}")
    by_block = x_scale.mT
    if by_block.is_contiguous():  # the scales viewed column-major: strides (1, M)
        return by_block
    if x_scale.is_contiguous():  # aiter's contiguous view of the same bytes
        return x_scale.view(shape[1], shape[0])
    raise ValueError(
        f"x_scale must hold the [K/128, M] scales column-major: strides (1, {shape[0]}) or "
        f"aiter's contiguous [M, K/128] view of them, got strides {tuple(x_scale.stride())}"
    )


def _blockscale_matmul(XQ, W, x_scale, w_scale, out_dtype) -> torch.Tensor:
    """What the blockscale kernels compute, in torch: row-major W and [M, K/128] x scales."""
    block = BLOCKSCALE_BLOCK
    x = XQ.to(torch.float32) * x_scale.repeat_interleave(block, dim=1)
    w_scale_full = w_scale.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)
    w = W.to(torch.float32) * w_scale_full
    return torch.matmul(x, w.mT).to(out_dtype)
