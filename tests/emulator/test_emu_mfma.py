"""Each MFMA form on random inputs, one instruction, against a reference that places matrices
into lanes by the documented layout and multiplies with torch in float64.

Layouts (CDNA3/CDNA4 ISA, "Matrix Fused Multiply Add"; AMD matrix instruction calculator): an
MxMxK MFMA holds P = K * M / 64 elements of A per lane, A[i][k] in lane i + M * (k // P) at
element k % P, B[k][j] in lane j + M * (k // P); D 16x16: D[i][j] in lane j + 16 * (i // 4),
register i % 4; D 32x32: lane j + 32 * ((i // 4) % 2), register 4 * (i // 8) + i % 4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.emulator.harness import run

A_ROW, B_ROW, C_ROW, D_ROW, SA_ROW, SB_ROW = 10, 30, 50, 70, 100, 101


def _place(codes: np.ndarray, m: int, bits: int) -> np.ndarray:
    """codes [m, K] (A, or B transposed) -> uint32 [dwords, 64] in the operand layout."""
    k = codes.shape[1]
    per_lane = k * m // 64
    lanes = np.zeros((64, per_lane), np.int64)
    for lane in range(64):
        row, group = lane % m, lane // m
        lanes[lane] = codes[row, group * per_lane : (group + 1) * per_lane]
    dwords = per_lane * bits // 32
    out = np.zeros((dwords, 64), np.uint32)
    for lane in range(64):
        packed = 0
        for e, code in enumerate(lanes[lane]):
            packed |= (int(code) & ((1 << bits) - 1)) << (bits * e)
        for d in range(dwords):
            out[d, lane] = (packed >> (32 * d)) & 0xFFFFFFFF
    return out


def _d_from_lanes(raw: np.ndarray, m: int) -> np.ndarray:
    d = np.zeros((m, m), raw.dtype)
    for r in range(raw.shape[0]):
        for lane in range(64):
            i = 4 * (lane // 16) + r if m == 16 else 8 * (r // 4) + 4 * ((lane // 32) % 2) + r % 4
            d[i, lane % m] = raw[r, lane]
    return d


def _to_lanes(d: np.ndarray, m: int) -> np.ndarray:
    regs = m * m // 64
    out = np.zeros((regs, 64), d.dtype)
    for r in range(regs):
        for lane in range(64):
            i = 4 * (lane // 16) + r if m == 16 else 8 * (r // 4) + 4 * ((lane // 32) % 2) + r % 4
            out[r, lane] = d[i, lane % m]
    return out


def _run_mfma(line: str, a_raw, b_raw, c_raw, arch: str, scales=None):
    def setup(w):
        w.vgpr[A_ROW : A_ROW + a_raw.shape[0]] = a_raw
        w.vgpr[B_ROW : B_ROW + b_raw.shape[0]] = b_raw
        w.vgpr[C_ROW : C_ROW + c_raw.shape[0]] = c_raw
        if scales is not None:
            w.vgpr[SA_ROW], w.vgpr[SB_ROW] = scales

    r = run([line, "s_endpgm"], setup=setup, arch=arch)
    return r.waves[0].vgpr[D_ROW : D_ROW + c_raw.shape[0]]


def _reg(row: int, n: int) -> str:
    return f"v[{row}:{row + n - 1}]"


FLOAT_FORMS = [
    ("v_mfma_f32_16x16x16_bf16", 16, 16, torch.bfloat16, "gfx942"),
    ("v_mfma_f32_16x16x16_f16", 16, 16, torch.float16, "gfx942"),
    ("v_mfma_f32_16x16x32_bf16", 16, 32, torch.bfloat16, "gfx950"),
    ("v_mfma_f32_16x16x32_f16", 16, 32, torch.float16, "gfx950"),
    ("v_mfma_f32_16x16x32_fp8_fp8", 16, 32, torch.float8_e4m3fnuz, "gfx942"),
    ("v_mfma_f32_16x16x32_fp8_fp8", 16, 32, torch.float8_e4m3fn, "gfx950"),
    ("v_mfma_f32_16x16x32_bf8_bf8", 16, 32, torch.float8_e5m2fnuz, "gfx942"),
    ("v_mfma_f32_32x32x16_fp8_fp8", 32, 16, torch.float8_e4m3fn, "gfx950"),
    ("v_mfma_f32_32x32x8_bf16", 32, 8, torch.bfloat16, "gfx942"),
]


@pytest.mark.parametrize("mnemonic, m, k, dtype, arch", FLOAT_FORMS)
def test_float_mfma_matches_the_documented_layout(mnemonic, m, k, dtype, arch) -> None:
    """Rule: D = A @ B + C with fp32 accumulation, operands in the documented lane layout; the
    fp8 forms read FNUZ codes on gfx942 and OCP codes on gfx950 (LLVM AMDGPUUsage, gfx950
    "FP8 and BF8 use the OCP formats")."""
    gen = torch.Generator().manual_seed(k + m)
    a = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    b = (torch.randn(m, k, generator=gen) * 2).to(dtype)  # B transposed: [n, k]
    c = torch.randn(m, m, generator=gen)
    bits = 8 * a.element_size()
    view = torch.uint8 if bits == 8 else torch.int16
    a_raw = _place(a.view(view).numpy().astype(np.int64), m, bits)
    b_raw = _place(b.view(view).numpy().astype(np.int64), m, bits)
    c_raw = _to_lanes(c.numpy(), m).view(np.uint32)
    line = (f"{mnemonic} {_reg(D_ROW, c_raw.shape[0])}, {_reg(A_ROW, a_raw.shape[0])}, "
            f"{_reg(B_ROW, b_raw.shape[0])}, {_reg(C_ROW, c_raw.shape[0])}")  # fmt: skip
    got = _d_from_lanes(_run_mfma(line, a_raw, b_raw, c_raw, arch).view(np.float32), m)
    ref = (a.double() @ b.double().T + c.double()).float().numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mnemonic, k, arch", [("v_mfma_i32_16x16x32_i8", 32, "gfx942"),
                                               ("v_mfma_i32_16x16x64_i8", 64, "gfx950")])  # fmt: skip
def test_int8_mfma_accumulates_exactly_in_i32(mnemonic, k, arch) -> None:
    """Rule: the i8 forms multiply signed bytes and accumulate exactly into i32 (CDNA3 ISA
    V_MFMA_I32_16X16X32_I8; CDNA4 V_MFMA_I32_16X16X64_I8)."""
    rng = np.random.default_rng(k)
    a, b = rng.integers(-128, 128, (16, k)), rng.integers(-128, 128, (16, k))
    c = rng.integers(-(2**20), 2**20, (16, 16))
    c_raw = _to_lanes(c, 16).astype(np.int32).view(np.uint32)
    a_raw, b_raw = _place(a, 16, 8), _place(b, 16, 8)
    line = (f"{mnemonic} {_reg(D_ROW, 4)}, {_reg(A_ROW, a_raw.shape[0])}, "
            f"{_reg(B_ROW, b_raw.shape[0])}, {_reg(C_ROW, 4)}")  # fmt: skip
    got = _d_from_lanes(_run_mfma(line, a_raw, b_raw, c_raw, arch).view(np.int32), 16)
    np.testing.assert_array_equal(got, a @ b.T + c)


# OCP MX element values, written out from the OCP Microscaling Formats spec v1.0, section 5.3.
def _mx_value(code: int, exp_bits: int, man_bits: int, bias: int) -> float:
    sign = -1.0 if code >> (exp_bits + man_bits) & 1 else 1.0
    exp = code >> man_bits & ((1 << exp_bits) - 1)
    man = code & ((1 << man_bits) - 1)
    if exp == 0:
        return sign * man / (1 << man_bits) * 2.0 ** (1 - bias)
    return sign * (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias)


_KINDS = {  # cbsz/blgp value, bits, value of a code
    "fp8": (0, 8, lambda c: torch.tensor([c], dtype=torch.uint8).view(torch.float8_e4m3fn).item()),
    "bf8": (1, 8, lambda c: torch.tensor([c], dtype=torch.uint8).view(torch.float8_e5m2).item()),
    "fp6": (2, 6, lambda c: _mx_value(c, 2, 3, 1)),
    "bf6": (3, 6, lambda c: _mx_value(c, 3, 2, 3)),
    "fp4": (4, 4, lambda c: _mx_value(c, 2, 1, 1)),
}


@pytest.mark.parametrize(
    "m, kind_a, kind_b, sel",
    [(16, "fp8", "fp8", (0, 0)), (16, "bf8", "fp4", (1, 2)), (16, "fp6", "bf6", (3, 0)),
     (32, "fp8", "fp8", (0, 0)), (32, "fp4", "fp6", (2, 1))],
)  # fmt: skip
def test_scaled_mfma_formats_and_e8m0_scales(m, kind_a, kind_b, sel) -> None:
    """Rule (gfx950): V_MFMA_SCALE_F32_{16X16X128,32X32X64}_F8F6F4 reads A in format cbsz and
    B in format blgp (0 fp8 e4m3, 1 bf8 e5m2, 2 fp6 e2m3, 3 bf6 e3m2, 4 fp4 e2m1; LLVM
    llvm.amdgcn.mfma.scale tests), packed densely per lane (6-bit elements straddle dwords), and
    each lane's 32 elements are multiplied by 2 ** (E8M0 - 127) from the scale operand byte
    op_sel[k] + 2 * op_sel_hi[k] (OCP MX spec: one E8M0 scale per block of 32)."""
    k = 128 if m == 16 else 64
    rng = np.random.default_rng(m + sel[0])
    mats, raws, scale_words, values = [], [], [], []
    for n, kind in enumerate((kind_a, kind_b)):
        code_of, bits, value_of = _KINDS[kind]
        codes = rng.integers(0, 1 << bits, (m, k))
        if bits == 8:
            table = np.array([value_of(c) for c in range(256)])
            codes = np.where(np.isfinite(table[codes]), codes, 0)  # no NaN/inf inputs
        table = np.array([value_of(c) for c in range(1 << bits)])
        mats.append(code_of)
        raws.append(_place(codes, m, bits))
        exps = rng.integers(120, 134, (m, k // 32))  # scale per (row, 32-block)
        word = np.zeros(64, np.uint32)
        for lane in range(64):
            word[lane] = int(exps[lane % m, lane // m]) << (8 * sel[n]) | 0x7F << (8 * (3 - sel[n]))
        scale_words.append(word)
        values.append(table[codes] * np.repeat(2.0 ** (exps - 127), 32, axis=1))
    c = rng.standard_normal((m, m))
    c_raw = _to_lanes(c.astype(np.float32), m).view(np.uint32)
    op_sel = f"op_sel:[{sel[0] & 1},{sel[1] & 1},0] op_sel_hi:[{sel[0] >> 1},{sel[1] >> 1},0]"
    line = (f"v_mfma_scale_f32_{m}x{m}x{k}_f8f6f4 {_reg(D_ROW, c_raw.shape[0])}, "
            f"{_reg(A_ROW, raws[0].shape[0])}, {_reg(B_ROW, raws[1].shape[0])}, "
            f"{_reg(C_ROW, c_raw.shape[0])}, v{SA_ROW}, v{SB_ROW} {op_sel} "
            f"cbsz:{mats[0]} blgp:{mats[1]}")  # fmt: skip
    got = _run_mfma(line, raws[0], raws[1], c_raw, "gfx950", scales=scale_words)
    got = _d_from_lanes(got.view(np.float32), m)
    ref = values[0] @ values[1].T + c.astype(np.float32)
    np.testing.assert_allclose(got, ref.astype(np.float32), rtol=1e-6, atol=1e-5)
