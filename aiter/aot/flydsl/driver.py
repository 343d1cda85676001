"""The AOT command line: runs one replay process per arch side by side on one worker budget
(unless the memo finds the cache complete), shows progress, prints the job lines and summary,
writes the manifest and --report, and decides the exit status.

Importing it, parsing the options and deciding that a cache is complete load neither torch nor
FlyDSL.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.execution import memo
from aiter.aot.flydsl.execution.options import Build, UsageError, parse
from aiter.aot.flydsl.execution.summary import (
    print_job_lines,
    print_summary,
    summary_rows,
    table_lines,
)
from aiter.aot.flydsl.jobs.records import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ArchProcessSpec,
    ArchReport,
    Mode,
    Tag,
    from_json,
    to_json,
)
from aiter.aot.flydsl.replay import spawn as arch_process
from aiter.arch import ArchTarget

# What one compile worker may hold (measured peak about 390 MB) and one arch process (about
# 500 MB after its first compile): -j is capped so they fit in the memory available.
WORKER_MB = 600
ARCH_PROCESS_MB = 600
WORKER_MB_ENV = "AITER_AOT_WORKER_MB"


# --- running the arch processes ---


def _estimates(cache_dir: str) -> dict[str, float]:
    """Seconds per kernel function, from the compile times an earlier build recorded."""
    from aiter.flydsl_bridge import manifest

    try:
        return manifest.read(cache_dir).mean_compile_seconds()
    except ValueError:
        return {}


@dataclass
class _ArchRun:
    target: ArchTarget
    proc: Any  # a subprocess.Popen or an arch_process.ForkedProcess
    pipe: Any  # the read end of its progress pipe
    held: int = 0
    # Pieces of the line not yet ended: the ArchReport is one long line that arrives in many
    # reads, and re-scanning a growing string on every read would cost quadratic time.
    pending: list[str] = field(default_factory=list)
    arch_report: ArchReport | None = None  # sent as the last line of its progress pipe


def _start(
    build: Build,
    target: ArchTarget,
    workers: int,
    budget: Any,
    estimates: dict[str, float],
    tmp: Path,
    started: Sequence[_ArchRun],
) -> _ArchRun:
    """Start the arch process of `target` (after those `started`): its ArchProcessSpec goes to
    a file in `tmp` whose path is its only argument; it sends counts and its ArchReport back on
    a pipe."""
    read_fd, write_fd = os.pipe()
    spec = ArchProcessSpec(
        modules=list(build.modules.values()),
        arch=target.arch,
        cu_num=target.cu_num,
        mode=build.mode,
        workers=workers,
        maxima=dict(build.maxima),
        sample=build.sample,
        seed=build.seed,
        timeout=build.timeout,
        extra_tables={name: list(paths) for name, paths in build.extra_tables.items()},
        captures=list(build.captures),
        capture_widen=build.capture_widen,
        tables=build.tables,
        estimates=estimates,
        progress_fd=write_fd,
        shard=build.shard,
        shard_estimates=build.estimates,
    )
    fd, spec_path = tempfile.mkstemp(prefix=f"{target.arch}-", suffix=".json", dir=tmp)
    with os.fdopen(fd, "w") as f:
        json.dump(to_json(spec), f)
    env = {**os.environ, **build.arch_env, **bridge.target_env(target.arch), **budget.child_env()}
    env[bridge.ENV_CACHE_DIR] = build.cache_dir
    # No GPU may be visible: everything must come from the dry run.
    env.update(HIP_VISIBLE_DEVICES="", ROCR_VISIBLE_DEVICES="", CUDA_VISIBLE_DEVICES="")
    drivers_own = [read_fd, *(run.pipe.fileno() for run in started)]
    proc = arch_process.start(spec_path, env, (*budget.fds, write_fd), drivers_own)
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
    from aiter.aot.flydsl.execution.budget import WorkerBudget
    from aiter.aot.flydsl.execution.progress import ProgressBoard

    workers = memory_capped_workers(build.workers, len(build.targets), available_mb())
    if workers < build.workers:
        print(
            f"-j {build.workers} capped to {workers} workers: {available_mb()} MB available, "
            f"{len(build.targets)} arch processes and {os.environ.get(WORKER_MB_ENV) or WORKER_MB}"
            f" MB per worker ({WORKER_MB_ENV})",
            file=sys.stderr,
        )
    budget = WorkerBudget.create(workers)
    labels = [str(t) for t in build.targets]
    board = ProgressBoard(labels)
    arch_reports: dict[str, ArchReport] = {}
    estimates = _estimates(build.cache_dir)
    with tempfile.TemporaryDirectory(prefix="aiter-aot-") as tmp:
        if arch_process.can_fork():
            arch_process.warm_up(build.modules.values())
        runs: list[_ArchRun] = []
        for target in build.targets:
            runs.append(_start(build, target, workers, budget, estimates, Path(tmp), runs))
        selector = selectors.DefaultSelector()
        for run in runs:
            selector.register(run.pipe, selectors.EVENT_READ, run)
        live = list(runs)
        try:
            _follow(live, selector, board, arch_reports, budget, build.mode)
        finally:
            for run in live:  # interrupted: no arch process outlives the command
                run.proc.kill()
                run.proc.wait()
        board.close()
        selector.close()
    budget.close()
    return [arch_reports[label] for label in labels]


def _follow(
    live: list[_ArchRun],
    selector: Any,
    board: Any,
    arch_reports: dict[str, ArchReport],
    budget: Any,
    mode: Mode,
) -> None:
    """Show every arch's progress until each has ended, collecting its ArchReport."""
    while live:
        for key, _ in selector.select(timeout=0.5):
            if not _read(key.data, board):
                selector.unregister(key.data.pipe)
        for run in [r for r in live if r.proc.poll() is not None]:
            live.remove(run)
            if run.pipe.fileno() in selector.get_map():
                selector.unregister(run.pipe)
            while _read(run, board):  # what it sent before it ended, the ArchReport last
                pass
            arch_reports[str(run.target)] = _collect(run, budget, mode)


def _read(run: _ArchRun, board: Any) -> bool:
    """Take in what an arch process sent on its pipe; False at the end of it."""
    try:
        data = os.read(run.pipe.fileno(), 1 << 20)
    except BlockingIOError:  # ended, but an orphaned worker still holds the pipe open
        return False
    if not data:
        return False
    chunk = data.decode()
    if "\n" not in chunk:
        run.pending.append(chunk)
        return True
    first, *lines = chunk.split("\n")
    lines[0:0] = ["".join([*run.pending, first])]
    *lines, rest = lines
    run.pending = [rest] if rest else []
    for line in lines:
        message = json.loads(line)
        if "arch_report" in message:
            run.arch_report = from_json(ArchReport, message["arch_report"])
            continue
        run.held = message.pop("held", 0)
        board.update(str(run.target), **message)
    return True


def _collect(run: _ArchRun, budget: Any, mode: Mode) -> ArchReport:
    """The ArchReport an ended arch process sent, or one that says why it sent none."""
    code = run.proc.returncode
    if code == 0 and run.arch_report is not None:
        return run.arch_report
    budget.add(run.held)  # what it held dies with it; give it back to the others
    why = f"arch process exited with {code}" + (" (usage error)" if code == EXIT_USAGE else "")
    return ArchReport(arch=run.target.arch, mode=mode, crashed=why)


# --- after the run ---


def _versions() -> dict[str, str]:
    from aiter.aot.flydsl.execution import fingerprint

    return dict(fingerprint.package_versions())


def _recorded_seconds(cache_dir: str, arch: str) -> dict[str, float]:
    """Compile seconds an earlier build recorded per entry, kept for entries not rebuilt."""
    from aiter.flydsl_bridge import manifest

    try:
        return manifest.read(cache_dir).compile_seconds(arch)
    except ValueError:
        return {}


def write_manifest(build: Build, report: ArchReport) -> None:
    from aiter.flydsl_bridge.entries import file_digest
    from aiter.flydsl_bridge.manifest import KernelEntry, Requester, update_manifest

    recorded = _recorded_seconds(build.cache_dir, report.arch)
    seconds: dict[str, float] = {}
    for c in report.compiles:
        for f in c.compiled:
            seconds[f] = c.seconds / max(len(c.compiled), 1)
    for module in build.families:
        kernels: dict[str, KernelEntry] = {}
        for result in report.results:
            if result.job.module != module:
                continue
            job = result.job
            for seg in result.segments:
                for k in seg.kernels:
                    if not k.path.is_file():  # the manifest lists what the cache holds
                        continue
                    rel = os.path.relpath(k.path, build.cache_dir)
                    if rel not in kernels:
                        size, digest = file_digest(k.path)
                        kernels[rel] = KernelEntry(
                            function=k.function,
                            params=k.params,
                            size=size,
                            sha256=digest,
                            compile_seconds=seconds.get(str(k.path), recorded.get(rel, 0.0)),
                        )
                    kernels[rel].requested_by.append(
                        Requester(
                            module=module,
                            table=job.table,
                            row=job.row,
                            axis=job.axis,
                            lo=seg.lo,
                            hi=seg.hi,
                            fixed=dict(job.fixed),
                            variant=job.variant,
                        )
                    )
        # A build of captures alone adds to what the module's table builds listed, a shard to
        # what the other shards built into the same cache listed.
        merge = not build.tables or bool(build.shard)
        update_manifest(build.cache_dir, report.arch, module, kernels, _versions(), merge=merge)


def _write_report_file(
    build: Build,
    arch_reports: list[ArchReport],
    rows: list[dict[str, Any]],
    up_to_date: bool = False,
    executed: dict[str, list[dict]] | None = None,
) -> None:
    """--report PATH: the whole typed report as JSON (a build the memo answered has no
    ArchReports)."""
    if not build.report_path:
        return
    document = {
        "mode": build.mode,
        "modules": list(build.modules),
        "up_to_date": up_to_date,
        "archs": to_json(arch_reports),
        "summary": rows,
    }
    if executed:
        document["executed"] = executed
    Path(build.report_path).write_text(json.dumps(document, indent=1))


def _execute(build: Build, arch_reports: list[ArchReport], out: dict[str, list[dict]]) -> bool:
    """--check --execute: each arch's cached kernels run on the emulator; whether any failed."""
    from aiter.aot.flydsl.audit import execute

    failed = False
    for report in arch_reports:
        if report.crashed:
            continue
        print(f"execute {report.arch}: running the cached kernels on the emulator", file=sys.stderr)
        try:
            records = execute.execute(report, build.cache_dir, build.sample, build.seed)
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            print(f"error: {err}", file=sys.stderr)
            failed = True
            continue
        out[report.arch] = records
        lines, bad = execute.summary(report.arch, records)
        print("\n".join(lines))
        failed |= bad
    return failed


def main(module_paths: Sequence[str] | None = None, argv: Sequence[str] | None = None) -> int:
    """The command line of the AOT builder: every registered module (module_paths None) or the
    named ones; build (default), --list or --check."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["merge"]:
        from aiter.aot.flydsl.distribution.merge import main as merge

        return merge(args[1:])
    if "--info" in args:
        from aiter.aot.flydsl.distribution.info import main as info

        return info()
    try:
        build = parse(module_paths, argv)
        fp = inputs = None
        if build.mode == Mode.BUILD and build.targets:
            fp, inputs = memo.fingerprint(build)
            # A capture is not part of the fingerprint, nor is a shard's split: such builds
            # always replay (a shard rerun finds what it compiled before in its cache).
            replays = build.no_memo or build.captures or build.shard
            if not replays and memo.memo_holds(build, fp):
                _write_report_file(build, [], [], up_to_date=True)
                return EXIT_OK
            from aiter.toolchain import LinkerNotFound, find_linker

            try:  # the arch processes link; this one only makes sure they can
                build.arch_env["ROCM_PATH"] = str(find_linker().rocm_path)
            except LinkerNotFound as err:
                raise UsageError(str(err)) from None
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if not build.targets:
        print(f"nothing to do: no {'/'.join(build.families)} table rows for the requested archs")
        return EXIT_OK
    if build.executor == "ray":
        from aiter.aot.flydsl.distribution import ray_executor

        return ray_executor.run(build)

    print(
        f"replaying {', '.join(build.families)} for {', '.join(map(str, build.targets))} "
        f"({build.mode}, {build.workers} workers) into {build.cache_dir}",
        file=sys.stderr,
    )
    try:
        arch_reports = _run_archs(build)
    except KeyboardInterrupt:
        # Entries land whole or not at all, so an interrupted build leaves a usable cache.
        print("interrupted: the cache holds what was compiled so far; build again to finish",
              file=sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    failed = False
    for report in arch_reports:
        print_job_lines(report, build.mode, build.verbose)
        failed |= bool(report.crashed) or any(r.tag == Tag.FAIL for r in report.results)
        if build.mode == Mode.BUILD and not report.crashed:
            write_manifest(build, report)
    rows = summary_rows(arch_reports)
    print_summary(rows, arch_reports, build.maxima)
    executed: dict[str, list[dict]] = {}
    if build.execute:
        failed |= _execute(build, arch_reports, executed)
    if build.tables:
        specs = [(spec, build.extra_paths(spec)) for spec in build.specs()]
        print("\n".join(table_lines(specs)))
    if build.capture_problems:
        print(f"capture: {len(build.capture_problems)} line(s) could not be used as written "
              "(reported at the start); exit status 1", file=sys.stderr)  # fmt: skip
        failed = True
    if build.mode == Mode.BUILD and not failed and fp is not None and build.tables:
        from aiter.flydsl_bridge.manifest import record_build

        record_build(
            build.cache_dir,
            build.modules,
            {r.arch for r in arch_reports},
            [str(t) for t in build.targets],
            fp,
            inputs or {},
            shard=build.shard,
        )
    _write_report_file(build, arch_reports, rows, executed=executed)
    if build.mode == Mode.BUILD:
        print(f"cache: {build.cache_dir}")
        print(
            f"serve from it with: {bridge.ENV_CACHE_DIR}={build.cache_dir} {bridge.ENV_RUN_ONLY}=1 "
            "(FlyDSL then loads kernels and never compiles)"
        )
    return EXIT_FAIL if failed else EXIT_OK
