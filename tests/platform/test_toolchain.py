"""Tests of aiter.toolchain: where an AMDGPU ld.lld is looked for, in which order, and shims.

Every test builds its own fake ROCm tree, PATH and shim directory under tmp_path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiter import toolchain
from aiter.toolchain import LinkerNotFound, configure_linker, find_linker


def _executable(path: Path, text: str = '#!/bin/sh\necho "fake-lld $*"\n') -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No ROCM_PATH, no /opt/rocm, an empty PATH directory; returns the shim root to use."""
    monkeypatch.delenv("ROCM_PATH", raising=False)
    monkeypatch.setattr(toolchain, "DEFAULT_ROCM", tmp_path / "no-such-rocm")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return tmp_path / "shim"


def test_rocm_path_with_lld_is_chosen(clean: Path, tmp_path: Path, monkeypatch) -> None:
    rocm = tmp_path / "rocm"
    lld = _executable(rocm / "llvm" / "bin" / "ld.lld")
    # Something on PATH too: ROCM_PATH must still win.
    _executable(tmp_path / "empty-bin" / "ld.lld")
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    linker = find_linker(clean)
    assert linker == toolchain.Linker(rocm, lld, "ROCM_PATH")
    assert not clean.exists()  # no shim was written


def test_default_rocm_is_chosen_after_rocm_path(clean: Path, tmp_path: Path, monkeypatch) -> None:
    default = tmp_path / "opt-rocm"
    lld = _executable(default / "llvm" / "bin" / "ld.lld")
    monkeypatch.setattr(toolchain, "DEFAULT_ROCM", default)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm-without-lld"))
    linker = find_linker(clean)
    assert linker == toolchain.Linker(default, lld, str(default))


def test_rocm_path_without_lld_falls_through_to_path(clean: Path, tmp_path: Path, monkeypatch):
    rocm = tmp_path / "rocm"
    (rocm / "llvm" / "bin").mkdir(parents=True)
    # Not executable: must not count.
    (rocm / "llvm" / "bin" / "ld.lld").write_text("#!/bin/sh\n")
    (rocm / "llvm" / "bin" / "ld.lld").chmod(0o644)
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    on_path = _executable(tmp_path / "empty-bin" / "ld.lld")
    linker = find_linker(clean)
    assert linker.origin == "PATH"
    assert linker.rocm_path == clean
    assert linker.lld == clean / "llvm" / "bin" / "ld.lld"
    assert on_path.exists()


def test_lld_on_path_gets_a_shim_that_execs_it(clean: Path, tmp_path: Path, monkeypatch) -> None:
    bindir = tmp_path / "bin"
    real = _executable(bindir / "ld.lld")
    monkeypatch.setenv("PATH", str(bindir))
    linker = find_linker(clean)
    shim = clean / "llvm" / "bin" / "ld.lld"
    assert linker == toolchain.Linker(clean, shim, "PATH")
    assert shim.read_text() == f'#!/bin/sh\nexec "{real}" "$@"\n'
    assert os.access(shim, os.X_OK)
    out = subprocess.run(
        [str(shim), "--version", "a b"], capture_output=True, text=True, check=True
    )
    assert out.stdout == "fake-lld --version a b\n"
    # A second call finds the same shim and leaves it as it is.
    mtime = shim.stat().st_mtime_ns
    assert find_linker(clean) == linker
    assert shim.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in shim.parent.iterdir()) == ["ld.lld"]  # no temp file left


def test_shim_on_path_is_not_taken_for_a_real_lld(clean: Path, monkeypatch) -> None:
    # The shim directory's own bin on PATH must not make the shim exec itself.
    shim = _executable(clean / "llvm" / "bin" / "ld.lld")
    monkeypatch.setenv("PATH", str(shim.parent))
    monkeypatch.setattr(toolchain, "_ziglang_available", lambda: False)
    with pytest.raises(LinkerNotFound):
        find_linker(clean)


def test_ziglang_fallback_writes_a_shim_that_really_links(clean: Path) -> None:
    if not toolchain._ziglang_available():
        pytest.skip("the ziglang package is not installed")
    linker = find_linker(clean)
    shim = clean / "llvm" / "bin" / "ld.lld"
    assert linker == toolchain.Linker(clean, shim, "ziglang")
    assert shim.read_text() == f'#!/bin/sh\nexec "{sys.executable}" -m ziglang ld.lld "$@"\n'
    out = subprocess.run(
        [str(shim), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("LLD ")
    assert toolchain.linker_version(linker).startswith("LLD ")


def test_shim_dir_defaults_to_env_var(clean: Path, tmp_path: Path, monkeypatch) -> None:
    bindir = tmp_path / "bin"
    _executable(bindir / "ld.lld")
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv(toolchain.SHIM_ENV, str(tmp_path / "from-env"))
    linker = find_linker()
    assert linker.rocm_path == tmp_path / "from-env"
    assert linker.lld.is_file()


def test_nothing_found_lists_every_place_tried_and_the_fix(
    clean: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(toolchain, "_ziglang_available", lambda: False)
    rocm = tmp_path / "rocm"
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    with pytest.raises(LinkerNotFound) as info:
        find_linker(clean)
    default = tmp_path / "no-such-rocm"
    assert str(info.value) == (
        "no AMDGPU-capable ld.lld was found. Tried:\n"
        f"  - {rocm}/llvm/bin/ld.lld (ROCM_PATH): not found\n"
        f"  - {default}/llvm/bin/ld.lld ({default}): not found\n"
        "  - ld.lld on PATH: not found\n"
        "  - ziglang's LLD (python -m ziglang ld.lld): the ziglang package is not installed\n"
        "Fix: install ROCm (or set ROCM_PATH to a tree with llvm/bin/ld.lld), "
        "or `pip install ziglang` to use its LLD."
    )
    assert not clean.exists()


def test_nothing_found_without_rocm_path_lists_the_default_only(clean: Path, monkeypatch):
    monkeypatch.setattr(toolchain, "_ziglang_available", lambda: False)
    with pytest.raises(LinkerNotFound) as info:
        find_linker(clean)
    message = str(info.value)
    assert "(ROCM_PATH)" not in message
    assert message.count("  - ") == 3


def test_configure_linker_sets_rocm_path(clean: Path, tmp_path: Path, monkeypatch) -> None:
    bindir = tmp_path / "bin"
    _executable(bindir / "ld.lld")
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm-without-lld"))
    linker = configure_linker(clean)
    assert linker.origin == "PATH"
    assert os.environ["ROCM_PATH"] == str(clean)


def test_configure_linker_keeps_a_good_rocm_path(clean: Path, tmp_path: Path, monkeypatch):
    rocm = tmp_path / "rocm"
    _executable(rocm / "llvm" / "bin" / "ld.lld")
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    assert configure_linker(clean).origin == "ROCM_PATH"
    assert os.environ["ROCM_PATH"] == str(rocm)
