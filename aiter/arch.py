"""The GPU archs aiter builds for, their devices and traits, and GPU_ARCHS parsing.

Everything arch-specific that host code needs (MMA kind, wave size, fp8 flavour) is answered here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ArchInfo:
    name: str
    family: str
    devices: Mapping[str, int]  # device name -> CU count
    default_cu_num: int
    fp8_dtype_name: str  # torch dtype attribute name
    mma: str  # "mfma" (matrix cores, wave64) or "wmma" (wave32)
    wave_size: int
    elf_mach: int  # EF_AMDGPU_MACH: the low byte of a code object's ELF e_flags

    @property
    def fp8_dtype(self) -> torch.dtype:
        # Imported here so that reading the registry (e.g. to check a cache) stays torch-free.
        import torch

        return getattr(torch, self.fp8_dtype_name)

    @property
    def cu_nums(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.devices.values())))


ARCHS: Mapping[str, ArchInfo] = MappingProxyType(
    {
        "gfx942": ArchInfo(
            name="gfx942",
            family="CDNA3",
            devices=MappingProxyType({"MI300X": 304, "MI325X": 304, "MI300A": 228, "MI308X": 80}),
            default_cu_num=304,
            fp8_dtype_name="float8_e4m3fnuz",
            mma="mfma",
            wave_size=64,
            elf_mach=0x4C,
        ),
        "gfx950": ArchInfo(
            name="gfx950",
            family="CDNA4",
            devices=MappingProxyType({"MI350X": 256, "MI355X": 256}),
            default_cu_num=256,
            fp8_dtype_name="float8_e4m3fn",
            mma="mfma",
            wave_size=64,
            elf_mach=0x4F,
        ),
        # No gfx1250 part was measurable here; 256 CUs is an assumption that GPU_ARCHS
        # (gfx1250:<cu_num>) or a tuned table row overrides.
        "gfx1250": ArchInfo(
            name="gfx1250",
            family="CDNA5",
            devices=MappingProxyType({"gfx1250": 256}),
            default_cu_num=256,
            fp8_dtype_name="float8_e4m3fn",
            mma="wmma",
            wave_size=32,
            elf_mach=0x49,
        ),
    }
)


# aiter's rule for its older tuned tables, written before they had a gfx column (aiter's
# chip_info.gfx_from_cu_num): each of these CU counts was only ever tuned on one arch. Newer archs
# that share a count (gfx1250 reports 256 too) are always written with their gfx.
LEGACY_CU_NUM_ARCHS: Mapping[int, str] = MappingProxyType(
    {256: "gfx950", 80: "gfx942", 304: "gfx942"}
)


def arch_of_legacy_row(cells: Mapping[str, str]) -> str:
    """The gfx of a tuned-table row written without one, from its cu_num by aiter's rule;
    ValueError saying why when the rule names no arch for it."""
    text = cells.get("cu_num", "")
    try:
        cu_num = int(float(text))
    except ValueError:
        raise ValueError(f"its cu_num {text!r} is not a CU count to derive it from") from None
    arch = LEGACY_CU_NUM_ARCHS.get(cu_num)
    if arch is None:
        rule = ", ".join(f"{cu} -> {a}" for cu, a in LEGACY_CU_NUM_ARCHS.items())
        raise ValueError(
            f"aiter's rule for tables without one ({rule}) names no arch for cu_num {cu_num}, "
            "which several archs may report: add a gfx column"
        )
    return arch


def get_arch(name: str) -> ArchInfo:
    """The registry entry for `name` (a feature suffix such as ':sramecc+' is ignored)."""
    base = name.strip().lower().split(":", 1)[0]
    try:
        return ARCHS[base]
    except KeyError:
        raise ValueError(f"unknown GPU arch {name!r}: expected one of {', '.join(ARCHS)}") from None


@dataclass(frozen=True)
class ArchTarget:
    """One arch to build for; cu_num None means every CU count the tables hold."""

    arch: str
    cu_num: int | None = None

    def __str__(self) -> str:
        return self.arch if self.cu_num is None else f"{self.arch}:{self.cu_num}"


_ARCH_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_FEATURE = re.compile(r"^[A-Za-z_]+[+-]$")  # target features such as sramecc+ or xnack-
MALFORMED_HINT = "expected 'gfxNNN' or 'gfxNNN:cu_num' (feature flags such as ':xnack-' allowed)"


def parse_gpu_archs(text: str, native: Callable[[], ArchTarget] | None = None) -> list[ArchTarget]:
    """Parse GPU_ARCHS: 'gfx942;gfx950', an optional ':cu_num' per arch, or 'native'.

    Target feature flags ('gfx942:sramecc+:xnack-') are accepted and ignored: kernels are built
    for the arch.

    `native` resolves the current machine's GPU; it is called only when the text asks for it.
    Entries may be separated by ';' or ','. Duplicates are dropped, order is kept.
    """
    targets: list[ArchTarget] = []
    entries = [e.strip() for e in re.split(r"[;,]", text) if e.strip()]
    if not entries:
        raise ValueError(f"GPU_ARCHS={text!r} names no arch: expected e.g. 'gfx942;gfx950'")
    for entry in entries:
        if entry.lower() == "native":
            if native is None:
                raise ValueError("GPU_ARCHS=native needs a visible GPU to resolve")
            target = native()
        else:
            name, *parts = entry.split(":")
            extra = [p for p in parts if not _FEATURE.match(p)]
            if not _ARCH_NAME.match(name) or len(extra) > 1:
                raise ValueError(f"GPU_ARCHS entry {entry!r} is malformed: {MALFORMED_HINT}")
            arch = get_arch(name).name
            cu_num = None
            if extra:
                cu_text = extra[0]
                if not cu_text.isdigit() or int(cu_text) <= 0:
                    raise ValueError(
                        f"GPU_ARCHS entry {entry!r}: cu_num must be a positive integer, "
                        f"got {cu_text!r}"
                    )
                cu_num = int(cu_text)
            target = ArchTarget(arch, cu_num)
        if target not in targets:
            targets.append(target)
    return targets
