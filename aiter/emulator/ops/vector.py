"""Vector ALU semantics (VOP1, VOP2, VOP3, VOPC) vectorised over the 64 lanes: each result is
written to the lanes EXEC enables, as the CDNA3 ISA ("Vector ALU Operations") defines it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.errors import UnsupportedInstruction
from aiter.emulator.ops.numeric import (
    f32_to_bf16,
    fma_f32,
    op_sel,
    source,
    split,
    typed,
    words_of,
)
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import LANES, Wave, mask_to_bits

U32 = np.uint32
_SIXTEEN = ("f16", "bf16", "u16", "i16", "b16")


@dataclass(frozen=True)
class LaneOp:
    """A lane-wise operation D = fn(S0, S1, ...) with its operand types, kept so that other
    encodings of the same opcode (SDWA) can reuse it; `arch_fn(arch)` gives fn when the
    semantics depend on the target (fp8 flavours)."""

    dst: str
    srcs: tuple[str, ...]
    fn: Callable[..., np.ndarray] | None = None
    arch_fn: Callable[[str], Callable[..., np.ndarray]] | None = None

    def bind(self, arch: str) -> Callable[..., np.ndarray]:
        return self.arch_fn(arch) if self.arch_fn is not None else self.fn


LANE_OPS: dict[str, LaneOp] = {}
COMPARES: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {}


def _u(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.int64).astype(U32)


def _clamp(value: np.ndarray, t: str) -> np.ndarray:
    if t in ("f32", "f16", "f64"):
        # Clamp to [0, 1]; NaN becomes 0 (CDNA3 ISA, "Output Modifiers").
        return np.where(np.isnan(value), 0, np.clip(value, 0, 1)).astype(value.dtype)
    raise ValueError(t)


def _omod(value: np.ndarray, i: Instruction) -> np.ndarray:
    if i.has("mul"):
        return value * value.dtype.type(i.mod_int("mul"))
    if i.has("div"):
        return value / value.dtype.type(i.mod_int("div"))
    return value


def valu(
    names: str,
    dst: str,
    srcs: tuple[str, ...],
    fn: Callable[..., np.ndarray],
    saturate: tuple[int, int] | None = None,
) -> None:
    """Register a lane-wise operation D = fn(S0, S1, ...) with typed sources and result.
    `saturate`: the integer range `clamp` saturates an (unwrapped) integer result to."""
    for name in names.split():
        LANE_OPS[name] = LaneOp(dst, srcs, fn)
    is_float = dst in ("f32", "f16", "f64", "bf16")
    sixteen = dst in _SIXTEEN or any(t in _SIXTEEN for t in srcs)
    mods = (("clamp", "mul", "div") if is_float else ()) + (("op_sel",) if sixteen else ())
    mods += ("clamp",) if saturate else ()

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        sel = op_sel(i) + [0] * 4
        args = [source(w, i.operands[1 + k], t, bool(sel[k])) for k, t in enumerate(srcs)]
        with np.errstate(all="ignore"):
            result = fn(*args)
            if is_float:
                result = _omod(np.asarray(result, _FLOAT_DTYPE[dst]), i)
                if i.has("clamp"):
                    result = _clamp(result, dst)
            elif saturate and i.has("clamp"):
                result = np.clip(np.asarray(result, np.int64), *saturate)
        out = words_of(result, dst)
        if dst in _SIXTEEN:
            old = w.vgpr[w.vrow(i.operands[0])]
            if sel[len(srcs)]:
                # op_sel on the destination writes the high half and keeps the low one.
                out = (old & U32(0xFFFF)) | (out << U32(16))
            # Without it gfx9 zeroes the high half (LLVM GCNSubtarget::zeroesHigh16BitsOfDest).
        w.write_vector(i.operands[0], out, w.exec_mask())

    op(*names.split(), mods=mods)(run)


_FLOAT_DTYPE = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "bf16": np.float32}

# --- integer and bitwise ----------------------------------------------------------------------


def _shl(a, s):
    return a.astype(np.uint64) << (s.astype(np.uint64) & np.uint64(31))


def _shl64(a, s):
    return a << (s & U32(63)).astype(np.uint64)


def _hi32(product):
    return product >> np.uint64(32)


def _shr(a, s):
    return a >> (s & U32(31))


valu("v_mov_b32", "b32", ("b32",), lambda a: a)
valu("v_not_b32", "b32", ("b32",), lambda a: ~a)
valu("v_bfrev_b32", "b32", ("b32",), lambda a: _bitrev(a))
_U32_RANGE = (0, 0xFFFFFFFF)
valu("v_add_u32", "u32", ("u32", "u32"), lambda a, b: a.astype(np.int64) + b, _U32_RANGE)
valu("v_sub_u32", "u32", ("u32", "u32"), lambda a, b: a.astype(np.int64) - b, _U32_RANGE)
valu("v_subrev_u32", "u32", ("u32", "u32"), lambda a, b: b.astype(np.int64) - a, _U32_RANGE)
valu("v_and_b32", "b32", ("b32", "b32"), lambda a, b: a & b)
valu("v_or_b32", "b32", ("b32", "b32"), lambda a, b: a | b)
valu("v_xor_b32", "b32", ("b32", "b32"), lambda a, b: a ^ b)
valu("v_xnor_b32", "b32", ("b32", "b32"), lambda a, b: ~(a ^ b))
valu("v_lshlrev_b32", "b32", ("u32", "b32"), lambda s, a: _shl(a, s))
valu("v_lshrrev_b32", "b32", ("u32", "b32"), lambda s, a: _shr(a, s))
valu("v_ashrrev_i32", "i32", ("u32", "i32"), lambda s, a: a >> (s & U32(31)).astype(np.int32))
valu("v_lshlrev_b64", "b64", ("u32", "u64"), lambda s, a: _shl64(a, s))
valu("v_lshrrev_b64", "b64", ("u32", "u64"), lambda s, a: a >> (s & U32(63)).astype(np.uint64))
valu("v_ashrrev_i64", "i64", ("u32", "i64"), lambda s, a: a >> (s & U32(63)).astype(np.int64))
valu("v_min_i32", "i32", ("i32", "i32"), np.minimum)
valu("v_max_i32", "i32", ("i32", "i32"), np.maximum)
valu("v_min_u32", "u32", ("u32", "u32"), np.minimum)
valu("v_max_u32", "u32", ("u32", "u32"), np.maximum)
valu("v_min3_i32", "i32", ("i32",) * 3, lambda a, b, c: np.minimum(np.minimum(a, b), c))
valu("v_max3_i32", "i32", ("i32",) * 3, lambda a, b, c: np.maximum(np.maximum(a, b), c))
valu("v_min3_u32", "u32", ("u32",) * 3, lambda a, b, c: np.minimum(np.minimum(a, b), c))
valu("v_max3_u32", "u32", ("u32",) * 3, lambda a, b, c: np.maximum(np.maximum(a, b), c))
valu("v_med3_i32", "i32", ("i32",) * 3, lambda a, b, c: np.median(np.stack([a, b, c]), 0))
valu("v_med3_u32", "u32", ("u32",) * 3, lambda a, b, c: np.median(np.stack([a, b, c]), 0))
valu("v_mul_lo_u32", "u32", ("u32", "u32"), lambda a, b: a.astype(np.uint64) * b)
valu("v_mul_hi_u32", "u32", ("u32", "u32"), lambda a, b: _hi32(a.astype(np.uint64) * b))
valu("v_mul_hi_i32", "i32", ("i32", "i32"), lambda a, b: (a.astype(np.int64) * b) >> 32)
valu("v_mul_u32_u24", "u32", ("u24", "u24"), lambda a, b: a.astype(np.uint64) * b)
valu("v_mul_hi_u32_u24", "u32", ("u24", "u24"), lambda a, b: _hi32(a.astype(np.uint64) * b))
valu("v_mul_i32_i24", "i32", ("i24", "i24"), lambda a, b: a.astype(np.int64) * b)
valu("v_mul_hi_i32_i24", "i32", ("i24", "i24"), lambda a, b: (a.astype(np.int64) * b) >> 32)
valu("v_mad_u32_u24", "u32", ("u24", "u24", "u32"), lambda a, b, c: a.astype(np.uint64) * b + c)
valu("v_mad_i32_i24", "i32", ("i24", "i24", "i32"), lambda a, b, c: a.astype(np.int64) * b + c)
valu("v_add3_u32", "u32", ("u32",) * 3, lambda a, b, c: a.astype(np.uint64) + b + c)
valu("v_lshl_add_u32", "u32", ("u32",) * 3, lambda a, s, c: _shl(a, s) + c)
valu("v_add_lshl_u32", "u32", ("u32",) * 3, lambda a, b, s: _shl(_u(a.astype(np.uint64) + b), s))
valu("v_lshl_or_b32", "b32", ("u32",) * 3, lambda a, s, c: _shl(a, s) | c)
valu("v_and_or_b32", "b32", ("u32",) * 3, lambda a, b, c: (a & b) | c)
valu("v_or3_b32", "b32", ("u32",) * 3, lambda a, b, c: a | b | c)
valu("v_xad_u32", "u32", ("u32",) * 3, lambda a, b, c: (a ^ b).astype(np.uint64) + c)
valu(
    "v_bfm_b32",
    "b32",
    ("u32", "u32"),
    lambda n, o: _shl(_u((1 << (n & U32(31)).astype(np.int64)) - 1), o),
)
valu("v_bfi_b32", "b32", ("u32",) * 3, lambda m, a, b: (m & a) | (~m & b))
valu("v_lshl_add_u64", "u64", ("u64", "u32", "u64"), lambda a, s, c: _shl64(a, s) + c)
valu("v_mov_b64", "b64", ("b64",), lambda a: a)


def _bitrev(a: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(a.astype(">u4").view(np.uint8)).reshape(-1, 32)[:, ::-1]
    return np.packbits(bits, axis=1).view(">u4").reshape(-1).astype(U32)


def _bfe_u32(a: np.ndarray, off: np.ndarray, width: np.ndarray) -> np.ndarray:
    off, width = (off & U32(31)).astype(np.uint64), (width & U32(31)).astype(np.uint64)
    return (a.astype(np.uint64) >> off) & ((np.uint64(1) << width) - np.uint64(1))


def _bfe_i32(a: np.ndarray, off: np.ndarray, width: np.ndarray) -> np.ndarray:
    field = _bfe_u32(a.view(U32), off, width).astype(np.int64)
    width = (width & U32(31)).astype(np.int64)
    sign = np.where(width > 0, (field >> np.maximum(width - 1, 0)) & 1, 0)
    return np.where(sign == 1, field - (np.int64(1) << width), field)


valu("v_bfe_u32", "u32", ("u32",) * 3, _bfe_u32)
valu("v_bfe_i32", "i32", ("i32", "u32", "u32"), _bfe_i32)


def _alignbit(a, b, s):
    return ((a.astype(np.uint64) << np.uint64(32)) | b) >> (s & U32(31)).astype(np.uint64)


def _alignbyte(a, b, s):
    return ((a.astype(np.uint64) << np.uint64(32)) | b) >> (8 * (s & U32(3))).astype(np.uint64)


valu("v_alignbit_b32", "b32", ("u32",) * 3, _alignbit)
valu("v_alignbyte_b32", "b32", ("u32",) * 3, _alignbyte)


def _perm(a: np.ndarray, b: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """V_PERM_B32: byte k of D is chosen by byte k of S2 from the 8 bytes {S0, S1} (S1 low),
    8-11 take a byte's sign, 12 is 0x00, 13+ is 0xFF (CDNA3 ISA)."""
    pool = ((a.astype(np.uint64) << np.uint64(32)) | b).astype(np.uint64)
    out = np.zeros_like(a, dtype=np.uint64)
    for k in range(4):
        s = ((sel >> U32(8 * k)) & U32(0xFF)).astype(np.uint64)
        byte = (pool >> (np.uint64(8) * (s & np.uint64(7)))) & np.uint64(0xFF)
        signs = {8: 1, 9: 3, 10: 5, 11: 7}
        for code, src_byte in signs.items():
            bit = (pool >> np.uint64(8 * src_byte + 7)) & np.uint64(1)
            byte = np.where(s == code, bit * np.uint64(0xFF), byte)
        byte = np.where(s == 12, np.uint64(0), byte)
        byte = np.where(s >= 13, np.uint64(0xFF), byte)
        out |= byte << np.uint64(8 * k)
    return out


valu("v_perm_b32", "b32", ("u32",) * 3, _perm)

# --- floating point ---------------------------------------------------------------------------

F32 = np.float32


def _fma32(a, b, c):
    return fma_f32(a, b, c)


valu("v_add_f32", "f32", ("f32", "f32"), np.add)
valu("v_sub_f32", "f32", ("f32", "f32"), np.subtract)
valu("v_subrev_f32", "f32", ("f32", "f32"), lambda a, b: b - a)
valu("v_mul_f32", "f32", ("f32", "f32"), np.multiply)
valu("v_max_f32", "f32", ("f32", "f32"), np.fmax)
valu("v_min_f32", "f32", ("f32", "f32"), np.fmin)
valu("v_max3_f32", "f32", ("f32",) * 3, lambda a, b, c: np.fmax(np.fmax(a, b), c))
valu("v_min3_f32", "f32", ("f32",) * 3, lambda a, b, c: np.fmin(np.fmin(a, b), c))


def ieee_maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE 754-2019 maximum: a NaN operand gives a quiet NaN, and +0 > -0."""
    out = np.maximum(a, b)
    zeros = (a == 0) & (b == 0)
    out = np.where(zeros, np.where(np.signbit(a) & np.signbit(b), -0.0, 0.0), out)
    return np.where(np.isnan(a) | np.isnan(b), np.nan, out).astype(a.dtype)


def ieee_minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE 754-2019 minimum: a NaN operand gives a quiet NaN, and -0 < +0."""
    out = np.minimum(a, b)
    zeros = (a == 0) & (b == 0)
    out = np.where(zeros, np.where(np.signbit(a) | np.signbit(b), -0.0, 0.0), out)
    return np.where(np.isnan(a) | np.isnan(b), np.nan, out).astype(a.dtype)


# gfx950 (CDNA4 ISA, V_MAXIMUM3_F32 / V_MINIMUM3_F32): NaN-propagating, unlike v_max3_f32.
valu("v_maximum3_f32", "f32", ("f32",) * 3, lambda a, b, c: ieee_maximum(ieee_maximum(a, b), c))
valu("v_minimum3_f32", "f32", ("f32",) * 3, lambda a, b, c: ieee_minimum(ieee_minimum(a, b), c))
valu("v_med3_f32", "f32", ("f32",) * 3, lambda a, b, c: np.nanmedian(np.stack([a, b, c]), 0))
valu("v_fma_f32", "f32", ("f32",) * 3, _fma32)
valu("v_mad_f32", "f32", ("f32",) * 3, lambda a, b, c: a * b + c)
valu("v_rcp_f32", "f32", ("f32",), lambda a: F32(1) / a)
valu("v_rsq_f32", "f32", ("f32",), lambda a: F32(1) / np.sqrt(a))
valu("v_sqrt_f32", "f32", ("f32",), np.sqrt)
valu("v_exp_f32", "f32", ("f32",), np.exp2)
valu("v_log_f32", "f32", ("f32",), np.log2)
valu("v_sin_f32", "f32", ("f32",), lambda a: np.sin(a.astype(np.float64) * 2 * np.pi))
valu("v_cos_f32", "f32", ("f32",), lambda a: np.cos(a.astype(np.float64) * 2 * np.pi))
valu("v_floor_f32", "f32", ("f32",), np.floor)
valu("v_ceil_f32", "f32", ("f32",), np.ceil)
valu("v_trunc_f32", "f32", ("f32",), np.trunc)
valu("v_rndne_f32", "f32", ("f32",), np.rint)
valu("v_fract_f32", "f32", ("f32",), lambda a: a - np.floor(a))
valu("v_ldexp_f32", "f32", ("f32", "i32"), lambda a, e: np.ldexp(a, np.clip(e, -300, 300)))
valu("v_add_f64", "f64", ("f64", "f64"), np.add)
valu("v_mul_f64", "f64", ("f64", "f64"), np.multiply)
valu("v_fma_f64", "f64", ("f64",) * 3, lambda a, b, c: a * b + c)
valu("v_add_f16", "f16", ("f16", "f16"), np.add)
valu("v_sub_f16", "f16", ("f16", "f16"), np.subtract)
valu("v_mul_f16", "f16", ("f16", "f16"), np.multiply)
valu("v_max_f16", "f16", ("f16", "f16"), np.fmax)
valu("v_min_f16", "f16", ("f16", "f16"), np.fmin)
valu("v_fma_f16", "f16", ("f16",) * 3, lambda a, b, c: (a.astype(np.float64) * b + c))


def _byte(a: np.ndarray, k: int) -> np.ndarray:
    return (a >> U32(8 * k)) & U32(255)


def _cvt_int(dtype: type, lo: int, hi: int) -> Callable[[np.ndarray], np.ndarray]:
    """Float -> integer: truncate toward zero, saturate, NaN -> 0 (CDNA3 ISA, V_CVT_*)."""

    def run(a: np.ndarray) -> np.ndarray:
        value = np.where(np.isnan(a), 0, np.clip(np.trunc(a.astype(np.float64)), lo, hi))
        return value.astype(np.int64).astype(dtype)

    return run


valu("v_cvt_f32_u32", "f32", ("u32",), lambda a: a.astype(F32))
valu("v_cvt_f32_i32", "f32", ("i32",), lambda a: a.astype(F32))
valu("v_cvt_u32_f32", "u32", ("f32",), _cvt_int(np.uint32, 0, 2**32 - 1))
valu("v_cvt_i32_f32", "i32", ("f32",), _cvt_int(np.int32, -(2**31), 2**31 - 1))
valu("v_cvt_f32_f16", "f32", ("f16",), lambda a: a.astype(F32))
valu("v_cvt_f16_f32", "f16", ("f32",), lambda a: a)
valu("v_cvt_f32_f64", "f32", ("f64",), lambda a: a.astype(F32))
valu("v_cvt_f64_f32", "f64", ("f32",), lambda a: a.astype(np.float64))
for _k in range(4):
    valu(f"v_cvt_f32_ubyte{_k}", "f32", ("u32",), lambda a, k=_k: _byte(a, k).astype(F32))


# --- moves across lanes, selects ----------------------------------------------------------------


@op("v_cndmask_b32")
def _cndmask(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """D = VCC/SSRC[lane] ? S1 : S0 (abs/neg apply to the f32 view when present)."""
    a = source(w, i.operands[1], "f32" if i.operands[1].neg or i.operands[1].abs else "b32")
    b = source(w, i.operands[2], "f32" if i.operands[2].neg or i.operands[2].abs else "b32")
    cond = w.read_lane_mask(i.operands[3])
    out = np.where(cond, np.asarray(b).view(U32), np.asarray(a).view(U32))
    w.write_vector(i.operands[0], out, w.exec_mask())


def _first_lane(w: Wave) -> int:
    bits = w.exec
    # With EXEC = 0 the hardware reads lane 0 (CDNA3 ISA, V_READFIRSTLANE_B32).
    return (bits & -bits).bit_length() - 1 if bits else 0


@op("v_readfirstlane_b32")
def _readfirstlane(ctx: Ctx, w: Wave, i: Instruction) -> None:
    row = w.read_vector(i.operands[1])
    w.write_scalar(i.operands[0], int(row[0, _first_lane(w)]))


@op("v_readlane_b32")
def _readlane(ctx: Ctx, w: Wave, i: Instruction) -> None:
    lane = w.read_scalar(i.operands[2]) & (LANES - 1)
    w.write_scalar(i.operands[0], int(w.read_vector(i.operands[1])[0, lane]))


@op("v_writelane_b32")
def _writelane(ctx: Ctx, w: Wave, i: Instruction) -> None:
    lane = w.read_scalar(i.operands[2]) & (LANES - 1)
    value = w.read_scalar(i.operands[1])
    mask = np.zeros(LANES, bool)
    mask[lane] = True  # written whatever EXEC holds
    w.write_vector(i.operands[0], np.full(LANES, value, U32), mask)


# --- carries ------------------------------------------------------------------------------------


def _carry_op(name: str, fn: Callable[..., tuple[np.ndarray, np.ndarray]], carry_in: bool):
    """VOP2/VOP3b: vdst, sdst (carry/borrow out per lane), src0, src1[, carry-in mask]."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        if i.has("clamp"):
            raise UnsupportedInstruction(i.mnemonic, ctx.kernel.name, i.address, "clamp")
        mask = w.exec_mask()
        a = source(w, i.operands[2], "u32").astype(np.int64)
        b = source(w, i.operands[3], "u32").astype(np.int64)
        cin = w.read_lane_mask(i.operands[4]).astype(np.int64) if carry_in else 0
        value, carry = fn(a, b, cin)
        w.write_vector(i.operands[0], _u(value), mask)
        # Inactive lanes get 0 in the carry mask (CDNA3 ISA, "VOPC and VOP3b" carry-out rule).
        w.write_scalar(i.operands[1], mask_to_bits(carry & mask))

    op(name, mods=("clamp",))(run)


_carry_op("v_add_co_u32", lambda a, b, c: (a + b, a + b > 0xFFFFFFFF), False)
_carry_op("v_addc_co_u32", lambda a, b, c: (a + b + c, a + b + c > 0xFFFFFFFF), True)
_carry_op("v_sub_co_u32", lambda a, b, c: (a - b, b > a), False)
_carry_op("v_subrev_co_u32", lambda a, b, c: (b - a, a > b), False)
_carry_op("v_subb_co_u32", lambda a, b, c: (a - b - c, b + c > a), True)
_carry_op("v_subbrev_co_u32", lambda a, b, c: (b - a - c, a + c > b), True)


def _mad64(signed: bool):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        if i.has("clamp"):
            raise UnsupportedInstruction(i.mnemonic, ctx.kernel.name, i.address, "clamp")
        mask = w.exec_mask()
        t = "i32" if signed else "u32"
        a = source(w, i.operands[2], t).astype(object)
        b = source(w, i.operands[3], t).astype(object)
        c = typed(w.read_vector(i.operands[4], 2), "i64" if signed else "u64").astype(object)
        full = a * b + c
        lo = np.array([int(v) & 0xFFFFFFFFFFFFFFFF for v in full], np.uint64)
        if signed:
            carry = np.array([not -(2**63) <= int(v) < 2**63 for v in full])
        else:
            carry = np.array([int(v) >> 64 != 0 for v in full])
        w.write_vector(i.operands[0], split(lo), mask)
        w.write_scalar(i.operands[1], mask_to_bits(carry & mask))

    return run


op("v_mad_u64_u32", mods=("clamp",))(_mad64(False))
op("v_mad_i64_i32", mods=("clamp",))(_mad64(True))


# --- compares -----------------------------------------------------------------------------------

_INT_CONDS = {
    "f": lambda a, b: np.zeros(a.shape, bool),
    "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater,
    "ne": np.not_equal, "ge": np.greater_equal, "t": lambda a, b: np.ones(a.shape, bool),
}  # fmt: skip
_FLOAT_CONDS = {
    "f": lambda a, b: np.zeros(a.shape, bool),
    "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater,
    "lg": lambda a, b: np.less(a, b) | np.greater(a, b), "ge": np.greater_equal,
    "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)), "u": lambda a, b: np.isnan(a) | np.isnan(b),
    "nge": lambda a, b: ~np.greater_equal(a, b),
    "nlg": lambda a, b: ~(np.less(a, b) | np.greater(a, b)),
    "ngt": lambda a, b: ~np.greater(a, b), "nle": lambda a, b: ~np.less_equal(a, b),
    "neq": lambda a, b: ~np.equal(a, b), "nlt": lambda a, b: ~np.less(a, b),
    "tru": lambda a, b: np.ones(a.shape, bool),
}  # fmt: skip


def _compare(t: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], to_exec: bool):
    """VOPC: sdst[lane] = fn(S0, S1) for active lanes, 0 for inactive ones; v_cmpx also writes
    EXEC (CDNA3 ISA, "VOPC Instructions"). gfx12's v_cmpx has no sdst: it writes EXEC only."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        a, b = i.operands[-2:]
        with np.errstate(all="ignore"):
            result = fn(source(w, a, t), source(w, b, t)) & mask
        bits = mask_to_bits(result)
        if len(i.operands) == 3:
            w.write_scalar(i.operands[0], bits)
        if to_exec:
            w.exec = bits

    return run


for _t in ("i16", "u16", "i32", "u32", "i64", "u64"):
    for _cond, _fn in _INT_CONDS.items():
        op(f"v_cmp_{_cond}_{_t}")(_compare(_t, _fn, False))
        op(f"v_cmpx_{_cond}_{_t}")(_compare(_t, _fn, True))
        COMPARES[f"v_cmp_{_cond}_{_t}"] = (_t, _fn)
for _t in ("f16", "f32", "f64"):
    for _cond, _fn in _FLOAT_CONDS.items():
        COMPARES[f"v_cmp_{_cond}_{_t}"] = (_t, _fn)
        op(f"v_cmp_{_cond}_{_t}")(_compare(_t, _fn, False))
        op(f"v_cmpx_{_cond}_{_t}")(_compare(_t, _fn, True))


def _cmp_class(t: str):
    """V_CMP_CLASS: S1 bits select classes: 0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denorm,
    5 -0, 6 +0, 7 +denorm, 8 +normal, 9 +inf."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        a = source(w, i.operands[1], t)
        sel = source(w, i.operands[2], "u32")
        tiny = np.finfo(a.dtype).tiny
        neg = np.signbit(a)
        mag = np.abs(a)
        quiet_bit = {np.float32: 22, np.float16: 9, np.float64: 51}[a.dtype.type]
        raw = a.view({4: np.uint32, 2: np.uint16, 8: np.uint64}[a.dtype.itemsize])
        quiet = ((raw >> raw.dtype.type(quiet_bit)) & raw.dtype.type(1)) == 1
        classes = [
            np.isnan(a) & ~quiet, np.isnan(a) & quiet, np.isinf(a) & neg,
            neg & (mag >= tiny) & np.isfinite(a), neg & (mag < tiny) & (mag > 0),
            neg & (mag == 0), ~neg & (mag == 0), ~neg & (mag < tiny) & (mag > 0),
            ~neg & (mag >= tiny) & np.isfinite(a), np.isinf(a) & ~neg,
        ]  # fmt: skip
        result = np.zeros(LANES, bool)
        for bit, cls in enumerate(classes):
            result |= cls & (((sel >> U32(bit)) & U32(1)) == 1)
        w.write_scalar(i.operands[0], mask_to_bits(result & mask))

    return run


for _t in ("f16", "f32", "f64"):
    op(f"v_cmp_class_{_t}")(_cmp_class(_t))


# --- AccVGPR moves, lane counts, 16-bit integers ------------------------------------------------

valu("v_accvgpr_read_b32 v_accvgpr_write_b32 v_accvgpr_mov_b32", "b32", ("b32",), lambda a: a)
valu("v_bcnt_u32_b32", "u32", ("u32", "u32"), lambda a, b: _popcount(a).astype(np.uint64) + b)
valu("v_add_u16", "u16", ("u16", "u16"), lambda a, b: a.astype(np.int64) + b, (0, 0xFFFF))
valu("v_sub_u16", "u16", ("u16", "u16"), lambda a, b: a.astype(np.int64) - b, (0, 0xFFFF))
valu("v_mul_lo_u16", "u16", ("u16", "u16"), lambda a, b: a * b)
valu("v_lshlrev_b16", "u16", ("u16", "u16"), lambda s, a: a << (s & U32(15)))
valu("v_lshrrev_b16", "u16", ("u16", "u16"), lambda s, a: a >> (s & U32(15)))
valu("v_ashrrev_i16", "i16", ("u16", "i16"), lambda s, a: a >> (s & U32(15)).astype(np.int16))


def _popcount(a: np.ndarray) -> np.ndarray:
    return np.unpackbits(a.astype("<u4").view(np.uint8).reshape(-1, 4), axis=1).sum(1)


_BELOW = np.array([(1 << lane) - 1 for lane in range(LANES)], dtype=object)


def _mbcnt(high: bool):
    """V_MBCNT_LO/HI_U32_B32: S1 + the set bits of S0 that stand for lanes below this one, in
    lanes 0-31 (lo) or 32-63 (hi) (CDNA3 ISA)."""
    below = np.array(
        [(int(b) >> 32 if high else int(b)) & 0xFFFFFFFF for b in _BELOW], dtype=np.uint32
    )

    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _popcount(a & below).astype(np.uint64) + b

    return fn


valu("v_mbcnt_lo_u32_b32", "u32", ("u32", "u32"), _mbcnt(False))
valu("v_mbcnt_hi_u32_b32", "u32", ("u32", "u32"), _mbcnt(True))


@op("v_fmac_f32", mods=("clamp", "mul", "div"))
def _fmac(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """D = S0 * S1 + D, fused."""
    a, b = source(w, i.operands[1], "f32"), source(w, i.operands[2], "f32")
    acc = source(w, i.operands[0], "f32")
    with np.errstate(all="ignore"):
        result = _omod(_fma32(a, b, acc), i)
    if i.has("clamp"):
        result = _clamp(result, "f32")
    w.write_vector(i.operands[0], result.view(U32), w.exec_mask())


# --- packing and packed conversions -------------------------------------------------------------


def _cvt_pk(to_bits: Callable[[np.ndarray], np.ndarray]):
    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return to_bits(a) | (to_bits(b) << U32(16))

    return fn


valu("v_cvt_pk_bf16_f32", "b32", ("f32", "f32"), _cvt_pk(lambda x: words_of(x, "bf16")[0]))
valu("v_cvt_pk_f16_f32", "b32", ("f32", "f32"), _cvt_pk(lambda x: words_of(x, "f16")[0]))
valu("v_pack_b32_f16", "b32", ("b16", "b16"), lambda a, b: a | (b << U32(16)))


def _bitop3(ctx: Ctx, w: Wave, i: Instruction) -> None:
    """V_BITOP3_B32: bit k of D is bit (S0[k] << 2 | S1[k] << 1 | S2[k]) of the bitop3 truth
    table (so 0xF0 selects S0, 0xCC S1, 0xAA S2)."""
    table = i.mod_int("bitop3")
    a, b, c = (source(w, i.operands[k], "u32") for k in (1, 2, 3))
    out = np.zeros(LANES, U32)
    for index in range(8):
        if table >> index & 1:
            pa = a if index & 4 else ~a
            pb = b if index & 2 else ~b
            pc = c if index & 1 else ~c
            out |= pa & pb & pc
    w.write_vector(i.operands[0], out, w.exec_mask())


op("v_bitop3_b32", mods=("bitop3",))(_bitop3)


def _pk_f32(fn: Callable[..., np.ndarray], nsrc: int):
    """VOP3P packed f32 (gfx940+): each source is a register pair; the low result takes dword
    op_sel[k] of source k and the high result dword op_sel_hi[k] (default 1); neg_lo/neg_hi
    negate per half."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        sel, sel_hi = op_sel(i), op_sel(i, "op_sel_hi") if i.has("op_sel_hi") else [1] * 4
        neg_lo, neg_hi = op_sel(i, "neg_lo"), op_sel(i, "neg_hi")
        pairs = [w.read_vector(i.operands[1 + k], 2, "f32").view(np.float32) for k in range(nsrc)]
        lo = [pairs[k][sel[k]] * (-1 if neg_lo[k] else 1) for k in range(nsrc)]
        hi = [pairs[k][sel_hi[k]] * (-1 if neg_hi[k] else 1) for k in range(nsrc)]
        with np.errstate(all="ignore"):
            out = np.stack([fn(*lo), fn(*hi)]).astype(np.float32)
        w.write_vector(i.operands[0], out.view(U32), w.exec_mask())

    return run


_PK_MODS = ("op_sel", "op_sel_hi", "neg_lo", "neg_hi")
op("v_pk_add_f32", mods=_PK_MODS)(_pk_f32(np.add, 2))
op("v_pk_mul_f32", mods=_PK_MODS)(_pk_f32(np.multiply, 2))
op("v_pk_fma_f32", mods=_PK_MODS)(_pk_f32(_fma32, 3))


def _mix_sources(w: Wave, i: Instruction, short: str = "f16") -> list[np.ndarray]:
    """The three f32 sources of a VOP3P mix instruction: source k is an f32 when op_sel_hi[k]
    is 0, else the f16 in its high (op_sel[k] = 1) or low half. A mix source takes VOP3's neg
    and abs (the disassembler prints them on the operand: -v1, |v1|, neg(0)); abs applies
    first (CDNA3 ISA, VOP3P "mix" opcodes)."""
    sel, sel_hi = op_sel(i), op_sel(i, "op_sel_hi")
    values = []
    for k in range(3):
        operand = i.operands[1 + k]
        if sel_hi[k]:
            raw = w.read_vector(operand, 1, short)
            value = typed(raw, short, hi=bool(sel[k])).astype(np.float32)
        else:
            value = w.read_vector(operand, 1, "f32")[0].view(np.float32)
        if operand.abs:
            value = np.abs(value)
        values.append(-value if operand.neg else value)
    return values


def _round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """f64 -> f32 rounding to odd: truncate, then set the last bit when inexact, so that a
    later rounding to a narrower format (bf16) rounds as the exact value would."""
    f = x.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(x)
    f = np.where(over, np.nextafter(f, np.float32(0)), f).astype(np.float32)
    inexact = (f.astype(np.float64) != x) & np.isfinite(x)
    return np.where(inexact, (f.view(U32) | U32(1)).view(np.float32), f)


def _fma_mix(half: str | None, short: str = "f16"):
    """v_fma_mix_f32 (half None): D.f32 = S0 * S1 + S2 rounded once. v_fma_mixlo_f16 /
    v_fma_mixhi_f16: the same sum rounded to f16 into the low / high half of D, the other half
    kept; the bf16 forms (gfx1250) take bf16 halves and round to bf16. Clamp limits the result
    to [0, 1]."""

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        a, b, c = _mix_sources(w, i, short)
        if half is None:
            out = fma_f32(a, b, c)
            if i.has("clamp"):
                out = np.clip(out, 0.0, 1.0).astype(np.float32)
            w.write_vector(i.operands[0], out.view(U32)[None, :], w.exec_mask())
            return
        # the exact f64 fma rounded to f16 (a product of f32 values is exact in f64; the sum
        # rounds at most once there, far below f16's precision)
        exact = a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)
        if i.has("clamp"):
            exact = np.clip(exact, 0.0, 1.0)
        with np.errstate(all="ignore"):
            if short == "bf16":
                bits = f32_to_bf16(_round_to_odd_f32(exact))
            else:
                bits = exact.astype(np.float16).view(np.uint16).astype(U32)
        old = w.read_vector(i.operands[0], 1)[0]
        keep, shift = (U32(0xFFFF0000), U32(0)) if half == "lo" else (U32(0xFFFF), U32(16))
        out = (old & keep) | (bits << shift)
        w.write_vector(i.operands[0], out[None, :], w.exec_mask())

    return run


_MIX_MODS = ("op_sel", "op_sel_hi", "clamp")
op("v_fma_mix_f32", mods=_MIX_MODS)(_fma_mix(None))
op("v_fma_mixlo_f16", mods=_MIX_MODS)(_fma_mix("lo"))
op("v_fma_mixhi_f16", mods=_MIX_MODS)(_fma_mix("hi"))
op("v_fma_mixlo_bf16", mods=_MIX_MODS)(_fma_mix("lo", "bf16"))
op("v_fma_mixhi_bf16", mods=_MIX_MODS)(_fma_mix("hi", "bf16"))
