"""FlyDSL hashes only same-directory helpers into a kernel's cache key; the helpers in
aiter/ops/shared are called from every family's kernels directory, so every launcher reads the
shared sources' digest and FlyDSL keys each kernel by it. Editing a shared helper must change
every kernel's key (no stale entry may serve), and nothing else may."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import aiter.ops
from aiter import flydsl_bridge as bridge
from aiter.ops import shared

REPO = Path(__file__).resolve().parents[2]


def _kernel_modules() -> list[str]:
    found = []
    for info in pkgutil.walk_packages(aiter.ops.__path__, "aiter.ops."):
        if ".kernels." in info.name:
            found.append(info.name)
    return sorted(found)


def _launchers():
    jit = bridge.jit_function().JitFunction
    for name in _kernel_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, jit) and value.func.__module__ == name:
                yield name, value


def test_every_family_has_launchers() -> None:
    families = {name.split(".")[2] for name, _ in _launchers()}
    assert families == {"gemm", "moe", "conv3d", "fmha_fp8", "chunk_gdn_h"}


@pytest.mark.parametrize(
    "name, launcher", [pytest.param(n, f, id=f"{n}.{f.func.__name__}") for n, f in _launchers()]
)
def test_every_launcher_reads_the_shared_digest(name, launcher) -> None:
    module = importlib.import_module(name)
    assert module.SHARED_HELPERS == shared.SOURCES_DIGEST
    assert "SHARED_HELPERS" in launcher.func.__code__.co_names
    refs = bridge.jit_function()._discover_global_refs(launcher.func)
    assert ("SHARED_HELPERS", name) in {(n, m) for n, m, _ in refs}


def test_the_digest_follows_the_sources(tmp_path) -> None:
    for path in Path(shared.__file__).parent.glob("*.py"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    assert shared.sources_digest(tmp_path) == shared.SOURCES_DIGEST
    helper = tmp_path / "gemm_blocks.py"
    helper.write_text(helper.read_text() + "\n# an edit\n")
    assert shared.sources_digest(tmp_path) != shared.SOURCES_DIGEST


NAME_KERNEL = """
import sys, torch
import aiter.ops.shared as shared
if len(sys.argv) > 1:
    shared.SOURCES_DIGEST = sys.argv[1]  # as if a shared helper had been edited
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.gemm.entry import gemm_a16w16
with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:
    gemm_a16w16(torch.empty(32, 256, dtype=torch.bfloat16, device="cuda"),
                torch.empty(128, 256, dtype=torch.bfloat16, device="cuda"))
print(requests[0].file_name)
"""


def _entry_name(cache: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", NAME_KERNEL, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), "FLYDSL_RUNTIME_CACHE_DIR": str(cache)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()[-1]


@pytest.mark.slow
def test_a_changed_shared_source_changes_the_kernel_key(tmp_path) -> None:
    same = _entry_name(tmp_path)
    assert _entry_name(tmp_path) == same  # stable across processes
    assert _entry_name(tmp_path, "0" * 64) != same
