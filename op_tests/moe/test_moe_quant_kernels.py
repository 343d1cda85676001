"""Tests of the MoE per-token fp8 quantization kernel without a GPU: its data path emulated on
CPU block by block from the index functions, against the torch reference bit for bit; the
launcher's argument checks; compilation and the ISA listing per arch."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiter.ops.moe.kernels import quant
from aiter.ops.moe.kernels import quant_index as ix
from aiter.ops.moe.reference import per_token_quant
from op_tests.compile_child import compile_env, run_child

ARCHS = ("gfx942", "gfx950", "gfx1250")
WAVE_SIZE = {"gfx942": 64, "gfx950": 64, "gfx1250": 32}


# --- the kernel, emulated on CPU ---------------------------------------------------------


def _wave_max(lanes: list[torch.Tensor], wave_size: int) -> list[torch.Tensor]:
    """The xor-shuffle butterfly of the kernel over one wave's lanes (fp32 maxima)."""
    for offset in ix.xor_offsets(wave_size):
        lanes = [torch.maximum(lanes[lane], lanes[lane ^ offset]) for lane in range(wave_size)]
    return lanes


def emulate_block(x_row: torch.Tensor, fp8: torch.dtype, wave_size: int):
    """One block's work on one row as the kernel does it: (q row, scale, writes per element of
    q, the words of the row's scale written)."""
    k = x_row.numel()
    chunks = ix.chunks_for(k)
    fp8_max = torch.tensor(torch.finfo(fp8).max)
    runs = []  # runs[tid][c]: VEC fp32 values, zeros past the row (a buffer load's zero)
    for tid in range(ix.THREADS):
        mine = []
        for c in range(chunks):
            start = ix.run_start(c, tid)
            if start < k:
                assert start + ix.VEC <= k, "a run straddles the row's end"
                mine.append(x_row[start : start + ix.VEC].float())
            else:
                mine.append(torch.zeros(ix.VEC))
        runs.append(mine)
    thread_max = [torch.stack([r.abs().max() for r in mine]).max() for mine in runs]
    lds = []
    for w in range(ix.waves_per_block(wave_size)):
        lanes = _wave_max(thread_max[w * wave_size : (w + 1) * wave_size], wave_size)
        assert all(torch.equal(lane, lanes[0]) for lane in lanes), "lanes disagree on the word"
        lds.append(lanes[0])
    amax = torch.stack(lds).max()
    scale = torch.maximum(amax, torch.tensor(ix.SCALE_FLOOR, dtype=torch.float32)) / fp8_max
    q = torch.zeros(k, dtype=torch.float32)
    writes = torch.zeros(k, dtype=torch.int32)
    for tid in range(ix.THREADS):
        for c in range(chunks):
            start = ix.run_start(c, tid)
            if start < k:
                q[start : start + ix.VEC] = runs[tid][c] / scale
                writes[start : start + ix.VEC] += 1
    return q.to(fp8), scale, writes


def emulate(x: torch.Tensor, fp8: torch.dtype, wave_size: int):
    rows = [emulate_block(x[r], fp8, wave_size) for r in range(x.shape[0])]
    q = torch.stack([r[0] for r in rows])
    scale = torch.stack([r[1] for r in rows]).reshape(-1, 1)
    writes = torch.stack([r[2] for r in rows])
    return q, scale, writes


def _rows(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows of values over many magnitudes, a row of zeros and a row of one large value."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.logspace(-12, 4, k)[torch.randperm(k)]
    x = x.to(dtype)
    x[0] = 0
    if rows > 1:
        x[1] = 0
        x[1, k - 1] = -3.0e4
    return x


def _assert_reference(x: torch.Tensor, fp8: torch.dtype, wave_size: int) -> None:
    q, scale, writes = emulate(x, fp8, wave_size)
    q_ref, scale_ref = per_token_quant(x, fp8)
    assert torch.equal(writes, torch.ones_like(writes)), "an element not written exactly once"
    assert scale.dtype == torch.float32 and torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=["fn", "fnuz"])
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("wave_size", [64, 32])
@pytest.mark.parametrize("k", [64, 776, 2048, 4104])
def test_emulated_blocks_give_the_references_codes_and_scales(k, wave_size, act, fp8) -> None:
    _assert_reference(_rows(3, k, act, seed=k), fp8, wave_size)


@settings(max_examples=8, deadline=None)
@given(
    steps=st.integers(1, ix.MAX_K // ix.K_MULTIPLE),
    wave_size=st.sampled_from([32, 64]),
    fnuz=st.booleans(),
)
def test_every_row_length_is_covered_once_and_matches(steps, wave_size, fnuz) -> None:
    fp8 = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    _assert_reference(_rows(2, steps * ix.K_MULTIPLE, torch.bfloat16, seed=steps), fp8, wave_size)


def test_the_row_layout_fits_its_bounds() -> None:
    assert ix.chunks_for(ix.MAX_K) == ix.MAX_CHUNKS
    assert ix.chunks_for(ix.MAX_K + ix.K_MULTIPLE) == ix.MAX_CHUNKS + 1
    assert ix.ROW_STEP % ix.K_MULTIPLE == 0  # a run never straddles the row's end
    for wave_size in (32, 64):
        assert ix.THREADS % wave_size == 0
        assert 1 << len(ix.xor_offsets(wave_size)) == wave_size
    # The largest row's byte offsets stay below the buffers' out-of-range offset.
    from aiter.ops.shared.mainloop_index import OUT_OF_RANGE

    assert 2 * ix.MAX_K < OUT_OF_RANGE


# --- the launcher ------------------------------------------------------------------------------


@pytest.fixture
def gfx942(monkeypatch):
    monkeypatch.setattr(quant, "get_rocm_arch", lambda: "gfx942")


def _args(rows=4, k=256, act=torch.bfloat16, fp8=torch.float8_e4m3fnuz, scale_shape=None):
    return (
        torch.empty(rows, k, dtype=act),
        torch.empty(rows, k, dtype=fp8),
        torch.empty(scale_shape or (rows, 1), dtype=torch.float32),
    )


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(k=100), r"x: K = x.shape\[1\] must be a multiple of 8, got 100"),
        (dict(k=ix.MAX_K + 8), rf"x: K = x.shape\[1\]: expected an int in \[1, {ix.MAX_K}\]"),
        (dict(act=torch.float32), "x: expected dtype"),
        (dict(fp8=torch.float8_e4m3fn), "q: expected dtype"),
        (dict(scale_shape=(4,)), r"scale: expected shape \[rows, 1\] = \[4, 1\], got \[4\]"),
    ],
)
def test_launcher_refuses_bad_arguments(gfx942, kwargs, expected) -> None:
    with pytest.raises(ValueError, match=expected):
        quant.launch_moe_quant_per_token(*_args(**kwargs))


def test_no_rows_launch_nothing(gfx942, monkeypatch) -> None:
    def never(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(quant, "moe_quant_per_token", never)
    quant.launch_moe_quant_per_token(*_args(rows=0))


def test_the_launch_carries_rows_k_and_the_chunk_count(gfx942, monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(quant, "moe_quant_per_token", lambda *a, **kw: seen.append(a[3:]))
    quant.launch_moe_quant_per_token(*_args(rows=5, k=7168))
    assert seen == [(5, 7168, 4)]


# --- compilation and the ISA listing, per arch ---------------------------------------------

# K = 8, 7168 and MAX_K (1, 4 and 16 runs per thread); bf16, and fp16 at 7168.
ISA_CONFIGS = ((8, "bfloat16"), (7168, "bfloat16"), (7168, "float16"), (ix.MAX_K, "bfloat16"))

_ISA_CHILD = """
import json, os, sys
import torch
from flydsl.runtime.device import get_rocm_arch
from aiter.arch import get_arch
from aiter.ops.moe.kernels.quant import launch_moe_quant_per_token

root = sys.argv[1]
os.environ["FLYDSL_DEBUG_DUMP_ASM"] = "1"
for i, (k, dtype) in enumerate(json.loads(sys.argv[2])):
    os.environ["FLYDSL_DUMP_DIR"] = os.path.join(root, str(i))
    x = torch.empty(3, k, dtype=getattr(torch, dtype))
    q = torch.empty(3, k, dtype=get_arch(get_rocm_arch()).fp8_dtype)
    launch_moe_quant_per_token(x, q, torch.empty(3, 1))
"""


def _waits_on_loads(inst) -> bool:
    return inst.mnemonic.startswith("s_wait_loadcnt") or (
        inst.mnemonic == "s_waitcnt" and "vmcnt" in inst.operands
    )


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_isa_reads_the_row_once_with_every_load_before_the_first_wait(
    arch: str, rocm_path: str, tmp_path
) -> None:
    """Per config: the arch's target and wave size; no loop; the thread's `chunks` 16-byte
    loads all issued before the first memory wait; one barrier and one LDS word per wave; two
    cvt_pk_fp8 per run and one 8-byte store per run; no scratch; at least 4 waves per SIMD
    where the occupancy model knows the arch."""
    from aiter.flydsl_bridge import listing as isa

    dump = tmp_path / "dump"
    env = compile_env(arch, rocm_path, tmp_path / "cache")
    child = run_child(_ISA_CHILD, [str(dump), json.dumps(ISA_CONFIGS)], env)
    assert child.returncode == 0, child.stderr[-4000:]
    figures = []
    for i, (k, dtype) in enumerate(ISA_CONFIGS):
        chunks = ix.chunks_for(k)
        listings = sorted((dump / str(i)).glob("moe_quant_per_token_kernel_*/*final_isa.s"))
        assert len(listings) == 1, (k, dtype, listings)
        text = listings[0].read_text()
        assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text
        assert f".wavefront_size: {WAVE_SIZE[arch]}" in text
        lst = isa.parse_listing(text)
        ops = [inst.mnemonic for inst in lst.instructions]
        assert isa.loops(lst) == [], (k, dtype)
        loads = [n for n, op in enumerate(ops) if isa.vmem_kind(op) == "load"]
        assert len(loads) == chunks and all(isa.access_bytes(ops[n]) == 16 for n in loads)
        first_wait = next(n for n, inst in enumerate(lst.instructions) if _waits_on_loads(inst))
        assert loads[-1] < first_wait, (k, dtype, "a load issued after a wait on memory")
        assert sum(op.startswith("v_cvt_pk_fp8_f32") for op in ops) == 4 * chunks
        stores = [op for op in ops if isa.vmem_kind(op) == "store"]
        assert sorted(isa.access_bytes(op) for op in stores) == [4] + [8] * chunks
        assert sum(op in ("s_barrier", "s_barrier_wait") for op in ops) == 1
        assert lst.lds_bytes >= 4 * ix.waves_per_block(WAVE_SIZE[arch])
        assert lst.scratch_bytes == 0 and lst.vgpr_spills == 0
        waves = isa.occupancy(arch, lst.arch_vgprs, 0, lst.lds_bytes, lst.waves_per_block or 1)
        assert waves is None or waves >= 4, (k, dtype, lst.arch_vgprs, waves)
        figures.append((k, dtype, chunks, lst.arch_vgprs, lst.sgprs, lst.lds_bytes, waves))
    print(f"{arch} (K, dtype, runs, VGPRs, SGPRs, LDS bytes, waves/SIMD): {figures}")
