"""A capture from a MoE server, every public op of the family: routing with `fused_topk` (torch,
no FlyDSL kernel), `moe_sorting` on its own, and the layer with `fused_moe` in every caller
variant. Building, widening and auditing from it exit 0, the
routing calls are reported as served by torch (never FAIL), and the cache then serves every
captured call under FLYDSL_RUNTIME_RUN_ONLY=1."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from aiter import capture
from tests.aot_cli import REPO, aot_env, run_aot

# A bf16 row and a per-token fp8 row of the default table, every caller variant of each, at a
# token count inside the row's range: routed as a server routes, sorted, then the layer.
SERVER = textwrap.dedent("""
    import sys, torch
    import aiter
    from aiter.aot.flydsl import registry
    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.moe.table import QUANT_NONE, QUANT_PER_TOKEN

    mode = sys.argv[1]
    family = registry.load(registry.MODULES["moe"])
    spec = family.tables[0]
    rows = [r for r in spec.load().rows if r["gfx"] == "gfx942"]
    chosen = [next(r for r in rows if r["q_type"] == q) for q in (QUANT_NONE, QUANT_PER_TOKEN)]
    with dry_run("gfx942", 304, mode):
        for row in chosen:
            tokens, experts, topk = 37, row.int("expert"), row.int("topk")
            hidden = torch.empty((tokens, row.int("model_dim")), dtype=torch.bfloat16,
                                 device="cuda")
            gating = torch.empty((tokens, experts), dtype=torch.bfloat16, device="cuda")
            weights, ids = aiter.fused_topk(hidden, gating, topk, True)
            aiter.moe_sorting(ids, weights, experts, row.int("model_dim"), torch.bfloat16, 32)
            for variant in family.variants_of(spec, row):
                family.caller(spec, row, variant)(tokens=tokens)
    print("SERVED")
    """)


def _serve(script, env: dict[str, str], mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), mode],
        cwd=REPO,
        env=aot_env(env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and "SERVED" in proc.stdout, proc.stderr[-4000:]


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # compiles the layer's kernels for two rows in every caller variant
def test_a_moe_server_capture_builds_audits_and_serves(tmp_path) -> None:
    script, path, cache = tmp_path / "serve.py", tmp_path / "capture.jsonl", tmp_path / "cache"
    script.write_text(SERVER)
    _serve(script, {capture.ENV_CAPTURE: str(path)}, "name")
    ops = [json.loads(line)["op"] for line in path.read_text().splitlines()]
    # One line per distinct call: the two rows route alike here (same experts and topk).
    assert ops.count("fused_topk") >= 1 and ops.count("moe_sorting") >= 1
    assert ops.count("fused_moe") > 2

    capture_args = ("--capture", str(path), "--cache-dir", str(cache))
    built = _ok(run_aot("aiter.aot.flydsl", *capture_args, "--verbose"))
    routing = [line for line in built.splitlines() if "fused_topk" in line]
    assert len(routing) == ops.count("fused_topk"), built[-3000:]
    assert all(line.startswith("UNREACHED") for line in routing), routing
    assert all("served by torch: softmax top-k routing" in line for line in routing), routing
    _ok(run_aot("aiter.aot.flydsl", "--check", *capture_args))
    _ok(run_aot("aiter.aot.flydsl", "--check", "--sample", "4", *capture_args))
    _serve(
        script, {"FLYDSL_RUNTIME_CACHE_DIR": str(cache), "FLYDSL_RUNTIME_RUN_ONLY": "1"}, "compile"
    )

    _ok(run_aot("aiter.aot.flydsl", "--capture-widen", *capture_args))
    _ok(run_aot("aiter.aot.flydsl", "--check", "--capture-widen", *capture_args))
