"""End to end: build a small GEMM table for two archs, audit it, rebuild it, serve from it.

Runs `python -m aiter.aot.flydsl.gemm` as a user would, with AITER_CONFIG_DIR pointing at a
small table so the test compiles a handful of kernels rather than the whole default set.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from tests.aot_cli import REPO, lines_starting, run_aot

MODULE = "aiter.aot.flydsl.gemm"
BF16, FP16, FP32 = "torch.bfloat16", "torch.float16", "torch.float32"
HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,libtype,splitK,us,kernelName"
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
    (tables / "bf16_tuned_gemm.csv").write_text("\n".join([HEADER, *ROWS]) + "\n")
    # The other GEMM tables exist and are empty: this test is about the bf16 family.
    (tables / "a8w8_bpreshuffle_tuned_gemm.csv").write_text(
        "gfx,cu_num,M,N,K,q_dtype_w,libtype,kernelId,splitK,us,kernelName\n"
    )
    (tables / "a8w8_blockscale_tuned_gemm.csv").write_text(
        "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName\n"
    )
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": "gfx942;gfx1250"}
    return env, tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def build(setup):
    env, cache = setup
    return run_aot(MODULE, "--cache-dir", str(cache), "-j", "2", env=env)


@pytest.fixture(scope="module")
def listing(setup):
    env, cache = setup
    return run_aot(MODULE, "--list", "--cache-dir", str(cache), env=env)


def _named_kernels(list_stdout: str) -> set[str]:
    """function[params] of every kernel --list names, per arch."""
    names, arch = set(), None
    for line in list_stdout.splitlines():
        job = re.match(r"^(OK|REFUSED)\s+gemm (gfx\d+):", line)
        if job:
            arch = job.group(2)
        seg = re.match(r"^\s+M \d+-\d+: (.*)$", line)
        if seg and seg.group(1):
            names |= {f"{arch} {k}" for k in re.findall(r"(\w+\[[^\]]*\])", seg.group(1))}
    return names


def test_build_succeeds_for_both_archs(build):
    assert build.returncode == 0, build.stdout + build.stderr
    assert lines_starting(
        build.stdout, "summary gfx942: 3 jobs: 2 OK, 0 SKIP, 0 REFUSED, 1 UNREACHED"
    )
    assert lines_starting(build.stdout, "summary gfx1250: 2 jobs: 2 OK, 0 SKIP")
    assert "serve from it with: FLYDSL_RUNTIME_CACHE_DIR=" in build.stdout


def test_list_shows_the_switch_inside_a_bucket(listing):
    assert listing.returncode == 0
    out = listing.stdout
    assert re.search(r"M 1-128: gemm_a16w16\[[^\]]*split_k=8", out), out
    assert re.search(r"M 129-256: gemm_a16w16\[[^\]]*split_k=4", out), out
    # WMMA kernels for gfx1250, MFMA for gfx942
    assert "mma='wmma'" in out and "mma='mfma'" in out


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
    expected = {
        tuple(k.split()[0:1]) + (k.split()[1].split("[")[0],)
        for k in _named_kernels(listing.stdout)
    }
    assert named == expected
    assert ("gfx942", "gemm_a16w16_splitk_reduce") in named
    assert ("gfx1250", "gemm_a16w16") in named


def test_rebuild_over_a_complete_cache_compiles_nothing(build, setup):
    env, cache = setup
    proc = run_aot(MODULE, "--cache-dir", str(cache), env=env)
    assert proc.returncode == 0
    for line in lines_starting(proc.stdout, "summary"):
        assert " 0 compiled, 0 missing" in line, line


def test_manifest_records_both_archs_and_who_asked(build, setup):
    _, cache = setup
    manifest = json.loads((cache / "aiter_aot_manifest.json").read_text())
    assert set(manifest["archs"]) == {"gfx942", "gfx1250"}
    assert set(manifest["versions"]) == {"aiter", "flydsl", "torch"}
    for modules in manifest["archs"].values():
        for rel, entry in modules["gemm"].items():
            assert (cache / rel).is_file()
            assert entry["requested_by"][0]["module"] == "gemm"
            assert entry["requested_by"][0]["row"].endswith(
                ".csv:" + entry["requested_by"][0]["row"].rsplit(":", 1)[1]
            )


SERVE = textwrap.dedent("""
    import sys, torch
    from aiter.aot.flydsl import hooks
    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.gemm_a16w16 import gemm_a16w16
    m, n, k = (int(v) for v in sys.argv[1:4])
    with dry_run("gfx942", 304, hooks.MODE_COMPILE):
        a = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
        b = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")
        bias = torch.empty((n,), dtype=torch.float32, device="cuda")
        gemm_a16w16(a, b, bias, out_dtype=torch.float32)
    print("served")
    """)


@pytest.mark.parametrize("m", [1, 100, 129, 256])
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
    proc = _run_script(script, ["3000", "1280", "5120"], run_env)
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
