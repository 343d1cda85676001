"""fp8/bf8 formats and conversions per arch (FNUZ on gfx942, OCP on gfx950), checked code by code
against torch's float8 dtypes where their semantics agree, and on the rules where they do not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiter.emulator.ops.minifloat import E4M3_FNUZ, E4M3_OCP, E5M2_FNUZ, E5M2_OCP
from tests.emulator.harness import run

FORMATS = [
    (E4M3_FNUZ, torch.float8_e4m3fnuz),
    (E5M2_FNUZ, torch.float8_e5m2fnuz),
    (E4M3_OCP, torch.float8_e4m3fn),
    (E5M2_OCP, torch.float8_e5m2),
]


def _torch_values(dtype: torch.dtype) -> np.ndarray:
    return torch.arange(256, dtype=torch.uint8).view(dtype).float().numpy()


@pytest.mark.parametrize("fmt, dtype", FORMATS, ids=lambda f: getattr(f, "name", ""))
def test_every_code_decodes_as_torch_does(fmt, dtype) -> None:
    """Rule: e4m3fnuz has bias 8, no inf and the single NaN 0x80; e5m2fnuz bias 16, NaN 0x80
    (AMD CDNA3 ISA, "FP8/BF8"; LLVM APFloat Float8E4M3FNUZ/Float8E5M2FNUZ); OCP e4m3fn bias 7,
    NaN S.1111.111, no inf; OCP e5m2 bias 15 with IEEE inf/NaN (OCP 8-bit FP spec v1.0).
    torch's float8 dtypes implement the same four formats."""
    ours = fmt.decode(np.arange(256))
    ref = _torch_values(dtype)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    np.testing.assert_array_equal(ours[~np.isnan(ours)], ref[~np.isnan(ref)])


@pytest.mark.parametrize("fmt, dtype", FORMATS, ids=lambda f: getattr(f, "name", ""))
def test_in_range_values_round_to_nearest_even_like_torch(fmt, dtype) -> None:
    """Rule: f32 -> fp8 rounds to nearest, ties to even, subnormals kept (CDNA3 ISA,
    V_CVT_PK_FP8_F32 sets ROUND_MODE = ROUND_NEAREST_EVEN; no denormal flush for fp8). Inside
    the format's range torch rounds the same way; ties are forced by using exact midpoints."""
    rng = np.random.default_rng(0)
    finite = fmt.decode(np.arange(256))
    finite = np.unique(np.abs(finite[np.isfinite(finite)]))
    mids = (finite[:-1] + finite[1:]) / 2  # exact ties, subnormal range included
    values = np.concatenate([
        rng.uniform(-fmt.max, fmt.max, 4000), mids, -mids, finite, -finite,
        rng.uniform(-4, 4, 2000) * 2.0 ** rng.integers(-20, 0, 2000),
    ]).astype(np.float32)  # fmt: skip
    ours = fmt.encode(values)
    ref = torch.from_numpy(values).to(dtype).view(torch.uint8).numpy()
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize(
    "fmt, value, code",
    [
        (E4M3_FNUZ, 247.9, 0x7F),  # below max + half a step: the maximum 240
        (E4M3_FNUZ, 248.0, 0x80),  # the tie: 240 has an odd mantissa, so it rounds up: NaN
        (E4M3_FNUZ, 1e9, 0x80),
        (E4M3_FNUZ, float("inf"), 0x80),  # FNUZ has no inf
        (E4M3_FNUZ, -0.0, 0x00),  # FNUZ has no negative zero (0x80 is NaN)
        (E4M3_FNUZ, -(2.0**-12), 0x00),  # rounds to zero, positive
        (E4M3_FNUZ, 2.0**-10, 0x01),  # the smallest subnormal is kept
        (E4M3_OCP, 464.0, 0x7E),  # tie at 448 + 16: 448's mantissa is even, stays 448
        (E4M3_OCP, 465.0, 0x7F),  # past it: NaN (torch saturates to 0x7E here)
        (E4M3_OCP, -1e9, 0xFF),
        (E4M3_OCP, -0.0, 0x80),
        (E5M2_OCP, 61439.0, 0x7B),  # below 57344 + 4096: the maximum
        (E5M2_OCP, 61440.0, 0x7C),  # the tie rounds to even, past the maximum: inf
        (E5M2_FNUZ, 61440.0, 0x80),  # FNUZ bf8: NaN instead of inf
        (E5M2_FNUZ, float("nan"), 0x80),
    ],
)
def test_overflow_and_sign_rules(fmt, value: float, code: int) -> None:
    """Rule: the conversion does not saturate (ROCm/rocm-systems#9556, measured on MI300X and
    MI355X: 448 + 18 -> 0x7f on gfx950; triton-lang/triton#7327 quoting the CDNA4 ISA): a value
    rounds to nearest even among the codes and one virtual code past the maximum, which is NaN
    for E4M3 and the FNUZ formats and inf for OCP E5M2. torch's float8_e4m3fn cast saturates
    instead (465 -> 448), so this case is checked against the rule, not torch."""
    assert int(fmt.encode(np.array([value], np.float32))[0]) == code


def test_clamp_saturates() -> None:
    """Rule: with the VOP3 clamp bit the conversion saturates to +-max (CDNA3 ISA, "clamp" on
    the FP8 conversions); NaN stays NaN."""
    values = np.array([1e9, -1e9, 248.0, np.nan], np.float32)
    assert E4M3_FNUZ.encode(values, saturate=True).tolist() == [0x7F, 0xFF, 0x7F, 0x80]
    assert E5M2_OCP.encode(values[:2], saturate=True).tolist() == [0x7B, 0xFB]


def _f32(values) -> np.ndarray:
    return np.asarray(values, np.float32).view(np.uint32)


@pytest.mark.parametrize("arch, one", [("gfx942", 0x40), ("gfx950", 0x38)])
def test_cvt_pk_fp8_packs_in_the_arch_flavour_and_keeps_the_other_half(arch, one) -> None:
    """Rule: V_CVT_PK_FP8_F32 writes {cvt(S1), cvt(S0)} to D[15:0], or to D[31:16] with
    op_sel[3] (printed op_sel:[0,0,1]), keeping the other half (CDNA3/CDNA4 ISA pseudocode).
    1.0 is 0x40 in e4m3fnuz (bias 8) and 0x38 in e4m3fn (bias 7)."""

    def setup(w):
        w.vgpr[1] = _f32(np.full(64, 1.0))
        w.vgpr[2] = _f32(np.full(64, -2.0))
        w.vgpr[3] = 0xAABBCCDD
        w.vgpr[4] = 0xAABBCCDD

    r = run(
        ["v_cvt_pk_fp8_f32 v3, v1, v2", "v_cvt_pk_fp8_f32 v4, v1, v2 op_sel:[0,0,1]",
         "s_endpgm"], setup=setup, arch=arch,
    )  # fmt: skip
    minus_two = one + 0x08 | 0x80
    assert int(r.waves[0].vgpr[3, 0]) == 0xAABB0000 | minus_two << 8 | one
    assert int(r.waves[0].vgpr[4, 5]) == (minus_two << 8 | one) << 16 | 0xCCDD


@pytest.mark.parametrize("arch, dtype", [("gfx942", torch.float8_e4m3fnuz),
                                         ("gfx950", torch.float8_e4m3fn)])  # fmt: skip
def test_cvt_f32_fp8_sdwa_selects_the_byte(arch, dtype) -> None:
    """Rule: V_CVT_F32_FP8 converts byte SDWA_SRC0_SEL of S0 (byte 0 in the e32 form), exactly
    (CDNA3/CDNA4 ISA pseudocode); V_CVT_PK_F32_FP8 converts bytes 0 and 1 of the word src0_sel
    picks into two dwords."""
    codes = np.random.default_rng(1).integers(0, 256, (64, 4), dtype=np.uint8)

    def setup(w):
        w.vgpr[1] = codes.view("<u4")[:, 0]

    r = run(["v_cvt_f32_fp8_sdwa v2, v1 src0_sel:BYTE_2", "v_cvt_f32_fp8_e32 v3, v1",
             "v_cvt_pk_f32_fp8_sdwa v[4:5], v1 src0_sel:WORD_1", "s_endpgm"],
            setup=setup, arch=arch)  # fmt: skip
    values = torch.from_numpy(codes.copy()).view(dtype).float().numpy()
    got = r.waves[0].vgpr
    np.testing.assert_array_equal(got[2].view(np.float32), values[:, 2])
    np.testing.assert_array_equal(got[3].view(np.float32), values[:, 0])
    np.testing.assert_array_equal(got[4].view(np.float32), values[:, 2])
    np.testing.assert_array_equal(got[5].view(np.float32), values[:, 3])
