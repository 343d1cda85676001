"""The OCP MX quantizers (aiter.mxfp4_quantize, aiter.mxfp8_quantize) against the rules of the
OCP Microscaling Formats v1.0 specification, section 6.3: the shared scale from the block's
largest magnitude, elements rounded to nearest even, saturation, the NaN scale, and the
dequantization the MX GEMMs are checked against."""

from __future__ import annotations

import pytest
import torch

import aiter
from aiter.ops.gemm.microscale import E2M1_VALUES, e2m1_codes

GRID = E2M1_VALUES.tolist()


def _codes(scales: torch.Tensor) -> list[int]:
    return scales.view(torch.uint8).flatten().tolist()


def _block(values: list[float]) -> torch.Tensor:
    return torch.tensor(values + [0.0] * (32 - len(values)))[None, :]


def test_the_scale_is_the_blocks_exponent_less_the_formats_emax() -> None:
    """X = 2 ** (floor(log2(amax)) - emax): emax 2 for E2M1, 8 for E4M3."""
    x = torch.cat([_block([6.0 * 2.0**k, 2.0**k]) for k in (-3, 0, 5)], dim=1)
    _, s4 = aiter.mxfp4_quantize(x)
    _, s8 = aiter.mxfp8_quantize(x)
    # floor(log2(6 * 2**k)) = k + 2
    assert _codes(s4) == [127 - 3, 127, 127 + 5]
    assert _codes(s8) == [127 - 3 - 6, 127 - 6, 127 + 5 - 6]


def test_values_on_the_grid_come_back_exactly() -> None:
    signs = [1.0, -1.0]
    values = [s * v * 2.0**3 for v in GRID for s in signs]  # 16 values, amax 6 * 8
    x = torch.cat([_block(values), _block([v / 4 for v in values])], dim=1)
    packed, scales = aiter.mxfp4_quantize(x)
    assert packed.shape == (1, 32) and packed.dtype == torch.float4_e2m1fn_x2
    assert scales.shape == (1, 2) and scales.dtype == torch.float8_e8m0fnu
    assert torch.equal(aiter.mx_dequantize(packed, scales), x)
    elements, scales8 = aiter.mxfp8_quantize(x)
    assert torch.equal(aiter.mx_dequantize(elements, scales8), x)


def test_e2m1_rounds_to_nearest_even_and_saturates() -> None:
    halfway = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    # ties go to the even code: 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
    assert e2m1_codes(halfway).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert e2m1_codes(torch.tensor([0.26, 5.01, 7.9, 100.0])).tolist() == [1, 7, 7, 7]
    assert e2m1_codes(torch.tensor([-0.0, -3.0])).tolist() == [8, 8 | 5]
    # in a block: amax 7.9 gives X = 1 (floor(log2 7.9) = 2), and 7.9 saturates to 6
    packed, scales = aiter.mxfp4_quantize(_block([7.9, 1.25, -2.5]))
    assert _codes(scales) == [127]
    assert aiter.mx_dequantize(packed, scales)[0, :3].tolist() == [6.0, 1.0, -2.0]


def test_e4m3_elements_saturate_at_448() -> None:
    elements, scales = aiter.mxfp8_quantize(_block([500.0, -300.0, 1.0]))
    assert _codes(scales) == [127]  # floor(log2 500) = 8 = emax
    assert elements.float()[0, :3].tolist() == [448.0, -288.0, 1.0]


def test_zero_tiny_huge_and_nan_blocks() -> None:
    x = torch.cat([_block([0.0]), _block([1e-40]), _block([3e38]), _block([float("nan"), 1.0]),
                   _block([float("inf")]), _block([3.0])], dim=1)  # fmt: skip
    for quantize in (aiter.mxfp4_quantize, aiter.mxfp8_quantize):
        elements, scales = quantize(x)
        codes = _codes(scales)
        assert codes[0] == 0 and codes[1] == 0  # zero block; below 2**-127 clamps to code 0
        # floor(log2 3e38) = 127: the largest blocks keep their exponent
        assert codes[2] == 127 + 127 - (2 if quantize is aiter.mxfp4_quantize else 8)
        assert codes[3] == codes[4] == 255  # NaN and infinity: the NaN scale
        out = aiter.mx_dequantize(elements, scales)
        assert torch.isnan(out[0, 96:160]).all()
        assert out[0, 160] == 3.0 and out[0, 0] == 0.0


def test_dequantized_values_are_within_half_a_grid_step() -> None:
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0)) * 3
    packed, scales = aiter.mxfp4_quantize(x)
    got = aiter.mx_dequantize(packed, scales)
    step = torch.repeat_interleave(aiter.ops.gemm.microscale.scale_values(scales), 32, dim=1)
    # E2M1's widest step is 2 (between 4 and 6); past 6 saturation loses less than 2 more
    assert ((got - x).abs() <= 2 * step).all()
    inside = x.abs() <= 6 * step
    assert ((got - x).abs()[inside] <= step[inside]).all()


@pytest.mark.parametrize("bad, error", [(torch.zeros(2, 48), ValueError),
                                        (torch.zeros(2, 64, dtype=torch.int32), TypeError)])  # fmt: skip
def test_bad_input_names_the_argument(bad, error) -> None:
    for quantize in (aiter.mxfp4_quantize, aiter.mxfp8_quantize):
        with pytest.raises(error, match="x:"):
            quantize(bad)
