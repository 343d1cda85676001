"""What an AOT-built cache holds: every kernel entry with its size and content hash, who asked
for it, and the fingerprint of the build that made it, so a rebuild can tell it has nothing to do.

One JSON file at the cache root, replaced atomically; each build replaces its (arch, module) parts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiter.flydsl_bridge.entries import entry_defect, record_mismatch

MANIFEST_NAME = "aiter_aot_manifest.json"
FORMAT = 2


def manifest_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / MANIFEST_NAME


def read_manifest(cache_dir: str | Path) -> dict[str, Any]:
    """The manifest, or an empty one when there is none (or one of an older format)."""
    path = manifest_path(cache_dir)
    empty = {"format": FORMAT, "archs": {}, "builds": {}}
    if not path.is_file():
        return empty
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path}: not a valid aiter manifest ({err}); delete it to rebuild"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return empty  # written by another aiter: everything is replayed and it is rewritten
    return data


@contextlib.contextmanager
def _locked(cache_dir: str | Path) -> Iterator[None]:
    """Hold the manifest's lock: builders of other archs or modules into the same cache wait,
    so none loses another's part of the manifest."""
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(cache_dir) / f".{MANIFEST_NAME}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _readable_or_new(cache_dir: str | Path) -> dict[str, Any]:
    """The manifest to update; an unreadable one is started anew (its entries are listed again
    by the next build of each arch and module), never a reason to fail a build."""
    try:
        return read_manifest(cache_dir)
    except ValueError as err:
        print(f"warning: {err}; writing a new manifest", file=sys.stderr)
        return {"format": FORMAT, "archs": {}, "builds": {}}


def build_key(modules: Iterable[str], targets: Iterable[str]) -> str:
    return f"{','.join(sorted(modules))}|{';'.join(sorted(targets))}"


def update_manifest(
    cache_dir: str | Path,
    arch: str,
    module: str,
    kernels: Mapping[str, dict[str, Any]],
    versions: Mapping[str, str],
) -> Path:
    """Replace `module`'s kernels for `arch`; other archs and modules are kept as they were.

    `kernels` maps a cache entry (path relative to the cache root) to its function,
    compile-time parameters, size, sha256 and the jobs that asked for it. Every build record
    that covered this (arch, module) is dropped: its list of entries is no longer the one here.
    """
    with _locked(cache_dir):
        data = _readable_or_new(cache_dir)
        data["versions"] = dict(versions)
        data["archs"].setdefault(arch, {})[module] = dict(kernels)
        builds = data["builds"]
        for key in [k for k, b in builds.items() if arch in b["archs"] and module in b["modules"]]:
            del builds[key]
        return _write(cache_dir, data)


def record_build(
    cache_dir: str | Path,
    modules: Iterable[str],
    archs: Iterable[str],
    targets: Iterable[str],
    fingerprint: str,
    inputs: Mapping[str, Any],
) -> Path:
    """Say that a build of `modules` for `targets` with this fingerprint completed."""
    with _locked(cache_dir):
        data = _readable_or_new(cache_dir)
        data["builds"][build_key(modules, targets)] = {
            "fingerprint": fingerprint,
            "modules": sorted(modules),
            "archs": sorted(archs),
            "inputs": dict(inputs),
        }
        return _write(cache_dir, data)


def memo_entries(
    data: Mapping[str, Any], modules: Iterable[str], targets: Iterable[str], fingerprint: str
) -> dict[str, dict[str, Any]] | None:
    """The entries a completed build with this fingerprint listed (relative path -> record), or
    None when no such build is recorded."""
    build = data.get("builds", {}).get(build_key(modules, targets))
    if not build or build.get("fingerprint") != fingerprint:
        return None
    entries: dict[str, dict[str, Any]] = {}
    for arch in build["archs"]:
        for module in build["modules"]:
            kernels = data["archs"].get(arch, {}).get(module)
            if kernels is None:
                return None
            for rel, record in kernels.items():
                entries[rel] = {**record, "arch": arch}
    return entries


def entry_problem(cache_dir: str | Path, rel: str, record: Mapping[str, Any]) -> str | None:
    """Why an entry the manifest lists is not the one the build wrote, or None when it is:
    missing, another size or content, or not an AMDGPU code object of the arch it serves."""
    path = Path(cache_dir) / rel
    if not path.is_file():
        return "missing"
    return record_mismatch(path, record) or entry_defect(path, record["arch"])


def _write(cache_dir: str | Path, data: Mapping[str, Any]) -> Path:
    path = manifest_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{MANIFEST_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
