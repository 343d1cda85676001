"""Naming: which kernels a job's public entry asks for at each value of its axis, found by
bisection inside one dry run per job, compiling nothing; and the random points of the audit.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from aiter.aot.flydsl.jobs import Job
from aiter.aot.flydsl.protocol import (
    JobInfo,
    JobResult,
    KernelRef,
    Sample,
    Segment,
    Tag,
)


def _kernel_ref(request: Any) -> KernelRef:
    return KernelRef(
        function=request.function,
        cache_dir=request.cache_dir,
        file=request.file_name,
        params=request.describe_params(),
    )


@contextmanager
def naming_session(job: Job) -> Iterator[Callable[[Mapping[str, int]], Any]]:
    """A probe that names the kernels and serving backends of the public entry at given axis
    values, compiling nothing; one dry run serves every probe of the job."""
    from aiter import dispatch
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run

    info = job.info
    with dispatch.observe() as records, dry_run(info.arch, info.cu_num, bridge.MODE_NAME) as reqs:

        def probe(values: Mapping[str, int]) -> tuple[tuple[KernelRef, ...], tuple[str, ...]]:
            first_request, first_record = len(reqs), len(records)
            job.call(**values)
            kernels = {k.path: k for k in map(_kernel_ref, reqs[first_request:])}
            ordered = tuple(sorted(kernels.values(), key=lambda k: (k.function, k.file)))
            return ordered, tuple(sorted({r.backend for r in records[first_record:]}))

        yield probe


def replayed_ranges(info: JobInfo, limit: int | None) -> tuple[list[tuple[int, int]], str]:
    """Ranges of the axis to replay under a module's limit, and what the limit refused."""
    if limit is None or info.hi <= limit:
        return [(info.lo, info.hi)], ""
    ranges = [(info.lo, limit)] if info.lo <= limit else []
    tabled = info.tabled
    if tabled is not None and tabled > limit and info.lo <= tabled <= info.hi:
        ranges.append((tabled, tabled))
    lo = max(info.lo, limit + 1)
    refused = f"in-between {info.axis} {lo}-{info.hi} above the module's limit {limit} not replayed"
    if tabled is not None and tabled > limit:
        refused += f" (the tabled {info.axis} {tabled} is)"
    return ranges, refused


def _sample_points(info: JobInfo, segments: list[Segment], count: int, seed: int) -> list:
    """`count` random points inside every segment of width > 1, or inside the job's grid cell."""
    rng = random.Random(seed ^ zlib.crc32(info.describe().encode()))
    points: list[tuple[dict[str, int], int]] = []
    if info.cell:
        for _ in range(count):
            values = {axis: rng.randint(lo, hi) for axis, (lo, hi) in info.cell.items()}
            points.append((values, -1))
        return points
    for index, seg in enumerate(segments):
        if seg.hi > seg.lo:
            points += [(info.values(rng.randint(seg.lo, seg.hi)), index) for _ in range(count)]
    return points


def name_job(job: Job, limit: int | None, sample: int = 0, seed: int = 0) -> JobResult:
    """Every segment of the job's range with the kernels it asks for, and a tag."""
    from aiter.aot.flydsl.bisection import segments

    info = job.info
    result = JobResult(info)
    ranges, refused = replayed_ranges(info, limit)
    cpu = time.process_time()
    backends: set[str] = set()

    try:
        with naming_session(job) as probe:

            def at(value: int):
                result.probes += 1
                return probe(info.values(value))

            # A lookup that matches a row's own value exactly may serve it unlike its neighbours
            # (conv3d: the row's split-K there, one resolved per call around it).
            exact = [] if info.tabled is None else [info.tabled - 1, info.tabled, info.tabled + 1]
            for lo, hi in ranges:
                dense = hi - lo + 1 <= job.probe_every_up_to
                points = range(lo, hi + 1) if dense else [v for v in exact if lo <= v <= hi]
                for seg in segments(at, lo, hi, points=points):
                    kernels, seg_backends = seg.value
                    backends.update(seg_backends)
                    result.segments.append(
                        Segment(seg.lo, seg.hi, list(kernels), list(seg_backends))
                    )
            for values, index in _sample_points(info, result.segments, sample, seed):
                result.probes += 1
                kernels, _ = probe(values)
                result.samples.append(Sample(values, index, list(kernels)))
    except NotImplementedError as err:
        result.tag, result.message, result.segments = Tag.SKIP, f"runtime declines: {err}", []
    except Exception as err:  # every other failure fails this job only
        result.tag, result.message = Tag.FAIL, f"{type(err).__name__}: {err}"
    else:
        if not any(seg.kernels for seg in result.segments):
            if backends and "flydsl" not in backends:
                result.tag, result.message = (
                    Tag.UNREACHED,
                    f"served by {', '.join(sorted(backends))}",
                )
            else:
                result.tag = Tag.FAIL
                result.message = "the call launched no FlyDSL kernel and reported none"
        elif refused:
            result.tag, result.message = Tag.REFUSED, refused
    result.naming_cpu = time.process_time() - cpu
    return result
