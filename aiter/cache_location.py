"""Where the runtime's FlyDSL kernel cache is: the user's FLYDSL_RUNTIME_CACHE_DIR, else the cache
shipped inside the package (aiter/flydsl_cache), else the installed cache-only wheel of the
machine's arch (`aiter-flydsl-cache-<arch>`, built by this aiter version), else FlyDSL's
default. Light: no torch here.

A shipped cache in a read-only location still serves: the runtime then reads it through a
writable overlay directory of links to its entries, where a compile on the serving path lands.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from aiter.flydsl_bridge.env import ENV_CACHE_DIR as CACHE_DIR_ENV
from aiter.flydsl_bridge.manifest import MANIFEST_NAME

SHIPPED_DIR_NAME = "flydsl_cache"
# A cache-only wheel per arch: distribution aiter-flydsl-cache-<arch>, package
# aiter_flydsl_cache_<arch> holding flydsl_cache/ and the aiter version that built it.
ARCH_WHEEL_PREFIX = "aiter-flydsl-cache-"
ARCH_PACKAGE_PREFIX = "aiter_flydsl_cache_"
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")

OVERLAY_ENV = "AITER_CACHE_OVERLAY_DIR"  # where overlays of read-only caches go
# 1: never write into the shipped cache, even where the process could (an image's layers).
READONLY_ENV = "AITER_CACHE_READONLY"
FLYDSL_DEFAULT = Path.home() / ".flydsl" / "cache"

# How the runtime's cache was chosen, for `--info` and error messages.
USER, SHIPPED, SHIPPED_OVERLAY, FLYDSL = "user", "shipped", "shipped (overlay)", "flydsl default"
ARCH_WHEEL, ARCH_WHEEL_OVERLAY = "arch wheel", "arch wheel (overlay)"
OVERLAYS = {SHIPPED: SHIPPED_OVERLAY, ARCH_WHEEL: ARCH_WHEEL_OVERLAY}


def shipped_cache() -> Path | None:
    """The cache a wheel built with AITER_AOT=1 carries, when it does (manifest included)."""
    path = Path(__file__).resolve().parent / SHIPPED_DIR_NAME
    return path if (path / MANIFEST_NAME).is_file() else None


def arch_package(arch: str) -> str:
    return f"{ARCH_PACKAGE_PREFIX}{arch}"


def machine_arch(environ: Mapping[str, str] | None = None, nodes: Path = KFD_NODES) -> str | None:
    """The GPU arch of this machine as FlyDSL will target it, without importing FlyDSL: the
    variables FlyDSL reads first (FLYDSL_GPU_ARCH, HSA_OVERRIDE_GFX_VERSION), else the first GPU
    node the kernel driver lists (its gfx_target_version, e.g. 90402 for gfx942); None when
    neither says."""
    env = os.environ if environ is None else environ
    named = (env.get("FLYDSL_GPU_ARCH") or env.get("HSA_OVERRIDE_GFX_VERSION") or "").lower()
    if named.startswith("gfx"):
        return named
    if named.count(".") == 2:
        major, minor, step = named.split(".")
        return f"gfx{major}{minor}{step}"
    try:
        properties = sorted(nodes.glob("*/properties"), key=lambda p: int(p.parent.name))
    except (OSError, ValueError):
        return None
    for path in properties:
        try:
            fields = dict(line.split(None, 1) for line in path.read_text().splitlines() if line)
            version = int(fields.get("gfx_target_version", "0"))
        except (OSError, ValueError):
            continue
        if version:  # CPU nodes say 0
            major, minor, step = version // 10000, version // 100 % 100, version % 100
            return f"gfx{major}{minor:x}{step:x}"
    return None


def arch_wheel(arch: str) -> tuple[Path, str] | None:
    """(the cache directory, the aiter version that built it) of the installed cache-only wheel
    of `arch`, or None when none is installed."""
    spec = importlib.util.find_spec(arch_package(arch))
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SHIPPED_DIR_NAME
    if not (path / MANIFEST_NAME).is_file():
        return None
    version = getattr(importlib.import_module(arch_package(arch)), "AITER_VERSION", "unknown")
    return path, version


def _arch_wheel_cache() -> Path | None:
    """The cache of the installed wheel of the machine's arch, when this aiter built it."""
    from aiter.version import __version__

    arch = machine_arch()
    found = arch_wheel(arch) if arch else None
    return found[0] if found is not None and found[1] == __version__ else None


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
    shipped, how = shipped_cache(), SHIPPED
    if shipped is None:
        shipped, how = _arch_wheel_cache(), ARCH_WHEEL
    if shipped is None:
        return FLYDSL_DEFAULT, FLYDSL
    return shipped, how if _writable(shipped) else OVERLAYS[how]


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
    if how in OVERLAYS.values():
        try:
            path = overlay_for(path)
        except OSError:
            return path, how  # no writable place: FlyDSL keeps its default
    if how != USER and how != FLYDSL:
        os.environ[CACHE_DIR_ENV] = str(path)
        _configured = (path, how)
    return path, how
