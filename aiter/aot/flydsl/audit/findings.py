"""The audit after naming: kernels the cache lacks or holds corrupt, and kernels the dense
audit's random points asked for that no bisection probe named; the jobs they belong to fail.
"""

from __future__ import annotations

from pathlib import Path

from aiter.aot.flydsl.audit.entries import EntryAudit
from aiter.aot.flydsl.jobs.records import (
    EntryProblem,
    Finding,
    JobResult,
    Missing,
    Mode,
    Tag,
)


def audit(results: list[JobResult], mode: str, entries: EntryAudit) -> None:
    """Find kernels the cache lacks or holds corrupt, and sampled kernels no probe named; fail
    those jobs."""
    group_kernels: dict[str, set[Path]] = {}
    for r in results:
        if r.job.group:
            group_kernels.setdefault(r.job.group, set()).update(k.path for k in r.kernels())
    for r in results:
        if r.tag not in (Tag.OK, Tag.REFUSED):
            continue
        if mode != Mode.LIST:
            r.missing = [
                Missing(k, seg.lo, seg.hi, *_problem(entries.problem(k.path)))
                for seg in r.segments
                for k in seg.kernels
                if not entries.is_whole(k.path)
            ]
        for s in r.samples:
            probed = (
                {k.path for k in r.segments[s.segment].kernels}
                if s.segment >= 0
                else group_kernels.get(r.job.group, set())
            )
            for k in s.kernels:
                if k.path not in probed:
                    r.findings.append(Finding("unprobed", s.values, k))
                elif not entries.is_whole(k.path):
                    r.findings.append(Finding("missing", s.values, k))
        problems = []
        corrupt = sum(m.problem == EntryProblem.CORRUPT for m in r.missing)
        if len(r.missing) > corrupt:
            problems.append(f"{len(r.missing) - corrupt} kernel(s) missing from the cache")
        if corrupt:
            problems.append(f"{corrupt} corrupt cache entr{'y' if corrupt == 1 else 'ies'}")
        unprobed = sum(f.problem == "unprobed" for f in r.findings)
        if unprobed:
            problems.append(f"{unprobed} sampled kernel(s) that bisection did not name")
        if r.findings and not unprobed:
            problems.append(f"{len(r.findings)} sampled kernel(s) missing from the cache")
        if problems and mode != Mode.LIST:
            r.tag, r.message = Tag.FAIL, "; ".join(problems)


def _problem(problem: str | None) -> tuple[str, str]:
    """(problem, why) of a Missing record."""
    if problem == EntryProblem.MISSING:
        return EntryProblem.MISSING, ""
    return EntryProblem.CORRUPT, problem or ""
