"""AOT replay of the GEMM tables: each row becomes calls of its public entry on FakeTensors.

Run `python -m aiter.aot.flydsl.gemm [--list | --check]`; see replay.py for what happens next.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from aiter.aot.flydsl.replay import Family, Job, main
from aiter.ops.tables import A16W16, TableSpec
from aiter.tuning import TunedTable

_DTYPES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32"}


def _dtype(row, column: str):
    import torch

    name = row[column]
    if name not in _DTYPES:
        raise ValueError(
            f"{row.source}:{row.line}: column {column!r}: expected one of {list(_DTYPES)}, "
            f"found {name!r}"
        )
    return getattr(torch, _DTYPES[name])


def _a16w16_caller(row):
    """M -> the call a model makes for this row: gemm_a16w16 on [M, K] x [N, K]."""
    import torch

    from aiter.ops.gemm import gemm_a16w16

    n, k, with_bias = row.int("N"), row.int("K"), row.int("bias") == 1
    dtype, out_dtype = _dtype(row, "dtype"), _dtype(row, "outdtype")

    def call(m: int) -> None:
        a = torch.empty((m, k), dtype=dtype, device="cuda")
        b = torch.empty((n, k), dtype=dtype, device="cuda")
        bias = torch.empty((n,), dtype=out_dtype, device="cuda") if with_bias else None
        gemm_a16w16(a, b, bias, out_dtype=out_dtype)

    return call


CALLERS = {A16W16.name: _a16w16_caller}


def make_jobs(
    spec: TableSpec, table: TunedTable, arch: str, cu_nums: frozenset[int] | None
) -> list[Job]:
    jobs = []
    for row in table.rows:
        if row["gfx"] != arch or (cu_nums is not None and row.int("cu_num") not in cu_nums):
            continue
        m_lo, m_hi = table.bucket_of(row)
        jobs.append(
            Job(
                table=spec.name,
                row=f"{row.source}:{row.line}",
                arch=arch,
                cu_num=row.int("cu_num"),
                m_lo=m_lo,
                m_hi=m_hi,
                m_row=row.int("M"),
                variant=f"out={_DTYPES.get(row['outdtype'], row['outdtype'])}",
                call=CALLERS[spec.name](row),
            )
        )
    return jobs


FAMILY = Family(module="gemm", tables=(A16W16,), make_jobs=make_jobs)


def run(argv: Sequence[str] | None = None) -> int:
    return main(__name__ if __name__ != "__main__" else "aiter.aot.flydsl.gemm", argv)


if __name__ == "__main__":
    sys.exit(run())
