"""Tests of the a16w16 GEMM FlyDSL kernels without a GPU: their index math emulated on CPU
against torch, their lane layouts against FlyDSL's MMA atoms, and compilation per arch."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from aiter.ops.gemm.kernels import a16w16 as g
from aiter.ops.shared import mainloop_index as mx
from op_tests.compile_child import compile_env, disassemble_or_skip, run_child
from op_tests.shared.mainloop_emulation import conflict_summary, emulate_a16w16, fast_first

REPO = Path(__file__).resolve().parents[2]
ARCH_FLAVOUR = {"gfx942": "mfma", "gfx950": "mfma", "gfx1250": "wmma"}
# K of one MMA instruction: gfx942 16x16x16, gfx950 16x16x32, gfx1250 WMMA 16x16x32.
MMA_K = {"mfma": 16, "wmma": 32}


# --- FlyDSL's MMA atoms: what each lane's registers hold ---------------------------------


def _layout_offset(shape, stride, x: int) -> int:
    """Offset of flat coordinate x in a (nested) CuTe-style layout, first mode fastest."""
    if isinstance(shape, int):
        return x * stride
    offset = 0
    for sub_shape, sub_stride in zip(shape, stride, strict=True):
        size = _layout_size(sub_shape)
        offset += _layout_offset(sub_shape, sub_stride, x % size)
        x //= size
    return offset


def _layout_size(shape) -> int:
    if isinstance(shape, int):
        return shape
    size = 1
    for sub in shape:
        size *= _layout_size(sub)
    return size


def _parse_layout(text: str):
    """`!fly.layout<((16,4),4):((1,64),16)>` -> (shape, stride) as nested tuples."""
    body = re.fullmatch(r"!fly\.layout<(.*)>", str(text).strip()).group(1)
    shape, stride = body.split(":")
    return ast.literal_eval(shape), ast.literal_eval(stride)


def _tv_table(text: str, rows: int, values: int) -> list[list[tuple[int, int]]]:
    """[lane][value] -> (row, column) inside the 16 x `cols` operand tile (column-major)."""
    shape, stride = _parse_layout(text)
    thr_shape, val_shape = shape
    thr_stride, val_stride = stride
    assert _layout_size(val_shape) == values
    table = []
    for lane in range(_layout_size(thr_shape)):
        base = _layout_offset(thr_shape, thr_stride, lane)
        table.append(
            [
                divmod(base + _layout_offset(val_shape, val_stride, v), rows)[::-1]
                for v in range(values)
            ]
        )
    return table


_ATOMS: dict[str, dict[str, list]] = {}


def atom_tables(mma: str) -> dict[str, list]:
    """A, B and C thread-value tables of the MMA atom FlyDSL defines for the kernel's
    instruction (bf16 and fp16 share one layout)."""
    if mma not in _ATOMS:
        from flydsl._mlir import ir
        from flydsl._mlir._mlir_libs._mlirDialectsFly import MmaAtomType
        from flydsl._mlir._mlir_libs._mlirDialectsFlyROCDL import (
            MmaOpCDNA3_MFMAType,
            MmaOpGFX1250_WMMAType,
        )

        wsz = mx.WAVE_SIZE[mma]
        k = MMA_K[mma]
        with ir.Context(), ir.Location.unknown():
            bf16, f32 = ir.BF16Type.get(), ir.F32Type.get()
            if mma == "mfma":
                op = MmaOpCDNA3_MFMAType.get(16, 16, k, bf16, bf16, f32)
            else:
                op = MmaOpGFX1250_WMMAType.get(16, 16, k, bf16, bf16, f32)
            atom = MmaAtomType.get(op)
            assert str(atom.thr_layout) == f"!fly.layout<{wsz}:1>"
            per_lane = 16 * k // wsz
            _ATOMS[mma] = {
                "A": _tv_table(atom.tv_layout_a, 16, per_lane),
                "B": _tv_table(atom.tv_layout_b, 16, per_lane),
                "C": _tv_table(atom.tv_layout_c, 16, mx.acc_rows_per_lane(mma)),
            }
    return _ATOMS[mma]


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
def test_kernel_lane_math_matches_flydsl_mma_atom(mma: str) -> None:
    """The kernel feeds lane l the operand row l % 16 and reads C element (acc_row, acc_col);
    FlyDSL's atom for the same instruction must agree, and A and B must pair each K slot."""
    wsz = mx.WAVE_SIZE[mma]
    tables = atom_tables(mma)
    for lane in range(wsz):
        for e, ((a_row, a_k), (b_col, b_k)) in enumerate(
            zip(tables["A"][lane], tables["B"][lane], strict=True)
        ):
            assert a_row == mx.operand_row(0, lane), (lane, e)
            assert b_col == mx.operand_row(0, lane), (lane, e)
            assert a_k == b_k, (lane, e)
        for e, (row, col) in enumerate(tables["C"][lane]):
            assert (row, col) == (mx.acc_row(lane, e, mma), mx.acc_col(lane)), (lane, e)


def test_atom_layout_parser() -> None:
    # CDNA3 16x16x16 MFMA A operand: lane l holds row l % 16, K slots 4 * (l // 16) + v.
    table = _tv_table("!fly.layout<((16,4),4):((1,64),16)>", 16, 4)
    assert table[0] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert table[17] == [(1, 4), (1, 5), (1, 6), (1, 7)]
    assert table[63][3] == (15, 15)


# --- pure index math ---------------------------------------------------------------------


@pytest.mark.parametrize("num_kb", [0, 1, 2, 3, 5, 8, 13, 64])
@pytest.mark.parametrize("split_k", [1, 2, 3, 4, 7, 16])
def test_split_k_ranges_cover_k_once(num_kb: int, split_k: int) -> None:
    seen = []
    sizes = []
    previous_end = 0
    for split in range(split_k):
        begin, end = mx.split_k_range(split, num_kb, split_k)
        assert begin == previous_end and begin <= end
        previous_end = end
        seen.extend(range(begin, end))
        sizes.append(end - begin)
    assert seen == list(range(num_kb))
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize(("begin", "end"), [(0, 0), (0, 1), (3, 8), (5, 10), (2, 3)])
def test_k_tiles_cover_the_split(blocks: int, begin: int, end: int) -> None:
    """The main loop's k-tiles reach every k-block of the split; the k-blocks of a partial
    last k-tile past the split's end are the ones loaded as zeros."""
    tiles = mx.k_tiles(begin, end, blocks)
    visited = [begin + t * blocks + j for t in range(tiles) for j in range(blocks)]
    assert [kb for kb in visited if kb < end] == list(range(begin, end))
    assert len(visited) - (end - begin) < blocks


@pytest.mark.slow  # every tile of both flavours: seconds; the emulations cover the fast set
@pytest.mark.parametrize("mma", ["mfma", "wmma"])
def test_every_tile_element_has_one_owner(mma: str) -> None:
    """Across waves, MMA repeats, lanes and accumulator elements, a block covers its tile once;
    so do the epilogue's 16-byte runs."""
    wsz = mx.WAVE_SIZE[mma]
    for tile in g.SUPPORTED_TILES[mma]:
        reps_m, reps_n = mx.mma_repeats(tile.tile_m, tile.tile_n)
        owners = torch.zeros(tile.tile_m, tile.tile_n, dtype=torch.int32)
        for wave in range(mx.WAVES_PER_BLOCK):
            for i in range(reps_m):
                for j in range(reps_n):
                    for lane in range(wsz):
                        for e in range(mx.acc_rows_per_lane(mma)):
                            r = i * 16 + mx.acc_row(lane, e, mma)
                            c = mx.wave_col0(wave, tile.tile_n) + j * 16 + mx.acc_col(lane)
                            owners[r, c] += 1
        assert torch.equal(owners, torch.ones_like(owners)), tile
        for out_bytes in (2, 4):
            stored = torch.zeros(16, mx.wave_cols(tile.tile_n), dtype=torch.int32)
            for store_pass in range(mx.out_store_passes(tile.tile_n, out_bytes, mma)):
                for lane in range(wsz):
                    row, col, real = mx.out_read_coord(
                        store_pass, lane, tile.tile_n, out_bytes, mma
                    )
                    if real:
                        stored[row, col : col + mx.CHUNK_BYTES // out_bytes] += 1
            assert torch.equal(stored, torch.ones_like(stored)), (tile, out_bytes)


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
def test_supported_tiles_fit_the_kernel(mma: str) -> None:
    for tile in g.SUPPORTED_TILES[mma]:
        assert tile.tile_m % mx.MMA_MN == 0
        assert tile.tile_n % (mx.WAVES_PER_BLOCK * mx.MMA_MN) == 0
        assert tile.tile_k % g.K_BLOCK == 0
        assert g.tile_problem(tile, mma) is None
    assert g.K_MULTIPLE == g.K_BLOCK == 32
    assert g.N_MULTIPLE == 1


def test_tiles_over_budget_are_not_supported() -> None:
    """256x256x64 needs more registers than a lane has room for (it spills on gfx942), so the
    registry leaves it out and says why."""
    big = g.GemmTile(256, 256, 64)
    assert big not in g.SUPPORTED_TILES["mfma"]
    assert "VGPRs" in g.tile_problem(big, "mfma")
    assert g.GemmTile(256, 256, 32) in g.SUPPORTED_TILES["mfma"]
    huge = g.GemmTile(1024, 64, 512)
    assert "LDS" in mx.budget_problem(1024, 64, 512, 2, 4, "mfma")
    assert huge not in g.SUPPORTED_TILES["mfma"]


# --- the kernels' data paths, emulated on CPU work-group by work-group ----------------------

EMULATED = [
    # arch, tile, split_k, M, N, K, in dtype, out dtype, bias
    ("gfx942", (32, 64, 64), 1, 45, 80, 160, torch.bfloat16, torch.bfloat16, True),
    ("gfx942", (16, 128, 32), 3, 7, 128, 96, torch.float16, torch.float32, True),
    ("gfx950", (64, 64, 64), 4, 70, 64, 64, torch.bfloat16, torch.float16, False),
    ("gfx950", (128, 64, 64), 2, 1, 40, 224, torch.float16, torch.float16, True),
    ("gfx942", (256, 128, 32), 1, 20, 130, 96, torch.bfloat16, torch.bfloat16, True),
    ("gfx1250", (32, 64, 64), 2, 33, 72, 160, torch.bfloat16, torch.bfloat16, True),
    ("gfx1250", (16, 64, 32), 1, 20, 64, 64, torch.float16, torch.float32, False),
    ("gfx1250", (128, 64, 32), 5, 130, 48, 96, torch.float16, torch.float16, True),
]


@pytest.mark.parametrize(
    ("arch", "tile", "split_k", "m", "n", "k", "dtype", "out_dtype", "with_bias"),
    fast_first(EMULATED, 2),
)
def test_emulated_work_groups_match_torch(arch, tile, split_k, m, n, k, dtype, out_dtype, with_bias) -> None:  # fmt: skip
    """(a) bit-exact against torch on small integers (every fp32 sum is exact), every element
    written once; (b) no LDS race: within a phase no byte one wave writes is touched by another."""
    gen = torch.Generator().manual_seed(m * 1000 + n + k + split_k)
    a = torch.randint(-3, 4, (m, k), generator=gen).to(dtype)
    b = torch.randint(-3, 4, (n, k), generator=gen).to(dtype)
    bias = torch.randint(-8, 9, (n,), generator=gen).to(out_dtype) if with_bias else None
    run = emulate_a16w16(a, b, bias, out_dtype, g.GemmTile(*tile), split_k, arch)

    expected = a.float() @ b.float().T
    if bias is not None:
        expected = expected + bias.float()
    assert torch.equal(run.out, expected.to(out_dtype))
    assert torch.equal(run.writes, torch.ones(m, n, dtype=torch.int32))
    if split_k > 1:  # every split writes its whole partial, zeros for an empty K range
        assert torch.equal(run.workspace_writes, torch.ones(split_k, m, n, dtype=torch.int32))
    assert run.races == []


# Extra LDS cycles bank conflicts cost in the main loop, under the emulation's bank model.
EXPECTED_CONFLICTS = {"A write": 0, "A read": 0}


@pytest.mark.parametrize(
    ("arch", "tile_k"),
    fast_first([("gfx950", 32), ("gfx950", 64), ("gfx1250", 32), ("gfx1250", 64)], 1),
)
def test_swizzle_leaves_operand_traffic_free_of_bank_conflicts(arch: str, tile_k: int) -> None:
    """(c) The A stage's writes and the MMA operand reads take one LDS cycle per eight lanes;
    the epilogue's staging (once per tile, not per k-tile) is counted and bounded at twice
    the ideal (its 16-byte reads of two 64-byte rows share banks: 2 cycles per 8 lanes)."""
    a = torch.ones(128, tile_k * 2, dtype=torch.bfloat16)
    b = torch.ones(128, tile_k * 2, dtype=torch.bfloat16)
    run = emulate_a16w16(a, b, None, torch.bfloat16, g.GemmTile(128, 128, tile_k), 1, arch)
    summary = conflict_summary(run.stats)
    print(summary)
    for kind, extra in EXPECTED_CONFLICTS.items():
        assert run.stats[kind].extra_cycles == extra, summary
    for kind in ("C write", "C read"):
        assert run.stats[kind].cycles <= 2 * run.stats[kind].ideal_cycles, summary


@pytest.mark.parametrize("cpr", [2, 4, 8, 16])
def test_the_swizzle_repeats_every_16_rows(cpr: int) -> None:
    """The MMA operand reads use one address per lane plus a constant per repeat."""
    for row in range(64):
        for chunk in range(cpr):
            assert mx.a_lds_byte(row + 16, chunk, cpr) == (
                mx.a_lds_byte(row, chunk, cpr) + mx.rep_stride_bytes(cpr)
            )


def test_an_unswizzled_stage_would_conflict() -> None:
    """The bank model sees the conflicts the swizzle removes: eight rows' same chunk, unswizzled
    (row pitch 128 bytes), all fall on one group of four banks."""
    from op_tests.shared.mainloop_emulation import Lds

    lds = Lds(nbytes=128 * 64)
    lds.instruction("plain", 0, [(lane % 16) * 128 for lane in range(64)], 16)
    lds.instruction("swizzled", 0, [mx.a_lds_byte(lane % 16, 0, 8) for lane in range(64)], 16)
    assert lds.stats["plain"].cycles == 8 * lds.stats["plain"].ideal_cycles
    assert lds.stats["swizzled"].extra_cycles == 0


# --- host entry --------------------------------------------------------------------------


def _tensors(m=4, n=64, k=64):
    return (
        torch.empty(m, k, dtype=torch.bfloat16),
        torch.empty(n, k, dtype=torch.bfloat16),
        torch.empty(m, n, dtype=torch.bfloat16),
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(tile=g.GemmTile(32, 64, 32), split_k=1, mma="xdl"), "mma: expected one of"),
        (dict(tile=g.GemmTile(32, 96, 32), split_k=1, mma="mfma"), "tile: .* not supported"),
        (dict(tile=g.GemmTile(32, 64, 48), split_k=1, mma="wmma"), "tile: .* not supported"),
        (dict(tile=g.GemmTile(32, 64, 32), split_k=0, mma="mfma"), "split_k: expected an int"),
        (dict(tile=g.GemmTile(32, 64, 32), split_k=2, mma="mfma"), "workspace: expected"),
    ],
)
def test_launch_rejects_bad_arguments(kwargs, message) -> None:
    a, b, out = _tensors()
    with pytest.raises(ValueError, match=message):
        g.launch_gemm_a16w16(a, b, None, out, None, **kwargs)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((4, 48), (64, 48), (4, 64)), "a: K = a.shape.1. must be a positive multiple of 32"),
        (((4, 64), (64, 32), (4, 64)), r"b: expected shape \[N, 64\]"),
        (((4, 64), (64, 64), (5, 64)), r"out: expected shape \[4, 64\]"),
    ],
)
def test_launch_rejects_bad_shapes(shapes, message) -> None:
    a, b, out = (torch.empty(s, dtype=torch.bfloat16) for s in shapes)
    with pytest.raises(ValueError, match=message):
        g.launch_gemm_a16w16(
            a, b, None, out, None, tile=g.GemmTile(32, 64, 32), split_k=1, mma="mfma"
        )


@pytest.mark.gpu
def test_kernel_numerics_on_gpu() -> None:
    a = torch.randn(100, 256, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(192, 256, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(192, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(100, 192, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(3, 100, 192, dtype=torch.float32, device="cuda")
    for split_k, workspace in ((1, None), (3, ws)):
        g.launch_gemm_a16w16(
            a, b, bias, out, workspace, tile=g.GemmTile(32, 64, 64), split_k=split_k, mma="mfma"
        )
        torch.testing.assert_close(out, (a @ b.T + bias), rtol=2e-2, atol=2e-2)


# --- compilation per arch ----------------------------------------------------------------

# tile, split_k, input dtype, output dtype, bias: every dtype and both epilogues appear.
COMPILED = [
    ((64, 128, 64), 1, "bfloat16", "bfloat16", True),
    ((32, 64, 32), 3, "float16", "float32", True),
    ((16, 64, 64), 1, "float16", "float16", False),
    ((128, 128, 32), 2, "bfloat16", "bfloat16", False),
]

_CHILD = """
import json, sys, time
import torch
from aiter.ops.gemm.kernels.a16w16 import GemmTile, launch_gemm_a16w16

mma, configs = sys.argv[1], json.loads(sys.argv[2])
m, n, k = 37, 200, 160
times = []
for tile, split_k, dtype, out_dtype, with_bias in configs:
    dtype, out_dtype = getattr(torch, dtype), getattr(torch, out_dtype)
    a, b = torch.empty(m, k, dtype=dtype), torch.empty(n, k, dtype=dtype)
    out = torch.empty(m, n, dtype=out_dtype)
    bias = torch.empty(n, dtype=out_dtype) if with_bias else None
    ws = torch.empty(split_k, m, n, dtype=torch.float32) if split_k > 1 else None
    start = time.perf_counter()
    launch_gemm_a16w16(a, b, bias, out, ws, tile=GemmTile(*tile), split_k=split_k, mma=mma)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


@pytest.fixture(scope="module", params=list(ARCH_FLAVOUR))
def compiled(request, rocm_path: str, tmp_path_factory) -> dict:
    """Compile COMPILED for one arch in a child process; the cache entries it wrote."""
    arch = request.param
    mma = ARCH_FLAVOUR[arch]
    cache = tmp_path_factory.mktemp(f"cache_{arch}")
    child = run_child(_CHILD, [mma, json.dumps(COMPILED)], compile_env(arch, rocm_path, cache))
    assert child.returncode == 0, (
        f"{arch}: compile process exited with {child.returncode}"
        f" (negative: killed by signal)\n{child.stderr[-4000:]}"
    )
    return {
        "arch": arch,
        "mma": mma,
        "times": json.loads(child.stdout.strip().splitlines()[-1]),
        "main": sorted(cache.glob("gemm_a16w16_[0-9a-f]*/*.pkl")),
        "reduce": sorted(cache.glob("gemm_a16w16_splitk_reduce_*/*.pkl")),
    }


@pytest.mark.slow
def test_one_cache_entry_per_specialization(compiled: dict) -> None:
    print(f"{compiled['arch']} compile seconds: {[round(t, 2) for t in compiled['times']]}")
    assert len(compiled["main"]) == len(COMPILED)
    assert len(compiled["reduce"]) == sum(1 for cfg in COMPILED if cfg[1] > 1)


@pytest.mark.slow
def test_code_objects_target_the_arch(compiled: dict) -> None:
    from aiter.flydsl_bridge import elf, extract_code_objects

    for entry in compiled["main"] + compiled["reduce"]:
        codes = extract_code_objects(entry)
        assert len(codes) == 1, entry
        header = elf.parse_header(codes[0])
        assert header.e_machine == 224, entry
        assert header.e_flags & 0xFF == elf.ARCH_TO_MACH[compiled["arch"]], entry


@pytest.mark.slow
def test_disassembly_uses_the_arch_mma(compiled: dict) -> None:
    from aiter.flydsl_bridge import extract_code_objects

    arch = compiled["arch"]
    mma_prefix = {
        "gfx942": "v_mfma_f32_16x16x16",
        "gfx950": "v_mfma_f32_16x16x32",
        "gfx1250": "v_wmma_f32_16x16x32",
    }[arch]
    other_prefix = "v_wmma" if compiled["mma"] == "mfma" else "v_mfma"
    for entry in compiled["main"] + compiled["reduce"]:
        text = disassemble_or_skip(extract_code_objects(entry)[0], arch)
        assert (mma_prefix in text) == (entry in compiled["main"]), entry
        assert other_prefix not in text, entry


_ISA_CHILD = """
import sys
import torch
from aiter.ops.gemm.kernels.a16w16 import GemmTile, launch_gemm_a16w16

mma, dtype = sys.argv[1], getattr(torch, sys.argv[2])
a, b = torch.empty(37, 64, dtype=dtype), torch.empty(64, 64, dtype=dtype)
out = torch.empty(37, 64, dtype=dtype)
launch_gemm_a16w16(a, b, None, out, None, tile=GemmTile(16, 64, 32), split_k=1, mma=mma)
"""

# (arch, input dtype) -> the MMA instruction the kernel must use, and the wave size.
ISA_EXPECTED = {
    ("gfx942", "bfloat16"): ("v_mfma_f32_16x16x16_bf16", 64),
    ("gfx950", "float16"): ("v_mfma_f32_16x16x32_f16", 64),
    ("gfx1250", "bfloat16"): ("v_wmma_f32_16x16x32_bf16", 32),
}


@pytest.mark.slow
@pytest.mark.parametrize("arch, dtype", list(ISA_EXPECTED))
def test_isa_listing_uses_the_arch_mma(arch: str, dtype: str, rocm_path: str, tmp_path) -> None:
    """FlyDSL's own ISA listing of the compile (LLVM's AMDGPU backend output) for every arch,
    where no installed llvm-objdump can disassemble the code object."""
    expected, wave = ISA_EXPECTED[(arch, dtype)]
    mma = ARCH_FLAVOUR[arch]
    env = compile_env(arch, rocm_path, tmp_path / "cache", dump=tmp_path / "dump")
    child = run_child(_ISA_CHILD, [mma, dtype], env)
    assert child.returncode == 0, child.stderr[-4000:]
    listings = sorted((tmp_path / "dump").glob("gemm_a16w16_kernel_*/*final_isa.s"))
    assert len(listings) == 1, listings
    text = listings[0].read_text()
    assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text
    assert expected in text
    assert ("v_wmma" if mma == "mfma" else "v_mfma") not in text
    assert f".wavefront_size: {wave}" in text
