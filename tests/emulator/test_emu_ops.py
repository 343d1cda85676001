"""The rest of the default cache's instructions, each rule on the instruction that implements it:
f32 division sequence, SDWA, IEEE maximum3, cross-lane moves, and global atomics.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiter.emulator.memory import Memory
from tests.emulator.harness import run

LANE = np.arange(64, dtype=np.uint32)
_L = np.arange(64)


def _f32(values) -> np.ndarray:
    return np.asarray(values, np.float32).view(np.uint32)


# --- division -----------------------------------------------------------------------------

# The sequence LLVM 22 emits for an IEEE f32 a / b (copied from flash_attn_fp8_combine's code
# object in the default cache; numerator moved from s4 to v20).
FDIV = [
    "v_div_scale_f32 v1, s[8:9], v0, v0, v20",
    "v_rcp_f32_e32 v5, v1",
    "v_div_scale_f32 v9, vcc, v20, v0, v20",
    "v_fma_f32 v11, -v1, v5, 1.0",
    "v_fmac_f32_e32 v5, v11, v5",
    "v_mul_f32_e32 v11, v9, v5",
    "v_fma_f32 v12, -v1, v11, v9",
    "v_fmac_f32_e32 v11, v12, v5",
    "v_fma_f32 v1, -v1, v11, v9",
    "v_div_fmas_f32 v1, v1, v5, v11",
    "v_div_fixup_f32 v1, v1, v0, v20",
    "s_endpgm",
]


def test_llvm_fdiv_sequence_is_ieee_division() -> None:
    """Rule: v_div_scale/v_div_fmas/v_div_fixup (CDNA3 ISA pseudocode; the fmas post-scale as
    ROCm/rocm-systems#11613 checked on hardware) make LLVM's fdiv sequence correctly rounded:
    bit-equal to numpy's float32 division, on results that overflow, underflow to subnormals,
    quotients whose exponents differ by >= 96, subnormal operands, zeros, infs and NaNs."""
    rng = np.random.default_rng(0)
    tricky = [
        (1.0, 3.0), (2.0**100, 2.0**-20), (3e38, 1e-3), (2.0**-120, 2.0**10),
        (1e-40, 3.0), (7.0, 1e-40), (1e-45, 1e-45), (2.0**-126, 3.0), (1e-38, 1e30),
        (0.0, 5.0), (5.0, 0.0), (-5.0, 0.0), (0.0, 0.0), (np.inf, np.inf), (np.inf, 2.0),
        (2.0, np.inf), (np.nan, 1.0), (1.0, np.nan), (-0.0, 3.0), (3.4e38, 0.5),
        (1.17549435e-38, 0.99999994), (-6.0, 7e-39),
    ]  # fmt: skip
    num = np.array([t[0] for t in tricky] + list(rng.standard_normal(64 - len(tricky)) * 1e3))
    den = np.array([t[1] for t in tricky] + list(rng.standard_normal(64 - len(tricky))))
    num, den = num.astype(np.float32), den.astype(np.float32)

    def setup(w):
        w.vgpr[0], w.vgpr[20] = _f32(den), _f32(num)

    got = run(FDIV, setup=setup).waves[0].vgpr[1].view(np.float32)
    with np.errstate(all="ignore"):
        ref = num / den
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert got[ok].view(np.uint32).tolist() == ref[ok].view(np.uint32).tolist()


# --- SDWA, maximum3 -------------------------------------------------------------------------


def test_sdwa_selects_extends_and_places() -> None:
    """Rule: SDWA sources are the selected byte/word, zero-extended or sign-extended with sext;
    the result goes to dst_sel's field, UNUSED_PAD zeroing the rest, UNUSED_PRESERVE keeping it
    (CDNA3 ISA, "SDWA")."""

    def setup(w):
        w.vgpr[1] = 0x80F17F03
        w.vgpr[2] = 4
        w.vgpr[5] = 0x11223344
        w.sgpr[10] = 3

    r = run([
        "v_lshrrev_b32_sdwa v3, v2, v1 dst_sel:BYTE_1 dst_unused:UNUSED_PAD src0_sel:DWORD "
        "src1_sel:DWORD",
        "v_add_u16_sdwa v4, v1, v2 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:BYTE_1 "
        "src1_sel:DWORD",
        "v_or_b32_sdwa v5, v1, v2 dst_sel:WORD_1 dst_unused:UNUSED_PRESERVE src0_sel:BYTE_3 "
        "src1_sel:DWORD",
        "v_mul_i32_i24_sdwa v6, sext(v1), v2 dst_sel:DWORD dst_unused:UNUSED_PAD "
        "src0_sel:BYTE_3 src1_sel:DWORD",
        "v_cmp_lt_i32_sdwa s[12:13], sext(v1), s10 src0_sel:BYTE_2 src1_sel:DWORD",
        "s_endpgm",
    ], setup=setup)  # fmt: skip
    g = r.waves[0].vgpr
    assert int(g[3, 0]) == ((0x80F17F03 >> 4) & 0xFF) << 8
    assert int(g[4, 0]) == 0x7F + 4
    assert int(g[5, 0]) == (0x80 | 4) << 16 | 0x3344
    assert int(g[6, 0]) == (-128 * 4) & 0xFFFFFFFF
    assert r.waves[0].s64(12) == (1 << 64) - 1  # sext(0xF1) = -15 < 3 on every lane


def test_maximum3_propagates_nan_and_orders_zeros() -> None:
    """Rule (gfx950): V_MAXIMUM3_F32 / V_MINIMUM3_F32 are IEEE 754-2019 maximum/minimum: any NaN
    operand gives NaN, and -0 < +0 (CDNA4 ISA); v_max3_f32 instead returns the non-NaN one."""
    a = np.array([1.0, np.nan, -0.0, 2.0] * 16, np.float32)
    b = np.array([5.0, 3.0, 0.0, np.nan] * 16, np.float32)
    c = np.array([2.0, 1.0, -0.0, 1.0] * 16, np.float32)

    def setup(w):
        w.vgpr[1], w.vgpr[2], w.vgpr[3] = _f32(a), _f32(b), _f32(c)

    r = run(["v_maximum3_f32 v4, v1, v2, v3", "v_minimum3_f32 v5, v1, v2, v3",
             "v_max3_f32 v6, v1, v2, v3", "s_endpgm"], setup=setup, arch="gfx950")  # fmt: skip
    g = r.waves[0].vgpr
    mx, mn, old = g[4].view(np.float32), g[5].view(np.float32), g[6].view(np.float32)
    assert mx[0] == 5.0 and np.isnan(mx[1]) and np.isnan(mx[3])
    assert mx[2] == 0 and not np.signbit(mx[2]) and np.signbit(mn[2])
    assert mn[0] == 1.0 and np.isnan(mn[1]) and old[1] == 3.0


# --- cross-lane -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, source",
    [
        ("swizzle(SWAP,16)", _L ^ 16),
        ("swizzle(REVERSE,8)", _L ^ 7),
        ("swizzle(QUAD_PERM,3,2,1,0)", (_L & ~3) | (3 - (_L & 3))),
        ("swizzle(BROADCAST,8,5)", (_L & ~7) | 5),
        ('swizzle(BITMASK_PERM,"01pi0")', (_L & 32) | 8 | (_L & 4) | (~_L & 2)),
        ("0x041f", (_L & 32) | ((_L & 31) ^ 1)),
    ],
)
def test_ds_swizzle_offset_modes(pattern: str, source: np.ndarray) -> None:
    """Rule: ds_swizzle_b32 offset[15] = 1 is quad-permute mode (lane 4q + j reads 4q +
    offset[2j+1:2j]); offset[15] = 0 is bitmask mode within 32 lanes: source = ((lane &
    offset[4:0]) | offset[9:5]) ^ offset[14:10] (CDNA3 ISA DS_SWIZZLE_B32; LLVM
    AMDGPUModifierSyntax "swizzle pattern" for the macros). Data lands at lgkmcnt."""

    def setup(w):
        w.vgpr[1] = LANE * 10

    r = run([f"ds_swizzle_b32 v2, v1 offset:{pattern}", "s_waitcnt lgkmcnt(0)", "s_endpgm"],
            setup=setup)  # fmt: skip
    assert r.waves[0].vgpr[2].tolist() == (source * 10).tolist()


def test_bpermute_and_permute_with_inactive_lanes() -> None:
    """Rule: ds_bpermute_b32 lane i reads lane ((addr + offset) / 4) % 64, 0 when that lane is
    inactive; ds_permute_b32 active lane i writes lane ((addr + offset) / 4) % 64, unwritten
    lanes get 0 (CDNA3 ISA pseudocode)."""

    def setup(w):
        w.vgpr[1] = ((63 - LANE) * 4).astype(np.uint32)
        w.vgpr[2] = LANE + 100
        w.exec = (1 << 64) - 1 - 1  # lane 0 off

    r = run(["ds_bpermute_b32 v3, v1, v2 offset:4", "ds_permute_b32 v4, v1, v2",
             "s_waitcnt lgkmcnt(0)", "s_endpgm"], setup=setup)  # fmt: skip
    bperm, perm = r.waves[0].vgpr[3], r.waves[0].vgpr[4]
    src = (64 - LANE) % 64
    expect = np.where(src == 0, 0, src + 100)
    assert bperm[1:].tolist() == expect[1:].tolist() and bperm[0] == 0  # lane 0 kept
    assert perm[1:63].tolist() == (163 - LANE[1:63]).tolist() and perm[63] == 0


def test_permlane_swaps() -> None:
    """Rule (gfx950): v_permlane16_swap_b32 swaps VDST lanes 16-31/48-63 with SRC0 lanes
    0-15/32-47; v_permlane32_swap_b32 swaps VDST lanes 32-63 with SRC0 lanes 0-31 (CDNA4 ISA
    pseudocode)."""

    def setup(w):
        for row in (1, 3):
            w.vgpr[row] = LANE + 1000
        for row in (2, 4):
            w.vgpr[row] = LANE + 2000

    r = run(["v_permlane16_swap_b32_e32 v1, v2", "v_permlane32_swap_b32_e32 v3, v4",
             "s_endpgm"], setup=setup, arch="gfx950")  # fmt: skip
    g = r.waves[0].vgpr
    high16 = (LANE // 16) % 2 == 1
    assert g[1].tolist() == np.where(high16, LANE - 16 + 2000, LANE + 1000).tolist()
    assert g[2].tolist() == np.where(~high16, LANE + 16 + 1000, LANE + 2000).tolist()
    assert g[3].tolist() == np.where(LANE >= 32, LANE - 32 + 2000, LANE + 1000).tolist()
    assert g[4].tolist() == np.where(LANE < 32, LANE + 32 + 1000, LANE + 2000).tolist()


# --- atomics --------------------------------------------------------------------------------


def _pair(w, row: int, address: np.ndarray) -> None:
    w.vgpr[row] = (address & 0xFFFFFFFF).astype(np.uint32)
    w.vgpr[row + 1] = (address >> 32).astype(np.uint32)


def test_atomic_add_f32_applies_every_lane_on_shared_addresses() -> None:
    """Rule: an atomic applies each lane's update in full (CDNA3 ISA, "Global Atomic
    Instructions"): 64 lanes adding to 4 addresses leave the sum of 16 lanes in each."""
    out = np.zeros(4, np.float32)
    memory = Memory()
    base = memory.add(out, "out")

    def setup(w):
        _pair(w, 2, base + 4 * (LANE.astype(np.uint64) % 4))
        w.vgpr[4] = _f32(LANE.astype(np.float32) * 0.5)

    run(["global_atomic_add_f32 v[2:3], v4, off", "s_endpgm"], memory, setup=setup)
    assert out.tolist() == [sum(0.5 * lane for lane in range(j, 64, 4)) for j in range(4)]


def test_atomic_x2_add_and_swap_return_old_values() -> None:
    """Rule: global_atomic_add_x2 adds u64 (wrapping) and with sc0 returns the pre-op value at
    vmcnt; global_atomic_swap_x2 stores the data (CDNA3 ISA; gfx940 sc0 = return)."""
    data = np.array([2**64 - 1, 7], np.uint64)
    memory = Memory()
    base = memory.add(data, "sem")

    def setup(w):
        w.exec = 1
        w.vgpr[2] = 0
        w.vgpr[4], w.vgpr[5] = 2, 0
        w.vgpr[6], w.vgpr[7] = 0x1234, 0x5678
        w.vgpr[8] = 8
        w.sgpr[10], w.sgpr[11] = base & 0xFFFFFFFF, base >> 32

    r = run(["global_atomic_add_x2 v[0:1], v2, v[4:5], s[10:11] sc0",
             "global_atomic_swap_x2 v8, v[6:7], s[10:11]", "s_waitcnt vmcnt(0)", "s_endpgm"],
            memory, setup=setup)  # fmt: skip
    assert data.tolist() == [1, 0x5678_0000_1234]
    assert int(r.waves[0].vgpr[0, 0]) == 0xFFFFFFFF and int(r.waves[0].vgpr[1, 0]) == 0xFFFFFFFF


def test_atomic_pk_add_bf16_rounds_each_half_to_nearest_even() -> None:
    """Rule: global_atomic_pk_add_bf16 adds each bf16 half separately with round to nearest even
    (CDNA3 ISA pseudocode, dst[31:16].bf16 = tmp[31:16].bf16 + src[31:16].bf16): checked
    against torch's bf16 addition, which rounds once to nearest even."""
    rng = np.random.default_rng(3)
    old = torch.from_numpy(rng.standard_normal(128).astype(np.float32)).bfloat16()
    add = torch.from_numpy((rng.standard_normal(128) * 1e-2).astype(np.float32)).bfloat16()
    add[0], old[0] = torch.tensor(2.0**-8).bfloat16(), torch.tensor(1.0).bfloat16()  # a tie
    mem = old.clone()
    memory = Memory()
    base = memory.add(mem.view(torch.uint8).numpy(), "acc")

    def setup(w):
        _pair(w, 2, base + 4 * LANE.astype(np.uint64))
        w.vgpr[4] = add.view(torch.int32).numpy().view(np.uint32)

    run(["global_atomic_pk_add_bf16 v[2:3], v4, off", "s_endpgm"], memory, setup=setup)
    assert torch.equal(mem.view(torch.int16), (old + add).view(torch.int16))


def test_atomic_pk_add_f16_rounds_each_half_to_nearest_even() -> None:
    """Rule: global_atomic_pk_add_f16 adds each f16 half separately, rounded to nearest even
    (CDNA3 ISA, "Global Atomic Instructions"): checked against torch's f16 addition, which
    rounds once to nearest even, with a tie and an overflow to infinity among the lanes."""
    rng = np.random.default_rng(4)
    old = torch.from_numpy(rng.standard_normal(128).astype(np.float32)).half()
    add = torch.from_numpy((rng.standard_normal(128) * 1e-2).astype(np.float32)).half()
    old[0], add[0] = 1.0, 2.0**-11  # exactly half an ulp of 1.0: stays 1.0
    old[1], add[1] = 65504.0, 32.0  # the largest f16 plus half its ulp: infinity
    mem = old.clone()
    memory = Memory()
    base = memory.add(mem.view(torch.uint8).numpy(), "acc")

    def setup(w):
        _pair(w, 2, base + 4 * LANE.astype(np.uint64))
        w.vgpr[4] = add.view(torch.int32).numpy().view(np.uint32)

    run(["global_atomic_pk_add_f16 v[2:3], v4, off", "s_endpgm"], memory, setup=setup)
    assert torch.equal(mem.view(torch.int16), (old + add).view(torch.int16))
    assert mem[0].item() == 1.0 and mem[1].item() == float("inf")


def test_fma_mix_f32_mixes_f16_halves_and_f32_sources() -> None:
    """Rule: v_fma_mix_f32 computes S0 * S1 + S2 in f32 with one rounding, source k an f16
    (its high half when op_sel[k], else low) where op_sel_hi[k] is set, else an f32; a source's
    neg and abs print on the operand, as llvm-objdump writes them (CDNA3 ISA, VOP3P "mix")."""
    rng = np.random.default_rng(5)
    halves = rng.standard_normal((2, 64)).astype(np.float16)
    f32 = rng.standard_normal((2, 64)).astype(np.float32)

    def setup(w):
        packed = halves[0].view(np.uint16).astype(np.uint32)
        w.vgpr[1] = packed | (halves[1].view(np.uint16).astype(np.uint32) << 16)
        w.vgpr[2] = f32[0].view(np.uint32)
        w.vgpr[3] = f32[1].view(np.uint32)

    # D = -(hi half of v1) * v2 + |v3|, then D = (lo half of v1) * (hi half of v1) + v3
    r = run(["v_fma_mix_f32 v4, -v1, v2, |v3| op_sel:[1,0,0] op_sel_hi:[1,0,0]",
             "v_fma_mix_f32 v5, v1, v1, v3 op_sel:[0,1,0] op_sel_hi:[1,1,0]", "s_endpgm"],
            Memory(), setup=setup)  # fmt: skip
    h0, h1 = halves[0].astype(np.float64), halves[1].astype(np.float64)
    want4 = (-h1 * f32[0].astype(np.float64) + np.abs(f32[1].astype(np.float64))).astype(np.float32)
    want5 = (h0 * h1 + f32[1].astype(np.float64)).astype(np.float32)
    assert np.array_equal(r.waves[0].vgpr[4].view(np.float32), want4)
    assert np.array_equal(r.waves[0].vgpr[5].view(np.float32), want5)


def test_fma_mixlo_mixhi_round_to_one_half_and_keep_the_other() -> None:
    """Rule: v_fma_mixlo_f16 / v_fma_mixhi_f16 round the mix sum to f16 into D's low / high
    half and keep the other half; neg(0) is a negated inline constant, an f32 -0.0 when
    op_sel_hi is clear (CDNA3 ISA, VOP3P "mix")."""
    rng = np.random.default_rng(6)
    halves = rng.standard_normal((2, 64)).astype(np.float16)
    f32 = rng.standard_normal((2, 64)).astype(np.float32)

    def setup(w):
        packed = halves[0].view(np.uint16).astype(np.uint32)
        w.vgpr[1] = packed | (halves[1].view(np.uint16).astype(np.uint32) << 16)
        w.vgpr[2] = f32[0].view(np.uint32)
        w.vgpr[3] = f32[1].view(np.uint32)
        w.vgpr[4] = 0xABCD1234
        w.vgpr[5] = 0xABCD1234

    r = run(["v_fma_mixlo_f16 v4, v1, -v1, v3 op_sel:[0,1,0] op_sel_hi:[1,1,0]",
             "v_fma_mixhi_f16 v5, v2, v3, neg(0)", "s_endpgm"], Memory(), setup=setup)  # fmt: skip
    h0, h1 = halves[0].astype(np.float64), halves[1].astype(np.float64)
    lo = (h0 * -h1 + f32[1].astype(np.float64)).astype(np.float16).view(np.uint16)
    hi = (f32[0].astype(np.float64) * f32[1].astype(np.float64)).astype(np.float16)
    v4, v5 = r.waves[0].vgpr[4], r.waves[0].vgpr[5]
    assert np.array_equal(v4 & 0xFFFF, lo) and np.all(v4 >> 16 == 0xABCD)
    assert np.array_equal(v5 >> 16, hi.view(np.uint16)) and np.all(v5 & 0xFFFF == 0x1234)


def test_atomic_cmpswap_writes_only_on_match() -> None:
    """Rule: global_atomic_cmpswap stores DATA[31:0] when memory equals DATA[63:32] and returns
    the old value with sc0 (CDNA3 ISA pseudocode)."""
    data = np.array([5, 6], np.uint32)
    memory = Memory()
    base = memory.add(data, "data")

    def setup(w):
        w.exec = 3
        _pair(w, 2, base + 4 * LANE.astype(np.uint64))
        w.vgpr[4] = 100 + LANE
        w.vgpr[5] = 5

    r = run(["global_atomic_cmpswap v0, v[2:3], v[4:5], off sc0", "s_waitcnt vmcnt(0)",
             "s_endpgm"], memory, setup=setup)  # fmt: skip
    assert data.tolist() == [100, 6] and r.waves[0].vgpr[0, :2].tolist() == [5, 6]


def test_lds_bank_conflicts_follow_the_banks_of_the_arch() -> None:
    """Model: 4-byte banks, 32 on gfx942 and 64 on gfx950 (CDNA3/CDNA4 ISA, "Local Data
    Share"); lanes reading one dword share it; distinct dwords on one bank serialize."""
    from aiter.emulator.banks import banks_of, conflict_cycles

    lanes = np.arange(64, dtype=np.int64)
    assert conflict_cycles(4 * lanes, 4, banks_of("gfx942")) == (2, 0)  # consecutive dwords
    assert conflict_cycles(np.zeros(64, np.int64), 4, 32) == (2, 0)  # one dword: a broadcast
    # a column of a 32-dword-wide row-major tile: every lane on bank 0 of 32
    assert conflict_cycles(128 * lanes, 4, banks_of("gfx942")) == (2, 62)
    # on 64 banks the same column lands on banks 0 and 32: 32 lanes on each, one phase
    assert conflict_cycles(128 * lanes, 4, banks_of("gfx950")) == (1, 31)
    # b128 reads of consecutive 16-byte rows fill the banks: 8 lanes per phase on 32 banks
    assert conflict_cycles(16 * lanes, 16, 32) == (8, 0)
