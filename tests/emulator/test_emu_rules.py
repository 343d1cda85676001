"""Hardware rules the emulator models, each tested on the instructions that implement it, with
the rule and its source stated; no code object or disassembler is needed.
"""

from __future__ import annotations

import numpy as np
import pytest

from aiter.emulator import DataRace, MemoryFault, MissingWait, UnsupportedInstruction
from aiter.emulator.memory import Memory
from aiter.emulator.ops.numeric import f32_to_bf16
from tests.emulator.harness import buffer_descriptor, run

LANE = np.arange(64, dtype=np.uint32)


def _lanes(wave, row: int, values) -> None:
    wave.vgpr[row] = np.asarray(values, np.uint32)


# --- buffer range checking -----------------------------------------------------------------


def test_buffer_load_past_num_records_reads_zero_per_dword() -> None:
    """Rule: a raw buffer (stride 0) access is range-checked per dword against num_records on
    the offset VGPR + instruction offset; out-of-range dwords of a load read 0 (CDNA3 ISA,
    "Buffer out-of-range checking"; LLVM AMDGPUUsage, "Relaxed Buffer OOB Mode": each 32-bit
    word of a wider access is checked independently)."""
    data = np.arange(1, 17, dtype=np.uint32)  # 64 bytes
    memory = Memory()
    base = memory.add(data, "data")

    def setup(w):
        buffer_descriptor(w, 4, base, 40)  # the first 10 dwords are in range
        _lanes(w, 0, np.full(64, 32))  # every lane reads dwords 8..11

    r = run(
        ["buffer_load_dwordx4 v[4:7], v0, s[4:7], 0 offen", "s_waitcnt vmcnt(0)", "s_endpgm"],
        memory,
        setup=setup,
    )
    got = r.waves[0].vgpr[4:8, 0]
    assert got.tolist() == [9, 10, 0, 0]


def test_buffer_offset_is_unsigned_so_a_huge_offset_reads_zero() -> None:
    """Rule: the checked offset is unsigned (AMDGPUUsage, "Relaxed Buffer OOB Mode"): FlyDSL and
    CK park masked lanes at offset 0x7ffffff0 / 0x80000000 to read zeros without a branch."""
    memory = Memory()
    base = memory.add(np.arange(4, dtype=np.uint32), "data")

    def setup(w):
        buffer_descriptor(w, 8, base, 16)
        _lanes(w, 1, np.where(LANE % 2 == 0, 4, 0x80000000))
        _lanes(w, 2, np.full(64, 77))

    r = run(["buffer_load_dword v2, v1, s[8:11], 0 offen", "s_waitcnt vmcnt(0)", "s_endpgm"],
            memory, setup=setup)  # fmt: skip
    got = r.waves[0].vgpr[2]
    assert got[0] == 1 and got[1] == 0 and set(got[::2]) == {1} and set(got[1::2]) == {0}


def test_buffer_store_past_num_records_is_dropped_per_dword() -> None:
    """Rule: out-of-range dwords of a store are not written (CDNA3 ISA, "Buffer out-of-range
    checking"); the in-range dwords of the same store are."""
    out = np.full(8, 0xAAAAAAAA, np.uint32)
    memory = Memory()
    base = memory.add(out, "out")

    def setup(w):
        buffer_descriptor(w, 4, base, 24)  # 6 dwords in range
        w.exec = 1  # lane 0 only
        _lanes(w, 0, np.full(64, 16))  # dwords 4..7
        for k in range(4):
            _lanes(w, 8 + k, np.full(64, 100 + k))

    run(["buffer_store_dwordx4 v[8:11], v0, s[4:7], 0 offen", "s_endpgm"], memory, setup=setup)
    assert out.tolist()[4:] == [100, 101, 0xAAAAAAAA, 0xAAAAAAAA]
    assert out.tolist()[:4] == [0xAAAAAAAA] * 4


def test_soffset_moves_the_address_but_not_the_checked_offset() -> None:
    """Rule: the SGPR offset is added to the address and left out of the range check (the
    check covers the VGPR offset and the instruction offset; AMDGPUUsage, "Relaxed Buffer OOB
    Mode" checks the voffset)."""
    memory = Memory()
    base = memory.add(np.arange(8, dtype=np.uint32), "data")

    def setup(w):
        buffer_descriptor(w, 4, base, 8)  # two dwords checked in range
        w.sgpr[12] = 16  # soffset: four dwords further
        _lanes(w, 0, np.full(64, 4))

    r = run(["buffer_load_dword v1, v0, s[4:7], s12 offen", "s_waitcnt vmcnt(0)", "s_endpgm"],
            memory, setup=setup)  # fmt: skip
    assert r.waves[0].vgpr[1, 0] == 5


# --- sub-dword and misaligned accesses --------------------------------------------------------


def test_sub_dword_stores_touch_only_their_bytes() -> None:
    """Rule: byte and short stores write 1 and 2 bytes and leave their neighbours (CDNA3 ISA,
    BUFFER_STORE_BYTE / BUFFER_STORE_SHORT / GLOBAL_STORE_SHORT; _d16_hi stores the high
    half of the VGPR)."""
    out = np.zeros(16, np.uint8) + 0xEE
    memory = Memory()
    base = memory.add(out, "out")

    def setup(w):
        w.exec = 1
        buffer_descriptor(w, 4, base, 16)
        _lanes(w, 0, np.full(64, 1))
        _lanes(w, 1, np.full(64, 0x11223344))
        w.sgpr[10], w.sgpr[11] = base & 0xFFFFFFFF, base >> 32
        _lanes(w, 2, np.full(64, 6))

    run(
        [
            "buffer_store_byte v1, v0, s[4:7], 0 offen",
            "global_store_short v2, v1, s[10:11] offset:4",
            "global_store_short_d16_hi v2, v1, s[10:11] offset:8",
            "s_endpgm",
        ],
        memory,
        setup=setup,
    )
    expected = [0xEE] * 16
    expected[1] = 0x44
    expected[10], expected[11] = 0x44, 0x33
    expected[14], expected[15] = 0x22, 0x11
    assert out.tolist() == expected


def test_d16_loads_keep_the_other_half_and_extend_as_named() -> None:
    """Rule: d16 loads write only the low (or, for _d16_hi, high) 16 bits of the VGPR;
    sbyte/sshort sign-extend, ubyte/ushort zero-extend (CDNA3 ISA, "16-bit Memory
    Operations")."""
    memory = Memory()
    base = memory.add(np.array([0x80, 0xFF, 0x34, 0x12], np.uint8), "data")

    def setup(w):
        buffer_descriptor(w, 4, base, 4)
        _lanes(w, 0, np.zeros(64))
        _lanes(w, 1, np.full(64, 0xAAAABBBB))
        _lanes(w, 2, np.full(64, 0xAAAABBBB))

    r = run(
        [
            "buffer_load_short_d16_hi v1, v0, s[4:7], 0 offen offset:2",
            "buffer_load_sbyte_d16 v2, v0, s[4:7], 0 offen",
            "buffer_load_sshort v3, v0, s[4:7], 0 offen",
            "buffer_load_ubyte v4, v0, s[4:7], 0 offen offset:1",
            "s_waitcnt vmcnt(0)",
            "s_endpgm",
        ],
        memory,
        setup=setup,
    )
    w = r.waves[0]
    assert hex(w.vgpr[1, 0]) == hex(0x1234BBBB)
    assert hex(w.vgpr[2, 0]) == hex(0xAAAAFF80)
    assert hex(w.vgpr[3, 0]) == hex(0xFFFFFF80)
    assert w.vgpr[4, 0] == 0xFF


def test_misaligned_dword_global_accesses_work() -> None:
    """Rule: global dword loads and stores need no 4-byte alignment on gfx9 (unaligned access
    mode, the ROCm default; FlyDSL kernels store fp32 at addresses that are not 4-aligned)."""
    buf = np.zeros(16, np.uint8)
    memory = Memory()
    base = memory.add(buf, "buf")

    def setup(w):
        w.exec = 1
        w.sgpr[4], w.sgpr[5] = base & 0xFFFFFFFF, base >> 32
        _lanes(w, 0, np.full(64, 3))
        _lanes(w, 1, np.full(64, 0xDEADBEEF))

    r = run(
        [
            "global_store_dword v0, v1, s[4:5]",
            "global_load_dword v2, v0, s[4:5]",
            "s_waitcnt vmcnt(0)",
            "s_endpgm",
        ],
        memory,
        setup=setup,
    )
    assert buf[3:7].tolist() == [0xEF, 0xBE, 0xAD, 0xDE]
    assert r.waves[0].vgpr[2, 0] == 0xDEADBEEF


def test_an_access_outside_every_region_names_the_address() -> None:
    memory = Memory()
    base = memory.add(np.zeros(4, np.uint32), "small")

    def setup(w):
        w.sgpr[4], w.sgpr[5] = base & 0xFFFFFFFF, base >> 32
        _lanes(w, 0, LANE * 4)  # lanes 4.. fall past the 16 bytes

    with pytest.raises(MemoryFault, match=rf"{base + 16:#x}.*'small'"):
        run(["global_load_dword v1, v0, s[4:5]", "s_endpgm"], memory, setup=setup)


# --- waits ------------------------------------------------------------------------------------


_LOAD_THEN_USE = ["buffer_load_dword v1, v0, s[4:7], 0 offen", "v_add_u32_e32 v2, v1, v1"]


def _load_setup(base):
    def setup(w):
        buffer_descriptor(w, 4, base, 4)
        _lanes(w, 0, np.zeros(64))
        _lanes(w, 1, np.full(64, 5))

    return setup


def test_a_load_lands_only_at_its_waitcnt() -> None:
    """Rule: a VMEM load's data reaches its VGPRs some time after issue; only an s_waitcnt
    vmcnt(N) that the load's completion satisfies guarantees it (CDNA3 ISA, "Data Dependency
    Resolution" / S_WAITCNT)."""
    memory = Memory()
    base = memory.add(np.array([21], np.uint32), "data")
    r = run(_LOAD_THEN_USE[:1] + ["s_waitcnt vmcnt(0)"] + _LOAD_THEN_USE[1:] + ["s_endpgm"],
            memory, setup=_load_setup(base))  # fmt: skip
    assert r.waves[0].vgpr[2, 0] == 42 and not r.hazards


def test_a_missing_wait_is_reported_and_reads_the_old_value() -> None:
    """The seeded fault: the same code without its s_waitcnt raises MissingWait naming both pcs;
    in lenient mode the read sees the register's old value (5), as hardware may."""
    memory = Memory()
    base = memory.add(np.array([21], np.uint32), "data")
    with pytest.raises(MissingWait, match=r"v1 is the destination of the load at pc 0x1000"):
        run(_LOAD_THEN_USE + ["s_endpgm"], memory, setup=_load_setup(base))
    r = run(_LOAD_THEN_USE + ["s_endpgm"], memory, setup=_load_setup(base), strict_waits=False)
    assert r.waves[0].vgpr[2, 0] == 10
    assert r.hazards[0].pc == 0x1004 and r.hazards[0].load_pc == 0x1000


def test_vmcnt_retires_loads_oldest_first() -> None:
    """Rule: vmcnt(N) waits until at most N vector memory operations are outstanding, and loads
    return in issue order (CDNA3 ISA, S_WAITCNT)."""
    memory = Memory()
    base = memory.add(np.array([7, 9], np.uint32), "data")

    def setup(w):
        buffer_descriptor(w, 4, base, 8)
        _lanes(w, 0, np.zeros(64))

    lines = [
        "buffer_load_dword v1, v0, s[4:7], 0 offen",
        "buffer_load_dword v2, v0, s[4:7], 0 offen offset:4",
        "s_waitcnt vmcnt(1)",
        "v_mov_b32_e32 v3, v1",
        "v_mov_b32_e32 v4, v2",
        "s_endpgm",
    ]
    with pytest.raises(MissingWait, match=r"v2 .*pc 0x1004"):
        run(lines, memory, setup=setup)
    lines.insert(4, "s_waitcnt vmcnt(0)")
    r = run(lines, memory, setup=setup)
    assert (r.waves[0].vgpr[3, 0], r.waves[0].vgpr[4, 0]) == (7, 9)


def test_scalar_loads_land_at_lgkmcnt() -> None:
    """Rule: s_load results land at s_waitcnt lgkmcnt (CDNA3 ISA, "Scalar Memory Operations")."""
    memory = Memory()
    base = memory.add(np.array([3, 4], np.uint32), "data")

    def setup(w):
        w.sgpr[0], w.sgpr[1] = base & 0xFFFFFFFF, base >> 32

    r = run(["s_load_dwordx2 s[2:3], s[0:1], 0x0", "s_waitcnt lgkmcnt(0)",
             "s_add_u32 s4, s2, s3", "s_endpgm"], memory, setup=setup)  # fmt: skip
    assert r.waves[0].sgpr[4] == 7
    with pytest.raises(MissingWait, match="s2"):
        run(["s_load_dwordx2 s[2:3], s[0:1], 0x0", "s_add_u32 s4, s2, s3", "s_endpgm"],
            memory, setup=setup)  # fmt: skip


# --- barriers and LDS -------------------------------------------------------------------------


def _exchange_setup(w) -> None:
    """Wave i writes lane + 100 * (i + 1) to its own 256-byte half of LDS, then reads the
    other wave's half."""
    _lanes(w, 0, LANE * 4 + 256 * w.index)
    _lanes(w, 1, LANE + 100 * (w.index + 1))
    _lanes(w, 3, LANE * 4 + 256 * (1 - w.index))


_EXCHANGE = [
    "ds_write_b32 v0, v1",
    "s_waitcnt lgkmcnt(0)",
    "s_barrier",
    "ds_read_b32 v2, v3",
    "s_waitcnt lgkmcnt(0)",
    "s_endpgm",
]


@pytest.mark.parametrize("seed", range(8))
def test_barrier_orders_lds_traffic_between_waves(seed: int) -> None:
    """Rule: s_barrier holds each wave until every wave of the work-group reaches it (CDNA3 ISA,
    S_BARRIER): each wave reads what the other wrote before the barrier, whatever order the
    seeded scheduler draws."""
    r = run(_EXCHANGE, waves=2, lds_bytes=512, setup=_exchange_setup, seed=seed)
    assert r.waves[0].vgpr[2].tolist() == (LANE + 200).tolist()
    assert r.waves[1].vgpr[2].tolist() == (LANE + 100).tolist()


def test_without_the_barrier_some_interleaving_reads_stale_lds() -> None:
    """The seeded fault: with the barrier removed, the scheduler finds an order in which a wave
    reads the other's half before it was written (the waves really interleave)."""
    broken = [line for line in _EXCHANGE if line != "s_barrier"]
    stale = 0
    for seed in range(16):
        r = run(broken, waves=2, lds_bytes=512, setup=_exchange_setup, seed=seed, races="collect")
        stale += r.waves[0].vgpr[2].tolist() != (LANE + 200).tolist()
        # The race report does not depend on whether this order exposed stale data.
        assert {(x.first[1], x.second[1]) for x in r.races} <= {(0, 1), (1, 0)} and r.races
    assert stale > 0


@pytest.mark.parametrize("seed", range(8))
def test_lds_race_is_reported_with_both_pcs_for_every_seed(seed: int) -> None:
    """Rule: LDS accesses of two waves to one byte, one a write, with no s_barrier between them
    are unordered (CDNA3 ISA, S_BARRIER is the only intra-group ordering of LDS traffic between
    waves): the race is raised in every interleaving, naming both pcs and waves and the byte."""
    broken = [line for line in _EXCHANGE if line != "s_barrier"]
    with pytest.raises(DataRace, match=r"LDS byte 0x[0-9a-f]+: ") as caught:
        run(broken, waves=2, lds_bytes=512, setup=_exchange_setup, seed=seed)
    message = str(caught.value).split("data race", 1)[1]
    assert "wave 0 pc" in message and "wave 1 pc" in message
    assert "pc 0x1000 (write)" in message and "pc 0x1008 (read)" in message


def test_lds_access_past_the_allocation_raises() -> None:
    def setup(w):
        _lanes(w, 0, LANE * 4)

    with pytest.raises(MemoryFault, match="LDS access of 4 bytes at 128"):
        run(["ds_write_b32 v0, v1", "s_endpgm"], lds_bytes=128, setup=setup)


def test_read2_offsets_are_in_elements_and_st64_in_64_elements() -> None:
    """Rule: ds_read2_b32 reads at addr + 4 * offset0 and addr + 4 * offset1; the st64 form
    scales the offsets by 64 elements (CDNA3 ISA, DS_READ2_B32 / DS_READ2ST64_B32)."""
    lines = [
        "ds_read2_b32 v[2:3], v0 offset0:1 offset1:3",
        "ds_read2st64_b32 v[4:5], v0 offset0:1 offset1:2",
        "s_waitcnt lgkmcnt(0)",
        "s_endpgm",
    ]
    words = np.arange(512, dtype=np.uint32)
    r = run(lines, lds_bytes=2048, lds_init=words.view(np.uint8))
    assert r.waves[0].vgpr[2:6, 0].tolist() == [1, 3, 64, 128]


# --- vector ALU -------------------------------------------------------------------------------


def test_vopc_writes_zero_for_inactive_lanes() -> None:
    """Rule: a VOPC compare writes 0 to the mask bit of every lane EXEC disables (CDNA3 ISA,
    "VOPC Instructions")."""

    def setup(w):
        w.exec = 0x0000_FFFF_0000_FFFF
        _lanes(w, 0, LANE)

    r = run(["v_cmp_gt_u32_e64 s[4:5], 100, v0", "s_endpgm"], setup=setup)
    assert r.waves[0].s64(4) == 0x0000_FFFF_0000_FFFF


def test_saveexec_branching_runs_only_the_selected_lanes() -> None:
    """Rule: s_and_saveexec_b64 saves EXEC and ANDs it with the condition; VALU writes only the
    enabled lanes (CDNA3 ISA, S_AND_SAVEEXEC_B64, "EXEC mask")."""

    def setup(w):
        _lanes(w, 0, LANE)
        _lanes(w, 1, np.zeros(64))

    r = run(
        [
            "v_cmp_gt_u32_e32 vcc, 10, v0",
            "s_and_saveexec_b64 s[4:5], vcc",
            "v_mov_b32_e32 v1, 7",
            "s_or_b64 exec, exec, s[4:5]",
            "s_endpgm",
        ],
        setup=setup,
    )
    w = r.waves[0]
    assert w.vgpr[1].tolist() == [7] * 10 + [0] * 54 and w.exec == (1 << 64) - 1


def test_f32_to_bf16_rounds_to_nearest_even() -> None:
    """Rule: f32 -> bf16 conversions (v_cvt_pk_bf16_f32 on gfx950) round to nearest even; NaN
    stays NaN (CDNA4 ISA, V_CVT_PK_BF16_F32). Checked against torch's conversion."""
    import torch

    values = torch.tensor(
        [1.0, 1.00390625, 1.01171875, -2.5, 3.4e38, float("inf"), 1e-40, 0.0], dtype=torch.float32
    )
    ours = f32_to_bf16(values.numpy())
    theirs = values.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
    assert ours.astype(np.uint16).tolist() == theirs.tolist()
    assert (f32_to_bf16(np.array([np.nan], np.float32))[0] & 0x7F80) == 0x7F80


def test_carry_chain_adds_64_bit_values() -> None:
    """Rule: v_add_co_u32 writes the carry of each lane to its SGPR-pair bit; v_addc_co_u32
    adds it in (CDNA3 ISA)."""

    def setup(w):
        _lanes(w, 0, np.full(64, 0xFFFFFFFF))
        _lanes(w, 1, np.full(64, 1))
        _lanes(w, 2, LANE)

    r = run(
        ["v_add_co_u32_e32 v3, vcc, v0, v1", "v_addc_co_u32_e32 v4, vcc, 0, v2, vcc", "s_endpgm"],
        setup=setup,
    )
    assert r.waves[0].vgpr[3].tolist() == [0] * 64
    assert r.waves[0].vgpr[4].tolist() == (LANE + 1).tolist()


def test_cache_maintenance_changes_nothing() -> None:
    """Rule: buffer_wbl2 and buffer_inv write back / invalidate caches and have no effect on
    any value a single-device run observes (CDNA3 ISA, BUFFER_WBL2, BUFFER_INV)."""
    r = run(["buffer_wbl2 sc1", "buffer_inv sc1", "s_endpgm"])
    assert r.waves[0].done


# --- refusals -----------------------------------------------------------------------------------


def test_an_unimplemented_instruction_names_mnemonic_kernel_and_pc() -> None:
    with pytest.raises(UnsupportedInstruction, match=r"test_kernel pc 0x1004: v_frobnicate_b32"):
        run(["s_nop 0", "v_frobnicate_b32 v0, v1", "s_endpgm"])


def test_an_unimplemented_modifier_is_refused() -> None:
    with pytest.raises(UnsupportedInstruction, match="modifier .*tfe"):
        run(["buffer_load_dword v1, v0, s[4:7], 0 offen tfe", "s_endpgm"])


def test_lds_writes_count_toward_lgkmcnt() -> None:
    """Rule: every LDS instruction, reads and writes alike, increments lgkmcnt until it completes
    (CDNA3 ISA, S_WAITCNT: LGKM_CNT counts LDS, GDS, constant and message operations). So
    lgkmcnt(1) after write, read, write retires the read; if writes were not counted, the read
    would still be in flight."""

    def setup(w):
        _lanes(w, 0, LANE * 4)
        _lanes(w, 1, LANE + 5)

    r = run(
        [
            "ds_write_b32 v0, v1",
            "ds_read_b32 v2, v0",
            "ds_write_b32 v0, v1 offset:256",
            "s_waitcnt lgkmcnt(1)",
            "v_mov_b32_e32 v3, v2",
            "s_endpgm",
        ],
        lds_bytes=512,
        setup=setup,
    )
    assert r.waves[0].vgpr[3].tolist() == (LANE + 5).tolist()
