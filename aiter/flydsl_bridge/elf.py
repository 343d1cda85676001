"""Header facts of AMDGPU code objects (HSACO ELF files): machine and target arch, and an
optional disassembly through an installed llvm-objdump that knows the arch.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass

from aiter.arch import ARCHS

EM_AMDGPU = 224
# Low byte of e_flags (EF_AMDGPU_MACH) for the archs aiter builds; aiter/arch.py declares them.
ARCH_TO_MACH: dict[str, int] = {name: info.elf_mach for name, info in ARCHS.items()}
MACH_TO_ARCH: dict[int, str] = {mach: arch for arch, mach in ARCH_TO_MACH.items()}
EF_AMDGPU_MACH_MASK = 0xFF

_ELF64_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")


@dataclass(frozen=True)
class ElfHeader:
    e_machine: int
    e_flags: int

    @property
    def is_amdgpu(self) -> bool:
        return self.e_machine == EM_AMDGPU

    @property
    def mach(self) -> int:
        return self.e_flags & EF_AMDGPU_MACH_MASK

    @property
    def arch(self) -> str | None:
        """The gfx arch the code object targets, or None for a machine aiter does not build."""
        return MACH_TO_ARCH.get(self.mach) if self.is_amdgpu else None


def parse_header(code: bytes) -> ElfHeader:
    """Read e_machine and e_flags of a little-endian ELF64 file (what HSACO always is)."""
    if len(code) < _ELF64_HEADER.size or code[:4] != b"\x7fELF":
        raise ValueError(f"code: expected an ELF file, got {len(code)} bytes starting {code[:4]!r}")
    if code[4] != 2 or code[5] != 1:
        raise ValueError(
            f"code: expected a little-endian ELF64 file (EI_CLASS 2, EI_DATA 1), "
            f"got EI_CLASS {code[4]}, EI_DATA {code[5]}"
        )
    fields = _ELF64_HEADER.unpack_from(code, 0)
    return ElfHeader(e_machine=fields[2], e_flags=fields[7])


def code_object_arch(code: bytes) -> str:
    """The gfx arch of an AMDGPU code object; ValueError for anything else."""
    header = parse_header(code)
    if not header.is_amdgpu:
        raise ValueError(
            f"code: expected e_machine {EM_AMDGPU} (EM_AMDGPU), got {header.e_machine}"
        )
    if header.arch is None:
        raise ValueError(
            f"code: e_flags {header.e_flags:#x} names mach {header.mach:#x}, "
            f"expected one of {', '.join(f'{m:#x} ({a})' for m, a in MACH_TO_ARCH.items())}"
        )
    return header.arch


def _llvm_major(path: str) -> int:
    match = re.search(r"(?:llvm-|objdump-)(\d+)", path)
    return int(match.group(1)) if match else 0


def _objdump_candidates() -> list[str]:
    """llvm-objdump binaries on this machine: explicit and ROCm ones, then newest LLVM first."""
    first = [os.environ.get("AITER_LLVM_OBJDUMP", "")]
    first.append(
        os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "llvm", "bin", "llvm-objdump")
    )
    versioned = glob.glob("/usr/lib/llvm-*/bin/llvm-objdump")
    versioned += [p for n in range(40, 13, -1) if (p := shutil.which(f"llvm-objdump-{n}"))]
    versioned.sort(key=_llvm_major, reverse=True)
    unique: list[str] = []
    seen: set[str] = set()
    for path in [*first, *versioned, shutil.which("llvm-objdump") or ""]:
        if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            unique.append(path)
    return unique


def _features(arch: str) -> list[str]:
    """gfx12 code uses 16-bit register halves (v0.l, v0.h): without real-true16 LLVM 22 cannot
    decode its v_mov_b16 and prints .long words in their place."""
    return ["--mattr=+real-true16"] if arch.startswith("gfx12") else []


def _run_objdump(objdump: str, path: str, arch: str) -> str | None:
    """Disassembly by one llvm-objdump, or None when that LLVM does not know `arch` (older
    ones warn "not a recognized processor", fail to find the target, or abort)."""
    try:
        out = subprocess.run(
            [objdump, "-d", "--triple=amdgcn-amd-amdhsa", f"--mcpu={arch}", *_features(arch), path],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or "not a recognized processor" in out.stderr:
        return None
    return out.stdout


_working_objdump: dict[str, str] = {}


def disassemble(code: bytes, arch: str) -> str | None:
    """Disassembly text of a code object, or None when no installed llvm-objdump knows `arch`.

    Candidates: $AITER_LLVM_OBJDUMP, $ROCM_PATH/llvm/bin, /usr/lib/llvm-*/bin (newest first),
    llvm-objdump-NN and llvm-objdump on PATH.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"code.{arch}.hsaco")
        with open(path, "wb") as f:
            f.write(code)
        known = _working_objdump.get(arch)
        candidates = [known] if known else _objdump_candidates()
        for objdump in candidates:
            text = _run_objdump(objdump, path, arch)
            if text is not None:
                _working_objdump[arch] = objdump
                return text
    return None
