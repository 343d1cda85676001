"""The per-arch replay process: names every job's kernels by bisection inside a dry run, and
compiles each missing kernel set in forked workers while naming goes on.

One per arch, all modules in one process, forked from the warm driver (`arch_process`) or run as
`python -m aiter.aot.flydsl.replay.arch_process SPEC.json`, told what to do by the ArchProcessSpec the driver
wrote; the workers of every arch process share the driver's budget. Counts and the final ArchReport go back on a pipe.
"""

from __future__ import annotations

import errno
import heapq
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiter.aot.flydsl import registry
from aiter.aot.flydsl.audit.entries import EntryAudit
from aiter.aot.flydsl.audit.findings import audit
from aiter.aot.flydsl.capture.jobs import capture_jobs
from aiter.aot.flydsl.jobs.family import Family, Job
from aiter.aot.flydsl.jobs.records import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ArchProcessSpec,
    ArchReport,
    CompileResult,
    CompileTask,
    JobResult,
    Mode,
    Tag,
    from_json,
    to_json,
)
from aiter.aot.flydsl.replay import operators
from aiter.aot.flydsl.replay.naming import NamingBatch, name_job

DEFAULT_COMPILE_SECONDS = 1.0  # estimate for a kernel function no earlier build has timed
# Jobs a naming worker takes at once: enough that a fork's start-up is paid rarely (its first
# job costs 10-20 ms more, in pages copied from the arch process as it touches them, and its
# memos of launch keys and inputs start from the arch process's), few enough that every worker
# gets several chunks and compiles interleave with naming.
MIN_NAMING_CHUNK, MAX_NAMING_CHUNK, CHUNKS_PER_WORKER = 8, 1024, 4
USAGE = "run an AOT module instead, e.g. python -m aiter.aot.flydsl"


class ProgressPipe:
    """The arch process's side of its pipe to the driver: counts as JSON lines while it runs,
    its ArchReport as the last line (nothing is sent when run without a driver)."""

    def __init__(self, fd: int | None, budget: Any = None) -> None:
        self._out = os.fdopen(fd, "w", buffering=1) if fd is not None else None
        self._budget = budget
        self._last = 0.0
        self.counts: dict[str, Any] = {
            "jobs_total": 0,
            "jobs_done": 0,
            "kernels_to_compile": 0,
            "kernels_compiled": 0,
            "failed": 0,
            "phase": "naming",
        }

    def send_arch_report(self, report: ArchReport) -> None:
        """The arch's report, as the last line on the pipe (a pipe still works where a full
        disk or a file-size limit stops files)."""
        if self._out is not None:
            self._out.write(json.dumps({"arch_report": to_json(report)}) + "\n")
            self._out.flush()

    def send_counts(self, force: bool = False, **counts: Any) -> None:
        """Update the counts; send them unless the last were sent under 0.2 s ago (or `force`)."""
        self.counts.update(counts)
        now = time.monotonic()
        if self._out is None or (not force and now - self._last < 0.2):
            return
        self._last = now
        held = self._budget.held if self._budget is not None else 0
        self._out.write(json.dumps({**self.counts, "held": held}) + "\n")


# --- compiling ---


def compile_task(job: Job, task: CompileTask, entries: EntryAudit) -> dict[str, Any]:
    """Runs in a forked worker: call the public entry at the task's point with compiling on."""
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run

    replaced = entries.remove_corrupt(task.files)
    before = {f for f in task.files if Path(f).is_file()}
    # Past a file-size limit a write then fails with EFBIG instead of killing the worker.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    start = time.perf_counter()
    try:
        with dry_run(job.info.arch, job.info.cu_num, bridge.MODE_COMPILE):
            job.call(**task.values)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise RuntimeError(
                f"cannot write to the cache ({err.strerror}: the disk is full or a file-size "
                "limit was reached); no partial entry was left, free space and build again"
            ) from None
        raise
    seconds = time.perf_counter() - start
    entries.forget(task.files)
    missing = [f for f in task.files if not entries.is_whole(f)]
    if missing:
        raise RuntimeError(
            f"compiled, but no whole cache entry was written for {', '.join(missing)}"
        )
    return {
        "seconds": seconds,
        "compiled": [f for f in task.files if f not in before],
        "replaced": replaced,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def write_trouble(path: str) -> str:
    """A note for a failed compile when writing files cannot work here: a file-size limit, or
    a nearly full disk under the cache (linking and the cache entry both write files)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        return f" (writing files may fail here: a file-size limit of {soft} bytes is set)"
    try:
        usage = os.statvfs(Path(path).parent if Path(path).parent.exists() else "/")
    except OSError:
        return ""
    free_mb = usage.f_bavail * usage.f_frsize // 2**20
    if free_mb < 64:
        return f" (writing files may fail here: {free_mb} MB free under the cache)"
    return ""


def plan_compiles(
    index: int,
    result: JobResult,
    scheduled: set[str],
    estimates: Mapping[str, float],
    entries: EntryAudit,
) -> list[CompileTask]:
    """A task per segment whose kernel set holds a kernel not yet on disk nor scheduled."""
    if result.tag not in (Tag.OK, Tag.REFUSED):
        return []
    tasks = []
    for seg in result.segments:
        files = [str(k.path) for k in seg.kernels]
        todo = [
            k for k in seg.kernels if str(k.path) not in scheduled and not entries.is_whole(k.path)
        ]
        if not todo:
            continue
        scheduled.update(files)
        tasks.append(
            CompileTask(
                job=index,
                values=result.job.values(seg.lo),
                files=files,
                functions=[k.function for k in seg.kernels],
                estimate=sum(estimates.get(k.function, DEFAULT_COMPILE_SECONDS) for k in todo),
            )
        )
    return tasks


# --- the scheduler ---


class _Scheduler:
    """Naming chunks and compile tasks on one pool of forked workers; compiles first, longest
    first, so compiling starts while naming goes on."""

    def __init__(self, jobs, limits, mode, sample, seed, estimates, pool, pipe, entries):
        self.jobs: list[Job] = jobs
        self.limits: list[int | None] = limits
        self.mode: Mode = mode
        self.sample, self.seed = sample, seed
        self.estimates = estimates
        self.pool = pool
        self.pipe: ProgressPipe = pipe
        self.entries: EntryAudit = entries
        self.timeout: float | None = None  # seconds a worker may take for one task
        self.results: list[JobResult | None] = [None] * len(jobs)
        # Running counts for the progress board: counting over the results at every accept
        # made the arch process quadratic in its jobs.
        self.done = self.failed = 0
        self.compiles: list[CompileResult] = []
        self.scheduled: set[str] = set()
        self.heap: list[tuple[float, int, CompileTask]] = []
        self.serial = 0
        self.to_compile: set[str] = set()
        # Distinct entries written: two tasks sharing a kernel (a combine kernel) may both write it.
        self.compiled_files: set[str] = set()

    def name_here(self, index: int) -> None:
        self.accept(index, self._name(index))

    def _name(self, index: int, batch: NamingBatch | None = None) -> JobResult:
        misses = self.mode == Mode.CHECK
        job, limit = self.jobs[index], self.limits[index]
        return name_job(job, limit, self.sample, self.seed, misses, batch)

    def accept(self, index: int, result: JobResult) -> None:
        previous = self.results[index]
        self.done += previous is None
        self.failed += (result.tag == Tag.FAIL) - (
            previous is not None and previous.tag == Tag.FAIL
        )
        self.results[index] = result
        if self.mode == Mode.BUILD:
            for task in plan_compiles(index, result, self.scheduled, self.estimates, self.entries):
                self.serial += 1
                self.to_compile.update(f for f in task.files if not self.entries.is_whole(f))
                heapq.heappush(self.heap, (-task.estimate, self.serial, task))
        self.send_counts()

    def send_counts(self, force: bool = False) -> None:
        """Jobs named, kernels compiled, failures and the phase, to the driver's progress board."""
        done, failed = self.done, self.failed
        phase = "naming" if done < len(self.jobs) else "compiling" if self.pool.busy else "done"
        self.pipe.send_counts(
            force,
            jobs_total=len(self.jobs),
            jobs_done=done,
            kernels_to_compile=len(self.to_compile),
            kernels_compiled=len(self.compiled_files),
            failed=failed,
            phase=phase,
        )

    def run(self, pending: list[int]) -> None:
        size = len(pending) // (CHUNKS_PER_WORKER * self.pool.workers)
        size = max(MIN_NAMING_CHUNK, min(MAX_NAMING_CHUNK, size))
        chunks = [pending[i : i + size] for i in range(0, len(pending), size)]
        while chunks or self.heap or self.pool.busy:
            while (chunks or self.heap) and self.pool.reserve():
                if self.heap:
                    task = heapq.heappop(self.heap)[2]
                    self.pool.start(("compile", task), task, self._compile_in_child, self.timeout)
                else:
                    chunk = chunks.pop(0)
                    self.pool.start(("name", chunk), chunk, self._name_in_child, self.timeout)
            finished = self.pool.wait(timeout=0.1)
            if finished is not None:
                (kind, what), outcome = finished
                if kind == "name":
                    self._named(what, outcome)
                else:
                    self._compiled(what, outcome)
            self.send_counts()
        self.send_counts(force=True)

    def _name_in_child(self, chunk: list[int]) -> list[JobResult]:
        # The worker pool pickles what a task returns: typed results come back as they are.
        # The chunk shares a dry run; the arch process, which forks, never keeps one open.
        with NamingBatch() as batch:
            return [self._name(i, batch) for i in chunk]

    def _compile_in_child(self, task: CompileTask) -> dict[str, Any]:
        return compile_task(self.jobs[task.job], task, self.entries)

    def _named(self, chunk: list[int], outcome: Any) -> None:
        for position, index in enumerate(chunk):
            if outcome.ok:
                result = outcome.result[position]
            else:  # every job of a dead naming worker fails; the others stand
                error = f"naming worker: {outcome.error}"
                result = JobResult(self.jobs[index].info, Tag.FAIL, error)
            self.accept(index, result)

    def _compiled(self, task: CompileTask, outcome: Any) -> None:
        self.entries.forget(task.files)
        if outcome.ok:
            compiled = CompileResult(task, True, **outcome.result)
            self.compiled_files.update(compiled.compiled)
        else:
            compiled = CompileResult(task, False, error=outcome.error or "")
            failed = self.results[task.job]
            self.failed += failed.tag != Tag.FAIL
            where = ", ".join(f"{k}={v}" for k, v in task.values.items())
            hint = write_trouble(task.files[0]) if task.files else ""
            failed.tag, failed.message = Tag.FAIL, f"compile at {where}: {outcome.error}{hint}"
        self.compiles.append(compiled)


def replay_arch(
    families: Sequence[Family],
    spec: ArchProcessSpec,
    *,
    budget: Any = None,
    pipe: ProgressPipe | None = None,
) -> ArchReport:
    """Everything one arch's process does, as `spec` says."""
    import torch

    from aiter.aot.flydsl.execution.workers import ForkPool

    torch.set_num_threads(1)  # workers are processes; threads would only contend
    start = time.perf_counter()
    pipe = pipe or ProgressPipe(None)
    cu_nums = frozenset([spec.cu_num]) if spec.cu_num is not None else None
    jobs: list[Job] = []
    limits: list[int | None] = []
    report = ArchReport(arch=spec.arch, mode=spec.mode, workers=spec.workers)
    calls = _captured_calls(spec.captures)
    for family in families:
        family_jobs = family.jobs(spec.arch, cu_nums, spec.maxima) if spec.tables else []
        family_jobs += capture_jobs(
            family, calls, spec.arch, cu_nums, spec.maxima, spec.capture_widen
        )
        jobs += family_jobs
        limits += [family.limits.get(job.info.axis) for job in family_jobs]
        if any(family.limits.get(j.info.axis) is not None for j in family_jobs):
            report.limits += family.describe_limits()
    if spec.shard:
        jobs, limits = _shard(jobs, limits, spec, report)
    pool = ForkPool(spec.workers, budget)
    from aiter import flydsl_bridge as bridge

    entries = EntryAudit(bridge.cache_dir_from_env(), spec.arch)
    scheduler = _Scheduler(
        jobs, limits, spec.mode, spec.sample, spec.seed, spec.estimates, pool, pipe, entries
    )
    scheduler.timeout = spec.timeout
    try:
        # The operators' modules are imported and the first job of each table is named here,
        # so imports, FakeTensorMode and FlyDSL's state for every kernel family are warm in
        # the workers forked afterwards.
        operators.import_all()
        firsts = list(
            {(j.info.module, j.info.table): i for i, j in reversed(list(enumerate(jobs)))}.values()
        )
        for index in sorted(firsts):
            scheduler.name_here(index)
        scheduler.run([i for i in range(len(jobs)) if i not in set(firsts)])
    finally:
        pool.close()
    report.results = [r for r in scheduler.results if r is not None]
    report.compiles = scheduler.compiles
    audit(report.results, spec.mode, entries)
    report.naming_seconds = sum(r.naming_cpu for r in report.results)
    report.seconds = time.perf_counter() - start
    return report


def _shard(
    jobs: list[Job], limits: list[int | None], spec: ArchProcessSpec, report: ArchReport
) -> tuple[list[Job], list[int | None]]:
    """The part of the arch's jobs spec.shard replays (shards.py)."""
    from aiter.aot.flydsl.jobs import shards

    shard = shards.parse_shard(spec.shard)
    estimates = None
    if spec.shard_estimates:
        estimates = shards.CompileEstimates.read(spec.shard_estimates)
    kept = shards.select([job.info for job in jobs], shard, estimates)
    report.shard, report.jobs_total = str(shard), len(jobs)
    return [jobs[i] for i in kept], [limits[i] for i in kept]


def _captured_calls(paths: Sequence[str]) -> list:
    """The distinct calls of the --capture files (the driver has reported their bad lines)."""
    if not paths:
        return []
    from aiter.aot.flydsl.capture.files import read_captures

    return read_captures(paths).calls


def read_spec(path: str) -> ArchProcessSpec:
    """The ArchProcessSpec the driver wrote to `path`; ValueError when there is none."""
    try:
        return from_json(ArchProcessSpec, json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"{path}: no arch process spec the driver wrote ({err})") from None


def apply_extra_tables(spec: ArchProcessSpec, families: Sequence[Family]) -> None:
    """--csv, the way a serving process is configured: each extended table's environment
    variable names its own files, then the --csv files. Called once, before any replay, so
    every lookup of the runtime merges them."""
    tables = {table.name: table for family in families for table in family.tables}
    for name, paths in spec.extra_tables.items():
        table = tables[name]
        os.environ[table.env_var] = table.env_value(paths)


def arch_process_main(spec_path: str) -> int:
    """The arch process: replay what the spec at `spec_path` says, send the report back."""
    from aiter import flydsl_bridge as bridge

    bridge.mark_aot_build()  # forked from the driver, this process runs under its __main__
    try:
        spec = read_spec(spec_path)
    except ValueError as err:
        print(f"error: {err}; {USAGE}", file=sys.stderr)
        return EXIT_USAGE
    from aiter.toolchain import configure_linker

    configure_linker()
    from aiter.aot.flydsl.execution.budget import WorkerBudget

    # FlyDSL reads its target from the environment; a process that would compile for another
    # arch than it replays must not write a single cache entry.
    target = bridge.flydsl_target_arch()
    arch_env = os.environ.get(bridge.ENV_ARCH)
    if target != spec.arch or arch_env != spec.arch:
        print(
            f"error: replay process for {spec.arch} finds FlyDSL targeting {target} "
            f"({bridge.ENV_ARCH}={arch_env!r}); set "
            f"{' and '.join(bridge.target_env(spec.arch))} as bridge.target_env says",
            file=sys.stderr,
        )
        return EXIT_USAGE
    families = [registry.load(path) for path in spec.modules]
    apply_extra_tables(spec, families)
    budget = WorkerBudget.from_env()
    pipe = ProgressPipe(spec.progress_fd, budget)
    report = replay_arch(families, spec, budget=budget, pipe=pipe)
    if budget is not None:
        budget.release_all()
    pipe.send_arch_report(report)
    return EXIT_OK


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(USAGE, file=sys.stderr)
        sys.exit(EXIT_USAGE)
    try:
        sys.exit(arch_process_main(sys.argv[1]))
    except KeyboardInterrupt:  # the driver says so, once, for every arch
        sys.exit(EXIT_INTERRUPTED)
