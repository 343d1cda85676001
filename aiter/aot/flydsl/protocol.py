"""The replay's typed records: jobs, segments, kernel references, compile tasks, results and
per-arch reports, each a dataclass with a JSON round trip (`to_json`, `from_json`).

The per-arch process sends them to the driver; the driver, the manifest, `--report` and the tests
read them. Nothing here imports torch or FlyDSL.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

OK, SKIP, REFUSED, UNREACHED, FAIL = "OK", "SKIP", "REFUSED", "UNREACHED", "FAIL"
TAGS = (OK, SKIP, REFUSED, UNREACHED, FAIL)
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
MODE_BUILD, MODE_LIST, MODE_CHECK = "build", "list", "check"
MODES = (MODE_BUILD, MODE_LIST, MODE_CHECK)
MISSING, CORRUPT = "missing", "corrupt"

T = TypeVar("T")


@dataclass(frozen=True)
class KernelRef:
    """One FlyDSL kernel specialization as FlyDSL's cache files it."""

    function: str  # the @flyc.jit function
    cache_dir: str  # <cache root>/<function>_<manager key>
    # Not FlyDSL's full key (kilobytes, repeated in every segment of a report): the entry file
    # name is derived from it, and the parameters say what differs.
    file: str  # entry file name inside cache_dir
    params: str  # compile-time parameters, "name=value ..."

    @property
    def path(self) -> Path:
        return Path(self.cache_dir) / self.file

    def label(self) -> str:
        return f"{self.function}[{self.params}]"


@dataclass(frozen=True)
class JobInfo:
    """Where a job comes from and the range of its axis it replays; `Job` adds the caller."""

    module: str  # the AOT module, e.g. "gemm"
    table: str  # the table's file name (or a grid's name)
    row: str  # "path:line" of the row, or a grid point's label
    arch: str
    cu_num: int
    variant: str  # the caller variant, e.g. "out_dtype=float16", "" when the row fixes all
    axis: str  # the axis this job ranges over
    lo: int  # inclusive range of the axis
    hi: int
    tabled: int | None = None  # the row's own value, replayed even above a module's limit
    fixed: dict[str, int] = field(default_factory=dict)  # the other axes' values (grids)
    cell: dict[str, list[int]] = field(default_factory=dict)  # a grid cell's bounds, to sample
    group: str = ""  # grid jobs of one group name their kernels for each other (the audit)

    def values(self, value: int) -> dict[str, int]:
        """Every axis value of a call at `value` of this job's axis."""
        return {**self.fixed, self.axis: value}

    def describe(self) -> str:
        source, _, line = self.row.rpartition(":")
        where = f"{Path(source).name}:{line}" if source and line.isdigit() else self.row
        fixed = "".join(f" {k}={v}" for k, v in self.fixed.items())
        variant = f" {self.variant}" if self.variant else ""
        return f"{self.arch}:{self.cu_num} {where}{fixed} {self.axis} {self.lo}-{self.hi}{variant}"


@dataclass(frozen=True)
class Segment:
    """A run of the axis over which the call asks for the same kernels."""

    lo: int
    hi: int
    kernels: list[KernelRef]
    backends: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Missing:
    """A kernel some call needs that the cache lacks, or holds corrupt."""

    kernel: KernelRef
    lo: int
    hi: int
    problem: str = MISSING  # MISSING or CORRUPT
    why: str = ""  # what is wrong with a corrupt entry


@dataclass(frozen=True)
class Sample:
    """What the dense audit named at one random point (every axis value)."""

    values: dict[str, int]
    segment: int  # index of the segment the point lies in, -1 for a grid cell
    kernels: list[KernelRef]


@dataclass(frozen=True)
class Finding:
    """A sampled kernel the cache lacks ("missing") or the job's probes never named ("unprobed")."""

    problem: str
    values: dict[str, int]
    kernel: KernelRef


@dataclass
class JobResult:
    job: JobInfo
    tag: str = OK
    message: str = ""
    segments: list[Segment] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    probes: int = 0  # calls of the public entry in naming mode
    naming_cpu: float = 0.0  # CPU seconds they took

    def kernels(self) -> list[KernelRef]:
        """Every distinct kernel the job's segments ask for."""
        seen: dict[Path, KernelRef] = {}
        for seg in self.segments:
            for k in seg.kernels:
                seen.setdefault(k.path, k)
        return list(seen.values())


@dataclass(frozen=True)
class CompileTask:
    """Call a job's entry at one point with compiling on, so `files` land in the cache."""

    job: int  # index into the arch's job list
    values: dict[str, int]
    files: list[str]
    functions: list[str]
    estimate: float  # expected seconds; the longest compile tasks start first


@dataclass(frozen=True)
class CompileResult:
    task: CompileTask
    ok: bool
    error: str = ""
    seconds: float = 0.0
    compiled: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)  # entries that were there but not whole
    peak_rss_mb: float = 0.0


@dataclass
class ArchReport:
    arch: str
    mode: str
    results: list[JobResult] = field(default_factory=list)
    compiles: list[CompileResult] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)  # declared limits that refused a range
    naming_seconds: float = 0.0
    seconds: float = 0.0
    workers: int = 1
    crashed: str = ""  # why the arch process produced no report

    def kernels(self) -> dict[Path, KernelRef]:
        return {k.path: k for r in self.results for k in r.kernels()}

    def compiled(self) -> set[str]:
        return {f for c in self.compiles for f in c.compiled}

    def missing(self) -> set[Path]:
        """Entries some call needs that the cache lacks (sampled points included)."""
        found = {m.kernel.path for r in self.results for m in r.missing}
        sampled = {
            f.kernel.path for r in self.results for f in r.findings if f.problem == "missing"
        }
        return found | sampled


def to_json(record: Any) -> Any:
    """A record (or list of records) as plain JSON data."""
    if isinstance(record, list):
        return [to_json(r) for r in record]
    return dataclasses.asdict(record)


def from_json(cls: type[T], data: Any) -> T:
    """Rebuild a record of type `cls` from what `to_json` made of it."""
    return _convert(cls, data)


def _convert(tp: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _convert(hints[f.name], value[f.name])
            for f in dataclasses.fields(tp)
            if f.name in value
        }
        return tp(**kwargs)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return [_convert(args[0], v) for v in value]
    if origin is dict:
        return {k: _convert(args[1], v) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _convert(next(a for a in args if a is not type(None)), value)
    return value
