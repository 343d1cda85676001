"""The decoder: llvm-objdump's text turned into operands and modifiers, and the loader's
refusals; pure text and bytes, no disassembler needed.
"""

from __future__ import annotations

import pytest

from aiter.emulator import CodeObjectError, load_code_object
from aiter.emulator.decode import EXEC, VCC, parse_disassembly
from aiter.emulator.ops.flow import waitcnt_counts
from tests.emulator.harness import program_text


def _one(line: str):
    (inst,) = parse_disassembly(program_text([line]), "gfx942").instructions
    return inst


def _shape(inst) -> list[tuple]:
    return [(o.kind, o.index, o.count) for o in inst.operands]


def test_buffer_operands_and_modifiers() -> None:
    inst = _one("buffer_load_dwordx4 v[24:27], v3, s[8:11], 0 offen offset:16 sc0 nt")
    assert _shape(inst) == [("v", 24, 4), ("v", 3, 1), ("s", 8, 4), ("imm", 0, 1)]
    assert inst.modifiers == {"offen": None, "offset": "16", "sc0": None, "nt": None}


def test_global_saddr_off_and_named_registers() -> None:
    inst = _one("global_store_dword v[2:3], v9, off offset:-4")
    assert [o.kind for o in inst.operands] == ["v", "v", "off"] and inst.mod_int("offset") == -4
    cmp = _one("v_cmp_gt_i32_e32 vcc, s14, v2")
    assert _shape(cmp)[0] == ("s", VCC, 2)
    assert _shape(_one("s_and_b64 exec, exec, vcc"))[:2] == [("s", EXEC, 2), ("s", EXEC, 2)]
    assert _shape(_one("s_mov_b32 m0, exec_hi")) == [("s", 124, 1), ("s", EXEC + 1, 1)]


def test_input_modifiers_and_float_constants() -> None:
    inst = _one("v_add_f32_e64 v0, -|v1|, 0.15915494 clamp")
    src = inst.operands[1]
    assert (src.kind, src.neg, src.abs) == ("v", True, True)
    assert inst.operands[2].kind == "float" and inst.operands[2].value == pytest.approx(0.15915494)
    assert inst.has("clamp")
    assert _one("s_mov_b32 s0, -1").operands[1].value == -1
    assert _one("v_mov_b32_e32 v11, 0x7ffffff0").operands[1].value == 0x7FFFFFF0


def test_packed_dpp_sdwa_and_mfma_modifiers() -> None:
    pk = _one("v_pk_mul_f32 v[0:1], v[2:3], v[4:5] op_sel_hi:[1,0] neg_lo:[0,1]")
    assert pk.modifiers == {"op_sel_hi": "[1,0]", "neg_lo": "[0,1]"}
    dpp = _one("v_mov_b32_dpp v0, v1 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf")
    assert dpp.modifiers["quad_perm"] == "[1,0,3,2]" and len(dpp.operands) == 2
    sdwa = _one("v_or_b32_sdwa v0, v1, v2 dst_sel:WORD_1 dst_unused:UNUSED_PAD src0_sel:BYTE_0")
    assert sdwa.modifiers["dst_sel"] == "WORD_1" and len(sdwa.operands) == 3
    mfma = _one("v_mfma_f32_16x16x16_bf16 a[0:3], v[20:21], v[56:57], 0 cbsz:1 abid:2 blgp:3")
    assert _shape(mfma)[0] == ("a", 0, 4) and mfma.mod_int("blgp") == 3


def test_branch_targets_are_absolute() -> None:
    """simm16 counts dwords from the next instruction: 0x1000 + 4 + 4 * -98."""
    inst = _one("s_cbranch_scc1 65438")
    assert inst.operands[0].kind == "label" and inst.operands[0].value == 0x1004 - 4 * 98


def test_waitcnt_counters_named_and_raw() -> None:
    named = waitcnt_counts(_one("s_waitcnt vmcnt(3) lgkmcnt(0)"))
    assert (named["vmcnt"], named["lgkmcnt"], named["expcnt"]) == (3, 0, 7)
    # gfx9 simm16: vmcnt = bits 3:0 and 15:14, expcnt 6:4, lgkmcnt 11:8.
    raw = waitcnt_counts(_one("s_waitcnt 0xc07f"))
    assert (raw["vmcnt"], raw["lgkmcnt"], raw["expcnt"]) == (63, 0, 7)


def test_loader_refuses_what_is_not_an_amdgpu_code_object() -> None:
    with pytest.raises(CodeObjectError, match="expected an ELF file"):
        load_code_object(b"not an elf at all" * 8)
