"""Naming: which kernels a job's public entry asks for at each value of its axis, found by
bisection inside one dry run per job, compiling nothing; and the random points of the audit.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from aiter.aot.flydsl.jobs.family import Job
from aiter.aot.flydsl.jobs.records import (
    CAPTURE_TABLE,
    JobInfo,
    JobResult,
    KernelRef,
    Sample,
    Segment,
    Tag,
)

# Each KernelRequest's KernelRef and path, by the request's identity: the naming memo hands the
# same request object to every launch with its key, and deriving a ref hashes the whole key.
_refs: dict[int, tuple[Any, KernelRef, Any]] = {}
_REFS_KEPT = 50_000


def _kernel_ref(request: Any) -> tuple[KernelRef, Any]:
    """The KernelRef of `request`, and its path."""
    known = _refs.get(id(request))
    if known is None or known[0] is not request:
        if len(_refs) >= _REFS_KEPT:  # requests from outside the memo are new each launch
            _refs.clear()
        ref = KernelRef(
            function=request.function,
            cache_dir=request.cache_dir,
            file=request.file_name,
            params=request.describe_params(),
        )
        known = _refs[id(request)] = (request, ref, ref.path)
    return known[1], known[2]


Probe = Callable[[Mapping[str, int]], "Named"]


@dataclass(frozen=True)
class Named:
    """What one probe of the public entry found."""

    kernels: tuple[KernelRef, ...]
    backends: tuple[str, ...]
    served: tuple[tuple[Any, ...], ...]  # (op, table, row, source) of each dispatch record
    # Why a backend other than FlyDSL served (the records' "reason"), for an UNREACHED tag.
    reasons: tuple[str, ...] = ()


class NamingBatch:
    """One dry run kept open across the jobs a naming worker names, while they share an arch and
    CU count: entering a dry run costs about a fifth of a one-probe job. The run is closed after
    a job that raised, and before anything opens a dry run of its own."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._device: tuple[str, int] | None = None
        self.records: list[Any] = []
        self.requests: list[Any] = []

    def session(self, arch: str, cu_num: int) -> tuple[list[Any], list[Any]]:
        """The dispatch records and kernel requests of the open dry run for (arch, cu_num)."""
        from aiter import dispatch
        from aiter import flydsl_bridge as bridge
        from aiter.aot.flydsl.dry_run import dry_run

        if self._device != (arch, cu_num):
            self.close()
            stack = ExitStack()
            self.records = stack.enter_context(dispatch.observe())
            self.requests = stack.enter_context(dry_run(arch, cu_num, bridge.MODE_NAME))
            self._stack, self._device = stack, (arch, cu_num)
        return self.records, self.requests

    def close(self) -> None:
        stack, self._stack, self._device = self._stack, None, None
        self.records, self.requests = [], []
        if stack is not None:
            stack.close()

    def __enter__(self) -> NamingBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def _own_session(job: Job) -> Iterator[tuple[list[Any], list[Any]]]:
    with NamingBatch() as batch:  # a batch of one job
        yield batch.session(job.info.arch, job.info.cu_num)


@contextmanager
def _batched_session(job: Job, batch: NamingBatch) -> Iterator[tuple[list[Any], list[Any]]]:
    try:
        yield batch.session(job.info.arch, job.info.cu_num)
    except BaseException:
        batch.close()  # what a failing call left behind stays with it
        raise


@contextmanager
def naming_session(job: Job, batch: NamingBatch | None = None) -> Iterator[Probe]:
    """A probe that names the kernels, serving backends and table rows of the public entry at
    given axis values, compiling nothing; one dry run serves every probe of the job (and the
    later jobs of `batch`, when given)."""
    session = _own_session(job) if batch is None else _batched_session(job, batch)
    with session as (records, reqs):

        def probe(values: Mapping[str, int]) -> Named:
            first_request, first_record = len(reqs), len(records)
            job.call(**values)
            kernels = {path: k for k, path in map(_kernel_ref, reqs[first_request:])}
            ordered = tuple(sorted(kernels.values(), key=lambda k: (k.function, k.file)))
            new = records[first_record:]
            return Named(
                ordered,
                tuple(sorted({r.backend for r in new})),
                tuple((r.op, r.table, r.row, r.source) for r in new),
                tuple(sorted({str(r.params["reason"]) for r in new if "reason" in r.params})),
            )

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


def served_run(probe: Probe, value: int, top: int) -> tuple[int, int]:
    """The run of 1..top around `value` over which the same table rows (or the heuristic) serve
    the call as at `value`, by binary search on each side: a row serves one run of its shape's
    axis (the table's buckets), and the heuristic the runs no row serves. A value the runtime
    declines (NotImplementedError: past a kernel's limits) is outside the run."""
    wanted = probe({"value": value}).served

    def same(at: int) -> bool:
        try:
            return probe({"value": at}).served == wanted
        except NotImplementedError:
            return False

    lo, hi = 1, value  # the smallest same value lies in lo..hi
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if same(mid) else (mid + 1, hi)
    start = lo
    lo, hi = value, top  # the largest
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if same(mid) else (lo, mid - 1)
    return start, lo


def capture_misses(job: Job, value: int) -> list[str]:
    """The JIT monitor's message for each kernel the captured call at `value` needs that the
    cache lacks, each request paired with the dispatch record reported last before it (the
    record a serving process's message names), written inside the job's dry run."""
    from aiter import dispatch, jit_monitor
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run

    info = job.info
    pairs: dict[Any, tuple[Any, Any]] = {}
    latest: list[Any] = [None]
    with dry_run(info.arch, info.cu_num, bridge.MODE_NAME) as reqs:
        paired = 0

        def pair_up() -> None:
            nonlocal paired
            for request in reqs[paired:]:
                pairs.setdefault(request.path, (request, latest[0]))
            paired = len(reqs)

        def note(record: Any) -> None:
            pair_up()  # requests before this record were made under the one before it
            latest[0] = record

        dispatch.subscribe(note)
        try:
            job.call(**info.values(value))
        finally:
            dispatch.unsubscribe(note)
        pair_up()
        messages = []
        for request, record in pairs.values():
            if request.path.is_file():
                continue
            miss = jit_monitor.describe_miss(
                request, record, "the cache does not hold it (--check --capture)"
            )
            cache = f" --cache-dir {miss.cache_root}" if miss.cache_root else ""
            fix = (
                f"build it from the capture: GPU_ARCHS={info.arch}:{info.cu_num} python -m "
                f"aiter.aot.flydsl --capture {info.row.rpartition(':')[0]}{cache}; or serve "
                f"it from a tuned row: {miss.fix}"
            )
            messages.append(jit_monitor.format_miss(replace(miss, fix=fix)))
    return messages


def name_job(
    job: Job,
    limit: int | None,
    sample: int = 0,
    seed: int = 0,
    misses: bool = False,
    batch: NamingBatch | None = None,
) -> JobResult:
    """Every segment of the job's range with the kernels it asks for, and a tag; with `misses`,
    a captured call's job also carries the miss message of each kernel the cache lacks. With
    `batch`, the job is named in the batch's dry run."""
    from aiter.aot.flydsl.jobs.bisection import segments

    info = job.info
    result = JobResult(info)
    cpu = time.process_time()
    backends: set[str] = set()
    reasons: set[str] = set()

    try:
        with naming_session(job, batch) as probe:
            if info.widen_to:

                def at_axis(values: Mapping[str, int]) -> Named:
                    result.probes += 1
                    return probe(info.values(values["value"]))

                lo, hi = served_run(at_axis, info.lo, info.widen_to)
                info = result.job = replace(info, lo=lo, hi=hi)
            ranges, refused = replayed_ranges(info, limit)

            def at(value: int):
                result.probes += 1
                named = probe(info.values(value))
                reasons.update(named.reasons)
                return named.kernels, named.backends

            # A lookup that matches a row's own value exactly may serve it unlike its neighbours
            # (conv3d: the row's split-K there, one resolved per call around it).
            exact = [] if info.tabled is None else [info.tabled - 1, info.tabled, info.tabled + 1]
            for lo, hi in ranges:
                dense = hi - lo + 1 <= job.probe_every_up_to
                points = range(lo, hi + 1) if dense else [v for v in exact if lo <= v <= hi]
                pieces = [(lo, hi)]
                if info.widen_to and job.segment_by is not None:
                    pieces = [(p.lo, p.hi) for p in segments(job.segment_by, lo, hi)]
                for piece_lo, piece_hi in pieces:
                    inside = [v for v in points if piece_lo <= v <= piece_hi]
                    for seg in segments(at, piece_lo, piece_hi, points=inside):
                        kernels, seg_backends = seg.value
                        backends.update(seg_backends)
                        result.segments.append(
                            Segment(seg.lo, seg.hi, list(kernels), list(seg_backends))
                        )
            for values, index in _sample_points(info, result.segments, sample, seed):
                result.probes += 1
                try:
                    kernels = probe(values).kernels
                except NotImplementedError:
                    continue  # the runtime declines this point (e.g. past 32-bit offsets)
                result.samples.append(Sample(values, index, list(kernels)))
        if misses and info.table == CAPTURE_TABLE and info.tabled is not None:
            if batch is not None:
                batch.close()  # capture_misses opens its own dry run
            result.misses = capture_misses(job, info.tabled)
    except NotImplementedError as err:
        result.tag, result.message, result.segments = Tag.SKIP, f"runtime declines: {err}", []
    except Exception as err:  # every other failure fails this job only
        result.tag, result.message = Tag.FAIL, f"{type(err).__name__}: {err}"
    else:
        if not any(seg.kernels for seg in result.segments):
            if backends and "flydsl" not in backends:
                result.tag, result.message = (
                    Tag.UNREACHED,
                    f"served by {', '.join(sorted(backends))}"
                    + "".join(f": {reason}" for reason in sorted(reasons)[:1]),
                )
            else:
                result.tag = Tag.FAIL
                result.message = "the call launched no FlyDSL kernel and reported none"
        elif refused:
            result.tag, result.message = Tag.REFUSED, refused
    result.naming_cpu = time.process_time() - cpu
    return result
