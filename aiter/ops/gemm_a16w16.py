"""Public GEMM entries: validate, look the shape up in the tuned table, allocate, launch.

`gemm_a16w16` serves bf16/fp16 GEMMs with FlyDSL kernels (or torch where a row says so).
"""

from __future__ import annotations

import torch

from aiter import device, dispatch
from aiter.ops import gemm_config, gemm_tables
from aiter.ops.flydsl.gemm_a16w16 import K_MULTIPLE, N_MULTIPLE, launch_gemm_a16w16
from aiter.ops.gemm_plan import plan
from aiter.ops.gemm_tables import A16W16

A16W16_INPUT_DTYPES = tuple(getattr(torch, n) for n in gemm_tables.A16W16_INPUT_DTYPES)
A16W16_OUT_DTYPES = tuple(getattr(torch, n) for n in gemm_tables.A16W16_OUT_DTYPES)


def _check_matrix(name: str, t: object, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {dtypes}, got {t.dtype}")
    if not t.is_cuda:
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


def gemm_a16w16(
    A: torch.Tensor,
    B: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """out[M, N] = A[M, K] @ B[N, K]^T (+ bias[N]), bf16 or fp16 inputs, fp32 accumulation.

    out_dtype (bf16, fp16 or fp32) defaults to A's dtype; bias has the output dtype.
    N must be a multiple of N_MULTIPLE and K of K_MULTIPLE for FlyDSL kernels.
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
    served = plan("gemm_a16w16", A16W16, gemm_config.A16W16, key, m, n, k)

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
    if n % N_MULTIPLE or k % K_MULTIPLE:
        raise ValueError(
            f"gemm_a16w16 FlyDSL kernels need N % {N_MULTIPLE} == 0 and K % {K_MULTIPLE} == 0, "
            f"got N={n}, K={k}"
        )

    def launch(choice: gemm_config.KernelChoice) -> torch.Tensor:
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
