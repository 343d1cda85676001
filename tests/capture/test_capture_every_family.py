"""From serving capture to served cache, for every family: two dry-run serving processes record
one file at once, a build from that capture fills an empty cache, the audit from it passes, and
the same processes then serve every call under FLYDSL_RUNTIME_RUN_ONLY=1 without a miss."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from aiter import capture
from aiter.aot.flydsl import registry
from aiter.flydsl_bridge import manifest
from tests.aot_cli import REPO, aot_env, run_aot

# Each rank calls the public entries of some families as a caller of a default table row does
# (the AOT module's caller, at a point inside the row's range), plus untuned GEMM shapes.
SERVER = textwrap.dedent("""
    import sys, torch
    import aiter
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl import registry
    from aiter.aot.flydsl.dry_run import dry_run

    POINTS = {
        "gemm": lambda row: {"M": 300},
        "moe": lambda row: {"tokens": 300},
        "moe_routing": lambda row: {"tokens": 300},
        "conv3d": lambda row: {"frames": row.int("D")},
        "fmha_fp8": lambda row: {"batch": 2, "seqlen_q": 1, "seqlen_k": 300},
        "chunk_gdn_h": lambda row: {"seqs": 2, "tokens": 300},
    }
    RANKS = [("gemm", "moe", "conv3d"), ("fmha_fp8", "chunk_gdn_h", "moe_routing")]
    rank, mode = int(sys.argv[1]), sys.argv[2]
    with dry_run("gfx942", 304, mode):
        for name in RANKS[rank]:
            family = registry.load(registry.MODULES[name])
            spec = family.tables[0]
            row = next(r for r in spec.load().rows if r["gfx"] == "gfx942")
            variant = family.variants_of(spec, row)[0]
            family.caller(spec, row, variant)(**POINTS[name](row))
        if rank == 1:
            e = lambda *s: torch.empty(s, dtype=torch.bfloat16, device="cuda")
            for m in (1, 37):  # N and K no table lists: the heuristic serves
                aiter.gemm_a16w16(e(m, 768), e(384, 768))
    print("SERVED")
    """)


def _serve(script, rank: int, env: dict[str, str], mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), str(rank), mode],
        cwd=REPO,
        env=aot_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _serve_all(script, env: dict[str, str], mode: str) -> None:
    procs = [_serve(script, rank, env, mode) for rank in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0 and "SERVED" in out, err[-4000:]


@pytest.mark.slow  # compiles the kernels of one call or two of every family
def test_a_capture_of_every_family_builds_a_cache_that_serves_it(tmp_path) -> None:
    script, path, cache = tmp_path / "serve.py", tmp_path / "capture.jsonl", tmp_path / "cache"
    script.write_text(SERVER)
    _serve_all(script, {capture.ENV_CAPTURE: str(path)}, "name")
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # none interleaved
    families = [registry.load(p) for p in registry.MODULES.values()]
    ops = {op for family in families for op in family.captured}
    assert {line["op"] for line in lines} <= ops
    for family in families:
        assert set(family.captured) & {line["op"] for line in lines}, family.name

    build = run_aot("aiter.aot.flydsl", "--capture", str(path), "--cache-dir", str(cache))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert f"--capture: {len(lines)} distinct calls of 6 module(s)" in build.stderr
    check = run_aot(
        "aiter.aot.flydsl", "--check", "--capture", str(path), "--cache-dir", str(cache)
    )
    assert check.returncode == 0, check.stdout[-3000:]

    serving = {"FLYDSL_RUNTIME_CACHE_DIR": str(cache), "FLYDSL_RUNTIME_RUN_ONLY": "1"}
    _serve_all(script, serving, "compile")

    listed = manifest.read(cache).entries("gfx942")
    requesters = [r for entry in listed.values() for r in entry.requested_by]
    assert requesters and all(r.table == "capture" for r in requesters)
    assert {r.row.rpartition(":")[0] for r in requesters} == {str(path)}
