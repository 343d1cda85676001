"""Runs kernel compiles in a child process, one arch per process, for the kernel tests.

FlyDSL freezes its target per process and an LLVM abort kills the process: pytest must survive.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def linker_rocm_path(shim_root: Path) -> str:
    """ROCM_PATH of an AMDGPU linker, or skip the test with the reason."""
    from aiter.toolchain import LinkerNotFound, find_linker

    try:
        return str(find_linker(shim_root).rocm_path)
    except LinkerNotFound as exc:
        pytest.skip(f"no AMDGPU linker to compile with: {exc}")


def compile_env(arch: str, rocm_path: str, cache: Path, dump: Path | None = None) -> dict:
    """The environment of a compile-only child for `arch`; `dump` turns on FlyDSL's ISA listing
    (which also turns off its disk cache)."""
    from aiter import flydsl_bridge as bridge

    env = dict(os.environ)
    env.pop("FLYDSL_DEBUG_DUMP_ASM", None)
    env.pop("FLYDSL_DUMP_DIR", None)
    env.update(bridge.target_env(arch))
    env.update(
        ROCM_PATH=rocm_path,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    env[bridge.ENV_CACHE_DIR] = str(cache)
    if dump is not None:
        env.update(FLYDSL_DEBUG_DUMP_ASM="1", FLYDSL_DUMP_DIR=str(dump))
    return env


def disassemble_or_skip(code: bytes, arch: str) -> str:
    """llvm-objdump's disassembly of a code object; skips the test when no installed LLVM knows
    the arch, or fails it under AITER_REQUIRE_DISASSEMBLER=1 (CI installs llvm-22)."""
    from aiter.flydsl_bridge import elf

    text = elf.disassemble(code, arch)
    if text is None:
        reason = f"no installed llvm-objdump knows {arch} (Debian's llvm-22 knows all three archs)"
        if os.environ.get("AITER_REQUIRE_DISASSEMBLER"):
            pytest.fail(reason)
        pytest.skip(reason)
    return text


def run_child(code: str, args: list[str], env: dict, cwd: Path = REPO):
    """`python -c code args...`; the CompletedProcess, output captured."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


# The end of a child script that compiles `configs` twice, for the kernel tests' `compiled`
# fixtures. The script defines arch, configs, dump (a directory for FlyDSL's listings), keep
# (where listings are copied) and launch(cfg, device) -> seconds (or a dict of them), and
# imports json, os, shutil, dry_run and hooks. It prints {"listed": [{"isa": {kernel: path},
# "seconds": ...}], "built": [{"entries": [[function, path]], "seconds": ...}]}, one per config.
LIST_THEN_BUILD = """
# Phase 1: FlyDSL's ISA listing of every kernel (a listing turns FlyDSL's disk cache off).
os.environ.update(FLYDSL_DEBUG_DUMP_ASM="1", FLYDSL_DUMP_DIR=str(dump))
listed = []
for idx, cfg in enumerate(configs):
    shutil.rmtree(dump, ignore_errors=True)  # listings of one kernel name share a directory
    seconds = launch(cfg, "cpu")
    isa = {}
    for listing in sorted(dump.glob("*/*final_isa.s")):
        kernel = listing.parent.name.rsplit("_", 1)[0]
        target = keep / f"{idx}_{kernel}.s"
        shutil.copyfile(listing, target)
        isa[kernel] = str(target)
    listed.append({"isa": isa, "seconds": seconds})
del os.environ["FLYDSL_DEBUG_DUMP_ASM"], os.environ["FLYDSL_DUMP_DIR"]

# Phase 2: the AOT builder's way, FakeTensors in a dry run that compiles into the disk cache.
# The dry run's launch recorder bypasses FlyDSL's in-process artifact cache, so phase 1's
# artifacts are compiled again and written.
built = []
for cfg in configs:
    with dry_run(arch, 304, bridge.MODE_COMPILE) as requests:
        seconds = launch(cfg, "cuda")
    built.append({"entries": [[r.function, str(r.path)] for r in requests], "seconds": seconds})
print(json.dumps({"listed": listed, "built": built}))
"""
