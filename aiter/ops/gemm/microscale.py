"""OCP microscaling (MX) formats on the host: quantizers to MXFP4 and MXFP8, and the
dequantization the MX GEMMs are checked against.

The rules are the OCP Microscaling Formats (MX) v1.0 specification's:

- a block is 32 consecutive elements along the last dimension (K), sharing one scale X;
- X is an E8M0 power of two, 2 ** (code - 127) for codes 0..254, code 255 being NaN
  (section 5.4);
- X = 2 ** (floor(log2(amax)) - emax_elem), amax the block's largest magnitude and emax_elem
  the exponent of the element format's largest normal: 2 for FP4 E2M1 (6.0 = 1.5 * 2**2), 8
  for FP8 E4M3 (448 = 1.75 * 2**8) (section 6.3, "Conversion from vector of FP32 to MX");
- each element is V / X rounded to the nearest element value, ties to even, and values past
  the format's largest magnitude clamp to it (saturation, section 6.3);
- a block holding NaN or infinity gets the NaN scale; an all-zero block gets code 0.

MXFP4 packs two E2M1 codes per byte, the element of even K in the low nibble (torch's
float4_e2m1fn_x2). Scales are returned as torch.float8_e8m0fnu, shape [..., K / 32].
"""

from __future__ import annotations

import torch

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 0xFF
# Exponent of the largest normal of each element format.
EMAX = {"fp4": 2, "fp8": 8}
# E2M1 magnitudes by code (bit 3 is the sign): 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = torch.tensor(E2M1_MAGNITUDES)
FP4_MAX, FP8_MAX = 6.0, 448.0


def _check(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {_describe(x)}")
    if x.dim() < 1 or x.shape[-1] % BLOCK:
        raise ValueError(
            f"{name}: the last dimension (K) must be a multiple of the MX block of {BLOCK}, "
            f"got shape {tuple(x.shape)}"
        )


def _describe(x) -> str:
    return f"{x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__


def _blocks(x: torch.Tensor) -> torch.Tensor:
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def shared_scale_codes(blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """E8M0 codes (uint8) of blocks [..., nblocks, 32] for the element format `fmt`."""
    amax = blocks.abs().amax(dim=-1)
    _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1): floor(log2) + 1
    shared = (exponent - 1 - EMAX[fmt]).clamp(-E8M0_BIAS, E8M0_BIAS)
    codes = (shared + E8M0_BIAS).to(torch.int32)
    codes = torch.where(amax == 0, torch.zeros_like(codes), codes)
    bad = ~torch.isfinite(blocks).all(dim=-1)
    return torch.where(bad, torch.full_like(codes, E8M0_NAN), codes).to(torch.uint8)


def scale_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 2 ** (code - 127) of E8M0 codes (uint8 or float8_e8m0fnu); NaN for 255."""
    raw = codes.view(torch.uint8) if codes.dtype != torch.uint8 else codes
    values = torch.ldexp(torch.ones_like(raw, dtype=torch.float32), raw.to(torch.int32) - 127)
    return torch.where(raw == E8M0_NAN, torch.full_like(values, float("nan")), values)


def _scaled(blocks: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """V / X per block: exact, X being a power of two."""
    shift = codes.to(torch.int32) - E8M0_BIAS
    return torch.ldexp(blocks, -shift.unsqueeze(-1).expand_as(blocks))


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (uint8) of float values: nearest magnitude, ties to the even code,
    saturated at 6; the sign in bit 3 (negative zero keeps it)."""
    magnitude = values.abs().clamp(max=FP4_MAX)
    # Tables made on the input's device (in a dry run, fake tensors); no ellipsis indexing here:
    # a dry run refuses it.
    table = torch.tensor(E2M1_MAGNITUDES, device=values.device)
    distance = (magnitude.unsqueeze(-1) - table).abs()
    nearest = distance == distance.amin(dim=-1, keepdim=True)
    even = (torch.arange(8, device=values.device) % 2 == 0).to(torch.int32)
    code = (nearest.to(torch.int32) * (1 + even)).argmax(dim=-1)  # a tie picks the even code
    return (code | torch.signbit(values).to(torch.int64) << 3).to(torch.uint8)


def mxfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (packed E2M1 [..., K / 2] as torch.float4_e2m1fn_x2, E8M0 scales
    [..., K / 32] as torch.float8_e8m0fnu), by the OCP MX rules above. Elements of a NaN
    block are 0 (their scale carries the NaN)."""
    _check(x, "x")
    blocks = _blocks(x)
    codes = shared_scale_codes(blocks, "fp4")
    scaled = torch.nan_to_num(_scaled(blocks, codes), nan=0.0, posinf=0.0, neginf=0.0)
    elements = e2m1_codes(scaled).reshape(*x.shape[:-1], x.shape[-1])
    pairs = elements.reshape(*elements.shape[:-1], -1, 2)
    packed = pairs.select(-1, 0) | pairs.select(-1, 1) << 4
    return packed.view(torch.float4_e2m1fn_x2), codes.view(torch.float8_e8m0fnu)


def mxfp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (OCP E4M3 elements [..., K] as torch.float8_e4m3fn, E8M0 scales
    [..., K / 32] as torch.float8_e8m0fnu), by the OCP MX rules above (torch's E4M3 cast
    rounds to nearest even and saturates at 448)."""
    _check(x, "x")
    blocks = _blocks(x)
    codes = shared_scale_codes(blocks, "fp8")
    scaled = torch.nan_to_num(_scaled(blocks, codes), nan=0.0, posinf=0.0, neginf=0.0)
    elements = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return elements.reshape(x.shape), codes.view(torch.float8_e8m0fnu)


def e2m1_values(packed: torch.Tensor) -> torch.Tensor:
    """float32 [..., 2 * n] of packed E2M1 [..., n] (uint8 or float4_e2m1fn_x2)."""
    raw = packed.view(torch.uint8)
    codes = torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(*raw.shape[:-1], -1)
    # Code e m (2 exponent bits, 1 mantissa bit): 0.5 m when e = 0, else 2^(e-1) (1 + m / 2).
    exponent, mantissa = ((codes >> 1) & 3).to(torch.int32), (codes & 1).to(torch.float32)
    normal = torch.ldexp(1.0 + 0.5 * mantissa, exponent - 1)
    magnitude = torch.where(exponent == 0, 0.5 * mantissa, normal)
    return torch.where(codes >= 8, -magnitude, magnitude)


def mx_dequantize(elements: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 elements times their block's scale: the reference of the MX GEMMs. `elements`
    is packed E2M1 ([..., K / 2]) or E4M3 ([..., K]); `scales` [..., K / 32]."""
    if elements.dtype in (torch.float4_e2m1fn_x2, torch.uint8):
        values = e2m1_values(elements)
    else:
        values = elements.float()
    blocks = values.reshape(*values.shape[:-1], values.shape[-1] // BLOCK, BLOCK)
    return (blocks * scale_values(scales).unsqueeze(-1)).reshape(values.shape)
