"""gfx12 (gfx1250) semantics: the mnemonics gfx12 renamed, bound to the gfx9 semantics they
share, and the operations gfx9 has no counterpart for (64-bit VALU and SALU arithmetic, the
SALU float ops, the split wait counters, true16 moves, VOPD dual issue, DPP row operations,
v_permlanex16).

Sources: the RDNA4 / gfx12 ISA reference and LLVM's AMDGPU documentation for gfx12 (renames:
"AMDGPUAsmGFX12"); where gfx1250 differs, LLVM's disassembly of this project's own cache.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.ops import atomic, lds, scalar, smem, vector, vmem  # noqa: F401  (renamed here)
from aiter.emulator.ops.numeric import source, split, typed
from aiter.emulator.ops.registry import OPS, Ctx, Op, op
from aiter.emulator.ops.scalar import saveexec
from aiter.emulator.ops.smem import _s_load
from aiter.emulator.ops.vector import ieee_maximum, ieee_minimum, valu
from aiter.emulator.state import LANES, MASK32, MASK64, Wave, mask_to_bits

U32, U64 = np.uint32, np.uint64
# gfx12's cache policy and scope (th:, scope:), the scalar load's nv bit: no effect on a result.
_GFX12_MEMORY = ("th", "scope", "nv")
_SCALED = ("scale_offset",)  # gfx1250: the offset register counts elements, not bytes

# gfx12 name -> the gfx9 mnemonic with the same semantics.
RENAMED = {
    # scalar memory
    "s_load_b32": "s_load_dword", "s_load_b64": "s_load_dwordx2",
    "s_load_b128": "s_load_dwordx4", "s_load_b256": "s_load_dwordx8",
    "s_load_b512": "s_load_dwordx16",
    # buffer
    "buffer_load_b32": "buffer_load_dword", "buffer_load_b64": "buffer_load_dwordx2",
    "buffer_load_b96": "buffer_load_dwordx3", "buffer_load_b128": "buffer_load_dwordx4",
    "buffer_load_u16": "buffer_load_ushort", "buffer_load_i16": "buffer_load_sshort",
    "buffer_load_u8": "buffer_load_ubyte", "buffer_load_i8": "buffer_load_sbyte",
    "buffer_store_b32": "buffer_store_dword", "buffer_store_b64": "buffer_store_dwordx2",
    "buffer_store_b96": "buffer_store_dwordx3", "buffer_store_b128": "buffer_store_dwordx4",
    "buffer_store_b16": "buffer_store_short", "buffer_store_b8": "buffer_store_byte",
    # global
    "global_load_b32": "global_load_dword", "global_load_b64": "global_load_dwordx2",
    "global_load_b96": "global_load_dwordx3", "global_load_b128": "global_load_dwordx4",
    "global_load_u16": "global_load_ushort", "global_load_i16": "global_load_sshort",
    "global_load_u8": "global_load_ubyte", "global_load_i8": "global_load_sbyte",
    "global_store_b32": "global_store_dword", "global_store_b64": "global_store_dwordx2",
    "global_store_b96": "global_store_dwordx3", "global_store_b128": "global_store_dwordx4",
    "global_store_b16": "global_store_short", "global_store_b8": "global_store_byte",
    "global_store_d16_hi_b16": "global_store_short_d16_hi",
    "global_atomic_add_u64": "global_atomic_add_x2", "global_atomic_swap_b64": "global_atomic_swap_x2",
    "global_atomic_add_u32": "global_atomic_add", "global_atomic_swap_b32": "global_atomic_swap",
    "global_atomic_add_f32": "global_atomic_add_f32",
    # LDS
    "ds_load_b32": "ds_read_b32", "ds_load_b64": "ds_read_b64", "ds_load_b96": "ds_read_b96",
    "ds_load_b128": "ds_read_b128", "ds_load_u16": "ds_read_u16", "ds_load_u8": "ds_read_u8",
    "ds_load_2addr_b32": "ds_read2_b32", "ds_load_2addr_b64": "ds_read2_b64",
    "ds_load_2addr_stride64_b32": "ds_read2st64_b32",
    "ds_load_2addr_stride64_b64": "ds_read2st64_b64",
    "ds_store_b8": "ds_write_b8", "ds_store_b16": "ds_write_b16", "ds_store_b32": "ds_write_b32",
    "ds_store_b64": "ds_write_b64", "ds_store_b96": "ds_write_b96",
    "ds_store_b128": "ds_write_b128", "ds_store_b16_d16_hi": "ds_write_b16_d16_hi",
    "ds_store_2addr_b32": "ds_write2_b32", "ds_store_2addr_b64": "ds_write2_b64",
    "ds_store_2addr_stride64_b32": "ds_write2st64_b32",
    "ds_store_2addr_stride64_b64": "ds_write2st64_b64",
    # SALU
    "s_add_co_i32": "s_add_i32", "s_sub_co_i32": "s_sub_i32", "s_add_co_u32": "s_add_u32",
    "s_sub_co_u32": "s_sub_u32", "s_add_co_ci_u32": "s_addc_u32",
    "s_sub_co_ci_u32": "s_subb_u32", "s_addk_co_i32": "s_addk_i32",
    "s_and_not1_b32": "s_andn2_b32", "s_and_not1_b64": "s_andn2_b64",
    "s_or_not1_b32": "s_orn2_b32", "s_or_not1_b64": "s_orn2_b64",
    # VALU
    "v_add_nc_u32": "v_add_u32", "v_sub_nc_u32": "v_sub_u32", "v_subrev_nc_u32": "v_subrev_u32",
    "v_add_co_ci_u32": "v_addc_co_u32", "v_sub_co_ci_u32": "v_subb_co_u32",
    "v_subrev_co_ci_u32": "v_subbrev_co_u32",
}  # fmt: skip

for _new, _old in RENAMED.items():
    _found = OPS[_old]
    _extra = _GFX12_MEMORY if _new.startswith(("s_load", "buffer_", "global_", "ds_")) else ()
    _extra += _SCALED if _new.startswith("s_load") else ()
    OPS[_new] = Op(_found.fn, _found.modifiers | frozenset(_extra))

op("s_load_b96", mods=_GFX12_MEMORY + _SCALED)(_s_load(3))
# Atomics gfx12 kept the gfx9 names of take its cache policy and scope too.
for _name, _found in list(OPS.items()):
    if _name.startswith("global_atomic_"):
        OPS[_name] = Op(_found.fn, _found.modifiers | frozenset(_GFX12_MEMORY))


# --- no effect on results: hints, cache maintenance, the waits with nothing to wait for ------


def _nothing(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """Scheduling hints, prefetches and cache maintenance."""


# s_wait_xcnt waits until the address registers of memory instructions in flight may be
# overwritten; the emulator reads addresses at issue, so it has nothing to wait for.
op("s_delay_alu", "s_clause", "s_code_end", "v_nop", "s_wait_xcnt", "s_wait_alu")(_nothing)
op("s_sendmsg")(_nothing)  # MSG_DEALLOC_VGPRS before s_endpgm
# s_set_vgpr_msb selects VGPRs 256..1023 for the operands that follow; llvm-objdump applies it
# to the registers it prints (decode.py reads the real ones), so executing it changes nothing.
op("s_set_vgpr_msb")(_nothing)
op("global_prefetch_b8", "global_inv", "global_wb", mods=("offset", *_GFX12_MEMORY))(_nothing)


# --- the split wait counters --------------------------------------------------------------


def _wait(*counters: str):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        value = int(i.operands[0].value)
        if len(counters) == 1:
            w.retire(counters[0], value)
        else:
            # s_wait_loadcnt_dscnt / s_wait_storecnt_dscnt: the first count in bits 13:8, dscnt
            # in bits 5:0 (gfx12 ISA, SOPP).
            w.retire(counters[0], (value >> 8) & 0x3F)
            w.retire(counters[1], value & 0x3F)

    return run


op("s_wait_loadcnt")(_wait("load"))
op("s_wait_storecnt")(_wait("store"))
op("s_wait_dscnt")(_wait("ds"))
op("s_wait_kmcnt")(_wait("km"))
op("s_wait_loadcnt_dscnt")(_wait("load", "ds"))
op("s_wait_storecnt_dscnt")(_wait("store", "ds"))


# --- SALU -----------------------------------------------------------------------------------


op("s_and_saveexec_b32")(saveexec(lambda s, e: s & e, 1))
op("s_or_saveexec_b32")(saveexec(lambda s, e: s | e, 1))
op("s_xor_saveexec_b32")(saveexec(lambda s, e: s ^ e, 1))
op("s_and_not1_saveexec_b32")(saveexec(lambda s, e: s & ~e, 1))
op("s_and_not0_saveexec_b32")(saveexec(lambda s, e: ~s & e, 1))
op("s_or_not1_saveexec_b32")(saveexec(lambda s, e: s | ~e, 1))


def _sop2_64(fn):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        a, b = w.read_scalar(i.operands[1], 2), w.read_scalar(i.operands[2], 2)
        w.write_scalar(i.operands[0], fn(a, b) & MASK64)

    return run


# 64-bit SALU arithmetic; neither writes SCC (gfx12 ISA, S_ADD_NC_U64 / S_MUL_U64).
op("s_add_nc_u64")(_sop2_64(lambda a, b: a + b))
op("s_sub_nc_u64")(_sop2_64(lambda a, b: a - b))
op("s_mul_u64")(_sop2_64(lambda a, b: a * b))


def _f32(bits: int) -> np.float32:
    return np.array([bits & MASK32], U32).view(np.float32)[0]


def _bits(value) -> int:
    return int(np.array([value], np.float32).view(U32)[0])


def _salu_float(fn, result: str = "f32"):
    """SALU float ops (gfx11.5 and later): IEEE f32 on SGPRs, no SCC."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        args = [w.read_scalar(o, 1, "f32") for o in i.operands[1:]]
        with np.errstate(all="ignore"):
            value = fn(*args)
        w.write_scalar(i.operands[0], _bits(value) if result == "f32" else int(value))

    return run


def _f32_to_u32(bits: int) -> int:
    value = float(_f32(bits))
    return 0 if value != value else int(min(max(np.trunc(value), 0), MASK32))


op("s_mul_f32")(_salu_float(lambda a, b: np.float32(_f32(a) * _f32(b))))
op("s_add_f32")(_salu_float(lambda a, b: np.float32(_f32(a) + _f32(b))))
op("s_sub_f32")(_salu_float(lambda a, b: np.float32(_f32(a) - _f32(b))))
op("s_cvt_f32_u32")(_salu_float(lambda a: np.float32(a)))
op("s_cvt_f32_i32")(_salu_float(lambda a: np.float32(a - (1 << 32) if a >> 31 else a)))
op("s_cvt_u32_f32")(_salu_float(_f32_to_u32, result="u32"))


# s_getreg / s_setreg: the hardware registers hold modes and IDs the emulator does not model;
# a kernel reads back what it set, and IB_STS2 (gfx1250's cluster fields) reads 0: no cluster.
def _hwreg(text: str) -> tuple[str, int, int]:
    inner = text[text.index("hwreg(") + 6 : text.index(")")]
    parts = [p.strip() for p in inner.split(",")]
    offset = int(parts[1], 0) if len(parts) > 1 else 0
    size = int(parts[2], 0) if len(parts) > 2 else 32
    return parts[0], offset, size


@op("s_getreg_b32")
def _getreg(ctx: Ctx, w: Wave, i: Instruction) -> None:
    name, offset, size = _hwreg(i.text)
    value = w.hwregs.get(name, 0)
    w.write_scalar(i.operands[0], (value >> offset) & ((1 << size) - 1))


@op("s_setreg_imm32_b32", "s_setreg_b32")
def _setreg(ctx: Ctx, w: Wave, i: Instruction) -> None:
    name, offset, size = _hwreg(i.text)
    field = ((1 << size) - 1) << offset
    value = w.read_scalar(i.operands[-1])
    w.hwregs[name] = (w.hwregs.get(name, 0) & ~field) | ((value << offset) & field)


# --- VALU -----------------------------------------------------------------------------------

valu("v_add_nc_u16", "u16", ("u16", "u16"), lambda a, b: a.astype(np.int64) + b)
valu("v_sub_nc_u16", "u16", ("u16", "u16"), lambda a, b: a.astype(np.int64) - b)
valu("v_and_b16", "b16", ("b16", "b16"), lambda a, b: a & b)
valu("v_or_b16", "b16", ("b16", "b16"), lambda a, b: a | b)
valu("v_xor_b16", "b16", ("b16", "b16"), lambda a, b: a ^ b)
valu("v_mov_b16", "b16", ("b16",), lambda a: a)
valu("v_cvt_u32_u16", "u32", ("u16",), lambda a: a)
valu("v_add_nc_u64", "u64", ("u64", "u64"), lambda a, b: a + b)
valu("v_sub_nc_u64", "u64", ("u64", "u64"), lambda a, b: a - b)
valu("v_mul_u64", "u64", ("u64", "u64"), lambda a, b: a * b)
valu("v_mad_u32", "u32", ("u32",) * 3, lambda a, b, c: a.astype(np.uint64) * b + c)
# IEEE 754-2019 maximumNumber (a NaN operand yields the other), as np.fmax; v_maximum_f32
# propagates NaN.
valu("v_max_num_f32", "f32", ("f32", "f32"), np.fmax)
valu("v_min_num_f32", "f32", ("f32", "f32"), np.fmin)
valu("v_max3_num_f32", "f32", ("f32",) * 3, lambda a, b, c: np.fmax(np.fmax(a, b), c))
valu("v_min3_num_f32", "f32", ("f32",) * 3, lambda a, b, c: np.fmin(np.fmin(a, b), c))
valu("v_maximum_f32", "f32", ("f32", "f32"), ieee_maximum)
valu("v_minimum_f32", "f32", ("f32", "f32"), ieee_minimum)
# The fused forms apply the first operation to S0, S1 and the second to that and S2.
valu("v_minimummaximum_f32", "f32", ("f32",) * 3,
     lambda a, b, c: ieee_maximum(ieee_minimum(a, b), c))  # fmt: skip
valu("v_maximumminimum_f32", "f32", ("f32",) * 3,
     lambda a, b, c: ieee_minimum(ieee_maximum(a, b), c))  # fmt: skip


@op("v_bitop2_b32", mods=("bitop3",))
def _bitop2(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """VOPD3's two-input truth table: bit k of D is bit (a_k << 2 | b_k << 1) of bitop3 (the
    v_bitop3_b32 table with its third input 0)."""
    table = i.mod_int("bitop3")
    a = source(w, i.operands[1], "b32").astype(U32)
    b = source(w, i.operands[2], "b32").astype(U32)
    out = np.zeros(LANES, U32)
    for index in (0, 2, 4, 6):
        if table >> index & 1:
            sel_a = a if index & 4 else ~a
            sel_b = b if index & 2 else ~b
            out |= sel_a & sel_b
    w.write_vector(i.operands[0], out, w.exec_mask())


@op("v_cndmask_b16")
def _cndmask16(ctx: Ctx, w: Wave, i: Instruction) -> None:
    a = source(w, i.operands[1], "b16")
    b = source(w, i.operands[2], "b16")
    cond = w.read_lane_mask(i.operands[3])
    w.write_vector(i.operands[0], np.where(cond, b, a).astype(U32), w.exec_mask())


@op("v_s_rcp_f32", mods=("clamp",))
def _s_rcp(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """The VALU's transcendental with an SGPR result (gfx1250): 1/x of a scalar."""
    value = _f32(w.read_scalar(i.operands[1], 1, "f32"))
    with np.errstate(all="ignore"):
        w.write_scalar(i.operands[0], _bits(np.float32(1) / value))


def _mad_nc(signed: bool):
    """v_mad_nc_{u64_u32,i64_i32}: D.64 = S0.32 * S1.32 + S2.64, no carry out."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        t = "i32" if signed else "u32"
        a = source(w, i.operands[1], t).astype(np.int64)
        b = source(w, i.operands[2], t).astype(np.int64)
        c = typed(w.read_vector(i.operands[3], 2), "u64")
        product = (a * b).view(U64)  # exact: |a * b| < 2^63 for 32-bit factors
        w.write_vector(i.operands[0], split(product + c), w.exec_mask())

    return run


op("v_mad_nc_u64_u32", mods=("clamp",))(_mad_nc(False))
op("v_mad_nc_i64_i32", mods=("clamp",))(_mad_nc(True))


# --- VOPD: two VALU ops issued as one --------------------------------------------------------


@op("v_dual")
def _dual(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """X and Y read their sources before either writes (gfx12 ISA, "VOPD"): Y sees the
    registers as they were before X wrote its destination."""
    from aiter.emulator.ops.registry import lookup

    x, y = i.parts
    y_sources = {w.vrow(o) for o in y.operands[1:] if o.kind == "v"}
    x_dst = w.vrow(x.operands[0])
    saved = w.vgpr[x_dst].copy() if x_dst in y_sources else None
    lookup(x.mnemonic).fn(ctx, w, x)
    if saved is None:
        lookup(y.mnemonic).fn(ctx, w, y)
        return
    written = w.vgpr[x_dst].copy()
    w.vgpr[x_dst] = saved
    lookup(y.mnemonic).fn(ctx, w, y)
    w.vgpr[x_dst] = written


# --- cross-lane ------------------------------------------------------------------------------


def _dpp_sources(i: Instruction, size: int) -> np.ndarray:
    """The source lane of each lane (-1: none) for the DPP control on `i` (gfx12 DPP16)."""
    lane = np.arange(LANES)
    row_lane = lane % 16
    base = lane - row_lane
    if i.has("quad_perm"):
        sel = [int(s) for s in i.mod("quad_perm").strip("[]").split(",")]
        src = lane - lane % 4 + np.array(sel)[lane % 4]
    elif i.has("row_shl"):
        n = i.mod_int("row_shl")
        src = np.where(row_lane + n < 16, lane + n, -1)
    elif i.has("row_shr"):
        n = i.mod_int("row_shr")
        src = np.where(row_lane - n >= 0, lane - n, -1)
    elif i.has("row_ror"):
        src = base + (row_lane + i.mod_int("row_ror")) % 16
    elif i.has("row_mirror"):
        src = base + 15 - row_lane
    elif i.has("row_half_mirror"):
        src = lane - lane % 8 + 7 - lane % 8
    elif i.has("row_share"):
        src = base + i.mod_int("row_share")
    elif i.has("row_xmask"):
        src = base + (row_lane ^ i.mod_int("row_xmask"))
    else:
        raise ValueError(f"DPP control of {i.text!r} is not modelled")
    return np.where(lane < size, src, -1)


_DPP_MODS = ("quad_perm", "row_shl", "row_shr", "row_ror", "row_mirror", "row_half_mirror",
             "row_share", "row_xmask", "row_mask", "bank_mask", "bound_ctrl", "fi")  # fmt: skip


@op("v_mov_b32_dpp", mods=_DPP_MODS)
def _mov_dpp(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """D = S0 of the lane the DPP control names. A source lane that is out of the row or
    disabled reads 0 with bound_ctrl:1, else leaves D unwritten (fi:0)."""
    if i.mod_int("row_mask", 0xF) != 0xF or i.mod_int("bank_mask", 0xF) != 0xF:
        raise ValueError("DPP row_mask / bank_mask other than 0xf is not modelled")
    src = _dpp_sources(i, w.size)
    active = w.exec_mask()
    valid = (src >= 0) & active[np.clip(src, 0, LANES - 1)]
    data = w.read_vector(i.operands[1])[0]
    out = np.where(valid, data[np.clip(src, 0, LANES - 1)], U32(0))
    write = active & (valid | i.has("bound_ctrl"))
    w.write_vector(i.operands[0], out, write)


def _compare_dpp(t: str, fn):
    """VOPC with DPP16 (v_cmp_*_e64_dpp): src0 is read from the lane the DPP control names; a
    lane whose source is out of its row or inactive reads 0 with bound_ctrl:1, else is
    disabled and its result bit is 0 (gfx12 ISA, "DPP")."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        if i.mod_int("row_mask", 0xF) != 0xF or i.mod_int("bank_mask", 0xF) != 0xF:
            raise ValueError("DPP row_mask / bank_mask other than 0xf is not modelled")
        active = w.exec_mask()
        src = _dpp_sources(i, w.size)
        valid = (src >= 0) & active[np.clip(src, 0, LANES - 1)]
        a = source(w, i.operands[-2], t)
        a = np.where(valid, a[np.clip(src, 0, LANES - 1)], a.dtype.type(0))
        enabled = active & (valid | i.has("bound_ctrl"))
        with np.errstate(all="ignore"):
            result = fn(a, source(w, i.operands[-1], t)) & enabled
        w.write_scalar(i.operands[0], mask_to_bits(result))

    return run


for _name, (_t, _fn) in vector.COMPARES.items():
    op(f"{_name}_e64_dpp", mods=_DPP_MODS)(_compare_dpp(_t, _fn))


@op("v_permlanex16_b32", mods=("op_sel",))
def _permlanex16(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """Lane l reads S0 of lane sel(l % 16) in the other row of 16 of its 32, where sel takes
    nibble l % 16 of {S2, S1} (gfx12 ISA, V_PERMLANEX16_B32)."""
    selects = w.read_scalar(i.operands[2]) | w.read_scalar(i.operands[3]) << 32
    lane = np.arange(LANES)
    nibble = np.array([(selects >> (4 * (k % 16))) & 0xF for k in range(LANES)])
    other_row = lane - lane % 32 + (16 - (lane % 32) // 16 * 16)
    src = other_row + nibble
    data = w.read_vector(i.operands[1])[0]
    w.write_vector(i.operands[0], data[src], w.exec_mask())


def _with_dpp(base: Op):
    """A VOP1/VOP2/VOP3 instruction with DPP16: its first source read from the lane the DPP
    control names. A lane whose source is out of its row or inactive reads 0 with
    bound_ctrl:1, else is disabled (not written). Run as the base instruction whose src0 names
    a scratch row holding the moved values (its other sources, the same register included,
    read unmoved)."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        if i.mod_int("row_mask", 0xF) != 0xF or i.mod_int("bank_mask", 0xF) != 0xF:
            raise ValueError("DPP row_mask / bank_mask other than 0xf is not modelled")
        src0 = i.operands[1]
        if src0.kind != "v" or src0.count != 1 or src0.half:
            raise ValueError(f"DPP on {src0.text!r} (not one whole VGPR) is not modelled")
        active = w.exec_mask()
        src = _dpp_sources(i, w.size)
        valid = (src >= 0) & active[np.clip(src, 0, LANES - 1)]
        data = w.read_vector(src0)[0]
        dst = i.operands[0]
        scratch = w.vgpr.shape[0] - 1  # a row the instruction itself does not write
        if dst.kind == "v" and dst.index <= scratch < dst.index + dst.count:
            scratch = dst.index - 1
        saved, pending = w.vgpr[scratch].copy(), w.pending_v.pop(scratch, None)
        w.vgpr[scratch] = np.where(valid, data[np.clip(src, 0, LANES - 1)], U32(0))
        moved = dataclasses.replace(src0, index=scratch, text=f"v{scratch}")
        operands = (i.operands[0], moved, *i.operands[2:])
        exec_bits = w.exec
        w.exec = mask_to_bits(active & (valid | i.has("bound_ctrl")))
        try:
            base.fn(ctx, w, dataclasses.replace(i, operands=operands))
        finally:
            w.exec = exec_bits
            w.vgpr[scratch] = saved
            if pending is not None:
                w.pending_v[scratch] = pending

    return run


for _name, _base in list(OPS.items()):
    if not _name.startswith("v_") or _name.endswith("_dpp") or _name.startswith(
        ("v_cmp", "v_mfma", "v_wmma", "v_dual", "v_mov_b32", "v_permlane", "v_readlane",
         "v_readfirstlane", "v_writelane")
    ):  # fmt: skip
        continue
    for _suffix in ("_dpp", "_e64_dpp"):
        if _name + _suffix not in OPS:
            op(_name + _suffix, mods=tuple(_base.modifiers | set(_DPP_MODS)))(_with_dpp(_base))
