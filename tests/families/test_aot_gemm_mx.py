"""The MX GEMM tables' replay on the archs without MX kernels: a table row of gfx942 (no MX
instructions) or gfx1250 (no MX kernel here yet) is reported SKIP with the entry's reason, and
the build passes; gfx950's rows name their kernels.
"""

from __future__ import annotations

import pytest

from aiter.ops.gemm.table import A4W4, MXFP8, MXFP8_Q_DTYPE
from tests.aot_cli import other_tables, read_report, run_aot

pytestmark = pytest.mark.slow  # runs the command line

MODULE = "aiter.aot.flydsl.gemm"
ARCHS = ("gfx942", "gfx950", "gfx1250")
CU = {"gfx942": 304, "gfx950": 256, "gfx1250": 256}


def test_archs_without_mx_kernels_report_skip(tmp_path) -> None:
    fp4, fp8 = "flydsl_a4w4_mfma_16x64x512", "flydsl_a8w8_mxfp8_mfma_16x64x256"
    a4w4 = [f"{arch},{CU[arch]},64,1536,7168,flydsl,0,0,,{fp4}" for arch in ARCHS]
    mxfp8 = [f"{arch},{CU[arch]},64,1024,8192,{MXFP8_Q_DTYPE},flydsl,0,0,,{fp8}" for arch in ARCHS]
    for spec, rows in ((A4W4, a4w4), (MXFP8, mxfp8)):
        (tmp_path / spec.name).write_text("\n".join([",".join(spec.header), *rows]) + "\n")
    for spec in other_tables(A4W4, MXFP8):
        (tmp_path / spec.name).write_text(",".join(spec.header) + "\n")
    env = {"AITER_CONFIG_DIR": str(tmp_path), "GPU_ARCHS": ";".join(ARCHS)}
    report = tmp_path / "report.json"
    proc = run_aot(MODULE, "--list", "--report", str(report), "--cache-dir", str(tmp_path / "c"),
                   "--max-m", "64", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = {r.arch: r for r in read_report(report)}
    for arch, reason in (
        ("gfx942", "gfx942 has no MX instructions"),
        ("gfx1250", "no MX GEMM kernel for gfx1250 yet"),
    ):
        results = reports[arch].results
        assert len(results) == 8  # two tables, four caller variants each
        assert all(r.tag == "SKIP" and reason in r.message for r in results), results
    gfx950 = reports["gfx950"].results
    assert len(gfx950) == 8 and all(r.tag == "OK" for r in gfx950)
    functions = {k.function for k in reports["gfx950"].kernels().values()}
    assert functions == {"gemm_a4w4", "gemm_mxfp8"}
