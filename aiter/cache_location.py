"""Where the runtime's FlyDSL kernel cache is: the user's FLYDSL_RUNTIME_CACHE_DIR, else the cache
shipped inside the package (aiter/flydsl_cache), else FlyDSL's default. Light: no torch here.

A shipped cache in a read-only location still serves: the runtime then reads it through a
writable overlay directory of links to its entries, where a compile on the serving path lands.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from aiter.flydsl_bridge.env import ENV_CACHE_DIR as CACHE_DIR_ENV
from aiter.flydsl_bridge.manifest import MANIFEST_NAME

SHIPPED_DIR_NAME = "flydsl_cache"

OVERLAY_ENV = "AITER_CACHE_OVERLAY_DIR"  # where overlays of read-only caches go
# 1: never write into the shipped cache, even where the process could (an image's layers).
READONLY_ENV = "AITER_CACHE_READONLY"
FLYDSL_DEFAULT = Path.home() / ".flydsl" / "cache"

# How the runtime's cache was chosen, for `--info` and error messages.
USER, SHIPPED, SHIPPED_OVERLAY, FLYDSL = "user", "shipped", "shipped (overlay)", "flydsl default"


def shipped_cache() -> Path | None:
    """The cache a wheel built with AITER_AOT=1 carries, when it does (manifest included)."""
    path = Path(__file__).resolve().parent / SHIPPED_DIR_NAME
    return path if (path / MANIFEST_NAME).is_file() else None


def _writable(path: Path) -> bool:
    if os.environ.get(READONLY_ENV) == "1":
        return False
    return os.access(path, os.W_OK | os.X_OK)


def _overlay_root() -> Path:
    base = os.environ.get(OVERLAY_ENV) or os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "aiter" / "flydsl-overlay"


def overlay_for(shipped: Path) -> Path:
    """A writable directory holding a link to every file of `shipped` (directories recreated),
    named by the shipped cache's path and manifest so that a new install gets a new overlay.
    FlyDSL then reads the shipped entries through the links and writes new ones beside them."""
    manifest = shipped / MANIFEST_NAME
    stamp = f"{shipped}:{manifest.stat().st_mtime_ns}:{manifest.stat().st_size}"
    overlay = _overlay_root() / hashlib.sha256(stamp.encode()).hexdigest()[:16]
    for dirpath, _, filenames in os.walk(shipped):
        target_dir = overlay / Path(dirpath).relative_to(shipped)
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            if name.endswith(".lock"):
                continue  # locks are made where the cache is written
            link = target_dir / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(Path(dirpath) / name)
    return overlay


def runtime_cache() -> tuple[Path, str]:
    """(the directory FlyDSL reads and writes, how it was chosen), without changing anything."""
    user = os.environ.get(CACHE_DIR_ENV)
    if user:
        return Path(user), USER
    shipped = shipped_cache()
    if shipped is None:
        return FLYDSL_DEFAULT, FLYDSL
    if _writable(shipped):
        return shipped, SHIPPED
    return shipped, SHIPPED_OVERLAY


_configured: tuple[Path, str] | None = None


def current() -> tuple[Path, str]:
    """How this process's runtime cache was chosen: configure()'s choice while the variable still
    holds it, else what runtime_cache() finds now."""
    if _configured is not None and os.environ.get(CACHE_DIR_ENV) == str(_configured[0]):
        return _configured
    return runtime_cache()


def configure() -> tuple[Path, str]:
    """Point FlyDSL at the shipped cache when the user set no cache directory (never overriding
    one they set). Called by `import aiter`, before FlyDSL is imported."""
    global _configured
    path, how = runtime_cache()
    if how == SHIPPED_OVERLAY:
        try:
            path = overlay_for(path)
        except OSError:
            return path, how  # no writable place: FlyDSL keeps its default
    if how in (SHIPPED, SHIPPED_OVERLAY):
        os.environ[CACHE_DIR_ENV] = str(path)
        _configured = (path, how)
    return path, how
