"""Executes AMDGPU code objects (gfx942, gfx950; wave64) on the CPU, instruction by instruction,
so that the kernels FlyDSL compiled can be checked against torch without a GPU.

`launch(code_object, kernel_name, grid, block, kernarg, memory)` runs one kernel over a grid;
`Memory` holds the launch's buffers; `pack_kernargs` lays out arguments from the metadata.
"""

from aiter.emulator.codeobject import CodeObject, Kernel, KernelArg, load_code_object
from aiter.emulator.errors import (
    CodeObjectError,
    DecodeError,
    DisassemblerNotFound,
    EmulatorError,
    ExecutionLimit,
    MemoryFault,
    MissingWait,
    UnsupportedInstruction,
)
from aiter.emulator.kernargs import launch_kernargs, pack_kernargs
from aiter.emulator.launch import LaunchStats, launch
from aiter.emulator.memory import Memory
from aiter.emulator.races import DataRace, Race

__all__ = [
    "CodeObject",
    "CodeObjectError",
    "DataRace",
    "DecodeError",
    "DisassemblerNotFound",
    "EmulatorError",
    "ExecutionLimit",
    "Kernel",
    "KernelArg",
    "LaunchStats",
    "Memory",
    "MemoryFault",
    "MissingWait",
    "Race",
    "UnsupportedInstruction",
    "launch",
    "launch_kernargs",
    "load_code_object",
    "pack_kernargs",
]
