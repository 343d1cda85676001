"""`python -m aiter.aot.flydsl merge DIR... --into DIR`: the union of caches built apart (the
shards of one build, `--shard I/N`, or builds of other archs or modules with the same inputs).

Before anything is written, every input is read and checked: it must hold a manifest with a
completed build (a shard killed mid-build has none: rerun it into its directory first), every
entry it lists must be present, whole and of its arch, and the inputs must have been built from
the same inputs (the fingerprint: sources, tables, environment, versions, options; for inputs of
the same arch also the targets), the first difference named. Then, holding the target's
manifest lock (so merges and builds into one directory wait for each other and lose nothing),
each entry is copied in atomically. An entry two inputs hold with the same bytes is one entry;
with different bytes (compiles are not always byte-identical) the one with the smallest sha256
is kept, whatever the inputs' order, and the merge says so. The manifests are joined, and the
merge ends by verifying every entry it listed, as `--check` verifies the entries it finds.

Exit status: 0; 1 when an input is refused or the verification fails (the target is then as it
was, or holds only whole entries); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiter.aot.flydsl.jobs.records import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from aiter.flydsl_bridge import manifest
from aiter.flydsl_bridge.manifest import KernelEntry, Manifest

TARGETS_ENV = "GPU_ARCHS"  # differs between the builds of different archs


@dataclass(frozen=True)
class MergeInput:
    directory: Path
    manifest: Manifest

    def label(self) -> str:
        shards = sorted({b.shard for b in self.manifest.builds.values() if b.shard})
        return f"{self.directory} (shard {', '.join(shards)})" if shards else str(self.directory)


def _read_input(directory: Path) -> tuple[MergeInput | None, list[str]]:
    if not directory.is_dir():
        return None, [f"{directory}: no such directory"]
    if not manifest.manifest_path(directory).is_file():
        return None, [
            f"{directory}: incomplete: no manifest (a build that did not finish, or not an "
            "aiter cache); rerun its build into it, then merge"
        ]
    try:
        built = manifest.read(directory)
    except ValueError as err:
        return None, [f"{directory}: corrupt: {err}"]
    if not built.builds:
        return None, [
            f"{directory}: incomplete: its manifest records no completed build (a shard killed "
            "mid-build, or one that failed); rerun its build into it, then merge"
        ]
    problems = [
        f"{directory}: corrupt: {rel}: {why}"
        for arch, modules in built.archs.items()
        for kernels in modules.values()
        for rel, entry in kernels.items()
        if (why := manifest.entry_problem(directory, arch, rel, entry))
    ]
    return MergeInput(directory, built), problems


def _differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], same_arch: bool) -> list[str]:
    """What differs between two builds' recorded inputs (the fingerprint's), section by section;
    builds of different archs may differ in their targets only."""
    found = []
    for section in sorted(set(ours) | set(theirs)):
        if section == "targets" and not same_arch:
            continue
        a, b = ours.get(section), theirs.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            names = sorted(
                n
                for n in set(a) | set(b)
                if a.get(n) != b.get(n) and (same_arch or (section, n) != ("env", TARGETS_ENV))
            )
            found += [f"{section}: {n} is {a.get(n)!r} here, {b.get(n)!r} there" for n in names]
        elif a != b:
            found.append(f"{section}: {a!r} here, {b!r} there")
    return found


def disagreements(inputs: Sequence[MergeInput]) -> list[str]:
    """Each input whose builds were made from other inputs than the first one's, and how."""
    records = [(i, b) for i in inputs for b in i.manifest.builds.values()]
    problems = []
    first_input, first = records[0]
    for other_input, record in records[1:]:
        same_arch = bool(set(record.archs) & set(first.archs))
        if same_arch and record.fingerprint == first.fingerprint:
            continue
        if not same_arch and not _differences(first.inputs, record.inputs, False):
            continue
        differs = _differences(first.inputs, record.inputs, same_arch) or [
            "the fingerprint (its recorded inputs are the same: another aiter's encoding)"
        ]
        problems.append(
            f"{other_input.label()}: built from other inputs than {first_input.label()}: "
            f"{'; '.join(differs[:3])}"
            + (f"; and {len(differs) - 3} more" if len(differs) > 3 else "")
        )
    return problems


def _copy(source: Path, target: Path) -> None:
    """`source`'s bytes at `target`, whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@dataclass
class MergeCounts:
    copied: int = 0
    already: int = 0  # entries the target held with the bytes kept
    differing: list[str] | None = None  # what was said about entries held with other bytes


def _place_entries(
    target: Path, current: Manifest, inputs: Sequence[MergeInput], counts: MergeCounts
) -> dict[str, KernelEntry]:
    """Copy each input's entries into `target` (the smallest digest where they differ);
    the entry kept per relative path."""
    holders: dict[str, dict[str, tuple[Path, KernelEntry]]] = {}  # rel -> sha -> holder
    for arch in current.archs:
        for rel, entry in current.entries(arch).items():
            if manifest.entry_problem(target, arch, rel, entry) is None:
                holders.setdefault(rel, {})[entry.sha256] = (target, entry)
    for merge_input in inputs:
        for rel, entry in merge_input.manifest.entries().items():
            holders.setdefault(rel, {}).setdefault(entry.sha256, (merge_input.directory, entry))
    counts.differing = []
    kept: dict[str, KernelEntry] = {}
    for rel, by_digest in sorted(holders.items()):
        digest = min(by_digest)
        directory, entry = by_digest[digest]
        kept[rel] = entry
        if len(by_digest) > 1:
            others = ", ".join(f"{d[:12]} in {h[0]}" for d, h in sorted(by_digest.items()))
            counts.differing.append(
                f"{rel}: different compiles ({others}): kept {digest[:12]}, the smallest digest"
            )
        if directory != target:
            _copy(directory / rel, target / rel)
            counts.copied += 1
        else:
            counts.already += 1
    return kept


def merge(directories: Sequence[str], into: str) -> int:
    target = Path(into).resolve()
    sources = [Path(d).resolve() for d in directories]
    if target in sources:
        print(f"error: --into {into} is also an input", file=sys.stderr)
        return EXIT_USAGE
    if target.exists() and not target.is_dir():
        print(f"error: --into {into}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    inputs, problems = [], []
    for directory in sources:
        read, found = _read_input(directory)
        problems += found
        if read is not None:
            inputs.append(read)
    if not problems:
        existing = [MergeInput(target, manifest.read(target))] if target.is_dir() else []
        existing = [e for e in existing if e.manifest.builds]
        problems += disagreements([*existing, *inputs])
    if problems:
        for problem in problems:
            print(f"refused: {problem}", file=sys.stderr)
        print(f"nothing merged into {into}", file=sys.stderr)
        return EXIT_FAIL
    counts = MergeCounts()

    def change(current: Manifest) -> Manifest:
        kept = _place_entries(target, current, inputs, counts)
        return manifest.union(current, [i.manifest for i in inputs], kept)

    target.mkdir(parents=True, exist_ok=True)
    manifest.change_manifest(target, change)
    for line in counts.differing or []:
        print(f"kept one: {line}", file=sys.stderr)
    return _verify(target, counts, len(inputs))


def _verify(target: Path, counts: MergeCounts, inputs: int) -> int:
    merged = manifest.read(target)
    bad = [
        f"{rel}: {why}"
        for arch in merged.archs
        for rel, entry in merged.entries(arch).items()
        if (why := manifest.entry_problem(target, arch, rel, entry))
    ]
    for line in bad:
        print(f"FAIL      {target}: {line}")
    total = len(merged.entries())
    print(
        f"merged {inputs} cache(s) into {target}: {counts.copied} entries copied, "
        f"{counts.already} already there, {len(counts.differing or [])} kept of differing "
        f"compiles; {total - len(bad)} of {total} entries present, whole and of their arch"
    )
    for _, record in sorted(merged.builds.items()):
        kind = f"shard {record.shard}" if record.shard else "complete build"
        print(
            f"  {kind}: {', '.join(record.modules)} for {', '.join(record.targets or record.archs)}"
        )
    return EXIT_FAIL if bad else EXIT_OK


def parser() -> argparse.ArgumentParser:
    parsing = argparse.ArgumentParser(
        prog="python -m aiter.aot.flydsl merge",
        description="Merge caches built apart (shards, archs, modules) into one.",
    )
    parsing.add_argument("directories", nargs="+", metavar="DIR", help="caches to merge")
    parsing.add_argument("--into", required=True, metavar="DIR", help="the merged cache")
    return parsing


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return merge(args.directories, args.into)
