"""The wheel build step: with AITER_AOT=1, fill the cache the wheel ships (aiter/flydsl_cache) by
the combined replay for GPU_ARCHS, or ship AITER_AOT_CACHE=DIR after `--check` passes on it.
With AITER_AOT_ARCH_WHEELS=DIST as well, the cache goes into one cache-only wheel per arch
written to DIST (cache_wheels.py) instead, and aiter's wheel ships none.

setup.py runs `python -m aiter.aot.flydsl.wheel BUILD_LIB` after the extension is built; any FAIL
fails the wheel build with the replay's summary. It prints the shipped cache's size per arch.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from aiter.cache_location import SHIPPED_DIR_NAME
from aiter.flydsl_bridge import manifest

AOT_ENV = "AITER_AOT"
PREBUILT_ENV = "AITER_AOT_CACHE"
ARCH_WHEELS_ENV = "AITER_AOT_ARCH_WHEELS"


def sizes_per_arch(cache: Path) -> dict[str, tuple[int, int]]:
    """arch -> (kernel entries, bytes) as the cache's manifest records them."""
    built = manifest.read(cache)
    out = {}
    for arch in built.archs:
        entries = built.entries(arch)
        out[arch] = (len(entries), sum(e.size for e in entries.values()))
    return out


def _tidy(cache: Path) -> None:
    """Drop FlyDSL's lock files and stray temporary files: a shipped cache holds entries only."""
    for path in cache.rglob("*"):
        if path.is_file() and (path.name.endswith(".lock") or path.name.endswith(".tmp")):
            path.unlink()


def build_shipped_cache(build_lib: Path, environ: dict[str, str]) -> int:
    """Fill build_lib/aiter/flydsl_cache, or with AITER_AOT_ARCH_WHEELS the per-arch cache
    wheels; 0 on success, else the replay's exit status."""
    target = build_lib / "aiter" / SHIPPED_DIR_NAME
    if target.exists():
        shutil.rmtree(target)
    wheels = environ.get(ARCH_WHEELS_ENV)
    if not wheels:
        return _fill(target, environ)
    import tempfile

    from aiter.aot.flydsl.cache_wheels import build_arch_wheels

    with tempfile.TemporaryDirectory(prefix="aiter-arch-wheels-") as staging:
        cache = Path(staging) / SHIPPED_DIR_NAME
        status = _fill(cache, environ)
        if status:
            return status
        try:
            written = build_arch_wheels(cache, Path(wheels).resolve())
        except (ValueError, OSError) as err:
            print(f"error: {ARCH_WHEELS_ENV}={wheels}: {err}", file=sys.stderr)
            return 1
        for path in written:
            print(f"aiter: cache wheel {path} ({path.stat().st_size / 1e6:.2f} MB)")
    print(f"aiter: {ARCH_WHEELS_ENV}: the caches are in the wheels above; aiter's ships none")
    return 0


def _fill(target: Path, environ: dict[str, str]) -> int:
    """The cache the wheels carry, at `target`: built, or the prebuilt one checked and copied."""
    from aiter.aot.flydsl.driver import main

    prebuilt = environ.get(PREBUILT_ENV)
    if prebuilt:
        source = Path(prebuilt)
        if not (source / manifest.MANIFEST_NAME).is_file():
            print(f"error: {PREBUILT_ENV}={prebuilt}: no {manifest.MANIFEST_NAME} there; build it with "
                  "python -m aiter.aot.flydsl --cache-dir DIR", file=sys.stderr)  # fmt: skip
            return 2
        print(f"aiter: checking the prebuilt cache {source} before shipping it", file=sys.stderr)
        status = main(None, ["--check", "--cache-dir", str(source)])
        if status:
            return status
        shutil.copytree(source, target)
    else:
        print(f"aiter: building the FlyDSL cache the wheel ships ({AOT_ENV}=1)", file=sys.stderr)
        status = main(None, ["--cache-dir", str(target)])
        if status:
            return status
    _tidy(target)
    for arch, (count, size) in sorted(sizes_per_arch(target).items()):
        print(f"aiter: shipped cache {arch}: {count} kernels, {size / 1e6:.2f} MB")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import os

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m aiter.aot.flydsl.wheel BUILD_LIB", file=sys.stderr)
        return 2
    return build_shipped_cache(Path(args[0]), dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
