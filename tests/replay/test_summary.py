"""The summary's `replayed:` line states what was replayed: each axis up to the rows' largest
value, capped by the deployment's maximum, not the maximum alone."""

from __future__ import annotations

from aiter.aot.flydsl.execution.summary import print_summary, replayed_extent, summary_rows
from aiter.aot.flydsl.jobs.records import ArchReport, JobInfo, JobResult, Mode


def _result(axis: str, lo: int, hi: int, **fixed: int) -> JobResult:
    info = JobInfo("m", "t.csv", "t.csv:2", "gfx942", 304, "", axis, lo, hi, fixed=fixed)
    return JobResult(info)


def _report() -> ArchReport:
    results = [
        _result("M", 1, 512),
        _result("M", 513, 32768),
        _result("seqlen", 1024, 4096, batch=8),
        _result("seqlen", 4096, 12000, batch=1),
        _result("seqlen_k", 64, 256, batch=2, seqlen_q=64),
    ]
    return ArchReport(arch="gfx942", mode=Mode.LIST, results=results)


def test_the_extent_is_the_largest_value_each_axis_replayed() -> None:
    assert replayed_extent([_report()]) == {
        "M": 32768,
        "seqlen": 12000,
        "batch": 8,
        "seqlen_k": 256,
        "seqlen_q": 64,
    }


def test_the_replayed_line_names_the_rows_largest_under_the_maximum(capsys) -> None:
    report = _report()
    maxima = {"M": 32768, "seqlen": 1 << 20, "batch": 4}
    print_summary(summary_rows([report]), [report], maxima)
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("replayed:")]
    assert line == (
        "replayed: M up to 32768 (the deployment's maximum), "
        "seqlen up to 12000 (the rows' largest; the deployment's is 1048576), "
        "batch up to 4 (the deployment's maximum), seqlen_k up to 256, seqlen_q up to 64; "
        "--max-<axis> sets the deployment's maximum"
    )
