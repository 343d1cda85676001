"""The typed manifest of an AOT-built cache: every kernel entry with its size and content hash, who
asked for it, and the fingerprint of each completed build, so a rebuild can tell it has nothing to do.

One JSON file at the cache root (`MANIFEST_NAME`), and this module is the only code that parses or
writes it. `read` is its one reader: a process reads an unchanged manifest once. `update_manifest`
and `record_build` change it through its one writer, a read-modify-write under a file lock whose
result replaces the file atomically; each build replaces its (arch, module) parts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiter.flydsl_bridge.entries import entry_defect, file_digest
from aiter.typed_json import from_json, to_json

MANIFEST_NAME = "aiter_aot_manifest.json"
# The files of a cache that are aiter's and FlyDSL's bookkeeping, not kernels: the manifest, its
# temporaries and every lock file.
BOOKKEEPING_PATTERNS = (f"{MANIFEST_NAME}*", f".{MANIFEST_NAME}*", "*.lock")
FORMAT = 3  # a manifest of another format reads as empty: everything is replayed and rewritten


# --- the schema ---


@dataclass(frozen=True)
class Requester:
    """A replay job that asked for an entry, and the range of its axis over which it did."""

    module: str  # the AOT module, e.g. "gemm"
    table: str  # the table's file name (or a grid's name)
    row: str  # "path:line" of the row, or a grid point's label
    axis: str  # the axis the job ranges over, e.g. "M"
    lo: int  # inclusive range of the axis over which the call asks for the entry
    hi: int
    fixed: dict[str, int] = field(default_factory=dict)  # the other axes' values (grids)
    variant: str = ""  # the caller variant, e.g. "out_dtype=float16"


@dataclass(frozen=True)
class KernelEntry:
    """One cache entry a build wrote or found: the kernel, its bytes and who asked for it."""

    function: str  # the @flyc.jit function
    params: str  # its compile-time parameters, "name=value ..."
    size: int  # bytes of the entry file
    sha256: str  # of the entry file
    compile_seconds: float = 0.0  # what compiling it took; 0.0 when no build measured it
    requested_by: list[Requester] = field(default_factory=list)

    def mismatch(self, path: str | Path) -> str | None:
        """Why the file at `path` is not the one this entry records, or None when it is."""
        size, digest = file_digest(path)
        if size != self.size or digest != self.sha256:
            return f"changed since the build that listed it (size {size}, recorded {self.size})"
        return None


@dataclass(frozen=True)
class BuildRecord:
    """A build that completed without a FAIL: which modules and archs, and its fingerprint."""

    fingerprint: str
    modules: list[str]
    archs: list[str]
    inputs: dict[str, Any] = field(default_factory=dict)  # what entered the fingerprint
    shard: str = ""  # "I/N": this build replayed only that part of the jobs (--shard)
    targets: list[str] = field(default_factory=list)  # e.g. ["gfx942:304"]

    def covers(self, arch: str, module: str) -> bool:
        return arch in self.archs and module in self.modules


@dataclass(frozen=True)
class Manifest:
    """The whole manifest. The one `read` returns is shared by the process: never change it."""

    versions: dict[str, str] = field(default_factory=dict)  # package -> version it was built with
    # arch -> module -> entry path relative to the cache root -> entry
    archs: dict[str, dict[str, dict[str, KernelEntry]]] = field(default_factory=dict)
    builds: dict[str, BuildRecord] = field(default_factory=dict)  # build_key(...) -> record
    format: int = FORMAT

    def entries(self, arch: str | None = None) -> dict[str, KernelEntry]:
        """Every entry (relative path -> entry) of every module for `arch`, or of every arch."""
        archs = self.archs.values() if arch is None else [self.archs.get(arch, {})]
        return {
            rel: entry
            for modules in archs
            for kernels in modules.values()
            for rel, entry in kernels.items()
        }

    def build_entries(
        self, modules: Iterable[str], targets: Iterable[str], fingerprint: str
    ) -> dict[str, dict[str, KernelEntry]] | None:
        """The entries (arch -> relative path -> entry) a completed build of `modules` for
        `targets` with this fingerprint listed, or None when no such build is recorded."""
        build = self.builds.get(build_key(modules, targets))
        if build is None or build.fingerprint != fingerprint:
            return None
        listed: dict[str, dict[str, KernelEntry]] = {}
        for arch in build.archs:
            for module in build.modules:
                kernels = self.archs.get(arch, {}).get(module)
                if kernels is None:
                    return None
                listed.setdefault(arch, {}).update(kernels)
        return listed

    def mean_compile_seconds(self) -> dict[str, float]:
        """Mean compile seconds per kernel function, over every entry a build timed (all archs)."""
        seconds: dict[str, list[float]] = {}
        for entry in self.entries().values():
            if entry.compile_seconds:
                seconds.setdefault(entry.function, []).append(entry.compile_seconds)
        return {function: sum(v) / len(v) for function, v in seconds.items()}

    def compile_seconds(self, arch: str) -> dict[str, float]:
        """The compile seconds recorded for each entry (relative path) of `arch`."""
        return {rel: entry.compile_seconds for rel, entry in self.entries(arch).items()}


def manifest_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / MANIFEST_NAME


def build_key(modules: Iterable[str], targets: Iterable[str], shard: str = "") -> str:
    key = f"{','.join(sorted(modules))}|{';'.join(sorted(targets))}"
    return f"{key}|shard {shard}" if shard else key


def entry_problem(cache_dir: str | Path, arch: str, rel: str, entry: KernelEntry) -> str | None:
    """Why an entry the manifest lists for `arch` is not the one the build wrote, or None when it
    is: missing, another size or content, or not an AMDGPU code object of the arch it serves."""
    path = Path(cache_dir) / rel
    if not path.is_file():
        return "missing"
    return entry.mismatch(path) or entry_defect(path, arch)


# --- the one reader ---

# absolute manifest path -> (mtime_ns, size, inode) of the file read, and what it held
_read_before: dict[str, tuple[tuple[int, int, int], Manifest]] = {}


def read(cache_dir: str | Path) -> Manifest:
    """The manifest of the cache at `cache_dir`; an empty one when there is none (or one of
    another format). ValueError when the file is not a manifest.

    A process reads the file once while it is unchanged (same mtime, size and inode: every write
    replaces it by a new file), so every caller gets the same Manifest: never change it.
    """
    path = manifest_path(cache_dir)
    try:
        st = path.stat()
    except FileNotFoundError:
        return Manifest()
    if not stat.S_ISREG(st.st_mode):
        return Manifest()
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    key = os.path.abspath(path)
    known = _read_before.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    # Read after the stat: a write in between only makes the next read read again.
    manifest = _load(path)
    _read_before[key] = (stamp, manifest)
    return manifest


def read_at(path: str | Path) -> Manifest:
    """The manifest at `path`, the file itself or the cache directory holding it; ValueError
    naming `path` when there is none there, or it is not a manifest."""
    where = Path(path)
    file = manifest_path(where) if where.is_dir() else where
    if file.name != MANIFEST_NAME or not file.is_file():
        raise ValueError(
            f"{path}: expected an aiter manifest ({MANIFEST_NAME}) or the cache directory "
            "holding one"
        )
    return read(file.parent)


def _load(path: Path) -> Manifest:
    def invalid(err: Exception) -> ValueError:
        return ValueError(f"{path}: not a valid aiter manifest ({err}); delete it to rebuild")

    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise invalid(err) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return Manifest()  # written by another aiter: everything is replayed and it is rewritten
    try:
        return from_json(Manifest, data)
    except (TypeError, KeyError, AttributeError) as err:
        raise invalid(f"{type(err).__name__}: {err}") from None


# --- the one writer ---


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


def change_manifest(cache_dir: str | Path, change: Callable[[Manifest], Manifest]) -> Path:
    """Replace the manifest by `change` of it, under the lock (so `change` may also write the
    entries it lists: other writers wait). The file is read anew (another builder may have
    written it); an unreadable one is started anew (its entries are listed again by the next
    build of each arch and module), never a reason to fail a build."""
    path = manifest_path(cache_dir)
    with _locked(cache_dir):
        try:
            current = _load(path) if path.is_file() else Manifest()
        except ValueError as err:
            print(f"warning: {err}; writing a new manifest", file=sys.stderr)
            current = Manifest()
        manifest = change(current)
        data = to_json(manifest)
        tmp = path.with_name(f".{MANIFEST_NAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
        # This process has just written it: no need to read it back. A copy, so that the
        # caller's own objects are not the shared ones.
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        _read_before[os.path.abspath(path)] = (stamp, from_json(Manifest, data))
    return path


def update_manifest(
    cache_dir: str | Path,
    arch: str,
    module: str,
    kernels: Mapping[str, KernelEntry],
    versions: Mapping[str, str],
    merge: bool = False,
) -> Path:
    """Replace `module`'s kernels for `arch` (entry path relative to the cache root -> entry),
    or with `merge` add them to those listed (requesters of an entry listed both ways joined);
    other archs and modules are kept as they were. Without `merge`, every build record that
    covered this (arch, module) is dropped: its list of entries is no longer the one here."""

    def change(current: Manifest) -> Manifest:
        archs = {a: dict(modules) for a, modules in current.archs.items()}
        listed = dict(archs.get(arch, {}).get(module, {})) if merge else {}
        for rel, entry in kernels.items():
            old = listed.get(rel)
            if old is not None:
                joined = [*old.requested_by]
                joined += [r for r in entry.requested_by if r not in joined]
                entry = replace(entry, requested_by=joined)
            listed[rel] = entry
        archs.setdefault(arch, {})[module] = listed
        if merge:
            return Manifest(versions=dict(versions), archs=archs, builds=dict(current.builds))
        builds = {k: b for k, b in current.builds.items() if not b.covers(arch, module)}
        return Manifest(versions=dict(versions), archs=archs, builds=builds)

    return change_manifest(cache_dir, change)


def record_build(
    cache_dir: str | Path,
    modules: Iterable[str],
    archs: Iterable[str],
    targets: Iterable[str],
    fingerprint: str,
    inputs: Mapping[str, Any],
    shard: str = "",
) -> Path:
    """Say that a build of `modules` for `targets` with this fingerprint completed (`shard`:
    the part I/N of its jobs it replayed)."""
    modules, archs, targets = list(modules), list(archs), list(targets)
    record = BuildRecord(
        fingerprint, sorted(modules), sorted(archs), dict(inputs), shard, sorted(targets)
    )

    def change(current: Manifest) -> Manifest:
        builds = {**current.builds, build_key(modules, targets, shard): record}
        return Manifest(versions=current.versions, archs=current.archs, builds=builds)

    return change_manifest(cache_dir, change)


def union(
    current: Manifest, parts: Iterable[Manifest], kept: Mapping[str, KernelEntry]
) -> Manifest:
    """`current` with every entry and build record of `parts` added: an entry listed several
    times becomes `kept[relative path]` with the requesters of all joined. Shard records that
    together make every part of one build (0/N .. N-1/N, one fingerprint) also record that
    build unsharded, so a rebuild of it over the merged cache replays nothing."""
    parts = [current, *parts]
    archs: dict[str, dict[str, dict[str, KernelEntry]]] = {}
    for part in parts:
        for arch, modules in part.archs.items():
            for module, kernels in modules.items():
                listed = archs.setdefault(arch, {}).setdefault(module, {})
                for rel, entry in kernels.items():
                    old = listed.get(rel)
                    joined = [*old.requested_by] if old is not None else []
                    joined += [r for r in entry.requested_by if r not in joined]
                    listed[rel] = replace(kept.get(rel, entry), requested_by=joined)
    builds = {k: b for part in parts for k, b in part.builds.items()}
    shards: dict[tuple, dict[int, BuildRecord]] = {}
    for record in builds.values():
        if record.shard:
            index, count = (int(v) for v in record.shard.split("/"))
            group = (tuple(record.modules), tuple(record.targets), record.fingerprint, count)
            shards.setdefault(group, {})[index] = record
    for (modules, targets, _, count), records in shards.items():
        if len(records) == count:
            whole = replace(records[0], shard="")
            builds[build_key(modules, targets)] = whole
    versions = next((p.versions for p in reversed(parts) if p.versions), {})
    return Manifest(versions=dict(versions), archs=archs, builds=builds)
