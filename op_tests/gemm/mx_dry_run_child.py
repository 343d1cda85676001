"""The MX GEMM entries inside a gfx950 dry run (naming mode), in a process of its own (one arch
per process): prints one JSON object, scenario name -> what the call reported or raised.

    python -m op_tests.gemm.mx_dry_run_child TABLE_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.gemm import mx_entry
from aiter.ops.gemm.kernels import mx as kmx
from aiter.ops.gemm.table import A4W4, MXFP8

FP4, FP8, E8M0 = torch.float4_e2m1fn_x2, torch.float8_e4m3fn, torch.float8_e8m0fnu
ENTRIES = {"fp4": mx_entry.gemm_a4w4, "fp8": mx_entry.gemm_mxfp8}


def mx_args(fmt: str, m: int, n: int, k: int, dtype=None, plain_scale: bool = False):
    per_byte = 2 if fmt == "fp4" else 1
    element = dtype or (FP4 if fmt == "fp4" else FP8)
    a_scale = (m, k // 32) if plain_scale else kmx.mx_scale_shape(m, k)
    return (
        torch.empty((m, k // per_byte), dtype=element, device="cuda"),
        torch.empty((n, k // per_byte), dtype=element, device="cuda"),
        torch.empty(a_scale, dtype=E8M0, device="cuda"),
        torch.empty(kmx.mx_scale_shape(n, k), dtype=E8M0, device="cuda"),
    )


def call(fmt: str, m: int, n: int, k: int, bias_dtype=None, out_dtype=torch.bfloat16, **kw):
    """What one call reports: its records and requests, or the error it raises."""
    with dry_run("gfx950", 256, bridge.MODE_NAME) as requests, dispatch.observe() as records:
        bias = None if bias_dtype is None else torch.empty((n,), dtype=bias_dtype, device="cuda")
        try:
            out = ENTRIES[fmt](*mx_args(fmt, m, n, k, **kw), bias, out_dtype=out_dtype)
        except (TypeError, ValueError, NotImplementedError) as err:
            return {"error": type(err).__name__, "message": str(err)}
        return {
            "out": [list(out.shape), str(out.dtype)],
            "records": [
                {"backend": r.backend, "kernel": r.kernel, "source": r.source, "row": r.row,
                 "params": {k: str(v) for k, v in r.params.items()}}
                for r in records
            ],  # fmt: skip
            "requests": [
                {"function": q.function, "params": dict(q.params), "key": str(q.key)}
                for q in requests
            ],
        }


AITER_A4W4 = """cu_num,M,N,K,kernelId,splitK,us,kernelName
256,16,1536,7168,0,0,19.9248,a4w4_blockscale_256x64x128x128_16x16_16x16_8x32x1_8x32x1_1x32x1x8_8_2x2_intrawave_v3
256,16,576,7168,-1,0,nan,None
"""
AITER_MXFP8 = """gfx,cu_num,M,N,K,q_dtype_w,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio
gfx950,256,16,768,7168,mxfp8,flydsl_mxfp8,268,1,23.0185,flydsl_bpreshuflle_32x128x256_MXF8_MXF8_B16_2x1x0x1x0_default,7.65,245.21,0.0
"""


TORCH_A4W4 = ",".join(A4W4.header) + "\ngfx950,256,16,64,224,torch,0,0,,\n"


def with_table(spec, path: Path, text: str, *args, **kwargs) -> dict:
    path.write_text(text)
    os.environ[spec.env_var] = str(path)
    try:
        return call(*args, **kwargs)
    finally:
        del os.environ[spec.env_var]


def main(table_dir: Path) -> dict:
    fp16 = torch.float16
    return {
        "default_fp4": call("fp4", 100, 1536, 7168),
        "default_fp8": call("fp8", 100, 8192, 1024),
        "bias_fp16": call("fp4", 8, 1536, 7168, bias_dtype=fp16, out_dtype=fp16),
        "no_bias": call("fp4", 8, 1536, 7168),
        "k_48": call("fp4", 4, 64, 48),
        "n_24": call("fp4", 4, 24, 256),
        "fnuz": call("fp8", 4, 64, 256, dtype=torch.float8_e4m3fnuz),
        "plain_scale": call("fp8", 4, 64, 256, plain_scale=True),
        "fp32_out": call("fp4", 4, 64, 256, out_dtype=torch.float32),
        "bias_dtype": call("fp8", 4, 64, 256, bias_dtype=fp16),
        "aiter_a4w4": with_table(A4W4, table_dir / "a4w4.csv", AITER_A4W4, "fp4", 16, 576, 7168),
        # torch serves inside the dry run too: the dequantized product on FakeTensors
        "torch_row": with_table(A4W4, table_dir / "torch.csv", TORCH_A4W4, "fp4", 9, 64, 224),
        "aiter_mxfp8": with_table(
            MXFP8, table_dir / "mxfp8.csv", AITER_MXFP8, "fp8", 16, 768, 7168
        ),
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
