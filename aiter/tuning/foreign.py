"""Rows aiter's tuners write for backends other than this library's kernels: the backends their
cells name, and what aiter's own FlyDSL kernel names state (tile, split-K, flags). No torch.

A table is a fact about a deployment: each row's shape is served here by this library's choice
(a kernel the row's name maps onto, else the family's heuristic), and the dispatch record says
which backend the row named and why it was served otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FLYDSL = "flydsl"
TORCH = "torch"
# Every `libtype` aiter's GEMM tuners write (aiter/utility/base_tuner.py and the tuned files).
AITER_LIBTYPES = (
    FLYDSL,
    TORCH,
    "asm",
    "ck",
    "cktile",
    "triton",
    "opus",
    "hipblaslt",
    "rocblas",
    "skinny",
)

# aiter's tuned tables of operators no family of this library serves yet: the base name of the
# files (as aiter's runtime finds them, also inside model_configs/ names) -> why.
UNSERVED_AITER_TABLES = {
    "tuned_grouped_fmoe": "aiter's grouped fused MoE; no family here serves grouped MoE yet",
    "tuned_fhmoe": (
        "aiter's fused heterogeneous MoE (shared experts); no family here serves it yet"
    ),
    "a8w8_tuned_batched_gemm": "aiter's batched int8/fp8 GEMM; no family here serves batched GEMM",
    "bf16_tuned_batched_gemm": "aiter's batched bf16 GEMM; no family here serves batched GEMM",
    "batched_gemm_a8w8_blockscale_mxscale_tuned": (
        "aiter's batched MX-scaled blockscale GEMM; no family here serves batched GEMM"
    ),
}


def unserved_aiter_table(file_name: str, served: tuple[str, ...] = ()) -> str | None:
    """Why no family of this library reads a file of aiter's tables, when its name holds the
    base name of one in UNSERVED_AITER_TABLES and no longer one of `served` (the aiter names of
    the tables this library reads); None otherwise."""
    unserved = [name for name in UNSERVED_AITER_TABLES if name in file_name]
    if not unserved:
        return None
    name = max(unserved, key=len)
    if any(len(other) > len(name) and other in file_name for other in served):
        return None
    return f"{name}: {UNSERVED_AITER_TABLES[name]}"


# aiter's FlyDSL names carry the tile as `t<m>x<n>x<k>` (or a bare `<m>x<n>x<k>` after the
# kernel's kind), the K split as `split_k<s>` or `sk<s>`, and flags as `<flag>True|False`.
_TILE = re.compile(r"(?:^|_)t?(\d+)x(\d+)x(\d+)(?=_|$)")
_SPLIT_K = re.compile(r"(?:^|_)(?:split_k|sk)(\d+)(?=_|$)")
_FLAG = re.compile(r"(?:^|_)([a-z][a-z_]*?)(True|False)(?=_|$)")
_ARCH = re.compile(r"(?:^|_)(gfx\d+[a-z]?)$")


@dataclass(frozen=True)
class AiterKernelName:
    """What an aiter FlyDSL kernel name states; None where the name does not say."""

    name: str
    tile: tuple[int, int, int] | None
    split_k: int | None
    flags: dict[str, bool] = field(default_factory=dict)
    arch: str | None = None

    def describe(self) -> str:
        parts = []
        if self.tile is not None:
            parts.append("tile {}x{}x{}".format(*self.tile))
        if self.split_k is not None:
            parts.append(f"split-K {self.split_k}")
        parts += [f"{flag}={value}" for flag, value in sorted(self.flags.items())]
        return ", ".join(parts) or "nothing this library reads"


def parse_aiter_flydsl_name(name: str) -> AiterKernelName:
    """The tile, split-K, flags and arch an aiter FlyDSL kernel name states, e.g.
    `flydsl_gemm4_abf16_wbf16_bf16_t32x64x128_split_k4_..._async_copyTrue_..._gfx950`."""
    text = name.strip()
    tile = _TILE.search(text)
    split = _SPLIT_K.search(text)
    arch = _ARCH.search(text)
    flags = {m[1]: m[2] == "True" for m in _FLAG.finditer(text)}
    return AiterKernelName(
        text,
        tuple(int(g) for g in tile.groups()) if tile else None,  # type: ignore[arg-type]
        int(split[1]) if split else None,
        flags,
        arch[1] if arch else None,
    )


def kernel_backend(name: str) -> str:
    """The backend a stage kernel name of aiter's MoE tables belongs to: `flydsl` for FlyDSL
    names, `asm` for aiter's assembly kernels (mangled `_ZN5aiter...`), `ck` for Composable
    Kernel stages, `planner` for an empty cell (the runtime chooses)."""
    text = name.strip()
    if not text:
        return "planner"
    if text.startswith("flydsl"):
        return FLYDSL
    if text.startswith("_Z"):
        return "asm"
    if "ck" in text.split("_")[0] or text.startswith("moe_ck"):
        return "ck"
    return "other"
