"""Each job of the replay ends in exactly one documented tag; the driver survives a dead worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.aot_cli import lines_starting, run_aot

TABLE = """gfx,cu_num,M,case
gfx942,304,256,ok
gfx942,304,64,skip
gfx942,304,64,unreached
gfx942,304,64,fail
gfx942,304,64,abort
gfx942,304,500,refused
gfx942,304,4000,refused
"""
MODULE = "tests.fixtures.tag_family"


@pytest.fixture(scope="module")
def tag_env(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / "tags.csv").write_text(TABLE)
    cache = tmp_path_factory.mktemp("cache")
    return {"AITER_TEST_TAGS_DIR": str(tables), "GPU_ARCHS": "gfx942"}, cache


@pytest.fixture(scope="module")
def build(tag_env):
    env, cache = tag_env
    return run_aot(MODULE, "--cache-dir", str(cache), "-j", "2", env=env), cache


def _tags(stdout: str) -> dict[str, str]:
    """Row line -> tag, from the job lines of a report."""
    tags = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in ("OK", "SKIP", "REFUSED", "UNREACHED", "FAIL"):
            tags[parts[3]] = parts[0]
    return tags


def test_every_tag_is_reported_for_its_row(build):
    proc, _ = build
    assert _tags(proc.stdout) == {
        "tags.csv:2": "OK",
        "tags.csv:3": "SKIP",
        "tags.csv:4": "UNREACHED",
        "tags.csv:5": "FAIL",
        "tags.csv:6": "FAIL",
        "tags.csv:7": "OK",
        "tags.csv:8": "REFUSED",
    }, (
        proc.stdout + proc.stderr
    )


def test_failures_make_the_exit_status_one(build):
    proc, _ = build
    assert proc.returncode == 1, proc.stderr


def test_reasons_are_given(build):
    proc, _ = build
    out = proc.stdout
    assert "runtime declines: no kernel for this variant on this arch" in out
    assert "served by torch" in out
    assert "ValueError: the runtime rejected this row" in out
    assert "compile at M=1: worker killed by SIGABRT" in out
    assert "in-between M 1001-3999 above the module's limit 1000 not replayed" in out


def test_a_dead_worker_does_not_stop_the_others(build):
    proc, cache = build
    summary = lines_starting(proc.stdout, "summary gfx942:")
    assert summary and "2 compiled" in summary[0], proc.stdout
    manifest = json.loads((cache / "aiter_aot_manifest.json").read_text())
    kernels = manifest["archs"]["gfx942"]["tags"]
    blocks = sorted(k["params"].split("block=")[1].split()[0] for k in kernels.values())
    # block 64 below the switch, 128 above it; the aborted job's block 256 never landed.
    assert blocks == ["128", "64"]
    assert all((cache / rel).is_file() for rel in kernels)


def test_list_names_both_sides_of_the_switch(tag_env):
    env, cache = tag_env
    proc = run_aot(MODULE, "--list", "--cache-dir", str(cache), env=env)
    assert "          M 1-100: scale[" in proc.stdout
    assert "          M 101-256: scale[" in proc.stdout


def test_unknown_arch_is_a_usage_error(tag_env):
    env, cache = tag_env
    proc = run_aot(MODULE, "--list", env={**env, "GPU_ARCHS": "gfx90a"})
    assert proc.returncode == 2
    assert "gfx90a" in proc.stderr


def test_missing_csv_is_a_usage_error(tag_env, tmp_path):
    env, _ = tag_env
    proc = run_aot(MODULE, "--list", "--csv", str(tmp_path / "nope.csv"), env=env)
    assert proc.returncode == 2
    assert "nope.csv: no such file" in proc.stderr


def test_naming_in_parallel_matches_serial(tag_env):
    env, cache = tag_env

    def job_lines(workers: str) -> list[str]:
        proc = run_aot(MODULE, "--list", "--cache-dir", str(cache), "-j", workers, env=env)
        return [line for line in proc.stdout.splitlines() if not line.startswith("summary")]

    serial, parallel = job_lines("1"), job_lines("3")
    assert serial == parallel
    assert len(serial) > 7


def test_no_linker_is_a_usage_error(tag_env, tmp_path):
    env, cache = tag_env
    site = tmp_path / "site"
    site.mkdir()
    # A machine without ziglang: importing it fails in every process.
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['ziglang'] = None\n")
    bare = {
        **env,
        "PATH": str(tmp_path),  # no ld.lld on PATH
        "ROCM_PATH": str(tmp_path / "no-rocm"),
        "PYTHONPATH": str(site),
        "AITER_LLD_SHIM_DIR": str(tmp_path / "shim"),
    }
    if Path("/opt/rocm/llvm/bin/ld.lld").exists():
        pytest.skip("this machine has ROCm's ld.lld in /opt/rocm, which is always found")
    proc = run_aot(MODULE, "--cache-dir", str(cache), env=bare)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no AMDGPU-capable ld.lld was found" in proc.stderr
    assert "pip install ziglang" in proc.stderr
