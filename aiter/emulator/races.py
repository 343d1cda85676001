"""Data-race detection that does not depend on the schedule: LDS bytes touched by two waves of
a work-group within one barrier epoch (at least one access a write), and global bytes written
non-atomically by two work-groups of one launch.

A work-group's barrier epoch counts the s_barrier releases so far; two accesses in the same
epoch have no barrier between them, whatever order the scheduler happened to run them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aiter.emulator.errors import EmulatorError

MAX_REPORTS = 32  # per launch: one bug tends to race on every byte it touches


class DataRace(EmulatorError):
    """Two unordered accesses to one byte, at least one a plain write."""


@dataclass(frozen=True)
class Race:
    kind: str  # "lds" or "global"
    kernel: str
    address: int
    first: tuple  # (work-group, wave, pc, "read"/"write") of the earlier access
    second: tuple  # the same for the later access

    def __str__(self) -> str:
        def side(a: tuple) -> str:
            group, wave, pc, how = a
            where = f"wave {wave} " if wave is not None else ""
            return f"work-group {group} {where}pc {pc:#x} ({how})"

        space = "LDS byte" if self.kind == "lds" else "global byte"
        order = "no s_barrier between them" if self.kind == "lds" else "in one launch"
        return (
            f"{self.kernel}: data race on {space} {self.address:#x}: {side(self.first)} and "
            f"{side(self.second)}, {order}"
        )


@dataclass
class RaceLog:
    """Where races go: raised at the first one, or collected (up to MAX_REPORTS)."""

    kernel: str
    raise_on_race: bool
    races: list[Race] = field(default_factory=list)
    _seen: set = field(default_factory=set)

    def report(self, race: Race) -> None:
        if self.raise_on_race:
            raise DataRace(str(race))
        key = (race.kind, race.first[2], race.second[2])
        if key not in self._seen and len(self.races) < MAX_REPORTS:
            self._seen.add(key)
            self.races.append(race)


class LdsTracker:
    """Per LDS byte of one work-group: the last writer (wave, pc, epoch) and, per wave, the
    epoch and pc of its last read."""

    def __init__(self, size: int, group: tuple, log: RaceLog) -> None:
        self.group, self.log = group, log
        self.writer = np.full(size, -1, np.int16)
        self.write_pc = np.zeros(size, np.int64)
        self.write_epoch = np.full(size, -1, np.int32)
        self.read_epoch: dict[int, np.ndarray] = {}
        self.read_pc: dict[int, np.ndarray] = {}

    def access(self, byte_addresses: np.ndarray, wave: int, pc: int, epoch: int, write: bool):
        addr = np.asarray(byte_addresses, np.int64).reshape(-1)
        if addr.size == 0:
            return
        clash = (self.write_epoch[addr] == epoch) & (self.writer[addr] != wave)
        clash &= self.writer[addr] >= 0
        if clash.any():
            k = int(np.argmax(clash))
            a = int(addr[k])
            first = (self.group, int(self.writer[a]), int(self.write_pc[a]), "write")
            self._report(a, first, wave, pc, write)
        if write:
            for other, epochs in self.read_epoch.items():
                if other == wave:
                    continue
                hit = epochs[addr] == epoch
                if hit.any():
                    a = int(addr[int(np.argmax(hit))])
                    first = (self.group, other, int(self.read_pc[other][a]), "read")
                    self._report(a, first, wave, pc, write)
            self.writer[addr] = wave
            self.write_pc[addr] = pc
            self.write_epoch[addr] = epoch
        else:
            if wave not in self.read_epoch:
                self.read_epoch[wave] = np.full(self.writer.size, -1, np.int32)
                self.read_pc[wave] = np.zeros(self.writer.size, np.int64)
            self.read_epoch[wave][addr] = epoch
            self.read_pc[wave][addr] = pc

    def _report(self, address: int, first: tuple, wave: int, pc: int, write: bool) -> None:
        second = (self.group, wave, pc, "write" if write else "read")
        self.log.report(Race("lds", self.log.kernel, address, first, second))


class GlobalWrites:
    """Bytes each work-group of a launch wrote with plain (non-atomic) stores."""

    def __init__(self) -> None:
        self._current: list[tuple[np.ndarray, int]] = []
        self._groups: list[tuple[tuple, np.ndarray, np.ndarray]] = []

    def store(self, addresses: np.ndarray, nbytes: int, pc: int) -> None:
        """A store of `nbytes` at each address (uint64)."""
        if addresses.size:
            spans = addresses[:, None] + np.arange(nbytes, dtype=np.uint64)[None, :]
            self._current.append((spans.reshape(-1), pc))

    def end_group(self, group: tuple) -> None:
        if self._current:
            addr = np.concatenate([a for a, _ in self._current])
            pcs = np.concatenate([np.full(a.size, pc, np.int64) for a, pc in self._current])
            uniq, first = np.unique(addr, return_index=True)
            self._groups.append((group, uniq, pcs[first]))
        self._current = []

    def check(self, log: RaceLog) -> None:
        """Report bytes that more than one work-group wrote."""
        if len(self._groups) < 2:
            return
        addr = np.concatenate([u for _, u, _ in self._groups])
        owner = np.concatenate([np.full(u.size, n) for n, (_, u, _) in enumerate(self._groups)])
        pcs = np.concatenate([p for _, _, p in self._groups])
        order = np.argsort(addr, kind="stable")
        addr, owner, pcs = addr[order], owner[order], pcs[order]
        dup = np.flatnonzero(addr[1:] == addr[:-1])
        for k in dup[:MAX_REPORTS]:
            a, b = int(owner[k]), int(owner[k + 1])
            first = (self._groups[a][0], None, int(pcs[k]), "write")
            second = (self._groups[b][0], None, int(pcs[k + 1]), "write")
            log.report(Race("global", log.kernel, int(addr[k]), first, second))
