"""`--check --execute`: the cache's kernels run on the emulator and are checked against torch.

A one-row bf16 GEMM table (M up to 64: a split-K 1 tile, a split-K 2 tile and its reduction) is
built for gfx942; the audit then executes the three cached kernels. A cache whose entry holds
another kernel's code (its manifest gone, so only execution can tell) fails the audit, naming the
row and the kernel.
"""

from __future__ import annotations

import json
import shutil

import pytest

from aiter.ops.gemm.table import (
    A16W16,
)
from tests.aot_cli import other_tables, run_aot

MODULE = "aiter.aot.flydsl.gemm"
ROW = "gfx942,304,32,256,512,0,torch.bfloat16,torch.bfloat16,flydsl,1,,flydsl_a16w16_mfma_32x64x128"
LIMITS = ("--max-m", "64")


def test_execute_needs_check() -> None:
    done = run_aot(MODULE, "--list", "--execute")
    assert done.returncode == 2
    assert "--execute goes with --check" in done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / A16W16.name).write_text(",".join(A16W16.header) + "\n" + ROW + "\n")
    for spec in other_tables(A16W16):
        (tables / spec.name).write_text(",".join(spec.header) + "\n")
    cache = tmp_path_factory.mktemp("cache")
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": "gfx942"}
    done = run_aot(MODULE, "--cache-dir", str(cache), *LIMITS, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return env, cache


@pytest.mark.slow
def test_check_execute_runs_every_cached_kernel(built, tmp_path) -> None:
    env, cache = built
    report = tmp_path / "report.json"
    args = ("--check", "--execute", "--cache-dir", str(cache), "--report", str(report))
    done = run_aot(MODULE, *args, *LIMITS, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "execute gfx942: 3 kernels run on the emulator" in done.stdout
    assert "3 match torch, 0 FAILED, 0 unreachable" in done.stdout
    records = json.loads(report.read_text())["executed"]["gfx942"]
    functions = sorted(r["function"] for r in records)
    assert functions == ["gemm_a16w16", "gemm_a16w16", "gemm_a16w16_splitk_reduce"]
    assert all(r["reached"] and r["cache"] == "hit" and r["checks"] for r in records)
    assert all(r["rows"] == [f"{env['AITER_CONFIG_DIR']}/{A16W16.name}:2"] for r in records)
    # the audit's copy of the cache added nothing to the cache
    assert sorted(p.name for p in cache.rglob("*.pkl")) == sorted(
        r["target"].split("/")[1] for r in records
    )


@pytest.mark.slow
def test_an_entry_holding_the_wrong_code_fails_the_audit(built, tmp_path) -> None:
    env, cache = built
    broken = tmp_path / "cache"
    shutil.copytree(cache, broken, ignore=shutil.ignore_patterns("aiter_aot_manifest.json*"))
    report = tmp_path / "report.json"
    check = ("--check", "--cache-dir", str(broken), "--report", str(report), *LIMITS)
    assert run_aot(MODULE, *check, env=env).returncode == 0
    kernels = {
        k["params"]: k
        for r in json.loads(report.read_text())["archs"][0]["results"]
        for s in r["segments"]
        for k in s["kernels"]
        if k["function"] == "gemm_a16w16"
    }
    (target,) = [k for p, k in kernels.items() if "split_k=1" in p]
    (donor,) = [k for p, k in kernels.items() if "split_k=2" in p]
    target_file = broken / target["cache_dir"].rsplit("/", 1)[1] / target["file"]
    donor_file = broken / donor["cache_dir"].rsplit("/", 1)[1] / donor["file"]
    shutil.copyfile(donor_file, target_file)

    done = run_aot(MODULE, *check, "--execute", env=env)
    assert done.returncode == 1, done.stdout[-3000:]
    failed = [line for line in done.stdout.splitlines() if line.strip().startswith("FAILED")]
    assert len(failed) == 1, done.stdout[-3000:]
    assert target["file"] in failed[0] and f"{A16W16.name}:2" in failed[0], failed[0]
