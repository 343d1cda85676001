"""`gemm_a8w8_blockscale_bpreshuffle`: its plan picks the blockscale kernel that reads a
preshuffled weight (a cache key of its own), its arguments are checked with errors naming them,
torch serves it as aiter's contract says (x scales column-major, either of aiter's views), and
the replay of its default table compiles.

Host-level tests run in a naming dry run of gfx942 (one arch per process); the build and the
emulated run of the kernels run in child processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import aiter
from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.gemm.table import (
    A8W8_BLOCKSCALE_BPRESHUFFLE,
)
from aiter.ops.shared.preshuffle import shuffle_weight
from aiter.tuning.spec import CONFIG_DIR
from tests.aot_cli import REPO, lines_starting, other_tables, read_report, run_aot

ARCH, CU_NUM = "gfx942", 304
FP8 = torch.float8_e4m3fnuz  # gfx942's flavour
F32 = torch.float32
# DeepSeek-V3's q_a projection at TP8, a shape of the default table (M 16, 128 and 1024).
N, K = 1536, 7168
KERNELS = "flydsl_a8w8_blockscale_bpreshuffle_mfma_"


def _t(*shape: int, dtype: torch.dtype = FP8) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _x_scale(m: int, k: int, view: bool) -> torch.Tensor:
    """The [M, K/128] scales over [K/128, M] bytes: aiter's contiguous view, or strided (1, M)."""
    return _t(m, k // 128, dtype=F32) if view else _t(k // 128, m, dtype=F32).mT


def _call(m: int, n: int = N, k: int = K, view: bool = True, **kwargs):
    return lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
        _t(m, k), _t(n, k), _x_scale(m, k, view), _t(n // 128, k // 128, dtype=F32), **kwargs
    )


def _named(call) -> tuple[list[dispatch.DispatchRecord], list[bridge.KernelRequest]]:
    """The dispatch records and kernel requests of `call()` in a naming dry run of gfx942."""
    with dry_run(ARCH, CU_NUM, bridge.MODE_NAME) as requests, dispatch.observe() as records:
        call()
    return list(records), list(requests)


# --- the plan ---


@pytest.mark.parametrize("m, tile", [(16, "16x64x128"), (100, "128x64x128"), (700, "256x64x128")])
def test_the_plan_serves_the_default_table_with_the_preshuffled_blockscale_kernel(m, tile):
    records, requests = _named(_call(m))
    (record,) = records
    assert (record.op, record.backend, record.source) == (
        "gemm_a8w8_blockscale_bpreshuffle",
        dispatch.BACKEND_FLYDSL,
        "table",
    )
    assert record.kernel == KERNELS + tile
    assert record.row.startswith(str(CONFIG_DIR / A8W8_BLOCKSCALE_BPRESHUFFLE.name) + ":")
    assert record.args["WQ"].endswith("preshuffled 16x16")
    assert requests and {r.function for r in requests} == {"gemm_a8w8_blockscale_bpreshuffle"}
    params = dict(requests[0].params)
    assert f"{params['tile_m']}x{params['tile_n']}x{params['tile_k']}" == tile
    assert params["xq"] == params["wq"] == "float8_e4m3fnuz"


def test_both_views_of_the_x_scales_ask_for_one_kernel():
    _, by_view = _named(_call(40, view=True))
    _, strided = _named(_call(40, view=False))
    assert [(r.cache_dir, r.key) for r in by_view] == [(r.cache_dir, r.key) for r in strided]


def test_its_kernel_keys_differ_from_the_row_major_blockscale_kernel():
    """The same tile and split-K, but WQ preshuffled and x scales by block: another kernel."""
    m = 16
    _, preshuffled = _named(_call(m))
    _, row_major = _named(
        lambda: aiter.gemm_a8w8_blockscale(
            _t(m, K), _t(N, K), _t(m, K // 128, dtype=F32), _t(N // 128, K // 128, dtype=F32)
        )
    )
    (a,), (b,) = preshuffled, row_major
    assert dict(a.params) == dict(b.params)
    assert a.function != b.function and a.cache_dir != b.cache_dir
    assert a.path != b.path


def test_an_untuned_shape_is_served_by_the_heuristic():
    (record,), requests = _named(_call(64, n=256, k=1024))
    assert record.source == "heuristic" and record.kernel.startswith(KERNELS)
    assert record.table_row["kernelName"] == record.kernel
    assert [r.function for r in requests] == ["gemm_a8w8_blockscale_bpreshuffle"]


# --- argument checks: each names the argument (in a dry run: FakeTensors on cuda) ---

BAD_ARGUMENTS = {
    "XQ-dtype": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256, dtype=torch.bfloat16), _t(128, 256), _x_scale(16, 256, True),
            _t(1, 2, dtype=F32),
        ),
        TypeError, "XQ must have dtype in",
    ),
    "XQ-int8": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256, dtype=torch.int8), _t(128, 256, dtype=torch.int8),
            _x_scale(16, 256, True), _t(1, 2, dtype=F32),
        ),
        TypeError, "XQ must have dtype in",
    ),
    "XQ-fp8-flavour": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256, dtype=torch.float8_e4m3fn), _t(128, 256, dtype=torch.float8_e4m3fn),
            _x_scale(16, 256, True), _t(1, 2, dtype=F32),
        ),
        TypeError, "XQ must have dtype in",
    ),
    "XQ-rank": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(2, 16, 256), _t(128, 256), _x_scale(16, 256, True), _t(1, 2, dtype=F32)
        ),
        ValueError, "XQ must be a 2-D tensor [M, K]",
    ),
    "WQ-K": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 384), _x_scale(16, 256, True), _t(1, 2, dtype=F32)
        ),
        ValueError, "WQ must have shape [128, 256]",
    ),
    "WQ-dtype": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 256, dtype=torch.bfloat16), _x_scale(16, 256, True),
            _t(1, 2, dtype=F32),
        ),
        TypeError, "WQ must have dtype in",
    ),
    "N-off-the-grid": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(576, 256), _x_scale(16, 256, True), _t(5, 2, dtype=F32)
        ),
        ValueError, "gemm_a8w8_blockscale_bpreshuffle needs N and K multiples of 128",
    ),
    "x_scale-shape": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 256), _t(16, 1, dtype=F32), _t(1, 2, dtype=F32)
        ),
        ValueError, "x_scale must have shape [16, 2]",
    ),
    "x_scale-dtype": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 256), _t(16, 2, dtype=torch.bfloat16), _t(1, 2, dtype=F32)
        ),
        TypeError, "x_scale must have dtype torch.float32",
    ),
    "x_scale-strides": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 256), _t(16, 4, dtype=F32).as_strided((16, 2), (4, 2)),
            _t(1, 2, dtype=F32),
        ),
        ValueError, "x_scale must hold the [K/128, M] scales column-major: strides (1, 16)",
    ),
    "x_scale-none": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 256), None, _t(1, 2, dtype=F32)
        ),
        TypeError, "x_scale must be a torch.Tensor",
    ),
    "w_scale-shape": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 256), _x_scale(16, 256, True), _t(2, 1, dtype=F32)
        ),
        ValueError, "w_scale must have shape [1, 2]",
    ),
    "w_scale-strides": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(256, 256), _x_scale(16, 256, True), _t(2, 2, dtype=F32).mT
        ),
        ValueError, "w_scale must be contiguous",
    ),
    "out_dtype": (
        lambda: aiter.gemm_a8w8_blockscale_bpreshuffle(
            _t(16, 256), _t(128, 256), _x_scale(16, 256, True), _t(1, 2, dtype=F32),
            out_dtype=F32,
        ),
        TypeError, "out_dtype must be one of",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_a_bad_argument_is_an_error_naming_it_before_anything_is_served(case):
    call, error, message = BAD_ARGUMENTS[case]
    with pytest.raises(error) as raised:
        _named(call)
    assert str(raised.value).startswith(message), str(raised.value)


def test_bad_arguments_report_and_launch_nothing():
    call = BAD_ARGUMENTS["x_scale-strides"][0]
    with (
        dry_run(ARCH, CU_NUM, bridge.MODE_NAME) as requests,
        dispatch.observe() as records,
        pytest.raises(ValueError),
    ):
        call()
    assert not records and not requests


# --- torch serves as aiter's contract says (CPU tensors, aiter.emulated: no kernel runs) ---


def _reference(x, w, x_scale, w_scale, out_dtype):
    """sum over 128-wide k-blocks of (x @ w^T) * x_scale[m, kb] * w_scale[n // 128, kb]."""
    out = torch.zeros(x.shape[0], w.shape[0])
    for kb in range(x.shape[1] // 128):
        block = slice(kb * 128, (kb + 1) * 128)
        part = x[:, block].float() @ w[:, block].float().T
        out += part * x_scale[:, kb : kb + 1] * w_scale[:, kb].repeat_interleave(128)[None, :]
    return out.to(out_dtype)


def test_torch_serves_a_torch_row_with_aiters_scale_layout(tmp_path, monkeypatch):
    m, n, k = 8, 256, 384
    row = f"{ARCH},{CU_NUM},{m},{n},{k},torch,0,0,,"
    table = tmp_path / A8W8_BLOCKSCALE_BPRESHUFFLE.name
    table.write_text(",".join(A8W8_BLOCKSCALE_BPRESHUFFLE.header) + "\n" + row + "\n")
    monkeypatch.setenv(A8W8_BLOCKSCALE_BPRESHUFFLE.env_var, str(table))
    for name in (bridge.ENV_ARCH, bridge.ENV_GPU_ARCH):
        # aiter.emulated sets the target for the process; the worker's later tests get theirs back
        monkeypatch.setenv(name, ARCH)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(m, k, generator=gen).to(FP8)
    w = torch.randn(n, k, generator=gen).to(FP8)
    scales = torch.rand(m, k // 128, generator=gen) + 0.5
    w_scale = torch.rand(n // 128, k // 128, generator=gen) + 0.5
    views = {
        "strided": scales.T.contiguous().T,
        "contiguous": scales.T.contiguous().view(m, k // 128),
    }
    with aiter.emulated(ARCH, CU_NUM) as session, dispatch.observe() as records:
        for out_dtype in (torch.bfloat16, torch.float16):
            expected = _reference(x, w, scales, w_scale, out_dtype)
            for x_scale in views.values():
                out = aiter.gemm_a8w8_blockscale_bpreshuffle(
                    x, shuffle_weight(w), x_scale, w_scale, out_dtype=out_dtype
                )
                assert out.dtype == out_dtype and out.shape == (m, n)
                torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
            # A row-major x_scale is read as aiter's contiguous view of other bytes.
            misread = aiter.gemm_a8w8_blockscale_bpreshuffle(x, shuffle_weight(w), scales, w_scale)
            assert not torch.allclose(misread.float(), expected.float(), rtol=1e-2, atol=1e-2)
    assert not session.launches
    assert {(r.backend, r.row) for r in records} == {(dispatch.BACKEND_TORCH, f"{table}:2")}


# --- the replay compiles; the kernels compute what torch does (child processes) ---


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    """AITER_CONFIG_DIR: the default table of this entry, the other GEMM tables empty."""
    directory = tmp_path_factory.mktemp("tables")
    for spec in other_tables(A8W8_BLOCKSCALE_BPRESHUFFLE):
        (directory / spec.name).write_text(",".join(spec.header) + "\n")
    shutil.copy(CONFIG_DIR / A8W8_BLOCKSCALE_BPRESHUFFLE.name, directory)
    return directory


@pytest.mark.slow
def test_the_replay_of_its_default_table_compiles_and_checks(tables, tmp_path):
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": ARCH}
    cache, report = tmp_path / "cache", tmp_path / "report.json"
    args = ("--max-m", "16", "--cache-dir", str(cache))
    proc = run_aot("aiter.aot.flydsl.gemm", *args, "-j", "1", "--report", str(report), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = read_report(report)
    assert built.arch == ARCH
    assert [r.job.row.rsplit("/", 1)[1] for r in built.results] == [
        f"{A8W8_BLOCKSCALE_BPRESHUFFLE.name}:{line}" for line in (2, 2, 5, 5)
    ]
    assert {r.tag for r in built.results} == {"OK"} and not lines_starting(proc.stdout, "FAIL")
    kernels = built.kernels()
    assert kernels and {k.function for k in kernels.values()} == {
        "gemm_a8w8_blockscale_bpreshuffle"
    }
    assert all("xq=float8_e4m3fnuz" in k.params for k in kernels.values())
    assert all(c.ok for c in built.compiles) and built.compiled() == {str(p) for p in kernels}
    assert all(Path(p).is_file() for p in kernels)
    check = run_aot("aiter.aot.flydsl.gemm", "--check", *args, env=env)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert not lines_starting(check.stdout, "MISSING")


_EMULATED = """
import json, sys, torch, aiter
from aiter import dispatch
from aiter.ops.shared.preshuffle import shuffle_weight

gen = torch.Generator().manual_seed(3)
fp8 = torch.float8_e4m3fnuz
runs = []
with aiter.emulated("gfx942") as session:
    for m, n, k in json.loads(sys.argv[1]):
        x = torch.randn(m, k, generator=gen).to(fp8)
        w = torch.randn(n, k, generator=gen).to(fp8)
        scales = torch.rand(m, k // 128, generator=gen) + 0.5
        w_scale = torch.rand(n // 128, k // 128, generator=gen) + 0.5
        for view in (True, False):
            x_scale = scales.T.contiguous()
            x_scale = x_scale.view(m, k // 128) if view else x_scale.T
            with dispatch.observe() as records:
                out = aiter.gemm_a8w8_blockscale_bpreshuffle(x, shuffle_weight(w), x_scale, w_scale)
            expected = torch.zeros(m, n)
            for kb in range(k // 128):
                b = slice(kb * 128, (kb + 1) * 128)
                part = x[:, b].float() @ w[:, b].float().T
                expected += part * scales[:, kb : kb + 1] * w_scale[:, kb].repeat_interleave(128)
            close = torch.allclose(out.float(), expected, rtol=1e-2, atol=1e-2)
            runs.append({"close": close, "kernel": records[-1].kernel,
                         "split_k": records[-1].params.get("split_k")})
print("RUNS " + json.dumps({"runs": runs, "launches": len(session.launches)}))
"""


@pytest.mark.slow
def test_its_kernels_compute_what_torch_does_in_the_emulator(tmp_path, rocm_path):
    """Split-K 1 and 2 (the heuristic's choices for these shapes on 304 CUs), M and N tails."""
    shapes = [[20, 256, 512], [37, 256, 1024]]
    env = {**os.environ, "ROCM_PATH": rocm_path, bridge.ENV_CACHE_DIR: str(tmp_path / "cache")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EMULATED), json.dumps(shapes)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = lines_starting(proc.stdout, "RUNS ")
    result = json.loads(line[len("RUNS ") :])
    runs = result["runs"]
    assert [r["split_k"] for r in runs] == [1, 1, 2, 2]
    assert all(r["kernel"].startswith(KERNELS) for r in runs)
    assert all(r["close"] for r in runs), runs
    assert result["launches"] == len(runs)
