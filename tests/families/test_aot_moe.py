"""The fused-MoE replay end to end: a small tuned_fmoe table for two archs is listed, built,
audited and served from, as a user would run `python -m aiter.aot.flydsl.moe`; gpt-oss-120b's
shards (inter_dim off the kernels' tiles) are built with --csv and served; a row the kernels
cannot serve is refused at load.

The shape (model_dim 2048, inter 256, 8 experts, top 2) makes the C++ planner switch its K split
at 305 tokens, inside the padded bucket of 512: the replay must find that without being told.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from aiter.aot.flydsl.jobs.records import ArchReport, JobResult
from aiter.ops.moe.table import FMOE
from tests.aot_cli import (
    lines_starting,
    manifest_entries,
    observed_calls_script,
    replay_reports,
    result_of,
    run_aot,
    serve_from_cache,
    serve_with_fallback,
)

pytestmark = pytest.mark.slow  # builds a MoE cache for two archs

MODULE = "aiter.aot.flydsl.moe"
ARCHS = {"gfx942": 304, "gfx1250": 256}
MAX_TOKENS = "512"
BF16 = "torch.bfloat16"


def _row(gfx: str, cu: int, token: int, act: str, doweight: int = 0) -> str:
    cells = dict.fromkeys(FMOE.header, "")
    cells.update(
        gfx=gfx, cu_num=str(cu), token=str(token), model_dim="2048", inter_dim="256",
        expert="8", topk="2", act_type=act, dtype=BF16, q_dtype_a=BF16, q_dtype_w=BF16,
        q_type="QuantType.No", use_g1u1="1", doweight_stage1=str(doweight), block_m="0",
        ksplit="0", run_1stage="0",
    )  # fmt: skip
    return ",".join(cells[name] for name in FMOE.header)


ROWS = [
    _row("gfx942", 304, 512, "ActivationType.Silu"),
    _row("gfx942", 304, 64, "ActivationType.Swiglu", doweight=1),
    _row("gfx1250", 256, 512, "ActivationType.Silu"),
]

EXTRA_ARGS = ("--max-tokens", MAX_TOKENS)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / FMOE.name).write_text("\n".join([",".join(FMOE.header), *ROWS]) + "\n")
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": ";".join(ARCHS)}
    return env, tmp_path_factory.mktemp("moe")


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


def _jobs(report: ArchReport, line: int, lo: int) -> list[JobResult]:
    return [
        r for r in report.results if r.job.row.endswith(f"/{FMOE.name}:{line}") and r.job.lo == lo
    ]


def _split_params(result: JobResult, token: int) -> set[str]:
    seg = next(s for s in result.segments if s.lo <= token <= s.hi)
    return {k.params for k in seg.kernels if k.function.startswith("moe_stage1")}


def test_every_padded_bucket_of_every_variant_is_a_job(listing):
    report = listing["gfx942"]
    # Tokens 1..512 fall in 10 padded buckets; 8 variants for silu, 16 with swiglu's biases.
    silu = [r for r in report.results if r.job.row.endswith(f"{FMOE.name}:2")]
    swiglu = [r for r in report.results if r.job.row.endswith(f"{FMOE.name}:3")]
    assert len(silu) + len(swiglu) == 10 * 8 + 10 * 16
    assert {(r.job.lo, r.job.hi) for r in silu} >= {(1, 1), (257, 512), (3, 4)}
    assert all(r.tag == "OK" for r in report.results), [r.message for r in report.results]


def test_the_k_split_switch_inside_a_bucket_is_found(listing):
    """moe_ksplit gives 2 up to 304 tokens and 1 above, all inside the bucket 257-512."""
    for result in _jobs(listing["gfx942"], 2, 257):
        bounds = [(s.lo, s.hi) for s in result.segments]
        assert (257, 304) in bounds and (305, 512) in bounds, bounds
        assert _split_params(result, 300) != _split_params(result, 400)
        below = {k.function for s in result.segments if s.hi <= 304 for k in s.kernels}
        above = {k.function for s in result.segments if s.lo >= 305 for k in s.kernels}
        assert "moe_stage1_activation" in below and "moe_stage1_activation" not in above


def test_wmma_arch_names_its_own_kernels(listing):
    report = listing["gfx1250"]
    assert report.results and all(r.tag == "OK" for r in report.results)
    gemms = [k for k in report.kernels().values() if k.function in ("moe_stage1", "moe_stage2")]
    assert gemms and all("mma='wmma'" in k.params for k in gemms), [k.params for k in gemms]


def test_a_new_block_size_rule_in_the_runtime_is_followed(listing, setup, tmp_path):
    """Change the runtime (a sitecustomize every process imports), not the AOT module."""
    env, _ = setup
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import aiter.ops.moe.host_planner as host
        host.moe_block_m = lambda tokens, topk, experts, inter, cu_num: 32 if tokens > 100 else 16
        """))
    changed = {**env, "PYTHONPATH": str(site), "GPU_ARCHS": "gfx942"}
    proc, reports = _replay(changed, tmp_path / "r.json", "--list", "--cache-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    before = {(s.lo, s.hi) for r in _jobs(listing["gfx942"], 2, 65) for s in r.segments}
    after = {(s.lo, s.hi) for r in _jobs(reports["gfx942"], 2, 65) for s in r.segments}
    assert (65, 100) in after and (65, 100) not in before


def test_build_succeeds_and_check_passes(built, setup):
    proc, reports, cache = built
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(reports) == set(ARCHS)
    env, work = setup
    check, _ = _replay(env, work / "check.json", "--check", "--cache-dir", str(cache))
    assert check.returncode == 0, check.stdout[-3000:]
    sampled, _ = _replay(
        env, work / "sample.json", "--check", "--sample", "5", "--cache-dir", str(cache)
    )
    assert sampled.returncode == 0, sampled.stdout[-3000:]


SERVE = textwrap.dedent("""
    import random, sys, torch
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.moe.entry import fused_moe
    arch, cu = sys.argv[1], int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]))
    empty = lambda shape, dtype: torch.empty(shape, dtype=dtype, device="cuda")
    served = 0
    with dry_run(arch, cu, bridge.MODE_COMPILE):
        for case in range(int(sys.argv[4])):
            tokens = rng.randint(1, 512)
            kw = {"gate_mode": rng.choice(["separated", "interleave"])}
            local = 8
            if rng.random() < 0.5:
                local = 1
                kw["expert_mask"] = empty((8,), torch.int32)
            if rng.random() < 0.5:
                kw["num_local_tokens"] = empty((1,), torch.int32)
            if arch == "gfx942" and rng.random() < 0.5:  # the swiglu row's layer
                kw.update(activation="swiglu", doweight_stage1=True)
                if rng.random() < 0.5:
                    kw["bias1"] = empty((local, 512), torch.float32)
                    kw["bias2"] = empty((local, 2048), torch.float32)
            fused_moe(
                empty((tokens, 2048), torch.bfloat16), empty((local, 512, 2048), torch.bfloat16),
                empty((local, 2048, 256), torch.bfloat16), empty((tokens, 2), torch.float32),
                empty((tokens, 2), torch.int32), **kw,
            )
            served += 1
    print("served", served)
    """)


def _serve(env: dict, cache: Path, arch: str, seed: int, cases: int, tmp_path: Path):
    args = [arch, str(ARCHS[arch]), str(seed), str(cases)]
    return serve_from_cache(SERVE, args, env, cache, tmp_path)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_random_calls_are_served_from_the_cache_alone(built, setup, arch, tmp_path):
    """FLYDSL_RUNTIME_RUN_ONLY=1 raises on any miss: the replay built all these calls need."""
    _, _, cache = built
    env, _ = setup
    proc = _serve(env, cache, arch, seed=len(arch), cases=40, tmp_path=tmp_path)
    assert proc.returncode == 0 and "served 40" in proc.stdout, proc.stderr[-3000:]


def test_an_empty_cache_misses(setup, tmp_path):
    env, _ = setup
    proc = _serve(env, tmp_path / "empty", "gfx942", seed=1, cases=1, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "FLYDSL_RUNTIME_RUN_ONLY=1 but no usable AOT cache" in proc.stderr


FALLBACK = observed_calls_script(
    "gfx942",
    304,
    """
    empty = lambda shape, dtype: torch.empty(shape, dtype=dtype, device="cuda")
    for _ in range(2):
        aiter.fused_moe(
            empty((300, 2048), torch.bfloat16), empty((8, 512, 2048), torch.bfloat16),
            empty((8, 2048, 256), torch.bfloat16), empty((300, 2), torch.float32),
            empty((300, 2), torch.int32),
        )
    """,
)


def _stage1_entries(cache: Path, ksplit: int) -> list[Path]:
    """gfx942's stage-1 GEMM entries compiled with `ksplit`."""
    return manifest_entries(
        cache, "gfx942", "moe",
        lambda e: e.function == "moe_stage1" and f"ksplit={ksplit} " in e.params,
    )  # fmt: skip


def test_the_fallback_serves_a_deleted_k_split_with_its_cached_sibling(built, setup, tmp_path):
    env, _ = setup
    cache = Path(shutil.copytree(built[2], tmp_path / "cache"))
    split2 = _stage1_entries(cache, 2)
    assert split2 and _stage1_entries(cache, 1)  # 300 tokens split K in two; 305..512 do not
    proc = serve_with_fallback(FALLBACK, env, cache, tmp_path, split2)
    records = result_of(proc)
    [kernels] = {kernel for kernel, _ in records}
    planned = f"{kernels} ksplit=2"
    assert lines_starting(proc.stderr, "LOG aiter.jit ") == [
        f"LOG aiter.jit WARNING fused_moe: kernel {planned} is not in the kernel cache; serving "
        f"it with the cached equivalent {kernels} ksplit=1 instead (AITER_AOT_FALLBACK=1: the "
        "same result, the sums blocked, ordered and rounded differently)"
    ]
    for _, params in records:
        assert params["ksplit"] == 1 and params["fallback_from"] == planned


# gpt-oss-120b's MoE layer sharded over 8, 4 and 2 GPUs: inter_dim 360 (stage 2's K ends inside
# a k-block), 720 (likewise) and 1440 (no K tail); every stage-1 column tile count has a tail.
GPT_OSS_INTERS = (360, 720, 1440)
GPT_OSS_TOKENS = "64"


def _gpt_oss_row(inter: int) -> str:
    cells = dict.fromkeys(FMOE.header, "")
    cells.update(
        gfx="gfx942", cu_num="304", token=GPT_OSS_TOKENS, model_dim="2880",
        inter_dim=str(inter), expert="128", topk="4", act_type="ActivationType.Swiglu",
        dtype=BF16, q_dtype_a=BF16, q_dtype_w=BF16, q_type="QuantType.No", use_g1u1="1",
        doweight_stage1="0", block_m="0", ksplit="0", run_1stage="0",
    )  # fmt: skip
    return ",".join(cells[name] for name in FMOE.header)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """The gpt-oss rows alone (an empty default table), built for gfx942 with --csv."""
    work = tmp_path_factory.mktemp("gpt_oss")
    (work / FMOE.name).write_text(",".join(FMOE.header) + "\n")
    table = work / "gpt_oss_fmoe.csv"
    rows = [_gpt_oss_row(inter) for inter in GPT_OSS_INTERS]
    table.write_text("\n".join([",".join(FMOE.header), *rows]) + "\n")
    env = {"AITER_CONFIG_DIR": str(work), "GPU_ARCHS": "gfx942"}
    cache = work / "cache"
    args = ("--csv", f"fmoe={table}", "--max-tokens", GPT_OSS_TOKENS, "--cache-dir", str(cache))
    proc, reports = replay_reports(MODULE, env, work / "build.json", *args, "-j", "2")
    return env, table, cache, proc, reports


def test_gpt_oss_shards_build(gpt_oss):
    _, _, _, proc, reports = gpt_oss
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = reports["gfx942"]
    assert report.results and all(r.tag == "OK" for r in report.results)
    assert {r.job.row.rsplit(":", 1)[1] for r in report.results} == {"2", "3", "4"}
    tails = {
        re.search(r"k_tail=(\w+)", k.params)[1]
        for k in report.kernels().values()
        if k.function == "moe_stage2"
    }
    assert tails == {"True", "False"}, tails  # 360 and 720 have a K tail, 1440 has none


SERVE_GPT_OSS = textwrap.dedent("""
    import random, sys, torch
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.moe.entry import fused_moe
    rng = random.Random(7)
    empty = lambda shape, dtype: torch.empty(shape, dtype=dtype, device="cuda")
    served = 0
    with dry_run("gfx942", 304, bridge.MODE_COMPILE):
        for inter in map(int, sys.argv[1].split(",")):
            for tokens in map(int, sys.argv[2].split(",")):
                kw = {"gate_mode": rng.choice(["separated", "interleave"])}
                if rng.random() < 0.5:
                    kw["bias1"] = empty((128, 2 * inter), torch.float32)
                    kw["bias2"] = empty((128, 2880), torch.float32)
                if rng.random() < 0.5:
                    kw["num_local_tokens"] = empty((1,), torch.int32)
                fused_moe(
                    empty((tokens, 2880), torch.bfloat16),
                    empty((128, 2 * inter, 2880), torch.bfloat16),
                    empty((128, 2880, inter), torch.bfloat16), empty((tokens, 4), torch.float32),
                    empty((tokens, 4), torch.int32), activation="swiglu", **kw,
                )
                served += 1
    print("served", served)
    """)


def test_gpt_oss_shards_are_served_from_the_cache_alone(gpt_oss, tmp_path):
    env, table, cache, proc, _ = gpt_oss
    assert proc.returncode == 0, proc.stderr[-3000:]
    inters = ",".join(map(str, GPT_OSS_INTERS))
    serve_env = {**env, FMOE.env_var: str(table)}
    served = serve_from_cache(SERVE_GPT_OSS, [inters, "1,5,33,64"], serve_env, cache, tmp_path)
    assert served.returncode == 0 and "served 12" in served.stdout, served.stderr[-3000:]


def test_a_row_the_kernels_cannot_serve_is_refused_at_load(tmp_path):
    """inter_dim 100 is no multiple of 8: the builder names file, line and column, exit 2."""
    table = tmp_path / "bad.csv"
    table.write_text(
        "\n".join([",".join(FMOE.header), _gpt_oss_row(720), _gpt_oss_row(100)]) + "\n"
    )
    args = ("--list", "--csv", f"fmoe={table}", "--cache-dir", str(tmp_path / "cache"))
    proc = run_aot(MODULE, *args, env={"GPU_ARCHS": "gfx942"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert lines_starting(proc.stderr, "error:") == [
        f"error: {table}:3: column 'inter_dim': expected a multiple of 8, found '100'"
    ]
