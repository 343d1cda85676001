"""FlyDSL's environment variables (the one place aiter spells their names) and what follows from
them: the target of a compile, run-only serving, the cache root. Imports neither FlyDSL nor torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TESTED_FLYDSL = "0.4.2"

# FlyDSL's environment variables: the only place aiter spells their names.
ENV_CACHE_DIR = "FLYDSL_RUNTIME_CACHE_DIR"
ENV_RUN_ONLY = "FLYDSL_RUNTIME_RUN_ONLY"
ENV_COMPILE_ONLY = "COMPILE_ONLY"
ENV_ARCH = "ARCH"  # the arch FlyDSL's compile pipeline targets
ENV_GPU_ARCH = "FLYDSL_GPU_ARCH"  # the arch kernel code sees through get_rocm_arch()
# Variables FlyDSL folds into every cache key (the last one only into gfx1250 keys);
# self_test() checks this list against the installed FlyDSL.
KEY_ENV_VARS: tuple[str, ...] = (
    "FLYDSL_COMPILE_OPT_LEVEL",
    "FLYDSL_COMPILE_BACKEND",
    "FLYDSL_COMPILE_LLVM_DIR",
    "FLYDSL_DEBUG_ENABLE_DEBUG_INFO",
    "FLYDSL_EXTRA_SOURCE_DIRS",
    "FLYDSL_KTRACE_ENABLE",
    "FLYDSL_KTRACE_BLOCKS",
    "FLYDSL_KTRACE_BUFFER_BYTES",
    "LLVM_GFX1250_ANY_XNACK_CODEGEN",
)


def flydsl_version() -> str:
    """The installed FlyDSL's version, read from its metadata ("missing" when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("flydsl")
    except metadata.PackageNotFoundError:
        return "missing"


def target_env(arch: str) -> dict[str, str]:
    """Environment that makes FlyDSL compile for `arch` without a GPU.

    Both arch variables are needed: the pipeline reads one, kernel code the other, and a
    kernel that finds neither silently builds for gfx942.
    """
    return {ENV_ARCH: arch, ENV_GPU_ARCH: arch, ENV_COMPILE_ONLY: "1"}


def run_only_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether FLYDSL_RUNTIME_RUN_ONLY is on in `environ` (default os.environ), as FlyDSL reads
    a boolean: 1, true, yes or on, in any case."""
    env = os.environ if environ is None else environ
    return env.get(ENV_RUN_ONLY, "").lower() in ("1", "true", "yes", "on")


def cache_dir_from_env(environ: Mapping[str, str] | None = None) -> str:
    """FlyDSL's cache root for `environ` (default os.environ), without importing FlyDSL.

    An empty FLYDSL_RUNTIME_CACHE_DIR turns FlyDSL's disk cache off; it is treated as unset
    here so that callers always get a directory.
    """
    env = os.environ if environ is None else environ
    return env.get(ENV_CACHE_DIR) or str(Path.home() / ".flydsl" / "cache")


def default_cache_dir() -> str:
    """The cache root FlyDSL's runtime uses in this process (see cache_dir_from_env)."""
    return cache_dir_from_env()
