"""The GEMM code objects of a cache built by aiter's own builder (`python -m aiter.aot.flydsl`),
executed in the emulator against torch, with the compile-time parameters its manifest records.

Set AITER_EMULATOR_CACHE_DIR to a built cache to run it (AITER_EMULATOR_CACHE_SAMPLE entries
per arch, default 4, spread over the manifest's order); without it the test is skipped.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import torch

from aiter.emulator import Memory
from op_tests.compile_child import disassemble_or_skip
from tests.emulator.test_emu_kernels import _gemm

CACHE_ENV = "AITER_EMULATOR_CACHE_DIR"
SAMPLE_ENV = "AITER_EMULATOR_CACHE_SAMPLE"


def _entries(arch: str) -> list[tuple[Path, dict]]:
    cache = os.environ.get(CACHE_ENV)
    if not cache:
        pytest.skip(f"set {CACHE_ENV} to a cache built by python -m aiter.aot.flydsl")
    manifest = Path(cache) / "aiter_aot_manifest.json"
    if not manifest.is_file():
        pytest.fail(f"{CACHE_ENV}={cache}: no aiter_aot_manifest.json in it")
    archs = json.loads(manifest.read_text())["archs"]
    if arch not in archs or "gemm" not in archs[arch]:
        pytest.skip(f"{cache} holds no gemm kernels for {arch}")
    found = []
    for rel, info in archs[arch]["gemm"].items():
        if info["function"] == "gemm_a16w16":
            params = dict(p.split("=", 1) for p in info["params"].split())
            found.append((Path(cache) / rel, {k: _value(v) for k, v in params.items()}))
    sample = int(os.environ.get(SAMPLE_ENV, "4"))
    step = max(1, len(found) // sample)
    return found[::step][:sample]


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_cached_gemm_code_objects_match_torch(arch: str) -> None:
    from aiter.flydsl_bridge import extract_code_objects

    for entry, p in _entries(arch):
        (code,) = extract_code_objects(entry)
        disassemble_or_skip(code, arch)
        m, n, k = 37, 200, 160
        dtype, out_dtype = getattr(torch, p["a"]), getattr(torch, p["c"])
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(m, k, generator=gen).to(dtype)
        b = torch.randn(n, k, generator=gen).to(dtype)
        split_k, tile = p["split_k"], (p["tile_m"], p["tile_n"])
        ref = a.float() @ b.float().T
        memory = Memory()
        if split_k > 1:
            # The split kernel writes fp32 partials to a [split_k, M, N] workspace.
            ws = torch.full((split_k, m, n), float("nan"))
            out = torch.empty(m, n, dtype=getattr(torch, p["bias"]))
            _gemm(code, memory, a, b, out, ws, m, n, k, tile, split_k)
            got, tol = ws.sum(0), (1e-5, 1e-4)
        else:
            bias = torch.randn(n, generator=gen).to(out_dtype)
            out = torch.full((m, n), float("nan"), dtype=out_dtype)
            _gemm(code, memory, a, b, bias if p["has_bias"] else out, out, m, n, k, tile, 1)
            ref = (ref + bias.float() if p["has_bias"] else ref).to(out_dtype).float()
            got = out.float()
            tol = (1e-5, 1e-4) if out_dtype == torch.float32 else (1e-2, 2e-2)
        torch.testing.assert_close(
            got, ref, rtol=tol[0], atol=tol[1], msg=lambda s, e=entry: f"{e}: {s}"
        )
