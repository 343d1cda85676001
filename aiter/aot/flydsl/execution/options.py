"""The AOT command line's options and what they decide before anything runs: the modules, the
mode, the tables and --csv, the archs, the cache directory and the deployment's maxima.

Bad options are UsageErrors (exit 2). Reading them changes no environment variable and imports
neither torch nor FlyDSL.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl import registry
from aiter.aot.flydsl.jobs.family import Family
from aiter.aot.flydsl.jobs.records import Mode
from aiter.arch import ARCHS, ArchTarget, parse_gpu_archs
from aiter.tuning import TableError, TableSpec
from aiter.tuning.foreign import unserved_aiter_table

# Far above the slowest real compile measured here (a few seconds); a worker this slow hangs.
DEFAULT_TIMEOUT = 600.0


class UsageError(Exception):
    """Bad command line or environment: exit status 2."""


@dataclass
class Build:
    """Everything the command line decided: what to replay, where, how."""

    modules: dict[str, str]  # short name -> import path
    families: dict[str, Family]  # short name -> family
    mode: Mode
    cache_dir: str
    targets: list[ArchTarget]
    maxima: dict[str, int]
    workers: int
    sample: int
    seed: int
    verbose: bool
    timeout: float = DEFAULT_TIMEOUT
    execute: bool = False  # --check --execute: run the cached kernels on the emulator
    no_memo: bool = False
    report_path: str | None = None  # --report PATH: the typed report as JSON
    # --csv: table file name -> the files that extend it (resolved), merged after those the
    # table's environment variable names.
    extra_tables: dict[str, list[str]] = field(default_factory=dict)
    # Variables the arch processes get on top of the driver's environment (ROCM_PATH).
    arch_env: dict[str, str] = field(default_factory=dict)
    captures: list[str] = field(default_factory=list)  # --capture files (resolved)
    capture_widen: bool = False
    tables: bool = True  # replay the modules' tables (without --capture, or with --tables)
    capture_problems: list[str] = field(default_factory=list)  # bad lines: the exit says so
    shard: str = ""  # --shard I/N: each arch replays only that part of its jobs
    estimates: str = ""  # --estimates: the manifest the shard split weighs jobs by
    executor: str = "local"  # --executor: "local" (arch processes here) or "ray"
    ray_address: str = ""  # --ray-address: the cluster ("": a local one)
    shards: int = 0  # --shards N: shards per arch under --executor ray (0: one per node)

    def specs(self) -> list[TableSpec]:
        return [spec for family in self.families.values() for spec in family.tables]

    def extra_paths(self, spec: TableSpec) -> list[str]:
        """The --csv files that extend `spec`, in merge order."""
        return self.extra_tables.get(spec.name, [])

    def table_env(self) -> dict[str, str]:
        """The variables of the tables --csv extends as the arch processes set them (their own
        files, then the --csv files): what a serving process sets to read the same tables."""
        return {
            spec.env_var: spec.env_value(self.extra_paths(spec))
            for spec in self.specs()
            if spec.name in self.extra_tables
        }


# --- tables and --csv ---


def _spec_names(spec: TableSpec) -> set[str]:
    return {spec.name, spec.short_name, Path(spec.name).stem}


def _read_header(path: str) -> set[str]:
    from aiter.tuning.csvio import read_table_file

    try:
        return set(read_table_file(path, "--csv").header)
    except TableError as err:
        raise UsageError(f"--csv {path}: {err}") from None


def _check_csv_path(path: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--csv {path}: is a directory, expected a CSV file")
    if not p.is_file():
        raise UsageError(f"--csv {path}: no such file")
    if not os.access(p, os.R_OK):
        raise UsageError(f"--csv {path}: not readable (check its permissions)")


def _choices(specs: Sequence[TableSpec]) -> str:
    return ", ".join(f"{s.short_name} ({s.name})" for s in specs)


def assign_csv(specs: Sequence[TableSpec], items: Sequence[str]) -> dict[TableSpec, list[str]]:
    """Which table each --csv extends: `TABLE=PATH` names it (file name or short name); a bare
    PATH goes to the table whose aiter file name its name holds (`dsv3_bf16_tuned_gemm.csv`),
    else to the one table whose columns it has (the most specific, when several fit)."""
    assigned: dict[TableSpec, list[str]] = {}
    for item in items:
        name, sep, path = item.partition("=")
        named = [s for s in specs if name in _spec_names(s)] if sep else []
        if sep and not named and not Path(item).exists():
            raise UsageError(f"--csv {item}: no table named {name!r}; tables: {_choices(specs)}")
        if not named:
            path = item
        elif not path:
            raise UsageError(f"--csv {item}: no path after '='; expected --csv {name}=PATH")
        _check_csv_path(path)
        header = _read_header(path)
        spec = named[0] if named else _fitting_spec(specs, path, header)
        lacking = [c for c in spec.required_columns if c not in header]
        if lacking:
            raise UsageError(
                f"--csv {item}: lacks {spec.short_name}'s columns {', '.join(lacking)}"
            )
        assigned.setdefault(spec, []).append(str(Path(path).resolve()))
    return assigned


def _fitting_spec(specs: Sequence[TableSpec], path: str, header: set[str]) -> TableSpec:
    by_name = [s for s in specs if s.aiter_name and s.aiter_name in Path(path).name]
    unserved = unserved_aiter_table(Path(path).name, tuple(s.aiter_name for s in by_name))
    if unserved is not None:
        raise UsageError(f"--csv {path}: not served by this library: {unserved}")
    if by_name:
        return max(by_name, key=lambda s: len(s.aiter_name))
    fits = [s for s in specs if s.assign_by_columns and set(s.required_columns) <= header]
    # Of tables whose columns the file has, the one needing the most (a8w8 bpreshuffle's
    # q_dtype_w over blockscale's), when its columns hold every other's.
    fits = [
        s for s in fits if all(set(o.required_columns) <= set(s.required_columns) for o in fits)
    ]
    if len(fits) != 1:
        why = "fit none of" if not fits else "fit more than one of"
        raise UsageError(
            f"--csv {path}: its columns {why} the tables; say which with "
            f"--csv TABLE={path}, TABLE one of: {_choices(specs)}"
        )
    return fits[0]


def aiter_configs(specs: Sequence[TableSpec], directory: str) -> dict[TableSpec, list[str]]:
    """The files of aiter's `aiter/configs` layout under `directory` that aiter's runtime merges
    into each table (TableSpec.aiter_files)."""
    root = Path(directory)
    if not root.is_dir():
        raise UsageError(f"--aiter-configs {directory}: not a directory (expected aiter/configs)")
    found = {spec: [str(f.resolve()) for f in spec.aiter_files(root)] for spec in specs}
    return {spec: files for spec, files in found.items() if files}


def _table_archs(
    specs: Sequence[TableSpec], extra_tables: dict[str, list[str]]
) -> dict[str, set[int]]:
    archs: dict[str, set[int]] = {}
    for spec in specs:
        try:
            rows = spec.load(extra_tables.get(spec.name, [])).rows
        except TableError as err:
            raise UsageError(str(err)) from None
        for row in rows:
            archs.setdefault(row["gfx"], set()).add(row.int("cu_num"))
    return archs


def _targets(
    specs: Sequence[TableSpec],
    extra_tables: dict[str, list[str]],
    modules: str,
    captured: dict[str, set[int]] | None = None,
) -> list[ArchTarget]:
    text = os.environ.get("GPU_ARCHS", "")
    table_archs = _table_archs(specs, extra_tables) if specs else {}
    for arch, cu_nums in (captured or {}).items():
        table_archs.setdefault(arch, set()).update(cu_nums)
    if not text.strip():
        return [ArchTarget(a) for a in ARCHS if a in table_archs]

    def native() -> ArchTarget:
        from aiter import device

        return device.native_target()

    try:
        wanted = parse_gpu_archs(text, native=native)
    except Exception as err:
        raise UsageError(f"GPU_ARCHS: {err}") from None
    targets = []
    for target in wanted:
        if target.arch not in table_archs:
            print(f"GPU_ARCHS names {target.arch}, but no {modules} table or capture has it",
                  file=sys.stderr)  # fmt: skip
            continue
        targets.append(target)
    return targets


def _cache_dir(text: str | None, mode: Mode) -> str:
    cache_dir = os.path.abspath(text or bridge.cache_dir_from_env())
    path = Path(cache_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--cache-dir {cache_dir}: is a file, expected a directory")
    if mode == Mode.BUILD:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageError(
                f"--cache-dir {cache_dir}: cannot be created ({err.strerror})"
            ) from None
        if not os.access(path, os.W_OK):
            raise UsageError(f"--cache-dir {cache_dir}: not writable")
    return cache_dir


# --- the command line ---


def _parser(prog: str, axes: dict[str, Any], combined: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Fill, list or check FlyDSL's kernel cache for aiter's operators by "
        "replaying their tuned tables (archs from GPU_ARCHS, default: all the tables hold).",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true", help="name the kernels, compile nothing")
    group.add_argument(
        "--info",
        action="store_true",
        help="which cache the runtime reads, what it holds, and whether its versions match",
    )
    group.add_argument(
        "--check", action="store_true", help="compile nothing; report every missing kernel"
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="with --check: also name the kernels at N random points inside every segment",
    )
    parser.add_argument(
        "--execute",
        action="store_true",
        help="with --check: run every cached kernel the rows reach (with --sample N, N per "
        "FlyDSL function) on aiter's emulator in a small call, checked against torch",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample's points")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="a worker still compiling (or naming) one task after this long is killed and its "
        f"job fails (default {DEFAULT_TIMEOUT:g})",
    )
    if combined:
        parser.add_argument(
            "--module",
            help=f"replay only these modules, comma-separated ({', '.join(axes['modules'])})",
        )
    parser.add_argument(
        "--csv",
        action="append",
        default=[],
        metavar="TABLE=PATH",
        help="an extra tuned table for TABLE (its file or short name), merged like the table's "
        "environment variable; a bare PATH when only one table has its columns (repeatable)",
    )
    parser.add_argument(
        "--aiter-configs",
        metavar="DIR",
        help="a directory laid out as aiter's aiter/configs: each table is extended with the "
        "files aiter's runtime merges into it (<name>.csv and model_configs/*<name>*.csv)",
    )
    parser.add_argument(
        "--capture",
        action="append",
        default=[],
        metavar="PATH",
        help="replay the calls a serving process recorded with AITER_CAPTURE=PATH (repeatable); "
        "archs and modules come from the capture",
    )
    parser.add_argument(
        "--capture-widen",
        action="store_true",
        help="with --capture: replay each captured call over the whole run of its axis that "
        "its table row or heuristic serves",
    )
    parser.add_argument(
        "--tables",
        action="store_true",
        help="with --capture: replay the modules' tables too (without --capture they always are)",
    )
    parser.add_argument(
        "--cache-dir", help="cache to fill (default: FLYDSL_RUNTIME_CACHE_DIR or FlyDSL's default)"
    )
    parser.add_argument(
        "-j", "--workers", type=int, default=os.cpu_count() or 1, help="workers, all archs together"
    )
    for name, default in axes["axes"].items():
        parser.add_argument(
            "--max-" + name.lower().replace("_", "-"),
            type=int,
            dest=f"max_{name}",
            default=default,
            metavar="N",
            help=f"largest {name} the deployment serves; replayed up to it (default {default})",
        )
    parser.add_argument(
        "--shard",
        metavar="I/N",
        help="replay only part I of N of each arch's jobs (0 <= I < N), the same split on every "
        "machine; `python -m aiter.aot.flydsl merge` joins the shards' caches",
    )
    parser.add_argument(
        "--estimates",
        metavar="MANIFEST",
        help="with --shard: balance the split by the compile times this earlier build's "
        "manifest (or cache directory) recorded, keeping jobs that share a kernel together",
    )
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where a build runs: here (default), or as shard tasks on a Ray cluster, merged "
        "into --cache-dir (pip install 'aiter[ray]')",
    )
    parser.add_argument("--ray-address", metavar="ADDR", help="with --executor ray: the cluster")
    parser.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="with --executor ray: shards per arch (default: one per alive node)",
    )
    parser.add_argument("--report", metavar="PATH", help="write the full report as JSON to PATH")
    parser.add_argument("--verbose", action="store_true", help="print a line for every job")
    parser.add_argument(
        "--no-memo", action="store_true", help="replay even when the cache's fingerprint matches"
    )
    return parser


def _all_axes(modules: dict[str, str]) -> dict[str, int]:
    axes: dict[str, int] = {}
    for path in modules.values():
        for name, default in registry.load(path).axes().items():
            axes.setdefault(name, default)
    return axes


def parse(module_paths: Sequence[str] | None, argv: Sequence[str] | None) -> Build:
    combined = module_paths is None
    try:
        candidates = (
            registry.registered() if combined else {p.rsplit(".", 1)[-1]: p for p in module_paths}
        )
        axes = _all_axes(candidates)
    except (ImportError, ValueError) as err:
        raise UsageError(str(err)) from None
    prog = "python -m aiter.aot.flydsl" if combined else f"python -m {module_paths[0]}"
    args = _parser(prog, {"axes": axes, "modules": list(candidates)}, combined).parse_args(argv)
    mode = Mode.LIST if args.list else Mode.CHECK if args.check else Mode.BUILD
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a number of seconds > 0, got {args.timeout:g}")
    if args.report:
        report = Path(args.report)
        if report.is_dir() or not report.parent.is_dir():
            raise UsageError(f"--report {args.report}: expected a file in an existing directory")
    if args.sample < 0 or (args.sample and mode != Mode.CHECK):
        raise UsageError("--sample N needs --check and N >= 0")
    if args.execute and mode != Mode.CHECK:
        raise UsageError("--execute goes with --check: it runs the kernels a check found")
    maxima = {name: getattr(args, f"max_{name}") for name in axes}
    for name, value in maxima.items():
        if value < 1:
            raise UsageError(f"--max-{name.lower()} must be >= 1, got {value}")
    if (args.capture_widen or args.tables) and not args.capture:
        raise UsageError("--capture-widen and --tables go with --capture PATH")
    shard, estimates = _shard_options(args.shard, args.estimates)
    _executor_options(args, mode)
    captured = _read_captures(args.capture)
    modules = candidates
    if combined and args.module:
        try:
            modules = registry.select([m.strip() for m in args.module.split(",") if m.strip()])
        except ValueError as err:
            raise UsageError(str(err)) from None
    if captured is not None and not args.tables:
        modules = _captured_modules(modules, captured.ops())
        if not modules:
            raise UsageError(
                "--capture: no module of this build replays the captured ops "
                f"({', '.join(sorted(captured.ops())) or 'none'})"
            )
    families = {}
    for path in modules.values():
        family = registry.load(path)
        families[family.name] = family
    modules = {f.name: p for f, p in zip(families.values(), modules.values(), strict=True)}
    # Only the axes of the modules replayed: the others would only clutter the summary.
    replayed_axes = {name for family in families.values() for name in family.axes()}
    maxima = {name: value for name, value in maxima.items() if name in replayed_axes}
    build = Build(
        modules=modules,
        families=families,
        mode=mode,
        cache_dir="",
        targets=[],
        maxima=maxima,
        workers=args.workers,
        sample=args.sample,
        seed=args.seed,
        execute=args.execute,
        verbose=args.verbose,
        timeout=args.timeout,
        no_memo=args.no_memo,
        report_path=args.report,
        shard=shard,
        estimates=estimates,
        executor=args.executor,
        ray_address=args.ray_address or "",
        shards=args.shards or 0,
    )
    if captured is not None:
        build.captures = [str(Path(p).resolve()) for p in args.capture]
        build.capture_widen, build.tables = args.capture_widen, args.tables
        build.capture_problems = captured.problems
        captured_modules = _captured_modules(modules, captured.ops())
        ignored = sorted(captured.ops() - {op for f in families.values() for op in f.captured})
        if ignored:
            print(f"--capture: calls of {', '.join(ignored)} are not replayed here (no module "
                  "of this build declares them)", file=sys.stderr)  # fmt: skip
        print(_capture_summary(captured, len(captured_modules)), file=sys.stderr)
    if args.aiter_configs:
        for spec, paths in aiter_configs(build.specs(), args.aiter_configs).items():
            build.extra_tables.setdefault(spec.name, []).extend(paths)
            print(f"--aiter-configs: {len(paths)} file(s) extend {spec.name}", file=sys.stderr)
    for spec, paths in assign_csv(build.specs(), args.csv).items():
        build.extra_tables.setdefault(spec.name, []).extend(paths)
        print(f"--csv: {', '.join(paths)} extend {spec.name}", file=sys.stderr)
    build.cache_dir = _cache_dir(args.cache_dir, mode)
    specs = build.specs() if build.tables else []
    archs = _captured_archs(captured, families) if captured is not None else None
    build.targets = _targets(specs, build.extra_tables, "/".join(families), archs)
    return build


# --- --shard ---


def _shard_options(shard: str | None, estimates: str | None) -> tuple[str, str]:
    """--shard and --estimates checked ("" when not given): the estimates are read here, so a
    bad manifest is a usage error before any arch process starts."""
    from aiter.aot.flydsl.jobs import shards

    if estimates and not shard:
        raise UsageError("--estimates MANIFEST goes with --shard I/N")
    if not shard:
        return "", ""
    try:
        parsed = shards.parse_shard(shard)
        if estimates:
            shards.CompileEstimates.read(estimates)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return str(parsed), str(Path(estimates).resolve()) if estimates else ""


def _executor_options(args: argparse.Namespace, mode: Mode) -> None:
    if args.executor != "ray":
        if args.ray_address or args.shards is not None:
            raise UsageError("--ray-address and --shards go with --executor ray")
        return
    if mode != Mode.BUILD:
        raise UsageError("--executor ray runs builds; --list and --check run here")
    if args.shard:
        raise UsageError("--executor ray shards the build itself (--shards N); drop --shard")
    if args.shards is not None and args.shards < 1:
        raise UsageError(f"--shards must be >= 1, got {args.shards}")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError(
            "--executor ray needs Ray, which is not installed: pip install 'aiter[ray]'"
        ) from None


# --- --capture ---


def _read_captures(paths: Sequence[str]):
    """The calls of the --capture files, each bad line reported on stderr (None: no --capture)."""
    if not paths:
        return None
    from aiter.aot.flydsl.capture.files import read_captures

    for path in paths:
        if not Path(path).is_file():
            raise UsageError(f"--capture {path}: no such file")
    try:
        captured = read_captures(paths)
    except OSError as err:
        raise UsageError(f"--capture: {err}") from None
    for problem in captured.problems:
        print(f"capture: {problem}", file=sys.stderr)
    return captured


def _captured_modules(modules: dict[str, str], ops: set[str]) -> dict[str, str]:
    """The modules declaring an op the capture called."""
    return {n: p for n, p in modules.items() if set(registry.load(p).captured) & ops}


def _captured_archs(captured, families: dict[str, Family]) -> dict[str, set[int]]:
    ops = {op for family in families.values() for op in family.captured}
    archs: dict[str, set[int]] = {}
    for call in captured.calls:
        if call.op in ops:
            archs.setdefault(call.arch, set()).add(call.cu_num)
    return archs


def _capture_summary(captured, modules: int) -> str:
    text = f"--capture: {len(captured.calls)} distinct calls of {modules} module(s)"
    if captured.duplicates:
        text += f", {captured.duplicates} repeated lines"
    if captured.refused:
        text += f", {captured.refused} calls refused at serving (not replayed)"
    if captured.problems:
        text += f", {len(captured.problems)} bad lines (reported above; the exit status says so)"
    return text
