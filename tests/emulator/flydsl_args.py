"""Kernel arguments of FlyDSL kernels for emulated launches: torch tensors placed in an emulator
Memory, passed as FlyDSL passes a layout-dynamic tensor (pointer, then shapes and strides).
"""

from __future__ import annotations

import struct

import torch

from aiter.emulator import Memory


def place(memory: Memory, t: torch.Tensor, name: str) -> int:
    """Register a contiguous CPU tensor's bytes (writes land in the tensor); its address."""
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")
    return memory.add(t.view(torch.uint8).numpy(), name)


def tensor_args(memory: Memory, t: torch.Tensor, name: str) -> list:
    """[pointer, layout bytes]: FlyDSL packs a layout-dynamic tensor's shapes as int32 then its
    strides but the unit one as int64 (flydsl/compiler/jit_argument.py, _LayoutPlan)."""
    layout = struct.pack("<" + "i" * t.dim() + "q" * (t.dim() - 1), *t.shape, *t.stride()[:-1])
    return [place(memory, t, name), layout]
