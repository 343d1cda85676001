"""Runs aiter's public entries on CPU tensors with every FlyDSL launch executed by aiter's AMDGPU
emulator: `emulated(arch)` answers aiter.device for that arch, and the HIP stand-in of
aiter.flydsl_bridge.hip_standin hands each launch here, where its arguments are laid out from the
code object's metadata and aiter.emulator runs it over the memory of the tensors it names.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiter.flydsl_bridge import hip_standin, run_only_from_env
from aiter.flydsl_bridge.hip_standin import EmulationUnavailable

__all__ = ["EmulatedLaunch", "EmulatedSession", "EmulationUnavailable", "emulated"]


@dataclass(frozen=True)
class EmulatedLaunch:
    """One kernel launch the emulator ran: its name, grid (work-groups), block, and what it did
    (an aiter.emulator.LaunchStats)."""

    kernel: str
    arch: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int
    stats: Any
    code_object: bytes = field(repr=False, default=b"")


@dataclass
class EmulatedSession:
    """What `emulated` yields: the target, and every launch it ran, in order."""

    arch: str
    cu_num: int
    seed: int
    races: str = "raise"
    launches: list[EmulatedLaunch] = field(default_factory=list)


def _explicit_reader(kernel, params, buffer: bytes | None):
    """Explicit argument i of a launch: from kernelParams (params[i] points at its value) or
    from the packed argument buffer at the argument's metadata offset."""

    def read(index: int, arg) -> bytes:
        if buffer is not None:
            if arg.offset + arg.size > len(buffer):
                raise EmulationUnavailable(
                    f"{kernel.name}: the launch's argument buffer has {len(buffer)} bytes, "
                    f"argument {index} ends at byte {arg.offset + arg.size}"
                )
            return buffer[arg.offset : arg.offset + arg.size]
        if not params or not params[index]:
            raise EmulationUnavailable(
                f"{kernel.name}: the launch passed no value for explicit argument {index} "
                f"(offset {arg.offset}, {arg.size} bytes)"
            )
        return ctypes.string_at(params[index], arg.size)

    return read


def pack_kernel_arguments(kernel, params, buffer, grid, block, dynamic_lds: int) -> bytes:
    """The kernarg segment of one launch made through the HIP stand-in."""
    from aiter import emulator

    read = _explicit_reader(kernel, params, buffer)
    return emulator.launch_kernargs(kernel, read, grid, block, dynamic_lds)


def _memory():
    """The emulator's memory for a launch: every tracked tensor's storage and every live block
    FlyDSL allocated, at their own addresses (the kernel's writes land in them)."""
    import numpy as np

    from aiter import emulator

    memory = emulator.Memory()
    for base, data in hip_standin.regions():
        memory.add(data, f"tensor@{base:#x}", base=base)
    for base, size in hip_standin.allocations():
        if memory.region_at(base) is None:
            view = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(base))
            memory.add(view, f"hipMalloc@{base:#x}", base)
    return memory


def _runner(session: EmulatedSession):
    def run(image: bytes, name: str, grid, block, dynamic_lds: int, params, buffer) -> None:
        from aiter import emulator

        code = emulator.load_code_object(image)
        if code.arch != session.arch:
            raise EmulationUnavailable(
                f"{name}: the code object FlyDSL launched is for {code.arch}, the process "
                f"emulates {session.arch} (a cache entry of the wrong arch under this key?)"
            )
        kernel = code.kernel(name)
        kernarg = pack_kernel_arguments(kernel, params, buffer, grid, block, dynamic_lds)
        stats = emulator.launch(
            image,
            name,
            grid,
            block,
            kernarg,
            _memory(),
            dynamic_lds=dynamic_lds,
            seed=session.seed,
            races=session.races,
        )
        launch = EmulatedLaunch(name, code.arch, grid, block, dynamic_lds, stats, image)
        session.launches.append(launch)

    return run


def _configure_linker() -> None:
    """Kernels not in the cache compile here: point FlyDSL at an AMDGPU linker. A run-only
    process never links, so it needs none."""
    if run_only_from_env():
        return
    from aiter.toolchain import configure_linker

    configure_linker()


@contextmanager
def emulated(
    arch: str, cu_num: int | None = None, seed: int = 0, races: str = "raise"
) -> Iterator[EmulatedSession]:
    """Run aiter's public entries on CPU tensors as on a `cu_num`-CU GPU of `arch` (default: the
    arch's default CU count), every FlyDSL kernel executed by aiter's emulator.

    Kernels are chosen exactly as on that GPU: the same tables, plans and FlyDSL cache keys; a
    kernel in FlyDSL's cache is loaded from it (so FLYDSL_RUNTIME_RUN_ONLY=1 runs the shipped
    entry), any other is compiled. `seed` orders work-groups and waves in the emulator; `races`
    is the emulator's race policy ("raise", "collect" or "off"). One arch per process. An
    instruction the emulator does not implement raises aiter.emulator.UnsupportedInstruction
    naming it.
    """
    from aiter import device
    from aiter.arch import get_arch

    info = get_arch(arch)
    cus = info.default_cu_num if cu_num is None else int(cu_num)
    if cus < 1:
        raise ValueError(f"cu_num must be a positive CU count, got {cu_num!r}")
    if races not in ("raise", "collect", "off"):
        raise ValueError(f"races must be 'raise', 'collect' or 'off', got {races!r}")
    session = EmulatedSession(info.name, cus, seed, races)
    with hip_standin.installed(info.name, _runner(session)) as stream:
        _configure_linker()
        with device.simulate(info.name, cus, stream, cpu_tensors=True):
            yield session
