"""gfx1250's rules, each on the instructions that implement it: wave32 EXEC, WMMA lane layouts,
VOPD dual issue, true16 register halves, v_cmpx without sdst, the split barrier, the split
wait counters, the 57-bit V#, scale_offset, DPP and v_permlanex16, bitop2 truth tables.

Sources: the gfx12 ISA reference (VOPD, DPP16, s_wait_*, true16), composable_kernel's gfx12
WMMA traits for the lane layouts, LLVM's gfx1250 make.buffer.rsrc lowering for the V#.
"""

from __future__ import annotations

import numpy as np
import pytest

from aiter.emulator.errors import MissingWait
from aiter.emulator.memory import Memory
from tests.emulator.harness import buffer_descriptor_gfx1250, run

ARCH = "gfx1250"
LANES = np.arange(64)
U32 = np.uint32


def _f32(values) -> np.ndarray:
    return np.asarray(values, np.float32).view(U32)


def _gfx1250(lines, **kw):
    return run([*lines, "s_endpgm"], arch=ARCH, **kw)


def test_a_wave32_writes_only_its_32_lanes() -> None:
    """EXEC of a wave32 is EXEC_LO: lanes 32..63 of the register arrays are never written."""
    r = _gfx1250(["v_mov_b32_e32 v1, 7", "s_mov_b32 exec_lo, -1", "v_mov_b32_e32 v2, 9"])
    g = r.waves[0].vgpr
    assert (g[1, :32] == 7).all() and (g[1, 32:] == 0).all()
    assert (g[2, :32] == 9).all() and (g[2, 32:] == 0).all()
    assert r.waves[0].exec == 0xFFFFFFFF


# --- WMMA -------------------------------------------------------------------------------------


def _k_of(lane: np.ndarray, element: np.ndarray) -> np.ndarray:
    """gfx12 WMMA A/B layout: 8 contiguous K per group, the two half-waves interleaved."""
    return 16 * (element // 8) + 8 * (lane // 16) + element % 8


@pytest.mark.parametrize("dtype, k", [("bf16", 32), ("f16", 32)])
def test_wmma_16bit_lane_layout(dtype: str, k: int) -> None:
    """Rule: A [16, K]: lane l holds row l % 16, its element e is K = 16 (e // 8) + 8 (l // 16)
    + e % 8; B [K, 16] alike by column; D register r of lane l is (8 (l // 16) + r, l % 16)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, k, generator=gen).to(
        getattr(torch, "bfloat16" if dtype == "bf16" else "float16")
    )
    b = torch.randn(16, k, generator=gen).to(a.dtype)  # B^T: row n holds column n of B
    c = torch.randn(16, 16, generator=gen)
    lane, element = np.arange(32)[:, None], np.arange(k // 2)[None, :]
    kk = _k_of(lane, element)
    a_lanes = a.view(torch.int16).numpy()[lane % 16, kk].astype(np.uint16)  # [32, K/2]
    b_lanes = b.view(torch.int16).numpy()[lane % 16, kk].astype(np.uint16)
    regs = np.arange(8)[:, None]
    rows, cols = 8 * (np.arange(32) // 16)[None, :] + regs, np.arange(32)[None, :] % 16

    def setup(w):
        for n, lanes in ((0, a_lanes), (8, b_lanes)):
            packed = lanes[:, 0::2].astype(U32) | lanes[:, 1::2].astype(U32) << 16  # [32, 8]
            w.vgpr[n : n + 8, :32] = packed.T
        w.vgpr[16:24, :32] = _f32(c.numpy()[rows, np.broadcast_to(cols, rows.shape)])

    mnemonic = f"v_wmma_f32_16x16x32_{dtype}"
    r = _gfx1250([f"{mnemonic} v[24:31], v[0:7], v[8:15], v[16:23]"], setup=setup)
    got = np.zeros((16, 16), np.float32)
    got[rows, np.broadcast_to(cols, rows.shape)] = r.waves[0].vgpr[24:32, :32].view(np.float32)
    want = (a.double() @ b.double().T + c.double()).float().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_wmma_fp8_is_ocp_e4m3_with_64_k() -> None:
    """Rule: v_wmma_f32_16x16x64_fp8_fp8 takes OCP e4m3 (gfx1250 is not FNUZ), 32 per lane in
    the same interleaved groups of 8."""
    import torch

    gen = torch.Generator().manual_seed(1)
    a = torch.randn(16, 64, generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn(16, 64, generator=gen).to(torch.float8_e4m3fn)
    lane, element = np.arange(32)[:, None], np.arange(32)[None, :]
    kk = _k_of(lane, element)
    a_bytes = a.view(torch.uint8).numpy()[lane % 16, kk]
    b_bytes = b.view(torch.uint8).numpy()[lane % 16, kk]

    def setup(w):
        w.vgpr[0:8, :32] = np.ascontiguousarray(a_bytes).view("<u4").T
        w.vgpr[8:16, :32] = np.ascontiguousarray(b_bytes).view("<u4").T

    r = _gfx1250(["v_wmma_f32_16x16x64_fp8_fp8 v[24:31], v[0:7], v[8:15], 0"], setup=setup)
    regs = np.arange(8)[:, None]
    rows, cols = 8 * (np.arange(32) // 16)[None, :] + regs, np.arange(32)[None, :] % 16
    got = np.zeros((16, 16), np.float32)
    got[rows, np.broadcast_to(cols, rows.shape)] = r.waves[0].vgpr[24:32, :32].view(np.float32)
    want = (a.double() @ b.double().T).float().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


# --- VOPD, true16, VOPC ------------------------------------------------------------------------


def test_vopd_halves_read_their_sources_before_either_writes() -> None:
    """Rule: the Y half of a VOPD pair reads the registers as they were before X wrote."""

    def setup(w):
        w.vgpr[1], w.vgpr[2], w.vgpr[4] = 10, 20, 1

    r = _gfx1250(["v_dual_mov_b32 v1, v2 :: v_dual_add_nc_u32 v3, v1, v4"], setup=setup)
    g = r.waves[0].vgpr
    assert (g[1, :32] == 20).all() and (g[3, :32] == 11).all()


def test_vopd_cndmask_selects_by_vcc() -> None:
    """Rule: v_dual_cndmask_b32 selects by VCC_LO, which it does not name."""

    def setup(w):
        w.vgpr[1], w.vgpr[2] = 5, 6
        w.sgpr[106] = 0x0000FFFF  # lanes 0..15

    r = _gfx1250(["v_dual_cndmask_b32 v3, v1, v2 :: v_dual_mov_b32 v4, 0"], setup=setup)
    g = r.waves[0].vgpr
    assert g[3, :16].tolist() == [6] * 16 and g[3, 16:32].tolist() == [5] * 16


def test_a_wave32_lane_mask_operand_is_one_sgpr() -> None:
    """Rule: on wave32 the condition of v_cndmask_b32_e64 (and a carry-in) is one SGPR: s2
    selects, s3 is not read (a load of s3 still in flight is no hazard). The fp8 attention's
    combine kernel relies on it on gfx1250."""
    memory = Memory()
    base = memory.add(np.arange(4, dtype=U32), "data")

    def setup(w):
        w.vgpr[1], w.vgpr[2] = 5, 6
        w.sgpr[2] = 0x0000FFFF  # lanes 0..15
        w.sgpr[4], w.sgpr[5] = base & 0xFFFFFFFF, base >> 32

    lines = [
        "s_load_b32 s3, s[4:5], 0x0",
        "v_cndmask_b32_e64 v3, v1, v2, s2",
        "v_add_co_ci_u32_e64 v4, s6, v1, 0, s2",
        "s_wait_kmcnt 0x0",
    ]
    r = _gfx1250(lines, memory=memory, setup=setup)
    g = r.waves[0].vgpr
    assert g[3, :16].tolist() == [6] * 16 and g[3, 16:32].tolist() == [5] * 16
    assert g[4, :16].tolist() == [6] * 16 and g[4, 16:32].tolist() == [5] * 16


@pytest.mark.parametrize("table, fn", [(0x40, np.bitwise_and), (0x54, np.bitwise_or),
                                       (0x14, np.bitwise_xor)])  # fmt: skip
def test_bitop2_is_the_bitop3_table_with_its_third_input_zero(table, fn) -> None:
    """Rule: VOPD3's v_dual_bitop2_b32 computes bit (a << 2 | b << 1) of bitop3's table."""
    a, b = U32(0xF0F0A5A5), U32(0x0FF05A5A ^ 0x00FF00FF)

    def setup(w):
        w.vgpr[1], w.vgpr[2] = a, b

    r = _gfx1250([f"v_dual_mov_b32 v5, 0 :: v_dual_bitop2_b32 v3, v1, v2 bitop3:{table:#x}"],
                 setup=setup)  # fmt: skip
    assert int(r.waves[0].vgpr[3, 0]) == int(fn(a, b))


def test_true16_halves_keep_the_other_half() -> None:
    """Rule (true16): a 16-bit result written to v.l or v.h leaves the other half as it was;
    a .h source reads bits 31:16."""

    def setup(w):
        w.vgpr[1], w.vgpr[2] = 0x11112222, 0x33334444

    r = _gfx1250(["v_mov_b16_e32 v1.h, v2.l", "v_mov_b16_e32 v2.l, v2.h",
                  "v_add_nc_u16 v3.l, v2.l, 1"], setup=setup)  # fmt: skip
    g = r.waves[0].vgpr
    assert int(g[1, 0]) == 0x44442222 and int(g[2, 0]) == 0x33333333
    assert int(g[3, 0]) == 0x00003334


def test_gfx12_cmpx_writes_exec_only() -> None:
    """Rule: gfx12's v_cmpx has no SDST; its first operand is a source (s13 is not written)."""

    def setup(w):
        w.sgpr[13] = 16
        w.vgpr[1] = LANES

    r = _gfx1250(["v_cmpx_gt_u32_e32 s13, v1", "v_mov_b32_e32 v2, 1"], setup=setup)
    assert r.waves[0].sgpr[13] == 16 and r.waves[0].exec == 0xFFFF
    assert r.waves[0].vgpr[2, :32].tolist() == [1] * 16 + [0] * 16


# --- barrier and waits --------------------------------------------------------------------------


def test_split_barrier_orders_what_comes_before_the_signal() -> None:
    """Rule: a wave past s_barrier_wait sees every LDS write the other waves made before their
    s_barrier_signal."""

    def setup(w):
        w.vgpr[1] = 4 * w.index  # each wave's own dword
        w.vgpr[2] = 100 + w.index
        w.vgpr[3] = 4 * (1 - w.index)  # the other wave's

    lines = ["ds_store_b32 v1, v2", "s_wait_dscnt 0x0", "s_barrier_signal -1",
             "s_barrier_wait 0xffff", "ds_load_b32 v4, v3", "s_wait_dscnt 0x0"]  # fmt: skip
    for seed in range(4):
        r = _gfx1250(lines, waves=2, lds_bytes=8, setup=setup, seed=seed)
        assert [int(w.vgpr[4, 0]) for w in r.waves] == [101, 100]


def test_wait_counters_are_split_by_kind() -> None:
    """Rule: s_wait_dscnt does not retire a global load (loadcnt does)."""
    memory = Memory()
    data = np.arange(64, dtype=U32)
    base = memory.add(data, "data")

    def setup(w):
        w.sgpr[4], w.sgpr[5] = base & 0xFFFFFFFF, base >> 32
        w.vgpr[1] = 4 * LANES

    lines = ["global_load_b32 v2, v1, s[4:5]", "s_wait_dscnt 0x0", "v_mov_b32_e32 v3, v2"]
    with pytest.raises(MissingWait):
        _gfx1250(lines, memory=memory, setup=setup)
    lines[1] = "s_wait_loadcnt 0x0"
    r = _gfx1250(lines, memory=memory, setup=setup)
    assert r.waves[0].vgpr[3, :32].tolist() == list(range(32))


# --- memory ---------------------------------------------------------------------------------


def test_gfx1250_buffer_resource_and_its_range_check() -> None:
    """Rule: gfx1250's V# holds a 57-bit base and a 45-bit num_records from bit 57; a raw
    access past num_records reads 0."""
    memory = Memory()
    data = np.arange(1, 65, dtype=U32)
    base = memory.add(data, "data")

    def setup(w):
        buffer_descriptor_gfx1250(w, 8, base, 40 * 4)  # 40 dwords in range
        w.vgpr[1] = 4 * LANES

    r = _gfx1250(["buffer_load_b32 v2, v1, s[8:11], null offen", "s_wait_loadcnt 0x0"],
                 memory=memory, setup=setup)  # fmt: skip
    assert r.waves[0].vgpr[2, :32].tolist() == list(range(1, 33))
    r = _gfx1250(["buffer_load_b32 v2, v1, s[8:11], null offen offset:32",
                  "s_wait_loadcnt 0x0"], memory=memory, setup=setup)  # fmt: skip
    assert r.waves[0].vgpr[2, :32].tolist() == list(range(9, 41))  # dword 39 is the last
    r = _gfx1250(["buffer_load_b32 v2, v1, s[8:11], null offen offset:64",
                  "s_wait_loadcnt 0x0"], memory=memory, setup=setup)  # fmt: skip
    assert r.waves[0].vgpr[2, :32].tolist() == list(range(17, 41)) + [0] * 8


def test_scale_offset_counts_elements() -> None:
    """Rule (gfx1250): with scale_offset the offset register is in elements of the access."""
    memory = Memory()
    data = np.arange(100, 164, dtype=U32)
    base = memory.add(data, "data")

    def setup(w):
        w.sgpr[4], w.sgpr[5] = base & 0xFFFFFFFF, base >> 32
        w.sgpr[6] = 5
        w.vgpr[1] = LANES

    r = _gfx1250(["global_load_b32 v2, v1, s[4:5] scale_offset", "s_wait_loadcnt 0x0",
                  "s_load_b32 s7, s[4:5], s6 offset:0x0 scale_offset", "s_wait_kmcnt 0x0"],
                 memory=memory, setup=setup)  # fmt: skip
    assert r.waves[0].vgpr[2, :32].tolist() == list(range(100, 132))
    assert r.waves[0].sgpr[7] == 105


# --- cross-lane -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "control, source",
    [
        ("quad_perm:[1,0,3,2]", LANES ^ 1),
        ("row_xmask:4", LANES ^ 4),
        ("row_ror:8", LANES - LANES % 16 + (LANES % 16 + 8) % 16),
        ("row_share:3", LANES - LANES % 16 + 3),
    ],
)
def test_dpp_moves_within_rows_of_16(control: str, source: np.ndarray) -> None:
    def setup(w):
        w.vgpr[1] = LANES + 100

    line = f"v_mov_b32_dpp v2, v1 {control} row_mask:0xf bank_mask:0xf bound_ctrl:1"
    r = _gfx1250([line], setup=setup)
    assert r.waves[0].vgpr[2, :32].tolist() == (source[:32] + 100).tolist()


def test_dpp_compare_reads_its_first_source_across_lanes() -> None:
    """Rule: v_cmp_*_e64_dpp compares src0 of the lane the DPP control names with src1 of its
    own lane (what a butterfly's tie test compiles to)."""

    def setup(w):
        w.vgpr[1] = _f32(LANES // 2)  # lanes 2j and 2j + 1 hold j
        w.vgpr[2] = _f32(LANES)

    ctrl = "quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf bound_ctrl:1"
    r = _gfx1250([f"v_cmp_eq_f32_e64_dpp s4, v1, v1 {ctrl}",
                  f"v_cmp_gt_f32_e64_dpp s5, v2, v2 {ctrl}"], setup=setup)  # fmt: skip
    w = r.waves[0]
    assert int(w.sgpr[4]) == 0xFFFFFFFF  # the partner holds the same j
    assert int(w.sgpr[5]) == 0x55555555  # lane 2j compares its partner's 2j + 1 > 2j


def test_dpp_on_a_vop2_moves_only_its_first_source() -> None:
    """Rule: v_add_f32_dpp v5, v5, v5 adds the moved v5 to the unmoved v5 (a butterfly step)."""

    def setup(w):
        w.vgpr[5] = _f32(LANES)

    ctrl = "quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf bound_ctrl:1"
    r = _gfx1250([f"v_add_f32_dpp v5, v5, v5 {ctrl}"], setup=setup)
    got = r.waves[0].vgpr[5, :32].view(np.float32)
    assert got.tolist() == (LANES[:32] + (LANES[:32] ^ 1)).astype(np.float32).tolist()


def test_permlanex16_reads_the_other_row() -> None:
    """Rule: lane l reads lane sel(l % 16) of the other 16-lane row, sel from {S2, S1} nibbles."""

    def setup(w):
        w.vgpr[1] = LANES
        w.sgpr[7] = 0x76543210

    r = _gfx1250(["v_permlanex16_b32 v2, v1, s7, 0xfedcba98"], setup=setup)
    assert r.waves[0].vgpr[2, :32].tolist() == [16 + k for k in range(16)] + list(range(16))


def test_hardware_registers_read_back_and_no_cluster() -> None:
    """s_getreg of IB_STS2 (gfx1250's cluster fields) reads 0; s_setreg fields read back."""
    r = _gfx1250(["s_setreg_imm32_b32 hwreg(HW_REG_WAVE_MODE, 25, 1), 1",
                  "s_getreg_b32 s1, hwreg(HW_REG_WAVE_MODE, 25, 1)",
                  "s_getreg_b32 s2, hwreg(HW_REG_IB_STS2, 6, 4)"])  # fmt: skip
    assert r.waves[0].sgpr[1] == 1 and r.waves[0].sgpr[2] == 0


def test_true16_op_sel_printed_with_the_halves_selects_once() -> None:
    """llvm-objdump prints a true16 destination both as v2.h and as op_sel's last bit: the pair
    lands in the high half once, the low half kept."""

    def setup(w):
        w.vgpr[2] = 0x0000BEEF
        w.vgpr[5], w.vgpr[6] = _f32(np.full(64, 1.0)), _f32(np.full(64, -2.0))

    r = _gfx1250(["v_cvt_pk_fp8_f32 v2.h, v5, v6 op_sel:[0,0,1]"], setup=setup)
    # OCP e4m3: 1.0 = 0x38, -2.0 = 0xC0; S0 in the low byte of the pair
    assert int(r.waves[0].vgpr[2, 0]) == 0xC038BEEF
