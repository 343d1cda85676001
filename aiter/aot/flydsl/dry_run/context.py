"""The context that makes a CPU-only process look like one GPU of a target arch.

Every stand-in lives in `dry_run`; anything that still reaches a real GPU runtime raises
GpuRuntimeReached, which always fails the build.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from aiter import device
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run.fake_mode import process_mode

_process_arch: str | None = None  # FlyDSL freezes its target per process at first use


class GpuRuntimeReached(RuntimeError):
    """Host code reached a real GPU runtime inside a dry run."""


@dataclass(frozen=True)
class SimulatedStream:
    """The launch stream kernels get in a dry run (FlyDSL reads `cuda_stream`)."""

    cuda_stream: int = 0


# torch.cuda calls that would need a real GPU. Runtime code asks aiter.device instead.
GUARDED_TORCH_CUDA = (
    "current_stream",
    "default_stream",
    "synchronize",
    "get_device_properties",
    "current_device",
    "set_device",
    "device_count",
    "mem_get_info",
)


def _raise_reached(what: str):
    def guard(*args: Any, **kwargs: Any):
        raise GpuRuntimeReached(
            f"{what} was called inside an AOT dry run: host code must ask aiter.device, "
            "and kernels must only compile (bridge.target_env)"
        )

    return guard


def _fake_getitem(original):
    """Tensor indexing whose Python binding takes a CUDA device guard; fakes need none."""

    def getitem(self, index):
        if not isinstance(self, FakeTensor):
            return original(self, index)
        items = index if isinstance(index, tuple) else (index,)
        out, dim = self, 0
        for item in items:
            if isinstance(item, bool):
                raise TypeError("indexing a fake tensor with a bool is not supported in a dry run")
            if isinstance(item, int):
                out = torch.ops.aten.select.int(out, dim, item)
            elif isinstance(item, slice):
                start, stop, step = item.start or 0, item.stop, item.step or 1
                stop = out.shape[dim] if stop is None else stop
                out = torch.ops.aten.slice.Tensor(out, dim, start, stop, step)
                dim += 1
            elif item is None:
                out = out.unsqueeze(dim)
                dim += 1
            else:
                raise TypeError(
                    f"indexing a fake tensor with {type(item).__name__} is not supported in a "
                    "dry run; index with ints, slices and None"
                )
        return out

    return getitem


def _fake_copy(original):
    def copy_(self, src, non_blocking=False):
        if isinstance(self, FakeTensor):
            return torch.ops.aten.copy_.default(self, src, non_blocking)
        return original(self, src, non_blocking)

    return copy_


def _fake_contiguous(original):
    def contiguous(self, memory_format=torch.contiguous_format):
        if not isinstance(self, FakeTensor):
            return original(self, memory_format=memory_format)
        if self.is_contiguous(memory_format=memory_format):
            return self
        return torch.ops.aten.clone.default(self, memory_format=memory_format)

    return contiguous


def host_tensor(
    values: list[int], dtype: torch.dtype, shape: Sequence[int] | None = None
) -> torch.Tensor:
    """A real CPU tensor of `values` (row-major, as `shape` when given), also inside a dry run:
    for an argument whose values the host code reads (a varlen batch's cu_seqlens), where a
    FakeTensor has none."""
    with unset_fake_temporarily():
        t = torch.tensor(values, dtype=dtype)
        return t.reshape(shape) if shape is not None else t


def _patch(stack: ExitStack, owner: Any, name: str, replacement: Any) -> None:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    stack.callback(setattr, owner, name, original)


def _set_env(stack: ExitStack, values: dict[str, str]) -> None:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)

    def restore() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    stack.callback(restore)


@contextmanager
def dry_run(arch: str, cu_num: int, mode: str) -> Iterator[list[bridge.KernelRequest]]:
    """Run host code as on a `cu_num`-CU GPU of `arch`; yields the kernels it launches.

    mode is bridge.MODE_NAME (name kernels, compile nothing) or bridge.MODE_COMPILE.
    Tensors made inside are FakeTensors on cuda:0. One arch per process: FlyDSL freezes its
    target at the first compile, so a process must not replay two archs.
    """
    global _process_arch
    frozen = _process_arch or os.environ.get(bridge.ENV_GPU_ARCH)
    if frozen and frozen != arch:
        raise ValueError(
            f"this process was started for {frozen} and cannot replay {arch}: "
            "run one process per arch"
        )
    _process_arch = arch
    stream = SimulatedStream()
    bridge.register_stream_type(SimulatedStream)
    with ExitStack() as stack:
        _set_env(stack, bridge.target_env(arch))
        stack.enter_context(device.simulate(arch, cu_num, stream))
        for name in GUARDED_TORCH_CUDA:
            _patch(stack, torch.cuda, name, _raise_reached(f"torch.cuda.{name}"))
        stack.enter_context(bridge.guard_kernel_execution(_raise_reached("a FlyDSL kernel launch")))
        _patch(stack, torch.Tensor, "__getitem__", _fake_getitem(torch.Tensor.__getitem__))
        _patch(stack, torch.Tensor, "copy_", _fake_copy(torch.Tensor.copy_))
        _patch(stack, torch.Tensor, "contiguous", _fake_contiguous(torch.Tensor.contiguous))
        stack.enter_context(process_mode())
        requests = stack.enter_context(bridge.record_launches(mode))
        yield requests
