"""Fixtures of the emulator tests: code objects compiled per arch in a child process (FlyDSL
freezes its target per process), checked to be readable by the installed llvm-objdump.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from op_tests.compile_child import compile_env, disassemble_or_skip, run_child

ARCHS = ("gfx942", "gfx950")

_AXPY_CHILD = """
import torch
from tests.emulator.emu_kernels import emu_axpy

n = 1000
emu_axpy(torch.empty(n), torch.empty(n), torch.empty(n), n)
"""

_EXCHANGE_CHILD = """
import torch
from tests.emulator.emu_kernels import BLOCK, emu_lds_exchange

emu_lds_exchange(torch.empty(BLOCK), torch.empty(BLOCK))
"""

# One config per line: tile, split_k, input dtype, output dtype, bias. Each is compiled alone so
# the entries it adds to the cache are known to be its own.
GEMM_CONFIGS = [
    ((16, 64, 128), 8, "bfloat16", "bfloat16", True),
    ((32, 64, 64), 1, "bfloat16", "bfloat16", True),
    ((64, 128, 64), 1, "float16", "float32", False),
]

_GEMM_CHILD = """
import json, sys
from pathlib import Path
import torch
from aiter.ops.gemm.kernels.a16w16 import GemmTile, launch_gemm_a16w16

cache, configs = Path(sys.argv[1]), json.loads(sys.argv[2])
m, n, k = 37, 200, 160
found = []
for tile, split_k, dtype, out_dtype, with_bias in configs:
    before = set(cache.glob("*/*.pkl"))
    dtype, out_dtype = getattr(torch, dtype), getattr(torch, out_dtype)
    a, b = torch.empty(m, k, dtype=dtype), torch.empty(n, k, dtype=dtype)
    out = torch.empty(m, n, dtype=out_dtype)
    bias = torch.empty(n, dtype=out_dtype) if with_bias else None
    ws = torch.empty(split_k, m, n, dtype=torch.float32) if split_k > 1 else None
    launch_gemm_a16w16(a, b, bias, out, ws, tile=GemmTile(*tile), split_k=split_k, mma="mfma")
    added = set(cache.glob("*/*.pkl")) - before
    found.append({p.parent.name.rsplit("_", 1)[0]: str(p) for p in added})
print(json.dumps(found))
"""


def _code(entry: str | Path) -> bytes:
    from aiter.flydsl_bridge import extract_code_objects

    (code,) = extract_code_objects(entry)
    return code


@pytest.fixture(scope="session", params=ARCHS)
def axpy_code(request, rocm_path: str, tmp_path_factory) -> tuple[str, bytes]:
    """(arch, code object) of tests/emulator/emu_kernels.py's emu_axpy kernel."""
    arch = request.param
    cache = tmp_path_factory.mktemp(f"axpy_{arch}")
    child = run_child(_AXPY_CHILD, [], compile_env(arch, rocm_path, cache))
    assert child.returncode == 0, f"{arch}: compile failed\n{child.stderr[-4000:]}"
    (entry,) = cache.glob("emu_axpy_*/*.pkl")
    code = _code(entry)
    disassemble_or_skip(code, arch)
    return arch, code


@pytest.fixture(scope="session", params=ARCHS)
def gemm_codes(request, rocm_path: str, tmp_path_factory) -> tuple[str, list[dict[str, bytes]]]:
    """(arch, [{jit function: code object}] per GEMM_CONFIGS entry) of aiter's bf16/f16 GEMM."""
    arch = request.param
    cache = tmp_path_factory.mktemp(f"gemm_{arch}")
    child = run_child(_GEMM_CHILD, [str(cache), json.dumps(GEMM_CONFIGS)],
                      compile_env(arch, rocm_path, cache))  # fmt: skip
    assert child.returncode == 0, f"{arch}: compile failed\n{child.stderr[-4000:]}"
    found = json.loads(child.stdout.strip().splitlines()[-1])
    codes = [{fn: _code(path) for fn, path in entries.items()} for entries in found]
    disassemble_or_skip(codes[0]["gemm_a16w16"], arch)
    return arch, codes


@pytest.fixture(scope="session", params=ARCHS)
def exchange_code(request, rocm_path: str, tmp_path_factory) -> tuple[str, bytes]:
    """(arch, code object) of tests/emulator/emu_kernels.py's LDS exchange kernel."""
    arch = request.param
    cache = tmp_path_factory.mktemp(f"exchange_{arch}")
    child = run_child(_EXCHANGE_CHILD, [], compile_env(arch, rocm_path, cache))
    assert child.returncode == 0, f"{arch}: compile failed\n{child.stderr[-4000:]}"
    (entry,) = cache.glob("emu_lds_exchange_*/*.pkl")
    code = _code(entry)
    disassemble_or_skip(code, arch)
    return arch, code


# fp8 GEMMs: (family, tile, split_k, (M, N, K)); M, N and K leave tails of the tile where the
# family allows (bpreshuffle: N % 16, K % 64; blockscale: N % 128, K % 128).
A8W8_CONFIGS = [
    ("bpreshuffle", (32, 64, 128), 1, (37, 80, 320)),
    ("bpreshuffle", (16, 64, 64), 3, (37, 80, 320)),
    ("blockscale", (32, 64, 128), 1, (37, 128, 384)),
    ("blockscale", (16, 64, 128), 2, (37, 128, 384)),
]
FP8_DTYPE = {"gfx942": "float8_e4m3fnuz", "gfx950": "float8_e4m3fn"}

_A8W8_CHILD = """
import json, sys
from pathlib import Path
import torch
from aiter.ops.gemm.kernels import a8w8

cache, configs, dtype = Path(sys.argv[1]), json.loads(sys.argv[2]), getattr(torch, sys.argv[3])
found = []
for family, tile, split_k, (m, n, k) in configs:
    before = set(cache.glob("*/*.pkl"))
    xq, wq = torch.empty(m, k, dtype=dtype), torch.empty(n, k, dtype=dtype)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    ws = torch.empty(split_k, m, n) if split_k > 1 else None
    tile = a8w8.A8W8Tile(*tile)
    sem = torch.zeros(a8w8.semaphore_size(m, n, tile), dtype=torch.int32) if split_k > 1 else None
    if family == "bpreshuffle":
        xs, wsc = torch.empty(m, 1), torch.empty(1, n)
        launch = a8w8.launch_gemm_a8w8_bpreshuffle
    else:
        xs, wsc = torch.empty(m, k // 128), torch.empty(n // 128, k // 128)
        launch = a8w8.launch_gemm_a8w8_blockscale
    launch(xq, wq, xs, wsc, out, ws, sem, tile=tile, split_k=split_k, mma="mfma")
    (added,) = set(cache.glob("*/*.pkl")) - before
    found.append(str(added))
print(json.dumps(found))
"""


@pytest.fixture(scope="session", params=ARCHS)
def a8w8_codes(request, rocm_path: str, tmp_path_factory) -> tuple[str, list[bytes]]:
    """(arch, [code object per A8W8_CONFIGS entry]) of aiter's fp8 GEMMs."""
    arch = request.param
    cache = tmp_path_factory.mktemp(f"a8w8_{arch}")
    child = run_child(_A8W8_CHILD, [str(cache), json.dumps(A8W8_CONFIGS), FP8_DTYPE[arch]],
                      compile_env(arch, rocm_path, cache))  # fmt: skip
    assert child.returncode == 0, f"{arch}: compile failed\n{child.stderr[-4000:]}"
    codes = [_code(path) for path in json.loads(child.stdout.strip().splitlines()[-1])]
    disassemble_or_skip(codes[0], arch)
    return arch, codes
