"""`python -m aiter.aot.flydsl --info`: which cache the runtime will read, what it holds (archs,
modules, kernel counts) and whether the installed flydsl and torch are the ones it was built with.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from aiter import cache_location
from aiter.flydsl_bridge import manifest

# FlyDSL's cache keys hash its version, and torch's enters the traced kernels: a cache built with
# other versions misses on every lookup.
CHECKED_PACKAGES = ("flydsl", "torch")


def installed_versions() -> dict[str, str]:
    versions = {}
    for package in ("aiter", *CHECKED_PACKAGES):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return versions


def mismatches(built: Mapping[str, str], installed: Mapping[str, str]) -> list[str]:
    return [
        f"{package}: the cache was built with {built[package]}, {installed.get(package)} is "
        "installed"
        for package in CHECKED_PACKAGES
        if package in built and built[package] != installed.get(package)
    ]


def installed_arch_wheels() -> list[tuple[str, str, Path | None]]:
    """(arch, the aiter version that built it, its cache) of each installed cache-only wheel."""
    found = []
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(cache_location.ARCH_WHEEL_PREFIX):
            arch = name.removeprefix(cache_location.ARCH_WHEEL_PREFIX)
            wheel = cache_location.arch_wheel(arch)
            found.append((arch, wheel[1] if wheel else dist.version, wheel[0] if wheel else None))
    return sorted(found)


def _arch_wheel_lines() -> list[str]:
    import aiter

    machine = cache_location.machine_arch()
    lines = []
    for arch, version, path in installed_arch_wheels():
        notes = []
        if version != aiter.__version__:
            notes.append(f"VERSION MISMATCH built by aiter {version}, {aiter.__version__} is "
                         "installed: not served")  # fmt: skip
        if arch == machine:
            notes.append("this machine's arch")
        where = path if path is not None else "no cache in it"
        lines.append(f"  {cache_location.ARCH_WHEEL_PREFIX}{arch}: {where}"
                     + (f" ({'; '.join(notes)})" if notes else ""))  # fmt: skip
    if lines:
        lines.insert(0, f"cache wheels installed (machine arch: {machine or 'unknown'}):")
    return lines


def describe() -> list[str]:
    path, how = cache_location.current()
    lines = [f"runtime cache: {path} ({how})", *_arch_wheel_lines()]
    if how in cache_location.OVERLAYS.values():
        lines.append(
            "  read-only: the runtime reads it through a writable overlay of links under "
            f"{cache_location._overlay_root()} (where a compile on the serving path lands)"
        )
    if not manifest.manifest_path(path).is_file():
        lines.append("  no aiter manifest there: not built by the AOT builder (or empty)")
        return lines
    built = manifest.read(path)
    for arch, modules in sorted(built.archs.items()):
        counts = ", ".join(
            f"{m} {len(entries)}" for m, entries in sorted(modules.items()) if entries
        )
        lines.append(f"  {arch}: {counts or 'no'} kernels")
    installed = installed_versions()
    lines.append(
        "  built with: " + ", ".join(f"{p} {v}" for p, v in sorted(built.versions.items()))
        + "; installed: " + ", ".join(f"{p} {v}" for p, v in sorted(installed.items()))
    )  # fmt: skip
    problems = mismatches(built.versions, installed)
    for problem in problems:
        lines.append(f"  VERSION MISMATCH {problem}")
    if problems:
        lines.append(
            "  FlyDSL's cache keys hash its version: every lookup will miss. Rebuild the cache "
            "with the installed versions (python -m aiter.aot.flydsl) or install the ones above."
        )
    else:
        lines.append("  versions match: the runtime can serve from it")
    return lines


def main() -> int:
    for line in describe():
        print(line)
    return 0
