"""`--check --execute`: the cache's kernels run on aiter's emulator and checked against torch.

After the check, every distinct kernel the checked rows reach and the cache holds (or, with
`--sample N`, N of them per FlyDSL function, chosen by `--seed`) is run by its family's reacher
(aiter.verify): a small call of the public entry that launches that cache entry, in a child
process per arch. The child reads a copy of the cache made of hard links, so the kernels are
the ones the cache holds, loaded and never compiled anew (a target its call compiled fails),
while anything else the small call needs compiles into the copy, never into the cache.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.jobs.records import ArchReport, KernelRef, Tag
from aiter.flydsl_bridge.manifest import BOOKKEEPING_PATTERNS

# A whole default cache of one arch runs in minutes; this bounds a hung child.
TIMEOUT_SECONDS = 6 * 3600


def targets(report: ArchReport, sample: int, seed: int) -> list[dict]:
    """The kernels to execute: each distinct one the checked rows reach and the cache holds,
    with the rows that reach it; at most `sample` per function when sample > 0."""
    missing = {str(path) for path in report.missing()}
    chosen: dict[str, tuple[KernelRef, list[str]]] = {}
    for result in report.results:
        if result.tag != Tag.OK:
            continue
        for kernel in result.kernels():
            if str(kernel.path) in missing:
                continue
            entry = f"{Path(kernel.cache_dir).name}/{kernel.file}"
            chosen.setdefault(entry, (kernel, []))[1].append(result.job.row)
    from aiter.verify.reachers import parse_params

    out = [
        {"entry": entry, "function": k.function, "params": parse_params(k.params), "rows": rows}
        for entry, (k, rows) in sorted(chosen.items())
    ]
    if sample:
        rng = random.Random(seed)
        by_function: dict[str, list[dict]] = {}
        for target in out:
            by_function.setdefault(target["function"], []).append(target)
        out = [
            t for group in by_function.values() for t in rng.sample(group, min(sample, len(group)))
        ]
    return out


def _linked_copy(cache_dir: str, into: Path) -> None:
    """The cache's entries hard-linked under `into` (copied where links cannot cross devices)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    # FlyDSL replaces an entry with os.replace, never in place, so a link is never written
    # through; the lock files and aiter's manifest are the cache's own, not the child's.
    ignore = shutil.ignore_patterns(*BOOKKEEPING_PATTERNS)
    shutil.copytree(cache_dir, into, copy_function=link, ignore=ignore)


def execute(report: ArchReport, cache_dir: str, sample: int, seed: int) -> list[dict]:
    """Run the report's targets on the emulator in a child process; their records."""
    chosen = targets(report, sample, seed)
    if not chosen:
        return []
    with tempfile.TemporaryDirectory(prefix=f"aiter-execute-{report.arch}-") as scratch:
        work = Path(scratch)
        cache = work / "cache"
        _linked_copy(cache_dir, cache)
        (work / "targets.json").write_text(json.dumps(chosen))
        env = dict(os.environ)
        env.pop(bridge.ENV_RUN_ONLY, None)
        env[bridge.ENV_CACHE_DIR] = str(cache)
        command = [sys.executable, "-m", "aiter.verify.execute", report.arch,
                   str(work / "targets.json"), str(work / "records.json"), "--require-hit"]  # fmt: skip
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS
        )
        records_file = work / "records.json"
        if not records_file.exists():
            tail = done.stderr.strip().splitlines()[-5:]
            raise RuntimeError(f"--execute {report.arch}: the emulator run ended with exit "
                               f"{done.returncode} and no records:\n" + "\n".join(tail))  # fmt: skip
        return json.loads(records_file.read_text())


def summary(arch: str, records: list[dict]) -> tuple[list[str], bool]:
    """Lines on an arch's executed kernels (every failed or unreachable one named with its
    rows, kernel and first differing element) and whether any failed."""
    from aiter.verify.execute import describe, failed

    bad = [r for r in records if failed(r)]
    unreachable = [r for r in records if r.get("unreachable")]
    passed = len(records) - len(bad) - len(unreachable)
    seconds = sum(r["seconds"] for r in records)
    lines = [
        f"execute {arch}: {len(records)} kernels run on the emulator in {seconds:.0f} s: "
        f"{passed} match torch, {len(bad)} FAILED, {len(unreachable)} unreachable"
    ]
    lines += [f"  FAILED {describe(r)}" for r in bad]
    lines += [f"  {describe(r)}" for r in unreachable]
    return lines, bool(bad)
