"""The conv3d replay end to end: a small bf16_tuned_conv3d table for two archs is listed, built,
audited and served from, as a user would run `python -m aiter.aot.flydsl.conv3d`.

The layer (32 -> 32 channels, 3x3x3, padding 1, 8x8 frames) is tabled at 8 and at 24 frames on
an 80-CU gfx942. Each row lends its kernel to the frame counts whose output positions are nearest
its own and within 4x (2..13 and 14..96); a row serves all of them with its own kernel, the
heuristic's tile and split-K at its own shape: split in two at 8 frames, not at 24.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from aiter.aot.flydsl.jobs.records import ArchReport, JobResult
from aiter.ops.conv3d.table import CONV3D
from tests.aot_cli import (
    lines_starting,
    manifest_entries,
    observed_calls_script,
    replay_reports,
    result_of,
    serve_from_cache,
    serve_with_fallback,
)

pytestmark = pytest.mark.slow  # builds a conv3d cache for two archs

MODULE = "aiter.aot.flydsl.conv3d"
ARCHS = {"gfx942": 80, "gfx1250": 256}


def _row(gfx: str, cu: int, **cells: str) -> str:
    row = dict.fromkeys(CONV3D.header, "")
    row.update(
        gfx=gfx, cu_num=str(cu), N="1", C="32", D="8", H="8", W="8", K="32", kT="3", kH="3",
        kW="3", stride_d="1", stride_h="1", stride_w="1", pad_d="1", pad_h="1", pad_w="1",
        dil_d="1", dil_h="1", dil_w="1", groups="1", bias="1", tile_m="0", tile_n="0",
        wave_m="0", wave_n="0", wgm="0", splitK="0",
    )  # fmt: skip
    row.update(cells)
    return ",".join(row[name] for name in CONV3D.header)


ROWS = [
    _row("gfx942", 80),
    _row("gfx942", 80, C="64", libtype="torch"),  # torch serves it: UNREACHED
    _row("gfx1250", 256),
    _row("gfx942", 80, D="24"),  # line 5: the same tile without split-K
]

EXTRA_ARGS = ()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / CONV3D.name).write_text("\n".join([",".join(CONV3D.header), *ROWS]) + "\n")
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": ";".join(ARCHS)}
    return env, tmp_path_factory.mktemp("conv3d")


def _replay(env, report: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    return replay_reports(MODULE, env, report, *EXTRA_ARGS, *args)


@pytest.fixture(scope="module")
def listing(setup):
    env, work = setup
    proc, reports = _replay(env, work / "list.json", "--list", "--cache-dir", str(work / "c0"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return reports


@pytest.fixture(scope="module")
def built(setup):
    env, work = setup
    cache = work / "cache"
    proc, reports = _replay(env, work / "build.json", "--cache-dir", str(cache), "-j", "2")
    return proc, reports, cache


def _jobs(report: ArchReport, line: int) -> list[JobResult]:
    return [r for r in report.results if r.job.row.endswith(f"/{CONV3D.name}:{line}")]


def test_each_dtype_and_layout_pair_is_a_job_over_the_borrowed_frames(listing):
    jobs = _jobs(listing["gfx942"], 2)
    # The entry takes bf16 and fp16; a row of the bf16 table serves both.
    assert sorted(r.job.variant for r in jobs) == sorted(
        f"dtype={d} input_layout={i} output_layout={o}"
        for d in ("bfloat16", "float16")
        for i in ("NCDHW", "NDHWC")
        for o in ("NCDHW", "NDHWC")
    )
    assert {(r.job.lo, r.job.hi) for r in jobs} == {(2, 13)}
    assert {(r.job.lo, r.job.hi) for r in _jobs(listing["gfx942"], 5)} == {(14, 96)}
    assert all(r.tag == "OK" for r in jobs), [r.message for r in jobs]


def test_a_row_serves_every_frame_it_lends_to_with_its_own_kernel(listing):
    for line, splits in ((2, True), (5, False)):
        for result in _jobs(listing["gfx942"], line):
            assert len(result.segments) == 1, [(s.lo, s.hi) for s in result.segments]
            functions = {k.function for k in result.kernels()}
            assert ("conv3d_splitk_epilogue" in functions) == splits
            pretranspose = "input_layout=NCDHW" in result.job.variant
            assert ("conv3d_pretranspose" in functions) == pretranspose


# A row with its own split-K, tabled at D=10: the frames it lends to (4..34, no other row of the
# layer) are served with that split too, not with one resolved for the call.
OWN_SPLIT_ROW = (
    "gfx942,304,1,256,10,60,88,256,3,3,3,1,1,1,0,1,1,1,1,1,32,1,32,64,2,2,4,2,,"
    "flydsl_conv3d_mfma_32x64_w2x2_g4,"
)


def test_a_rows_own_split_serves_every_frame_it_lends_to(setup, tmp_path):
    env, _ = setup
    table = tmp_path / "own.csv"
    table.write_text(",".join(CONV3D.header) + "\n" + OWN_SPLIT_ROW + "\n")
    args = ("--list", "--csv", f"conv3d={table}", "--cache-dir", str(tmp_path / "cache"))
    proc, reports = _replay({**env, "GPU_ARCHS": "gfx942"}, tmp_path / "r.json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = [r for r in reports["gfx942"].results if r.job.row.endswith("own.csv:2")]
    assert len(jobs) == 8  # 2 dtypes x 4 layout pairs
    for result in jobs:
        assert [(s.lo, s.hi) for s in result.segments] == [(4, 34)]
        [conv] = [k for k in result.kernels() if k.function == "conv3d_implicit"]
        assert "split_k=2 " in conv.params


def test_torch_rows_are_unreached_and_wmma_names_its_kernels(listing):
    assert [r.tag for r in _jobs(listing["gfx942"], 3)] == ["UNREACHED"] * 8
    report = listing["gfx1250"]
    convs = [k for k in report.kernels().values() if k.function == "conv3d_implicit"]
    assert convs and all("mma='wmma'" in k.params for k in convs)


def test_a_new_split_rule_in_the_runtime_is_followed(listing, setup, tmp_path):
    env, _ = setup
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import aiter.ops.conv3d.plan as rules
        rules.MAX_SPLIT_K = 1
        """))
    changed = {**env, "PYTHONPATH": str(site), "GPU_ARCHS": "gfx942"}
    proc, reports = _replay(changed, tmp_path / "r.json", "--list", "--cache-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for result in _jobs(reports["gfx942"], 2):
        # The 8-frame row's split in two is gone.
        assert [(s.lo, s.hi) for s in result.segments] == [(2, 13)]
        assert all(k.function != "conv3d_splitk_epilogue" for k in result.kernels())


def test_build_succeeds_and_passes_its_own_dense_audit(built, setup):
    proc, reports, cache = built
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env, work = setup
    check, _ = _replay(
        env, work / "check.json", "--check", "--sample", "32", "--cache-dir", str(cache)
    )
    assert check.returncode == 0, check.stdout[-3000:]


SERVE = textwrap.dedent("""
    import random, sys, torch
    import aiter
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    arch, cu = sys.argv[1], int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]))
    served = 0
    dtypes = {torch.bfloat16: 0, torch.float16: 0}
    with dry_run(arch, cu, bridge.MODE_COMPILE):
        for case in range(int(sys.argv[4])):
            dtype = rng.choice(list(dtypes))
            dtypes[dtype] += 1
            w = torch.empty((32, 32, 3, 3, 3), dtype=dtype, device="cuda")
            b = torch.empty((32,), dtype=dtype, device="cuda")
            frames = rng.randint(2, 32)
            layout_in, layout_out = rng.choice(["NCDHW", "NDHWC"]), rng.choice(["NCDHW", "NDHWC"])
            shape = (1, 32, frames, 8, 8) if layout_in == "NCDHW" else (1, frames, 8, 8, 32)
            x = torch.empty(shape, dtype=dtype, device="cuda")
            aiter.conv3d(x, w, b, padding=1, input_layout=layout_in, output_layout=layout_out)
            served += 1
    print("served", served, "fp16", dtypes[torch.float16])
    """)


def _serve(env: dict, cache: Path, arch: str, seed: int, cases: int, tmp_path: Path):
    args = [arch, str(ARCHS[arch]), str(seed), str(cases)]
    return serve_from_cache(SERVE, args, env, cache, tmp_path)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_random_calls_are_served_from_the_cache_alone(built, setup, arch, tmp_path):
    _, _, cache = built
    env, _ = setup
    proc = _serve(env, cache, arch, seed=len(arch), cases=30, tmp_path=tmp_path)
    assert proc.returncode == 0 and "served 30" in proc.stdout, proc.stderr[-3000:]
    assert int(proc.stdout.split("fp16")[1]) >= 5  # fp16 calls are served too


def test_an_empty_cache_misses(setup, tmp_path):
    env, _ = setup
    proc = _serve(env, tmp_path / "empty", "gfx942", seed=1, cases=1, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "FLYDSL_RUNTIME_RUN_ONLY=1 but no usable AOT cache" in proc.stderr


FALLBACK = observed_calls_script(
    "gfx942",
    80,
    """
    w = torch.empty((32, 32, 3, 3, 3), dtype=torch.bfloat16, device="cuda")
    b = torch.empty((32,), dtype=torch.bfloat16, device="cuda")
    for _ in range(2):
        x = torch.empty((1, 8, 8, 8, 32), dtype=torch.bfloat16, device="cuda")
        aiter.conv3d(x, w, b, padding=1, input_layout="NDHWC", output_layout="NDHWC")
    """,
)


def _split_entries(cache: Path, split_k: int) -> list[Path]:
    """gfx942's conv kernel entries compiled for `split_k` (the epilogue's left in place)."""
    return manifest_entries(
        cache, "gfx942", "conv3d",
        lambda e: e.function == "conv3d_implicit" and f"split_k={split_k} " in e.params,
    )  # fmt: skip


def test_the_fallback_serves_a_deleted_split_with_its_cached_sibling(built, setup, tmp_path):
    env, _ = setup
    cache = Path(shutil.copytree(built[2], tmp_path / "cache"))
    split2 = _split_entries(cache, 2)
    assert split2 and _split_entries(cache, 1)  # the 8-frame row splits in two; the 24 does not
    proc = serve_with_fallback(FALLBACK, env, cache, tmp_path, split2)
    tile = "flydsl_conv3d_mfma_32x32_w2x2_g4"  # the heuristic tile at 8 and at 24 frames
    assert lines_starting(proc.stderr, "LOG aiter.jit ") == [
        f"LOG aiter.jit WARNING conv3d: kernel {tile} split_k=2 is not in the kernel cache; "
        f"serving it with the cached equivalent {tile} split_k=1 instead (AITER_AOT_FALLBACK=1: "
        "the same result, the K sum blocked differently)"
    ]
    records = result_of(proc)
    assert [kernel for kernel, _ in records] == [tile, tile]
    for _, params in records:
        assert params["split_k"] == 1 and params["fallback_from"] == f"{tile} split_k=2"
