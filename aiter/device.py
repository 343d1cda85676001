"""The one seam between aiter's runtime and the GPU: current arch, CU count, stream, fp8 dtype.

The AOT dry run replaces the answers with those of a simulated device; nothing else asks torch.cuda.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from aiter.arch import ArchInfo, ArchTarget, get_arch


class NoGpuError(RuntimeError):
    """The runtime asked about the GPU and none is visible."""


@dataclass(frozen=True)
class DeviceFacts:
    arch: str
    cu_num: int
    stream: Any = None  # what kernels get as their launch stream
    cpu_tensors: bool = False  # CPU tensors stand for the device's (aiter.emulated)


_simulated: DeviceFacts | None = None


def on_gpu(t: torch.Tensor) -> bool:
    """`t.is_cuda` (a ROCm GPU's tensors are "cuda" too), read from the device itself: on the
    dry run's FakeTensors is_cuda costs a dispatch through the fake mode, device does not.
    Under aiter.emulated, where the emulator runs kernels on host memory, CPU tensors count."""
    kind = t.device.type
    if kind == "cuda":
        return True
    return kind == "cpu" and _simulated is not None and _simulated.cpu_tensors


@functools.cache
def _real_facts(index: int) -> tuple[str, int]:
    if not torch.cuda.is_available():
        raise NoGpuError(
            "no AMD GPU is visible to torch; run on a ROCm machine, or build kernels with the "
            "AOT builder (python -m aiter.aot.flydsl.gemm), which needs no GPU"
        )
    props = torch.cuda.get_device_properties(index)
    arch = getattr(props, "gcnArchName", "").split(":", 1)[0]
    if not arch:
        raise NoGpuError(f"GPU {index} ({props.name}) reports no gfx arch: is this a ROCm build?")
    return arch, props.multi_processor_count


def _facts() -> DeviceFacts:
    if _simulated is not None:
        return _simulated
    index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    arch, cu_num = _real_facts(index)
    return DeviceFacts(arch, cu_num, None)


def arch() -> str:
    """The current GPU's arch name, e.g. 'gfx942'."""
    return _facts().arch


def arch_info() -> ArchInfo:
    """The registry entry of the current GPU's arch."""
    return get_arch(_facts().arch)


def cu_num() -> int:
    """Compute units of the current GPU."""
    return _facts().cu_num


def fp8_dtype() -> torch.dtype:
    """The fp8 flavour of the current GPU (fnuz on gfx942, fn on gfx950 and gfx1250)."""
    return arch_info().fp8_dtype


def current_stream() -> Any:
    """The stream kernels launch on."""
    if _simulated is not None:
        return _simulated.stream
    if not torch.cuda.is_available():
        _real_facts(0)  # raises NoGpuError with the explanation
    return torch.cuda.current_stream()


def native_target() -> ArchTarget:
    """This machine's GPU as a build target (GPU_ARCHS=native)."""
    arch_name, cus = _real_facts(0)
    return ArchTarget(get_arch(arch_name).name, cus)


def is_simulated() -> bool:
    return _simulated is not None


@contextmanager
def simulate(
    arch_name: str, cu_num_value: int, stream: Any = None, *, cpu_tensors: bool = False
) -> Iterator[DeviceFacts]:
    """Answer every question of this module for a device that is not here (the AOT dry run);
    with cpu_tensors, CPU tensors are the device's (aiter.emulated runs kernels on them)."""
    global _simulated
    facts = DeviceFacts(get_arch(arch_name).name, int(cu_num_value), stream, cpu_tensors)
    previous, _simulated = _simulated, facts
    try:
        yield facts
    finally:
        _simulated = previous
