"""What an AOT module declares (`Family`) and the jobs it makes: a table row or grid point, a
caller variant and a range of one axis, with the call of the public entry at given axis values.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiter.aot.flydsl.protocol import JobInfo
from aiter.tuning import Row, TableSpec
from aiter.tuning.spec import describe_variant

# Calls the public entry with every axis value by name, e.g. call(M=128).
Call = Callable[..., object]


@dataclass(frozen=True)
class Job:
    info: JobInfo
    call: Call = field(repr=False)

    def call_at(self, value: int) -> object:
        return self.call(**self.info.values(value))


@dataclass(frozen=True)
class Family:
    """One AOT module: its tables, how a row and variant become a call of the public entry, and
    the limits it declares. A module whose jobs are not one per row (a grid) gives make_jobs."""

    module: str  # short name in reports and the manifest, e.g. "gemm"
    tables: tuple[TableSpec, ...]
    caller: Callable[[TableSpec, Row, Mapping[str, str]], Call] | None = None
    make_jobs: (
        Callable[[Family, str, frozenset[int] | None, Mapping[str, int]], list[Job]] | None
    ) = None
    # Axis -> largest value replayed between tabled values; above it only tabled values are.
    limits: Mapping[str, int] = field(default_factory=dict)

    def axes(self) -> dict[str, int]:
        """Each axis the module's tables bucket on, with the spec's default maximum."""
        return {spec.axis.name: spec.axis.default_max for spec in self.tables}

    def jobs(
        self, arch: str, cu_nums: frozenset[int] | None, maxima: Mapping[str, int]
    ) -> list[Job]:
        if self.make_jobs is not None:
            return self.make_jobs(self, arch, cu_nums, maxima)
        return [job for spec in self.tables for job in row_jobs(self, spec, arch, cu_nums, maxima)]

    def describe_limits(self) -> list[str]:
        return [
            f"{self.module}: {axis} above {limit} is replayed only at tabled values "
            "(a limit the module declares)"
            for axis, limit in self.limits.items()
        ]


def row_jobs(
    family: Family,
    spec: TableSpec,
    arch: str,
    cu_nums: frozenset[int] | None,
    maxima: Mapping[str, int],
) -> list[Job]:
    """One job per row of `arch` and caller variant, over the range of the axis the row serves.

    The top row of a shape also covers everything above it up to the deployment's maximum
    (there the heuristic serves); ranges are cut at that maximum.
    """
    if family.caller is None:
        raise ValueError(f"AOT module {family.module!r} declares neither caller nor make_jobs")
    table = spec.load()
    axis = spec.axis
    top = maxima.get(axis.name, axis.default_max)
    jobs = []
    for row in table.rows:
        if row["gfx"] != arch or (cu_nums is not None and row.int("cu_num") not in cu_nums):
            continue
        lo, tabled = table.bucket_of(row)
        hi = top if table.is_top(row) else min(tabled, top)
        if lo > hi:
            continue
        for variant in spec.variants():
            info = JobInfo(
                module=family.module,
                table=spec.name,
                row=f"{row.source}:{row.line}",
                arch=arch,
                cu_num=row.int("cu_num"),
                variant=describe_variant(variant),
                axis=axis.name,
                lo=lo,
                hi=hi,
                tabled=tabled if tabled <= top else None,
            )
            jobs.append(Job(info, family.caller(spec, row, variant)))
    return jobs


def grid_jobs(
    family: Family,
    *,
    table: str,
    row: str,
    arch: str,
    cu_num: int,
    variant: str,
    grid: Mapping[str, Sequence[int]],
    call: Call,
) -> list[Job]:
    """Jobs over a grid of several axes: from every grid point, one job along each axis up to
    the next grid value (other axes fixed), so bisection runs along every edge. The first job of
    each point carries the grid cell it spans, where the dense audit samples random points."""
    names = list(grid)
    values = {name: sorted(set(grid[name])) for name in names}
    for name, vs in values.items():
        if not vs or vs[0] < 1:
            raise ValueError(f"grid axis {name!r} of {row}: expected values >= 1, got {vs}")
    group = f"{row} {variant}".strip()
    jobs = []
    for point in itertools.product(*(values[n] for n in names)):
        at = dict(zip(names, point, strict=True))
        following = {n: _next(values[n], at[n]) for n in names}
        cell = {n: [at[n], following[n] or at[n]] for n in names}
        edges = [n for n in names if following[n] is not None] or names[:1]
        for index, name in enumerate(edges):
            info = JobInfo(
                module=family.module,
                table=table,
                row=row,
                arch=arch,
                cu_num=cu_num,
                variant=variant,
                axis=name,
                lo=at[name],
                hi=following[name] or at[name],
                fixed={n: at[n] for n in names if n != name},
                cell=cell if index == 0 else {},
                group=group,
            )
            jobs.append(Job(info, call))
    return jobs


def _next(values: list[int], value: int) -> int | None:
    later = [v for v in values if v > value]
    return later[0] if later else None


def module_file(module: object) -> str:
    return str(Path(getattr(module, "__file__", "") or "").resolve())
