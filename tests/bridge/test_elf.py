"""Tests of aiter.flydsl_bridge.elf on hand-built ELF headers: machine, arch from e_flags,
rejection of what is not an AMDGPU code object, and disassembly fallback."""

from __future__ import annotations

import struct

import pytest

from aiter.arch import ARCHS
from aiter.flydsl_bridge import elf

EM_X86_64 = 62


def make_elf(
    e_machine: int = elf.EM_AMDGPU, e_flags: int = 0x54C, ei_class: int = 2, ei_data: int = 1
) -> bytes:
    """A 64-byte ELF64 header; only the fields elf.py reads are meaningful."""
    ident = b"\x7fELF" + bytes([ei_class, ei_data, 1, 0x40, 4]) + bytes(7)
    return struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 3, e_machine, 1, 0, 64, 0, e_flags, 64, 56, 0, 64, 0, 0
    )


@pytest.mark.parametrize(
    ("e_flags", "arch"),
    [(0x54C, "gfx942"), (0x54F, "gfx950"), (0x549, "gfx1250"), (0x4C, "gfx942")],
)
def test_arch_from_low_byte_of_e_flags(e_flags: int, arch: str) -> None:
    code = make_elf(e_flags=e_flags)
    header = elf.parse_header(code)
    assert header.e_machine == 224
    assert header.e_flags == e_flags
    assert header.is_amdgpu
    assert header.arch == arch
    assert elf.code_object_arch(code) == arch


def test_tables_are_inverse() -> None:
    assert elf.ARCH_TO_MACH == {"gfx942": 0x4C, "gfx950": 0x4F, "gfx1250": 0x49}
    assert {m: a for a, m in elf.ARCH_TO_MACH.items()} == elf.MACH_TO_ARCH


def test_trailing_bytes_are_ignored() -> None:
    assert elf.code_object_arch(make_elf(e_flags=0x549) + b"\x00" * 4096) == "gfx1250"


def test_other_machine_is_not_amdgpu() -> None:
    code = make_elf(e_machine=EM_X86_64, e_flags=0x4C)
    header = elf.parse_header(code)
    assert not header.is_amdgpu
    assert header.arch is None
    with pytest.raises(ValueError, match="e_machine 224"):
        elf.code_object_arch(code)


def test_unknown_mach_names_flags() -> None:
    code = make_elf(e_flags=0x530)  # gfx90a-era mach: not built by aiter
    assert elf.parse_header(code).arch is None
    with pytest.raises(ValueError, match="0x530"):
        elf.code_object_arch(code)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (b"", "expected an ELF file"),
        (b"\x7fELF" + bytes(10), "expected an ELF file"),
        (b"MZ" + bytes(100), "expected an ELF file"),
        (make_elf(ei_class=1), "ELF64"),
        (make_elf(ei_data=2), "little-endian"),
    ],
)
def test_malformed_headers_raise(code: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        elf.parse_header(code)


def test_disassemble_returns_none_without_a_fitting_objdump(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(elf, "_objdump_candidates", lambda: [])
    monkeypatch.setattr(elf, "_working_objdump", {})
    assert elf.disassemble(make_elf(), "gfx942") is None


def test_disassemble_skips_an_objdump_that_rejects_the_arch(monkeypatch, tmp_path) -> None:
    old = tmp_path / "old-objdump"
    old.write_text("#!/bin/sh\necho \"'$3' is not a recognized processor\" >&2\nexit 0\n")
    new = tmp_path / "new-objdump"
    new.write_text('#!/bin/sh\necho "v_mfma_f32_16x16x16_bf16 v[0:3]"\n')
    for tool in (old, new):
        tool.chmod(0o755)
    monkeypatch.setattr(elf, "_working_objdump", {})
    monkeypatch.setattr(elf, "_objdump_candidates", lambda: [str(old)])
    assert elf.disassemble(make_elf(), "gfx950") is None
    monkeypatch.setattr(elf, "_objdump_candidates", lambda: [str(old), str(new)])
    assert "v_mfma_f32_16x16x16_bf16" in elf.disassemble(make_elf(), "gfx950")
    assert elf._working_objdump == {"gfx950": str(new)}


def test_disassemble_skips_an_objdump_that_aborts(monkeypatch, tmp_path) -> None:
    crash = tmp_path / "crash-objdump"
    crash.write_text("#!/bin/sh\necho 'LLVM ERROR: Disassembly not yet supported' >&2\nexit 134\n")
    crash.chmod(0o755)
    monkeypatch.setattr(elf, "_working_objdump", {})
    monkeypatch.setattr(elf, "_objdump_candidates", lambda: [str(crash)])
    assert elf.disassemble(make_elf(), "gfx1250") is None


def test_every_registered_arch_maps_both_ways() -> None:
    assert len(elf.MACH_TO_ARCH) == len(ARCHS)  # no two archs share a mach value
    for name, info in ARCHS.items():
        assert elf.ARCH_TO_MACH[name] == info.elf_mach
        assert elf.MACH_TO_ARCH[info.elf_mach] == name
        assert elf.code_object_arch(make_elf(e_flags=0x500 | info.elf_mach)) == name
