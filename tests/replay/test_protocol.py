"""The replay's typed records survive a JSON round trip, nested records, optional fields and
string enums included, and a job names itself the way reports print it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from aiter.aot.flydsl.jobs.records import (
    ArchReport,
    CompileResult,
    CompileTask,
    EntryProblem,
    Finding,
    JobInfo,
    JobResult,
    KernelRef,
    Missing,
    Mode,
    Sample,
    SampleProblem,
    Segment,
    Tag,
    from_json,
    to_json,
)

KERNEL = KernelRef("gemm", "/c/gemm_abc", "0123456789abcdef.pkl", "tile_m=16 split_k=2")
JOB = JobInfo("gemm", "t.csv", "/tables/t.csv:7", "gfx942", 304, "out_dtype=float16", "M", 1, 64)
GRID = JobInfo(
    "attn", "grid.csv", "/g.csv:2", "gfx950", 256, "", "seqlen", 128, 1024,
    fixed={"batch": 4}, cell={"batch": [4, 8], "seqlen": [128, 1024]}, group="/g.csv:2",
)  # fmt: skip


def _report() -> ArchReport:
    result = JobResult(
        JOB,
        segments=[Segment(1, 16, [KERNEL], ["flydsl"]), Segment(17, 64, [], ["torch"])],
        missing=[Missing(KERNEL, 1, 16)],
        samples=[Sample({"M": 9}, 0, [KERNEL])],
        findings=[Finding("unprobed", {"M": 9}, KERNEL)],
        probes=12,
        naming_cpu=0.25,
    )
    task = CompileTask(0, {"M": 1}, [str(KERNEL.path)], ["gemm"], 1.5)
    return ArchReport(
        "gfx942",
        "build",
        results=[result, JobResult(GRID, tag="SKIP", message="declines")],
        compiles=[CompileResult(task, True, seconds=0.4, compiled=[str(KERNEL.path)])],
        limits=["gemm: M above 8192 ..."],
    )


def test_an_arch_report_round_trips_through_json() -> None:
    report = _report()
    text = json.dumps(to_json(report))
    again = from_json(ArchReport, json.loads(text))
    assert again == report
    assert isinstance(again.results[0].segments[0].kernels[0], KernelRef)
    assert again.results[1].job.fixed == {"batch": 4}
    assert again.compiles[0].task.values == {"M": 1}


def test_the_json_data_is_what_asdict_makes() -> None:
    report = _report()
    assert to_json(report) == dataclasses.asdict(report)
    assert to_json([report, report]) == [dataclasses.asdict(report)] * 2


def test_a_list_of_records_round_trips() -> None:
    data = json.loads(json.dumps(to_json([JOB, GRID])))
    assert [from_json(JobInfo, d) for d in data] == [JOB, GRID]


def test_a_kernel_knows_its_own_path() -> None:
    assert str(KERNEL.path) == "/c/gemm_abc/0123456789abcdef.pkl"


def test_derived_views() -> None:
    report = _report()
    assert report.kernels() == {KERNEL.path: KERNEL}
    assert report.compiled() == {str(KERNEL.path)}
    assert report.missing() == {KERNEL.path}
    assert JOB.values(5) == {"M": 5} and GRID.values(200) == {"batch": 4, "seqlen": 200}


def test_describe_names_file_line_axis_and_variant() -> None:
    assert JOB.describe() == "gfx942:304 t.csv:7 M 1-64 out_dtype=float16"
    assert GRID.describe() == "gfx950:256 g.csv:2 batch=4 seqlen 128-1024"


def test_enum_fields_come_back_as_enums() -> None:
    report = _report()
    again = from_json(ArchReport, json.loads(json.dumps(to_json(report))))
    assert type(again.mode) is Mode and again.mode is Mode.BUILD
    assert [type(r.tag) for r in again.results] == [Tag, Tag]
    assert again.results[1].tag is Tag.SKIP
    assert type(again.results[0].missing[0].problem) is EntryProblem
    assert again.results[0].findings[0].problem is SampleProblem.UNPROBED
    corrupt = Missing(KERNEL, 1, 16, EntryProblem.CORRUPT, "truncated")
    assert from_json(Missing, json.loads(json.dumps(to_json(corrupt)))) == corrupt


def test_enums_are_their_values_in_json_and_text() -> None:
    assert [t.value for t in Tag] == ["OK", "SKIP", "REFUSED", "UNREACHED", "FAIL"]
    assert [m.value for m in Mode] == ["build", "list", "check"]
    # Printed and serialized as before they were enums: job lines, summaries, --report.
    assert f"{Tag.FAIL:<9}|{Mode.CHECK}" == "FAIL     |check"
    assert json.dumps({"mode": Mode.LIST, Tag.OK: 1}) == '{"mode": "list", "OK": 1}'
    assert Tag.OK == "OK" and Tag.SKIP == "SKIP" and {Tag.FAIL: 1}["FAIL"] == 1
    assert to_json(JobResult(JOB, tag=Tag.REFUSED))["tag"] == "REFUSED"


def test_a_value_no_enum_member_has_is_refused() -> None:
    data = to_json(JobResult(JOB))
    with pytest.raises(ValueError, match="'MAYBE' is not a valid Tag"):
        from_json(JobResult, {**data, "tag": "MAYBE"})
