"""Loads an AMDGPU code object (HSACO ELF) as the hardware's dispatcher reads it: each kernel's
64-byte descriptor, its `.note` metadata (argument layout, register counts) and its code.

Field layouts follow LLVM's AMDGPUUsage ("Kernel Descriptor", "Code Object V3+ Metadata").
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from aiter.emulator.errors import CodeObjectError
from aiter.flydsl_bridge.elf import code_object_arch

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
NT_AMDGPU_METADATA = 32
KD_SIZE = 64
# AMDGPUUsage, "Kernel Descriptor for GFX6-GFX12": the byte layout of the 64-byte descriptor.
_KD = struct.Struct("<IIIIq20sIIIHH4s")


@dataclass(frozen=True)
class KernelDescriptor:
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    kernel_code_entry_byte_offset: int
    compute_pgm_rsrc3: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc2: int
    kernel_code_properties: int
    kernarg_preload: int

    # kernel_code_properties bits, in the order the user SGPRs are set up (AMDGPUUsage
    # "SGPR Register Set Up Order"): (name, bit, number of SGPRs).
    USER_SGPRS = (
        ("private_segment_buffer", 0, 4),
        ("dispatch_ptr", 1, 2),
        ("queue_ptr", 2, 2),
        ("kernarg_segment_ptr", 3, 2),
        ("dispatch_id", 4, 2),
        ("flat_scratch_init", 5, 2),
        ("private_segment_size", 6, 1),
    )

    def user_sgprs(self) -> list[tuple[str, int]]:
        """(name, first SGPR) of each enabled user SGPR, in set-up order."""
        out, index = [], 0
        for name, bit, count in self.USER_SGPRS:
            if self.kernel_code_properties >> bit & 1:
                out.append((name, index))
                index += count
        return out

    @property
    def user_sgpr_count(self) -> int:
        """COMPUTE_PGM_RSRC2.USER_SGPR_COUNT (bits 1-5): user SGPRs incl. preloaded kernargs."""
        return self.compute_pgm_rsrc2 >> 1 & 0x1F

    @property
    def workgroup_id_enabled(self) -> tuple[bool, bool, bool]:
        """COMPUTE_PGM_RSRC2.ENABLE_SGPR_WORKGROUP_ID_X/Y/Z (bits 7, 8, 9)."""
        return tuple(bool(self.compute_pgm_rsrc2 >> b & 1) for b in (7, 8, 9))

    @property
    def workgroup_info_enabled(self) -> bool:
        """COMPUTE_PGM_RSRC2.ENABLE_SGPR_WORKGROUP_INFO (bit 10)."""
        return bool(self.compute_pgm_rsrc2 >> 10 & 1)

    @property
    def private_segment_enabled(self) -> bool:
        """COMPUTE_PGM_RSRC2.ENABLE_PRIVATE_SEGMENT (bit 0): a wave scratch offset SGPR."""
        return bool(self.compute_pgm_rsrc2 & 1)

    @property
    def workitem_id_dims(self) -> int:
        """1 + COMPUTE_PGM_RSRC2.ENABLE_VGPR_WORKITEM_ID (bits 11-12): 1 (X), 2 (XY), 3 (XYZ)."""
        return min(3, (self.compute_pgm_rsrc2 >> 11 & 3) + 1)

    @property
    def wave32(self) -> bool:
        """kernel_code_properties.ENABLE_WAVEFRONT_SIZE32 (bit 10)."""
        return bool(self.kernel_code_properties >> 10 & 1)

    @property
    def accum_offset(self) -> int:
        """First AccVGPR in the unified register file: (COMPUTE_PGM_RSRC3.ACCUM_OFFSET + 1) * 4
        (bits 0-5, GFX90A and later)."""
        return ((self.compute_pgm_rsrc3 & 0x3F) + 1) * 4

    @property
    def kernarg_preload_length(self) -> int:
        """KERNARG_PRELOAD_SPEC_LENGTH (bits 0-6): kernarg dwords preloaded into user SGPRs."""
        return self.kernarg_preload & 0x7F

    @property
    def kernarg_preload_offset(self) -> int:
        """KERNARG_PRELOAD_SPEC_OFFSET (bits 7-15), in dwords from the kernarg segment start."""
        return self.kernarg_preload >> 7 & 0x1FF


@dataclass(frozen=True)
class KernelArg:
    offset: int
    size: int
    value_kind: str
    name: str | None = None
    address_space: str | None = None


@dataclass(frozen=True)
class Kernel:
    name: str
    arch: str
    descriptor: KernelDescriptor
    entry: int  # virtual address of the first instruction
    end: int  # virtual address past the kernel's code
    args: tuple[KernelArg, ...]
    kernarg_segment_size: int
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    wavefront_size: int
    sgpr_count: int
    vgpr_count: int
    agpr_count: int
    max_flat_workgroup_size: int
    metadata: dict[str, Any]


@dataclass(frozen=True)
class CodeObject:
    arch: str
    sha256: str
    data: bytes
    kernels: dict[str, Kernel]

    def kernel(self, name: str) -> Kernel:
        if name not in self.kernels:
            raise CodeObjectError(
                f"kernel {name!r} is not in this code object; it holds {sorted(self.kernels)}"
            )
        return self.kernels[name]


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int


def _sections(data: bytes) -> list[_Section]:
    header = _EHDR.unpack_from(data, 0)
    shoff, shentsize, shnum, shstrndx = header[6], header[11], header[12], header[13]
    raw = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names = raw[shstrndx]
    strtab = data[names[4] : names[4] + names[5]]

    def name_at(off: int) -> str:
        return strtab[off : strtab.index(b"\0", off)].decode()

    return [_Section(name_at(s[0]), s[1], s[3], s[4], s[5], s[6]) for s in raw]


def _symbols(data: bytes, sections: list[_Section]) -> dict[str, tuple[int, int]]:
    """name -> (value, size) from .symtab (or .dynsym when stripped)."""
    table = next((s for s in sections if s.name == ".symtab"), None)
    table = table or next((s for s in sections if s.name == ".dynsym"), None)
    if table is None:
        raise CodeObjectError("code object has no symbol table (.symtab or .dynsym)")
    strings = sections[table.link]
    out: dict[str, tuple[int, int]] = {}
    for pos in range(table.offset, table.offset + table.size, _SYM.size):
        name_off, _info, _other, _shndx, value, size = _SYM.unpack_from(data, pos)
        start = strings.offset + name_off
        name = data[start : data.index(b"\0", start)].decode()
        if name:
            out[name] = (value, size)
    return out


def _metadata(data: bytes, sections: list[_Section]) -> dict[str, Any]:
    """The msgpack map of the NT_AMDGPU_METADATA note (owner "AMDGPU")."""
    for sec in sections:
        if sec.type != 7:  # SHT_NOTE
            continue
        pos, end = sec.offset, sec.offset + sec.size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name_start = pos + 12
            desc_start = name_start + (namesz + 3) // 4 * 4
            owner = data[name_start : name_start + namesz].rstrip(b"\0")
            if owner == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                return msgpack.unpackb(data[desc_start : desc_start + descsz], raw=False)
            pos = desc_start + (descsz + 3) // 4 * 4
    raise CodeObjectError("code object has no AMDGPU metadata note (NT_AMDGPU_METADATA)")


def _file_offset(sections: list[_Section], vaddr: int) -> int:
    for sec in sections:
        if sec.addr and sec.addr <= vaddr < sec.addr + sec.size and sec.type != 8:  # not NOBITS
            return sec.offset + vaddr - sec.addr
    raise CodeObjectError(f"virtual address {vaddr:#x} lies in no loaded section")


def load_code_object(data: bytes) -> CodeObject:
    """Every kernel of a code object: descriptor, metadata and code location."""
    try:
        arch = code_object_arch(data)
    except ValueError as err:
        raise CodeObjectError(str(err)) from err
    sections = _sections(data)
    symbols = _symbols(data, sections)
    meta = _metadata(data, sections)
    kernels: dict[str, Kernel] = {}
    for km in meta.get("amdhsa.kernels", []):
        name = km[".name"]
        symbol = km.get(".symbol", name + ".kd")
        if symbol not in symbols:
            raise CodeObjectError(f"{name}: descriptor symbol {symbol!r} not in the symbol table")
        kd_addr = symbols[symbol][0]
        kd_raw = data[_file_offset(sections, kd_addr) :][:KD_SIZE]
        f = _KD.unpack(kd_raw)
        kd = KernelDescriptor(f[0], f[1], f[2], f[4], f[6], f[7], f[8], f[9], f[10])
        entry = kd_addr + kd.kernel_code_entry_byte_offset
        code_size = symbols.get(name, (entry, 0))[1]
        args = tuple(
            KernelArg(
                offset=a[".offset"],
                size=a[".size"],
                value_kind=a[".value_kind"],
                name=a.get(".name"),
                address_space=a.get(".address_space"),
            )
            for a in km.get(".args", [])
        )
        kernels[name] = Kernel(
            name=name,
            arch=arch,
            descriptor=kd,
            entry=entry,
            end=entry + code_size,
            args=args,
            kernarg_segment_size=km.get(".kernarg_segment_size", kd.kernarg_size),
            group_segment_fixed_size=km.get(
                ".group_segment_fixed_size", kd.group_segment_fixed_size
            ),
            private_segment_fixed_size=km.get(
                ".private_segment_fixed_size", kd.private_segment_fixed_size
            ),
            wavefront_size=km.get(".wavefront_size", 32 if kd.wave32 else 64),
            sgpr_count=km.get(".sgpr_count", 0),
            vgpr_count=km.get(".vgpr_count", 0),
            agpr_count=km.get(".agpr_count", 0),
            max_flat_workgroup_size=km.get(".max_flat_workgroup_size", 1024),
            metadata=km,
        )
    if not kernels:
        raise CodeObjectError("code object metadata lists no kernels (amdhsa.kernels)")
    return CodeObject(arch, hashlib.sha256(data).hexdigest(), bytes(data), kernels)
