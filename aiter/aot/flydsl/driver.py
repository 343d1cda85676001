"""The AOT command line: reads the tables, picks the archs, skips a build whose fingerprint the
cache already holds, runs one replay process per arch side by side on one worker budget, shows
progress, prints the report and summary, writes the manifest and decides the exit status.

Importing it (and deciding that a cache is complete) loads neither torch nor FlyDSL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiter.aot.flydsl import hooks, registry
from aiter.aot.flydsl.jobs import Family
from aiter.aot.flydsl.protocol import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    FAIL,
    MODE_BUILD,
    MODE_CHECK,
    MODE_LIST,
    ArchReport,
    from_json,
    to_json,
)
from aiter.aot.flydsl.report import print_job_lines, print_summary, summary_rows
from aiter.arch import ARCHS, ArchTarget, parse_gpu_archs
from aiter.tuning import TableError, TableSpec

# Far above the slowest real compile measured here (a few seconds); a worker this slow hangs.
DEFAULT_TIMEOUT = 600.0
# What one compile worker may hold (measured peak about 390 MB) and one arch process (about
# 500 MB after its first compile): -j is capped so they fit in the memory available.
WORKER_MB = 600
ARCH_PROCESS_MB = 600
WORKER_MB_ENV = "AITER_AOT_WORKER_MB"


class UsageError(Exception):
    """Bad command line or environment: exit status 2."""


@dataclass
class Build:
    """Everything the command line decided: what to replay, where, how."""

    modules: dict[str, str]  # short name -> import path
    families: dict[str, Family]  # short name -> family
    mode: str
    cache_dir: str
    targets: list[ArchTarget]
    maxima: dict[str, int]
    workers: int
    sample: int
    seed: int
    verbose: bool
    timeout: float = DEFAULT_TIMEOUT
    no_memo: bool = False
    report_path: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def specs(self) -> list[TableSpec]:
        return [spec for family in self.families.values() for spec in family.tables]


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
    PATH is accepted when exactly one table has exactly its columns."""
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
        if named:
            spec = named[0]
            lacking = [c for c in spec.header if c not in header]
            if lacking:
                raise UsageError(
                    f"--csv {item}: lacks {spec.short_name}'s columns {', '.join(lacking)}"
                )
        else:
            fits = [s for s in specs if set(s.header) == header]
            if len(fits) != 1:
                why = "fit none of" if not fits else "fit more than one of"
                raise UsageError(
                    f"--csv {path}: its columns {why} the tables; say which with "
                    f"--csv TABLE={path}, TABLE one of: {_choices(specs)}"
                )
            spec = fits[0]
        assigned.setdefault(spec, []).append(str(Path(path).resolve()))
    return assigned


def _table_archs(specs: Sequence[TableSpec]) -> dict[str, set[int]]:
    archs: dict[str, set[int]] = {}
    for spec in specs:
        try:
            rows = spec.load().rows
        except TableError as err:
            raise UsageError(str(err)) from None
        for row in rows:
            archs.setdefault(row["gfx"], set()).add(row.int("cu_num"))
    return archs


def _targets(specs: Sequence[TableSpec], modules: str) -> list[ArchTarget]:
    text = os.environ.get("GPU_ARCHS", "")
    table_archs = _table_archs(specs)
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
            print(f"GPU_ARCHS names {target.arch}, but no {modules} table has rows for it",
                  file=sys.stderr)  # fmt: skip
            continue
        targets.append(target)
    return targets


def _cache_dir(text: str | None, mode: str) -> str:
    cache_dir = os.path.abspath(text or hooks.cache_dir_from_env())
    path = Path(cache_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--cache-dir {cache_dir}: is a file, expected a directory")
    if mode == MODE_BUILD:
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
        "--check", action="store_true", help="compile nothing; report every missing kernel"
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="with --check: also name the kernels at N random points inside every segment",
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
    candidates = (
        registry.registered() if combined else {p.rsplit(".", 1)[-1]: p for p in module_paths}
    )
    try:
        axes = _all_axes(candidates)
    except (ImportError, ValueError) as err:
        raise UsageError(str(err)) from None
    prog = "python -m aiter.aot.flydsl" if combined else f"python -m {module_paths[0]}"
    args = _parser(prog, {"axes": axes, "modules": list(candidates)}, combined).parse_args(argv)
    mode = MODE_LIST if args.list else MODE_CHECK if args.check else MODE_BUILD
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a number of seconds > 0, got {args.timeout:g}")
    if args.report:
        report = Path(args.report)
        if report.is_dir() or not report.parent.is_dir():
            raise UsageError(f"--report {args.report}: expected a file in an existing directory")
    if args.sample < 0 or (args.sample and mode != MODE_CHECK):
        raise UsageError("--sample N needs --check and N >= 0")
    maxima = {name: getattr(args, f"max_{name}") for name in axes}
    for name, value in maxima.items():
        if value < 1:
            raise UsageError(f"--max-{name.lower()} must be >= 1, got {value}")
    modules = candidates
    if combined and args.module:
        try:
            modules = registry.select([m.strip() for m in args.module.split(",") if m.strip()])
        except ValueError as err:
            raise UsageError(str(err)) from None
    families = {}
    for path in modules.values():
        family = registry.load(path)
        families[family.module] = family
    modules = {f.module: p for f, p in zip(families.values(), modules.values(), strict=True)}
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
        verbose=args.verbose,
        timeout=args.timeout,
        no_memo=args.no_memo,
        report_path=args.report,
    )
    env = dict(os.environ)
    for spec, paths in assign_csv(build.specs(), args.csv).items():
        joined = os.pathsep.join([p for p in [env.get(spec.env_var, "")] if p] + paths)
        env[spec.env_var] = os.environ[spec.env_var] = joined
        print(f"--csv: {', '.join(paths)} extend {spec.name}", file=sys.stderr)
    build.env = env
    build.cache_dir = _cache_dir(args.cache_dir, mode)
    build.targets = _targets(build.specs(), "/".join(families))
    return build


# --- the fingerprint memo ---


def _fingerprint(build: Build) -> tuple[str, dict[str, Any]]:
    from aiter.aot.flydsl import fingerprint

    extra = [registry.source_file(path) for path in build.modules.values()]
    inputs = fingerprint.FingerprintInputs(
        sources=tuple(fingerprint.package_sources(extra)),
        tables=tuple(p for spec in build.specs() for p in spec.paths()),
        env=fingerprint.fingerprint_env(build.env),
        versions=fingerprint.package_versions(),
        targets=tuple(str(t) for t in build.targets),
        options=tuple(sorted((f"max-{k}", str(v)) for k, v in build.maxima.items())),
    )
    return fingerprint.compute(inputs), fingerprint.describe(inputs)


def _memo_holds(build: Build, fp: str) -> bool:
    """True when the cache holds a complete build with this fingerprint, every entry intact."""
    from aiter.aot.flydsl.manifest import entry_problem, memo_entries, read_manifest

    start = time.perf_counter()
    try:
        data = read_manifest(build.cache_dir)
    except ValueError as err:
        print(f"memo: {err}; replaying", file=sys.stderr)
        return False
    entries = memo_entries(data, build.modules, [str(t) for t in build.targets], fp)
    if entries is None:
        print("memo: no build with this fingerprint in the cache; replaying", file=sys.stderr)
        return False
    bad = [
        (rel, why)
        for rel, rec in entries.items()
        if (why := entry_problem(build.cache_dir, rel, rec))
    ]
    if bad:
        rel, why = bad[0]
        print(f"memo: {len(bad)} entries not as built ({rel}: {why}); replaying", file=sys.stderr)
        return False
    print(
        f"up to date: the fingerprint matches and all {len(entries)} kernels of "
        f"{', '.join(build.modules)} for {', '.join(map(str, build.targets))} are intact "
        f"({time.perf_counter() - start:.2f} s); nothing replayed (--no-memo replays)"
    )
    return True


# --- running the arch processes ---


def _estimates(cache_dir: str) -> dict[str, float]:
    """Seconds per kernel function, from the compile times an earlier build recorded."""
    from aiter.aot.flydsl.manifest import read_manifest

    try:
        data = read_manifest(cache_dir)
    except ValueError:
        return {}
    seconds: dict[str, list[float]] = {}
    for modules in data["archs"].values():
        for kernels in modules.values():
            for record in kernels.values():
                if record.get("compile_seconds"):
                    seconds.setdefault(record["function"], []).append(record["compile_seconds"])
    return {fn: sum(v) / len(v) for fn, v in seconds.items()}


@dataclass
class _ArchRun:
    target: ArchTarget
    proc: subprocess.Popen
    progress: Any  # the read end of its progress pipe
    held: int = 0
    buffer: str = ""
    report: ArchReport | None = None  # sent as the last line of its progress pipe


def _start(build: Build, target: ArchTarget, budget: Any, estimates: Path) -> _ArchRun:
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", "aiter.aot.flydsl.replay", "--arch-process"]
    for path in build.modules.values():
        cmd += ["--module", path]
    cmd += ["--arch", target.arch, "--mode", build.mode, "--workers", str(build.workers)]
    cmd += ["--progress-fd", str(write_fd), "--estimates", str(estimates)]
    cmd += ["--sample", str(build.sample), "--seed", str(build.seed)]
    cmd += ["--timeout", str(build.timeout)]
    for name, value in build.maxima.items():
        cmd += ["--max", f"{name}={value}"]
    if target.cu_num is not None:
        cmd += ["--cu-num", str(target.cu_num)]
    env = {**build.env, **hooks.target_env(target.arch), **budget.child_env()}
    env[hooks.ENV_CACHE_DIR] = build.cache_dir
    # No GPU may be visible: everything must come from the dry run.
    env.update(HIP_VISIBLE_DEVICES="", ROCR_VISIBLE_DEVICES="", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen(cmd, env=env, pass_fds=(*budget.fds, write_fd))
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    return _ArchRun(target, proc, os.fdopen(read_fd, "r"))


def available_mb() -> int | None:
    """Memory the kernel says new work can use (MemAvailable), None where it does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def memory_capped_workers(workers: int, archs: int, available: int | None) -> int:
    """-j, capped so that the arch processes and the workers fit in available memory."""
    if available is None:
        return workers
    per_worker = int(os.environ.get(WORKER_MB_ENV) or WORKER_MB)
    fit = (available - archs * ARCH_PROCESS_MB) // max(per_worker, 1)
    return max(1, min(workers, fit))


def _run_archs(build: Build) -> list[ArchReport]:
    from aiter.aot.flydsl.budget import WorkerBudget
    from aiter.aot.flydsl.progress import ProgressBoard

    workers = memory_capped_workers(build.workers, len(build.targets), available_mb())
    if workers < build.workers:
        print(
            f"-j {build.workers} capped to {workers} workers: {available_mb()} MB available, "
            f"{len(build.targets)} arch processes and {os.environ.get(WORKER_MB_ENV) or WORKER_MB}"
            f" MB per worker ({WORKER_MB_ENV})",
            file=sys.stderr,
        )
        build.workers = workers
    budget = WorkerBudget.create(build.workers)
    labels = [str(t) for t in build.targets]
    board = ProgressBoard(labels)
    reports: dict[str, ArchReport] = {}
    with tempfile.TemporaryDirectory(prefix="aiter-aot-") as tmp:
        estimates = Path(tmp) / "estimates.json"
        estimates.write_text(json.dumps(_estimates(build.cache_dir)))
        runs = [_start(build, t, budget, estimates) for t in build.targets]
        selector = selectors.DefaultSelector()
        for run in runs:
            selector.register(run.progress, selectors.EVENT_READ, run)
        live = list(runs)
        while live:
            for key, _ in selector.select(timeout=0.5):
                if not _read(key.data, board):
                    selector.unregister(key.data.progress)
            for run in [r for r in live if r.proc.poll() is not None]:
                live.remove(run)
                if run.progress.fileno() in selector.get_map():
                    selector.unregister(run.progress)
                while _read(run, board):  # what it sent before it ended, the report last
                    pass
                reports[str(run.target)] = _collect(run, budget)
        board.close()
        selector.close()
    budget.close()
    return [reports[label] for label in labels]


def _read(run: _ArchRun, board: Any) -> bool:
    """Take in what an arch process sent on its pipe; False at the end of it."""
    try:
        data = os.read(run.progress.fileno(), 1 << 20)
    except BlockingIOError:  # ended, but an orphaned worker still holds the pipe open
        return False
    if not data:
        return False
    chunk = data.decode()
    run.buffer += chunk
    *lines, run.buffer = run.buffer.split("\n")
    for line in lines:
        message = json.loads(line)
        if "report" in message:
            run.report = from_json(ArchReport, message["report"])
            continue
        run.held = message.pop("held", 0)
        board.update(str(run.target), **message)
    return True


def _collect(run: _ArchRun, budget: Any) -> ArchReport:
    code = run.proc.returncode
    if code == 0 and run.report is not None:
        return run.report
    budget.add(run.held)  # what it held dies with it; give it back to the others
    why = f"arch process exited with {code}" + (" (usage error)" if code == EXIT_USAGE else "")
    return ArchReport(arch=run.target.arch, mode="", crashed=why)


# --- after the run ---


def _versions() -> dict[str, str]:
    from aiter.aot.flydsl import fingerprint

    return dict(fingerprint.package_versions())


def _recorded_seconds(cache_dir: str, arch: str) -> dict[str, float]:
    """Compile seconds an earlier build recorded per entry, kept for entries not rebuilt."""
    from aiter.aot.flydsl.manifest import read_manifest

    try:
        modules = read_manifest(cache_dir)["archs"].get(arch, {})
    except ValueError:
        return {}
    return {
        rel: record.get("compile_seconds", 0.0)
        for kernels in modules.values()
        for rel, record in kernels.items()
    }


def write_manifest(build: Build, report: ArchReport) -> None:
    from aiter.aot.flydsl.manifest import file_digest, update_manifest

    recorded = _recorded_seconds(build.cache_dir, report.arch)
    seconds: dict[str, float] = {}
    for c in report.compiles:
        for f in c.compiled:
            seconds[f] = c.seconds / max(len(c.compiled), 1)
    for module in build.families:
        kernels: dict[str, dict[str, Any]] = {}
        for result in report.results:
            if result.job.module != module:
                continue
            for seg in result.segments:
                for k in seg.kernels:
                    if not k.path.is_file():  # the manifest lists what the cache holds
                        continue
                    rel = os.path.relpath(k.path, build.cache_dir)
                    if rel not in kernels:
                        size, digest = file_digest(k.path)
                        kernels[rel] = {
                            "function": k.function,
                            "params": k.params,
                            "size": size,
                            "sha256": digest,
                            "compile_seconds": seconds.get(str(k.path), recorded.get(rel, 0.0)),
                            "requested_by": [],
                        }
                    kernels[rel]["requested_by"].append(
                        {
                            "module": module,
                            "table": result.job.table,
                            "row": result.job.row,
                            "axis": result.job.axis,
                            "lo": seg.lo,
                            "hi": seg.hi,
                            "fixed": result.job.fixed,
                            "variant": result.job.variant,
                        }
                    )
        update_manifest(build.cache_dir, report.arch, module, kernels, _versions())


def _write_report(
    build: Build, reports: list[ArchReport], rows: list[dict[str, Any]], up_to_date: bool = False
) -> None:
    """--report: the whole typed report; a build the memo answered has no arch reports."""
    if not build.report_path:
        return
    document = {
        "mode": build.mode,
        "modules": list(build.modules),
        "up_to_date": up_to_date,
        "archs": to_json(reports),
        "summary": rows,
    }
    Path(build.report_path).write_text(json.dumps(document, indent=1))


def main(module_paths: Sequence[str] | None = None, argv: Sequence[str] | None = None) -> int:
    """The command line of the AOT builder: every registered module (module_paths None) or the
    named ones; build (default), --list or --check."""
    try:
        build = parse(module_paths, argv)
        fp = inputs = None
        if build.mode == MODE_BUILD and build.targets:
            fp, inputs = _fingerprint(build)
            if not build.no_memo and _memo_holds(build, fp):
                _write_report(build, [], [], up_to_date=True)
                return EXIT_OK
            from aiter.toolchain import LinkerNotFound, configure_linker

            try:
                build.env["ROCM_PATH"] = str(configure_linker().rocm_path)
            except LinkerNotFound as err:
                raise UsageError(str(err)) from None
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if not build.targets:
        print(f"nothing to do: no {'/'.join(build.families)} table rows for the requested archs")
        return EXIT_OK

    print(
        f"replaying {', '.join(build.families)} for {', '.join(map(str, build.targets))} "
        f"({build.mode}, {build.workers} workers) into {build.cache_dir}",
        file=sys.stderr,
    )
    reports = _run_archs(build)
    failed = False
    for report in reports:
        print_job_lines(report, build.mode, build.verbose)
        failed |= bool(report.crashed) or any(r.tag == FAIL for r in report.results)
        if build.mode == MODE_BUILD and not report.crashed:
            write_manifest(build, report)
    rows = summary_rows(reports)
    print_summary(rows, reports, build.maxima)
    if build.mode == MODE_BUILD and not failed and fp is not None:
        from aiter.aot.flydsl.manifest import record_build

        record_build(
            build.cache_dir,
            build.modules,
            {r.arch for r in reports},
            [str(t) for t in build.targets],
            fp,
            inputs or {},
        )
    _write_report(build, reports, rows)
    if build.mode == MODE_BUILD:
        print(f"cache: {build.cache_dir}")
        print(
            f"serve from it with: {hooks.ENV_CACHE_DIR}={build.cache_dir} {hooks.ENV_RUN_ONLY}=1 "
            "(FlyDSL then loads kernels and never compiles)"
        )
    return EXIT_FAIL if failed else EXIT_OK
