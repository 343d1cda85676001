"""`aiter.gemm_a16w16` on CPU tensors under `aiter.emulated(arch)`, gfx942 and gfx950: results
against torch, kernels and cache keys against the naming dry run, and run-only serving.

Per arch, in child processes (FlyDSL freezes its target per process): the AOT way first (name
the kernels in a dry run, then compile them into a cache as the builder does), then the entries
emulated with an empty cache (they compile), then emulated again with FLYDSL_RUNTIME_RUN_ONLY=1
on the builder's cache (they must load, never compile).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiter.arch import get_arch
from op_tests.compile_child import REPO, run_child

ARCHS = ("gfx942", "gfx950")
ENV_TABLE = "AITER_CONFIG_GEMM_BF16"

# (M, N, K, bias, dtype, out_dtype): M and N are tails of every tile. The heuristic plans the
# first with split-K 2 (16x64x128 tiles, 8 k-tiles; a GEMM and a reduction kernel), the others
# without. The last is served by the tuned row TABLE_ROW writes: 32x64x128 tiles over K = 160
# (a K tail inside the tile) and split-K 3 over 5 k-blocks (splits of one and two k-blocks).
SHAPES = [
    (5, 100, 1024, False, "bfloat16", "bfloat16"),
    (37, 200, 160, True, "bfloat16", "bfloat16"),
    (70, 72, 96, True, "float16", "float32"),
    (20, 130, 160, True, "bfloat16", "bfloat16"),
]
SPLIT_K_SHAPE, TABLE_SHAPE = 0, 3
TABLE_ROW = (
    "{arch},{cu},20,130,160,1,torch.bfloat16,torch.bfloat16,flydsl,3,,flydsl_a16w16_mfma_32x64x128"
)
TABLE_HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,libtype,splitK,us,kernelName"

_PRELUDE = """
import json, sys
from pathlib import Path
import torch
import aiter
from aiter import dispatch
from aiter import flydsl_bridge as bridge

arch, shapes = sys.argv[1], json.loads(sys.argv[2])


def record(r):
    return {"op": r.op, "backend": r.backend, "kernel": r.kernel, "source": r.source,
            "row": r.row, "params": {k: str(v) for k, v in r.params.items()}}
"""

# The builder's way: name every call's kernels, then compile them into the (empty) cache.
_AOT_CHILD = _PRELUDE + """
from aiter.arch import get_arch
from aiter.aot.flydsl.dry_run import dry_run


def calls():
    for m, n, k, bias, dtype, out_dtype in shapes:
        dt, out_dt = getattr(torch, dtype), getattr(torch, out_dtype)
        a = torch.empty((m, k), dtype=dt, device="cuda")
        b = torch.empty((n, k), dtype=dt, device="cuda")
        c = torch.empty((n,), dtype=out_dt, device="cuda") if bias else None
        yield lambda: aiter.gemm_a16w16(a, b, c, out_dtype=out_dt)


cu = get_arch(arch).default_cu_num
named = []
with dry_run(arch, cu, bridge.MODE_NAME) as requests:
    for call in calls():
        before = len(requests)
        with dispatch.observe() as records:
            call()
        named.append({"records": [record(r) for r in records],
                      "entries": [str(r.path) for r in requests[before:]]})
with dry_run(arch, cu, bridge.MODE_COMPILE) as requests:
    for call in calls():
        call()
built = sorted(str(r.path) for r in requests)
print(json.dumps({"named": named, "built": built}))
"""

# The entries under aiter.emulated: outputs saved for the parent to check against torch.
_EMULATED_CHILD = _PRELUDE + """
out_file = Path(sys.argv[3])
gen = torch.Generator().manual_seed(0)
tensors, runs = [], []
with aiter.emulated(arch) as session:
    for m, n, k, bias, dtype, out_dtype in shapes:
        dt, out_dt = getattr(torch, dtype), getattr(torch, out_dtype)
        a = torch.randn(m, k, generator=gen).to(dt)
        b = torch.randn(n, k, generator=gen).to(dt)
        c = torch.randn(n, generator=gen).to(out_dt) if bias else None
        first = len(session.launches)
        with dispatch.observe() as records, bridge.observe_launches() as outcomes:
            out = aiter.gemm_a16w16(a, b, c, out_dtype=out_dt)
        tensors.append({"a": a, "b": b, "bias": c, "out": out})
        runs.append({
            "records": [record(r) for r in records],
            "entries": [str(o.request.path) for o in outcomes],
            "cache": [o.cache for o in outcomes],
            "launches": [[x.kernel, list(x.grid), list(x.block), x.stats.instructions,
                          len(x.stats.hazards)] for x in session.launches[first:]],
        })
torch.save(tensors, out_file)
print(json.dumps({"runs": runs}))
"""

# An instruction the emulator lacks: the bf16 MFMA, taken out of its table for this process.
_UNSUPPORTED_CHILD = _PRELUDE + """
from aiter.emulator import UnsupportedInstruction
from aiter.emulator.ops import OPS

removed = sorted(name for name in OPS if name.startswith("v_mfma_f32_16x16x") and "bf16" in name)
for name in removed:
    del OPS[name]
m, n, k, bias, dtype, out_dtype = shapes[0]
with aiter.emulated(arch):
    try:
        aiter.gemm_a16w16(torch.ones(m, k, dtype=torch.bfloat16),
                          torch.ones(n, k, dtype=torch.bfloat16))
        outcome = {"raised": None}
    except Exception as exc:
        outcome = {"raised": type(exc).__name__, "message": str(exc),
                   "mnemonic": getattr(exc, "mnemonic", None)}
outcome["removed"] = removed
print(json.dumps(outcome))
"""


def _env(cache: Path, table: Path | None = None, run_only: bool = False) -> dict[str, str]:
    """A child's environment: its own cache, no target, mode or linker inherited (the caller
    adds ROCM_PATH where kernels may compile), `table` as the user's bf16 GEMM table."""
    env = dict(os.environ)
    inherited = ("COMPILE_ONLY", "ARCH", "FLYDSL_GPU_ARCH", "FLYDSL_RUNTIME_RUN_ONLY", "ROCM_PATH")
    for name in (*inherited, ENV_TABLE):
        env.pop(name, None)
    env.update(
        FLYDSL_RUNTIME_CACHE_DIR=str(cache),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    if table is not None:
        env[ENV_TABLE] = str(table)
    if run_only:
        env["FLYDSL_RUNTIME_RUN_ONLY"] = "1"
    return env


def _child(script: str, args: list[str], env: dict[str, str], what: str) -> dict:
    child = run_child(script, args, env)
    assert child.returncode == 0, f"{what} failed:\n{child.stderr[-6000:]}"
    return json.loads(child.stdout.strip().splitlines()[-1])


def _snapshot(cache: Path) -> dict[str, tuple[int, int]]:
    """Every file of a cache with its size and modification time."""
    return {
        str(p.relative_to(cache)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(cache.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session", params=ARCHS)
def emulated_runs(request, rocm_path: str, tmp_path_factory) -> dict:
    """The three children of one arch, their reports, and the tensors of both emulated runs."""
    arch = request.param
    root = tmp_path_factory.mktemp(f"emulated_{arch}")
    table = root / "bf16_rows.csv"
    row = TABLE_ROW.format(arch=arch, cu=get_arch(arch).default_cu_num)
    table.write_text(f"{TABLE_HEADER}\n{row}\n")
    shapes = json.dumps(SHAPES)
    aot_cache, jit_cache = root / "aot_cache", root / "jit_cache"
    aot_env = {**_env(aot_cache, table), "ROCM_PATH": rocm_path}
    aot = _child(_AOT_CHILD, [arch, shapes], aot_env, f"{arch}: the AOT build")
    jit_env = {**_env(jit_cache, table), "ROCM_PATH": rocm_path}
    jit = _child(_EMULATED_CHILD, [arch, shapes, str(root / "jit.pt")], jit_env,
                 f"{arch}: the emulated entries")  # fmt: skip
    before = _snapshot(aot_cache)
    run_only = _child(
        _EMULATED_CHILD,
        [arch, shapes, str(root / "run_only.pt")],
        _env(aot_cache, table, run_only=True),  # no ROCM_PATH: nothing may link
        f"{arch}: the emulated entries under FLYDSL_RUNTIME_RUN_ONLY=1",
    )
    return {
        "arch": arch,
        "aot": aot,
        "jit": jit,
        "run_only": run_only,
        "aot_cache": aot_cache,
        "jit_cache": jit_cache,
        "snapshots": (before, _snapshot(aot_cache)),
        "tensors": {
            "jit": torch.load(root / "jit.pt"),
            "run_only": torch.load(root / "run_only.pt"),
        },
        "table": table,
    }


def _check_against_torch(t: dict, k: int) -> None:
    """out = A @ B^T (+ bias) with fp32 accumulation. bf16 and fp16 products are exact in fp32,
    so the kernel and the fp32 reference differ only in the order of the K-long fp32 sum (at
    most K * 2^-24 * sum|a||b| per element, the atol) and in the one rounding to the output
    dtype: half an ulp, well inside one ulp (rtol 2^-8 bf16, 2^-11 fp16, 2^-23 fp32)."""
    a, b, bias, out = t["a"].float(), t["b"].float(), t["bias"], t["out"]
    ref = a @ b.T + (bias.float() if bias is not None else 0)
    atol = k * 2.0**-24 * float((a.abs() @ b.abs().T).max())
    rtol = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-23}[out.dtype]
    torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SHAPES)), ids=[f"{s[0]}x{s[1]}x{s[2]}" for s in SHAPES])
def test_emulated_gemm_matches_torch(emulated_runs, index: int) -> None:
    m, n, k, bias, dtype, out_dtype = SHAPES[index]
    for run in ("jit", "run_only"):
        t = emulated_runs["tensors"][run][index]
        assert t["out"].shape == (m, n) and t["out"].dtype == getattr(torch, out_dtype)
        assert (t["bias"] is not None) == bias
        _check_against_torch(t, k)
        launches = emulated_runs[run]["runs"][index]["launches"]
        assert launches and all(hazards == 0 for *_, hazards in launches), launches
    # The same code objects on the same inputs: bit for bit, however they reached the process.
    jit, run_only = (emulated_runs["tensors"][r][index]["out"] for r in ("jit", "run_only"))
    assert torch.equal(jit, run_only)


@pytest.mark.slow
def test_split_k_plans_run_the_gemm_then_the_reduction(emulated_runs) -> None:
    for index, split_k in ((SPLIT_K_SHAPE, 2), (TABLE_SHAPE, 3)):
        run = emulated_runs["jit"]["runs"][index]
        (record,) = run["records"]
        assert record["params"]["split_k"] == str(split_k)
        kernels = [launch[0] for launch in run["launches"]]
        assert kernels == ["gemm_a16w16_kernel_0", "gemm_a16w16_splitk_reduce_kernel_0"]
        assert run["launches"][0][1][2] == split_k  # grid z: one slice of K per split


@pytest.mark.slow
def test_dispatch_records_match_the_naming_dry_run(emulated_runs) -> None:
    """The same table, plan and kernel as on a GPU of the arch: the dry run (FakeTensors on a
    simulated device) and the emulated run report the same dispatch records."""
    table = str(emulated_runs["table"])
    for index, named in enumerate(emulated_runs["aot"]["named"]):
        for run in ("jit", "run_only"):
            assert emulated_runs[run]["runs"][index]["records"] == named["records"]
        (record,) = named["records"]
        assert record["backend"] == "flydsl"
        assert (record["source"] == "table") == (index == TABLE_SHAPE)
        if index == TABLE_SHAPE:
            assert record["row"].startswith(table) and record["kernel"].endswith("32x64x128")


@pytest.mark.slow
def test_emulated_launches_use_the_keys_the_builder_names(emulated_runs) -> None:
    """FlyDSL keys the CPU tensors' launches exactly as the dry run keys the FakeTensors': the
    emulated run compiles into the empty cache exactly the entries the dry run named."""
    aot_cache, jit_cache = emulated_runs["aot_cache"], emulated_runs["jit_cache"]
    named = [
        [str(Path(p).relative_to(aot_cache)) for p in run["entries"]]
        for run in emulated_runs["aot"]["named"]
    ]
    emulated = [
        [str(Path(p).relative_to(jit_cache)) for p in run["entries"]]
        for run in emulated_runs["jit"]["runs"]
    ]
    assert emulated == named
    assert all(set(run["cache"]) == {"compiled"} for run in emulated_runs["jit"]["runs"])
    written = {str(p.relative_to(jit_cache)) for p in jit_cache.rglob("*.pkl")}
    assert written == {entry for entries in named for entry in entries}
    built = {str(Path(p).relative_to(aot_cache)) for p in emulated_runs["aot"]["built"]}
    assert built == written


@pytest.mark.slow
def test_run_only_serves_the_built_cache_without_compiling(emulated_runs) -> None:
    before, after = emulated_runs["snapshots"]
    assert before and after == before, "the run-only process changed the cache"
    runs = emulated_runs["run_only"]["runs"]
    assert all(set(run["cache"]) == {"hit"} for run in runs)
    served = {
        str(Path(p).relative_to(emulated_runs["aot_cache"])) for r in runs for p in r["entries"]
    }
    assert served == {p for p in before if p.endswith(".pkl")}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_an_instruction_the_emulator_lacks_is_named(arch: str, rocm_path: str, tmp_path) -> None:
    env = {**_env(tmp_path / "cache"), "ROCM_PATH": rocm_path}
    outcome = _child(_UNSUPPORTED_CHILD, [arch, json.dumps(SHAPES)], env, f"{arch}: child")
    assert outcome["removed"], "no bf16 MFMA in the emulator's table to take out"
    assert outcome["raised"] == "UnsupportedInstruction", outcome
    assert outcome["mnemonic"] in outcome["removed"]
    assert (
        outcome["mnemonic"] in outcome["message"] and "gemm_a16w16_kernel_0" in outcome["message"]
    )


@pytest.mark.slow
def test_a_cache_built_by_the_aot_cli_serves_the_emulated_entry(rocm_path: str, tmp_path) -> None:
    """The shipped path end to end: `python -m aiter.aot.flydsl` fills a cache from the tables
    (the tuned row included), and the public entry, emulated with FLYDSL_RUNTIME_RUN_ONLY=1,
    runs the row's kernels from it, compiling nothing, and matches torch."""
    arch, cu = "gfx942", get_arch("gfx942").default_cu_num
    table, cache = tmp_path / "bf16_rows.csv", tmp_path / "cache"
    table.write_text(f"{TABLE_HEADER}\n{TABLE_ROW.format(arch=arch, cu=cu)}\n")
    command = [sys.executable, "-m", "aiter.aot.flydsl", "--module", "gemm", "--csv",
               f"gemm_a16w16={table}", "--max-m", "32", "--cache-dir", str(cache), "-j", "1"]  # fmt: skip
    env = {**_env(cache), "ROCM_PATH": rocm_path, "GPU_ARCHS": arch}
    build = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, f"the AOT build failed:\n{build.stderr[-6000:]}"
    before = _snapshot(cache)
    report = _child(
        _EMULATED_CHILD,
        [arch, json.dumps([SHAPES[TABLE_SHAPE]]), str(tmp_path / "out.pt")],
        _env(cache, table, run_only=True),
        "the emulated entry on the AOT cache",
    )
    assert _snapshot(cache) == before
    (run,) = report["runs"]
    assert run["cache"] == ["hit", "hit"] and run["records"][0]["source"] == "table"
    (t,) = torch.load(tmp_path / "out.pt")
    _check_against_torch(t, SHAPES[TABLE_SHAPE][2])
