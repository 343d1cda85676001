"""Tests of aiter.arch: the arch registry's facts and GPU_ARCHS parsing.

Expectations are the registry's documented values; every error must name the bad entry.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiter.arch import ARCHS, ArchTarget, get_arch, parse_gpu_archs


def test_registry_holds_exactly_the_three_archs() -> None:
    assert list(ARCHS) == ["gfx942", "gfx950", "gfx1250"]


def test_gfx942_facts() -> None:
    info = get_arch("gfx942")
    assert info.name == "gfx942"
    assert info.family == "CDNA3"
    assert info.fp8_dtype_name == "float8_e4m3fnuz"
    assert info.fp8_dtype is torch.float8_e4m3fnuz
    assert info.mma == "mfma"
    assert info.wave_size == 64
    assert dict(info.devices) == {"MI300X": 304, "MI325X": 304, "MI300A": 228, "MI308X": 80}
    assert info.cu_nums == (80, 228, 304)
    assert info.default_cu_num == 304


def test_gfx950_facts() -> None:
    info = get_arch("gfx950")
    assert info.family == "CDNA4"
    assert info.fp8_dtype is torch.float8_e4m3fn
    assert info.mma == "mfma"
    assert info.wave_size == 64
    assert info.cu_nums == (256,)
    assert info.default_cu_num == 256


def test_gfx1250_facts() -> None:
    info = get_arch("gfx1250")
    assert info.fp8_dtype is torch.float8_e4m3fn
    assert info.mma == "wmma"
    assert info.wave_size == 32
    assert info.default_cu_num == 256


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        ARCHS["gfx90a"] = ARCHS["gfx942"]  # type: ignore[index]
    with pytest.raises(TypeError):
        get_arch("gfx942").devices["MI300X"] = 1  # type: ignore[index]


@pytest.mark.parametrize(
    "text", ["gfx942:sramecc+:xnack-", "gfx942:sramecc+", " GFX942 ", "gfx942:xnack+"]
)
def test_get_arch_ignores_feature_suffix_case_and_spaces(text: str) -> None:
    assert get_arch(text) is ARCHS["gfx942"]


@pytest.mark.parametrize("name", ["gfx90a", "gfx1100", "", "942"])
def test_get_arch_unknown_names_the_arch_and_the_known_ones(name: str) -> None:
    with pytest.raises(ValueError) as info:
        get_arch(name)
    message = str(info.value)
    assert f"unknown GPU arch {name!r}" in message
    assert "expected one of gfx942, gfx950, gfx1250" in message


# --- parse_gpu_archs ---


def test_parse_semicolon_list() -> None:
    assert parse_gpu_archs("gfx942;gfx950") == [ArchTarget("gfx942"), ArchTarget("gfx950")]


def test_parse_comma_list_and_mixed_separators() -> None:
    assert parse_gpu_archs("gfx950,gfx942") == [ArchTarget("gfx950"), ArchTarget("gfx942")]
    assert parse_gpu_archs("gfx942;gfx950,gfx1250") == [
        ArchTarget("gfx942"),
        ArchTarget("gfx950"),
        ArchTarget("gfx1250"),
    ]


def test_parse_cu_num() -> None:
    targets = parse_gpu_archs("gfx942:80;gfx942:304;gfx1250:128")
    assert targets == [
        ArchTarget("gfx942", 80),
        ArchTarget("gfx942", 304),
        ArchTarget("gfx1250", 128),
    ]
    assert [str(t) for t in targets] == ["gfx942:80", "gfx942:304", "gfx1250:128"]
    assert str(ArchTarget("gfx950")) == "gfx950"


def test_parse_drops_duplicates_keeping_first_order() -> None:
    assert parse_gpu_archs("gfx950;gfx942;gfx950;gfx942:80;gfx942;gfx942:80") == [
        ArchTarget("gfx950"),
        ArchTarget("gfx942"),
        ArchTarget("gfx942", 80),
    ]


def test_parse_whitespace_case_and_empty_entries() -> None:
    assert parse_gpu_archs("  gfx942 ;\tGFX950 ; ;, ") == [
        ArchTarget("gfx942"),
        ArchTarget("gfx950"),
    ]


def test_parse_native_resolves_through_the_callable_only_when_asked() -> None:
    calls = []

    def native() -> ArchTarget:
        calls.append(1)
        return ArchTarget("gfx942", 228)

    assert parse_gpu_archs("gfx950", native=native) == [ArchTarget("gfx950")]
    assert calls == []
    assert parse_gpu_archs("native;gfx950;NATIVE;gfx942:228", native=native) == [
        ArchTarget("gfx942", 228),
        ArchTarget("gfx950"),
    ]
    assert len(calls) == 2


def test_parse_native_without_resolver_errors() -> None:
    with pytest.raises(ValueError, match=r"GPU_ARCHS=native needs a visible GPU"):
        parse_gpu_archs("gfx942;native")


@pytest.mark.parametrize(
    "entry, bad_cu",
    [("gfx942:abc", "abc"), ("gfx942:0", "0"), ("gfx942:", ""), ("gfx942:-4", "-4")],
)
def test_parse_bad_cu_num_names_the_entry(entry: str, bad_cu: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_gpu_archs(f"gfx950;{entry}")
    assert str(info.value) == (
        f"GPU_ARCHS entry {entry!r}: cu_num must be a positive integer, got {bad_cu!r}"
    )


@pytest.mark.parametrize("text", ["", " ", ";", " ; , "])
def test_parse_empty_text_errors(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_gpu_archs(text)
    assert str(info.value) == f"GPU_ARCHS={text!r} names no arch: expected e.g. 'gfx942;gfx950'"


def test_parse_unknown_arch_names_it() -> None:
    with pytest.raises(ValueError) as info:
        parse_gpu_archs("gfx942;gfx90a")
    assert "unknown GPU arch 'gfx90a'" in str(info.value)
    assert "gfx942, gfx950, gfx1250" in str(info.value)


@pytest.mark.parametrize("entry", ["gfx942:80:1", "gfx-942", "gfx 942"])
def test_parse_malformed_entry_names_it(entry: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_gpu_archs(entry)
    assert str(info.value) == (
        f"GPU_ARCHS entry {entry!r} is malformed: expected 'gfxNNN' or 'gfxNNN:cu_num'"
        " (feature flags such as ':xnack-' allowed)"
    )


@pytest.mark.parametrize(
    "entry, cu_num",
    [("gfx942:sramecc+:xnack-", None), ("gfx942:xnack-:228", 228), ("gfx942:80:sramecc+", 80)],
)
def test_parse_feature_flags_are_ignored(entry: str, cu_num) -> None:
    assert parse_gpu_archs(entry) == [ArchTarget("gfx942", cu_num)]


def test_elf_mach_values() -> None:
    assert {name: info.elf_mach for name, info in ARCHS.items()} == {
        "gfx942": 0x4C,
        "gfx950": 0x4F,
        "gfx1250": 0x49,
    }


def test_importing_the_registry_does_not_import_torch() -> None:
    code = "import aiter.arch, sys; print('torch' in sys.modules)"
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
