"""A fingerprint of everything an AOT replay reads: sources, tuned tables, environment, package
versions, targets and options. A rebuild whose fingerprint matches the manifest replays nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiter.flydsl_bridge.env import KEY_ENV_VARS

# Bumped whenever the encoding below changes, so an old manifest never matches by accident.
FORMAT = "aiter-aot-fingerprint/1"
VERSIONED_PACKAGES = ("aiter", "flydsl", "torch")
AITER_ENV_PREFIX = "AITER_"
TARGETS_ENV = "GPU_ARCHS"
# Python and tables, and the built C++ host planner: its formulas choose kernels too.
_SOURCE_SUFFIXES = (".py", ".csv", ".so")


@dataclass(frozen=True)
class FingerprintInputs:
    """What a replay's result depends on. Only `tables` is order-sensitive (merge order)."""

    sources: tuple[str, ...]  # python, CSV and extension files whose bytes count
    tables: tuple[str, ...]  # every merged tuned-table file, in merge order
    env: tuple[tuple[str, str], ...]  # variables that enter FlyDSL's keys or aiter's choices
    versions: tuple[tuple[str, str], ...]  # (package, version)
    targets: tuple[str, ...]  # e.g. ("gfx942:304", "gfx950")
    options: tuple[tuple[str, str], ...]  # replay options that change what is built


def _package_dir() -> Path:
    import aiter

    return Path(aiter.__file__).resolve().parent


def package_sources(extra_files: Iterable[str | Path] = ()) -> list[str]:
    """Every *.py, *.csv and *.so file of the installed aiter package (sorted), then
    `extra_files`."""
    root = _package_dir()
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        found.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(_SOURCE_SUFFIXES))
    found.sort()
    seen = set(found)
    for extra in extra_files:
        path = os.path.abspath(extra)
        if path not in seen:
            seen.add(path)
            found.append(path)
    return found


def fingerprint_env(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """FlyDSL's cache-key variables ("" when unset), every set AITER_* variable and GPU_ARCHS.

    FLYDSL_RUNTIME_CACHE_DIR is left out: where the cache lives does not change its entries.
    """
    env = os.environ if environ is None else environ
    names = {*KEY_ENV_VARS, TARGETS_ENV}
    names.update(name for name in env if name.startswith(AITER_ENV_PREFIX))
    return tuple(sorted((name, env.get(name, "")) for name in names))


def package_versions() -> tuple[tuple[str, str], ...]:
    """Installed versions of aiter, FlyDSL and torch, from package metadata ("missing" if absent)."""
    from importlib import metadata

    versions = []
    for package in VERSIONED_PACKAGES:
        try:
            versions.append((package, metadata.version(package)))
        except metadata.PackageNotFoundError:
            versions.append((package, "missing"))
    return tuple(versions)


def _display_path(path: str, base: Path) -> str:
    """The path relative to the directory holding the aiter package when inside it (so a moved
    checkout keeps its fingerprint), else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(base).as_posix()
    except ValueError:
        return absolute.as_posix()


def _read(path: str) -> tuple[str, bytes]:
    """("bytes", content), or ("error", what went wrong) for a file that cannot be read."""
    try:
        with open(path, "rb") as f:
            return "bytes", f.read()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return "error", f"{type(exc).__name__}: {reason}".encode()


def _canonical_sources(paths: Iterable[str], base: Path) -> list[tuple[str, str]]:
    """(display path, path) of each distinct source, sorted by display path."""
    unique = {_display_path(p, base): p for p in paths}
    return sorted(unique.items())


def _put(digest: Any, *fields: str | bytes) -> None:
    # Each field is length-prefixed, so no two different field sequences share an encoding.
    for field in fields:
        data = field.encode("utf-8", "surrogateescape") if isinstance(field, str) else field
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)


def compute(inputs: FingerprintInputs) -> str:
    """sha256 hex digest of the inputs: file paths and bytes, env, versions, targets, options.

    Sources, env, versions, targets and options are sorted first, their order meaning nothing.
    """
    base = _package_dir().parent
    digest = hashlib.sha256()
    _put(digest, FORMAT)
    sources = _canonical_sources(inputs.sources, base)
    _put(digest, "sources", str(len(sources)))
    for shown, path in sources:
        _put(digest, "source", shown, *_read(path))
    _put(digest, "tables", str(len(inputs.tables)))
    for path in inputs.tables:
        _put(digest, "table", _display_path(path, base), *_read(path))
    for section, pairs in (
        ("env", inputs.env),
        ("versions", inputs.versions),
        ("options", inputs.options),
    ):
        _put(digest, section, str(len(pairs)))
        for name, value in sorted(pairs):
            _put(digest, name, value)
    targets = sorted(set(inputs.targets))
    _put(digest, "targets", str(len(targets)), *targets)
    return digest.hexdigest()


def describe(inputs: FingerprintInputs) -> dict[str, Any]:
    """JSON-able summary of the inputs for the manifest, with each file's sha256 so that a
    changed fingerprint can be traced to the file that changed."""
    base = _package_dir().parent
    sources = _canonical_sources(inputs.sources, base)
    tables = [(_display_path(p, base), p) for p in inputs.tables]
    digests = {}
    for shown, path in [*sources, *tables]:
        kind, data = _read(path)
        digests[shown] = hashlib.sha256(data).hexdigest() if kind == "bytes" else data.decode()
    return {
        "format": FORMAT,
        "sources": [shown for shown, _ in sources],
        "tables": [shown for shown, _ in tables],
        "env": dict(sorted(inputs.env)),
        "versions": dict(sorted(inputs.versions)),
        "targets": sorted(set(inputs.targets)),
        "options": dict(sorted(inputs.options)),
        "digests": digests,
    }
