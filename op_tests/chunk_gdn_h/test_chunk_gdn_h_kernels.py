"""chunk_gdn_h's FlyDSL kernel: what its key holds (naming in a dry run), and, per arch, a
compile into code objects of that arch whose ISA holds the arch's 16-bit MMA, the k^T staging
through LDS between two barriers per chunk, and no spills.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.chunk_gdn_h.kernels import chunk_h as ch
from aiter.ops.chunk_gdn_h.kernels import chunk_h_index as ix
from op_tests.compile_child import LIST_THEN_BUILD, compile_env, disassemble_or_skip, run_child


def _named(**over) -> list:
    cfg = dict(batch=2, seqlen=100, heads=4, key_heads=2, k=128, v=128, block_v=32, g=True,
               gk=False, h0=True, final=True, save=True, varlen=False)  # fmt: skip
    cfg.update(over)
    b, t, h, hg, k, v = (cfg[c] for c in ("batch", "seqlen", "heads", "key_heads", "k", "v"))
    n = 3 if cfg["varlen"] else b
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:

        def e(*shape, dtype=torch.bfloat16):
            return torch.empty(shape, dtype=dtype, device="cuda")

        f32 = torch.float32
        ch.launch_chunk_gdn_h(
            e(b, t, hg, k), e(b, t, h, k), e(b, t, h, v), e(b, t, h, dtype=f32) if cfg["g"] else None,
            e(b, t, h, k, dtype=f32) if cfg["gk"] else None, e(b, 9, h, k, v),
            e(b, t, h, v) if cfg["save"] else None, e(n, h, k, v, dtype=f32) if cfg["h0"] else None,
            e(n, h, k, v, dtype=f32) if cfg["final"] else None,
            e(n + 1, dtype=torch.int32) if cfg["varlen"] else None,
            e(n + 1, dtype=torch.int32) if cfg["varlen"] else None,
            num_seqs=n, chunk_size=64, block_v=cfg["block_v"], mma="mfma",
        )  # fmt: skip
    return list(requests)


def test_sizes_are_runtime_and_choices_compile_time() -> None:
    """Batch, tokens, heads and V are runtime arguments: one kernel serves them all; K, BV,
    the gates, states and layout are compile-time."""
    base = _named()
    assert [r.function for r in base] == ["chunk_gdn_h"]
    params = dict(base[0].params)
    assert params["block_v"] == "32" and params["head_dim"] == "128" and params["use_g"] == "True"
    same = _named(batch=5, seqlen=1, heads=8, key_heads=8, v=256)
    assert [r.key for r in same] == [r.key for r in base]
    for change in (dict(block_v=64), dict(k=64), dict(g=False), dict(gk=True), dict(h0=False),
                   dict(final=False), dict(save=False), dict(varlen=True, batch=1)):  # fmt: skip
        assert _named(**change)[0].key != base[0].key, change


def test_the_launcher_refuses_what_the_kernel_cannot_run() -> None:
    with pytest.raises(ValueError, match=r"^block_v: 48 must divide V = 128|^block_v: expected"):
        _named(block_v=48)
    with pytest.raises(ValueError, match=r"^block_v: 64 must divide V = 96"):
        _named(block_v=64, v=96)


# --- compilation per arch ----------------------------------------------------------------

ARCH_MMA = {"gfx942": "mfma", "gfx950": "mfma", "gfx1250": "wmma"}
MNEMONIC = {
    ("gfx942", "bfloat16"): "v_mfma_f32_16x16x16_bf16",
    ("gfx942", "float16"): "v_mfma_f32_16x16x16_f16",
    ("gfx950", "bfloat16"): "v_mfma_f32_16x16x32_bf16",
    ("gfx950", "float16"): "v_mfma_f32_16x16x32_f16",
    ("gfx1250", "bfloat16"): "v_wmma_f32_16x16x32_bf16",
    ("gfx1250", "float16"): "v_wmma_f32_16x16x32_f16",
}
# (K, BV, dtype, g, gk, h0, final, save, varlen)
COMPILED = [
    (128, 64, "bfloat16", True, False, True, True, True, False),
    (128, 16, "bfloat16", True, False, False, True, True, True),
    (64, 32, "float16", False, True, True, False, False, False),
    (256, 64, "bfloat16", True, True, True, True, True, True),
]

_CHILD = """
import json, os, shutil, sys, time
from pathlib import Path
import torch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.chunk_gdn_h.kernels import chunk_h as ch

arch, mma, configs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
dump, keep = Path(sys.argv[4]), Path(sys.argv[5])

def launch(cfg, device):
    k, bv, dt, g, gk, h0, final, save, varlen = cfg
    dtype, f32 = getattr(torch, dt), torch.float32
    b, t, hg, h, v = (1 if varlen else 2), 150, 2, 4, 128
    n = 3 if varlen else b
    e = lambda *s, d=dtype: torch.empty(s, dtype=d, device=device)
    start = time.perf_counter()
    ch.launch_chunk_gdn_h(
        e(b, t, hg, k), e(b, t, h, k), e(b, t, h, v), e(b, t, h, d=f32) if g else None,
        e(b, t, h, k, d=f32) if gk else None, e(b, 5, h, k, v), e(b, t, h, v) if save else None,
        e(n, h, k, v, d=f32) if h0 else None, e(n, h, k, v, d=f32) if final else None,
        e(n + 1, d=torch.int32) if varlen else None, e(n + 1, d=torch.int32) if varlen else None,
        num_seqs=n, chunk_size=64, block_v=bv, mma=mma)
    return time.perf_counter() - start

""" + LIST_THEN_BUILD


@pytest.fixture(scope="module", params=list(ARCH_MMA))
def compiled(request, rocm_path: str, tmp_path_factory) -> dict:
    """One child process per arch compiles COMPILED twice: with FlyDSL's ISA listing, then
    into a disk cache inside a compiling dry run."""
    arch = request.param
    mma = ARCH_MMA[arch]
    root = tmp_path_factory.mktemp(f"chunk_gdn_h_{arch}")
    (root / "isa").mkdir()
    env = compile_env(arch, rocm_path, root / "cache")
    args = [arch, mma, json.dumps(COMPILED), str(root / "dump"), str(root / "isa")]
    child = run_child(_CHILD, args, env)
    assert child.returncode == 0, (
        f"{arch}: compile process exited with {child.returncode}"
        f" (negative: killed by signal)\n{child.stderr[-4000:]}"
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    return {"arch": arch, "mma": mma, **result}


@pytest.mark.slow
def test_code_objects_target_the_arch_and_hold_its_mma(compiled: dict) -> None:
    from aiter.flydsl_bridge import elf, extract_code_objects

    arch = compiled["arch"]
    for idx, built in enumerate(compiled["built"]):
        assert [name for name, _ in built["entries"]] == ["chunk_gdn_h"], idx
        for _, path in built["entries"]:
            codes = extract_code_objects(path)
            assert len(codes) == 1, path
            header = elf.parse_header(codes[0])
            assert header.e_machine == 224 and header.e_flags & 0xFF == elf.ARCH_TO_MACH[arch]
            text = disassemble_or_skip(codes[0], arch)
            assert MNEMONIC[(arch, COMPILED[idx][2])] in text, (idx, path)


@pytest.mark.slow
def test_isa_listing(compiled: dict) -> None:
    """Per chunk and wave: the two products' MMA calls (v_new's BT/16 tiles over K/32
    contraction blocks, the state's K/16 tiles over BT/32), in the arch's instructions; two
    barriers around the k^T staging; LDS of the tile's size; no spills; the arch's wave
    size."""
    from aiter.flydsl_bridge import listing as L

    arch, mma = compiled["arch"], compiled["mma"]
    wsz = ix.WAVE_SIZE[mma]
    per_call = 2 if arch == "gfx942" else 1  # gfx942 has the 16x16x16 MFMA only
    for idx, listed in enumerate(compiled["listed"]):
        k, bv, dt = COMPILED[idx][:3]
        text = Path(listed["isa"]["chunk_gdn_h_kernel"]).read_text()
        assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text
        assert f".wavefront_size: {wsz}" in text
        assert ("v_wmma" if mma == "mfma" else "v_mfma") not in text
        spills = re.findall(r"\.(?:v|s)gpr_spill_count:\s+(\d+)", text)
        assert spills and all(s == "0" for s in spills), (idx, spills)
        lds = int(re.search(r"\.group_segment_fixed_size:\s+(\d+)", text).group(1))
        assert lds == 2 * ix.kt_lds_elements(k, 64), (idx, lds)
        loop = L.main_loop(L.parse_listing(text))
        assert loop is not None, idx
        fig = L.loop_figures(loop, wsz)
        calls = (64 // 16) * (k // 32) + (k // 16) * (64 // 32)  # v_new, then the state
        assert fig.mma_count == calls * per_call, (idx, fig.to_dict())
        # A one-wave work-group (BV 16) needs no barrier: the compiler drops them.
        assert fig.barriers == (2 if ix.waves(bv) > 1 else 0), idx
        assert not any(re.match(r"ds_(?:write|store)_b(8|16)\b", i.mnemonic) for i in loop.body)
