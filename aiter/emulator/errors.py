"""Errors the emulator raises: each names the kernel, the pc and the thing that went wrong.

A run stops at the first of them; nothing is guessed past an instruction it cannot execute.
"""

from __future__ import annotations


class EmulatorError(RuntimeError):
    """Base of every error the emulator raises."""


class CodeObjectError(EmulatorError):
    """The code object is not an AMDGPU HSACO the loader understands."""


class DecodeError(EmulatorError):
    """A disassembly line could not be parsed into an instruction."""


class DisassemblerNotFound(EmulatorError):
    """No installed llvm-objdump knows the code object's arch."""


class UnsupportedInstruction(EmulatorError):
    """An instruction (or a form of it) that the emulator does not implement."""

    def __init__(self, mnemonic: str, kernel: str, pc: int, detail: str = "") -> None:
        self.mnemonic, self.kernel, self.pc = mnemonic, kernel, pc
        extra = f": {detail}" if detail else ""
        super().__init__(
            f"{kernel} pc {pc:#x}: {mnemonic} is not implemented by aiter.emulator{extra}"
        )


class MemoryFault(EmulatorError):
    """An access outside every registered memory region, or outside the work-group's LDS."""


class ExecutionLimit(EmulatorError):
    """A wave ran more instructions than the launch allows (a hang or a runaway loop)."""


class Deadlock(EmulatorError):
    """Waves of a work-group wait at barriers that can never all be reached."""


class MissingWait(EmulatorError):
    """A register was read or overwritten while a load into it was still in flight."""
