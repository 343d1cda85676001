"""Public microscaled (OCP MX) GEMM entries: `gemm_a4w4` (MXFP4 x MXFP4) and `gemm_mxfp8`
(MXFP8 x MXFP8), validated, looked up in their tuned tables and launched on gfx950's scaled
MFMA, or served by torch where a row says so or no kernel can serve the shape.

Operands as a caller holds them: A quantized per call (`aiter.mxfp4_quantize` /
`aiter.mxfp8_quantize`), its scales shuffled (`aiter.shuffle_mx_scale`); the weight quantized
once, its bytes preshuffled (`aiter.shuffle_weight(B.view(torch.uint8))`, viewed back as its
dtype) and its scales shuffled. gfx942 has no MX instructions: the entries raise
NotImplementedError there (and on gfx1250, which has no kernel here yet).
"""

from __future__ import annotations

import torch

from aiter import capture, device, dispatch
from aiter.ops.gemm import microscale
from aiter.ops.gemm import plan as gemm_plan
from aiter.ops.gemm.entry import check_operand
from aiter.ops.gemm.kernels.a8w8 import semaphore_size
from aiter.ops.gemm.kernels.mx import (
    ELEMENT_DTYPES,
    MX_K_MULTIPLE,
    MX_N_MULTIPLE,
    MX_WEIGHT_LAYOUT,
    OUTPUT_DTYPES,
    SCALE_DTYPES,
    arch_problem,
    launch_gemm_mx,
    mx_scale_shape,
    shuffle_mx_scale,
    unshuffle_mx_scale,
)
from aiter.ops.gemm.plan import plan
from aiter.ops.gemm.table import A4W4, MXFP8, MXFP8_Q_DTYPE
from aiter.ops.shared.preshuffle import unshuffle_weight

__all__ = ["gemm_a4w4", "gemm_mxfp8", "shuffle_mx_scale", "unshuffle_mx_scale"]

_OP = {"fp4": "gemm_a4w4", "fp8": "gemm_mxfp8"}
_ELEMENTS_PER_BYTE = {"fp4": 2, "fp8": 1}


def _validate(fmt: str, A, B, A_scale, B_scale, bias, out_dtype) -> tuple[int, int, int]:
    """(M, N, K) of a valid call; an error naming the argument otherwise."""
    op = _OP[fmt]
    problem = arch_problem(device.arch())
    if problem is not None:
        raise NotImplementedError(f"{op}: {problem}")
    per_byte = _ELEMENTS_PER_BYTE[fmt]
    k_text = "K / 2" if per_byte == 2 else "K"
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D tensor [rows, {k_text}], got {got}")
    m, k = A.shape[0], A.shape[1] * per_byte
    n = B.shape[0]
    if m < 1:
        raise ValueError(f"A must have at least one row, got shape {list(A.shape)}")
    check_operand("A", A, ELEMENT_DTYPES[fmt], (m, k // per_byte))
    check_operand("B", B, ELEMENT_DTYPES[fmt], (n, k // per_byte))
    multiple = MX_K_MULTIPLE[fmt]
    if k < multiple or k % multiple:
        raise ValueError(f"{op}: K must be a positive multiple of the MX block {multiple}, got {k}")
    if n % MX_N_MULTIPLE:  # the preshuffled weight's 16-row groups, whatever serves the call
        raise ValueError(f"{op}: B is preshuffled in 16-row groups: N % 16 == 0, got N={n}")
    check_operand("A_scale", A_scale, SCALE_DTYPES, mx_scale_shape(m, k))
    check_operand("B_scale", B_scale, SCALE_DTYPES, mx_scale_shape(n, k))
    if out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUTPUT_DTYPES}, got {out_dtype}")
    if bias is not None:
        check_operand("bias", bias, (out_dtype,), (n,))
    return m, n, k


def _torch_mx_gemm(fmt: str, A, B, A_scale, B_scale, bias, out_dtype, k: int) -> torch.Tensor:
    """What the kernels compute, in torch: the dequantized operands' fp32 product (+ bias)."""
    blocks = k // microscale.BLOCK
    plain_b = unshuffle_weight(B.view(torch.uint8), MX_WEIGHT_LAYOUT).view(B.dtype)
    a = microscale.mx_dequantize(A, unshuffle_mx_scale(A_scale, blocks))
    b = microscale.mx_dequantize(plain_b, unshuffle_mx_scale(B_scale, blocks))
    out = a @ b.mT
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def _serve(fmt: str, A, B, A_scale, B_scale, bias, out_dtype) -> torch.Tensor:
    m, n, k = _validate(fmt, A, B, A_scale, B_scale, bias, out_dtype)
    op = _OP[fmt]
    if fmt == "fp4":
        served = plan(op, A4W4, gemm_plan.A4W4, {"N": n, "K": k}, m, n, k)
    else:
        key = {"N": n, "K": k, "q_dtype_w": MXFP8_Q_DTYPE}
        served = plan(op, MXFP8, gemm_plan.MXFP8, key, m, n, k)

    def args() -> dict[str, str]:
        return {
            "A": dispatch.tensor_arg(A, "row-major"),
            "B": dispatch.tensor_arg(B, "preshuffled {}x{}".format(*MX_WEIGHT_LAYOUT)),
            "A_scale": dispatch.tensor_arg(A_scale, "shuffled"),
            "B_scale": dispatch.tensor_arg(B_scale, "shuffled"),
            "bias": dispatch.tensor_arg(bias),
            "out_dtype": str(out_dtype).replace("torch.", ""),
        }

    if served.use_torch:
        served.report(args)
        return _torch_mx_gemm(fmt, A, B, A_scale, B_scale, bias, out_dtype, k)

    def launch(choice: gemm_plan.KernelChoice) -> torch.Tensor:
        out = torch.empty((m, n), dtype=out_dtype, device=A.device)
        workspace = semaphore = None
        if choice.split_k > 1:
            workspace = torch.empty((choice.split_k, m, n), dtype=torch.float32, device=A.device)
            slots = semaphore_size(m, n, choice.tile)
            semaphore = torch.zeros((slots,), dtype=torch.int64, device=A.device)
        launch_gemm_mx(fmt, A, B, A_scale, B_scale, bias, out, workspace, semaphore,
                       tile=choice.tile, split_k=choice.split_k, mma=choice.mma,
                       stream=device.current_stream())  # fmt: skip
        return out

    return served.launch(launch, args)


@capture.entry("gemm_a4w4")
def gemm_a4w4(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """out[M, N] = MX(A) @ MX(B)^T (+ bias[N]), MXFP4 operands, fp32 accumulation (gfx950).

    A [M, K / 2] and B [N, K / 2]: packed E2M1 (torch.float4_e2m1fn_x2 or uint8, the element
    of even K in the low nibble), B preshuffled by `aiter.shuffle_weight` on its bytes.
    A_scale [M, ceil(K / 512), 16] and B_scale [N, ceil(K / 512), 16]: the E8M0 block scales
    (torch.float8_e8m0fnu or uint8) of `aiter.mxfp4_quantize`, shuffled by
    `aiter.shuffle_mx_scale`. K % 32 == 0 (the MX block), N % 16 == 0; bias [N] of out_dtype
    (bf16 or fp16). NotImplementedError on gfx942 (no MX instructions) and gfx1250.
    """
    return _serve("fp4", A, B, A_scale, B_scale, bias, out_dtype)


@capture.entry("gemm_mxfp8")
def gemm_mxfp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """out[M, N] = MX(A) @ MX(B)^T (+ bias[N]), MXFP8 operands, fp32 accumulation (gfx950).

    A [M, K] and B [N, K]: OCP E4M3 (torch.float8_e4m3fn), B preshuffled by
    `aiter.shuffle_weight` (16x16 bytes). A_scale [M, ceil(K / 512), 16] and B_scale
    [N, ceil(K / 512), 16]: the E8M0 block scales of `aiter.mxfp8_quantize`, shuffled by
    `aiter.shuffle_mx_scale`. K % 32 == 0, N % 16 == 0; bias [N] of out_dtype (bf16 or fp16).
    NotImplementedError on gfx942 (no MX instructions) and gfx1250.
    """
    return _serve("fp8", A, B, A_scale, B_scale, bias, out_dtype)
