"""Building and auditing from a capture (`--capture`), on GEMM calls captured in this process
through the public entry wrapped as AITER_CAPTURE wraps it: one job per distinct call, the
widened run of the row (or heuristic) serving it, the miss message of each call an empty cache
would not serve, and bad lines reported with the exit status saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiter import capture
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.gemm import entry as gemm_entry
from tests.aot_cli import lines_starting, replay_reports, run_aot

N, K = 6144, 4096  # a tuned gfx942 shape: rows at M = 1, 2, 4, ..., 8192


def capture_gemm(path: Path, monkeypatch, ms: list[int], n: int = N, k: int = K) -> Path:
    """gemm_a16w16 at each M (bfloat16, N x K weight) captured to `path` in a dry run of
    gfx942 with 304 CUs, as a serving process with AITER_CAPTURE=path records it."""
    monkeypatch.setenv(capture.ENV_CAPTURE, str(path))
    gemm = capture.entry("gemm_a16w16")(gemm_entry.gemm_a16w16)
    with dry_run("gfx942", 304, bridge.MODE_NAME):
        for m in ms:
            a = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
            gemm(a, torch.empty((n, k), dtype=torch.bfloat16, device="cuda"))
    monkeypatch.delenv(capture.ENV_CAPTURE)
    return path


def jobs_of(report) -> list:
    return [r.job for r in report.results]


def test_widen_covers_the_run_that_serves_each_call(tmp_path, monkeypatch) -> None:
    path = capture_gemm(tmp_path / "c.jsonl", monkeypatch, [300, 10000, 300])
    proc, reports = replay_reports(
        "aiter.aot.flydsl", {"GPU_ARCHS": "gfx942"}, tmp_path / "r.json",
        "--list", "--capture", str(path), "--capture-widen", "--max-m", "16384",
        "--cache-dir", str(tmp_path / "cache"), "-j", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = jobs_of(reports["gfx942"])
    # 300 is served by the row at M=512 (above 256's); 10000 by the heuristic above 8192.
    assert [(j.row, j.axis, j.lo, j.hi) for j in jobs] == [
        (f"{path}:1", "M", 257, 512),
        (f"{path}:2", "M", 8193, 16384),
    ]
    assert all(j.table == "capture" and j.variant == "gemm_a16w16" for j in jobs)
    assert len(path.read_text().splitlines()) == 2  # the process wrote the repeat once
    assert "--capture: 2 distinct calls of 1 module(s)" in proc.stderr


@pytest.mark.slow  # an AOT command line in a subprocess
def test_check_names_each_call_an_empty_cache_would_not_serve(tmp_path, monkeypatch) -> None:
    path = capture_gemm(tmp_path / "c.jsonl", monkeypatch, [7, 300])
    proc = run_aot(
        "aiter.aot.flydsl", "--check", "--capture", str(path),
        "--cache-dir", str(tmp_path / "cache"), "-j", "2",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    fails = lines_starting(proc.stdout, "FAIL")
    assert [f.split()[3] for f in fails] == ["c.jsonl:1", "c.jsonl:2"]
    for m in (7, 300):
        assert f"call:    gemm_a16w16(A=bfloat16[{m}, {K}] row-major" in proc.stdout
    # One message per kernel a call lacks (a split-K call lacks its reduction kernel too).
    misses = len(lines_starting(proc.stdout, "MISSING"))
    assert misses >= 2
    assert proc.stdout.count("device:  gfx942, 304 CUs") == misses
    assert proc.stdout.count("served:  row ") == misses  # both M are tuned
    assert proc.stdout.count("fix:     build it from the capture: GPU_ARCHS=gfx942:304 ") == misses
    assert f"--capture {path}" in proc.stdout


@pytest.mark.slow  # AOT command lines in subprocesses
def test_a_bad_line_is_reported_and_the_rest_still_replayed(tmp_path, monkeypatch) -> None:
    path = capture_gemm(tmp_path / "c.jsonl", monkeypatch, [16])
    good = path.read_text()
    line = json.loads(good)
    line["schema"] = capture.SCHEMA_VERSION + 1
    path.write_text(good + json.dumps(line) + "\n" + good[:50])
    proc, reports = replay_reports(
        "aiter.aot.flydsl", {}, tmp_path / "r.json", "--list", "--capture", str(path),
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"capture: {path}:2: capture schema {capture.SCHEMA_VERSION + 1}" in proc.stderr
    assert f"capture: {path}:3: truncated last line" in proc.stderr
    assert [j.lo for j in jobs_of(reports["gfx942"])] == [16]


@pytest.mark.slow  # AOT command lines in subprocesses
def test_a_call_the_entry_now_rejects_fails_its_own_job(tmp_path, monkeypatch) -> None:
    path = capture_gemm(tmp_path / "c.jsonl", monkeypatch, [16, 32])
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["args"][1]["tensor"]["shape"] = [N, K + 1]  # B's K no longer A's
    path.write_text(json.dumps(first) + "\n" + lines[1] + "\n")
    proc, reports = replay_reports(
        "aiter.aot.flydsl", {}, tmp_path / "r.json", "--list", "--capture", str(path),
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert proc.returncode == 1
    [fail] = lines_starting(proc.stdout, "FAIL")
    assert "c.jsonl:1" in fail and "ValueError" in fail
    assert [r.tag for r in reports["gfx942"].results] == ["FAIL", "OK"]


@pytest.mark.slow  # AOT command lines in subprocesses
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--capture-widen"], "--capture-widen and --tables go with --capture PATH"),
        (["--capture", "/nonexistent.jsonl"], "--capture /nonexistent.jsonl: no such file"),
    ],
)
def test_bad_capture_options_are_usage_errors(args, expected) -> None:
    proc = run_aot("aiter.aot.flydsl", "--list", *args)
    assert proc.returncode == 2 and expected in proc.stderr


@pytest.mark.slow  # AOT command lines in subprocesses
def test_module_narrows_the_captured_modules(tmp_path, monkeypatch) -> None:
    path = capture_gemm(tmp_path / "c.jsonl", monkeypatch, [16])
    proc = run_aot("aiter.aot.flydsl", "--list", "--capture", str(path), "--module", "moe")
    assert proc.returncode == 2
    assert "--capture: no module of this build replays the captured ops (gemm_a16w16)" in (
        proc.stderr
    )


@pytest.mark.slow  # AOT command lines in subprocesses
def test_merge_keeps_each_distinct_call_once_and_reports_bad_lines(tmp_path, monkeypatch) -> None:
    a = capture_gemm(tmp_path / "a.jsonl", monkeypatch, [16, 32])
    b = capture_gemm(tmp_path / "b.jsonl", monkeypatch, [32, 64])
    b.write_text(b.read_text() + '{"schema": 1, "op"')
    merged = tmp_path / "merged.jsonl"
    proc = run_aot("aiter.aot.flydsl.capture", "merge", str(a), str(b), "-o", str(merged))
    assert proc.returncode == 1  # the truncated line
    assert f"capture: {b}:3: truncated last line" in proc.stderr
    ms = [json.loads(x)["args"][0]["tensor"]["shape"][0] for x in merged.read_text().splitlines()]
    assert ms == [16, 32, 64]
    again = run_aot("aiter.aot.flydsl.capture", "merge", str(merged), str(a), "-o", str(merged))
    assert again.returncode == 0 and len(merged.read_text().splitlines()) == 3


@pytest.mark.slow  # AOT command lines in subprocesses
def test_suggested_rows_load_and_serve_the_untuned_calls(tmp_path, monkeypatch) -> None:
    from aiter import dispatch
    from aiter.ops.gemm.table import A16W16

    untuned_n, untuned_k = 384, 768  # no row of any table has this shape
    path = capture_gemm(tmp_path / "c.jsonl", monkeypatch, [5, 300], untuned_n, untuned_k)
    capture_gemm(path, monkeypatch, [300])  # tuned: nothing to suggest for it
    proc = run_aot("aiter.aot.flydsl.capture", "suggest", str(path), "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    table = tmp_path / A16W16.name
    assert f"# gemm_a16w16: 2 row(s) for --csv gemm_a16w16={table}" in proc.stdout
    rows = table.read_text().splitlines()
    assert rows[0] == ",".join(A16W16.header) and len(rows) == 3
    monkeypatch.setenv(A16W16.env_var, A16W16.env_value([str(table)]))
    served = []
    with dispatch.observe() as records, dry_run("gfx942", 304, bridge.MODE_NAME):
        for m in (5, 300):
            a = torch.empty((m, untuned_k), dtype=torch.bfloat16, device="cuda")
            b = torch.empty((untuned_n, untuned_k), dtype=torch.bfloat16, device="cuda")
            gemm_entry.gemm_a16w16(a, b)
            served.append(records[-1])
    assert [r.row for r in served] == [f"{table}:2", f"{table}:3"]
    captured = [json.loads(x)["served"][0] for x in path.read_text().splitlines()[:2]]
    assert [r.kernel for r in served] == [c["kernel"] for c in captured]  # as the heuristic did
    assert [r.params["split_k"] for r in served] == [c["params"]["split_k"] for c in captured]


@pytest.mark.slow  # an AOT command line in a subprocess
def test_widen_moves_chunk_gdn_h_calls_along_their_tokens(tmp_path, monkeypatch) -> None:
    from aiter.aot.flydsl.dry_run import host_tensor
    from aiter.ops.chunk_gdn_h import entry as gdn_entry

    path = tmp_path / "c.jsonl"
    monkeypatch.setenv(capture.ENV_CAPTURE, str(path))
    call = capture.entry("chunk_gated_delta_rule_fwd_h")(gdn_entry.chunk_gated_delta_rule_fwd_h)
    batch = 8

    def empty(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="cuda")

    with dry_run("gfx942", 304, bridge.MODE_NAME):
        # 16000 tokens: the row of the layer at N = 8, T_flat = 32768; 40000: the heuristic.
        for seqlen in (2000, 5000):
            call(empty(batch, seqlen, 16, 128), empty(batch, seqlen, 32, 128),
                 empty(batch, seqlen, 32, 128), g=empty(batch, seqlen, 32, dtype=torch.float32),
                 output_final_state=True)  # fmt: skip
        # The same tokens as one varlen batch of 8 ragged sequences (a host cu_seqlens).
        for tokens in (16000, 40000):
            bounds = host_tensor(
                [(tokens * i * i) // (batch * batch) for i in range(batch + 1)], torch.int32
            )
            call(empty(1, tokens, 16, 128), empty(1, tokens, 32, 128), empty(1, tokens, 32, 128),
                 g=empty(1, tokens, 32, dtype=torch.float32), output_final_state=True,
                 cu_seqlens=bounds)  # fmt: skip
    monkeypatch.delenv(capture.ENV_CAPTURE)
    proc, reports = replay_reports(
        "aiter.aot.flydsl", {"GPU_ARCHS": "gfx942"}, tmp_path / "r.json",
        "--list", "--capture", str(path), "--capture-widen", "--max-tokens", "65536",
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    # The row serves 8193..32768 tokens of 8 sequences: T from 1025 to 32768 / 8; the
    # heuristic the rest, up to the deployment's 65536 tokens.
    # A varlen batch moves along its total tokens, the 8 sequences kept.
    assert [(j.axis, j.lo, j.hi) for j in jobs_of(reports["gfx942"])] == [
        ("seqlen", 1025, 4096),
        ("seqlen", 4097, 65536 // batch),
        ("tokens", 8193, 32768),
        ("tokens", 32769, 65536),
    ]


@pytest.mark.slow  # an AOT command line in a subprocess
def test_widen_moves_a_varlen_attention_call_along_its_longest_key_sequence(
    tmp_path, monkeypatch
) -> None:
    from aiter.ops.fmha_fp8 import entry as fmha_entry

    path = tmp_path / "c.jsonl"
    monkeypatch.setenv(capture.ENV_CAPTURE, str(path))
    call = capture.entry("flash_attn_fp8")(fmha_entry.flash_attn_fp8)
    with dry_run("gfx942", 304, bridge.MODE_NAME):
        fp8 = torch.float8_e4m3fnuz

        def empty(*shape, dtype=fp8):
            return torch.empty(shape, dtype=dtype, device="cuda")

        scale = empty(1, dtype=torch.float32)
        cu_seqlens = empty(3, dtype=torch.int32)  # 2 sequences: the Llama row's heads
        call(empty(500, 8, 128), empty(500, 1, 128), empty(500, 1, 128), q_descale=scale,
             k_descale=scale, v_descale=scale, cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
             max_seqlen_q=300, max_seqlen_kv=300)  # fmt: skip
    monkeypatch.delenv(capture.ENV_CAPTURE)
    proc, reports = replay_reports(
        "aiter.aot.flydsl", {"GPU_ARCHS": "gfx942"}, tmp_path / "r.json",
        "--list", "--capture", str(path), "--capture-widen", "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    [result] = reports["gfx942"].results
    # No row chooses attention's kernels: the plan serves every key length up to the default
    # maximum, and the widened replay reaches the split kernels longer sequences take.
    assert (result.job.axis, result.job.lo, result.job.hi) == ("seqlen_k", 1, result.job.widen_to)
    splits = [["use_split=True" in k.params for k in s.kernels] for s in result.segments]
    assert splits[0] == [False] and any(True in s for s in splits[1:]), splits
