"""What the AOT replay works on and reports: jobs, the families that make them, result tags,
modes and exit codes; shared by the driver and the per-arch process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiter.ops.tables import TableSpec
from aiter.tuning import TunedTable

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


def entry_path(kernel: dict[str, Any]) -> Path:
    return Path(kernel["cache_dir"]) / kernel["file"]


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
