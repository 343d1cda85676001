"""The GEMM replay across families: fp8 flavour per arch, gfx1250 declines, split-K buffers
and runtime rules followed with no AOT edit, and --csv told by columns or name.

Each test runs `python -m aiter.aot.flydsl.gemm` as a user would, over small tables in an
AITER_CONFIG_DIR, so only a handful of kernels compile.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.aot_cli import lines_starting, run_aot

MODULE = "aiter.aot.flydsl.gemm"
FNUZ, FN, I8 = "torch.float8_e4m3fnuz", "torch.float8_e4m3fn", "torch.int8"
BF16_HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,libtype,splitK,us,kernelName"
BPRE_HEADER = "gfx,cu_num,M,N,K,q_dtype_w,libtype,kernelId,splitK,us,kernelName"
BLOCK_HEADER = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName"
BPRE_ROWS = [
    # split-K 8 for M 1-128 and 4 for M 129-256: a switch inside the bucket
    f"gfx942,304,256,1280,8192,{FNUZ},flydsl,0,0,,flydsl_a8w8_bpreshuffle_mfma_128x64x128",
    f"gfx942,304,32,1024,1024,{I8},flydsl,0,1,,flydsl_a8w8_bpreshuffle_mfma_32x64x128",
    f"gfx942,304,8,64,128,{FNUZ},torch,0,0,,",
    f"gfx950,256,64,7168,8192,{FN},flydsl,0,1,,flydsl_a8w8_bpreshuffle_mfma_64x128x128",
    f"gfx1250,256,16,1280,8192,{FN},flydsl,0,1,,flydsl_a8w8_bpreshuffle_wmma_16x64x128",
]
BLOCK_ROWS = [
    "gfx942,304,128,1536,7168,flydsl,0,0,,flydsl_a8w8_blockscale_mfma_128x64x128",
    "gfx950,256,16,7168,2048,flydsl,0,1,,flydsl_a8w8_blockscale_mfma_16x64x128",
    "gfx1250,256,64,1536,7168,flydsl,0,0,,",
]


def write_tables(directory, bpre=BPRE_ROWS, block=BLOCK_ROWS) -> None:
    (directory / "bf16_tuned_gemm.csv").write_text(BF16_HEADER + "\n")
    bpre_text = "\n".join([BPRE_HEADER, *bpre]) + "\n"
    (directory / "a8w8_bpreshuffle_tuned_gemm.csv").write_text(bpre_text)
    block_text = "\n".join([BLOCK_HEADER, *block]) + "\n"
    (directory / "a8w8_blockscale_tuned_gemm.csv").write_text(block_text)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tables")
    write_tables(directory)
    return directory


@pytest.fixture(scope="module")
def env(tables):
    return {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": "gfx942;gfx950;gfx1250"}


@pytest.fixture(scope="module")
def listing(env, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return run_aot(MODULE, "--list", "--cache-dir", str(cache), env=env)


@pytest.fixture(scope="module")
def built(env, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return run_aot(MODULE, "--cache-dir", str(cache), "-j", "2", env=env), cache


def _kernel_lines(stdout: str, arch: str, function: str) -> list[str]:
    out, current = [], None
    for line in stdout.splitlines():
        job = re.match(r"^\w+\s+gemm (gfx\d+):", line)
        if job:
            current = job.group(1)
        elif current == arch:
            out += re.findall(rf"{function}\[[^\]]*\]", line)
    return out


def test_fp8_flavour_follows_each_arch(listing):
    assert listing.returncode == 0, listing.stdout + listing.stderr
    for arch, flavour in (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn")):
        for function in ("gemm_a8w8_bpreshuffle", "gemm_a8w8_blockscale"):
            fp8 = [k for k in _kernel_lines(listing.stdout, arch, function) if "int8" not in k]
            assert fp8, (arch, function)
            assert all(f"xq={flavour} wq={flavour} " in k for k in fp8), (arch, fp8)
    wmma = _kernel_lines(listing.stdout, "gfx1250", "gemm_a8w8_bpreshuffle")
    assert wmma and all("xq=float8_e4m3fn " in k and "mma='wmma'" in k for k in wmma)


def test_int8_row_compiles_an_int8_kernel(listing):
    kernels = _kernel_lines(listing.stdout, "gfx942", "gemm_a8w8_bpreshuffle")
    assert len([k for k in kernels if "xq=int8" in k]) == 2  # out=bfloat16 and out=float16


def test_open_output_dtype_is_replayed_once_per_dtype(listing):
    jobs = [x for x in listing.stdout.splitlines() if "a8w8_bpreshuffle_tuned_gemm.csv:2 " in x]
    assert [j.split()[-1] for j in jobs] == ["out=bfloat16", "out=float16"]


def test_gfx1250_blockscale_is_skipped_with_the_reason(listing):
    skip = lines_starting(listing.stdout, "SKIP")
    assert len(skip) == 2, listing.stdout  # one per output dtype
    assert all("a8w8_blockscale_tuned_gemm.csv:4" in x for x in skip)
    assert all("gemm_a8w8_blockscale has no FlyDSL kernel for gfx1250" in x for x in skip)


def test_split_k_switch_inside_a_bucket_is_found(listing):
    out = listing.stdout
    assert re.search(r"M 1-128: gemm_a8w8_bpreshuffle\[[^\]]*split_k=8", out), out
    assert re.search(r"M 129-256: gemm_a8w8_bpreshuffle\[[^\]]*split_k=4", out), out


def test_build_then_check_then_empty_check(built, env, tmp_path):
    proc, cache = built
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arch in ("gfx942", "gfx950", "gfx1250"):
        assert lines_starting(proc.stdout, f"summary {arch}:"), proc.stdout
    assert " 0 FAIL" in lines_starting(proc.stdout, "summary gfx1250:")[0]
    check = run_aot(MODULE, "--check", "--cache-dir", str(cache), env=env)
    assert check.returncode == 0, check.stdout
    empty = run_aot(MODULE, "--check", "--cache-dir", str(tmp_path / "empty"), env=env)
    assert empty.returncode == 1
    missing = lines_starting(empty.stdout, "MISSING")
    named = {re.search(r"kernel=(\S+)", x).group(1).split("/")[0] for x in missing}
    assert named == {"gemm_a8w8_bpreshuffle", "gemm_a8w8_blockscale"}
    archs = {re.search(r"arch=(\S+)", x).group(1) for x in missing}
    assert archs == {"gfx942", "gfx950", "gfx1250"}
    assert all("semaphore=" in x and "tile_m=" in x for x in missing)


def _with_sitecustomize(tmp_path, env, source: str) -> dict[str, str]:
    """Change the runtime, not the AOT module: a sitecustomize every process imports."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(source))
    return {**env, "PYTHONPATH": str(site)}


def _split8(stdout: str) -> list[str]:
    kernels = _kernel_lines(stdout, "gfx942", "gemm_a8w8_bpreshuffle")
    return [k for k in kernels if "split_k=8" in k]


def test_semaphore_dtype_changed_in_the_runtime_changes_the_kernels(listing, env, tmp_path):
    changed = _with_sitecustomize(
        tmp_path,
        env,
        """
        import torch
        import aiter.ops.gemm_a8w8 as runtime
        runtime.SEMAPHORE_DTYPE = torch.int32
        """,
    )
    proc = run_aot(MODULE, "--list", "--cache-dir", str(tmp_path / "c"), env=changed)
    assert proc.returncode == 0, proc.stderr
    before, after = _split8(listing.stdout), _split8(proc.stdout)
    assert before and all("semaphore=int64" in k for k in before)
    assert after and all("semaphore=int32" in k for k in after)


def test_a_new_split_k_rule_in_the_runtime_is_followed(listing, env, tmp_path):
    changed = _with_sitecustomize(
        tmp_path,
        env,
        """
        import aiter.ops.gemm_config as rules
        rules.MAX_SPLIT_K = 2
        """,
    )
    proc = run_aot(MODULE, "--list", "--cache-dir", str(tmp_path / "c"), env=changed)
    assert proc.returncode == 0, proc.stderr
    assert "split_k=8" in listing.stdout
    assert "split_k=8" not in proc.stdout and "split_k=4" not in proc.stdout
    assert "split_k=2" in proc.stdout


def test_arch_process_refuses_a_process_answering_another_arch(env, tmp_path):
    proc = run_aot(
        "aiter.aot.flydsl.replay",
        "--arch-process", "--family", MODULE, "--arch", "gfx950", "--mode", "list",
        "--workers", "1", "--result", str(tmp_path / "r.json"),
        env={**env, "ARCH": "gfx942", "FLYDSL_GPU_ARCH": "gfx942"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert "replay process for gfx950 finds FlyDSL targeting gfx942" in proc.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "name, header, table",
    [
        ("mine.csv", BF16_HEADER, "bf16_tuned_gemm.csv"),
        ("my_bpreshuffle.csv", BPRE_HEADER + ",tflops", "a8w8_bpreshuffle_tuned_gemm.csv"),
        ("mine.csv", BPRE_HEADER, "a8w8_bpreshuffle_tuned_gemm.csv"),  # exact columns
        ("my_blockscale.csv", BLOCK_HEADER, "a8w8_blockscale_tuned_gemm.csv"),
        # blockscale's columns are a subset of bpreshuffle's: the name decides
        ("extra_a8w8_blockscale_tuned_gemm.csv", BPRE_HEADER, "a8w8_blockscale_tuned_gemm.csv"),
    ],
)
def test_csv_is_told_by_columns_or_name(env, tmp_path, name, header, table):
    path = tmp_path / name
    path.write_text(header + "\n")
    one_arch = {**env, "GPU_ARCHS": "gfx942"}
    args = ("--list", "--csv", str(path), "--cache-dir", str(tmp_path / "c"))
    proc = run_aot(MODULE, *args, env=one_arch)
    assert proc.returncode == 0, proc.stderr
    assert f"--csv {path} extends {table}" in proc.stderr


@pytest.mark.parametrize(
    "header, why",
    [(BPRE_HEADER + ",tflops", "fits more than one of"), ("gfx,cu_num,M,N,K,us", "fits none of")],
)
def test_csv_that_is_neither_is_a_usage_error(env, tmp_path, header, why):
    path = tmp_path / "mine.csv"
    path.write_text(header + "\n")
    proc = run_aot(MODULE, "--list", "--csv", str(path), env=env)
    assert proc.returncode == 2
    assert why in proc.stderr and "name the file after its table" in proc.stderr
