"""The default tables are exactly what their generator writes, and hold what the README says."""

from __future__ import annotations

import csv

import pytest

from aiter.ops.gemm import generate
from aiter.tuning.spec import CONFIG_DIR

CONFIGS = CONFIG_DIR


@pytest.mark.parametrize("recipe", generate.RECIPES, ids=lambda r: r.file)
def test_table_is_what_the_generator_writes(recipe) -> None:
    assert generate.render(recipe) == (CONFIGS / recipe.file).read_text()


def _rows(name: str) -> list[dict[str, str]]:
    with open(CONFIGS / name, newline="") as handle:
        return list(csv.DictReader(handle))


def test_no_row_claims_a_measurement() -> None:
    for recipe in generate.RECIPES:
        assert {row["us"] for row in _rows(recipe.file)} == {""}, recipe.file


def test_archs_per_family() -> None:
    archs = {r.file: {row["gfx"] for row in _rows(r.file)} for r in generate.RECIPES}
    assert archs == {
        "bf16_tuned_gemm.csv": {"gfx942", "gfx950", "gfx1250"},
        "a8w8_bpreshuffle_tuned_gemm.csv": {"gfx942", "gfx950", "gfx1250"},
        "a8w8_blockscale_tuned_gemm.csv": {"gfx942", "gfx950"},
        "a8w8_blockscale_bpreshuffle_tuned_gemm.csv": {"gfx942", "gfx950"},
        # only gfx950 has the scaled MFMA
        "a4w4_blockscale_tuned_gemm.csv": {"gfx950"},
        "a8w8_bpreshuffle_mxfp8_tuned_gemm.csv": {"gfx950"},
    }


def test_fp8_flavour_follows_the_arch() -> None:
    flavours = {(r["gfx"], r["q_dtype_w"]) for r in _rows("a8w8_bpreshuffle_tuned_gemm.csv")}
    assert flavours == {
        ("gfx942", "torch.float8_e4m3fnuz"),
        ("gfx950", "torch.float8_e4m3fn"),
        ("gfx1250", "torch.float8_e4m3fn"),
    }


def test_model_shapes() -> None:
    # Llama-3.1-70B at TP8: qkv, o, gate_up, down
    llama = {(int(r["N"]), int(r["K"])) for r in _rows("a8w8_bpreshuffle_tuned_gemm.csv")}
    assert {(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)} <= llama
    # DeepSeek-V3 dense layers at TP8: q_a, q_b, kv_b, o, gate_up, down
    deepseek = {(int(r["N"]), int(r["K"])) for r in _rows("a8w8_blockscale_tuned_gemm.csv")}
    assert {(1536, 7168), (3072, 1536), (4096, 512), (7168, 2048), (4608, 7168)} <= deepseek
    assert (7168, 2304) in deepseek


def test_m_buckets_and_torch_rows() -> None:
    for recipe in generate.RECIPES:
        rows = _rows(recipe.file)
        flydsl_m = {int(r["M"]) for r in rows if r["libtype"] == "flydsl"}
        assert flydsl_m == set(recipe.m_buckets), recipe.file
        torch_rows = {(int(r["N"]), int(r["K"])) for r in rows if r["libtype"] == "torch"}
        assert torch_rows == set(recipe.torch_shapes), recipe.file
