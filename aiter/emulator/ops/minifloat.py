"""The 8-, 6- and 4-bit float formats of CDNA3/CDNA4 (fp8/bf8 FNUZ on gfx942, OCP fp8/bf8 on
gfx950, OCP MX fp6/bf6/fp4 and the E8M0 scale) and exact conversions to and from f32.

Decoding uses a table of every code; encoding rounds to nearest even among the codes with an
overflow rule per format, vectorised over any array shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Format:
    """A sign-exponent-mantissa format of `bits` bits.

    fnuz: no negative zero and no infinity; the code 1000...0 is the only NaN (AMD FNUZ).
    ocp_nan_all_ones: the all-ones exponent and mantissa is NaN, nothing is inf (OCP E4M3).
    ieee: the all-ones exponent is inf (mantissa 0) or NaN (OCP E5M2).
    Formats with none of these have neither inf nor NaN (OCP MX FP6/FP4).
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    fnuz: bool = False
    ocp_nan_all_ones: bool = False
    ieee: bool = False

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @cached_property
    def table(self) -> np.ndarray:
        """f32 value of every code, indexed by code."""
        codes = np.arange(1 << self.bits)
        sign = np.where(codes & self.sign_bit, -1.0, 1.0)
        exp = (codes >> self.man_bits) & ((1 << self.exp_bits) - 1)
        man = codes & ((1 << self.man_bits) - 1)
        scale = 2.0 ** (np.maximum(exp, 1) - self.bias - self.man_bits)
        value = sign * np.where(exp > 0, man + (1 << self.man_bits), man) * scale
        top = (1 << self.exp_bits) - 1
        if self.fnuz:
            value[self.sign_bit] = np.nan
        elif self.ocp_nan_all_ones:
            value[(exp == top) & (man == (1 << self.man_bits) - 1)] = np.nan
        elif self.ieee:
            value[(exp == top) & (man == 0)] = sign[(exp == top) & (man == 0)] * np.inf
            value[(exp == top) & (man != 0)] = np.nan
        return value.astype(np.float32)

    @cached_property
    def _ladder(self) -> tuple[np.ndarray, np.ndarray]:
        """Non-negative finite values ascending with their codes, plus one virtual step past
        the maximum (code max + 1) that stands for overflow."""
        positive = self.table[: self.sign_bit].astype(np.float64)
        codes = np.flatnonzero(np.isfinite(positive))
        values = positive[codes]
        step = values[-1] - values[-2]
        return np.append(values, values[-1] + step), np.append(codes, codes[-1] + 1)

    @property
    def max(self) -> float:
        return float(self._ladder[0][-2])

    @property
    def nan_code(self) -> int:
        if self.fnuz:
            return self.sign_bit
        return self.sign_bit - 1  # OCP: exponent and mantissa all ones

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Codes (any integer array) -> f32 values."""
        mask = (1 << self.bits) - 1
        return self.table[np.asarray(codes).astype(np.int64) & mask]

    def encode(self, value: np.ndarray, saturate: bool = False) -> np.ndarray:
        """f32 -> codes (uint32), rounding to nearest even. Past the maximum: a value below
        max + half a step rounds to the maximum; beyond, NaN for formats without inf, inf for
        E5M2, or the maximum when `saturate`. NaN -> the NaN code; fnuz makes -0 +0."""
        x = np.asarray(value, np.float32).astype(np.float64)
        values, codes = self._ladder
        mag = np.abs(x)
        hi = np.clip(np.searchsorted(values, mag, side="left"), 1, len(values) - 1)
        lo_v, hi_v = values[hi - 1], values[hi]
        lo_c, hi_c = codes[hi - 1], codes[hi]
        exact = mag == values[np.minimum(hi, len(values) - 1)]
        below = mag - lo_v
        above = hi_v - mag
        take_hi = (above < below) | ((above == below) & (hi_c % 2 == 0))
        code = np.where(exact, hi_c, np.where(take_hi, hi_c, lo_c))
        code = np.where(mag == 0, 0, code)
        overflow = (code > codes[-2]) | np.isinf(x)
        if saturate:
            code = np.where(overflow, codes[-2], code)
        elif self.ieee:
            code = np.where(overflow, (1 << self.man_bits) * ((1 << self.exp_bits) - 1), code)
        else:
            code = np.where(overflow, -1, code)  # NaN, patched below
        neg = np.signbit(x)
        out = np.where(neg, code | self.sign_bit, code)
        if self.fnuz:
            out = np.where(neg & (code == 0), 0, out)  # no negative zero
        nan = np.isnan(x) | (code == -1)
        if self.fnuz or not (self.ieee or self.ocp_nan_all_ones):
            nan_code = np.full(x.shape, self.nan_code)
        else:
            nan_code = np.where(neg, self.nan_code | self.sign_bit, self.nan_code)
        if not (self.fnuz or self.ieee or self.ocp_nan_all_ones):
            nan = np.zeros(x.shape, bool)  # MX FP6/FP4 have no NaN: always saturate
            out = np.where(code == -1, codes[-2] | (neg * self.sign_bit), out)
        return np.where(nan, nan_code, out).astype(np.uint32)


E4M3_FNUZ = Format("e4m3fnuz", 4, 3, 8, fnuz=True)
E5M2_FNUZ = Format("e5m2fnuz", 5, 2, 16, fnuz=True)
E4M3_OCP = Format("e4m3fn", 4, 3, 7, ocp_nan_all_ones=True)
E5M2_OCP = Format("e5m2", 5, 2, 15, ieee=True)
E2M3 = Format("e2m3", 2, 3, 1)  # OCP MX FP6
E3M2 = Format("e3m2", 3, 2, 3)  # OCP MX BF6
E2M1 = Format("e2m1", 2, 1, 1)  # OCP MX FP4


def fp8_formats(arch: str) -> tuple[Format, Format]:
    """(fp8, bf8) of an arch: gfx942 (CDNA3) uses the FNUZ flavours, gfx950 (CDNA4) OCP."""
    if arch == "gfx942":
        return E4M3_FNUZ, E5M2_FNUZ
    return E4M3_OCP, E5M2_OCP


def e8m0_to_f32(codes: np.ndarray) -> np.ndarray:
    """OCP MX E8M0 scale: 2 ** (code - 127); 0xFF is NaN."""
    c = np.asarray(codes).astype(np.int64) & 0xFF
    return np.where(c == 0xFF, np.nan, np.ldexp(1.0, c - 127)).astype(np.float64)
