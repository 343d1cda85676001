"""The fingerprint memo: a build whose inputs match a completed build the cache records, with
every entry that build listed intact, replays nothing. Imports neither torch nor FlyDSL.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from aiter.aot.flydsl import registry
from aiter.aot.flydsl.options import Build


def fingerprint(build: Build) -> tuple[str, dict[str, Any]]:
    from aiter.aot.flydsl import fingerprint as inputs_of

    extra = [registry.source_file(path) for path in build.modules.values()]
    inputs = inputs_of.FingerprintInputs(
        sources=tuple(inputs_of.package_sources(extra)),
        tables=tuple(p for spec in build.specs() for p in spec.paths()),
        env=inputs_of.fingerprint_env(build.env),
        versions=inputs_of.package_versions(),
        targets=tuple(str(t) for t in build.targets),
        options=tuple(sorted((f"max-{k}", str(v)) for k, v in build.maxima.items())),
    )
    return inputs_of.compute(inputs), inputs_of.describe(inputs)


def memo_holds(build: Build, fp: str) -> bool:
    """True when the cache holds a complete build with this fingerprint, every entry intact."""
    from aiter.flydsl_bridge.manifest import entry_problem, memo_entries, read_manifest

    start = time.perf_counter()
    try:
        data = read_manifest(build.cache_dir)
    except ValueError as err:
        print(f"memo: {err}; replaying", file=sys.stderr)
        return False
    entries = memo_entries(data, build.modules, [str(t) for t in build.targets], fp)
    if entries is None:
        print("memo: no build with this fingerprint in the cache; replaying", file=sys.stderr)
        return False
    bad = [
        (rel, why)
        for rel, rec in entries.items()
        if (why := entry_problem(build.cache_dir, rel, rec))
    ]
    if bad:
        rel, why = bad[0]
        print(f"memo: {len(bad)} entries not as built ({rel}: {why}); replaying", file=sys.stderr)
        return False
    print(
        f"up to date: the fingerprint matches and all {len(entries)} kernels of "
        f"{', '.join(build.modules)} for {', '.join(map(str, build.targets))} are intact "
        f"({time.perf_counter() - start:.2f} s); nothing replayed (--no-memo replays)"
    )
    return True
