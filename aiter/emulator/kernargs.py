"""Lays out a kernel's argument segment from its metadata (.args offsets and sizes): from values
the caller holds (`pack_kernargs`), or as the HIP runtime does for a launch (`launch_kernargs`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from aiter.emulator.codeobject import Kernel, KernelArg


def pack_kernargs(kernel: Kernel, values: Sequence[int | float | bytes]) -> bytes:
    """One value per metadata argument, in order: an int fills the argument's size
    (little-endian, two's complement), a float a 4-byte f32, bytes are copied (zero-padded)."""
    if len(values) != len(kernel.args):
        raise ValueError(
            f"{kernel.name}: expected {len(kernel.args)} argument values (one per .args entry: "
            f"{[(a.offset, a.size, a.value_kind) for a in kernel.args]}), got {len(values)}"
        )
    size = max((a.offset + a.size for a in kernel.args), default=0)
    out = bytearray(max(size, kernel.kernarg_segment_size))
    for arg, value in zip(kernel.args, values, strict=True):
        if isinstance(value, bytes):
            if len(value) > arg.size:
                raise ValueError(
                    f"{kernel.name}: argument at offset {arg.offset} takes {arg.size} bytes, "
                    f"got {len(value)}"
                )
            raw = value.ljust(arg.size, b"\0")
        elif isinstance(value, float):
            raw = struct.pack("<f", value).ljust(arg.size, b"\0")
        else:
            raw = (value & ((1 << (8 * arg.size)) - 1)).to_bytes(arg.size, "little")
        out[arg.offset : arg.offset + arg.size] = raw
    return bytes(out)


def _hidden_value(kind: str, grid: tuple, block: tuple, dynamic_lds: int) -> int:
    """The value the HIP runtime gives a hidden kernel argument (AMDGPUUsage, "Code Object V5
    Metadata", hidden arguments); pointers to runtime services are null here."""
    axis = {"x": 0, "y": 1, "z": 2}
    if kind.startswith("hidden_block_count_"):
        return grid[axis[kind[-1]]]
    if kind.startswith("hidden_group_size_"):
        return block[axis[kind[-1]]]
    if kind == "hidden_grid_dims":
        return 3 if grid[2] > 1 or block[2] > 1 else 2 if grid[1] > 1 or block[1] > 1 else 1
    if kind == "hidden_dynamic_lds_size":
        return dynamic_lds
    # hidden_remainder_* (grids are whole work-groups), hidden_global_offset_*, and the queue,
    # printf, hostcall and heap pointers, which nothing emulated provides.
    return 0


def launch_kernargs(
    kernel: Kernel,
    explicit: Callable[[int, KernelArg], bytes],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    dynamic_lds: int,
) -> bytes:
    """The kernarg segment of one launch as the HIP runtime builds it: explicit argument i is
    `explicit(i, arg)` (arg.size bytes), hidden ones are filled as HIP fills them; offsets and
    sizes from the code object's metadata."""
    out = bytearray(max(kernel.kernarg_segment_size, 8))
    index = 0
    for arg in kernel.args:
        end = arg.offset + arg.size
        if end > len(out):
            out.extend(bytes(end - len(out)))
        if arg.value_kind.startswith("hidden_"):
            value = _hidden_value(arg.value_kind, grid, block, dynamic_lds)
            raw = (value & ((1 << (8 * arg.size)) - 1)).to_bytes(arg.size, "little")
        else:
            raw = explicit(index, arg)
            index += 1
        out[arg.offset : end] = raw
    return bytes(out)
