"""What an AOT module declares (`Family`) and the jobs made from it, here and nowhere else: a table
row or grid point, a caller variant and a range of one axis, with the call of the public entry.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiter.aot.flydsl.jobs.axes import AlongOf
from aiter.aot.flydsl.jobs.bisection import segments
from aiter.aot.flydsl.jobs.records import JobInfo
from aiter.tuning import Row, TableSpec
from aiter.tuning.kinds import PARSERS
from aiter.tuning.spec import describe_variant

# Calls the public entry with every axis value by name, e.g. call(M=128).
Call = Callable[..., object]
# A row's caller variants, e.g. [{"out_dtype": "float16"}, {"out_dtype": "bfloat16"}].
Variants = Callable[[TableSpec, Row], list[dict[str, str]]]
# The row of a shape (its rows, sorted by their axis value) the runtime's lookup serves a call at
# a value of the axis with; None when none of them does (the heuristic, or another shape's row).
Serving = Callable[[TableSpec, Sequence[Row], int], Row | None]
# A row's grid of several axes (axis -> values), given the deployment's maxima.
Grid = Callable[[TableSpec, Row, Mapping[str, int]], Mapping[str, Sequence[int]]]
# The points of a row and caller variant that decide its kernels, each with the cell of the
# axes (axis -> [lo, hi]) whose every point needs the kernels of one of them, for the audit.
Points = Callable[
    [TableSpec, Row, Mapping[str, str], Mapping[str, int]],
    list[tuple[Mapping[str, int], Mapping[str, list[int]]]],
]


@dataclass(frozen=True)
class Job:
    info: JobInfo
    call: Call = field(repr=False)
    # Ranges of at most this many values are probed at every value, not bisected (0: never).
    probe_every_up_to: int = 0
    # The family's runtime function of the axis that cuts a widened capture job's range.
    segment_by: Callable[[int], Hashable] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CapturedOp:
    """How a build replays a captured call of one public entry: the entry, and where the call
    sits on the family's axis (so `--capture-widen` can move it along; see capture_axis)."""

    entry: str  # "module:function" of the public entry
    # The captured arguments -> their Along; None, or a call it returns None for: the call is
    # replayed only as captured.
    along: AlongOf | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Family:
    """One AOT module: its tables, how a row and caller variant become a call of the public
    entry, and what it declares about its jobs; `jobs` makes them all from these declarations.

    A shape of a table (its rows of one arch and key but for the axis value) is replayed from 1
    to the deployment's maximum, cut into runs where the row `serving` names changes (by default
    the table's buckets: a row serves the values above the previous tabled one up to its own, the
    top row everything above it) and where `segment_by` changes; each run is one job of the row
    serving it per caller variant. A module whose rows each span a grid declares `grid` instead.
    """

    name: str  # short name in reports and the manifest, e.g. "gemm"
    tables: tuple[TableSpec, ...]
    caller: Callable[[TableSpec, Row, Mapping[str, str]], Call]
    # A row's caller variants; None: every combination of its spec's open choices.
    variants: Variants | None = None
    # The runtime's own lookup of a shape's row; None: the table's buckets (`bucket_serving`).
    serving: Serving | None = None
    # A runtime function of the axis alone (MoE's padded token count): each run over which it is
    # constant is a job of its own, even where one row serves several. Its jobs then come shape
    # by shape; otherwise in the table's order of the rows they replay.
    segment_by: Callable[[int], Hashable] | None = None
    # Whether the runs no row of the shape serves (the heuristic does) are replayed, each as a
    # job of the shape's row nearest to its start (tabled None).
    replay_unserved: bool = True
    # Each row's grid of several axes (chunk_gdn_h): jobs along every grid edge instead of runs.
    grid: Grid | None = None
    # Where a module's plan proves which points decide a row's kernels (attention): one job per
    # point, and no other probe.
    points: Points | None = None
    # Axis -> largest value replayed between tabled values; above it only tabled values are.
    limits: Mapping[str, int] = field(default_factory=dict)
    # Packages outside aiter holding the family's runtime (entry, plan, kernels), by import name:
    # their sources enter the build's fingerprint, as aiter's own do.
    sources: tuple[str, ...] = ()
    # Where the runtime's choice need not be monotone along the axis and probes are cheap,
    # ranges of at most this many values are probed at every value instead of bisected; 0:
    # bisection alone (every in-tree module: each states why its choice is monotone).
    probe_every_up_to: int = 0
    # The public entries whose captured calls (`--capture`) this module replays, by op name.
    captured: Mapping[str, CapturedOp] = field(default_factory=dict)

    def axes(self) -> dict[str, int]:
        """Each axis the module's tables bucket on, with the spec's default maximum."""
        return {spec.axis.name: spec.axis.default_max for spec in self.tables}

    def variants_of(self, spec: TableSpec, row: Row) -> list[dict[str, str]]:
        return self.variants(spec, row) if self.variants is not None else spec.variants()

    def jobs(
        self, arch: str, cu_nums: frozenset[int] | None, maxima: Mapping[str, int]
    ) -> list[Job]:
        """Every job of `arch` (only rows of `cu_nums` when given), axes cut at `maxima`."""
        jobs = []
        for spec in self.tables:
            rows = [
                row
                for row in spec.load().rows
                if row["gfx"] == arch and (cu_nums is None or row.int("cu_num") in cu_nums)
            ]
            if self.points is not None:
                for row in rows:
                    for variant in self.variants_of(spec, row):
                        points = self.points(spec, row, variant, maxima)
                        jobs += point_jobs(self, spec, row, variant, points)
            elif self.grid is not None:
                for row in rows:
                    grid = self.grid(spec, row, maxima)
                    for variant in self.variants_of(spec, row):
                        jobs += grid_jobs(self, spec, row, variant, grid)
            else:
                jobs += run_jobs(
                    self, spec, rows, maxima.get(spec.axis.name, spec.axis.default_max)
                )
        return jobs

    def describe_limits(self) -> list[str]:
        return [
            f"{self.name}: {axis} above {limit} is replayed only at tabled values "
            "(a limit the module declares)"
            for axis, limit in self.limits.items()
        ]


def job_info(
    family: Family,
    spec: TableSpec,
    row: Row,
    variant: Mapping[str, str],
    lo: int,
    hi: int,
    *,
    tabled: int | None = None,
    axis: str | None = None,
    fixed: Mapping[str, int] | None = None,
    cell: Mapping[str, list[int]] | None = None,
    group: str = "",
) -> JobInfo:
    """The one place a JobInfo is made: the module, the table, the row ("path:line") with its
    arch and CU count, the caller variant, and the range lo..hi of `axis` (default: the table's;
    a grid's job names its own and the other axes' `fixed` values)."""
    return JobInfo(
        module=family.name,
        table=spec.name,
        row=row_ref(row),
        arch=row["gfx"],
        cu_num=row.int("cu_num"),
        variant=describe_variant(variant),
        axis=axis or spec.axis.name,
        lo=lo,
        hi=hi,
        tabled=tabled,
        fixed=dict(fixed or {}),
        cell=dict(cell or {}),
        group=group,
    )


def row_ref(row: Row) -> str:
    return f"{row.source}:{row.line}"


@dataclass(frozen=True)
class Run:
    """A run of a shape's axis that one row serves (or, not `served`, the heuristic)."""

    row: Row
    lo: int
    hi: int  # inclusive
    served: bool = True


def run_jobs(family: Family, spec: TableSpec, rows: Sequence[Row], top: int) -> list[Job]:
    """One job per run of each shape's axis (`shape_runs`) and caller variant of its row; the
    row's own value is the job's `tabled` when the row serves it inside the run."""
    shapes: dict[tuple[object, ...], list[Row]] = {}
    for row in rows:
        shapes.setdefault(shape_of(spec, row), []).append(row)
    runs = []
    for shape in shapes.values():
        runs += shape_runs(family, spec, sorted(shape, key=spec.row_axis_value), top)
    if family.segment_by is None:
        order = {row_ref(row): index for index, row in enumerate(rows)}
        runs.sort(key=lambda run: order[row_ref(run.row)])  # stable: each row's in axis order
    jobs = []
    for run in runs:
        value = spec.row_axis_value(run.row)
        tabled = value if run.served and run.lo <= value <= run.hi else None
        for variant in family.variants_of(spec, run.row):
            info = job_info(family, spec, run.row, variant, run.lo, run.hi, tabled=tabled)
            call = family.caller(spec, run.row, variant)
            jobs.append(Job(info, call, family.probe_every_up_to))
    return jobs


def shape_runs(family: Family, spec: TableSpec, rows: Sequence[Row], top: int) -> list[Run]:
    """The runs of 1..top over which the row serving one shape (`rows`, sorted by their axis
    value) and the family's `segment_by` are constant, found by bisection; each row's value and
    the next are probed too, so a row that serves only its own value is not missed."""
    if top < 1:
        return []
    serving = family.serving or bucket_serving
    values = [spec.row_axis_value(row) for row in rows]
    points = sorted({p for v in values for p in (v, v + 1) if p <= top})
    pieces = [(1, top)]
    if family.segment_by is not None:
        pieces = [(s.lo, s.hi) for s in segments(family.segment_by, 1, top, points)]
    runs = []
    for lo, hi in pieces:
        for seg in segments(lambda value: serving(spec, rows, value), lo, hi, points):
            if seg.value is not None:
                runs.append(Run(seg.value, seg.lo, seg.hi))
            elif family.replay_unserved:
                nearest = min(rows, key=lambda row: abs(spec.row_axis_value(row) - seg.lo))
                runs.append(Run(nearest, seg.lo, seg.hi, served=False))
    return runs


def bucket_serving(spec: TableSpec, rows: Sequence[Row], value: int) -> Row:
    """The table's buckets: the row with the smallest tabled value >= `value`; above them all the
    top row (the heuristic serves there, with the top row's shape)."""
    index = bisect_left([spec.row_axis_value(row) for row in rows], value)
    return rows[min(index, len(rows) - 1)]


def shape_of(spec: TableSpec, row: Row) -> tuple[object, ...]:
    """The row's shape: its key but for the axis, compared as the table's lookup compares it."""
    kinds = {column.name: column.kind for column in spec.columns}
    return tuple(PARSERS[kinds[name]](row[name]) for name in spec.key if name != spec.axis.column)


def grid_jobs(
    family: Family,
    spec: TableSpec,
    row: Row,
    variant: Mapping[str, str],
    grid: Mapping[str, Sequence[int]],
) -> list[Job]:
    """Jobs over a grid of several axes: from every grid point, one job along each axis up to
    the next grid value (other axes fixed), so bisection runs along every edge. The first job of
    each point carries the grid cell it spans, where the dense audit samples random points."""
    names = list(grid)
    values = {name: sorted(set(grid[name])) for name in names}
    for name, vs in values.items():
        if not vs or vs[0] < 1:
            raise ValueError(
                f"grid axis {name!r} of {row_ref(row)}: expected values >= 1, got {vs}"
            )
    call = family.caller(spec, row, variant)
    group = f"{row_ref(row)} {describe_variant(variant)}".strip()
    jobs = []
    for point in itertools.product(*(values[n] for n in names)):
        at = dict(zip(names, point, strict=True))
        following = {n: _next(values[n], at[n]) for n in names}
        cell = {n: [at[n], following[n] or at[n]] for n in names}
        edges = [n for n in names if following[n] is not None] or names[:1]
        for index, name in enumerate(edges):
            info = job_info(
                family,
                spec,
                row,
                variant,
                at[name],
                following[name] or at[name],
                axis=name,
                fixed={n: at[n] for n in names if n != name},
                cell=cell if index == 0 else {},
                group=group,
            )
            jobs.append(Job(info, call))
    return jobs


def point_jobs(
    family: Family,
    spec: TableSpec,
    row: Row,
    variant: Mapping[str, str],
    points: Sequence[tuple[Mapping[str, int], Mapping[str, list[int]]]],
) -> list[Job]:
    """One job per point, probed once (its last axis from the value to itself, the others
    fixed), carrying the cell the point stands for, where the dense audit samples."""
    call = family.caller(spec, row, variant)
    group = f"{row_ref(row)} {describe_variant(variant)}".strip()
    jobs = []
    for values, cell in points:
        *others, axis = values
        if any(v < 1 for v in values.values()):
            raise ValueError(f"point {dict(values)} of {row_ref(row)}: expected values >= 1")
        info = job_info(
            family, spec, row, variant, values[axis], values[axis], axis=axis,
            fixed={n: values[n] for n in others}, cell=cell, group=group,
        )  # fmt: skip
        jobs.append(Job(info, call))
    return jobs


def _next(values: list[int], value: int) -> int | None:
    later = [v for v in values if v > value]
    return later[0] if later else None


def module_file(module: object) -> str:
    return str(Path(getattr(module, "__file__", "") or "").resolve())
