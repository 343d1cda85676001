"""A serving process never imports the AOT builder: after `import aiter` and served calls of
every family under FLYDSL_RUNTIME_RUN_ONLY=1 with AITER_JIT=warn (the JIT monitor listening),
no `aiter.aot` module is loaded beyond the dry run that stands in for the GPU here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.aot_cli import REPO, aot_env

# One call of each family's public entries, small shapes, FakeTensors on the dry run's GPU.
CALLS = """
import torch
import aiter
from aiter import device
def t(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="cuda")
aiter.gemm_a16w16(t(32, 256), t(128, 256))
fp8 = device.fp8_dtype()
aiter.gemm_a8w8_bpreshuffle(t(32, 256, dtype=fp8), t(128, 256, dtype=fp8),
    t(32, 1, dtype=torch.float32), t(1, 128, dtype=torch.float32))
aiter.fused_moe(t(4, 256), t(8, 256, 256), t(8, 256, 128), t(4, 2, dtype=torch.float32),
    t(4, 2, dtype=torch.int32), activation="silu")
aiter.conv3d(t(1, 16, 4, 8, 8), t(16, 16, 3, 3, 3), padding=1)
one = t(1, dtype=torch.float32)
aiter.flash_attn_fp8(t(1, 64, 2, 64, dtype=fp8), t(1, 64, 2, 64, dtype=fp8),
    t(1, 64, 2, 64, dtype=fp8), q_descale=one, k_descale=one, v_descale=one)
"""

SCRIPT = f"""
import sys, json
import aiter
before_dry_run = sorted(m for m in sys.modules if m.startswith("aiter.aot"))
from aiter.toolchain import configure_linker
configure_linker()
from aiter import dispatch, flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
stand_in = sorted(m for m in sys.modules if m.startswith("aiter.aot"))
with dispatch.observe() as records, dry_run("gfx942", 304, bridge.MODE_COMPILE):
{"".join("    " + line + chr(10) for line in CALLS.strip().splitlines())}
after = sorted(m for m in sys.modules if m.startswith("aiter.aot"))
from aiter import jit_monitor
print(json.dumps({{"before": before_dry_run, "stand_in": stand_in, "after": after,
    "ops": sorted({{r.op for r in records}}), "policy": jit_monitor.settings().policy}}))
"""


def _run(env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_serving_every_family_under_run_only_imports_no_builder_module(tmp_path) -> None:
    cache = tmp_path / "cache"
    env = {**aot_env(), "FLYDSL_RUNTIME_CACHE_DIR": str(cache)}
    _run(env)  # compiles the kernels of these calls into the cache
    served = _run({**env, "FLYDSL_RUNTIME_RUN_ONLY": "1", "AITER_JIT": "warn"})
    assert served["policy"] == "warn"
    assert served["ops"] == [
        "conv3d",
        "flash_attn_fp8",
        "fused_moe",
        "gemm_a16w16",
        "gemm_a8w8_bpreshuffle",
    ]
    assert served["before"] == []  # import aiter loads nothing of the builder
    # The dry run (with its FakeTensorMode) is the builder's GPU stand-in, the one aiter.aot
    # piece such a test needs...
    stand_in = {"aiter.aot", "aiter.aot.flydsl", "aiter.aot.flydsl.dry_run"}
    stand_in.add("aiter.aot.flydsl.dry_run.context")
    fake_mode = {"aiter.aot.flydsl.dry_run.fake_mode", "aiter.aot.flydsl.dry_run.size_free"}
    assert set(served["stand_in"]) <= stand_in | fake_mode
    # ...and serving every family under the JIT monitor adds none.
    assert served["after"] == served["stand_in"]
