"""The one list of AOT modules: `python -m aiter.aot.flydsl` replays every module named here,
and each module's `FAMILY` names its tables. Nothing else lists modules or tables.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

from aiter.aot.flydsl.jobs.family import Family, module_file

MODULES: dict[str, str] = {
    "gemm": "aiter.aot.flydsl.gemm",
    "moe": "aiter.aot.flydsl.moe",
    "moe_routing": "aiter.aot.flydsl.moe_routing",
    "conv3d": "aiter.aot.flydsl.conv3d",
    "fmha_fp8": "aiter.aot.flydsl.fmha_fp8",
    "chunk_gdn_h": "aiter.aot.flydsl.chunk_gdn_h",
}
# More modules for one run (tests, out-of-tree operator families): import paths, comma-separated.
EXTRA_MODULES_ENV = "AITER_AOT_EXTRA_MODULES"


def registered() -> dict[str, str]:
    """Short name -> import path of every module the combined build replays."""
    modules = dict(MODULES)
    for path in (p.strip() for p in os.environ.get(EXTRA_MODULES_ENV, "").split(",")):
        name = path.rsplit(".", 1)[-1]
        if not path or modules.get(name) == path:
            continue
        if name in modules:  # a module is named by its last component: two would replace each other
            raise ValueError(
                f"{EXTRA_MODULES_ENV}: {path} and {modules[name]} are both AOT module {name!r}; "
                "rename one of them"
            )
        modules[name] = path
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


def family_sources(family: Family) -> list[str]:
    """Every Python file of the packages a family declares in `sources` (found without importing
    them); ValueError names a package that cannot be found."""
    files: list[str] = []
    for name in family.sources:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"AOT module {family.name!r}: sources names {name!r}, not importable")
        roots = [Path(p) for p in spec.submodule_search_locations or []]
        if not roots:
            files.append(str(Path(spec.origin).resolve()))
        for root in roots:
            files.extend(str(f.resolve()) for f in sorted(root.rglob("*.py")))
    return files


def select(names: Sequence[str] | None) -> dict[str, str]:
    """The modules `--module a,b` names (all registered when None); ValueError lists the choices."""
    modules = registered()
    if not names:
        return modules
    # A module answers to its registered name, its import path and the name its reports use.
    aliases = {n: {n, p, load(p).name} for n, p in modules.items()}
    unknown = [n for n in names if not any(n in a for a in aliases.values())]
    if unknown:
        known = ", ".join(sorted({load(p).name for p in modules.values()}))
        raise ValueError(f"--module {','.join(unknown)}: no such AOT module; registered: {known}")
    return {n: p for n, p in modules.items() if aliases[n] & set(names)}
