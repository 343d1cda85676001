"""The fix a miss message gives, end to end: where the cache's own build replayed the call's row
and never asked for its kernel, a rebuild cannot help, and the message says so; where the call
lies above what the build replayed, it names the maximum to raise."""

from __future__ import annotations

import pytest

from aiter.ops.gemm.table import A16W16
from tests.aot_cli import observed_calls_script, run_aot, serve_from_cache

pytestmark = pytest.mark.slow  # builds a small GEMM cache

MODULE = "tests.fixtures.out_dtype_gap_family"
# Tabled at M 128 for an fp32 output; the module's replay only ever asks for the bf16 one, and
# under --max-m 64 replays M 1-64 and the tabled 128.
ROW = "gfx942,304,128,256,256,0,torch.bfloat16,torch.float32,flydsl,0,,flydsl_a16w16_mfma_16x64x64"
EXTRA = {"AITER_AOT_EXTRA_MODULES": MODULE, "GPU_ARCHS": "gfx942"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tables = tmp_path_factory.mktemp("tables")
    (tables / A16W16.name).write_text(",".join(A16W16.header) + "\n" + ROW + "\n")
    cache = tmp_path_factory.mktemp("cache")
    env = {**EXTRA, "AITER_CONFIG_DIR": str(tables)}
    proc = run_aot(MODULE, "--cache-dir", str(cache), "--max-m", "64", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return env, cache, tmp_path_factory.mktemp("work")


def _serve(built, m: int, out_dtype: str):
    env, cache, work = built
    body = f"""
        aiter.gemm_a16w16(
            torch.empty(({m}, 256), dtype=torch.bfloat16, device="cuda"),
            torch.empty((256, 256), dtype=torch.bfloat16, device="cuda"),
            out_dtype=torch.{out_dtype},
        )
    """
    return serve_from_cache(observed_calls_script("gfx942", 304, body), [], env, cache, work)


def test_the_replayed_call_is_served(built) -> None:
    proc = _serve(built, 16, "bfloat16")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_call_the_replay_never_reaches_says_a_rebuild_cannot_help(built) -> None:
    proc = _serve(built, 16, "float32")
    assert proc.returncode != 0
    assert "fix:     a rebuild cannot help: the build of this cache replayed row " in proc.stderr
    assert "the replay does not reach this call" in proc.stderr
    assert "rebuild the cache" not in proc.stderr


def test_a_call_above_the_replayed_maximum_names_it(built) -> None:
    proc = _serve(built, 100, "float32")
    assert proc.returncode != 0
    assert "and this call's M is 100: rebuild with --max-m 100 or more" in proc.stderr
