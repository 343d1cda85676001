"""Instruction semantics, one module per class; importing the package fills the table.

`lookup(mnemonic)` returns the semantics of a mnemonic, or None when it is not implemented.
"""

from aiter.emulator.ops import (  # noqa: F401
    atomic,
    convert,
    crosslane,
    division,
    flow,
    gfx12,
    lds,
    mfma,
    scalar,
    smem,
    vector,
    vmem,
    wmma,
)
from aiter.emulator.ops.registry import OPS, Ctx, Op, lookup, op
from aiter.emulator.ops.sdwa import register_sdwa

register_sdwa()  # after every module that defines lane-wise operations

__all__ = ["OPS", "Ctx", "Op", "lookup", "op"]
