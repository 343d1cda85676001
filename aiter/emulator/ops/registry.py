"""The table from mnemonic to semantics, and the context every semantic function receives.

A semantic function declares the modifiers it implements; any other modifier on the
instruction stops the run, so no modifier is ever silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aiter.emulator.codeobject import Kernel
from aiter.emulator.decode import Instruction
from aiter.emulator.memory import Memory
from aiter.emulator.races import GlobalWrites
from aiter.emulator.state import Wave, WorkGroup


@dataclass
class Ctx:
    """What an instruction may touch besides its own wave."""

    kernel: Kernel
    memory: Memory
    group: WorkGroup
    counts: dict[str, int] = field(default_factory=dict)  # bytes moved by class
    global_writes: GlobalWrites | None = None  # plain global stores, for the race check


Semantics = Callable[[Ctx, Wave, Instruction], None]


@dataclass(frozen=True)
class Op:
    fn: Semantics
    modifiers: frozenset[str]


OPS: dict[str, Op] = {}
_SUFFIXES = ("_e32", "_e64", "_vop3")


def op(*names: str, mods: tuple[str, ...] = ()) -> Callable[[Semantics], Semantics]:
    """Register `fn` as the semantics of every mnemonic in `names`."""

    def register(fn: Semantics) -> Semantics:
        for name in names:
            if name in OPS:
                raise ValueError(f"{name}: registered twice")
            OPS[name] = Op(fn, frozenset(mods))
        return fn

    return register


def lookup(mnemonic: str) -> Op | None:
    """The semantics of a mnemonic; encoding suffixes (_e32, _e64) name the same operation."""
    found = OPS.get(mnemonic)
    if found is None:
        for suffix in _SUFFIXES:
            if mnemonic.endswith(suffix):
                return OPS.get(mnemonic[: -len(suffix)])
    return found
