"""The replay's typed records: what one arch process is asked to do, jobs, segments, kernel
references, compile tasks, results and per-arch reports, each a dataclass with a JSON round trip
(`to_json`, `from_json`); tags, modes and problem kinds are string enums.

The driver writes an ArchProcessSpec for each arch process, which sends the others back; the
driver, `--report` and the tests read them. Nothing here imports torch or FlyDSL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from aiter.tuning.row import row_name

# The JSON round trip of these records, re-exported for the code that imports it from here.
from aiter.typed_json import from_json as from_json
from aiter.typed_json import to_json as to_json

# String enums: a member is its value ("OK", "build") in JSON, f-strings and comparisons.


class Tag(StrEnum):
    """How a job ended (README "Result tags")."""

    OK = "OK"
    SKIP = "SKIP"
    REFUSED = "REFUSED"
    UNREACHED = "UNREACHED"
    FAIL = "FAIL"


class Mode(StrEnum):
    """What a replay does with the kernels it names: compile, list or check them."""

    BUILD = "build"
    LIST = "list"
    CHECK = "check"


class EntryProblem(StrEnum):
    """Why the cache does not serve a kernel some call needs."""

    MISSING = "missing"
    CORRUPT = "corrupt"


class SampleProblem(StrEnum):
    """What the dense audit found wrong with a kernel named at a random point."""

    MISSING = "missing"  # the cache lacks it
    UNPROBED = "unprobed"  # no bisection probe of the job named it


EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
CAPTURE_TABLE = "capture"  # the `table` of a captured call's job; its `row` is "path:line"


@dataclass(frozen=True)
class ArchProcessSpec:
    """Everything one arch process replays and how. The driver writes it as JSON to a file whose
    path is the process's only argument (`python -m aiter.aot.flydsl.replay.arch_process PATH`)."""

    modules: list[str]  # import paths of the AOT modules, all replayed in this one process
    arch: str
    cu_num: int | None  # None: every CU count the tables hold for the arch
    mode: Mode
    workers: int  # at most this many at once; the driver's budget is shared by every arch
    maxima: dict[str, int]  # axis -> the largest value the deployment serves
    sample: int  # --check --sample N: random points named inside every segment
    seed: int
    timeout: float  # seconds a worker may take for one task
    # Table file name -> the --csv files that extend it, merged after those its variable names.
    extra_tables: dict[str, list[str]] = field(default_factory=dict)
    captures: list[str] = field(default_factory=list)  # --capture files whose calls are replayed
    capture_widen: bool = False
    tables: bool = True  # whether the modules' tables are replayed (besides the captures)
    estimates: dict[str, float] = field(default_factory=dict)  # compile seconds per function
    progress_fd: int | None = None  # write end of the pipe to the driver (None: no driver)
    shard: str = ""  # "I/N": replay only that part of the arch's jobs (shards.py); "": all
    shard_estimates: str = ""  # the manifest the split weighs jobs by ("": by job count)


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
    # A captured call's job (table CAPTURE_TABLE) under --capture-widen: lo..hi is widened, up
    # to this value, to the run of the axis its row or heuristic serves (0: not widened).
    widen_to: int = 0

    def values(self, value: int) -> dict[str, int]:
        """Every axis value of a call at `value` of this job's axis."""
        return {**self.fixed, self.axis: value}

    def describe(self) -> str:
        where = row_name(self.row)
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
    problem: EntryProblem = EntryProblem.MISSING
    why: str = ""  # what is wrong with a corrupt entry


@dataclass(frozen=True)
class Sample:
    """What the dense audit named at one random point (every axis value)."""

    values: dict[str, int]
    segment: int  # index of the segment the point lies in, -1 for a grid cell
    kernels: list[KernelRef]


@dataclass(frozen=True)
class Finding:
    """A sampled kernel the cache lacks or the job's probes never named."""

    problem: SampleProblem
    values: dict[str, int]
    kernel: KernelRef


@dataclass
class JobResult:
    job: JobInfo
    tag: Tag = Tag.OK
    message: str = ""
    segments: list[Segment] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # Under --check, a captured call's job: the JIT monitor's message for each absent kernel.
    misses: list[str] = field(default_factory=list)
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
    mode: Mode
    results: list[JobResult] = field(default_factory=list)
    compiles: list[CompileResult] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)  # declared limits that refused a range
    naming_seconds: float = 0.0
    seconds: float = 0.0
    workers: int = 1
    crashed: str = ""  # why the arch process produced no report
    shard: str = ""  # "I/N" when the arch's jobs were sharded
    jobs_total: int = 0  # the arch's jobs before sharding

    def kernels(self) -> dict[Path, KernelRef]:
        return {k.path: k for r in self.results for k in r.kernels()}

    def compiled(self) -> set[str]:
        return {f for c in self.compiles for f in c.compiled}

    def missing(self) -> set[Path]:
        """Entries some call needs that the cache lacks (sampled points included)."""
        found = {m.kernel.path for r in self.results for m in r.missing}
        sampled = {
            f.kernel.path
            for r in self.results
            for f in r.findings
            if f.problem == SampleProblem.MISSING
        }
        return found | sampled
