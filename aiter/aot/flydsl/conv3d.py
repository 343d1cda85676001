"""AOT replay of the conv3d table: each row becomes calls of `aiter.conv3d` with FakeTensors in
every input/output layout pair, over the frame counts the row serves (exactly or by lending its
tile to calls within 4x its output positions), as the runtime's own lookup decides.

Run `python -m aiter.aot.flydsl.conv3d [--list | --check]` (or `python -m aiter.aot.flydsl`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence

from aiter.aot.flydsl.jobs import Call, Family, Job
from aiter.aot.flydsl.protocol import JobInfo
from aiter.ops.conv3d.table import BORROW_RATIO, CONV3D
from aiter.tuning import Row
from aiter.tuning.spec import describe_variant

DTYPE = "bfloat16"  # the table is bf16's


def caller(row: Row, variant: Mapping[str, str]) -> Call:
    """conv3d as a caller of this row's layer calls it, at a given frame count."""
    from aiter.ops.conv3d.entry import conv3d

    n, c, h, w, k = (row.int(name) for name in ("N", "C", "H", "W", "K"))
    kernel = tuple(row.int(name) for name in ("kT", "kH", "kW"))
    groups = row.int("groups")
    stride = tuple(row.int(f"stride_{a}") for a in "dhw")
    padding = tuple(row.int(f"pad_{a}") for a in "dhw")
    dilation = tuple(row.int(f"dil_{a}") for a in "dhw")
    with_bias = row["bias"].strip().lower() in ("1", "true", "1.0")
    input_layout, output_layout = variant["input_layout"], variant["output_layout"]

    def call(frames: int) -> None:
        import torch

        dtype = getattr(torch, DTYPE)
        shape = (n, c, frames, h, w) if input_layout == "NCDHW" else (n, frames, h, w, c)
        conv3d(
            torch.empty(shape, dtype=dtype, device="cuda"),
            torch.empty((k, c // groups, *kernel), dtype=dtype, device="cuda"),
            torch.empty((k,), dtype=dtype, device="cuda") if with_bias else None,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            input_layout=input_layout,
            output_layout=output_layout,
        )

    return call


def served_frames(row: Row, top: int) -> list[tuple[int, int]]:
    """The runs of frame counts (up to `top`) whose calls the runtime's lookup serves with `row`:
    its own, and those whose output positions lie within BORROW_RATIO of its own."""
    from aiter.ops.conv3d.plan import find_row, row_geometry

    geometry = row_geometry(row)
    has_bias = row["bias"].strip().lower() in ("1", "true", "1.0")
    arch, cu_num = row["gfx"], row.int("cu_num")
    runs: list[tuple[int, int]] = []
    frames = 1
    while frames <= top:
        try:
            call = dataclasses.replace(geometry, d=frames)
        except ValueError:  # too few frames for the kernel: no output
            frames += 1
            continue
        if call.positions > BORROW_RATIO * geometry.positions:
            break
        if find_row(call, has_bias, arch, cu_num)[0] == row:
            if runs and runs[-1][1] == frames - 1:
                runs[-1] = (runs[-1][0], frames)
            else:
                runs.append((frames, frames))
        frames += 1
    return runs


def make_jobs(
    family: Family, arch: str, cu_nums: frozenset[int] | None, maxima: Mapping[str, int]
) -> list[Job]:
    table = CONV3D.load()
    top = maxima.get(CONV3D.axis.name, CONV3D.axis.default_max)
    jobs = []
    for row in table.rows:
        if row["gfx"] != arch or (cu_nums is not None and row.int("cu_num") not in cu_nums):
            continue
        tabled = row.int("D")
        for lo, hi in served_frames(row, top):
            for variant in CONV3D.variants():
                info = JobInfo(
                    module=family.module,
                    table=CONV3D.name,
                    row=f"{row.source}:{row.line}",
                    arch=arch,
                    cu_num=row.int("cu_num"),
                    variant=describe_variant(variant),
                    axis=CONV3D.axis.name,
                    lo=lo,
                    hi=hi,
                    tabled=tabled if lo <= tabled <= hi else None,
                )
                jobs.append(Job(info, caller(row, variant)))
    return jobs


FAMILY = Family(module="conv3d", tables=(CONV3D,), make_jobs=make_jobs)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.conv3d"], argv)


if __name__ == "__main__":
    sys.exit(run())
