"""Tables written in aiter's own formats, as its tuners write them for all of its backends: every
column set loads (extra columns kept, a missing gfx derived from cu_num by aiter's rule, the
chunk_gdn_h opt kernel's columns), a row of another backend is served by this library's choice
and its dispatch record says why, aiter's FlyDSL kernel names carry their tile over where this
library has it, and garbage still fails at load naming file, line and column.

The rows are this file's own; benchmarks/upstream_tables.py reads aiter's real files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import aiter
from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.arch import arch_of_legacy_row
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from aiter.ops.gemm.table import (
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A16W16,
)
from aiter.ops.moe.table import FMOE
from aiter.tuning import TableError
from aiter.tuning.foreign import parse_aiter_flydsl_name

BF16_HEADER = (
    "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,"
    "kernelName,err_ratio,tflops,bw"
)
AITER_A16 = (
    "flydsl_gemm4_abf16_wbf16_bf16_t16x64x128_split_k4_block_m_warp1_block_n_warp4_block_k_warp1"
    "_async_copyTrue_b_to_ldsTrue_b_preshuffleFalse_c_to_ldsFalse_gfx950"
)
AITER_A16_NO_TILE = AITER_A16.replace("t16x64x128", "t48x64x128")
# One shape (N = 512, K = 4096) at M = 1 ... 256, one backend per row.
BF16_ROWS = [
    "gfx942,304,1,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,asm,5,13,7.9,"
    "_ZN5aiter39bf16gemm_fp32bf16_tn_64x64_splitk_cleanE,0.0,21.19,417.92",
    "gfx942,304,2,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,triton,0,0,8.1,"
    "_triton_gemm_a16w16_BLOCK_M16,0.0,1.0,2.0",
    "gfx942,304,4,512,4096,False,torch.bfloat16,torch.bfloat16,False,True,opus,3,0,8.0,"
    "opus_gemm_bf16_16x128,0.0,1.0,2.0",
    f"gfx942,304,8,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,flydsl,0,0,7.0,"
    f"{AITER_A16},0.0,1.0,2.0",
    f"gfx942,304,16,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,flydsl,0,0,7.0,"
    f"{AITER_A16_NO_TILE},0.0,1.0,2.0",
    "gfx942,304,32,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,flydsl,0,2,7.0,"
    "flydsl_a16w16_mfma_32x64x128,0.0,1.0,2.0",
    "gfx942,304,64,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,skinny,0,0,9.0,"
    "wvSplitK,0.0,1.0,2.0",
    "gfx942,304,128,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,hipblaslt,77,0,9.0,"
    "Cijk_Alik_Bljk,0.0,1.0,2.0",
    "gfx942,304,256,512,4096,False,torch.bfloat16,torch.bfloat16,False,False,torch,0,0,9.0,"
    ",0.0,1.0,2.0",
]
A8W8_HEADER = "gfx,cu_num,M,N,K,q_dtype_w,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
BPRESHUFFLE_ROWS = [
    "gfx942,80,16,1024,1024,torch.float8_e4m3fnuz,ck,12,0,4.2,"
    "a8w8_bpreshuffle_256x16x64x256_16x16_16x16_intrawave_v1,1.0,2.0,0.0",
    "gfx942,80,32,1024,1024,torch.float8_e4m3fnuz,cktile,3,0,4.2,cktile_bpreshuffle_32x64,1.0,2.0,0.0",
    "gfx942,80,64,1024,1024,torch.int8,asm,0,8,7.3,"
    "_ZN5aiter41I8gemm_bf16_perTokenI8_BpreShuffle_16x128E,22.92,183.56,0.182",
    "gfx942,80,128,1024,1024,torch.float8_e4m3fnuz,flydsl,0,0,4.0,"
    "flydsl_bpreshuflle_128x256x128_F8_F8_B16_1x2x4x2_default,1.0,2.0,0.0",
]
BLOCKSCALE_HEADER = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
BLOCKSCALE_ROWS = [
    "gfx942,304,1,1024,1024,ck,8,2,4.8,"
    "a8w8_blockscale_1x128x128_256x16x64x256_16x16_16x16_1x1_16x16x1_16x16x1_1x16x1x16_4_1x1_"
    "intrawave_v1,2.61,1304.22,0.0",
    "gfx942,304,2,1024,1024,cktile,3,0,4.8,cktile_blockscale_16x64,2.61,1304.22,0.0",
]
# aiter's a8w8_blockscale_bpreshuffle_tuned_gemm.csv: blockscale's columns, rows of every backend
# its tuners write (the cells as in aiter's files), and one row of this library's kernel.
BS_BPRE_ROWS = [
    "gfx942,80,1,1536,4096,triton,0,0,7.780,triton,0,0,0.0",
    "gfx942,80,16,1536,4096,ck,7,0,12.0155,a8w8_blockscale_bpreshuffle_1x128x128_256x16x64x256_"
    "16x16_16x16_16x16x1_16x16x1_1x16x1x16_4_1x1_intrawave_v1,16.76,0.53316,0.0",
    "gfx942,80,64,1536,4096,flydsl,0,2,9.0,flydsl_a8w8_blockscale_bpreshuffle_mfma_64x64x128,"
    "1.0,2.0,0.0",
    "gfx942,80,128,1536,4096,asm,0,1,19.048,_ZN5aiter42fp8gemm_bf16_blockscale_BpreShuffle_32x128E,"
    "84.56,0.37846,0.0",
    "gfx942,80,1408,1536,4096,opus,11000,0,77.2207,opus_gemm_gfx942_a8w8_bs_bpreshuf_sb_tailm_v16_"
    "512x128x128x128_4x2_16x16x32_1x128x128,229.43,0.21217,0.002053",
    "gfx950,256,8192,7168,4608,cktile,27,0,299.1261,a8w8_blockscale_cktile_192x256x128_4x2x1_"
    "16x16x128_intrawave_0x1x0_2,1809.16,0.62923,0.0",
    # Set aside: N off the 128 grid (DeepSeek-V3's kv_a projection), aiter's MX-scaled kernels.
    "gfx950,256,16,576,7168,ck,7,0,17.6513,a8w8_blockscale_bpreshuffle_1x128x128_256x16x64x256_"
    "16x16_16x16_16x16x1_16x16x1_1x16x1x16_4_1x1_intrawave_v1,7.49,241.45,0.0",
    "gfx1250,256,16,1536,4096,flydsl,11,1,4.6663,flydsl_mxfp8_128_bpreshuffle_wmma_t16x32x1024_mw1_"
    "nw2_nb4_sk1_cm1_cn1,43.14,1372.85,0.0",
]
FMOE_HEADER = (
    "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,"
    "use_g1u1,doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,"
    "run_1stage,tflops,bw,_tag"
)
_SILU = "ActivationType.Silu,torch.bfloat16,torch.bfloat16,torch.bfloat16,QuantType.No"
FMOE_ROWS = [
    # CK stages at block_m 128 (not a tile of this library's): the planner serves.
    f"304,32,2048,512,8,2,{_SILU},1,0,128,0,17.8,"
    "moe_ck2stages_gemm1_256x128x128x64_1x4_TypeCast_v3_Nswizzle0_Quant0_MulRoutedWeight0_B16,"
    "0.0%,14.5,moe_ck2stages_gemm2_256x128x64x128_1x4_TypeCast_v3_Nswizzle0_Quant0_B16,0.0%,"
    "32.3,0,5.26,2629.41,",
    # aiter's asm stage 1 on MI355X (cu_num 256 -> gfx950).
    f"256,32,2048,512,8,2,{_SILU},1,0,32,0,17.8,"
    "_ZN5aiter56fmoe_stage1_bf16_pertokenFp8_doweight_g1u1_32x64_4tg_pf3E,0.0%,14.5,,,32.3,"
    "0,5.26,2629.41,",
    # Kinds this library has no kernel for: set aside with the reason.
    "80,32,2048,512,8,2,ActivationType.Gelu,torch.bfloat16,torch.float8_e4m3fnuz,"
    "torch.float8_e4m3fnuz,QuantType.per_Token,1,1,32,0,17.8,,,,,,32.3,0,5.26,2629.41,",
    "80,64,7168,256,256,8,ActivationType.Silu,torch.bfloat16,torch.float8_e4m3fnuz,"
    "torch.float8_e4m3fnuz,QuantType.per_1x128,1,0,64,0,17.8,,,,,,32.3,0,5.26,2629.41,",
    "80,128,2048,512,8,2,ActivationType.Silu,torch.bfloat16,torch.float4_e2m1fn_x2,"
    "torch.float4_e2m1fn_x2,QuantType.per_1x32,1,0,32,0,17.8,,,,,,32.3,0,5.26,2629.41,",
    f"80,256,2048,512,8,2,{_SILU},1,0,32,0,,,,,,,32.3,1,5.26,2629.41,",
    f"80,512,2048,512,8,2,{_SILU},1,0,32,0,,,,,,,32.3,0,5.26,2629.41,flydsl_fallback",
]
OPT_HEADER = (
    "gfx,cu_num,dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,T_flat,N,"
    "total_chunks,max_seq_chunks,BV,us"
)
OPT_ROWS = [
    "gfx942,80,torch.bfloat16,128,128,64,32,16,False,True,False,True,False,2048,1,32,32,64,147.9",
    "gfx942,80,torch.bfloat16,128,128,64,32,16,True,True,True,True,False,4096,2,64,32,32,149.0",
    "gfx942,80,torch.bfloat16,128,128,64,4,2,False,True,False,False,False,2048,1,32,32,64,149.0",
    "gfx942,80,torch.bfloat16,128,128,64,4,2,True,True,True,True,True,2048,1,32,32,64,149.0",
]


def _write(tmp_path: Path, name: str, header: str, rows: list[str]) -> str:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def _t(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _record(arch: str, cu_num: int, call: Callable[[], object]) -> dispatch.DispatchRecord:
    """The last dispatch record of `call()` in a naming dry run of `arch` (nothing compiles;
    one arch per process, so every test here asks gfx942)."""
    with dry_run(arch, cu_num, bridge.MODE_NAME), dispatch.observe() as records:
        call()
    return records[-1]


@pytest.fixture
def bf16_table(tmp_path, monkeypatch) -> str:
    path = _write(tmp_path, "bf16_tuned_gemm.csv", BF16_HEADER, BF16_ROWS)
    monkeypatch.setenv(A16W16.env_var, path)
    return path


def test_aiter_bf16_table_loads_every_backend_and_keeps_its_columns(bf16_table, tmp_path):
    table = A16W16.load()
    mine = [row for row in table.rows if row.source == bf16_table]
    assert len(mine) == len(BF16_ROWS)
    assert [A16W16.backend_of(row) for row in mine] == [
        "asm", "triton", "opus", "flydsl", "flydsl", "flydsl", "skinny", "hipblaslt", "torch"
    ]  # fmt: skip
    assert mine[0]["solidx"] == "5" and mine[0]["bw"] == "417.92"  # extra columns kept
    written = tmp_path / "merged.csv"
    table.to_csv(written)  # a merge writes every column back, the extra ones unchanged
    header, *lines = written.read_text().splitlines()
    assert set(BF16_HEADER.split(",")) <= set(header.split(","))
    assert any(line.endswith(",_ZN5aiter39bf16gemm_fp32bf16_tn_64x64_splitk_cleanE,0.0,21.19,417.92")
               or "417.92" in line for line in lines)  # fmt: skip


def _a16w16_at(m: int) -> dispatch.DispatchRecord:
    return _record("gfx942", 304, lambda: aiter.gemm_a16w16(_t(m, 4096), _t(512, 4096)))


@pytest.mark.parametrize("m, backend", [(1, "asm"), (2, "triton"), (4, "opus"), (64, "skinny")])
def test_a_row_of_another_backend_is_served_by_the_heuristic(bf16_table, m, backend):
    record = _a16w16_at(m)
    assert record.backend == dispatch.BACKEND_FLYDSL and record.source == "table"
    assert record.row.endswith(
        f":{BF16_ROWS.index(next(r for r in BF16_ROWS if f',{m},512,' in r)) + 2}"
    )
    assert record.params["row_backend"] == backend
    assert "heuristic serves" in record.params["served_as"]
    untuned = _record("gfx942", 304, lambda: aiter.gemm_a16w16(_t(m, 4096), _t(768, 4096)))
    assert record.kernel == untuned.kernel  # what an untuned call of the shape is served by


def test_an_aiter_flydsl_name_carries_its_tile_and_split_over(bf16_table):
    record = _a16w16_at(8)
    assert record.kernel == "flydsl_a16w16_mfma_16x64x128" and record.params["split_k"] == 4
    assert record.params["served_as"].endswith("as flydsl_a16w16_mfma_16x64x128")
    stated = parse_aiter_flydsl_name(AITER_A16)
    assert stated.tile == (16, 64, 128) and stated.split_k == 4 and stated.arch == "gfx950"
    assert stated.flags["async_copy"] and not stated.flags["b_preshuffle"]


def test_an_aiter_flydsl_name_without_a_tile_here_is_served_by_the_heuristic(bf16_table):
    record = _a16w16_at(16)
    assert "t48x64x128" in record.params["served_as"]
    assert "has no mfma tile of flydsl_a16w16 here" in record.params["served_as"]


def test_this_librarys_rows_and_torch_rows_are_served_as_before(bf16_table):
    ours = _a16w16_at(32)
    assert ours.kernel == "flydsl_a16w16_mfma_32x64x128" and ours.params["split_k"] == 2
    assert "served_as" not in ours.params and "row_backend" not in ours.params
    assert _a16w16_at(256).backend == dispatch.BACKEND_TORCH


def test_aiter_a8w8_tables_load_every_backend(tmp_path):
    bp = _write(tmp_path, "a8w8_bpreshuffle_tuned_gemm.csv", A8W8_HEADER, BPRESHUFFLE_ROWS)
    bs = _write(tmp_path, "a8w8_blockscale_tuned_gemm.csv", BLOCKSCALE_HEADER, BLOCKSCALE_ROWS)
    bp_rows = [r for r in A8W8_BPRESHUFFLE.load([bp]).rows if r.source == bp]
    bs_rows = [r for r in A8W8_BLOCKSCALE.load([bs]).rows if r.source == bs]
    assert [A8W8_BPRESHUFFLE.backend_of(r) for r in bp_rows] == ["ck", "cktile", "asm", "flydsl"]
    assert [A8W8_BLOCKSCALE.backend_of(r) for r in bs_rows] == ["ck", "cktile"]
    assert bp_rows[0]["errRatio"] == "0.0"


@pytest.fixture
def bs_bpre_table(tmp_path, monkeypatch) -> str:
    name = "a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
    path = _write(tmp_path, name, BLOCKSCALE_HEADER, BS_BPRE_ROWS)
    monkeypatch.setenv(A8W8_BLOCKSCALE_BPRESHUFFLE.env_var, path)
    return path


def test_aiter_blockscale_bpreshuffle_table_loads_and_sets_aside_what_it_cannot_serve(
    bs_bpre_table,
):
    table = A8W8_BLOCKSCALE_BPRESHUFFLE.load()
    mine = [r for r in table.rows if r.source == bs_bpre_table]
    assert [A8W8_BLOCKSCALE_BPRESHUFFLE.backend_of(r) for r in mine] == [
        "triton", "ck", "flydsl", "asm", "opus", "cktile"
    ]  # fmt: skip
    assert mine[-1]["tflops"] == "1809.16"  # extra columns kept
    reasons = [(r["gfx"], why) for r, why in table.set_aside if r.source == bs_bpre_table]
    assert reasons == [
        ("gfx950", "N 576: this library's blockscale GEMM needs N and K multiples of 128"),
        ("gfx1250", "aiter's flydsl_mxfp8_... kernels take e8m0 scales; this library's are fp32"),
    ]


def _bs_bpre_at(m: int) -> dispatch.DispatchRecord:
    n, k = 1536, 4096
    fp8 = torch.float8_e4m3fnuz
    return _record(
        "gfx942",
        80,
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(m, k, dtype=fp8),
            _t(n, k, dtype=fp8),
            _t(m, k // 128, dtype=torch.float32),
            _t(n // 128, k // 128, dtype=torch.float32),
        ),
    )


@pytest.mark.parametrize("m, backend", [(1, "triton"), (16, "ck"), (128, "asm"), (1408, "opus")])
def test_a_blockscale_bpreshuffle_row_of_another_backend_is_served_by_the_heuristic(
    bs_bpre_table, m, backend
):
    record = _bs_bpre_at(m)
    assert record.backend == dispatch.BACKEND_FLYDSL and record.source == "table"
    assert record.kernel.startswith("flydsl_a8w8_blockscale_bpreshuffle_mfma_")
    assert record.params["row_backend"] == backend
    assert record.params["served_as"].endswith("this library's heuristic serves")


def test_a_flydsl_blockscale_bpreshuffle_row_is_served_by_its_kernel(bs_bpre_table):
    record = _bs_bpre_at(64)
    assert record.row == f"{bs_bpre_table}:4"
    assert record.kernel == "flydsl_a8w8_blockscale_bpreshuffle_mfma_64x64x128"
    assert record.params == {"split_k": 2}


def test_a_blockscale_kernel_name_in_the_bpreshuffle_table_fails_at_load(tmp_path):
    row = BS_BPRE_ROWS[2].replace("blockscale_bpreshuffle_mfma", "blockscale_mfma")
    path = _write(tmp_path, A8W8_BLOCKSCALE_BPRESHUFFLE.name, BLOCKSCALE_HEADER, [row])
    with pytest.raises(TableError) as err:
        A8W8_BLOCKSCALE_BPRESHUFFLE.load([path])
    assert str(err.value).startswith(
        f"{path}:2: column 'kernelName': expected flydsl_a8w8_blockscale_bpreshuffle_<mfma|wmma>_"
    ), str(err.value)


def test_aiter_fmoe_table_without_gfx_loads_and_sets_aside_what_it_cannot_serve(tmp_path):
    path = _write(tmp_path, "tuned_fmoe.csv", FMOE_HEADER, FMOE_ROWS)
    table = FMOE.load([path])
    mine = [r for r in table.rows if r.source == path]
    assert [(r["gfx"], r["cu_num"]) for r in mine] == [("gfx942", "304"), ("gfx950", "256")]
    assert [FMOE.backend_of(r) for r in mine] == ["ck", "asm"]
    reasons = [reason for row, reason in table.set_aside if row.source == path]
    assert reasons == [
        "ActivationType.Gelu: this library's fused_moe has silu and swiglu",
        "QuantType.per_1x128 experts: this library has bf16/fp16 and per-token fp8 experts",
        "QuantType.per_1x32 experts: this library has bf16/fp16 and per-token fp8 experts",
        "a one-stage kernel (run_1stage=1); this library's planner serves the shape",
        "aiter tagged it flydsl_fallback: its shape is served by another backend",
    ]


def test_a_ck_moe_row_is_served_by_the_planner(tmp_path, monkeypatch):
    """The file's rows hold no gfx: the CK row's cu_num 304 makes it a gfx942 row."""
    path = _write(tmp_path, "tuned_fmoe.csv", FMOE_HEADER, FMOE_ROWS)
    monkeypatch.setenv(FMOE.env_var, path)

    def layer(tokens: int):
        return lambda: aiter.fused_moe(
            _t(tokens, 2048), _t(8, 1024, 2048), _t(8, 2048, 512),
            _t(tokens, 2, dtype=torch.float32), _t(tokens, 2, dtype=torch.int32),
        )  # fmt: skip

    record = _record("gfx942", 304, layer(32))
    assert record.row == f"{path}:2" and record.params["row_backend"] == "ck"
    assert "moe_ck2stages_gemm1_256x128x128x64" in record.params["served_as"]
    assert record.params["served_as"].endswith("this library's planner serves")
    monkeypatch.delenv(FMOE.env_var)
    planner = _record("gfx942", 304, layer(32))
    assert planner.row is None and record.kernel == planner.kernel


def test_a_legacy_cu_num_names_its_arch_or_is_refused(tmp_path):
    assert arch_of_legacy_row({"cu_num": "304"}) == "gfx942"
    assert arch_of_legacy_row({"cu_num": "80"}) == "gfx942"
    assert arch_of_legacy_row({"cu_num": "256"}) == "gfx950"
    path = _write(
        tmp_path, "tuned_fmoe.csv", FMOE_HEADER, [FMOE_ROWS[0].replace("304,", "228,", 1)]
    )
    with pytest.raises(TableError) as err:
        FMOE.load([path])
    assert str(err.value).startswith(f"{path}:2: column 'gfx' is not in the file and aiter's rule")
    assert "names no arch for cu_num 228" in str(err.value) and "add a gfx column" in str(err.value)


def test_the_chunk_gdn_h_opt_table_loads_with_the_switches_its_kernel_fixes(tmp_path):
    path = _write(tmp_path, "chunk_gdn_h_opt_tuned.csv", OPT_HEADER, OPT_ROWS)
    table = CHUNK_GDN_H.load([path])
    mine = [r for r in table.rows if r.source == path]
    assert len(mine) == 2
    assert all(r.flag("use_g") and not r.flag("use_gk") and r.flag("save_vn") for r in mine)
    assert mine[0]["total_chunks"] == "32"
    reasons = [reason for row, reason in table.set_aside if row.source == path]
    assert reasons == [
        "fp32 per-chunk states (snapshot_bf16=False): this library stores the input dtype",
        "a bf16 final state (state_bf16=True): this library keeps it in fp32",
    ]


@pytest.mark.parametrize(
    "header, row, column, expected",
    [
        (BF16_HEADER, BF16_ROWS[0].replace(",asm,", ",cublas,"), "libtype", "expected one of flydsl"),
        (BF16_HEADER, BF16_ROWS[3].replace(AITER_A16, "gemm_16x64"), "kernelName", "expected flydsl_a16w16_"),
        (BF16_HEADER, BF16_ROWS[0].replace(",False,torch", ",maybe,torch", 1), "bias", "expected 0/1 or True/False"),
        (FMOE_HEADER, FMOE_ROWS[0].replace(",128,0,17.8", ",-1,0,17.8"), "block_m", "expected an integer from 0"),
        (FMOE_HEADER, FMOE_ROWS[0].replace("QuantType.No", "QuantType.Foo"), "q_type", "expected one of QuantType.No"),
        (FMOE_HEADER, FMOE_ROWS[5].replace(",32,0,,", ",128,0,,").replace(",1,5.26", ",0,5.26"), "block_m", "expected one of 0, 16, 32, 64"),
        (OPT_HEADER, OPT_ROWS[0].replace(",False,True,", ",Perhaps,True,", 1), "is_varlen", "expected 0/1 or True/False"),
    ],
    ids=["libtype", "flydsl-name", "bias", "block_m", "q_type", "our-block_m", "flag"],
)  # fmt: skip
def test_garbage_in_aiter_formats_still_fails_at_load(tmp_path, header, row, column, expected):
    spec = {BF16_HEADER: A16W16, FMOE_HEADER: FMOE, OPT_HEADER: CHUNK_GDN_H}[header]
    path = _write(tmp_path, spec.name, header, [row])
    with pytest.raises(TableError) as err:
        spec.load([path])
    assert str(err.value).startswith(f"{path}:2: column {column!r}: {expected}"), str(err.value)


def _aiter_configs(root: Path) -> Path:
    """A directory laid out as aiter's aiter/configs, holding this file's tables."""
    models = root / "model_configs"
    models.mkdir(parents=True)
    _write(root, "bf16_tuned_gemm.csv", BF16_HEADER, BF16_ROWS[:4])
    _write(models, "dsv3_bf16_tuned_gemm.csv", BF16_HEADER, BF16_ROWS[4:])
    _write(models, "dsv3_bf16_untuned_gemm.csv", "M,N,K", ["1,512,4096"])  # not a tuned table
    _write(root, "tuned_fmoe.csv", FMOE_HEADER, FMOE_ROWS)
    _write(models, "a8w8_blockscale_tuned_gemm_ds_v3.csv", BLOCKSCALE_HEADER, BLOCKSCALE_ROWS)
    _write(root, "a8w8_blockscale_bpreshuffle_tuned_gemm.csv", BLOCKSCALE_HEADER, BS_BPRE_ROWS)
    return root


def test_the_builder_reads_a_directory_of_aiters_tables(tmp_path):
    from tests.aot_cli import run_aot

    configs = _aiter_configs(tmp_path / "configs")
    proc = run_aot(
        "aiter.aot.flydsl", "--list", "--module", "gemm,moe", "--aiter-configs", str(configs),
        "--cache-dir", str(tmp_path / "cache"), env={"GPU_ARCHS": "gfx942"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--aiter-configs: 2 file(s) extend bf16_tuned_gemm.csv" in proc.stderr
    assert "--aiter-configs: 1 file(s) extend a8w8_blockscale_tuned_gemm.csv" in proc.stderr
    assert "--aiter-configs: 1 file(s) extend tuned_fmoe.csv" in proc.stderr
    assert (
        "--aiter-configs: 1 file(s) extend a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
        in proc.stderr
    )
    lines = {
        line.split(" (")[0]: line for line in proc.stdout.splitlines() if line.startswith("table ")
    }
    for backend in ("asm 1", "triton 1", "opus 1", "skinny 1", "hipblaslt 1"):
        assert backend in lines["table gemm_a16w16"], lines["table gemm_a16w16"]
    assert "5 set aside: 1 x ActivationType.Gelu" in lines["table fmoe"]
    bs_bpre = lines["table gemm_a8w8_blockscale_bpreshuffle"]
    for backend in ("ck 1", "asm 1", "opus 1", "triton 1", "cktile 1", "flydsl 1"):
        assert backend in bs_bpre, bs_bpre
    assert "2 set aside: 1 x N 576" in bs_bpre, bs_bpre
    assert not [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]


def test_a_bare_csv_goes_to_the_table_its_aiter_name_or_columns_say(tmp_path):
    from aiter.aot.flydsl.execution.options import assign_csv

    specs = [A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE, A8W8_BLOCKSCALE_BPRESHUFFLE, FMOE]
    named = _write(
        tmp_path, "dsv3_a8w8_blockscale_tuned_gemm.csv", BLOCKSCALE_HEADER, BLOCKSCALE_ROWS
    )
    # The same columns as blockscale's: only aiter's file name tells the two tables apart.
    named_bpre = _write(
        tmp_path, "dsv4_a8w8_blockscale_bpreshuffle_tuned_gemm.csv", BLOCKSCALE_HEADER, BS_BPRE_ROWS
    )
    by_columns = _write(tmp_path, "mine.csv", A8W8_HEADER, BPRESHUFFLE_ROWS)
    legacy_moe = _write(tmp_path, "moe.csv", FMOE_HEADER, FMOE_ROWS)
    assigned = assign_csv(specs, [named, named_bpre, by_columns, legacy_moe])
    assert assigned == {
        A8W8_BLOCKSCALE: [named],
        A8W8_BLOCKSCALE_BPRESHUFFLE: [named_bpre],
        A8W8_BPRESHUFFLE: [by_columns],
        FMOE: [legacy_moe],
    }


def test_a_record_short_of_cells_the_table_does_not_need_loads_as_pandas_reads_it(tmp_path):
    """aiter's files hold records one cell short (written with a column left out at the end):
    pandas reads the missing trailing cells as empty; a record short of a needed column fails."""
    short = FMOE_ROWS[0].rsplit(",", 1)[0]  # _tag left out
    path = _write(tmp_path, "tuned_fmoe.csv", FMOE_HEADER, [short])
    (row,) = [r for r in FMOE.load([path]).rows if r.source == path]
    assert row["_tag"] == "" and row["bw"] == "2629.41"
    too_short = FMOE_ROWS[0].split(",")[:20]  # up to kernelName2: us and run_1stage missing
    path = _write(tmp_path, "short_fmoe.csv", FMOE_HEADER, [",".join(too_short)])
    with pytest.raises(TableError, match=f"{path}:2: expected 26 cells .*, found 20"):
        FMOE.load([path])
