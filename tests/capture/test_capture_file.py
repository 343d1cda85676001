"""Reading captures for a build: good lines become distinct calls, each bad line is one report
naming its file and line while the rest of the file is still used."""

from __future__ import annotations

import json

from aiter import capture
from aiter.aot.flydsl.capture.files import current_versions, read_captures


def line(op="gemm_a16w16", m=8, **overrides) -> str:
    data = {
        "schema": capture.SCHEMA_VERSION,
        **current_versions(),
        "op": op,
        "arch": "gfx942",
        "cu_num": 304,
        "args": [{"tensor": {"dtype": "bfloat16", "shape": [m, 64], "stride": [64, 1],
                             "device": "cuda"}}],  # fmt: skip
        "kwargs": {},
        "served": [{"row": "bf16_tuned_gemm.csv:3", "source": "table"}],
    }
    data.update(overrides)
    return json.dumps(data)


def test_distinct_calls_across_files_first_seen_first(tmp_path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(f"{line(m=8)}\n{line(m=16)}\n")
    b.write_text(f"{line(m=16, served=[])}\n{line(m=32)}\n")  # served differently: same call
    read = read_captures([a, b])
    assert [c.where for c in read.calls] == [f"{a}:1", f"{a}:2", f"{b}:2"]
    assert read.duplicates == 1 and read.problems == []
    assert read.calls[0].served_rows() == ["bf16_tuned_gemm.csv:3"]
    assert read.archs() == {"gfx942": {304}}


def test_each_bad_line_is_one_report_and_the_rest_is_used(tmp_path) -> None:
    path = tmp_path / "c.jsonl"
    other = {"aiter": "0.0.1", "flydsl": "0.0.9"}
    path.write_text(
        "\n".join([
            line(m=1),
            line(m=2, schema=capture.SCHEMA_VERSION + 1),
            "{not json",
            line(m=3, arch="unknown"),
            line(m=4, **other),
            line(m=5, error="ValueError: N must be a multiple of 16"),
            json.dumps({"schema": capture.SCHEMA_VERSION, "op": "x"}),
            line(m=6)[:40],  # the writer died mid-line: the file does not end with a newline
        ])  # fmt: skip
    )
    read = read_captures([path])
    problems = read.problems
    assert len(problems) == 6, problems
    assert problems[0].startswith(f"{path}:2: capture schema 2")
    assert problems[1].startswith(f"{path}:3: not JSON")
    assert problems[2].startswith(f"{path}:4: arch 'unknown'")
    assert problems[3].startswith(f"{path}:5: recorded by aiter 0.0.1, flydsl 0.0.9; this is")
    assert problems[4] == f"{path}:7: not a capture line: lacks arch, cu_num, args, kwargs"
    assert problems[5].startswith(f"{path}:8: truncated last line")
    assert all("\n" not in p for p in problems)
    # The other version's call is still replayed; the refused one is not (it never served).
    assert [c.args[0]["tensor"]["shape"][0] for c in read.calls] == [1, 4]
    assert read.refused == 1


def test_a_file_ending_with_a_newline_has_no_truncated_line(tmp_path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(f"{line(m=1)}\n\n{line(m=2)}\n")
    read = read_captures([path])
    assert len(read.calls) == 2 and read.problems == []
