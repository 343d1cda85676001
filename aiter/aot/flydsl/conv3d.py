"""AOT replay of the conv3d table: each row becomes calls of `aiter.conv3d` with FakeTensors in
every input/output layout pair, over the frame counts the row serves (exactly or by lending its
tile to calls within 4x its output positions), as the runtime's own lookup decides.

Run `python -m aiter.aot.flydsl.conv3d [--list | --check]` (or `python -m aiter.aot.flydsl`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiter.aot.flydsl.jobs.axes import Along, along_dims
from aiter.aot.flydsl.jobs.family import Call, CapturedOp, Family
from aiter.aot.flydsl.jobs.fixed_inputs import FixedInputs
from aiter.ops.conv3d.table import CONV3D
from aiter.tuning import Row, TableSpec


def caller(spec: TableSpec, row: Row, variant: Mapping[str, str]) -> Call:
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
    fixed = FixedInputs()  # the layer's weight and bias, kept across calls

    def call(frames: int) -> None:
        import torch

        dtype = getattr(torch, variant["dtype"])  # one of the entry's input dtypes
        shape = (n, c, frames, h, w) if input_layout == "NCDHW" else (n, frames, h, w, c)
        conv3d(
            torch.empty(shape, dtype=dtype, device="cuda"),
            fixed.empty("weight", (k, c // groups, *kernel), dtype),
            fixed.empty("bias", (k,), dtype) if with_bias else None,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            input_layout=input_layout,
            output_layout=output_layout,
        )

    return call


def serving(spec: TableSpec, rows: Sequence[Row], frames: int) -> Row | None:
    """The row of a layer's shape the runtime's lookup serves `frames` with: its own, or one whose
    output positions lie within BORROW_RATIO (None: the heuristic, or a row of another shape of
    the layer, serves; or too few frames for the kernel, no output).

    Bisection finds these runs exactly: the lookup sees the frames only through the exact shape
    (a tabled D, which is probed) and the output positions, which never decrease with the frames;
    so the frames a row lends its tile to are one run around its own D, broken only at other
    rows' own D."""
    from aiter.ops.conv3d.plan import find_row, row_geometry

    row = rows[0]
    try:
        call = dataclasses.replace(row_geometry(row), d=frames)
    except ValueError:  # too few frames for the kernel: no output
        return None
    has_bias = row["bias"].strip().lower() in ("1", "true", "1.0")
    served = find_row(call, has_bias, row["gfx"], row.int("cu_num"))[0]
    return served if served in rows else None


# Only the frame counts a row serves are replayed, the heuristic's are not; bisection alone finds
# every change of the kernels over them. A row serves all its calls with one kernel choice
# (plan.row_choice: its tile and split-K, never the call's size); the frames are runtime int32 in
# every conv3d kernel (launch_conv3d), so no key depends on them; and what else changes along the
# frames are limits (cannot_serve, pretranspose_supported: sizes growing with the frames) that a
# call crosses once. So the kernels of a job are a function of the frames that never returns to a
# value it left, which bisection finds exactly.


def frames_along(arguments: Mapping[str, Any]) -> Along | None:
    """The frames are the input's D, the dimension its layout places it at."""
    return along_dims(
        arguments, "frames", {"x": 1 if arguments.get("input_layout") == "NDHWC" else 2}
    )


CAPTURED = {"conv3d": CapturedOp("aiter.ops.conv3d.entry:conv3d", frames_along)}
FAMILY = Family(
    captured=CAPTURED,
    name="conv3d",
    tables=(CONV3D,),
    caller=caller,
    serving=serving,
    replay_unserved=False,
)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.conv3d"], argv)


if __name__ == "__main__":
    sys.exit(run())
