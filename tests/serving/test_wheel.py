"""The shipped cache: a wheel built with AITER_AOT=1 for gfx942 from a small table holds the cache
and its manifest; installed into a fresh virtualenv, a process serves from it under RUN_ONLY with
no cache variable set; the user's FLYDSL_RUNTIME_CACHE_DIR wins; `--info` reports a version
mismatch; a cache wheel of the arch packed from that cache serves in a virtualenv of its own; a
read-only shipped cache (a read-only bind mount where the machine allows one, else
AITER_CACHE_READONLY=1) serves and survives a compile on the serving path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from aiter.ops.conv3d.table import CONV3D
from aiter.ops.fmha_fp8.table import FMHA_FP8
from aiter.ops.gemm.table import (
    A16W16,
)
from aiter.ops.moe.routing_table import MOE_ROUTING
from aiter.ops.moe.table import FMOE
from tests.aot_cli import REPO, other_tables

pytestmark = pytest.mark.slow  # builds a wheel (and its cache)

# The serving process reads the default tables (no row for N = K = 256): its heuristic must pick
# the kernel this row names, as the wheel's build does.
ROW = "gfx942,304,32,256,256,0,torch.bfloat16,torch.bfloat16,flydsl,0,,flydsl_a16w16_mfma_32x64x128"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    tables = work / "tables"
    tables.mkdir()
    for spec in (*other_tables(A16W16), FMOE, MOE_ROUTING, CONV3D, FMHA_FP8, CHUNK_GDN_H):
        (tables / spec.name).write_text(",".join(spec.header) + "\n")
    (tables / A16W16.name).write_text(",".join(A16W16.header) + f"\n{ROW}\n")
    env = {**os.environ, "AITER_AOT": "1", "GPU_ARCHS": "gfx942", "AITER_CONFIG_DIR": str(tables)}
    env.pop("FLYDSL_RUNTIME_CACHE_DIR", None)
    command = [sys.executable, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps"]
    proc = subprocess.run(
        [*command, "-v", "-w", str(work / "dist")], cwd=REPO, env=env, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = (work / "dist").glob("aiter-*.whl")
    return path, _venv(work / "venv", path), proc.stdout + proc.stderr


def _venv(venv: Path, *wheels: Path) -> tuple[Path, Path]:
    """A fresh virtualenv with `wheels` installed: (its python, its site-packages). The
    dependencies (torch, flydsl, pandas) come from this interpreter's site-packages through a
    .pth line, which, unlike a site directory, does not run that directory's .pth files (so the
    repository's editable install stays out)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    (site / "aiter_test_dependencies.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    install = [str(python), "-m", "pip", "install", "--no-deps", "--no-index", *map(str, wheels)]
    subprocess.run(install, check=True, capture_output=True)
    return python, site


@pytest.fixture(scope="module")
def arch_wheel_venv(wheel, tmp_path_factory):
    """aiter's wheel without its cache (as the wheel step with AITER_AOT_ARCH_WHEELS leaves it:
    tests/serving/test_cache_wheels.py) and the gfx942 cache wheel packed from that cache by the
    installed aiter, in a fresh virtualenv."""
    path, (python, site), _ = wheel
    work = tmp_path_factory.mktemp("arch-wheel")
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLYDSL_RUNTIME_CACHE_DIR")
    }
    pack = [str(python), "-m", "aiter.aot.flydsl.cache_wheels", str(site / "aiter" / "flydsl_cache"),
            "-o", str(work / "dist")]  # fmt: skip
    subprocess.run(pack, check=True, capture_output=True, env=env, cwd=work)
    (arch_wheel,) = (work / "dist").glob("aiter_flydsl_cache_gfx942-*.whl")
    venv = _venv(work / "venv", path, arch_wheel)
    shutil.rmtree(venv[1] / "aiter" / "flydsl_cache")
    return venv


def test_the_wheel_holds_the_cache_and_its_manifest(wheel):
    path, _, log = wheel
    names = zipfile.ZipFile(path).namelist()
    assert "aiter/flydsl_cache/aiter_aot_manifest.json" in names
    entries = [n for n in names if n.startswith("aiter/flydsl_cache/") and n.endswith(".pkl")]
    assert entries and not [n for n in names if n.endswith((".lock", ".tmp"))]
    assert "aiter: shipped cache gfx942: " in log


SERVE = textwrap.dedent("""
    import os, sys, torch
    import aiter
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    print("aiter from", aiter.__file__)
    print("cache", os.environ.get("FLYDSL_RUNTIME_CACHE_DIR"))
    m, with_bias = int(sys.argv[1]), sys.argv[2:] == ["bias"]
    with dry_run("gfx942", 304, bridge.MODE_COMPILE):
        a = torch.empty((m, 256), dtype=torch.bfloat16, device="cuda")
        b = torch.empty((256, 256), dtype=torch.bfloat16, device="cuda")
        bias = torch.empty((256,), dtype=torch.bfloat16, device="cuda") if with_bias else None
        aiter.gemm_a16w16(a, b, bias, out_dtype=torch.bfloat16)
    print("served")
    """)


def _run(venv: tuple[Path, Path], args: list[str], tmp_path: Path, **env: str):
    """The fresh virtualenv's python (its aiter is the installed wheel), with no cache variable
    and no PYTHONPATH, and `env` on top."""
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    unset = ("FLYDSL_RUNTIME_CACHE_DIR", "PYTHONPATH", "FLYDSL_RUNTIME_RUN_ONLY")
    full = {k: v for k, v in os.environ.items() if k not in unset} | env
    return subprocess.run(
        [str(venv[0]), *args], cwd=tmp_path, env=full, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


def test_an_installed_wheel_serves_from_its_cache_alone(wheel, tmp_path):
    _, venv, _ = wheel
    site = venv[1]
    proc = _run(venv, [str(tmp_path / "serve.py"), "20"], tmp_path, FLYDSL_RUNTIME_RUN_ONLY="1")
    assert proc.returncode == 0 and "served" in proc.stdout, proc.stderr[-3000:]
    assert f"aiter from {site}" in proc.stdout
    assert f"cache {site / 'aiter' / 'flydsl_cache'}" in proc.stdout


def test_an_installed_cache_wheel_of_the_machines_arch_serves_alone(arch_wheel_venv, tmp_path):
    site = arch_wheel_venv[1]
    proc = _run(arch_wheel_venv, [str(tmp_path / "serve.py"), "20"], tmp_path,
                FLYDSL_RUNTIME_RUN_ONLY="1", FLYDSL_GPU_ARCH="gfx942")  # fmt: skip
    assert proc.returncode == 0 and "served" in proc.stdout, proc.stderr[-3000:]
    assert f"cache {site / 'aiter_flydsl_cache_gfx942' / 'flydsl_cache'}" in proc.stdout
    info = _run(arch_wheel_venv, ["-m", "aiter.aot.flydsl", "--info"], tmp_path,
                FLYDSL_GPU_ARCH="gfx942")  # fmt: skip
    assert "(arch wheel)" in info.stdout and "versions match" in info.stdout, info.stdout


def test_the_users_cache_directory_wins(wheel, tmp_path):
    _, venv, _ = wheel
    mine = tmp_path / "mine"
    proc = _run(venv, [str(tmp_path / "serve.py"), "20"], tmp_path, FLYDSL_RUNTIME_RUN_ONLY="1",
                FLYDSL_RUNTIME_CACHE_DIR=str(mine))  # fmt: skip
    assert proc.returncode != 0 and f"cache {mine}" in proc.stdout


def test_info_names_the_shipped_cache_and_a_version_mismatch(wheel, tmp_path):
    _, venv, _ = wheel
    site = venv[1]
    info = ["-m", "aiter.aot.flydsl", "--info"]
    proc = _run(venv, info, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"runtime cache: {site / 'aiter' / 'flydsl_cache'} (shipped)" in proc.stdout
    assert "gfx942: gemm " in proc.stdout and "versions match" in proc.stdout
    other = tmp_path / "other"
    other.mkdir()
    manifest = json.loads((site / "aiter/flydsl_cache/aiter_aot_manifest.json").read_text())
    manifest["versions"]["flydsl"] = "0.0.1"
    (other / "aiter_aot_manifest.json").write_text(json.dumps(manifest))
    proc = _run(venv, info, tmp_path, FLYDSL_RUNTIME_CACHE_DIR=str(other))
    assert "VERSION MISMATCH flydsl: the cache was built with 0.0.1" in proc.stdout
    assert "every lookup will miss" in proc.stdout


# Runs a command with `directory` bind-mounted read-only over itself, in a mount namespace of
# its own: what a wheel installed on a read-only image layer looks like, even to root.
READ_ONLY_MOUNT = ["unshare", "--mount", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"']


def _why_no_read_only_mount(tmp_path: Path) -> str | None:
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        done = subprocess.run(
            [*READ_ONLY_MOUNT, str(probe), "sh", "-c", f'! touch "{probe}/file" 2>/dev/null'],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        return "no unshare command"
    if done.returncode != 0:
        return f"cannot make a read-only bind mount here: {done.stderr.strip()[-200:]}"
    return None


def test_a_shipped_cache_on_a_read_only_mount_serves_and_survives_a_compile(
    wheel, tmp_path, rocm_path
):
    """No AITER_CACHE_READONLY: the runtime finds out itself that it cannot write there."""
    reason = _why_no_read_only_mount(tmp_path)
    if reason:
        pytest.skip(reason)
    _, venv, _ = wheel
    shipped = venv[1] / "aiter" / "flydsl_cache"
    before = sorted(p.relative_to(shipped) for p in shipped.rglob("*"))
    overlay = tmp_path / "overlay"
    # The virtualenv's python behind a script that mounts the shipped cache read-only first.
    python = tmp_path / "python-read-only-cache"
    mount = " ".join(f"'{arg}'" for arg in READ_ONLY_MOUNT)
    python.write_text(f'#!/bin/sh\n{mount} "{shipped}" "{venv[0]}" "$@"\n')
    python.chmod(0o755)
    launcher = (python, venv[1])
    env = {"AITER_CACHE_OVERLAY_DIR": str(overlay)}
    served = _run(launcher, [str(tmp_path / "serve.py"), "20"], tmp_path,
                  FLYDSL_RUNTIME_RUN_ONLY="1", **env)  # fmt: skip
    assert served.returncode == 0, served.stderr[-3000:]
    assert f"cache {overlay}" in served.stdout
    compiled = _run(launcher, [str(tmp_path / "serve.py"), "20", "bias"], tmp_path,
                    ROCM_PATH=rocm_path, **env)  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert sorted(p.relative_to(shipped) for p in shipped.rglob("*")) == before
    assert [p for p in overlay.rglob("*.pkl") if not p.is_symlink()]


def test_a_read_only_shipped_cache_serves_and_survives_a_compile(wheel, tmp_path, rocm_path):
    _, venv, _ = wheel
    site = venv[1]
    shipped = site / "aiter" / "flydsl_cache"
    before = sorted(p.relative_to(shipped) for p in shipped.rglob("*"))
    ro = {"AITER_CACHE_READONLY": "1", "AITER_CACHE_OVERLAY_DIR": str(tmp_path / "overlay")}
    served = _run(venv, [str(tmp_path / "serve.py"), "20"], tmp_path, FLYDSL_RUNTIME_RUN_ONLY="1",
                  **ro)  # fmt: skip
    assert served.returncode == 0, served.stderr[-3000:]
    assert f"cache {tmp_path / 'overlay'}" in served.stdout
    # With a bias the shape is not tabled and its kernel not shipped: the call compiles.
    compiled = _run(
        venv, [str(tmp_path / "serve.py"), "20", "bias"], tmp_path, ROCM_PATH=rocm_path, **ro
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert sorted(p.relative_to(shipped) for p in shipped.rglob("*")) == before
    overlay_entries = [p for p in (tmp_path / "overlay").rglob("*.pkl") if not p.is_symlink()]
    assert overlay_entries  # the new kernel landed in the overlay
