"""End to end: build a small GEMM table for two archs, audit it, rebuild it, serve from it.

Runs `python -m aiter.aot.flydsl.gemm` as a user would, with AITER_CONFIG_DIR pointing at a
small table so the test compiles a handful of kernels rather than the whole default set.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from aiter.aot.flydsl.jobs.records import ArchReport
from aiter.flydsl_bridge import manifest
from aiter.ops.gemm.table import (
    A16W16,
)
from tests.aot_cli import REPO, lines_starting, other_tables, read_report, run_aot

pytestmark = pytest.mark.slow  # builds a cache for two archs

MODULE = "aiter.aot.flydsl.gemm"
BF16, FP16, FP32 = "torch.bfloat16", "torch.float16", "torch.float32"
HEADER = ",".join(A16W16.header)
ROWS = [
    # split-K from the heuristic: 4 for M 17-32
    f"gfx942,304,32,4096,4096,0,{BF16},{BF16},flydsl,0,,flydsl_a16w16_mfma_32x64x64",
    # split-K 8 for M 1-128, 4 for M 129-256: a switch inside the bucket
    f"gfx942,304,256,1280,5120,1,{BF16},{FP32},flydsl,0,,flydsl_a16w16_mfma_128x64x64",
    f"gfx942,304,8,64,64,0,{BF16},{BF16},torch,0,,",
    f"gfx1250,256,64,4096,4096,0,{FP16},{FP16},flydsl,1,,flydsl_a16w16_wmma_64x64x64",
    f"gfx1250,256,512,4096,4096,1,{BF16},{BF16},flydsl,0,,flydsl_a16w16_wmma_128x128x64",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / A16W16.name).write_text("\n".join([HEADER, *ROWS]) + "\n")
    # The other GEMM tables exist and are empty: this test is about the bf16 family.
    for spec in other_tables(A16W16):
        (tables / spec.name).write_text(",".join(spec.header) + "\n")
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": "gfx942;gfx1250"}
    return env, tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def build(setup):
    env, cache = setup
    report = cache.parent / "build-report.json"
    proc = run_aot(MODULE, "--cache-dir", str(cache), "-j", "2", "--report", str(report), env=env)
    return proc, read_report(report) if report.is_file() else []


@pytest.fixture(scope="module")
def listing(setup, tmp_path_factory):
    env, cache = setup
    report = tmp_path_factory.mktemp("list") / "report.json"
    proc = run_aot(MODULE, "--list", "--cache-dir", str(cache), "--report", str(report), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_report(report)


def _by_arch(reports: list[ArchReport]) -> dict[str, ArchReport]:
    return {r.arch: r for r in reports}


def test_build_succeeds_for_both_archs(build):
    proc, reports = build
    assert proc.returncode == 0, proc.stdout + proc.stderr
    archs = _by_arch(reports)
    # The torch row serves M 1-8; above it, up to the deployment's maximum, FlyDSL does.
    assert [r.tag for r in archs["gfx942"].results] == ["OK", "OK", "OK"]
    assert [r.tag for r in archs["gfx1250"].results] == ["OK", "OK"]
    assert all(not r.missing for a in reports for r in a.results)
    assert "serve from it with: FLYDSL_RUNTIME_CACHE_DIR=" in proc.stdout


def test_top_rows_cover_the_deployment_maximum(listing):
    for report in listing:
        for result in report.results:
            assert result.job.hi == 32768, result.job
    torch_row = next(r for r in _by_arch(listing)["gfx942"].results if r.job.row.endswith(":4"))
    first = torch_row.segments[0]
    assert (first.lo, first.hi, first.kernels, first.backends) == (1, 8, [], ["torch"])
    assert torch_row.segments[1].lo == 9 and torch_row.segments[1].kernels


def test_list_shows_the_switch_inside_a_bucket(listing):
    row = next(r for r in _by_arch(listing)["gfx942"].results if r.job.row.endswith(":3"))
    splits = [(s.lo, s.hi, _param(s.kernels[0], "split_k")) for s in row.segments[:2]]
    # Past the row's M (256) the heuristic serves, with its own 256-row tile.
    assert splits == [(1, 128, "8"), (129, 256, "4")]
    mmas = {_param(k, "mma") for a in listing for r in a.results for k in r.kernels()} - {None}
    assert mmas == {"'mfma'", "'wmma'"}


def _param(kernel, name: str) -> str | None:
    return dict(p.split("=", 1) for p in kernel.params.split()).get(name)


def test_check_passes_after_the_build(build, setup):
    env, cache = setup
    proc = run_aot(MODULE, "--check", "--cache-dir", str(cache), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not lines_starting(proc.stdout, "MISSING")


def test_check_on_an_empty_cache_names_every_missing_kernel(setup, listing, tmp_path):
    env, _ = setup
    proc = run_aot(MODULE, "--check", "--cache-dir", str(tmp_path / "empty"), env=env)
    assert proc.returncode == 1
    missing = lines_starting(proc.stdout, "MISSING")
    named = set()
    for line in missing:
        fields = dict(re.findall(r"(\w+)=(\S+)", line.split(" params: ")[0]))
        assert set(fields) == {"module", "row", "M", "arch", "kernel"}, line
        assert "tile_m=" in line or "split_k=" in line, line
        named.add((fields["arch"], fields["kernel"].split("/")[0]))
    expected = {(a.arch, k.function) for a in listing for r in a.results for k in r.kernels()}
    assert named == expected
    assert ("gfx942", "gemm_a16w16_splitk_reduce") in named
    assert ("gfx1250", "gemm_a16w16") in named


def test_rebuild_over_a_complete_cache_replays_nothing(build, setup):
    env, cache = setup
    proc = run_aot(MODULE, "--cache-dir", str(cache), env=env)
    assert proc.returncode == 0
    assert proc.stdout.startswith("up to date:"), proc.stdout + proc.stderr


def test_forced_rebuild_compiles_nothing(build, setup, tmp_path):
    env, cache = setup
    report = tmp_path / "report.json"
    proc = run_aot(MODULE, "--no-memo", "--cache-dir", str(cache), "--report", str(report), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(not a.compiled() for a in read_report(report))


def test_manifest_records_both_archs_and_who_asked(build, setup):
    _, cache = setup
    built = manifest.read(cache)
    assert set(built.archs) == {"gfx942", "gfx1250"}
    assert set(built.versions) == {"aiter", "flydsl", "torch"}
    for modules in built.archs.values():
        for rel, entry in modules["gemm"].items():
            assert (cache / rel).stat().st_size == entry.size
            asked = entry.requested_by[0]
            assert asked.module == "gemm" and asked.axis == "M"
            assert re.fullmatch(r".*bf16_tuned_gemm\.csv:\d+", asked.row)


SERVE = textwrap.dedent("""
    import sys, torch
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.gemm.entry import gemm_a16w16
    m, n, k = (int(v) for v in sys.argv[1:4])
    with dry_run("gfx942", 304, bridge.MODE_COMPILE):
        a = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
        b = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")
        bias = torch.empty((n,), dtype=torch.float32, device="cuda")
        gemm_a16w16(a, b, bias, out_dtype=torch.float32)
    print("served")
    """)


@pytest.mark.parametrize("m", [1, 100, 129, 256, 3000, 20000])
def test_runtime_calls_in_a_bucket_are_served_from_the_cache_alone(build, setup, m, tmp_path):
    """FLYDSL_RUNTIME_RUN_ONLY=1 makes FlyDSL raise on any miss: the replay built what it asks."""
    env, cache = setup
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    run_env = {**env, "FLYDSL_RUNTIME_CACHE_DIR": str(cache), "FLYDSL_RUNTIME_RUN_ONLY": "1"}
    proc = _run_script(script, [str(m), "1280", "5120"], run_env)
    assert proc.returncode == 0 and "served" in proc.stdout, proc.stderr[-2000:]


def test_a_shape_the_tables_do_not_hold_misses_the_cache(build, setup, tmp_path):
    env, cache = setup
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    run_env = {**env, "FLYDSL_RUNTIME_CACHE_DIR": str(cache), "FLYDSL_RUNTIME_RUN_ONLY": "1"}
    proc = _run_script(script, ["64", "2560", "5120"], run_env)
    assert proc.returncode != 0
    assert "FLYDSL_RUNTIME_RUN_ONLY=1 but no usable AOT cache" in proc.stderr


def _run_script(script, args, env):
    import os
    import subprocess
    import sys

    full = {**os.environ, **env, "PYTHONPATH": str(REPO), "FLYDSL_GPU_ARCH": "gfx942"}
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
