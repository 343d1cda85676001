"""Cache-only wheels, one per arch: `aiter-flydsl-cache-<arch>`, holding that arch's entries of a
built cache and its manifest, pinned to the aiter version that built it. `import aiter` serves
from the one installed for the machine's arch (aiter.cache_location).

    python -m aiter.aot.flydsl.cache_wheels CACHE_DIR -o DIST

The wheel step writes them with AITER_AOT_ARCH_WHEELS=DIST (aiter/aot/flydsl/wheel.py). A wheel
is a zip of the package, its `.dist-info` (METADATA, WHEEL, RECORD) and nothing else; entries
keep their names and bytes, and the zip's timestamps are fixed, so the same cache gives the same
wheel.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import aiter
from aiter.cache_location import ARCH_WHEEL_PREFIX, SHIPPED_DIR_NAME, arch_package
from aiter.flydsl_bridge import manifest
from aiter.flydsl_bridge.manifest import Manifest

ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: no build time in the wheel


def arch_manifest(built: Manifest, arch: str) -> Manifest:
    """The part of `built` about `arch`: its entries, and the builds of that arch alone."""
    builds = {k: b for k, b in built.builds.items() if b.archs == [arch]}
    return Manifest(versions=dict(built.versions), archs={arch: built.archs[arch]}, builds=builds)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write(archive: zipfile.ZipFile, name: str, data: bytes, record: list[str]) -> None:
    info = zipfile.ZipInfo(name, ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, data)
    record.append(_record_line(name, data))


def _package_init(arch: str, version: str) -> bytes:
    return (
        f'"""aiter\'s FlyDSL kernel cache for {arch}, built by aiter {version}; `import aiter` '
        'serves from it (flydsl_cache/)."""\n\n'
        f'ARCH = "{arch}"\nAITER_VERSION = "{version}"\n'
    ).encode()


def build_arch_wheel(cache: Path, arch: str, out_dir: Path, version: str) -> Path:
    """Write the cache-only wheel of `arch` from `cache` into `out_dir`; its path."""
    package = arch_package(arch)
    distribution = f"{ARCH_WHEEL_PREFIX}{arch}"
    dist_info = f"{package}-{version}.dist-info"
    path = out_dir / f"{package}-{version}-py3-none-any.whl"
    built = manifest.read(cache)
    with tempfile.TemporaryDirectory() as staging:
        # The arch's manifest, written by the manifest's own writer.
        manifest.change_manifest(staging, lambda _: arch_manifest(built, arch))
        manifest_bytes = manifest.manifest_path(staging).read_bytes()
    record: list[str] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with zipfile.ZipFile(temporary, "w") as archive:
        _write(archive, f"{package}/__init__.py", _package_init(arch, version), record)
        root = f"{package}/{SHIPPED_DIR_NAME}"
        _write(archive, f"{root}/{manifest.MANIFEST_NAME}", manifest_bytes, record)
        for rel in sorted(built.entries(arch)):
            _write(archive, f"{root}/{rel}", (cache / rel).read_bytes(), record)
        metadata = (
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
            f"Summary: aiter's FlyDSL kernel cache for {arch}\nRequires-Dist: aiter=={version}\n"
        )
        _write(archive, f"{dist_info}/METADATA", metadata.encode(), record)
        wheel = "Wheel-Version: 1.0\nGenerator: aiter\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        _write(archive, f"{dist_info}/WHEEL", wheel.encode(), record)
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", ZIP_TIME)
        archive.writestr(info, "\n".join(record) + "\n")
    temporary.replace(path)
    return path


def build_arch_wheels(cache: Path, out_dir: Path, version: str = aiter.__version__) -> list[Path]:
    """One cache-only wheel per arch the cache's manifest lists; ValueError naming the cache
    when it has no manifest or a listed entry is not whole."""
    if not manifest.manifest_path(cache).is_file():
        raise ValueError(f"{cache}: no {manifest.MANIFEST_NAME}: not a cache the builder made")
    built = manifest.read(cache)
    for arch in built.archs:
        for rel, entry in built.entries(arch).items():
            if (why := manifest.entry_problem(cache, arch, rel, entry)) is not None:
                raise ValueError(f"{cache}: {rel}: {why}; rebuild it before packing it")
    return [build_arch_wheel(cache, arch, out_dir, version) for arch in sorted(built.archs)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aiter.aot.flydsl.cache_wheels",
        description=f"Pack a built cache into one {ARCH_WHEEL_PREFIX}<arch> wheel per arch.",
    )
    parser.add_argument("cache", metavar="CACHE_DIR")
    parser.add_argument("-o", "--out-dir", required=True, metavar="DIST")
    args = parser.parse_args(argv)
    try:
        wheels = build_arch_wheels(Path(args.cache), Path(args.out_dir))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for path in wheels:
        print(f"{path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
