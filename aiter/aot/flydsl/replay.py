"""Replays tuned tables through the operators' public entries to fill, list or check FlyDSL's cache.

The driver starts one process per arch; each names kernels by bisection inside a dry run, then
compiles what is missing in forked workers. Family modules (gemm.py, ...) only turn rows into calls.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiter.arch import ARCHS, ArchTarget, parse_gpu_archs
from aiter.ops.tables import TableSpec
from aiter.tuning import TableError, TunedTable

OK, SKIP, REFUSED, UNREACHED, FAIL = "OK", "SKIP", "REFUSED", "UNREACHED", "FAIL"
TAGS = (OK, SKIP, REFUSED, UNREACHED, FAIL)
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
MODE_BUILD, MODE_LIST, MODE_CHECK = "build", "list", "check"


@dataclass
class Job:
    """One table row (or grid point) and caller variant, for one arch and CU count."""

    table: str
    row: str  # "file:line"
    arch: str
    cu_num: int
    m_lo: int  # the range of M the row serves, inclusive
    m_hi: int
    m_row: int  # the row's own M
    variant: str  # which caller variant, e.g. "out=bf16"
    call: Callable[[int], object] = field(repr=False)  # calls the public entry at M

    @classmethod
    def for_row(
        cls, table_name: str, table: TunedTable, row, variant: str, call: Callable[[int], object]
    ) -> Job:
        """The job of one table row: its arch and CU count, and the M bucket it serves."""
        m_lo, m_hi = table.bucket_of(row)
        return cls(
            table=table_name,
            row=f"{row.source}:{row.line}",
            arch=row["gfx"],
            cu_num=row.int("cu_num"),
            m_lo=m_lo,
            m_hi=m_hi,
            m_row=row.int("M"),
            variant=variant,
            call=call,
        )

    def describe(self) -> str:
        where = f"{Path(self.row.rsplit(':', 1)[0]).name}:{self.row.rsplit(':', 1)[1]}"
        variant = f" {self.variant}" if self.variant else ""
        return f"{self.arch}:{self.cu_num} {where} M {self.m_lo}-{self.m_hi}{variant}"


@dataclass(frozen=True)
class Family:
    """What an AOT module declares: its tables and how a row becomes jobs."""

    module: str  # short name used in reports and the manifest, e.g. "gemm"
    tables: tuple[TableSpec, ...]
    make_jobs: Callable[[TableSpec, TunedTable, str, frozenset[int] | None], list[Job]]
    # In-between sizes of M above this are refused (the tabled M itself is always replayed).
    inbetween_limit: int = 8192


class UsageError(Exception):
    """Bad command line or environment: exit status 2."""


# ---------------------------------------------------------------- per-arch process


def _naming(job: Job, m: int):
    """The kernels and dispatch records of the public entry at M, compiling nothing."""
    from aiter import dispatch
    from aiter.aot.flydsl import hooks
    from aiter.aot.flydsl.dry_run import dry_run

    with dispatch.observe() as records, dry_run(job.arch, job.cu_num, hooks.MODE_NAME) as requests:
        job.call(m)
    kernels = tuple(sorted({(r.cache_dir, r.key): r for r in requests}.values(), key=_req_order))
    backends = tuple(sorted({r.backend for r in records}))
    return kernels, backends


def _req_order(request) -> tuple[str, str]:
    return (request.function, request.file_name)


def _replayed_ranges(job: Job, limit: int) -> tuple[list[tuple[int, int]], str | None]:
    """Ranges of M to replay, and what was refused, under the family's in-between limit."""
    ranges: list[tuple[int, int]] = []
    if job.m_lo <= limit:
        ranges.append((job.m_lo, min(job.m_hi, limit)))
    if job.m_row > limit:
        ranges.append((job.m_row, job.m_row))
    refused = None
    if job.m_hi > limit:
        lo = max(job.m_lo, limit + 1)
        hi = job.m_hi if job.m_row != job.m_hi else job.m_hi - 1
        if lo <= hi:
            refused = f"in-between M {lo}-{hi} above the module's limit {limit} not replayed"
    return ranges, refused


def _job_result(job: Job) -> dict[str, Any]:
    """A job's report before naming: where it comes from, no segments yet."""
    return {
        "job": job.describe(),
        "table": job.table,
        "row": job.row,
        "arch": job.arch,
        "cu_num": job.cu_num,
        "m_lo": job.m_lo,
        "m_hi": job.m_hi,
        "variant": job.variant,
        "segments": [],
        "message": "",
    }


def _name_job(job: Job, limit: int) -> dict[str, Any]:
    from aiter.aot.flydsl.bisection import segments

    result = _job_result(job)
    ranges, refused = _replayed_ranges(job, limit)
    requests: dict[tuple[str, str], Any] = {}
    backends: set[str] = set()
    try:
        for lo, hi in ranges:
            for seg in segments(lambda m: _naming(job, m), lo, hi):
                kernels, seg_backends = seg.value
                backends.update(seg_backends)
                for r in kernels:
                    requests[(r.cache_dir, r.key)] = r
                result["segments"].append(
                    {"m_lo": seg.m_lo, "m_hi": seg.m_hi, "kernels": [_req_json(r) for r in kernels]}
                )
    except NotImplementedError as err:
        result.update(tag=SKIP, message=f"runtime declines: {err}", segments=[])
        return result
    except Exception as err:  # every other failure fails this job only
        result.update(tag=FAIL, message=f"{type(err).__name__}: {err}")
        return result
    if not requests:
        if backends and "flydsl" not in backends:
            result.update(tag=UNREACHED, message=f"served by {', '.join(sorted(backends))}")
        else:
            result.update(tag=FAIL, message="the call launched no FlyDSL kernel and reported none")
        return result
    result["tag"] = REFUSED if refused else OK
    result["message"] = refused or ""
    return result


def _req_json(request) -> dict[str, Any]:
    return {
        "function": request.function,
        "cache_dir": request.cache_dir,
        "key": request.key,
        "file": request.file_name,
        "params": request.describe_params(),
    }


def _entry_path(kernel: dict[str, Any]) -> Path:
    return Path(kernel["cache_dir"]) / kernel["file"]


def _compile_task(task: dict[str, Any], jobs: list[Job]) -> dict[str, Any]:
    """Runs in a forked worker: call the public entry at M with compiling on."""
    from aiter.aot.flydsl import hooks
    from aiter.aot.flydsl.dry_run import dry_run

    job = jobs[task["job"]]
    before = {f for f in task["files"] if Path(f).is_file()}
    start = time.perf_counter()
    with dry_run(job.arch, job.cu_num, hooks.MODE_COMPILE):
        job.call(task["m"])
    seconds = time.perf_counter() - start
    missing = [f for f in task["files"] if not Path(f).is_file()]
    if missing:
        raise RuntimeError(f"compiled, but no cache entry was written for {', '.join(missing)}")
    return {
        "seconds": seconds,
        "compiled": [f for f in task["files"] if f not in before],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _plan_compiles(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One task per distinct missing kernel set; each missing kernel is compiled once."""
    scheduled: set[str] = set()
    tasks = []
    for index, result in enumerate(results):
        if result["tag"] not in (OK, REFUSED):
            continue
        for seg in result["segments"]:
            files = [str(_entry_path(k)) for k in seg["kernels"]]
            todo = [f for f in files if f not in scheduled and not Path(f).is_file()]
            if todo:
                scheduled.update(files)
                tasks.append({"job": index, "m": seg["m_lo"], "files": files})
    return tasks


def _name_chunk(jobs: list[Job], indices: list[int], limit: int, arch: str) -> list[dict]:
    results = []
    for index in indices:
        results.append(_name_job(jobs[index], limit))
        _progress(
            f"[{arch}] named job {index + 1}/{len(jobs)}: {results[-1]['tag']} {jobs[index].describe()}"
        )
    return results


def _name_jobs(jobs: list[Job], limit: int, workers: int, arch: str) -> list[dict[str, Any]]:
    """Name every job's kernels; with several workers, in forked children after a warm-up.

    The first job is named here, so imports, FakeTensorMode and FlyDSL's per-function state
    are ready before the fork; the rest is dealt out round-robin and put back in order.
    """
    from aiter.aot.flydsl.workers import run_forked

    if not jobs:
        return []
    first = _name_chunk(jobs, [0], limit, arch)
    rest = list(range(1, len(jobs)))
    if workers == 1 or len(rest) < 2 * workers:
        return first + _name_chunk(jobs, rest, limit, arch)
    chunks = [rest[i::workers] for i in range(workers)]
    outcomes = run_forked(chunks, lambda chunk: _name_chunk(jobs, chunk, limit, arch), workers)
    results: list[dict[str, Any] | None] = [first[0]] + [None] * len(rest)
    for chunk, outcome in zip(chunks, outcomes, strict=True):
        if not outcome.ok:  # every job of a dead worker fails; the others stand
            for index in chunk:
                message = f"naming worker: {outcome.error}"
                results[index] = {**_job_result(jobs[index]), "tag": FAIL, "message": message}
            continue
        for index, result in zip(chunk, outcome.result, strict=True):
            results[index] = result
    return results


def replay_arch(
    family: Family, arch: str, cu_nums: frozenset[int] | None, mode: str, workers: int
) -> dict[str, Any]:
    """Everything one arch's process does; returns a JSON-able report."""
    import torch

    from aiter.aot.flydsl.workers import run_forked

    torch.set_num_threads(1)  # workers are processes; threads would only contend
    start = time.perf_counter()
    jobs: list[Job] = []
    for spec in family.tables:
        jobs += family.make_jobs(spec, spec.load(), arch, cu_nums)
    results = _name_jobs(jobs, family.inbetween_limit, workers, arch)
    naming_seconds = time.perf_counter() - start

    compile_outcomes: list[dict[str, Any]] = []
    if mode == MODE_BUILD:
        tasks = _plan_compiles(results)
        _progress(f"[{arch}] {len(tasks)} kernel sets to compile with {workers} workers")
        outcomes = run_forked(
            tasks,
            lambda task: _compile_task(task, jobs),
            workers,
            on_done=lambda o: _progress(
                f"[{arch}] compiled {o.index + 1}/{len(tasks)}: {'ok' if o.ok else o.error}"
            ),
        )
        for task, outcome in zip(tasks, outcomes, strict=True):
            compile_outcomes.append(
                {**task, "ok": outcome.ok, "error": outcome.error, **(outcome.result or {})}
            )
            if not outcome.ok:
                failed = results[task["job"]]
                failed.update(tag=FAIL, message=f"compile at M={task['m']}: {outcome.error}")

    for result in results:
        if result["tag"] not in (OK, REFUSED):
            continue
        missing = [
            {**k, "m_lo": seg["m_lo"], "m_hi": seg["m_hi"]}
            for seg in result["segments"]
            for k in seg["kernels"]
            if not _entry_path(k).is_file()
        ]
        result["missing"] = missing
        if missing and mode != MODE_LIST:
            result["tag"] = FAIL
            result["message"] = f"{len(missing)} kernel(s) missing from the cache"
    return {
        "arch": arch,
        "mode": mode,
        "results": results,
        "compiles": compile_outcomes,
        "naming_seconds": naming_seconds,
        "seconds": time.perf_counter() - start,
        "workers": workers,
    }


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def arch_process_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="aiter.aot.flydsl.replay (arch process)")
    parser.add_argument("--family", required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--cu-num", type=int, action="append")
    parser.add_argument("--mode", choices=(MODE_BUILD, MODE_LIST, MODE_CHECK), required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    from aiter.toolchain import configure_linker

    configure_linker()
    from aiter.aot.flydsl import hooks

    # FlyDSL reads its target from the environment; a process that would compile for another
    # arch than it replays must not write a single cache entry.
    target = hooks.flydsl_target_arch()
    if target != args.arch or os.environ.get("ARCH") != args.arch:
        print(
            f"error: replay process for {args.arch} finds FlyDSL targeting {target} "
            f"(ARCH={os.environ.get('ARCH')!r}); "
            "set FLYDSL_GPU_ARCH and ARCH to the arch being replayed",
            file=sys.stderr,
        )
        return EXIT_USAGE
    family = importlib.import_module(args.family).FAMILY
    cu_nums = frozenset(args.cu_num) if args.cu_num else None
    report = replay_arch(family, args.arch, cu_nums, args.mode, args.workers)
    Path(args.result).write_text(json.dumps(report))
    return EXIT_OK


# ---------------------------------------------------------------- driver


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
        _progress(f"--csv {path} extends {fits[0].name}")
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
            _progress(
                f"GPU_ARCHS names {target.arch}, but no {family.module} table has rows for it"
            )
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
                path = _entry_path(k)
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
        str(_entry_path(k))
        for r in report["results"]
        for s in r.get("segments", [])
        for k in s["kernels"]
    }
    missing = {str(_entry_path(k)) for r in report["results"] for k in r.get("missing", [])}
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
        _progress(f"replaying {family.module} for {target} ({mode}) into {cache_dir}")
        report = _run_arch(family_module, target, mode, args.workers, env)
        reports.append(report)
        tags = _print_report(family, report, mode)
        failed |= tags[FAIL] > 0
        if mode == MODE_BUILD and "crashed" not in report:
            path = _write_manifest(family, cache_dir, report)
            _progress(f"manifest: {path}")
    if args.report:
        Path(args.report).write_text(json.dumps(reports, indent=1))
    if mode == MODE_BUILD:
        print(f"cache: {cache_dir}")
        print(
            "serve from it with: FLYDSL_RUNTIME_CACHE_DIR="
            f"{cache_dir} FLYDSL_RUNTIME_RUN_ONLY=1 (FlyDSL then loads kernels and never compiles)"
        )
    return EXIT_FAIL if failed else EXIT_OK


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--arch-process":
        sys.exit(arch_process_main(sys.argv[2:]))
    print("run an AOT module instead, e.g. python -m aiter.aot.flydsl.gemm", file=sys.stderr)
    sys.exit(EXIT_USAGE)
