"""Instruction semantics, one module per class; importing the package fills the table.

`lookup(mnemonic)` returns the semantics of a mnemonic, or None when it is not implemented.
"""

from aiter.emulator.ops import flow, lds, mfma, scalar, smem, vector, vmem  # noqa: F401
from aiter.emulator.ops.registry import OPS, Ctx, Op, lookup, op

__all__ = ["OPS", "Ctx", "Op", "lookup", "op"]
