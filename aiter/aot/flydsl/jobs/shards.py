"""`--shard I/N`: one arch's jobs split into N parts, the same on every machine and Python.

Every shard process builds the arch's whole job list (the same tables and code give the same
jobs) and keeps the part the split gives index I. The split works on units: a job, or every job
of one grid group (their audit names kernels for each other). Units are ordered by the sha256 of
a portable identity (module, table file name, row file name and line, arch, CU count, variant,
axis range: no absolute path, no `hash()`), heaviest first. Each goes to the shard it adds the
least work to among those it leaves within their fair part (the total over N), else to the
least loaded one; ties go to the lower index.

A unit's work is its job count, or with `--estimates MANIFEST` (an earlier build's manifest):
the compile seconds of the entries its jobs asked for there, plus NAMING_SECONDS per job. The
manifest also says which units share a kernel: on a shard that holds a kernel already it costs
nothing, so sharers gather on one shard while the balance allows, and a kernel the earlier
build knew is then compiled by one shard only. Kernels the manifest does not know (new rows, a
first build), and sharers the balance puts apart, are compiled by each shard that needs them;
`merge` keeps one copy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from aiter.aot.flydsl.jobs.records import JobInfo
from aiter.tuning.row import row_name

# CPU seconds of naming one job (about 3.5 probes of 3.5 ms each, measured on the default
# tables): what a unit weighs besides the compiles it causes.
NAMING_SECONDS = 0.012


@dataclass(frozen=True)
class Shard:
    index: int  # 0 <= index < count
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """ "I/N" with 0 <= I < N; ValueError saying what a shard looks like."""
    index, sep, count = text.partition("/")
    if sep and index.strip().isdigit() and count.strip().isdigit():
        shard = Shard(int(index), int(count))
        if shard.count >= 1 and shard.index < shard.count:
            return shard
    raise ValueError(f"--shard {text}: expected I/N with 0 <= I < N, e.g. 0/4")


def _where(info: JobInfo) -> list[object]:
    return [info.module, info.table, row_name(info.row), info.arch, info.cu_num, info.variant]


def unit_key(info: JobInfo) -> str:
    """The unit a job belongs to: its grid group (the row and variant), or the job itself."""
    if info.group:
        return json.dumps(["group", *_where(info)])
    fixed = sorted(info.fixed.items())
    return json.dumps(["job", *_where(info), info.axis, info.lo, info.hi, fixed])


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class CompileEstimates:
    """What an earlier build's manifest says each job asked for: entry -> compile seconds."""

    def __init__(self, manifest) -> None:
        self._asked: dict[tuple, list[tuple[int, int, str, float]]] = {}
        for arch, modules in manifest.archs.items():
            for kernels in modules.values():
                for rel, entry in kernels.items():
                    for r in entry.requested_by:
                        key = (arch, r.module, r.table, row_name(r.row), r.variant, r.axis,
                               tuple(sorted(r.fixed.items())))  # fmt: skip
                        self._asked.setdefault(key, []).append(
                            (r.lo, r.hi, rel, entry.compile_seconds)
                        )

    @classmethod
    def read(cls, path: str) -> CompileEstimates:
        """The estimates of the manifest at `path` (the file, or the cache directory holding
        it); ValueError naming the path when there is none to read."""
        from aiter.flydsl_bridge import manifest

        try:
            built = manifest.read_at(path)
        except ValueError as err:
            raise ValueError(f"--estimates {err}") from None
        if not built.archs:
            raise ValueError(f"--estimates {path}: the manifest lists no kernels")
        return cls(built)

    def kernels(self, info: JobInfo) -> dict[str, float]:
        """Entry (relative path) -> compile seconds, of what the job's range asked for."""
        key = (info.arch, info.module, info.table, row_name(info.row), info.variant,
               info.axis, tuple(sorted(info.fixed.items())))  # fmt: skip
        return {
            rel: seconds
            for lo, hi, rel, seconds in self._asked.get(key, ())
            if lo <= info.hi and hi >= info.lo
        }


def assign(
    infos: Sequence[JobInfo], count: int, estimates: CompileEstimates | None = None
) -> list[int]:
    """The shard (0..count-1) of each job."""
    units: dict[str, list[int]] = {}
    for index, info in enumerate(infos):
        units.setdefault(unit_key(info), []).append(index)
    per_job = NAMING_SECONDS if estimates is not None else 1.0
    naming = {key: len(members) * per_job for key, members in units.items()}
    kernels: dict[str, dict[str, float]] = {key: {} for key in units}
    if estimates is not None:
        for key, members in units.items():
            for index in members:
                kernels[key].update(estimates.kernels(infos[index]))
    order = sorted(units, key=_digest)
    # Heaviest first; a stable sort keeps equal weights in digest order.
    order.sort(key=lambda key: -(naming[key] + sum(kernels[key].values())))
    # Each shard's fair part of the work, every kernel counted once.
    distinct = {rel: s for asked in kernels.values() for rel, s in asked.items()}
    fair = (sum(naming.values()) + sum(distinct.values())) / count
    load = [0.0] * count
    held: list[set[str]] = [set() for _ in range(count)]
    shard_of = [0] * len(infos)
    for key in order:

        def added(shard: int, key: str = key) -> float:
            new = sum(s for rel, s in kernels[key].items() if rel not in held[shard])
            return naming[key] + new

        # The shard it adds least work to among those it leaves within their fair part (a
        # kernel shared with what a shard holds costs nothing there), else the least loaded.
        fitting = [s for s in range(count) if load[s] + added(s) <= fair * (1 + 1e-9)]
        if fitting:
            best = min(fitting, key=lambda s: (added(s), load[s], s))
        else:
            best = min(range(count), key=lambda s: (load[s] + added(s), s))
        load[best] += added(best)
        held[best].update(kernels[key])
        for index in units[key]:
            shard_of[index] = best
    return shard_of


def select(
    infos: Sequence[JobInfo], shard: Shard, estimates: CompileEstimates | None = None
) -> list[int]:
    """The indices of the jobs `shard` replays, in their order."""
    shard_of = assign(infos, shard.count, estimates)
    return [i for i, s in enumerate(shard_of) if s == shard.index]
