"""Scalar ALU semantics (SOP1, SOP2, SOPC, SOPK) on one wave's SGPRs, SCC and EXEC, as the
CDNA3 ISA ("Scalar ALU Operations") defines them.
"""

from __future__ import annotations

from collections.abc import Callable

from aiter.emulator.decode import Instruction
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import MASK32, MASK64, Wave


def _sext(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _src(w: Wave, i: Instruction, n: int, words: int) -> int:
    return w.read_scalar(i.operands[n], words)


# --- SOP2: D = f(S0, S1), SCC as each operation defines --------------------------------------

BinaryFn = Callable[[int, int, Wave], tuple[int, int | None]]


def _sop2(name: str, words: int, fn: BinaryFn) -> None:
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        result, scc = fn(_src(w, i, 1, words), _src(w, i, 2, words), w)
        if scc is not None:
            w.scc = scc
        w.write_scalar(i.operands[0], result & (MASK32 if words == 1 else MASK64))

    op(name)(run)


def _logic(fn: Callable[[int, int], int], mask: int) -> BinaryFn:
    def run(a: int, b: int, w: Wave) -> tuple[int, int]:
        result = fn(a, b) & mask
        return result, int(result != 0)

    return run


for _w, _bits, _mask in ((1, 32, MASK32), (2, 64, MASK64)):
    _sfx = f"b{_bits}"
    _sop2(f"s_and_{_sfx}", _w, _logic(lambda a, b: a & b, _mask))
    _sop2(f"s_or_{_sfx}", _w, _logic(lambda a, b: a | b, _mask))
    _sop2(f"s_xor_{_sfx}", _w, _logic(lambda a, b: a ^ b, _mask))
    _sop2(f"s_andn2_{_sfx}", _w, _logic(lambda a, b, m=_mask: a & ~b & m, _mask))
    _sop2(f"s_orn2_{_sfx}", _w, _logic(lambda a, b, m=_mask: (a | ~b) & m, _mask))
    _sop2(f"s_nand_{_sfx}", _w, _logic(lambda a, b, m=_mask: ~(a & b) & m, _mask))
    _sop2(f"s_nor_{_sfx}", _w, _logic(lambda a, b, m=_mask: ~(a | b) & m, _mask))
    _sop2(f"s_xnor_{_sfx}", _w, _logic(lambda a, b, m=_mask: ~(a ^ b) & m, _mask))
    _sop2(f"s_lshl_{_sfx}", _w, lambda a, b, w, m=_mask, s=_bits - 1: _nz((a << (b & s)) & m))
    _sop2(f"s_lshr_{_sfx}", _w, lambda a, b, w, s=_bits - 1: _nz(a >> (b & s)))
    _sop2(
        f"s_ashr_i{_bits}",
        _w,
        lambda a, b, w, n=_bits, m=_mask: _nz((_sext(a, n) >> (b & (n - 1))) & m),
    )
    _sop2(f"s_cselect_{_sfx}", _w, lambda a, b, w: (a if w.scc else b, None))
    _sop2(
        f"s_bfm_{_sfx}", _w, lambda a, b, w, s=_bits - 1: ((((1 << (a & s)) - 1) << (b & s)), None)
    )


def _nz(value: int) -> tuple[int, int]:
    return value, int(value != 0)


def _add_u32(a: int, b: int, w: Wave) -> tuple[int, int]:
    total = a + b
    return total, int(total > MASK32)


def _sub_u32(a: int, b: int, w: Wave) -> tuple[int, int]:
    return a - b, int(b > a)


def _addc_u32(a: int, b: int, w: Wave) -> tuple[int, int]:
    total = a + b + w.scc
    return total, int(total > MASK32)


def _subb_u32(a: int, b: int, w: Wave) -> tuple[int, int]:
    return a - b - w.scc, int(b + w.scc > a)


def _overflow(a: int, b: int, result: int) -> int:
    """Signed 32-bit overflow of a + b = result (operands as signed)."""
    return int(not -(1 << 31) <= result < (1 << 31))


def _add_i32(a: int, b: int, w: Wave) -> tuple[int, int]:
    sa, sb = _sext(a, 32), _sext(b, 32)
    return sa + sb, _overflow(sa, sb, sa + sb)


def _sub_i32(a: int, b: int, w: Wave) -> tuple[int, int]:
    sa, sb = _sext(a, 32), _sext(b, 32)
    return sa - sb, _overflow(sa, -sb, sa - sb)


_sop2("s_add_u32", 1, _add_u32)
_sop2("s_sub_u32", 1, _sub_u32)
_sop2("s_addc_u32", 1, _addc_u32)
_sop2("s_subb_u32", 1, _subb_u32)
_sop2("s_add_i32", 1, _add_i32)
_sop2("s_sub_i32", 1, _sub_i32)
_sop2("s_mul_i32", 1, lambda a, b, w: (_sext(a, 32) * _sext(b, 32), None))
_sop2("s_mul_hi_u32", 1, lambda a, b, w: ((a * b) >> 32, None))
_sop2("s_mul_hi_i32", 1, lambda a, b, w: ((_sext(a, 32) * _sext(b, 32)) >> 32, None))
_sop2("s_min_i32", 1, lambda a, b, w: (a, 1) if _sext(a, 32) < _sext(b, 32) else (b, 0))
_sop2("s_min_u32", 1, lambda a, b, w: (a, 1) if a < b else (b, 0))
_sop2("s_max_i32", 1, lambda a, b, w: (a, 1) if _sext(a, 32) > _sext(b, 32) else (b, 0))
_sop2("s_max_u32", 1, lambda a, b, w: (a, 1) if a > b else (b, 0))
_sop2("s_absdiff_i32", 1, lambda a, b, w: _nz(abs(_sext(a, 32) - _sext(b, 32)) & MASK32))
_sop2("s_pack_ll_b32_b16", 1, lambda a, b, w: ((a & 0xFFFF) | (b & 0xFFFF) << 16, None))
_sop2("s_pack_lh_b32_b16", 1, lambda a, b, w: ((a & 0xFFFF) | (b & 0xFFFF0000), None))
_sop2("s_pack_hh_b32_b16", 1, lambda a, b, w: ((a >> 16) | (b & 0xFFFF0000), None))
for _n in (1, 2, 3, 4):
    _sop2(
        f"s_lshl{_n}_add_u32",
        1,
        lambda a, b, w, n=_n: (((a << n) & MASK32) + b, int(((a << n) & MASK32) + b > MASK32)),
    )


def _bfe(bits: int, signed: bool) -> BinaryFn:
    """S1[4:0] (or [5:0]) is the offset, S1[22:16] the width (CDNA3 ISA, S_BFE_*)."""

    def run(a: int, b: int, w: Wave) -> tuple[int, int]:
        offset, width = b & (bits - 1), (b >> 16) & 0x7F
        if width == 0:
            return 0, 0
        field = (a >> offset) & ((1 << width) - 1)
        if signed and width < bits:
            field = _sext(field, width) & ((1 << bits) - 1)
        return field, int(field != 0)

    return run


_sop2("s_bfe_u32", 1, _bfe(32, False))
_sop2("s_bfe_i32", 1, _bfe(32, True))
_sop2("s_bfe_u64", 2, _bfe(64, False))
_sop2("s_bfe_i64", 2, _bfe(64, True))


# --- SOPC: SCC = compare(S0, S1) --------------------------------------------------------------

_COMPARE = {
    "eq": lambda a, b: a == b,
    "lg": lambda a, b: a != b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
}


def _sopc(name: str, words: int, signed: bool, fn: Callable[[int, int], bool]) -> None:
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        a, b = _src(w, i, 0, words), _src(w, i, 1, words)
        if signed:
            a, b = _sext(a, 32 * words), _sext(b, 32 * words)
        w.scc = int(fn(a, b))

    op(name)(run)


for _cond, _fn in _COMPARE.items():
    _sopc(f"s_cmp_{_cond}_i32", 1, True, _fn)
    _sopc(f"s_cmp_{_cond}_u32", 1, False, _fn)
_sopc("s_cmp_eq_u64", 2, False, _COMPARE["eq"])
_sopc("s_cmp_lg_u64", 2, False, _COMPARE["lg"])
_sopc("s_bitcmp0_b32", 1, False, lambda a, b: not (a >> (b & 31)) & 1)
_sopc("s_bitcmp1_b32", 1, False, lambda a, b: bool((a >> (b & 31)) & 1))
_sopc("s_bitcmp0_b64", 2, False, lambda a, b: not (a >> (b & 63)) & 1)
_sopc("s_bitcmp1_b64", 2, False, lambda a, b: bool((a >> (b & 63)) & 1))


# --- SOP1: D = f(S0) ---------------------------------------------------------------------------

UnaryFn = Callable[[int, Wave], tuple[int, int | None]]


def _sop1(name: str, words: int, fn: UnaryFn) -> None:
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        result, scc = fn(_src(w, i, 1, words), w)
        if scc is not None:
            w.scc = scc
        w.write_scalar(i.operands[0], result & (MASK32 if words == 1 else MASK64))

    op(name)(run)


for _w, _bits, _mask in ((1, 32, MASK32), (2, 64, MASK64)):
    _sfx = f"b{_bits}"
    _sop1(f"s_mov_{_sfx}", _w, lambda a, w: (a, None))
    _sop1(f"s_not_{_sfx}", _w, lambda a, w, m=_mask: _nz(~a & m))
    _sop1(f"s_brev_{_sfx}", _w, lambda a, w, n=_bits: (int(f"{a:0{n}b}"[::-1], 2), None))
    _sop1(f"s_bcnt1_i32_{_sfx}", _w, lambda a, w: _nz(bin(a).count("1")))
    _sop1(f"s_bcnt0_i32_{_sfx}", _w, lambda a, w, n=_bits: _nz(n - bin(a).count("1")))
    _sop1(
        f"s_ff1_i32_{_sfx}",
        _w,
        lambda a, w: (((a & -a).bit_length() - 1) if a else MASK32, None),
    )
    _sop1(
        f"s_flbit_i32_{_sfx}",
        _w,
        lambda a, w, n=_bits: ((n - a.bit_length()) if a else MASK32, None),
    )

_sop1("s_sext_i32_i8", 1, lambda a, w: (_sext(a, 8), None))
_sop1("s_sext_i32_i16", 1, lambda a, w: (_sext(a, 16), None))
_sop1("s_abs_i32", 1, lambda a, w: _nz(abs(_sext(a, 32)) & MASK32))


def _cmov(words: int) -> Callable[[Ctx, Wave, Instruction], None]:
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        if w.scc:
            w.write_scalar(i.operands[0], _src(w, i, 1, words))

    return run


op("s_cmov_b32")(_cmov(1))
op("s_cmov_b64")(_cmov(2))


def saveexec(
    fn: Callable[[int, int], int], words: int = 2
) -> Callable[[Ctx, Wave, Instruction], None]:
    """D = EXEC; EXEC = fn(S0, EXEC); SCC = (EXEC != 0). words 1: the wave32 forms (_b32) on
    EXEC_LO."""
    mask = MASK64 if words == 2 else MASK32

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        source, old = _src(w, i, 1, words), w.exec & mask
        w.exec = fn(source, old) & mask
        w.scc = int(w.exec != 0)
        w.write_scalar(i.operands[0], old)

    return run


op("s_and_saveexec_b64")(saveexec(lambda s, e: s & e))
op("s_or_saveexec_b64")(saveexec(lambda s, e: s | e))
op("s_xor_saveexec_b64")(saveexec(lambda s, e: s ^ e))
op("s_andn2_saveexec_b64")(saveexec(lambda s, e: s & ~e))
op("s_orn2_saveexec_b64")(saveexec(lambda s, e: s | ~e))
op("s_nand_saveexec_b64")(saveexec(lambda s, e: ~(s & e)))
op("s_nor_saveexec_b64")(saveexec(lambda s, e: ~(s | e)))
op("s_xnor_saveexec_b64")(saveexec(lambda s, e: ~(s ^ e)))
op("s_andn1_saveexec_b64")(saveexec(lambda s, e: ~s & e))
op("s_orn1_saveexec_b64")(saveexec(lambda s, e: ~s | e))


@op("s_getpc_b64")
def _getpc(ctx: Ctx, w: Wave, i: Instruction) -> None:
    # w.pc already points past this instruction: S_GETPC_B64 returns the next one's address.
    w.write_scalar(i.operands[0], w.pc)


# --- SOPK: a 16-bit constant ------------------------------------------------------------------


@op("s_movk_i32")
def _movk(ctx: Ctx, w: Wave, i: Instruction) -> None:
    w.write_scalar(i.operands[0], _sext(i.operands[1].value, 16))


@op("s_addk_i32")
def _addk(ctx: Ctx, w: Wave, i: Instruction) -> None:
    a, k = _sext(w.read_scalar(i.operands[0]), 32), _sext(i.operands[1].value, 16)
    w.scc = _overflow(a, k, a + k)
    w.write_scalar(i.operands[0], a + k)


@op("s_mulk_i32")
def _mulk(ctx: Ctx, w: Wave, i: Instruction) -> None:
    a, k = _sext(w.read_scalar(i.operands[0]), 32), _sext(i.operands[1].value, 16)
    w.write_scalar(i.operands[0], a * k)


@op("s_cmovk_i32")
def _cmovk(ctx: Ctx, w: Wave, i: Instruction) -> None:
    if w.scc:
        w.write_scalar(i.operands[0], _sext(i.operands[1].value, 16))


def _sopk_cmp(signed: bool, fn: Callable[[int, int], bool]) -> Callable[..., None]:
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        a, k = w.read_scalar(i.operands[0]), i.operands[1].value & 0xFFFF
        if signed:
            a, k = _sext(a, 32), _sext(k, 16)
        w.scc = int(fn(a, k))

    return run


for _cond, _fn in _COMPARE.items():
    op(f"s_cmpk_{_cond}_i32")(_sopk_cmp(True, _fn))
    op(f"s_cmpk_{_cond}_u32")(_sopk_cmp(False, _fn))
