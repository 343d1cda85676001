"""The AOT command line: runs one replay process per arch side by side on one worker budget
(unless the memo finds the cache complete), shows progress, prints the report and summary,
writes the manifest and decides the exit status.

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
from aiter.aot.flydsl import memo
from aiter.aot.flydsl.options import Build, UsageError, parse
from aiter.aot.flydsl.protocol import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    FAIL,
    MODE_BUILD,
    ArchReport,
    from_json,
    to_json,
)
from aiter.aot.flydsl.report import print_job_lines, print_summary, summary_rows
from aiter.arch import ArchTarget

# What one compile worker may hold (measured peak about 390 MB) and one arch process (about
# 500 MB after its first compile): -j is capped so they fit in the memory available.
WORKER_MB = 600
ARCH_PROCESS_MB = 600
WORKER_MB_ENV = "AITER_AOT_WORKER_MB"


# --- running the arch processes ---


def _estimates(cache_dir: str) -> dict[str, float]:
    """Seconds per kernel function, from the compile times an earlier build recorded."""
    from aiter.flydsl_bridge.manifest import read_manifest

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
    # Pieces of the line not yet ended: the final report is one long line that arrives in many
    # reads, and re-scanning a growing string on every read would cost quadratic time.
    pending: list[str] = field(default_factory=list)
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
    env = {**build.env, **bridge.target_env(target.arch), **budget.child_env()}
    env[bridge.ENV_CACHE_DIR] = build.cache_dir
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
        try:
            _follow(live, selector, board, reports, budget)
        finally:
            for run in live:  # interrupted: no arch process outlives the command
                run.proc.kill()
                run.proc.wait()
        board.close()
        selector.close()
    budget.close()
    return [reports[label] for label in labels]


def _follow(live: list[_ArchRun], selector: Any, board: Any, reports: dict, budget: Any) -> None:
    """Show every arch's progress until each has ended, collecting its report."""
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


def _read(run: _ArchRun, board: Any) -> bool:
    """Take in what an arch process sent on its pipe; False at the end of it."""
    try:
        data = os.read(run.progress.fileno(), 1 << 20)
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
    from aiter.flydsl_bridge.manifest import read_manifest

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
    from aiter.flydsl_bridge.entries import file_digest
    from aiter.flydsl_bridge.manifest import update_manifest

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
    if "--info" in (sys.argv[1:] if argv is None else argv):
        from aiter.aot.flydsl.info import main as info

        return info()
    try:
        build = parse(module_paths, argv)
        fp = inputs = None
        if build.mode == MODE_BUILD and build.targets:
            fp, inputs = memo.fingerprint(build)
            if not build.no_memo and memo.memo_holds(build, fp):
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
    try:
        reports = _run_archs(build)
    except KeyboardInterrupt:
        # Entries land whole or not at all, so an interrupted build leaves a usable cache.
        print("interrupted: the cache holds what was compiled so far; build again to finish",
              file=sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    failed = False
    for report in reports:
        print_job_lines(report, build.mode, build.verbose)
        failed |= bool(report.crashed) or any(r.tag == FAIL for r in report.results)
        if build.mode == MODE_BUILD and not report.crashed:
            write_manifest(build, report)
    rows = summary_rows(reports)
    print_summary(rows, reports, build.maxima)
    if build.mode == MODE_BUILD and not failed and fp is not None:
        from aiter.flydsl_bridge.manifest import record_build

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
            f"serve from it with: {bridge.ENV_CACHE_DIR}={build.cache_dir} {bridge.ENV_RUN_ONLY}=1 "
            "(FlyDSL then loads kernels and never compiles)"
        )
    return EXIT_FAIL if failed else EXIT_OK
