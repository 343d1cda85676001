"""The f32 division helpers LLVM's fdiv lowering chains (v_div_scale_f32, v_rcp_f32, fma
refinement, v_div_fmas_f32, v_div_fixup_f32), as the CDNA3/CDNA4 ISA pseudocode defines them.

Where that pseudocode is not self-consistent (it has V_DIV_FMAS_F32 scale by 2**32 while
V_DIV_SCALE_F32 scales by 2**64), the post-scale is 2**64 or 2**-64 chosen by the addend's
exponent, as ROCm/rocm-systems#11613 (rocjitsu, checked against hardware) does.
"""

from __future__ import annotations

import numpy as np

from aiter.emulator.decode import VCC, Instruction
from aiter.emulator.ops.numeric import fma_f32, source
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import Wave, bits_to_mask, mask_to_bits

F32, U32 = np.float32, np.uint32


def exponent(x: np.ndarray) -> np.ndarray:
    """Biased exponent field of f32 values (0 for zeros and denormals)."""
    return ((np.asarray(x, F32).view(U32) >> U32(23)) & U32(0xFF)).astype(np.int64)


def _denormal(x: np.ndarray) -> np.ndarray:
    return (exponent(x) == 0) & (x != 0)


def div_scale(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """V_DIV_SCALE_F32 (S0 = the operand to scale, S1 = denominator, S2 = numerator):
    (D, VCC). Scaling both operands by 2**64 keeps the quotient; VCC marks the lanes whose
    quotient V_DIV_FMAS must scale back."""
    d = s0.astype(F32).copy()
    vcc = np.zeros(s0.shape, bool)
    up = np.ldexp(s0, 64).astype(F32)
    with np.errstate(all="ignore"):
        quotient = (s2 / s1).astype(F32)
    nan = (s2 == 0) | (s1 == 0)
    huge = ~nan & (exponent(s2) - exponent(s1) >= 96)
    den_tiny = ~nan & ~huge & _denormal(s1)
    q_tiny = ~nan & ~huge & ~den_tiny & _denormal(quotient)
    num_tiny = ~nan & ~huge & ~den_tiny & ~q_tiny & (exponent(s2) <= 23)
    d = np.where(huge & (s0 == s1), up, d)
    d = np.where(den_tiny | num_tiny, up, d)
    d = np.where(q_tiny & (s0 == s2), up, d)
    d = np.where(nan, F32(np.nan), d)
    vcc = huge | q_tiny
    return d, vcc


def div_fmas(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray, vcc: np.ndarray) -> np.ndarray:
    """V_DIV_FMAS_F32: fma(S0, S1, S2), times 2**64 (S2 >= 1) or 2**-64 (S2 < 1) where VCC,
    rounded once (subnormal results included)."""
    fused = fma_f32(s0, s1, s2)
    scaled = _fma_scaled(s0, s1, s2, np.where(exponent(s2) >= 127, 64, -64))
    return np.where(vcc, scaled, fused)


def _fma_scaled(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray, power: np.ndarray) -> np.ndarray:
    """fma(S0, S1, S2) * 2**power rounded once to f32 (2**±64 keeps f64 exact)."""
    a = np.ldexp(np.asarray(s0, np.float64), power)
    c = np.ldexp(np.asarray(s2, np.float64), power)
    # a and c are exact in f64; fma_f32 rounds a * S1 + c once.
    return fma_f32(a, s1, c)


def div_fixup(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """V_DIV_FIXUP_F32 (S0 = quotient, S1 = denominator, S2 = numerator): IEEE special cases,
    otherwise |S0| with the quotient's sign."""
    sign = np.signbit(s1) ^ np.signbit(s2)
    inf = np.where(sign, -np.inf, np.inf).astype(F32)
    zero = np.where(sign, F32(-0.0), F32(0.0))
    out = np.where(sign, -np.abs(s0), np.abs(s0)).astype(F32)
    out = np.where(exponent(s2) - exponent(s1) < -150, zero, out)
    out = np.where((np.abs(s1) == np.inf) | (s2 == 0), zero, out)
    out = np.where((s1 == 0) | (np.abs(s2) == np.inf), inf, out)
    both = ((s1 == 0) & (s2 == 0)) | ((np.abs(s1) == np.inf) & (np.abs(s2) == np.inf))
    out = np.where(both, np.uint32(0xFFC00000).view(F32), out)
    out = np.where(np.isnan(s1), _quiet(s1), out)
    return np.where(np.isnan(s2), _quiet(s2), out).astype(F32)


def _quiet(x: np.ndarray) -> np.ndarray:
    return (np.asarray(x, F32).view(U32) | U32(0x400000)).view(F32)


@op("v_div_scale_f32")
def _scale(ctx: Ctx, w: Wave, i: Instruction) -> None:
    mask = w.exec_mask()
    s0, s1, s2 = (source(w, i.operands[k], "f32") for k in (2, 3, 4))
    with np.errstate(all="ignore"):
        d, vcc = div_scale(s0, s1, s2)
    w.write_vector(i.operands[0], d.view(U32), mask)
    w.write_scalar(i.operands[1], mask_to_bits(vcc & mask))


@op("v_div_fmas_f32")
def _fmas(ctx: Ctx, w: Wave, i: Instruction) -> None:
    s0, s1, s2 = (source(w, i.operands[k], "f32") for k in (1, 2, 3))
    vcc = bits_to_mask(w.s64(VCC))
    with np.errstate(all="ignore"):
        d = div_fmas(s0, s1, s2, vcc)
    w.write_vector(i.operands[0], d.view(U32), w.exec_mask())


@op("v_div_fixup_f32")
def _fixup(ctx: Ctx, w: Wave, i: Instruction) -> None:
    s0, s1, s2 = (source(w, i.operands[k], "f32") for k in (1, 2, 3))
    with np.errstate(all="ignore"):
        d = div_fixup(s0, s1, s2)
    w.write_vector(i.operands[0], d.view(U32), w.exec_mask())
