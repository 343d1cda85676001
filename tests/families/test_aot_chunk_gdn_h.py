"""The chunk_gdn_h replay end to end: a small table is listed, built for gfx942 and gfx1250,
audited densely and served from at random batch shapes, dense and varlen, as a user would run
`python -m aiter.aot.flydsl.chunk_gdn_h`; a changed rule in the runtime is followed with no
edit of the AOT module.
"""

from __future__ import annotations

import random
import shutil
import textwrap
from pathlib import Path

import pytest

from aiter.ops.chunk_gdn_h import plan
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from tests.aot_cli import (
    lines_starting,
    manifest_entries,
    observed_calls_script,
    replay_reports,
    result_of,
    serve_from_cache,
    serve_with_fallback,
)

pytestmark = pytest.mark.slow  # builds a chunk_gdn_h cache

MODULE = "aiter.aot.flydsl.chunk_gdn_h"
ARCHS = {"gfx942": 304, "gfx1250": 256}
# 32 value heads, V = 128: on 304 CUs the rule's BV is 16 up to 2 sequences, 32 for 3 and 4,
# 64 from 5; the tuned row at N = 4 (up to 2048 tokens) says 16 instead.
LAYER = "torch.bfloat16,128,128,64,32,16"
ROWS = [
    f"gfx942,304,{LAYER},0,1,0,1,1,1,4096,8,64,",
    f"gfx942,304,{LAYER},1,1,0,0,1,1,4096,8,64,",
    f"gfx942,304,{LAYER},0,1,0,1,1,1,2048,4,16,3.5",
    f"gfx1250,256,{LAYER},1,1,0,0,1,1,4096,8,64,",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / CHUNK_GDN_H.name).write_text("\n".join([",".join(CHUNK_GDN_H.header), *ROWS]) + "\n")
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": ",".join(ARCHS)}
    return env, tmp_path_factory.mktemp("chunk_gdn_h")


def _replay(env, report: Path, *args: str):
    return replay_reports(MODULE, env, report, *args)


@pytest.fixture(scope="module")
def listing(setup):
    env, work = setup
    proc, reports = _replay(env, work / "list.json", "--list", "--cache-dir", str(work / "c0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return reports


@pytest.fixture(scope="module")
def built(setup):
    env, work = setup
    cache = work / "cache"
    proc, reports = _replay(env, work / "build.json", "--cache-dir", str(cache), "-j", "2")
    return proc, reports, cache


def _block_vs(segment) -> set[str]:
    return {p for k in segment.kernels for p in k.params.split() if p.startswith("block_v=")}


DENSE_ROWS = {"4096": ":2", "2048": ":4"}  # the lines of the dense gfx942 rows


def _cells(report, row_tokens: str) -> set[tuple[tuple[int, int], tuple[int, int]]]:
    return {
        (tuple(r.job.cell["seqs"]), tuple(r.job.cell["tokens"]))
        for r in report.results
        if r.job.row.endswith(DENSE_ROWS[row_tokens])
    }


def _bv_at(report, seqs: int, tokens: int) -> set[str]:
    """The block_v the point standing for (seqs, tokens) names, among the jobs of the dense
    gfx942 layer's rows."""
    found = set()
    for r in report.results:
        if not r.job.row.endswith(tuple(DENSE_ROWS.values())):
            continue
        (n_lo, n_hi), (t_lo, t_hi) = r.job.cell["seqs"], r.job.cell["tokens"]
        if n_lo <= seqs <= n_hi and t_lo <= tokens <= t_hi:
            for seg in r.segments:
                found |= _block_vs(seg)
    return found


def test_the_points_stand_for_the_rules_runs_and_the_tabled_buckets(listing):
    report = listing["gfx942"]
    assert report.results and all(r.tag == "OK" for r in report.results)
    assert all(r.probes == 1 for r in report.results)
    # Each row stands for its own bucket; the layer's first row (N = 4, 2048 tokens) also for
    # every shape no row serves, up to the deployment's 32768 tokens: the rule's runs (it
    # switches at 3 and 5 sequences) and the tokens above each tabled N's largest T_flat.
    top = 32768
    assert _cells(report, "4096") == {((8, 8), (1, 4096))}
    assert _cells(report, "2048") == {
        ((1, 2), (1, top)),
        ((3, 3), (1, top)),
        ((4, 4), (1, 2048)),
        ((4, 4), (2049, top)),
        ((5, 7), (1, top)),
        ((8, 8), (4097, top)),
        ((9, top), (1, top)),
    }


def test_kernels_change_where_the_plan_says(listing):
    report = listing["gfx942"]
    # Along N at 4096 tokens: the rule's 16, 32 and 64, and N = 8's tuned 64.
    for n, bv in ((2, 16), (3, 32), (4, 32), (5, 64), (7, 64), (8, 64)):
        assert _bv_at(report, n, 4096) == {f"block_v={bv}"}, n
    # At N = 4 the tuned row's 16 serves up to its 2048 tokens, the rule's 32 above, up to the
    # deployment's maximum; above the table's N the rule's 64.
    assert _bv_at(report, 4, 2048) == {"block_v=16"}
    assert _bv_at(report, 4, 2049) == {"block_v=32"}
    assert _bv_at(report, 4, 32768) == {"block_v=32"}
    assert _bv_at(report, 8, 20000) == {"block_v=64"}
    assert _bv_at(report, 100, 30000) == {"block_v=64"}


def test_the_wmma_arch_names_its_own_kernels(listing):
    report = listing["gfx1250"]
    assert report.results and all(r.tag == "OK" for r in report.results)
    kernels = list(report.kernels().values())
    assert kernels and all("mma='wmma'" in k.params for k in kernels)


def test_a_changed_rule_in_the_runtime_is_followed(listing, setup, tmp_path):
    """Change the runtime (a sitecustomize every process imports), not the AOT module."""
    env, _ = setup
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import aiter.ops.chunk_gdn_h.plan as plan
        plan.GRID_FILL = 2
        """))
    changed = {**env, "PYTHONPATH": str(site), "GPU_ARCHS": "gfx942"}
    proc, reports = _replay(changed, tmp_path / "r.json", "--list", "--cache-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 2 x 304 work-groups wanted: BV 16 up to N = 4, 32 from 5 (64 would need 10); N = 8
    # keeps its tuned row's 64.
    after = reports["gfx942"]
    for n, bv in ((3, 16), (4, 16), (5, 32), (7, 32), (8, 64)):
        assert _bv_at(after, n, 4096) == {f"block_v={bv}"}, n


def test_build_and_the_dense_audit_pass(built, setup):
    proc, reports, cache = built
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(reports) == set(ARCHS)
    env, work = setup
    check, _ = _replay(
        env, work / "check.json", "--check", "--sample", "4", "--cache-dir", str(cache)
    )
    assert check.returncode == 0, check.stdout[-3000:]


SERVE = textwrap.dedent("""
    import random, sys, torch
    import aiter
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run, host_tensor
    arch, cu = sys.argv[1], int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]))
    served = 0
    with dry_run(arch, cu, bridge.MODE_COMPILE):
        e = lambda *s, d=torch.bfloat16: torch.empty(s, dtype=d, device="cuda")
        for case in range(int(sys.argv[4])):
            n = rng.randint(1, 8)
            varlen = arch == "gfx1250" or rng.random() < 0.5
            if varlen:
                cuts = sorted(rng.randint(0, 4096) for _ in range(n - 1))
                total = rng.randint(cuts[-1] if cuts else 0, 4096)
                cu_seqlens = host_tensor([0, *cuts, total], torch.int32)
                b, t = 1, total
            else:
                cu_seqlens, b, t = None, n, rng.randint(1, 4096 // n)
            h0 = None if varlen else e(n, 32, 128, 128, d=torch.float32)
            aiter.chunk_gated_delta_rule_fwd_h(
                e(b, t, 16, 128), e(b, t, 32, 128), e(b, t, 32, 128),
                g=e(b, t, 32, d=torch.float32), initial_state=h0, output_final_state=True,
                cu_seqlens=cu_seqlens)
            served += 1
    print("served", served)
    """)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_random_calls_are_served_from_the_cache_alone(built, setup, tmp_path, arch):
    _, _, cache = built
    env, _ = setup
    args = [arch, str(ARCHS[arch]), str(random.Random(arch).randint(0, 999)), "40"]
    proc = serve_from_cache(SERVE, args, env, cache, tmp_path)
    assert proc.returncode == 0 and "served 40" in proc.stdout, proc.stderr[-3000:]


def test_an_empty_cache_misses(setup, tmp_path):
    env, _ = setup
    proc = serve_from_cache(SERVE, ["gfx942", "304", "1", "1"], env, tmp_path / "empty",
                            tmp_path)  # fmt: skip
    assert proc.returncode != 0
    assert "FLYDSL_RUNTIME_RUN_ONLY=1 but no usable AOT cache" in proc.stderr


def test_the_rule_the_rows_assume():
    assert [plan.grid_fill_block_v(n, 32, 128, 304) for n in range(1, 7)] == [
        16,
        16,
        32,
        32,
        64,
        64,
    ]


FALLBACK = observed_calls_script(
    "gfx942",
    304,
    """
    e = lambda *s, d=torch.bfloat16: torch.empty(s, dtype=d, device="cuda")
    for _ in range(2):  # 6 sequences of 500 tokens: the rule's BV 64
        aiter.chunk_gated_delta_rule_fwd_h(
            e(6, 500, 16, 128), e(6, 500, 32, 128), e(6, 500, 32, 128),
            g=e(6, 500, 32, d=torch.float32), initial_state=e(6, 32, 128, 128, d=torch.float32),
            output_final_state=True)
    """,
)


def test_the_fallback_serves_a_deleted_tile_width_with_another(built, setup, tmp_path):
    env, _ = setup
    cache = Path(shutil.copytree(built[2], tmp_path / "cache"))

    def dense_bv(width):
        return lambda e: f"block_v={width} " in e.params and "varlen=False" in e.params

    doomed = manifest_entries(cache, "gfx942", "chunk_gdn_h", dense_bv(64))
    assert doomed and manifest_entries(cache, "gfx942", "chunk_gdn_h", dense_bv(32))
    proc = serve_with_fallback(FALLBACK, env, cache, tmp_path, doomed)
    planned, used = "flydsl_chunk_gdn_h_mfma_k128_bv64", "flydsl_chunk_gdn_h_mfma_k128_bv32"
    assert lines_starting(proc.stderr, "LOG aiter.jit ") == [
        f"LOG aiter.jit WARNING chunk_gated_delta_rule_fwd_h: kernel {planned} is not in the "
        f"kernel cache; serving it with the cached equivalent {used} instead "
        "(AITER_AOT_FALLBACK=1: the same result, another V-tile width (the same arithmetic per "
        "value column))"
    ]
    records = result_of(proc)
    assert [kernel for kernel, _ in records] == [used, used]
    assert all(params["fallback_from"] == planned for _, params in records)


def test_a_miss_under_run_only_carries_the_monitors_message(setup, tmp_path):
    env, _ = setup
    proc = serve_from_cache(FALLBACK, [], env, tmp_path / "empty", tmp_path)
    assert proc.returncode != 0
    assert "chunk_gated_delta_rule_fwd_h" in proc.stderr and "block_v" in proc.stderr
    assert "python -m aiter.aot.flydsl" in proc.stderr, proc.stderr[-3000:]
