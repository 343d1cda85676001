"""Cache-only wheels per arch: packed from a built cache (one per arch, that arch's entries and
manifest, pinned to this aiter version, the same bytes for the same cache), installable by pip,
written by the wheel step with AITER_AOT_ARCH_WHEELS; `import aiter` serves from the one of the
machine's arch (named by FlyDSL's variables or the kernel driver's topology) when this aiter
built it, and `--info` lists them. tests/serving/test_wheel.py serves from one for real."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import aiter
from aiter import cache_location
from aiter.aot.flydsl import cache_wheels, wheel
from aiter.flydsl_bridge import manifest
from aiter.flydsl_bridge.manifest import KernelEntry, Requester

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A built cache of two archs, its entries stand-ins (the code-object check is left out)."""
    monkeypatch.setattr(manifest, "entry_defect", lambda path, arch: None)
    monkeypatch.setattr(manifest, "_read_before", {})
    root = tmp_path / "cache"
    for arch, rel in (("gfx942", "k_942/a.pkl"), ("gfx950", "k_950/b.pkl")):
        (root / rel).parent.mkdir(parents=True)
        data = f"entry of {arch}".encode()
        (root / rel).write_bytes(data)
        asked = Requester("gemm", "t.csv", "t.csv:2", "M", 1, 64)
        entry = KernelEntry("f", "", len(data), hashlib.sha256(data).hexdigest(), 1.0, [asked])
        manifest.update_manifest(root, arch, "gemm", {rel: entry}, {"flydsl": "0.4.2"})
        manifest.record_build(root, ["gemm"], [arch], [arch], "fp", {})
    return root


def _names(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def test_one_wheel_per_arch_with_its_entries_alone(cache, tmp_path) -> None:
    wheels = cache_wheels.build_arch_wheels(cache, tmp_path / "dist")
    version = aiter.__version__
    assert [w.name for w in wheels] == [
        f"aiter_flydsl_cache_{arch}-{version}-py3-none-any.whl" for arch in ("gfx942", "gfx950")
    ]
    names = _names(wheels[0])
    assert "aiter_flydsl_cache_gfx942/flydsl_cache/k_942/a.pkl" in names
    assert not any("k_950" in n for n in names)
    with zipfile.ZipFile(wheels[0]) as archive:
        metadata = archive.read(f"aiter_flydsl_cache_gfx942-{version}.dist-info/METADATA")
    assert f"Requires-Dist: aiter=={version}" in metadata.decode()
    again = cache_wheels.build_arch_wheels(cache, tmp_path / "again")
    assert wheels[0].read_bytes() == again[0].read_bytes()  # the same cache, the same wheel


def test_a_cache_with_a_broken_entry_is_not_packed(cache, tmp_path) -> None:
    (cache / "k_942/a.pkl").write_bytes(b"other")
    with pytest.raises(ValueError, match=r"k_942/a.pkl: changed since the build that listed it"):
        cache_wheels.build_arch_wheels(cache, tmp_path / "dist")


def _installed(cache: Path, tmp_path: Path, version: str = aiter.__version__) -> Path:
    """The gfx942 wheel installed by pip into a directory of its own."""
    [path] = [w for w in cache_wheels.build_arch_wheels(cache, tmp_path / "dist", version)
              if "gfx942" in w.name]  # fmt: skip
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(site), str(path)], check=True, capture_output=True)  # fmt: skip
    return site


def _python(site: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "FLYDSL_RUNTIME_CACHE_DIR"}
    full |= {"PYTHONPATH": f"{site}{os.pathsep}{REPO}", **env}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full, capture_output=True,
                          text=True, check=False)  # fmt: skip


WHERE = "import aiter; from aiter import cache_location as c; print(*c.current())"


def test_import_aiter_serves_from_the_wheel_of_the_machines_arch(cache, tmp_path) -> None:
    site = _installed(cache, tmp_path)
    served = site / "aiter_flydsl_cache_gfx942" / "flydsl_cache"
    proc = _python(site, WHERE, FLYDSL_GPU_ARCH="gfx942")
    assert proc.stdout.split() == [str(served), "arch", "wheel"], proc.stderr
    other = _python(site, WHERE, FLYDSL_GPU_ARCH="gfx950")  # not installed: FlyDSL's default
    assert other.stdout.split()[-2:] == ["flydsl", "default"]
    info = _python(
        site,
        "from aiter.aot.flydsl.distribution.info import main; main()",
        FLYDSL_GPU_ARCH="gfx942",
    )
    assert "cache wheels installed (machine arch: gfx942):" in info.stdout
    assert f"aiter-flydsl-cache-gfx942: {served} (this machine's arch)" in info.stdout


def test_a_wheel_another_aiter_built_is_listed_and_not_served(cache, tmp_path) -> None:
    site = _installed(cache, tmp_path, version="0.0.9")
    proc = _python(site, WHERE, FLYDSL_GPU_ARCH="gfx942")
    assert proc.stdout.split()[-2:] == ["flydsl", "default"]
    info = _python(
        site,
        "from aiter.aot.flydsl.distribution.info import main; main()",
        FLYDSL_GPU_ARCH="gfx942",
    )
    assert "VERSION MISMATCH built by aiter 0.0.9" in info.stdout


@pytest.mark.parametrize(
    "env, arch",
    [
        ({"FLYDSL_GPU_ARCH": "GFX950"}, "gfx950"),
        ({"HSA_OVERRIDE_GFX_VERSION": "9.4.2"}, "gfx942"),
        ({}, "gfx1250"),  # from the topology below
    ],
)
def test_the_machines_arch(env, arch, tmp_path) -> None:
    nodes = tmp_path / "nodes"
    for node, version in (("0", 0), ("1", 120500), ("2", 90402)):  # a CPU node, then two GPUs
        (nodes / node).mkdir(parents=True)
        (nodes / node / "properties").write_text(
            f"cpu_cores_count 1\ngfx_target_version {version}\n"
        )
    assert cache_location.machine_arch(env, nodes) == arch
    assert cache_location.machine_arch({}, tmp_path / "none") is None


def test_the_wheel_step_writes_cache_wheels_and_ships_none(cache, tmp_path, monkeypatch) -> None:
    import aiter.aot.flydsl.driver as driver

    monkeypatch.setattr(driver, "main", lambda modules, argv: 0)  # --check of the prebuilt cache
    build_lib = tmp_path / "build"
    (build_lib / "aiter").mkdir(parents=True)
    env = {wheel.PREBUILT_ENV: str(cache), wheel.ARCH_WHEELS_ENV: str(tmp_path / "dist")}
    assert wheel.build_shipped_cache(build_lib, env) == 0
    assert not (build_lib / "aiter" / cache_location.SHIPPED_DIR_NAME).exists()
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "dist").glob("*.whl")) == [
        "aiter_flydsl_cache_gfx942", "aiter_flydsl_cache_gfx950",
    ]  # fmt: skip
