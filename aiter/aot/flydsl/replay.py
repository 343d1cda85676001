"""The per-arch replay process: names every job's kernels by bisection inside a dry run, then
compiles the missing kernel sets in forked workers and reports back to the driver as JSON.

Run by the driver as `python -m aiter.aot.flydsl.replay --arch-process ...`, one per arch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiter.aot.flydsl.jobs import (
    EXIT_OK,
    EXIT_USAGE,
    FAIL,
    MODE_BUILD,
    MODE_CHECK,
    MODE_LIST,
    OK,
    REFUSED,
    SKIP,
    UNREACHED,
    Family,
    Job,
    entry_path,
    progress,
)


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
            files = [str(entry_path(k)) for k in seg["kernels"]]
            todo = [f for f in files if f not in scheduled and not Path(f).is_file()]
            if todo:
                scheduled.update(files)
                tasks.append({"job": index, "m": seg["m_lo"], "files": files})
    return tasks


def _name_chunk(jobs: list[Job], indices: list[int], limit: int, arch: str) -> list[dict]:
    results = []
    for index in indices:
        results.append(_name_job(jobs[index], limit))
        progress(
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
        progress(f"[{arch}] {len(tasks)} kernel sets to compile with {workers} workers")
        outcomes = run_forked(
            tasks,
            lambda task: _compile_task(task, jobs),
            workers,
            on_done=lambda o: progress(
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
            if not entry_path(k).is_file()
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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--arch-process":
        sys.exit(arch_process_main(sys.argv[2:]))
    print("run an AOT module instead, e.g. python -m aiter.aot.flydsl.gemm", file=sys.stderr)
    sys.exit(EXIT_USAGE)
