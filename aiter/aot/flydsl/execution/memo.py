"""The fingerprint memo: a build whose inputs match a completed build the cache records, with
every entry that build listed intact, replays nothing. Imports neither torch nor FlyDSL.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from aiter.aot.flydsl import registry
from aiter.aot.flydsl.execution.options import Build, UsageError


def fingerprint(build: Build) -> tuple[str, dict[str, Any]]:
    """The build's fingerprint and its inputs described: the tables merged with the --csv files
    and the environment as the arch processes will see it."""
    from aiter.aot.flydsl.execution import fingerprint as inputs_of

    extra = [registry.source_file(path) for path in build.modules.values()]
    try:
        extra += [f for family in build.families.values() for f in registry.family_sources(family)]
    except ValueError as err:
        raise UsageError(str(err)) from None
    inputs = inputs_of.FingerprintInputs(
        sources=tuple(inputs_of.package_sources(extra)),
        tables=tuple(p for spec in build.specs() for p in spec.paths(build.extra_paths(spec))),
        env=inputs_of.fingerprint_env({**os.environ, **build.table_env()}),
        versions=inputs_of.package_versions(),
        targets=tuple(str(t) for t in build.targets),
        options=tuple(sorted((f"max-{k}", str(v)) for k, v in build.maxima.items())),
    )
    return inputs_of.compute(inputs), inputs_of.describe(inputs)


def memo_holds(build: Build, fp: str) -> bool:
    """True when the cache holds a complete build with this fingerprint, every entry intact."""
    from aiter.flydsl_bridge import manifest

    start = time.perf_counter()
    try:
        built = manifest.read(build.cache_dir)
    except ValueError as err:
        print(f"memo: {err}; replaying", file=sys.stderr)
        return False
    listed = built.build_entries(build.modules, [str(t) for t in build.targets], fp)
    if listed is None:
        print("memo: no build with this fingerprint in the cache; replaying", file=sys.stderr)
        return False
    bad = [
        (rel, why)
        for arch, entries in listed.items()
        for rel, entry in entries.items()
        if (why := manifest.entry_problem(build.cache_dir, arch, rel, entry))
    ]
    if bad:
        rel, why = bad[0]
        print(f"memo: {len(bad)} entries not as built ({rel}: {why}); replaying", file=sys.stderr)
        return False
    count = sum(len(entries) for entries in listed.values())
    print(
        f"up to date: the fingerprint matches and all {count} kernels of "
        f"{', '.join(build.modules)} for {', '.join(map(str, build.targets))} are intact "
        f"({time.perf_counter() - start:.2f} s); nothing replayed (--no-memo replays)"
    )
    return True
