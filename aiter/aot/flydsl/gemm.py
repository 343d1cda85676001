"""AOT replay of every GEMM table: each row becomes calls of its family's public entry.

`TABLES` maps a table to its caller; a row that leaves the output dtype open is replayed once
per dtype callers may pass. Run `python -m aiter.aot.flydsl.gemm [--list | --check]`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiter.aot.flydsl.driver import main
from aiter.aot.flydsl.jobs import Family, Job
from aiter.ops.tables import A8W8_BLOCKSCALE, A8W8_BPRESHUFFLE, A16W16, TableSpec
from aiter.tuning import Row, TableError, TunedTable

_DTYPE_NAMES = (
    "bfloat16", "float16", "float32", "int8", "float8_e4m3fn", "float8_e4m3fnuz",
)  # fmt: skip
OPEN_OUT_DTYPES = ("bfloat16", "float16")  # what callers of the a8w8 entries may ask for


def _dtype(row: Row, column: str):
    import torch

    name = row[column].removeprefix("torch.")
    if name not in _DTYPE_NAMES:
        raise TableError(
            f"{row.source}:{row.line}: column {column!r}: expected a torch dtype such as "
            f"torch.bfloat16, found {row[column]!r}",
            path=row.source,
            line=row.line,
            column=column,
        )
    return getattr(torch, name)


def _empty(shape: tuple[int, ...], dtype):
    import torch

    return torch.empty(shape, dtype=dtype, device="cuda")


def _a16w16(row: Row, out_name: str | None) -> Callable[[int], object]:
    from aiter.ops.gemm import gemm_a16w16

    n, k, with_bias = row.int("N"), row.int("K"), row.int("bias") == 1

    def call(m: int) -> None:
        dtype, out_dtype = _dtype(row, "dtype"), _dtype(row, "outdtype")
        bias = _empty((n,), out_dtype) if with_bias else None
        gemm_a16w16(_empty((m, k), dtype), _empty((n, k), dtype), bias, out_dtype=out_dtype)

    return call


def _a8w8_bpreshuffle(row: Row, out_name: str | None) -> Callable[[int], object]:
    import torch

    from aiter.ops.gemm_a8w8 import gemm_a8w8_bpreshuffle

    n, k = row.int("N"), row.int("K")
    out_dtype = getattr(torch, out_name)

    def call(m: int) -> None:
        q_dtype = _dtype(row, "q_dtype_w")
        gemm_a8w8_bpreshuffle(
            _empty((m, k), q_dtype),
            _empty((n, k), q_dtype),  # a preshuffled weight has the plain weight's shape
            _empty((m, 1), torch.float32),
            _empty((1, n), torch.float32),
            out_dtype=out_dtype,
        )

    return call


def _a8w8_blockscale(row: Row, out_name: str | None) -> Callable[[int], object]:
    import torch

    from aiter import device
    from aiter.ops.flydsl.gemm_a8w8 import BLOCKSCALE_BLOCK as block
    from aiter.ops.gemm_a8w8 import gemm_a8w8_blockscale

    n, k = row.int("N"), row.int("K")
    out_dtype = getattr(torch, out_name)

    def call(m: int) -> None:
        q_dtype = device.fp8_dtype()  # the table leaves it to the arch, as a caller would
        gemm_a8w8_blockscale(
            _empty((m, k), q_dtype),
            _empty((n, k), q_dtype),
            _empty((m, k // block), torch.float32),
            _empty((n // block, k // block), torch.float32),
            out_dtype=out_dtype,
        )

    return call


@dataclass(frozen=True)
class Caller:
    make: Callable[[Row, str | None], Callable[[int], object]]
    open_out_dtypes: tuple[str, ...] = ()  # replayed once each when the row leaves out open


TABLES: dict[str, Caller] = {
    A16W16.name: Caller(_a16w16),
    A8W8_BPRESHUFFLE.name: Caller(_a8w8_bpreshuffle, OPEN_OUT_DTYPES),
    A8W8_BLOCKSCALE.name: Caller(_a8w8_blockscale, OPEN_OUT_DTYPES),
}


def _variants(spec: TableSpec, row: Row) -> list[tuple[str, str | None]]:
    caller = TABLES[spec.name]
    if caller.open_out_dtypes:
        return [(f"out={name}", name) for name in caller.open_out_dtypes]
    return [(f"out={row['outdtype'].removeprefix('torch.')}", None)]


def make_jobs(
    spec: TableSpec, table: TunedTable, arch: str, cu_nums: frozenset[int] | None
) -> list[Job]:
    jobs = []
    for row in table.rows:
        if row["gfx"] != arch or (cu_nums is not None and row.int("cu_num") not in cu_nums):
            continue
        for variant, out_name in _variants(spec, row):
            call = TABLES[spec.name].make(row, out_name)
            jobs.append(Job.for_row(spec.name, table, row, variant, call))
    return jobs


FAMILY = Family(
    module="gemm",
    tables=(A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE),
    make_jobs=make_jobs,
)


def run(argv: Sequence[str] | None = None) -> int:
    return main("aiter.aot.flydsl.gemm", argv)


if __name__ == "__main__":
    sys.exit(run())
