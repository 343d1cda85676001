"""Finds an ld.lld that can link AMDGPU code objects and points FlyDSL at it.

FlyDSL links every kernel by running `$ROCM_PATH/llvm/bin/ld.lld`; this module makes that path valid.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LLD_RELATIVE = Path("llvm") / "bin" / "ld.lld"
DEFAULT_ROCM = Path("/opt/rocm")
SHIM_ENV = "AITER_LLD_SHIM_DIR"


class LinkerNotFound(RuntimeError):
    """No AMDGPU-capable ld.lld could be found or made available."""


@dataclass(frozen=True)
class Linker:
    rocm_path: Path  # the directory FlyDSL gets as ROCM_PATH
    lld: Path  # the ld.lld FlyDSL will run
    origin: str  # "ROCM_PATH", "/opt/rocm", "PATH" or "ziglang"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _ziglang_available() -> bool:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return False
    return True


def _default_shim_dir() -> Path:
    base = os.environ.get(SHIM_ENV) or os.path.join(
        tempfile.gettempdir(), f"aiter-lld-{os.getuid()}"
    )
    return Path(base)


def _write_shim(shim_root: Path, command: str) -> Path:
    """A ROCM_PATH-shaped directory whose llvm/bin/ld.lld execs `command`."""
    lld = shim_root / LLD_RELATIVE
    script = f'#!/bin/sh\nexec {command} "$@"\n'
    if lld.is_file() and lld.read_text() == script:
        return lld
    lld.parent.mkdir(parents=True, exist_ok=True)
    # Write beside and rename, so a concurrent process never runs half a script.
    tmp = lld.with_name(f".ld.lld.{os.getpid()}")
    tmp.write_text(script)
    tmp.chmod(0o755)
    os.replace(tmp, lld)
    return lld


def find_linker(shim_root: Path | None = None) -> Linker:
    """Return the first usable linker: $ROCM_PATH, /opt/rocm, then ld.lld on PATH or ziglang's.

    The last two are reached through a shim directory, since FlyDSL only looks under ROCM_PATH.
    """
    tried = []
    rocm_env = os.environ.get("ROCM_PATH")
    candidates = []
    if rocm_env:
        candidates.append((Path(rocm_env), "ROCM_PATH"))
    candidates.append((DEFAULT_ROCM, str(DEFAULT_ROCM)))
    for root, origin in candidates:
        lld = root / LLD_RELATIVE
        if _is_executable(lld):
            return Linker(root, lld, origin)
        tried.append(f"{lld} ({origin}): not found")

    root = shim_root or _default_shim_dir()
    on_path = shutil.which("ld.lld")
    if on_path and Path(on_path).resolve() != (root / LLD_RELATIVE).resolve():
        return Linker(root, _write_shim(root, f'"{on_path}"'), "PATH")
    tried.append("ld.lld on PATH: not found")
    if _ziglang_available():
        command = f'"{sys.executable}" -m ziglang ld.lld'
        return Linker(root, _write_shim(root, command), "ziglang")
    tried.append("ziglang's LLD (python -m ziglang ld.lld): the ziglang package is not installed")

    raise LinkerNotFound(
        "no AMDGPU-capable ld.lld was found. Tried:\n  - "
        + "\n  - ".join(tried)
        + "\nFix: install ROCm (or set ROCM_PATH to a tree with llvm/bin/ld.lld), "
        "or `pip install ziglang` to use its LLD."
    )


def configure_linker(shim_root: Path | None = None) -> Linker:
    """Find a linker and set ROCM_PATH so FlyDSL uses it; call before any compile."""
    linker = find_linker(shim_root)
    os.environ["ROCM_PATH"] = str(linker.rocm_path)
    return linker


def linker_version(linker: Linker) -> str:
    """The first line of `ld.lld --version`, for reports."""
    out = subprocess.run(
        [str(linker.lld), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""
