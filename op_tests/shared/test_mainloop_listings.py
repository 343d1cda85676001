"""Structural tests of every GEMM-shaped kernel's compiled main loop, from FlyDSL's ISA listings
(benchmarks/kernel_profile.py compiles them on CPU, one child process per arch).

What they hold the kernels to: the shared operand is staged through LDS, the loads are buffer
loads, no wait on an iteration's own loads stands before its first MMA, nothing spills (VGPRs or
SGPRs), the occupancy is at least the direct-load kernels' (measured from their listings before
the shared main loop), and gfx950 runs its 16x16x32 bf16/f16 MFMA.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import kernel_profile  # noqa: E402

ARCHS = ("gfx942", "gfx950", "gfx1250")

# Waves per SIMD of the direct-load kernels at the profiled tiles (kernel_profile.py on their
# listings; gfx1250's occupancy is not modelled). A new kernel must reach at least these.
BASELINE_OCCUPANCY = {
    "gfx942": {
        ("a16w16", "128x128x64 bf16"): 3,
        ("a16w16", "64x128x32 bf16"): 6,
        ("a16w16", "16x64x32 bf16"): 8,
        ("a8w8_bpreshuffle", "128x128x128 fp8"): 3,
        ("a8w8_bpreshuffle", "64x128x64 fp8"): 5,
        ("a8w8_bpreshuffle", "128x128x128 i8"): 3,
        ("a8w8_blockscale", "128x128x128 fp8"): 2,
        ("a8w8_blockscale", "64x128x128 fp8"): 3,
        ("moe_stage1", "32x128x64 bf16"): 4,
        ("moe_stage1", "64x128x128 fp8"): 2,
        ("moe_stage2", "64x128x64 bf16"): 3,
        ("moe_stage2", "32x128x128 fp8"): 4,
        ("conv3d", "64x64 w2x2 bf16"): 7,
        ("conv3d", "128x128 w2x2 bf16"): 2,
    },
}
BASELINE_OCCUPANCY["gfx950"] = dict(BASELINE_OCCUPANCY["gfx942"])
BASELINE_OCCUPANCY["gfx950"][("conv3d", "128x128 w2x2 bf16")] = 3

# The MMA each arch's 16-bit kernels must use.
BF16_MMA = {
    "gfx942": "v_mfma_f32_16x16x16_bf16",
    "gfx950": "v_mfma_f32_16x16x32_bf16",
    "gfx1250": "v_wmma_f32_16x16x32_bf16",
}


@pytest.fixture(scope="module", params=ARCHS)
def profiled(request, tmp_path_factory) -> tuple[str, list[dict]]:
    arch = request.param
    configs = [
        c
        for c in kernel_profile.default_configs(arch)
        if c["kernel"] in kernel_profile.GEMM_KERNELS
    ]
    rows = kernel_profile.profile_configs(
        arch, configs, tmp_path_factory.mktemp(f"listings_{arch}")
    )
    return arch, rows


def _main_listing(row: dict) -> dict:
    """The listing of the config's GEMM kernel: the one whose main loop issues the most MMAs."""
    assert not row.get("error"), f"{row['kernel']} {row['label']}: {row['error']}"
    with_loops = [lst for lst in row["listings"] if lst["loop"]]
    assert with_loops, f"{row['kernel']} {row['label']}: no listing has a main loop"
    return max(with_loops, key=lambda lst: lst["loop"]["mma_count"])


def _name(row: dict) -> str:
    return f"{row['arch']} {row['kernel']} {row['label']}"


@pytest.mark.slow
def test_every_main_loop_stages_through_lds_with_buffer_loads(profiled) -> None:
    _, rows = profiled
    for row in rows:
        lst = _main_listing(row)
        loop = lst["loop"]
        assert lst["lds_bytes"] > 0, _name(row)
        assert loop["lds_write_bytes"] > 0 and loop["lds_read_bytes"] > 0, _name(row)
        assert loop["buffer_load_count"] > 0, _name(row)
        assert loop["inner_loops"] == 0, f"{_name(row)}: waterfall loops around the loads"


@pytest.mark.slow
def test_no_wait_on_an_iterations_own_loads_before_its_first_mma(profiled) -> None:
    _, rows = profiled
    exposed = [
        f"{_name(row)}: {lst['loop']['exposed_wait_detail']}"
        for row in rows
        if (lst := _main_listing(row))["loop"]["exposed_wait"]
    ]
    assert exposed == []


@pytest.mark.slow
def test_no_spills_and_occupancy_at_least_the_direct_load_kernels(profiled) -> None:
    arch, rows = profiled
    baseline = BASELINE_OCCUPANCY.get(arch)
    for row in rows:
        lst = _main_listing(row)
        spills = (lst["vgpr_spills"], lst["sgpr_spills"], lst["scratch_bytes"])
        assert spills == (0, 0, 0), _name(row)
        floor = (baseline or {}).get((row["kernel"], row["label"]))
        if floor is None:
            continue  # gfx1250 (occupancy not modelled), or a tile the old kernels lacked
        assert lst["occupancy"] >= floor, f"{_name(row)}: {lst['occupancy']} < {floor} waves/SIMD"


@pytest.mark.slow
def test_16bit_kernels_use_the_arch_mma(profiled) -> None:
    arch, rows = profiled
    for row in rows:
        if row["dtype"] != "bfloat16":
            continue
        mnemonics = _main_listing(row)["loop"]["mma_by_mnemonic"]
        assert set(mnemonics) == {BF16_MMA[arch]}, f"{_name(row)}: {mnemonics}"


def _8bit_mma(arch: str, row: dict) -> str:
    """The MMA an 8-bit kernel must use: gfx942 the 16x16x32 MFMAs, gfx1250 the 16x16x64
    WMMAs; gfx950 int8's 16x16x64 MFMA, and for fp8 the scaled 16x16x128 (two k-blocks per
    call) wherever a k-tile holds two, i.e. tile_k 128."""
    int8 = row["dtype"] == "int8"
    if arch == "gfx1250":
        return "v_wmma_i32_16x16x64_iu8" if int8 else "v_wmma_f32_16x16x64_fp8_fp8"
    if arch == "gfx950" and int8:
        return "v_mfma_i32_16x16x64_i8"
    if arch == "gfx950" and row["tile"][2] >= 128:
        return "v_mfma_scale_f32_16x16x128_f8f6f4"
    return "v_mfma_i32_16x16x32_i8" if int8 else "v_mfma_f32_16x16x32_fp8_fp8"


@pytest.mark.slow
def test_8bit_kernels_use_the_arch_mma(profiled) -> None:
    arch, rows = profiled
    eight_bit = [row for row in rows if row["dtype"] not in ("bfloat16", "float16")]
    assert eight_bit
    for row in eight_bit:
        mnemonics = _main_listing(row)["loop"]["mma_by_mnemonic"]
        assert set(mnemonics) == {_8bit_mma(arch, row)}, f"{_name(row)}: {mnemonics}"
