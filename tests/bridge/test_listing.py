"""Tests of aiter.flydsl_bridge.listing on small hand-written ISA listings (metadata, loops,
exposed waits, widths, MMA FLOPs, occupancy, the roofline estimate), of the kernel_profile
benchmark's table on them, and (slow) on the listing of one real compiled kernel."""

from __future__ import annotations

import math
import textwrap

import pytest

from aiter.flydsl_bridge import listing as isa

METADATA = """
    .section	.rodata,"a",@progbits
    .amdhsa_kernel {name}
        .amdhsa_group_segment_fixed_size {lds}
        .amdhsa_next_free_vgpr 999
    .end_amdhsa_kernel
    .set .L{name}.num_vgpr, {arch_vgprs}
    .set .L{name}.num_agpr, {agprs}
    .amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     {agprs}
    .args:
      - .address_space:  global
        .name:           a_ptr
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
    .group_segment_fixed_size: {lds}
    .max_flat_workgroup_size: 256
    .name:           {name}
    .private_segment_fixed_size: 0
    .reqd_workgroup_size:
      - {threads}
      - 1
      - 1
    .sgpr_count:     42
    .sgpr_spill_count: 0
    .vgpr_count:     {vgprs}
    .vgpr_spill_count: {spills}
    .wavefront_size: {wave}
amdhsa.target:   amdgcn-amd-amdhsa--{arch}
...
    .end_amdgpu_metadata
"""


def make_listing(body: str, arch: str = "gfx942", **meta) -> str:
    """A listing of kernel `k` with `body` (instructions, one per line) and metadata."""
    fields = dict(name="k", lds=16384, arch_vgprs=9, agprs=32, vgprs=44, threads=256, spills=0,
                  wave=64, arch=arch) | meta  # fmt: skip
    head = f'\t.amdgcn_target "amdgcn-amd-amdhsa--{arch}:xnack-"\n\t.text\n\t.globl k\nk:\n'
    text = textwrap.dedent(body).strip("\n")
    return head + "\n".join("\t" + line for line in text.splitlines()) + METADATA.format(**fields)


# A pipelined loop: the wait at the label drains the previous iteration's loads.
PIPELINED = """
    s_mov_b32 s0, 0
.LBB0_1:
    s_waitcnt vmcnt(0)
    ds_write_b128 v1, v[2:5]
    s_waitcnt lgkmcnt(0)
    s_barrier
    buffer_load_dwordx4 v[2:5], v6, s[8:11], 0 offen
    global_load_dwordx2 v[20:21], v[22:23], off
    ds_read_b128 v[10:13], v7
    s_waitcnt lgkmcnt(0)
    v_mfma_f32_16x16x16_bf16 v[30:33], v[10:11], v[12:13], v[30:33]
    v_mfma_f32_16x16x16_bf16 v[30:33], v[10:11], v[12:13], v[30:33]
    v_add_u32_e32 v6, 64, v6 ; a comment
    s_add_i32 s0, s0, 1
    s_cmp_lt_i32 s0, s1
    s_cbranch_scc1 .LBB0_1
    s_endpgm
"""

# A direct-load loop: the MMAs wait for the loads of their own iteration.
DIRECT = """
.LBB0_2:
    global_load_dwordx4 v[2:5], v[6:7], off
    global_load_dwordx4 v[8:11], v[12:13], off
    s_waitcnt vmcnt(0)
    v_mfma_f32_16x16x32_fp8_fp8 v[30:33], v[2:3], v[8:9], v[30:33]
    s_cbranch_vccnz .LBB0_2
"""


def main_figures(body: str, arch: str = "gfx942", wave: int = 64) -> isa.LoopFigures:
    lst = isa.parse_listing(make_listing(body, arch, wave=wave))
    loop = isa.main_loop(lst)
    assert loop is not None
    return isa.loop_figures(loop, lst.wave_size)


# --- metadata and instructions ---------------------------------------------------------------


def test_metadata() -> None:
    lst = isa.parse_listing(make_listing(PIPELINED, lds=8192, spills=3))
    assert (lst.name, lst.arch, lst.wave_size) == ("k", "gfx942", 64)
    assert (lst.vgprs, lst.agprs, lst.arch_vgprs, lst.sgprs) == (44, 32, 9, 42)
    assert (lst.lds_bytes, lst.vgpr_spills, lst.sgpr_spills, lst.scratch_bytes) == (8192, 3, 0, 0)
    assert (lst.workgroup_size, lst.waves_per_block) == (256, 4)


def test_metadata_defaults_and_gfx1250_target() -> None:
    text = make_listing(PIPELINED, arch="gfx1250", wave=32, threads=128).replace(
        "  - .agpr_count:     32\n    .args:", "  - .args:"
    )
    lst = isa.parse_listing(text.replace("    .set .Lk.num_vgpr, 9\n", ""))
    assert (lst.arch, lst.wave_size, lst.agprs, lst.arch_vgprs, lst.waves_per_block) == (
        "gfx1250", 32, 0, 44, 4,
    )  # fmt: skip


def test_instructions_skip_comments_directives_and_metadata() -> None:
    lst = isa.parse_listing(make_listing(PIPELINED))
    mnemonics = [i.mnemonic for i in lst.instructions]
    assert mnemonics[0] == "s_mov_b32" and mnemonics[-1] == "s_endpgm"
    assert len(mnemonics) == 16
    assert dict(lst.labels) == {"k": 0, ".LBB0_1": 1}
    add = lst.instructions[11]
    assert (add.mnemonic, add.operands) == ("v_add_u32_e32", "v6, 64, v6")
    assert add.line == lst.instructions[10].line + 1


def test_block_comments_in_operands() -> None:
    lst = isa.parse_listing(make_listing("v_add_lshl_u32 v146, s24, v28 /*v284*/, 1"))
    assert lst.instructions[0].operands == "v146, s24, v28 , 1"


# --- loops -----------------------------------------------------------------------------------


def test_pipelined_loop_figures() -> None:
    fig = main_figures(PIPELINED)
    assert fig.label == ".LBB0_1" and fig.instructions == 14
    assert (fig.global_load_count, fig.buffer_load_count) == (2, 1)
    assert fig.global_load_bytes == (16 + 8) * 64
    assert (fig.lds_read_bytes, fig.lds_write_bytes) == (16 * 64, 16 * 64)
    assert (fig.lds_read_count, fig.lds_write_count) == (1, 1)
    assert fig.mma_count == 2 and dict(fig.mma_by_mnemonic) == {"v_mfma_f32_16x16x16_bf16": 2}
    assert fig.mma_flops == 2 * 2 * 16 * 16 * 16
    assert (fig.valu_count, fig.salu_count, fig.barriers, fig.waitcnts) == (1, 2, 1, 3)
    assert not fig.exposed_wait and fig.exposed_wait_detail is None


def test_wait_before_the_first_mma_is_exposed() -> None:
    fig = main_figures(DIRECT)
    assert fig.exposed_wait
    assert fig.exposed_wait_detail.endswith("s_waitcnt vmcnt(0)")
    assert main_figures(DIRECT.replace("vmcnt(0)", "vmcnt(1)")).exposed_wait
    assert not main_figures(DIRECT.replace("vmcnt(0)", "vmcnt(2)")).exposed_wait


def test_wait_after_the_mmas_is_not_exposed() -> None:
    body = """
    .LBB0_3:
        v_mfma_f32_16x16x16_f16 v[30:33], v[2:3], v[8:9], v[30:33]
        global_load_dwordx4 v[2:5], v[6:7], off
        s_waitcnt vmcnt(0)
        v_mfma_f32_16x16x16_f16 v[30:33], v[2:3], v[8:9], v[30:33]
        s_branch .LBB0_3
    """
    assert not main_figures(body).exposed_wait


def test_gfx9_vmcnt_counts_stores() -> None:
    load_then_store = """
    .LBB0_1:
        global_load_dword v2, v[6:7], off
        global_store_dword v[6:7], v3, off
        s_waitcnt vmcnt(1)
        v_mfma_f32_16x16x16_bf16 v[30:33], v[2:3], v[8:9], v[30:33]
        s_cbranch_scc1 .LBB0_1
    """
    fig = main_figures(load_then_store)
    assert fig.exposed_wait  # vmcnt(1) leaves only the store outstanding
    assert (fig.global_store_count, fig.global_store_bytes) == (1, 4 * 64)
    store_then_load = load_then_store.replace(
        "global_load_dword v2, v[6:7], off\n        global_store_dword v[6:7], v3, off",
        "global_store_dword v[6:7], v3, off\n        global_load_dword v2, v[6:7], off",
    )
    assert not main_figures(store_then_load).exposed_wait


def test_gfx1250_waits_and_names() -> None:
    body = """
    .LBB0_4:
        s_wait_loadcnt 0x0
        global_load_b128 v[2:5], v[6:7], off
        buffer_load_b128 v[8:11], v12, s[4:7], null offen
        ds_load_b128 v[20:23], v24
        ds_store_b128 v25, v[2:5]
        s_wait_loadcnt 0x1
        s_barrier_signal -1
        s_barrier_wait -1
        v_wmma_f32_16x16x32_bf16 v[30:37], v[20:23], v[8:11], v[30:37]
        s_cbranch_scc1 .LBB0_4
    """
    fig = main_figures(body, "gfx1250", wave=32)
    assert (fig.global_load_bytes, fig.buffer_load_count) == (2 * 16 * 32, 1)
    assert (fig.lds_read_bytes, fig.lds_write_bytes) == (16 * 32, 16 * 32)
    assert fig.barriers == 1 and fig.waitcnts == 2
    assert fig.exposed_wait and "s_wait_loadcnt 0x1" in fig.exposed_wait_detail
    assert not main_figures(body.replace("0x1", "0x2"), "gfx1250", wave=32).exposed_wait


def test_nested_loops_take_the_innermost_with_the_most_mmas() -> None:
    mfma = "v_mfma_f32_16x16x16_bf16 v[30:33], v[2:3], v[8:9], v[30:33]"
    body = f"""
    .LBB0_1:
        {mfma}
    .LBB0_2:
        {mfma}
        {mfma}
        s_cbranch_scc1 .LBB0_2
        {mfma}
        s_cbranch_scc0 .LBB0_1
    .LBB0_5:
        {mfma}
        s_cbranch_scc1 .LBB0_5
    """
    lst = isa.parse_listing(make_listing(body))
    assert {lp.label: lp.mma_count for lp in isa.loops(lst)} == {
        ".LBB0_1": 4, ".LBB0_2": 2, ".LBB0_5": 1,
    }  # fmt: skip
    assert isa.main_loop(lst).label == ".LBB0_2"


def test_inner_loops_without_mmas_stay_in_the_main_loop() -> None:
    body = """
    .LBB0_1:
        s_mov_b32 s2, exec_lo
    .LBB0_2:
        v_readfirstlane_b32 s4, v230
        buffer_load_b128 v[194:197], v5, s[4:7], null offen
        s_cbranch_execnz .LBB0_2
        v_wmma_f32_16x16x32_bf16 v[30:37], v[20:23], v[8:11], v[30:37]
        s_cbranch_scc1 .LBB0_1
    """
    fig = main_figures(body, "gfx1250", wave=32)
    assert fig.label == ".LBB0_1" and fig.inner_loops == 1 and fig.mma_count == 1
    assert fig.valu_count == 1  # v_readfirstlane counts as VALU


def test_no_mma_loop() -> None:
    assert isa.main_loop(isa.parse_listing(make_listing(DIRECT.replace("v_mfma", "v_fma")))) is None
    no_loop = DIRECT.replace("s_cbranch_vccnz .LBB0_2", "s_endpgm")
    assert isa.main_loop(isa.parse_listing(make_listing(no_loop))) is None
    forward = "s_cbranch_scc1 .LBB0_9\nv_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]\n"
    assert isa.main_loop(isa.parse_listing(make_listing(forward + ".LBB0_9:\ns_endpgm"))) is None


@pytest.mark.parametrize(
    ("mnemonic", "width"),
    [
        ("global_load_dword", 4), ("global_load_dwordx2", 8), ("buffer_load_dwordx3", 12),
        ("buffer_load_dwordx4", 16), ("global_load_ubyte", 1), ("global_load_sbyte", 1),
        ("global_load_ushort", 2), ("global_load_short_d16_hi", 2), ("buffer_load_ubyte_d16", 1),
        ("global_load_b32", 4), ("global_load_b64", 8), ("global_load_b96", 12),
        ("global_load_b128", 16), ("global_load_d16_b16", 2), ("global_load_lds_dwordx4", 16),
        ("ds_read_b32", 4), ("ds_read_b64", 8), ("ds_read_b96", 12), ("ds_read_b128", 16),
        ("ds_read_u8", 1), ("ds_read_i16", 2), ("ds_read2_b32", 8), ("ds_read2_b64", 16),
        ("ds_read2st64_b32", 8), ("ds_write_b16", 2), ("ds_write2_b64", 16),
        ("ds_load_b128", 16), ("ds_store_b64", 8), ("ds_load_2addr_b32", 8),
        ("ds_read_b64_tr_b16", 8), ("global_store_d16_hi_b16", 2),
    ],
)  # fmt: skip
def test_access_bytes(mnemonic: str, width: int) -> None:
    assert isa.access_bytes(mnemonic) == width


def test_memory_kinds() -> None:
    assert isa.vmem_kind("s_buffer_load_dwordx4") is None
    assert isa.vmem_kind("global_prefetch_b8") is None
    assert isa.vmem_kind("global_atomic_add_f32") == "atomic"
    assert isa.lds_kind("ds_bpermute_b32") is None and isa.lds_kind("ds_add_u32") is None


# --- MMA FLOPs, occupancy, roofline ----------------------------------------------------------


@pytest.mark.parametrize(
    ("mnemonic", "flops"),
    [
        ("v_mfma_f32_16x16x16_bf16", 2 * 16 * 16 * 16),
        ("v_mfma_f32_16x16x16bf16_1k", 2 * 16 * 16 * 16),
        ("v_mfma_f32_16x16x32_bf16", 2 * 16 * 16 * 32),
        ("v_mfma_f32_16x16x32_fp8_fp8", 2 * 16 * 16 * 32),
        ("v_mfma_f32_16x16x32_f16", 2 * 16 * 16 * 32),
        ("v_mfma_i32_16x16x32_i8", 2 * 16 * 16 * 32),
        ("v_mfma_i32_16x16x64_i8", 2 * 16 * 16 * 64),
        ("v_mfma_scale_f32_16x16x128_f8f6f4", 2 * 16 * 16 * 128),
        ("v_mfma_f32_32x32x8_f16", 2 * 32 * 32 * 8),
        ("v_mfma_f32_32x32x8_bf16", 2 * 32 * 32 * 8),
        ("v_mfma_f32_32x32x1_2b_f32", 2 * 32 * 32 * 1 * 2),
        ("v_mfma_f32_4x4x4_16b_f16", 2 * 4 * 4 * 4 * 16),
        ("v_wmma_f32_16x16x32_bf16", 2 * 16 * 16 * 32),
        ("v_wmma_f32_16x16x64_fp8_fp8", 2 * 16 * 16 * 64),
        ("v_wmma_f32_16x16x128_fp8_fp8", 2 * 16 * 16 * 128),
        ("v_mfma_scale_f32_16x16x128_f8f6f4", 2 * 16 * 16 * 128),
        ("v_smfmac_f32_16x16x64_bf16", 2 * 16 * 16 * 64),
        ("v_mov_b32", 0),
    ],
)
def test_mma_flops(mnemonic: str, flops: int) -> None:
    assert isa.mma_flops(mnemonic) == flops


@pytest.mark.parametrize(
    ("arch", "vgprs", "agprs", "lds", "waves", "expected"),
    [
        ("gfx942", 164, 0, 16384, 4, 3),  # 168 registers: 512 // 168
        ("gfx942", 42, 0, 4096, 4, 8),  # capped at 8 waves per SIMD
        ("gfx942", 128, 128, 0, 4, 2),  # unified file: 256 registers
        ("gfx942", 9, 120, 0, 4, 3),  # roundup(9, 4) + 120 = 132 -> 136 registers
        ("gfx942", 64, 0, 32768, 4, 2),  # LDS: 2 blocks of one wave per SIMD
        ("gfx942", 64, 0, 32768, 8, 4),  # LDS: 2 blocks of two waves per SIMD
        ("gfx942", 64, 0, 65537, 4, 0),  # does not fit
        ("gfx950", 64, 0, 163840, 4, 1),  # gfx950's 160 KiB LDS holds one such block
        ("gfx950", 64, 0, 65536, 4, 2),
        ("gfx950", 256, 0, 0, 4, 2),
    ],
)
def test_occupancy(arch, vgprs, agprs, lds, waves, expected) -> None:
    assert isa.occupancy(arch, vgprs, agprs, lds, waves) == expected


def test_occupancy_not_modelled_on_gfx1250() -> None:
    assert isa.occupancy("gfx1250", 64, 0, 0, 4) is None


def test_mma_precision() -> None:
    assert isa.mma_precision("v_mfma_f32_16x16x16_bf16") == "bf16"
    assert isa.mma_precision("v_mfma_f32_16x16x16f16") == "bf16"
    assert isa.mma_precision("v_mfma_f32_16x16x32_fp8_fp8") == "fp8"
    assert isa.mma_precision("v_mfma_i32_16x16x32_i8") == "fp8"
    assert isa.mma_precision("v_mfma_scale_f32_16x16x128_f8f6f4") == "fp8"
    assert isa.mma_precision("v_mfma_f32_16x16x4_f32") is None


def test_roofline_estimate() -> None:
    fig = main_figures(PIPELINED)  # 2 bf16 MFMAs, 24 * 64 bytes per wave
    est = isa.roofline_estimate("gfx942", fig, 4)
    assert est.device == "MI300X" and est.precision == "bf16"
    assert est.flops_per_iteration == 4 * 16384 and est.global_bytes_per_iteration == 4 * 1536
    assert est.flop_per_byte == pytest.approx(16384 / 1536)
    assert est.machine_balance == pytest.approx(1307.4e12 / 5.3e12)
    assert est.memory_bound
    assert est.fraction_of_peak == pytest.approx(16384 / 1536 * 5.3e12 / 1307.4e12)
    fp8 = isa.roofline_estimate("gfx950", main_figures(DIRECT), 4)
    assert fp8.device == "MI355X" and fp8.precision == "fp8"
    assert fp8.machine_balance == pytest.approx(5.0e15 / 8.0e12)
    assert isa.roofline_estimate("gfx1250", fig, 4) is None


def test_roofline_estimate_compute_bound_without_loads() -> None:
    fig = main_figures(DIRECT.replace("global_load", "ds_read").replace("_dwordx4", "_b128"))
    est = isa.roofline_estimate("gfx942", fig, 4)
    assert math.isinf(est.flop_per_byte) and est.fraction_of_peak == 1 and not est.memory_bound


# --- the benchmark's table -------------------------------------------------------------------


def test_profile_table_of_synthetic_listings() -> None:
    from benchmarks import kernel_profile as kp

    gemm = kp.profile_listing(make_listing(PIPELINED))
    other = kp.profile_listing(make_listing("s_endpgm"))
    assert gemm["occupancy"] == 4 and gemm["loop"]["mma_count"] == 2
    cfg = dict(kernel="a16w16", tile=[128, 128, 64], dtype="bfloat16", mma="mfma")
    rows = [
        dict(cfg, arch="gfx942", label=kp.config_label(cfg), listings=[gemm, other]),
        dict(cfg, arch="gfx942", label="x", listings=[], error="child process died (-6)"),
    ]
    table = kp.format_table(rows)
    assert "nothing ran on a GPU" in table.splitlines()[0]
    row = table.splitlines()[2].split()
    assert row[:4] == ["a16w16", "gfx942", "128x128x64", "bf16"]
    assert "2 mfma_f32_16x16x16_bf16" in table and "MI300X" in table
    assert "FAILED" in table and "child process died (-6)" in table
    configs = kp.default_configs("gfx1250")
    assert configs and not any(c["kernel"] == "a8w8_blockscale" for c in configs)
    assert {c["mma"] for c in configs} == {"wmma"} and len(kp.default_configs("gfx942")) <= 30
    assert len(kp.not_built("gfx1250")) == 2 and not kp.not_built("gfx950")
    assert kp.not_built("gfx942") == [
        "mx_a4w4, mx_fp8: gfx942 has no MX GEMM kernel (aiter.ops.gemm.kernels.mx)"
    ]


@pytest.mark.slow
def test_profile_of_a_compiled_kernel(rocm_path: str) -> None:
    from benchmarks import kernel_profile as kp

    cfg = dict(kernel="a16w16", tile=[128, 128, 64], dtype="bfloat16", mma="mfma")
    (row,) = kp.profile_configs("gfx942", [cfg], rocm_path=rocm_path)
    assert "error" not in row, row["error"]
    (lst,) = row["listings"]
    assert lst["arch"] == "gfx942" and lst["wave_size"] == 64 and lst["lds_bytes"] > 0
    loop = lst["loop"]
    assert loop["mma_count"] > 0 and loop["global_load_bytes"] > 0
    assert 1 <= lst["occupancy"] <= 8
    # A 128x128 tile reuses each loaded byte at most 128 * 128 / (128 + 128) = 64 times.
    assert 0 < loop["mma_flops"] / loop["global_load_bytes"] <= 64
    assert "a16w16" in kp.format_table([row])


@pytest.mark.slow
def test_a_child_killed_by_llvm_fails_only_its_config(rocm_path: str) -> None:
    """An MFMA kernel built for gfx1250 aborts LLVM: that config fails, the next one compiles."""
    from benchmarks import kernel_profile as kp

    cfg = dict(kernel="a16w16", tile=[16, 64, 32], dtype="bfloat16")
    configs = [dict(cfg, mma="mfma"), dict(cfg, mma="wmma")]
    aborted, built = kp.profile_configs("gfx1250", configs, rocm_path=rocm_path)
    assert "child process died" in aborted["error"] and not aborted["listings"]
    assert "error" not in built and built["listings"][0]["loop"]["mma_count"] > 0
    assert "FAILED" in kp.format_table([aborted, built])
