"""Host side of the microscaled GEMMs (gemm_a4w4, gemm_mxfp8): the scale shuffle against the
kernel's index math, the tiles, the entries' checks and arch refusals, their plans inside a
gfx950 dry run (naming mode, no compile), the torch path against the dequantized reference, and
aiter's own MX table formats.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import aiter
from aiter.ops.gemm import mx_entry
from aiter.ops.gemm import plan as gemm_plan
from aiter.ops.gemm.kernels import mx as kmx
from aiter.ops.gemm.table import A4W4
from aiter.ops.shared import mainloop_index as ix
from aiter.tuning import TableError
from op_tests.gemm.mx_dry_run_child import AITER_A4W4

REPO = Path(__file__).resolve().parents[2]

BF16 = torch.bfloat16
E8M0 = torch.float8_e8m0fnu


# --- the scale shuffle is the layout the kernel's index math reads ---------------------------


@pytest.mark.parametrize("rows, blocks", [(3, 4), (16, 16), (5, 33), (2, 224)])
def test_shuffled_scale_bytes_are_where_each_lane_reads_them(rows: int, blocks: int) -> None:
    """Every block's scale sits at mx_scale_byte(row, call, lane) for the lane group that
    multiplies it (block 4 c + q of call c, lane group q), and the padding holds 1.0."""
    gen = torch.Generator().manual_seed(rows * blocks)
    plain = torch.randint(0, 255, (rows, blocks), generator=gen, dtype=torch.uint8)
    shuffled = kmx.shuffle_mx_scale(plain)
    row_bytes = ix.mx_scale_groups(blocks * 32) * ix.MX_GROUP_BYTES
    assert shuffled.shape == kmx.mx_scale_shape(rows, blocks * 32)
    flat = shuffled.reshape(-1)
    for row in range(rows):
        for block in range(blocks):
            call, group = divmod(block, ix.MX_BLOCKS_PER_CALL)
            byte = ix.mx_scale_byte(row, call, 16 * group, row_bytes)
            assert flat[byte] == plain[row, block]
            assert ix.mx_shuffled_position(block) == divmod(byte - row * row_bytes, 16)
    padding = shuffled.reshape(rows, -1).sum() - plain.to(torch.int64).sum()
    assert padding == 127 * rows * (row_bytes - blocks)
    assert torch.equal(kmx.unshuffle_mx_scale(shuffled, blocks), plain)


def test_a_k_tiles_scales_are_one_aligned_load() -> None:
    """A lane's scales of the calls of one k-tile (1, 2 or 4 calls, the k-tile's first call a
    multiple of that) are consecutive bytes, aligned to their count: one load."""
    for calls in (1, 2, 4):
        for first in range(0, 32, calls):
            for lane in (0, 17, 35, 63):
                bytes_ = [ix.mx_scale_byte(7, first + c, lane, 64) for c in range(calls)]
                assert bytes_ == list(range(bytes_[0], bytes_[0] + calls))
                assert bytes_[0] % calls == 0


@pytest.mark.parametrize("fmt, kb_per_call, elements_per_byte", [("fp4", 1, 2), ("fp8", 2, 1)])
def test_each_lanes_run_is_one_mx_block(fmt, kb_per_call, elements_per_byte) -> None:
    """The MX operand mapping: in every call the four lane groups' runs tile the call's 64 or
    128 bytes of a row once, and lane group q's run is exactly MX block 4 c + q of the row (its
    scale's block), for every call c of a k-tile of up to four calls."""
    chunk_elems = ix.CHUNK_BYTES * elements_per_byte
    for call in range(4):
        first_kb = call * kb_per_call
        covered = []
        for lane in range(64):
            chunks = [ix.mx_run_chunk(first_kb, lane, piece, kb_per_call)
                      for piece in range(kb_per_call)]  # fmt: skip
            elements = [c * chunk_elems + e for c in chunks for e in range(chunk_elems)]
            block = 4 * call + lane // 16
            assert elements == list(range(32 * block, 32 * block + 32)), (fmt, call, lane)
            if lane % 16 == 0:
                covered += chunks
        assert sorted(covered) == list(range(first_kb * 4, (first_kb + kb_per_call) * 4))


def test_shuffle_keeps_the_e8m0_dtype_and_refuses_other_input() -> None:
    scales = torch.full((2, 8), 127, dtype=torch.uint8).view(E8M0)
    assert aiter.shuffle_mx_scale(scales).dtype == E8M0
    with pytest.raises(TypeError, match="scale: expected a uint8 or float8_e8m0fnu"):
        aiter.shuffle_mx_scale(torch.zeros(2, 8))
    with pytest.raises(ValueError, match=r"scale: expected a 2-D \[rows, K / 32\]"):
        aiter.shuffle_mx_scale(torch.zeros(2, 2, 8, dtype=torch.uint8))


# --- tiles -----------------------------------------------------------------------------------


def test_tiles_reach_256_and_k_tiles_are_whole_calls() -> None:
    for fmt in kmx.MX_FORMATS:
        tiles = kmx.MX_TILES[fmt]["mfma"]
        assert max(t.tile_n for t in tiles) == 256 and max(t.tile_m for t in tiles) == 256
        assert all(t.tile_k % kmx.CALL_K == 0 for t in tiles)
    assert kmx.MXTile(64, 64, 512) in kmx.MX_TILES["fp4"]["mfma"]
    reason = kmx.mx_tile_problem(kmx.MXTile(64, 64, 384), "fp4")
    assert reason == "has tile_k 384: a k-tile is 1, 2 or 4 scaled MFMA calls of 128"
    assert "SGPRs" in kmx.mx_tile_problem(kmx.MXTile(256, 64, 512), "fp8")


@pytest.mark.parametrize(
    "name, message",
    [
        ("flydsl_a4w4_mfma_64x64x384", "the tile does not fit: it has tile_k 384"),
        ("flydsl_a4w4_wmma_64x64x256", "names a wmma kernel, but this arch uses mfma"),
    ],
)
def test_a_row_naming_a_tile_the_kernels_lack_is_refused(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gemm_plan.A4W4.parse_kernel_name(name, "mfma")


# --- the entries ------------------------------------------------------------------------------


def test_entries_are_lazy_attributes_of_aiter() -> None:
    assert aiter.gemm_a4w4 is mx_entry.gemm_a4w4
    assert aiter.gemm_mxfp8 is mx_entry.gemm_mxfp8
    assert aiter.unshuffle_mx_scale is kmx.unshuffle_mx_scale


@pytest.mark.parametrize("entry", [mx_entry.gemm_a4w4, mx_entry.gemm_mxfp8])
@pytest.mark.parametrize(
    "arch, reason",
    [
        ("gfx942", "gfx942 has no MX instructions"),
        ("gfx1250", "no MX GEMM kernel for gfx1250 yet"),
    ],
)
def test_archs_without_mx_kernels_raise_not_implemented(monkeypatch, entry, arch, reason) -> None:
    """Refused before anything else is looked at: the builder reports these archs' rows as
    SKIP ("runtime declines")."""
    monkeypatch.setattr(mx_entry.device, "arch", lambda: arch)
    with pytest.raises(NotImplementedError, match=reason):
        entry(None, None, None, None)


@pytest.fixture(scope="module")
def gfx950(tmp_path_factory) -> dict:
    """The entries' calls inside a gfx950 dry run, in a child process (one arch per process)."""
    tables = tmp_path_factory.mktemp("mx_tables")
    proc = subprocess.run(
        [sys.executable, "-m", "op_tests.gemm.mx_dry_run_child", str(tables)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("fmt", kmx.MX_FORMATS)
def test_default_rows_plan_kernels_on_gfx950(gfx950, fmt: str) -> None:
    """DeepSeek-R1's q_a_proj (MXFP4) and Llama-3.1-70B's o_proj (MXFP8) at M = 100: the
    default row of bucket M = 128 names the kernel, requested in the MX mode on bytes."""
    got = gfx950[f"default_{fmt}"]
    n = 1536 if fmt == "fp4" else 8192
    assert got["out"] == [[100, n], "torch.bfloat16"]
    (record,) = got["records"]
    assert record["backend"] == "flydsl" and record["source"] == "table"
    prefix = "flydsl_a4w4_mfma_" if fmt == "fp4" else "flydsl_a8w8_mxfp8_mfma_"
    assert record["kernel"].startswith(prefix)
    (request,) = got["requests"]
    assert request["function"] == ("gemm_a4w4" if fmt == "fp4" else "gemm_mxfp8")
    params = request["params"]
    assert params["a"] == params["b"] == params["a_scale"] == params["b_scale"] == "uint8"
    assert params["has_bias"] == "False"


def test_bias_and_out_dtype_are_their_own_kernels(gfx950) -> None:
    (plain,) = gfx950["no_bias"]["requests"]
    (biased,) = gfx950["bias_fp16"]["requests"]
    assert (biased["params"]["has_bias"], biased["params"]["out"]) == ("True", "float16")
    assert biased["key"] != plain["key"]


@pytest.mark.parametrize(
    "scenario, error, message",
    [
        ("k_48", "ValueError", "K must be a positive multiple of the MX block 32, got 48"),
        ("n_24", "ValueError", "N % 16 == 0, got N=24"),
        ("fnuz", "TypeError", "A must have dtype in"),
        ("plain_scale", "ValueError", "A_scale must have shape [4, 1, 16], got [4, 8]"),
        ("fp32_out", "TypeError", "out_dtype must be one of"),
        ("bias_dtype", "TypeError", "bias must have dtype in"),
    ],
)
def test_validation_errors_name_the_argument(gfx950, scenario, error, message) -> None:
    got = gfx950[scenario]
    assert got["error"] == error and message in got["message"], got


# --- the torch path computes what the kernels compute ------------------------------------------


@pytest.mark.parametrize("fmt", kmx.MX_FORMATS)
def test_torch_path_matches_the_dequantized_reference(fmt: str) -> None:
    """The path torch serves (a torch row, or a shape no kernel serves) unshuffles the weight
    and the scales and multiplies the dequantized operands."""
    gen = torch.Generator().manual_seed(3)
    m, n, k = 5, 32, 96  # K: three MX blocks, a partial scale group
    a, b = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    quantize = aiter.mxfp4_quantize if fmt == "fp4" else aiter.mxfp8_quantize
    (aq, a_s), (bq, b_s) = quantize(a), quantize(b)
    b_shuffled = aiter.shuffle_weight(bq.view(torch.uint8)).view(bq.dtype)
    bias = torch.randn(n, generator=gen).to(BF16)
    out = mx_entry._torch_mx_gemm(fmt, aq, b_shuffled, aiter.shuffle_mx_scale(a_s),
                                  aiter.shuffle_mx_scale(b_s), bias, BF16, k)  # fmt: skip
    ref = aiter.mx_dequantize(aq, a_s) @ aiter.mx_dequantize(bq, b_s).T + bias.float()
    torch.testing.assert_close(out, ref.to(BF16))


# --- aiter's own MX tables load --------------------------------------------------------------


def test_aiters_a4w4_table_loads_and_its_rows_are_served_here(gfx950) -> None:
    """aiter's a4w4 file has no gfx or libtype column: the arch comes from cu_num by aiter's
    rule, the backend from the kernel name; its CK rows (and its rows without a kernel, as
    N = 576 here) are served by this library's heuristic, and the record says so."""
    (record,) = gfx950["aiter_a4w4"]["records"]
    assert record["backend"] == "flydsl" and record["row"].endswith("a4w4.csv:3")
    assert "aiter's ck kernel" in record["params"]["served_as"]


def test_a_torch_row_is_served_by_torch_inside_a_dry_run(gfx950) -> None:
    got = gfx950["torch_row"]
    assert got["out"] == [[9, 64], "torch.bfloat16"] and got["requests"] == []
    (record,) = got["records"]
    assert record["backend"] == "torch" and record["row"].endswith("torch.csv:2")


def test_aiters_mxfp8_flydsl_row_carries_its_tile(gfx950) -> None:
    (record,) = gfx950["aiter_mxfp8"]["records"]
    assert record["kernel"] == "flydsl_a8w8_mxfp8_mfma_32x128x256"
    assert record["params"]["split_k"] == "1"
    assert record["params"]["row_backend"] == "flydsl_mxfp8"


def test_a_kernel_id_below_minus_one_is_refused_at_load(tmp_path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(AITER_A4W4.replace(",-1,0,nan", ",-2,0,nan"))
    with pytest.raises(TableError, match="kernelId"):
        A4W4.load([str(path)])
