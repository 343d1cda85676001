"""The one list of AOT modules: `python -m aiter.aot.flydsl` replays every module named here,
and each module's `FAMILY` names its tables. Nothing else lists modules or tables.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence

from aiter.aot.flydsl.jobs import Family, module_file

MODULES: dict[str, str] = {
    "gemm": "aiter.aot.flydsl.gemm",
    "moe": "aiter.aot.flydsl.moe",
    "conv3d": "aiter.aot.flydsl.conv3d",
    "fmha_fp8": "aiter.aot.flydsl.fmha_fp8",
}
# More modules for one run (tests, out-of-tree operator families): import paths, comma-separated.
EXTRA_MODULES_ENV = "AITER_AOT_EXTRA_MODULES"


def registered() -> dict[str, str]:
    """Short name -> import path of every module the combined build replays."""
    modules = dict(MODULES)
    for path in os.environ.get(EXTRA_MODULES_ENV, "").split(","):
        if path.strip():
            modules[path.strip().rsplit(".", 1)[-1]] = path.strip()
    return modules


def load(path: str) -> Family:
    """The Family an AOT module declares."""
    family = getattr(importlib.import_module(path), "FAMILY", None)
    if not isinstance(family, Family):
        raise ValueError(
            f"{path} declares no FAMILY: an AOT module must define FAMILY = Family(...)"
        )
    return family


def source_file(path: str) -> str:
    """The file of an AOT module: part of a build's fingerprint, wherever the module lives."""
    return module_file(importlib.import_module(path))


def select(names: Sequence[str] | None) -> dict[str, str]:
    """The modules `--module a,b` names (all registered when None); ValueError lists the choices."""
    modules = registered()
    if not names:
        return modules
    # A module answers to its registered name, its import path and the name its reports use.
    aliases = {n: {n, p, load(p).module} for n, p in modules.items()}
    unknown = [n for n in names if not any(n in a for a in aliases.values())]
    if unknown:
        known = ", ".join(sorted({load(p).module for p in modules.values()}))
        raise ValueError(f"--module {','.join(unknown)}: no such AOT module; registered: {known}")
    return {n: p for n, p in modules.items() if aliases[n] & set(names)}
