"""The fp8 attention replay end to end: a small fmha_fp8_shapes table is listed, built, audited
densely and served from at random (batch, query length, key length), dense and varlen, as a user
would run `python -m aiter.aot.flydsl.fmha_fp8`.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from aiter.aot.flydsl.jobs.records import ArchReport
from aiter.ops.fmha_fp8.table import FMHA_FP8
from tests.aot_cli import (
    lines_starting,
    manifest_entries,
    observed_calls_script,
    replay_reports,
    result_of,
    serve_from_cache,
    serve_with_fallback,
)

pytestmark = pytest.mark.slow  # builds an attention cache

MODULE = "aiter.aot.flydsl.fmha_fp8"
ROWS = [
    "gfx942,304,8,1,128,128,dense,1,4,1024,test",
    "gfx942,304,8,1,128,128,varlen,1,4,1024,test",
]

EXTRA_ARGS = ()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / FMHA_FP8.name).write_text("\n".join([",".join(FMHA_FP8.header), *ROWS]) + "\n")
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": "gfx942"}
    return env, tmp_path_factory.mktemp("fmha")


def _replay(env, report: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    return replay_reports(MODULE, env, report, *EXTRA_ARGS, *args)


@pytest.fixture(scope="module")
def listing(setup):
    env, work = setup
    proc, reports = _replay(env, work / "list.json", "--list", "--cache-dir", str(work / "c0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return reports["gfx942"]


@pytest.fixture(scope="module")
def built(setup):
    env, work = setup
    cache = work / "cache"
    proc, _ = _replay(env, work / "build.json", "--cache-dir", str(cache), "-j", "2")
    return proc, cache


def _point(result) -> tuple[int, int, int]:
    values = {**result.job.fixed, result.job.axis: result.job.lo}
    return values["batch"], values["seqlen_q"], values["seqlen_k"]


def _planned(report: ArchReport, layout_line: int = 2):
    return [
        r
        for r in report.results
        if "kv_splits=planned" in r.job.variant
        and "return_lse=false" in r.job.variant
        and r.job.row.endswith(f":{layout_line}")
    ]


def test_points_cover_every_region_of_the_one_axis_switches(listing):
    """Query runs split at the split gate (128) and the query block (257), key runs at the
    split gate (961 keys = 16 blocks of 64): six regions, each with its cell and two points."""
    planned = _planned(listing)
    cells = {
        (tuple(r.job.cell["seqlen_q"]), tuple(r.job.cell["seqlen_k"]))
        for r in planned
        if r.job.cell
    }
    assert cells == {
        (q, k) for q in ((1, 127), (128, 256), (257, 1024)) for k in ((1, 960), (961, 1024))
    }
    points = {_point(r) for r in planned}
    assert {(1, q, k) for q in (1, 128, 257) for k in (960, 1024)} <= points
    assert len(planned) == 12  # each region's largest and smallest split predicate
    assert all(r.probes == 1 for r in listing.results)
    assert all(r.tag == "OK" for r in listing.results), [r.message for r in listing.results][:3]


def test_kernels_change_between_regions(listing):
    at = {_point(r): r for r in _planned(listing)}
    params = {p: {k.params for k in at[p].segments[0].kernels} for p in at}
    assert params[(1, 128, 1024)] != params[(1, 257, 1024)]  # the query block
    functions = {p: {k.function for k in at[p].segments[0].kernels} for p in at}
    # 1 x 8 heads x 2 query blocks = 16 work-groups split; up to 4 batches they still do.
    assert len(functions[(1, 128, 1024)]) == 2  # forward and combine
    assert len(functions[(4, 256, 961)]) == 2
    assert len(functions[(1, 127, 1)]) == 1  # too few queries to split


def test_build_and_the_dense_audit_pass(built, setup):
    proc, cache = built
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env, work = setup
    check, _ = _replay(
        env, work / "check.json", "--check", "--sample", "6", "--cache-dir", str(cache)
    )
    assert check.returncode == 0, check.stdout[-3000:]


SERVE = textwrap.dedent("""
    import random, sys, torch
    import aiter
    from aiter import device
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    rng = random.Random(int(sys.argv[1]))
    served = 0
    with dry_run("gfx942", 304, bridge.MODE_COMPILE):
        fp8 = device.fp8_dtype()
        empty = lambda shape, dtype=fp8: torch.empty(shape, dtype=dtype, device="cuda")
        for case in range(int(sys.argv[2])):
            b, sq, sk = rng.randint(1, 4), rng.randint(1, 1024), rng.randint(1, 1024)
            lse = rng.random() < 0.5
            d = {n: empty((1,), torch.float32) for n in ("q_descale", "k_descale", "v_descale")}
            if rng.random() < 0.5:
                aiter.flash_attn_fp8(empty((b, sq, 8, 128)), empty((b, sk, 1, 128)),
                                     empty((b, sk, 1, 128)), return_lse=lse, **d)
            else:  # ragged: fewer rows than b * max lengths
                tq, tk = rng.randint(b, b * sq), rng.randint(b, b * sk)
                aiter.flash_attn_fp8(
                    empty((tq, 8, 128)), empty((tk, 1, 128)), empty((tk, 1, 128)),
                    cu_seqlens_q=empty((b + 1,), torch.int32),
                    cu_seqlens_kv=empty((b + 1,), torch.int32),
                    max_seqlen_q=sq, max_seqlen_kv=sk, return_lse=lse, **d)
            served += 1
    print("served", served)
    """)


def _serve(env: dict, cache: Path, seed: int, cases: int, tmp_path: Path):
    return serve_from_cache(SERVE, [str(seed), str(cases)], env, cache, tmp_path)


def test_random_calls_are_served_from_the_cache_alone(built, setup, tmp_path):
    _, cache = built
    env, _ = setup
    proc = _serve(env, cache, seed=7, cases=60, tmp_path=tmp_path)
    assert proc.returncode == 0 and "served 60" in proc.stdout, proc.stderr[-3000:]


def test_an_empty_cache_misses(setup, tmp_path):
    env, _ = setup
    proc = _serve(env, tmp_path / "empty", seed=1, cases=1, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "FLYDSL_RUNTIME_RUN_ONLY=1 but no usable AOT cache" in proc.stderr


FALLBACK = observed_calls_script(
    "gfx942",
    304,
    """
    empty = lambda shape, dtype=device.fp8_dtype(): torch.empty(shape, dtype=dtype, device="cuda")
    d = {n: empty((1,), torch.float32) for n in ("q_descale", "k_descale", "v_descale")}
    for _ in range(2):  # 512 queries: query block 128; 512 keys: lazy rescale, no split
        aiter.flash_attn_fp8(empty((1, 512, 8, 128)), empty((1, 512, 1, 128)),
                             empty((1, 512, 1, 128)), **d)
    """,
)


def test_the_fallback_serves_a_deleted_query_block_with_the_other(built, setup, tmp_path):
    env, _ = setup
    cache = Path(shutil.copytree(built[1], tmp_path / "cache"))
    block128 = manifest_entries(cache, "gfx942", "fmha_fp8", lambda e: "block_m=128 " in e.params)
    assert block128 and manifest_entries(
        cache, "gfx942", "fmha_fp8", lambda e: "block_m=64 " in e.params
    )
    proc = serve_with_fallback(FALLBACK, env, cache, tmp_path, block128)
    planned = "flydsl_fmha_fp8_mfma_bm128_d128x128_r6 splits=1"
    used = "flydsl_fmha_fp8_mfma_bm64_d128x128_r6"
    assert lines_starting(proc.stderr, "LOG aiter.jit ") == [
        f"LOG aiter.jit WARNING flash_attn_fp8: kernel {planned} is not in the kernel cache; "
        f"serving it with the cached equivalent {used} splits=1 instead (AITER_AOT_FALLBACK=1: "
        "the same result, the sums tiled, rescaled or split differently)"
    ]
    records = result_of(proc)
    assert [kernel for kernel, _ in records] == [used, used]
    assert all(params["fallback_from"] == planned for _, params in records)
