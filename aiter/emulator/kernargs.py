"""Lays out a kernel's argument segment from its metadata (.args offsets and sizes), for
callers that hold the argument values but not FlyDSL's host code.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from aiter.emulator.codeobject import Kernel


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
