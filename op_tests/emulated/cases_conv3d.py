"""conv3d cases: 3x3x3 with padding and bias (NCDHW), strided NDHWC in and out, grouped and
dilated, fp16; spatial sizes that leave partial tiles.

Tolerance: products of bf16/fp16 inputs are exact in fp32, the implicit GEMM sums in fp32 and
rounds once (the bias added in fp32 first): 2 ROUNDOFF, plus fp32 sums in another order
(below 1e-5 at these reduction sizes).
"""

from __future__ import annotations

import torch

from aiter.ops.conv3d.reach import conv_case as _conv
from op_tests.emulated.suite import CaseContext, case


@case("conv3d")
def k3_padded_bias_ncdhw(ctx: CaseContext) -> None:
    _conv(ctx, "conv3d 3x3x3 pad 1 NCDHW", (1, 8, 4, 6, 6), (16, 8, 3, 3, 3), padding=1)


@case("conv3d")
def strided_ndhwc_fp16(ctx: CaseContext) -> None:
    _conv(ctx, "conv3d stride (1, 2, 2) NDHWC fp16", (2, 16, 3, 9, 7), (24, 16, 1, 3, 3),
          dtype=torch.float16, bias=False, stride=(1, 2, 2), padding=(0, 1, 1),
          input_layout="NDHWC", output_layout="NDHWC")  # fmt: skip


@case("conv3d")
def grouped_dilated(ctx: CaseContext) -> None:
    _conv(ctx, "conv3d groups 2 dilation 2", (1, 16, 5, 7, 7), (32, 8, 3, 3, 3),
          dilation=2, padding=2, groups=2, output_layout="NDHWC")  # fmt: skip


@case("conv3d")
def temporal_kernel_ndhwc_to_ncdhw(ctx: CaseContext) -> None:
    _conv(ctx, "conv3d 3x1x1 NDHWC -> NCDHW", (1, 32, 6, 5, 5), (40, 32, 3, 1, 1),
          padding=(1, 0, 0), input_layout="NDHWC")  # fmt: skip
