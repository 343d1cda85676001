"""Typed views of register lanes and the number-format conversions the semantics share
(bf16 rounding, 16-bit halves, 64-bit register pairs), all vectorised over lanes.
"""

from __future__ import annotations

import numpy as np

from aiter.emulator.decode import Instruction, Operand
from aiter.emulator.state import Wave

WORDS = {
    "b32": 1, "u32": 1, "i32": 1, "f32": 1, "f16": 1, "bf16": 1, "u16": 1, "i16": 1, "b16": 1,
    "u8": 1, "i8": 1, "u24": 1, "i24": 1,
    "b64": 2, "u64": 2, "i64": 2, "f64": 2,
}  # fmt: skip
FLOATS = ("f16", "bf16", "f32", "f64")


def pair(raw: np.ndarray) -> np.ndarray:
    """uint32 [2, n] (low dword first) -> uint64 [n]."""
    return raw[0].astype(np.uint64) | (raw[1].astype(np.uint64) << np.uint64(32))


def split(value: np.ndarray) -> np.ndarray:
    """uint64 [n] -> uint32 [2, n]."""
    value = value.astype(np.uint64)
    return np.stack([(value & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                     (value >> np.uint64(32)).astype(np.uint32)])  # fmt: skip


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(value: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 bits (uint32 holding 16 bits); NaN stays a quiet NaN."""
    bits = np.asarray(value, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(value, np.float32))
    return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint32)


def f16_bits(value: np.ndarray) -> np.ndarray:
    return np.asarray(value, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)


def typed(raw: np.ndarray, t: str, hi: bool = False) -> np.ndarray:
    """Lanes of uint32 [words, n] as type `t` (16-bit types from the high half when `hi`)."""
    if WORDS[t] == 2:
        u64 = pair(raw)
        return {"f64": u64.view(np.float64), "i64": u64.view(np.int64)}.get(t, u64)
    u = raw[0]
    if t in ("f16", "bf16", "u16", "i16", "b16"):
        half = ((u >> np.uint32(16)) if hi else u) & np.uint32(0xFFFF)
        if t == "f16":
            return half.astype(np.uint16).view(np.float16)
        if t == "bf16":
            return bf16_to_f32(half)
        if t == "i16":
            return half.astype(np.uint16).view(np.int16)
        return half
    if t == "f32":
        return u.view(np.float32)
    if t == "i32":
        return u.view(np.int32)
    if t == "u24":
        return u & np.uint32(0xFFFFFF)
    if t == "i24":
        return ((u << np.uint32(8)).view(np.int32) >> 8).astype(np.int32)
    return u


def words_of(value: np.ndarray, t: str) -> np.ndarray:
    """A result of type `t` as uint32 [words, n]."""
    if WORDS[t] == 2:
        if t == "f64":
            return split(np.asarray(value, np.float64).view(np.uint64))
        return split(np.asarray(value).astype(np.int64).view(np.uint64))
    if t == "f32":
        return np.asarray(value, np.float32).view(np.uint32)[None, :]
    if t == "f16":
        return f16_bits(value)[None, :]
    if t == "bf16":
        return f32_to_bf16(value)[None, :]
    if t in ("u16", "i16", "b16"):
        return (np.asarray(value).astype(np.int64) & 0xFFFF).astype(np.uint32)[None, :]
    return np.asarray(value).astype(np.int64).astype(np.uint32)[None, :]


def source(w: Wave, op: Operand, t: str, hi: bool = False) -> np.ndarray:
    """A VALU source of type `t` with its abs/neg input modifiers applied."""
    raw = w.read_vector(op, WORDS[t], t if t in FLOATS else None)
    value = typed(raw, t, hi)
    if op.abs:
        value = np.abs(value)
    if op.neg:
        value = -value
    return value


def op_sel(inst: Instruction, name: str = "op_sel") -> list[int]:
    """The bits of op_sel:[a,b,...] (zeros when absent)."""
    text = inst.mod(name)
    if not text:
        return [0, 0, 0, 0]
    bits = [int(b) for b in text.strip("[]").split(",")]
    return bits + [0] * (4 - len(bits))


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c rounded once to f32, as a fused multiply-add does.

    The f64 product of two f32 values is exact; the f64 sum is made round-to-odd (its error,
    found by TwoSum, nudges an even result one f64 ulp toward the exact value), and a
    round-to-odd value with 29 spare bits rounds to f32 exactly as the exact sum would.
    """
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    product = a64 * b64
    addend = np.asarray(c, np.float64)
    total = product + addend
    back = total - product
    err = (product - (total - back)) + (addend - back)
    even = (total.view(np.uint64) & np.uint64(1)) == 0
    nudge = (err != 0) & even & np.isfinite(total)
    toward = np.where(err > 0, np.inf, -np.inf)
    total = np.where(nudge, np.nextafter(total, toward), total)
    return total.astype(np.float32)
