"""The AOT command line: reads the tables, picks the archs, runs one replay process per arch,
prints the report, writes the manifest and decides the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiter.aot.flydsl.jobs import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    FAIL,
    MODE_BUILD,
    MODE_CHECK,
    MODE_LIST,
    TAGS,
    Family,
    entry_path,
    progress,
)
from aiter.arch import ARCHS, ArchTarget, parse_gpu_archs
from aiter.ops.tables import TableSpec
from aiter.tuning import TableError


class UsageError(Exception):
    """Bad command line or environment: exit status 2."""


def _table_archs(family: Family) -> dict[str, set[int]]:
    archs: dict[str, set[int]] = {}
    for spec in family.tables:
        for row in spec.load().rows:
            archs.setdefault(row["gfx"], set()).add(row.int("cu_num"))
    return archs


def _named_by(tables: list[TableSpec], file_name: str) -> list[TableSpec]:
    """Tables a word of whose name, shared with no other candidate, appears in file_name."""
    words = {t: set(Path(t.name).stem.split("_")) for t in tables}
    named = []
    for table in tables:
        others = set().union(*(w for t, w in words.items() if t is not table))
        if any(word in file_name for word in words[table] - others):
            named.append(table)
    return named


def _exact_columns(tables: list[TableSpec], header: set[str]) -> list[TableSpec]:
    return [t for t in tables if {c.name for c in t.columns} == header]


def _assign_csv(family: Family, paths: Sequence[str]) -> dict[TableSpec, list[str]]:
    """Tell which table each --csv extends: the one whose columns it has; among several, the
    one its file name names, else the one whose columns it has exactly."""
    from aiter.tuning.csvio import read_table_file

    assigned: dict[TableSpec, list[str]] = {}
    for path in paths:
        if not Path(path).is_file():
            raise UsageError(f"--csv {path}: no such file")
        try:
            header = set(read_table_file(path, "--csv").header)
        except TableError as err:
            raise UsageError(f"--csv {path}: {err}") from None
        fits = [s for s in family.tables if {c.name for c in s.columns} <= header]
        if len(fits) > 1:
            fits = _named_by(fits, Path(path).name) or _exact_columns(fits, header) or fits
        if len(fits) != 1:
            tables = ", ".join(s.name for s in family.tables)
            why = "fits none of" if not fits else "fits more than one of"
            raise UsageError(
                f"--csv {path}: its columns {sorted(header)} {why} this module's tables "
                f"({tables}); name the file after its table or give it that table's columns"
            )
        assigned.setdefault(fits[0], []).append(str(Path(path).resolve()))
        progress(f"--csv {path} extends {fits[0].name}")
    return assigned


def _targets(family: Family) -> list[ArchTarget]:
    from aiter import device

    text = os.environ.get("GPU_ARCHS", "")
    table_archs = _table_archs(family)
    if not text.strip():
        return [ArchTarget(a) for a in ARCHS if a in table_archs]
    try:
        wanted = parse_gpu_archs(text, native=device.native_target)
    except Exception as err:
        raise UsageError(f"GPU_ARCHS: {err}") from None
    targets = []
    for target in wanted:
        if target.arch not in table_archs:
            progress(f"GPU_ARCHS names {target.arch}, but no {family.module} table has rows for it")
            continue
        targets.append(target)
    return targets


def _run_arch(
    family_module: str, target: ArchTarget, mode: str, workers: int, env: dict[str, str]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="aiter-aot-") as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "aiter.aot.flydsl.replay",
            "--arch-process",
            "--family",
            family_module,
            "--arch",
            target.arch,
            "--mode",
            mode,
            "--workers",
            str(workers),
            "--result",
            str(result_path),
        ]
        if target.cu_num is not None:
            cmd += ["--cu-num", str(target.cu_num)]
        proc_env = {**env, "ARCH": target.arch, "FLYDSL_GPU_ARCH": target.arch, "COMPILE_ONLY": "1"}
        # No GPU may be visible: everything must come from the dry run.
        proc_env.update(HIP_VISIBLE_DEVICES="", ROCR_VISIBLE_DEVICES="", CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run(cmd, env=proc_env, check=False)
        if proc.returncode != 0 or not result_path.is_file():
            return {"arch": target.arch, "crashed": f"arch process exited with {proc.returncode}"}
        return json.loads(result_path.read_text())


def _versions() -> dict[str, str]:
    import flydsl
    import torch

    import aiter

    return {"aiter": aiter.__version__, "flydsl": flydsl.__version__, "torch": torch.__version__}


def _write_manifest(family: Family, cache_dir: str, report: dict[str, Any]) -> Path:
    from aiter.aot.flydsl.manifest import update_manifest

    kernels: dict[str, dict[str, Any]] = {}
    for result in report["results"]:
        for seg in result.get("segments", []):
            for k in seg["kernels"]:
                path = entry_path(k)
                if not path.is_file():  # the manifest lists what the cache holds
                    continue
                rel = os.path.relpath(path, cache_dir)
                entry = kernels.setdefault(
                    rel, {"function": k["function"], "params": k["params"], "requested_by": []}
                )
                entry["requested_by"].append(
                    {
                        "module": family.module,
                        "table": result["table"],
                        "row": result["row"],
                        "m_lo": seg["m_lo"],
                        "m_hi": seg["m_hi"],
                        "variant": result["variant"],
                    }
                )
    return update_manifest(cache_dir, report["arch"], family.module, kernels, _versions())


def _print_report(family: Family, report: dict[str, Any], mode: str) -> Counter:
    arch = report["arch"]
    if "crashed" in report:
        print(f"{arch}: FAIL {report['crashed']}")
        return Counter({FAIL: 1})
    tags: Counter = Counter()
    for result in report["results"]:
        tags[result["tag"]] += 1
        note = f"  {result['message']}" if result["message"] else ""
        print(f"{result['tag']:<9} {family.module} {result['job']}{note}")
        if mode == MODE_LIST:
            for seg in result["segments"]:
                names = ", ".join(f"{k['function']}[{k['params']}]" for k in seg["kernels"])
                print(f"          M {seg['m_lo']}-{seg['m_hi']}: {names}")
        for k in result.get("missing", []) if mode == MODE_CHECK else []:
            print(
                f"MISSING   module={family.module} row={result['row']} M={k['m_lo']}-{k['m_hi']}"
                f" arch={arch} kernel={k['function']}/{k['file']} params: {k['params']}"
            )
    unique = {
        str(entry_path(k))
        for r in report["results"]
        for s in r.get("segments", [])
        for k in s["kernels"]
    }
    missing = {str(entry_path(k)) for r in report["results"] for k in r.get("missing", [])}
    compiled = len({f for c in report["compiles"] for f in c.get("compiled", [])})
    counts = ", ".join(f"{tags[t]} {t}" for t in TAGS)
    print(
        f"summary {arch}: {len(report['results'])} jobs: {counts}; kernels: {len(unique)} requested,"
        f" {compiled} compiled, {len(missing)} missing; {report['seconds']:.1f} s"
    )
    return tags


def main(family_module: str, argv: Sequence[str] | None = None) -> int:
    """The command line of an AOT module: build (default), --list or --check."""
    family: Family = importlib.import_module(family_module).FAMILY
    parser = argparse.ArgumentParser(
        prog=f"python -m {family_module}",
        description=f"Fill, list or check FlyDSL's kernel cache for aiter's {family.module} "
        "operators by replaying their tuned tables (archs from GPU_ARCHS, default: all the "
        "tables hold).",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true", help="name the kernels, compile nothing")
    group.add_argument(
        "--check", action="store_true", help="compile nothing; report every missing kernel"
    )
    parser.add_argument(
        "--csv",
        action="append",
        default=[],
        metavar="PATH",
        help="an extra tuned table, merged like the table's environment variable (repeatable)",
    )
    parser.add_argument(
        "--cache-dir", help="cache to fill (default: FLYDSL_RUNTIME_CACHE_DIR or FlyDSL's default)"
    )
    parser.add_argument(
        "-j", "--workers", type=int, default=os.cpu_count() or 1, help="compile workers per arch"
    )
    parser.add_argument(
        "--report", metavar="PATH", help="also write every arch's full report as JSON to PATH"
    )
    args = parser.parse_args(argv)
    mode = MODE_LIST if args.list else MODE_CHECK if args.check else MODE_BUILD
    try:
        if args.workers < 1:
            raise UsageError(f"--workers must be >= 1, got {args.workers}")
        env = dict(os.environ)
        for spec, paths in _assign_csv(family, args.csv).items():
            joined = os.pathsep.join([p for p in [env.get(spec.env_var, "")] if p] + paths)
            env[spec.env_var] = os.environ[spec.env_var] = joined
        from aiter.aot.flydsl import hooks

        cache_dir = os.path.abspath(args.cache_dir or hooks.default_cache_dir())
        env["FLYDSL_RUNTIME_CACHE_DIR"] = cache_dir
        try:
            targets = _targets(family)
        except TableError as err:
            raise UsageError(str(err)) from None
        if mode == MODE_BUILD:
            from aiter.toolchain import LinkerNotFound, configure_linker

            try:
                env["ROCM_PATH"] = str(configure_linker().rocm_path)
            except LinkerNotFound as err:
                raise UsageError(str(err)) from None
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE

    if not targets:
        print(f"nothing to do: no {family.module} table rows for the requested archs")
        return EXIT_OK
    failed = False
    reports = []
    for target in targets:
        progress(f"replaying {family.module} for {target} ({mode}) into {cache_dir}")
        report = _run_arch(family_module, target, mode, args.workers, env)
        reports.append(report)
        tags = _print_report(family, report, mode)
        failed |= tags[FAIL] > 0
        if mode == MODE_BUILD and "crashed" not in report:
            path = _write_manifest(family, cache_dir, report)
            progress(f"manifest: {path}")
    if args.report:
        Path(args.report).write_text(json.dumps(reports, indent=1))
    if mode == MODE_BUILD:
        print(f"cache: {cache_dir}")
        print(
            "serve from it with: FLYDSL_RUNTIME_CACHE_DIR="
            f"{cache_dir} FLYDSL_RUNTIME_RUN_ONLY=1 (FlyDSL then loads kernels and never compiles)"
        )
    return EXIT_FAIL if failed else EXIT_OK
