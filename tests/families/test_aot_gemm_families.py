"""The GEMM replay across families: fp8 flavour per arch, rows no FlyDSL kernel can serve
(gfx1250 blockscale, K off the kernels' grid) reported UNREACHED, split-K buffers and runtime
rules followed with no AOT edit, and --csv TABLE=PATH.

Each test runs `python -m aiter.aot.flydsl.gemm` as a user would, over small tables in an
AITER_CONFIG_DIR, and reads the results from its `--report` JSON.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from aiter.aot.flydsl import gemm
from aiter.aot.flydsl.jobs.records import ArchReport, JobResult, KernelRef
from aiter.flydsl_bridge import manifest
from aiter.ops.gemm.table import (
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A16W16,
)
from tests.aot_cli import lines_starting, other_tables, read_report, run_aot

pytestmark = pytest.mark.slow  # runs the command line, which replays and compiles

MODULE = "aiter.aot.flydsl.gemm"
ARCHS = ("gfx942", "gfx950", "gfx1250")
MAX_M = 32768  # the default --max-m
FNUZ, FN, I8 = "torch.float8_e4m3fnuz", "torch.float8_e4m3fn", "torch.int8"
BF16_HEADER = ",".join(A16W16.header)
BPRE_HEADER = ",".join(A8W8_BPRESHUFFLE.header)
BLOCK_HEADER = ",".join(A8W8_BLOCKSCALE.header)
BPRE_ROWS = [
    # split-K 8 for M 1-128 and 4 from M 129 on: a switch inside the row's bucket
    f"gfx942,304,256,1280,8192,{FNUZ},flydsl,0,0,,flydsl_a8w8_bpreshuffle_mfma_128x64x128",
    f"gfx942,304,32,1024,1024,{I8},flydsl,0,1,,flydsl_a8w8_bpreshuffle_mfma_32x64x128",
    # torch serves M 1-8; above it the heuristic picks FlyDSL kernels
    f"gfx942,304,8,64,128,{FNUZ},torch,0,0,,",
    f"gfx950,256,64,7168,8192,{FN},flydsl,0,1,,flydsl_a8w8_bpreshuffle_mfma_64x128x128",
    f"gfx1250,256,16,1280,8192,{FN},flydsl,0,1,,flydsl_a8w8_bpreshuffle_wmma_16x64x128",
]
# K = 100 is no multiple of 32: torch serves the row though it names a FlyDSL kernel.
BF16_ROWS = [
    "gfx942,304,16,4096,100,0,torch.bfloat16,torch.bfloat16,flydsl,0,,flydsl_a16w16_mfma_16x64x32",
]
BLOCK_ROWS = [
    "gfx942,304,128,1536,7168,flydsl,0,0,,flydsl_a8w8_blockscale_mfma_128x64x128",
    "gfx950,256,16,7168,2048,flydsl,0,1,,flydsl_a8w8_blockscale_mfma_16x64x128",
    "gfx1250,256,64,1536,7168,flydsl,0,0,,",
]
OUT_VARIANTS = ["out_dtype=bfloat16", "out_dtype=float16"]
UNREACHED = "served by torch"


def write_tables(directory: Path, bpre=BPRE_ROWS, block=BLOCK_ROWS, bf16=BF16_ROWS) -> None:
    (directory / A16W16.name).write_text("\n".join([BF16_HEADER, *bf16]) + "\n")
    (directory / A8W8_BPRESHUFFLE.name).write_text("\n".join([BPRE_HEADER, *bpre]) + "\n")
    (directory / A8W8_BLOCKSCALE.name).write_text("\n".join([BLOCK_HEADER, *block]) + "\n")
    # Their own replays: tests/families/test_aot_gemm_blockscale_bpreshuffle.py, the MX
    # GEMMs' property test.
    for spec in other_tables(A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE):
        (directory / spec.name).write_text(",".join(spec.header) + "\n")


def replay(env: dict[str, str], report: Path, *args: str):
    """Run the GEMM module with `--report report`; the process and its ArchReports by arch."""
    proc = run_aot(MODULE, *args, "--report", str(report), env=env)
    reports = read_report(report) if report.is_file() else []
    return proc, {r.arch: r for r in reports}


def jobs_of(report: ArchReport, table: str, line: int) -> list[JobResult]:
    """The results of one table row, one per caller variant."""
    return [r for r in report.results if r.job.row.endswith(f"/{table}:{line}")]


def kernels_of(report: ArchReport, function: str) -> list[KernelRef]:
    return [k for k in report.kernels().values() if k.function == function]


def entry(kernel: KernelRef) -> str:
    """A kernel's cache entry relative to the cache root, the same in every cache."""
    return f"{Path(kernel.cache_dir).name}/{kernel.file}"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tables")
    write_tables(directory)
    return directory


@pytest.fixture(scope="module")
def env(tables):
    return {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": ";".join(ARCHS)}


@pytest.fixture(scope="module")
def listing(env, tmp_path_factory):
    work = tmp_path_factory.mktemp("list")
    return replay(env, work / "report.json", "--list", "--cache-dir", str(work / "cache"))


@pytest.fixture(scope="module")
def built(env, tmp_path_factory):
    work = tmp_path_factory.mktemp("build")
    cache = work / "cache"
    proc, reports = replay(env, work / "report.json", "--cache-dir", str(cache), "-j", "2")
    return proc, reports, cache


# --- what --list names ---


def test_list_replays_every_row_up_to_the_maximum(listing):
    proc, reports = listing
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(reports) == set(ARCHS)
    counts = {arch: [r.tag for r in report.results] for arch, report in reports.items()}
    assert counts == {
        # the K = 100 bf16 row; 3 bpreshuffle and 1 blockscale rows, two output dtypes each
        "gfx942": ["UNREACHED"] + ["OK"] * 8,
        "gfx950": ["OK"] * 4,
        "gfx1250": ["OK", "OK", "UNREACHED", "UNREACHED"],
    }
    # Each row is the only one of its shape: it serves M 1 up to the deployment's maximum.
    assert all((r.job.lo, r.job.hi) == (1, MAX_M) for a in reports.values() for r in a.results)
    for report in reports.values():
        for result in report.results:
            if result.tag in ("OK", "UNREACHED"):
                assert result.segments[0].lo == 1 and result.segments[-1].hi == MAX_M
                pairs = zip(result.segments, result.segments[1:], strict=False)
                assert all(a.hi + 1 == b.lo for a, b in pairs), result.segments


def test_fp8_flavour_follows_each_arch(listing):
    _, reports = listing
    for arch, flavour in (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn")):
        for function in ("gemm_a8w8_bpreshuffle", "gemm_a8w8_blockscale"):
            fp8 = [k for k in kernels_of(reports[arch], function) if "xq=int8" not in k.params]
            assert fp8, (arch, function)
            assert all(f"xq={flavour} wq={flavour} " in k.params for k in fp8), (arch, fp8)
            assert all("mma='mfma'" in k.params for k in fp8)
    wmma = kernels_of(reports["gfx1250"], "gemm_a8w8_bpreshuffle")
    assert wmma and all("xq=float8_e4m3fn " in k.params and "mma='wmma'" in k.params for k in wmma)


def test_int8_row_names_only_int8_kernels(listing):
    _, reports = listing
    jobs = jobs_of(reports["gfx942"], A8W8_BPRESHUFFLE.name, 3)
    kernels = [k for r in jobs for k in r.kernels()]
    assert kernels and all("xq=int8 wq=int8 " in k.params for k in kernels)
    others = [r for r in reports["gfx942"].results if r not in jobs]
    assert not [k for r in others for k in r.kernels() if "int8" in k.params]


def test_open_output_dtype_is_replayed_once_per_dtype(listing):
    _, reports = listing
    jobs = jobs_of(reports["gfx942"], A8W8_BPRESHUFFLE.name, 2)
    assert [r.job.variant for r in jobs] == OUT_VARIANTS
    for result in jobs:
        out = result.job.variant.removeprefix("out_dtype=")
        assert all(f" out={out} " in k.params for k in result.kernels()), result.job.variant
    a8w8 = [r for a in reports.values() for r in a.results if r.job.table != A16W16.name]
    assert all(r.job.variant in OUT_VARIANTS for r in a8w8)  # bf16 rows have no open choice


def test_torch_row_is_served_by_flydsl_above_it(listing):
    _, reports = listing
    for result in jobs_of(reports["gfx942"], A8W8_BPRESHUFFLE.name, 4):
        first, second = result.segments[:2]
        assert (first.lo, first.hi, first.kernels, first.backends) == (1, 8, [], ["torch"])
        assert second.lo == 9 and second.kernels and second.backends == ["flydsl"]
        assert result.tag == "OK"


def test_rows_no_flydsl_kernel_can_serve_are_unreached(listing):
    """gfx1250 has no blockscale kernel and no a16w16 kernel takes K = 100: torch serves every M
    of those rows, so they are UNREACHED (not SKIP, not FAIL) and name no kernel."""
    proc, reports = listing
    unreached = [r for a in reports.values() for r in a.results if r.tag == "UNREACHED"]
    assert [(r.job.arch, r.job.row.rsplit("/", 1)[1], r.job.variant) for r in unreached] == [
        ("gfx942", f"{A16W16.name}:2", ""),
        *(("gfx1250", f"{A8W8_BLOCKSCALE.name}:4", v) for v in OUT_VARIANTS),
    ]
    for result in unreached:
        assert result.message.startswith(UNREACHED) and not result.kernels()
        assert [(s.lo, s.hi, s.backends) for s in result.segments] == [(1, MAX_M, ["torch"])]
    lines = lines_starting(proc.stdout, "UNREACHED")
    assert len(lines) == 3 and all(UNREACHED in x for x in lines), proc.stdout
    assert f"          M 1-{MAX_M}: (no FlyDSL kernel: served by torch)" in proc.stdout
    assert not [r for a in reports.values() for r in a.results if r.tag in ("SKIP", "FAIL")]


def test_split_k_switch_inside_a_bucket_is_found_exactly(listing):
    _, reports = listing
    # N 1280 with tile_n 64 is 20 blocks per 128 rows on 304 CUs: up to M 128, 20 * 8 <= 304;
    # from M 129 on, 40 blocks allow only 4 splits.
    for result in jobs_of(reports["gfx942"], A8W8_BPRESHUFFLE.name, 2):
        first, second = result.segments[:2]
        assert (first.lo, first.hi, second.lo) == (1, 128, 129)
        (below,), (above,) = first.kernels, second.kernels
        assert " split_k=8 " in below.params and " split_k=4 " in above.params
        assert below.params.replace("split_k=8", "split_k=4") == above.params


def test_list_prints_every_job_with_its_segments(listing):
    proc, reports = listing
    jobs = [x for x in proc.stdout.splitlines() if x.split()[:1] in (["OK"], ["UNREACHED"])]
    assert len(jobs) == sum(len(r.results) for r in reports.values())
    segments = [x for x in proc.stdout.splitlines() if x.startswith("          M ")]
    assert len(segments) == sum(len(r.segments) for a in reports.values() for r in a.results)
    assert "          M 1-128: gemm_a8w8_bpreshuffle[" in proc.stdout
    assert "          M 1-8: (no FlyDSL kernel: served by torch)" in proc.stdout


# --- build, manifest, check ---


def test_build_compiles_every_named_kernel(built, listing):
    proc, reports, cache = built
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, named = listing
    for arch in ARCHS:
        report = reports[arch]
        assert [r.tag for r in report.results] == [r.tag for r in named[arch].results]
        assert {entry(k) for k in report.kernels().values()} == {
            entry(k) for k in named[arch].kernels().values()
        }
        assert all(c.ok for c in report.compiles), [c.error for c in report.compiles]
        assert report.compiled() == {str(p) for p in report.kernels()}
        assert all(Path(p).is_file() for p in report.kernels())
    assert lines_starting(proc.stdout, "FAIL") == []
    assert f"serve from it with: FLYDSL_RUNTIME_CACHE_DIR={cache} " in proc.stdout


def test_build_summary_counts_each_arch(built):
    proc, reports, cache = built
    document = json.loads((cache.parent / "report.json").read_text())
    assert (document["mode"], document["modules"]) == ("build", ["gemm"])
    rows = {row["arch"]: row for row in document["summary"]}
    assert set(rows) == set(ARCHS)
    for arch, row in rows.items():
        kernels = len(reports[arch].kernels())
        assert (row["module"], row["jobs"], row["FAIL"]) == ("gemm", len(reports[arch].results), 0)
        assert row["kernels"] == row["compiled"] == kernels and row["missing"] == 0
    assert (rows["gfx942"]["UNREACHED"], rows["gfx1250"]["UNREACHED"]) == (1, 2)
    printed = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    assert all(printed[arch][1] == "gemm" for arch in ARCHS), proc.stdout


def test_manifest_lists_every_kernel_and_who_asked(built):
    _, reports, cache = built
    built = manifest.read(cache)
    assert built.builds
    for arch in ARCHS:
        kernels = built.archs[arch]["gemm"]
        report = reports[arch]
        assert set(kernels) == {entry(k) for k in report.kernels().values()}
        for rel, record in kernels.items():
            assert (cache / rel).stat().st_size == record.size
            assert record.function in ("gemm_a8w8_bpreshuffle", "gemm_a8w8_blockscale")
            asked = record.requested_by
            assert asked and all(a.variant in OUT_VARIANTS for a in asked)
            assert all(a.module == "gemm" and a.axis == "M" for a in asked)
        rows = {a.row for record in kernels.values() for a in record.requested_by}
        assert rows == {r.job.row for r in report.results if r.tag == "OK"}


def test_check_passes_and_a_rebuild_is_up_to_date(built, env, tmp_path):
    _, _, cache = built
    proc, reports = replay(env, tmp_path / "check.json", "--check", "--cache-dir", str(cache))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(
        not r.missing and r.tag in ("OK", "UNREACHED") for a in reports.values() for r in a.results
    )
    assert not lines_starting(proc.stdout, "MISSING")
    again = run_aot(MODULE, "--cache-dir", str(cache), "-j", "2", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert lines_starting(again.stdout, "up to date: the fingerprint matches"), again.stderr
    assert "nothing replayed" in again.stdout


def test_check_of_an_empty_cache_names_every_kernel(listing, env, tmp_path):
    _, named = listing
    proc, reports = replay(
        env, tmp_path / "check.json", "--check", "--cache-dir", str(tmp_path / "empty")
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    missing = {
        arch: [m.kernel for r in a.results for m in r.missing] for arch, a in reports.items()
    }
    for arch in ARCHS:
        assert {entry(k) for k in missing[arch]} == {
            entry(k) for k in named[arch].kernels().values()
        }
        failed = [r for r in reports[arch].results if r.tag == "FAIL"]
        assert failed == [r for r in reports[arch].results if r.tag != "UNREACHED"]
        for result in failed:
            assert result.message.startswith(f"{len(result.missing)} kernel(s) missing from the")
    every = [k for kernels in missing.values() for k in kernels]
    assert {k.function for k in every} == {"gemm_a8w8_bpreshuffle", "gemm_a8w8_blockscale"}
    assert all("semaphore=" in k.params and "tile_m=" in k.params for k in every)
    lines = lines_starting(proc.stdout, "MISSING")
    assert len(lines) == len(every)
    assert {x.split(" arch=")[1].split()[0] for x in lines} == set(ARCHS)


# --- the runtime decides; the replay follows ---


def _with_sitecustomize(tmp_path: Path, env: dict[str, str], source: str) -> dict[str, str]:
    """Change the runtime, not the AOT module: a sitecustomize every process imports."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(source))
    return {**env, "PYTHONPATH": str(site), "GPU_ARCHS": "gfx942"}


def _split_k(report: ArchReport, split: int) -> list[KernelRef]:
    return [
        k for k in kernels_of(report, "gemm_a8w8_bpreshuffle") if f"split_k={split} " in k.params
    ]


def test_semaphore_dtype_changed_in_the_runtime_changes_the_kernels(listing, env, tmp_path):
    changed = _with_sitecustomize(
        tmp_path,
        env,
        """
        import torch
        import aiter.ops.gemm.entry as runtime
        runtime.SEMAPHORE_DTYPE = torch.int32
        """,
    )
    args = ("--list", "--cache-dir", str(tmp_path / "cache"))
    proc, reports = replay(changed, tmp_path / "r.json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    before, after = _split_k(listing[1]["gfx942"], 8), _split_k(reports["gfx942"], 8)
    assert before and all("semaphore=int64" in k.params for k in before)
    assert after and all("semaphore=int32" in k.params for k in after)
    assert len(after) == len(before)


def test_a_new_split_k_rule_in_the_runtime_is_followed(listing, env, tmp_path):
    changed = _with_sitecustomize(
        tmp_path,
        env,
        """
        import aiter.ops.gemm.plan as rules
        rules.MAX_SPLIT_K = 2
        """,
    )
    args = ("--list", "--cache-dir", str(tmp_path / "cache"))
    proc, reports = replay(changed, tmp_path / "r.json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _split_k(listing[1]["gfx942"], 8)
    assert not _split_k(reports["gfx942"], 8) and not _split_k(reports["gfx942"], 4)
    assert _split_k(reports["gfx942"], 2)
    # The row's bucket no longer switches at M 128: split 2 holds up to a larger M.
    first = jobs_of(reports["gfx942"], A8W8_BPRESHUFFLE.name, 2)[0].segments[0]
    assert first.lo == 1 and first.hi > 128


# --- --csv TABLE=PATH ---


@pytest.fixture(scope="module")
def empty_env(tmp_path_factory):
    """Empty default tables: only what --csv adds has rows."""
    directory = tmp_path_factory.mktemp("empty-tables")
    write_tables(directory, bpre=[], block=[], bf16=[])
    return {"AITER_CONFIG_DIR": str(directory)}


def _csv(tmp_path: Path, header: str, *rows: str, name: str = "mine.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize(
    "table, header, expected",
    [
        ("", BF16_HEADER, A16W16),
        ("", BPRE_HEADER, A8W8_BPRESHUFFLE),
        (A8W8_BPRESHUFFLE.short_name, BPRE_HEADER + ",tflops", A8W8_BPRESHUFFLE),
        (A8W8_BPRESHUFFLE.name, BPRE_HEADER + ",tflops", A8W8_BPRESHUFFLE),
        # blockscale's columns are a subset of bpreshuffle's: the name decides
        (A8W8_BLOCKSCALE.short_name, BPRE_HEADER, A8W8_BLOCKSCALE),
    ],
    ids=["bf16", "bpreshuffle", "short-name", "file-name", "name-decides"],
)
def test_csv_extends_the_named_table_or_the_one_with_its_columns(
    empty_env, tmp_path, table, header, expected
):
    path = _csv(tmp_path, header)
    item = f"{table}={path}" if table else str(path)
    proc = run_aot(MODULE, "--list", "--csv", item, env=empty_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--csv: {path} extend {expected.name}" in proc.stderr
    assert "nothing to do" in proc.stdout  # the file adds no rows


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a8w8_blockscale_tuned_gemm.csv", A8W8_BLOCKSCALE),
        ("dsv4_a8w8_blockscale_bpreshuffle_tuned_gemm.csv", A8W8_BLOCKSCALE_BPRESHUFFLE),
    ],
    ids=["blockscale", "blockscale-bpreshuffle"],
)
def test_bare_csv_of_blockscale_columns_goes_to_the_table_its_name_holds(
    empty_env, tmp_path, name, expected
):
    """The two blockscale tables have the same columns: aiter's file name tells them apart."""
    path = _csv(tmp_path, BLOCK_HEADER, name=name)
    proc = run_aot(MODULE, "--list", "--csv", str(path), env=empty_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--csv: {path} extend {expected.name}" in proc.stderr


CHOICES = [f"{s.short_name} ({s.name})" for s in gemm.FAMILY.tables]


@pytest.mark.parametrize(
    "header",
    ["gfx,cu_num,M,N,K,us", BLOCK_HEADER],
    ids=["fewer-columns", "two-tables-columns"],
)
def test_bare_csv_of_no_table_asks_for_its_name(empty_env, tmp_path, header):
    path = _csv(tmp_path, header)
    proc = run_aot(MODULE, "--list", "--csv", str(path), env=empty_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: --csv {path}: ")
    assert f"--csv TABLE={path}" in line
    assert all(choice in line for choice in CHOICES), line


BAD_CSV = {
    "directory": "is a directory, expected a CSV file",
    "missing": "no such file",
    "named-missing": "no such file",
    "unknown-table": "no table named 'nosuch'; tables: " + ", ".join(CHOICES),
    "lacking": "lacks gemm_a8w8_bpreshuffle's columns q_dtype_w",
    "no-path": "no path after '='; expected --csv gemm_a16w16=PATH",
}


@pytest.mark.parametrize("case", list(BAD_CSV))
def test_bad_csv_is_a_usage_error(empty_env, tmp_path, case):
    block = _csv(tmp_path, BLOCK_HEADER)
    item = {
        "directory": str(tmp_path),
        "missing": str(tmp_path / "nope.csv"),
        "named-missing": f"{A16W16.short_name}={tmp_path / 'nope.csv'}",
        "unknown-table": f"nosuch={block}",
        "lacking": f"{A8W8_BPRESHUFFLE.short_name}={block}",
        "no-path": f"{A16W16.short_name}=",
    }[case]
    proc = run_aot(MODULE, "--list", "--csv", item, env=empty_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: --csv ") and line.endswith(BAD_CSV[case]), line


def test_csv_rows_are_replayed_with_their_table(empty_env, tmp_path):
    bpre = _csv(
        tmp_path,
        BPRE_HEADER + ",tflops",
        f"gfx942,304,64,2048,4096,{FNUZ},flydsl,0,0,,flydsl_a8w8_bpreshuffle_mfma_64x128x128,95.5",
        name="tuned_today.csv",
    )
    bf16 = _csv(
        tmp_path,
        BF16_HEADER,
        "gfx942,304,32,4096,4096,0,torch.bfloat16,torch.bfloat16,flydsl,0,,"
        "flydsl_a16w16_mfma_32x64x64",
        name="bf16_today.csv",
    )
    proc, reports = replay(
        empty_env,
        tmp_path / "r.json",
        "--list", "--max-m", "128", "--cache-dir", str(tmp_path / "c"),
        "--csv", f"{A8W8_BPRESHUFFLE.short_name}={bpre}",
        "--csv", f"{A16W16.name}={bf16}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(reports) == {"gfx942"}  # the arch of the added rows
    results = reports["gfx942"].results
    assert [(r.job.table, r.job.row, r.job.variant, r.tag) for r in results] == [
        (A16W16.name, f"{bf16}:2", "", "OK"),
        (A8W8_BPRESHUFFLE.name, f"{bpre}:2", OUT_VARIANTS[0], "OK"),
        (A8W8_BPRESHUFFLE.name, f"{bpre}:2", OUT_VARIANTS[1], "OK"),
    ]
    assert all((r.job.lo, r.job.hi) == (1, 128) for r in results)
    bf16_kernels = {k.function for k in results[0].kernels()}
    assert "gemm_a16w16" in bf16_kernels and all(f.startswith("gemm_a16w16") for f in bf16_kernels)
    for result in results[1:]:
        first = result.segments[0]
        assert (first.lo, first.hi) == (1, 64)
        (kernel,) = first.kernels
        assert kernel.function == "gemm_a8w8_bpreshuffle"
        assert "tile_m=64 tile_n=128 tile_k=128" in kernel.params  # the row's kernelName
