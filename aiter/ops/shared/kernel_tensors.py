"""How a launcher hands a tensor to a FlyDSL kernel, so the kernel's cache key depends on the
tensor's dtype, rank and alignment only, never on its sizes.

FlyDSL keys a tensor argument by the first axis whose stride is 1. A row-major tensor whose
trailing axes have size 1 has a unit stride earlier too (an lse of [H, 1] has strides (1, 1)),
and torch lets a size-1 axis carry any stride: so the same kernel would key differently when a
size that varies at serving happens to be 1, and a cache built for other sizes would miss.
`kernel_tensor` pins the unit-stride axis to the last one; the other strides are passed at run
time, so addressing is unchanged.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import torch
from flydsl.compiler.jit_argument import TorchTensorJitArg

from aiter.flydsl_bridge import hip_standin, startup

# Every kernel module of aiter imports this one before its first FlyDSL call: from then on a
# kernel's first call reads only the cache entry it needs (flydsl_bridge/startup.py).
startup.install()


def _canonical_strides(t: torch.Tensor) -> tuple[int, ...]:
    """t's strides with every size-1 axis given its row-major stride (never stepped, so free)."""
    if 1 not in t.shape:
        return t.stride()
    strides = list(t.stride())
    step = 1
    for axis in reversed(range(t.dim())):
        if t.shape[axis] == 1:
            strides[axis] = step
        step = strides[axis] * t.shape[axis] if t.shape[axis] > 1 else step
    return tuple(strides)


def kernel_tensor(t: torch.Tensor):
    """The FlyDSL argument for `t`, a tensor with a unit stride on its last axis (the launchers'
    checks require it): layout-dynamic with the last axis as its unit-stride axis, whatever the
    sizes."""
    if t.dim() == 0:
        raise ValueError("kernel_tensor: expected a tensor of at least one axis, got a scalar")
    strides = _canonical_strides(t)
    if strides[-1] != 1:
        raise ValueError(
            f"kernel_tensor: expected a unit stride on the last axis, got strides "
            f"{list(t.stride())} for shape {list(t.shape)}"
        )
    if strides != tuple(t.stride()):
        t = t.as_strided(t.shape, strides)
    if 1 in strides[:-1]:
        arg = flyc.from_torch_tensor(t).mark_layout_dynamic(leading_dim=t.dim() - 1)
    else:
        # The last axis is the only unit-stride one, which is the axis FlyDSL's default
        # layout-dynamic argument picks: the same key and memref, without building the layout
        # spec at every launch.
        arg = TorchTensorJitArg(t, dynamic_layout=True)
    if hip_standin.active:  # the emulator must find the tensor's memory when the kernel runs
        hip_standin.track(t, arg)
    return arg


def kernel_tensors(*tensors: torch.Tensor) -> tuple:
    """`kernel_tensor` of each tensor, in order."""
    return tuple(kernel_tensor(t) for t in tensors)
