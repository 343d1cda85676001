"""Serving captures (aiter.capture): what a line holds, the dedupe, refused calls, no tensor data,
the entries left untouched when AITER_CAPTURE is unset, and several processes appending to one
file at once with nothing lost or interleaved.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from aiter import capture
from tests.aot_cli import REPO, aot_env


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_entries_are_left_as_they_are_without_the_variable() -> None:
    from aiter.ops.gemm import entry

    assert not hasattr(entry.gemm_a16w16, "__wrapped__")


def test_a_decorated_function_records_each_distinct_call_once(tmp_path, monkeypatch) -> None:
    path = tmp_path / "capture.jsonl"
    monkeypatch.setenv(capture.ENV_CAPTURE, str(path))

    @capture.entry("double")
    def double(x, scale=2, dtype=None):
        if scale < 0:
            raise ValueError("scale: expected >= 0")
        return x

    a, b = torch.zeros(4, 8), torch.zeros(4, 8)
    double(a)
    double(b)  # the same dtype, shape and strides: not written again
    double(a, scale=3, dtype=torch.bfloat16)
    double(torch.zeros(8, 4).t())  # other strides
    with pytest.raises(ValueError):
        double(a, scale=-1)
    lines = _lines(path)
    assert len(lines) == 4
    first = lines[0]
    assert first["schema"] == capture.SCHEMA_VERSION and first["op"] == "double"
    assert first["aiter"] and first["flydsl"]
    assert first["args"] == [
        {"tensor": {"dtype": "float32", "shape": [4, 8], "stride": [8, 1], "device": "cpu"}}
    ]
    assert lines[1]["kwargs"] == {"scale": 3, "dtype": {"dtype": "bfloat16"}}
    assert lines[2]["args"][0]["tensor"]["stride"] == [1, 4]
    assert lines[3]["error"] == "ValueError: scale: expected >= 0"


def test_integer_host_tensors_are_recorded_by_value_and_nothing_else_is() -> None:
    seqlens = capture.describe(torch.tensor([0, 5, 9], dtype=torch.int32))
    assert seqlens["tensor"]["values"] == [0, 5, 9]
    data = capture.describe(torch.ones(3))
    assert "values" not in data["tensor"]


def test_the_dedupe_is_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(capture, "MAX_DISTINCT", 2)
    recorder = capture._Capture(str(tmp_path / "c.jsonl"))
    assert [recorder.first_time(k) for k in ("a", "b", "a", "c", "b", "a")] == [
        True, True, False, True, False, True,  # "a" was the oldest when "c" came
    ]  # fmt: skip


WRITER = textwrap.dedent("""
    import sys, torch
    import aiter
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    rank, calls = int(sys.argv[1]), int(sys.argv[2])
    with dry_run("gfx942", 304, bridge.MODE_NAME):
        e = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="cuda")
        for i in range(calls):
            for _ in range(3):  # repeats are not written again
                aiter.gemm_a16w16(e(1 + i, 256), e(64 * (rank + 1), 256))
    """)


@pytest.mark.slow  # four serving processes
def test_processes_sharing_one_file_lose_and_interleave_nothing(tmp_path) -> None:
    path, calls, ranks = tmp_path / "shared.jsonl", 60, 4
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**aot_env({}), capture.ENV_CAPTURE: str(path)}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(calls)], cwd=REPO, env=env,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
        for r in range(ranks)
    ]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
    lines = _lines(path)  # every line parses: none interleaved
    assert len(lines) == ranks * calls
    seen = {
        (ln["args"][0]["tensor"]["shape"][0], ln["args"][1]["tensor"]["shape"][0]) for ln in lines
    }
    assert seen == {(1 + i, 64 * (r + 1)) for i in range(calls) for r in range(ranks)}
    assert all(ln["served"] and ln["served"][0]["kernel"] for ln in lines)


KERNELS = textwrap.dedent("""
    import torch
    from aiter.toolchain import configure_linker
    configure_linker()
    import aiter
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    with dry_run("gfx942", 304, bridge.MODE_COMPILE):
        e = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="cuda")
        try:
            aiter.gemm_a16w16(e(7, 512), e(256, 512))
        except Exception as error:
            print(type(error).__name__)
    """)


@pytest.mark.slow  # compiles a kernel
def test_each_kernel_says_whether_the_cache_served_it(tmp_path) -> None:
    path, script = tmp_path / "capture.jsonl", tmp_path / "serve.py"
    script.write_text(KERNELS)

    def serve(cache, **env):
        full = {**aot_env(env), capture.ENV_CAPTURE: str(path),
                "FLYDSL_RUNTIME_CACHE_DIR": str(cache)}  # fmt: skip
        subprocess.run([sys.executable, str(script)], cwd=REPO, env=full, check=True, timeout=600)

    serve(tmp_path / "empty", FLYDSL_RUNTIME_RUN_ONLY="1")
    serve(tmp_path / "cache")
    serve(tmp_path / "cache", FLYDSL_RUNTIME_RUN_ONLY="1")
    lines = _lines(path)
    assert [[k["cache"] for k in line["kernels"]] for line in lines] == [
        ["refused"],
        ["compiled"],
        ["hit"],
    ]
    assert lines[0]["error"].startswith("JitCompileRefused")
    assert lines[1]["kernels"][0]["function"] == "gemm_a16w16"
    assert "tile_m=16" in lines[1]["kernels"][0]["params"]
