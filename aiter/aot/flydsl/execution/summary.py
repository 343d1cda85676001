"""What the AOT command prints on stdout: every FAIL and SKIP in full (every job with --verbose),
the kernels of each segment under --list, every missing kernel under --check, and one summary
table per build (per arch and module: jobs per tag, kernels requested / compiled / missing).

The typed report itself (`--report PATH`) is the driver's; this module only prints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from aiter.aot.flydsl.jobs.records import (
    ArchReport,
    EntryProblem,
    JobResult,
    Mode,
    SampleProblem,
    Tag,
)
from aiter.tuning import TableSpec

TAG_COLUMNS = [tag.value for tag in Tag]  # the summary's columns of jobs per tag, in order


def _job_line(result: JobResult) -> str:
    note = f"  {result.message}" if result.message else ""
    return f"{result.tag:<9} {result.job.module} {result.job.describe()}{note}"


def print_job_lines(report: ArchReport, mode: Mode, verbose: bool) -> None:
    """Every FAIL and SKIP (every job with `verbose` or under --list), with the segments' kernels
    under --list and the missing or corrupt entries under --check; one line for a crashed arch."""
    if report.crashed:
        print(f"FAIL      {report.arch}: {report.crashed}")
        return
    for result in report.results:
        shown = verbose or mode == Mode.LIST or result.tag in (Tag.FAIL, Tag.SKIP)
        if shown:
            print(_job_line(result))
        if mode == Mode.LIST:
            for seg in result.segments:
                names = ", ".join(k.label() for k in seg.kernels) or (
                    f"(no FlyDSL kernel: served by {', '.join(seg.backends) or 'nothing'})"
                )
                print(f"          {result.job.axis} {seg.lo}-{seg.hi}: {names}")
        if mode == Mode.CHECK:
            if result.missing:
                for message in result.misses:  # a captured call the cache would not serve
                    print("\n".join(f"          {line}" for line in message.splitlines()))
            for m in result.missing:
                where = (
                    f"module={result.job.module} row={result.job.row} "
                    f"{result.job.axis}={m.lo}-{m.hi}{_fixed(result)} arch={report.arch} "
                    f"kernel={m.kernel.function}/{m.kernel.file}"
                )
                if m.problem == EntryProblem.CORRUPT:
                    print(f"CORRUPT   {where} path={m.kernel.path} why: {m.why}")
                else:
                    print(f"MISSING   {where} params: {m.kernel.params}")
            for f in result.findings:
                at = " ".join(f"{k}={v}" for k, v in f.values.items())
                print(
                    f"SAMPLED   {f.problem} module={result.job.module} row={result.job.row} "
                    f"at {at} arch={report.arch} kernel={f.kernel.function}/{f.kernel.file} "
                    f"params: {f.kernel.params}"
                )


def _fixed(result: JobResult) -> str:
    return "".join(f" {k}={v}" for k, v in result.job.fixed.items())


def summary_rows(reports: Sequence[ArchReport]) -> list[dict[str, Any]]:
    """One record per (arch, module): jobs per tag, kernels requested / compiled / missing."""
    rows = []
    for report in reports:
        if report.crashed:
            rows.append({"arch": report.arch, "module": "-", Tag.FAIL.value: 1, "jobs": 0})
            continue
        compiled = report.compiled()
        for module in sorted({r.job.module for r in report.results}):
            results = [r for r in report.results if r.job.module == module]
            kernels = {k.path for r in results for k in r.kernels()}
            missing = {m.kernel.path for r in results for m in r.missing}
            missing |= {
                f.kernel.path
                for r in results
                for f in r.findings
                if f.problem == SampleProblem.MISSING
            }
            unprobed = {
                f.kernel.path
                for r in results
                for f in r.findings
                if f.problem == SampleProblem.UNPROBED
            }
            rows.append(
                {
                    "arch": report.arch,
                    "module": module,
                    "jobs": len(results),
                    **{tag.value: sum(r.tag == tag for r in results) for tag in Tag},
                    "kernels": len(kernels),
                    "compiled": len({p for p in kernels if str(p) in compiled}),
                    "missing": len(missing),
                    "unprobed": len(unprobed),
                    "probes": sum(r.probes for r in results),
                    "naming_cpu_s": round(sum(r.naming_cpu for r in results), 2),
                    "arch_s": round(report.seconds, 1),
                }
            )
    return rows


def replayed_extent(reports: Sequence[ArchReport]) -> dict[str, int]:
    """The largest value of each axis some job replayed or stands for (grid points and the
    cells a point decides included)."""
    extent: dict[str, int] = {}
    for report in reports:
        for result in report.results:
            job = result.job
            reached = {**job.fixed, job.axis: job.hi}
            reached.update((axis, bounds[1]) for axis, bounds in job.cell.items())
            for axis, value in reached.items():
                extent[axis] = max(extent.get(axis, 0), value)
    return extent


def print_summary(
    rows: list[dict[str, Any]], reports: Sequence[ArchReport], maxima: Mapping[str, int]
) -> None:
    import pandas as pd

    table = pd.DataFrame(rows).fillna(0)
    columns = ["arch", "module", "jobs", *TAG_COLUMNS, "kernels", "compiled", "missing", "unprobed"]
    columns.append("arch_s")
    if "unprobed" in table.columns and not table["unprobed"].any():
        columns.remove("unprobed")  # only a sampled audit can find one
    table = table[[c for c in columns if c in table.columns]]
    for column in table.columns:
        if column not in ("arch", "module", "arch_s"):
            table[column] = table[column].astype(int)
    print(table.to_string(index=False))
    extent = replayed_extent(reports)
    served = []
    for axis in [*(a for a in maxima if a in extent), *sorted(set(extent) - set(maxima))]:
        top = maxima.get(axis)
        reached = extent[axis] if top is None else min(extent[axis], top)
        if top is None:  # a grid's own axis, cut at its rows' maxima
            served.append(f"{axis} up to {reached}")
        elif reached == top:
            served.append(f"{axis} up to {top} (the deployment's maximum)")
        else:
            served.append(f"{axis} up to {reached} (the rows' largest; the deployment's is {top})")
    if served:
        print(f"replayed: {', '.join(served)}; --max-<axis> sets the deployment's maximum")
    for limit in sorted({line for r in reports for line in r.limits}):
        print(f"limit: {limit}")
    for report in reports:
        for path in sorted({f for c in report.compiles for f in c.replaced}):
            print(f"replaced: {path} (it was in the cache but not a whole entry for {report.arch})")
        if report.shard:
            kept = len(report.results)
            print(f"shard {report.shard} of {report.arch}: {kept} of {report.jobs_total} jobs")


def table_lines(tables: Sequence[tuple[TableSpec, Sequence[str]]]) -> list[str]:
    """One line per table the build read: its rows by the backend each names (a row of another
    backend than this library's is served by this library's choice, never a failure), and the
    rows set aside because this library serves nothing they describe, with their reasons."""
    lines = []
    for spec, extra_paths in tables:
        table = spec.load(extra_paths)
        files = spec.name + (f" + {len(extra_paths)} more file(s)" if extra_paths else "")
        line = f"table {spec.short_name} ({files}): {len(table.rows)} rows"
        if spec.backend_of is not None and table.rows:
            backends = Counter(spec.backend_of(row) for row in table.rows)
            line += " (" + ", ".join(f"{b} {n}" for b, n in backends.most_common()) + ")"
        if table.set_aside:
            reasons = Counter(reason for _, reason in table.set_aside)
            line += f"; {len(table.set_aside)} set aside: " + "; ".join(
                f"{n} x {reason}" for reason, n in reasons.most_common()
            )
        lines.append(line)
    return lines
