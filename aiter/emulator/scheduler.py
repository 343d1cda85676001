"""Runs the waves of one work-group to completion, interleaving them one instruction at a time
in an order drawn from a seeded random.Random. A barrier (s_barrier, or gfx12's
s_barrier_signal then s_barrier_wait) holds a waiting wave until every live wave of the group
has signaled; ended waves no longer count toward it.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np

from aiter.emulator.decode import Program
from aiter.emulator.errors import EmulatorError, ExecutionLimit, UnsupportedInstruction
from aiter.emulator.ops import Ctx, Op, lookup
from aiter.emulator.state import Wave


class Executor:
    """Steps waves through one kernel's program; resolves each address's semantics once."""

    def __init__(self, program: Program, kernel_name: str, start: int, end: int) -> None:
        self.program = program
        self.kernel_name = kernel_name
        self.start, self.end = start, end
        self._bound: dict[int, tuple] = {}
        self.issued: Counter[int] = Counter()  # instructions issued per address

    def _bind(self, pc: int) -> tuple:
        if not self.start <= pc < self.end or pc not in self.program.by_address:
            raise EmulatorError(
                f"{self.kernel_name}: pc {pc:#x} is not the start of an instruction of the "
                f"kernel (code at {self.start:#x}..{self.end:#x})"
            )
        inst = self.program.at(pc)
        found: Op | None = lookup(inst.mnemonic)
        if found is None:
            raise UnsupportedInstruction(inst.mnemonic, self.kernel_name, pc)
        extra = sorted(set(inst.modifiers) - found.modifiers)
        if extra:
            raise UnsupportedInstruction(
                inst.mnemonic, self.kernel_name, pc, f"modifier {', '.join(extra)}"
            )
        bound = (inst, found.fn)
        self._bound[pc] = bound
        return bound

    def step(self, ctx: Ctx, wave: Wave) -> None:
        pc = wave.pc
        inst, fn = self._bound.get(pc) or self._bind(pc)
        wave.current = pc
        wave.pc = pc + inst.size
        self.issued[pc] += 1
        wave.issued += 1
        try:
            fn(ctx, wave, inst)
        except UnsupportedInstruction:
            raise
        except EmulatorError as err:
            raise type(err)(self._where(ctx, wave, pc, inst.text) + str(err)) from err
        except (ValueError, IndexError, KeyError, TypeError) as err:
            # An operand form the semantics do not handle: refuse rather than guess.
            raise UnsupportedInstruction(
                inst.mnemonic, self.kernel_name, pc, f"{inst.text}: {type(err).__name__}: {err}"
            ) from err

    def _where(self, ctx: Ctx, wave: Wave, pc: int, text: str) -> str:
        return (
            f"{self.kernel_name} work-group {ctx.group.id} wave {wave.index} pc {pc:#x} "
            f"({text}): "
        )


def run_workgroup(executor: Executor, ctx: Ctx, rng: random.Random, max_instructions: int) -> None:
    """Run every wave of ctx.group until each reaches s_endpgm."""
    live = [w for w in ctx.group.waves if not w.done]
    with np.errstate(all="ignore"):
        while live:
            if ctx.group.signaled and ctx.group.complete_phase(live):
                continue
            runnable = [w for w in live if not w.at_barrier]
            if not runnable:
                raise EmulatorError(
                    f"{executor.kernel_name} work-group {ctx.group.id}: every live wave waits "
                    "at a barrier some live wave has not signaled (a deadlock on hardware)"
                )
            wave = runnable[rng.randrange(len(runnable))] if len(runnable) > 1 else runnable[0]
            executor.step(ctx, wave)
            if wave.issued > max_instructions:
                raise ExecutionLimit(
                    f"{executor.kernel_name} work-group {ctx.group.id} wave {wave.index}: more "
                    f"than {max_instructions} instructions (pc {wave.pc:#x}); raise "
                    "max_instructions if the kernel really runs that long"
                )
            if wave.done:
                live.remove(wave)
