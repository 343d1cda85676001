"""The fused-MoE host planner (csrc/moe_plan.cpp through aiter.ops.moe.host_planner) against its documented
formulas, restated here as a test-only oracle, at every switch point; errors; FakeTensorMode.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from aiter import device
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.moe import host_planner as moe_host

# (num_experts, topk, model_dim, inter_dim) of the per-GPU expert shapes the planner serves.
MODELS = [
    pytest.param(8, 2, 4096, 1792, id="mixtral-8x7b-tp8"),
    pytest.param(128, 8, 2048, 768, id="qwen3-30b-a3b"),
    pytest.param(256, 8, 7168, 2048, id="deepseek-v3-ep8"),
    pytest.param(64, 6, 2048, 1408, id="deepseek-v2-lite"),
]
# 304 CUs in the inner loop, every count in `make test`.
CU_NUMS = [pytest.param(80, marks=pytest.mark.slow), pytest.param(256, marks=pytest.mark.slow), 304]
# Every token count up to 4096 (all block_m and ksplit switches of MODELS lie there), then a
# coarse walk through the tiers, with each tier's edges.
TOKENS = [
    *range(1, 4097),
    *range(4097, 140000, 997),
    *(edge + d for edge in (32768, 65536, 131072) for d in (-1, 0, 1)),
]
SCHEMAS = {
    "get_padded_M": "aiter::get_padded_M(int tokens) -> int",
    "moe_padded_tiers": "aiter::moe_padded_tiers(int padded) -> int[]",
    "moe_sorting_sizes": (
        "aiter::moe_sorting_sizes(int tokens, int topk, int num_experts, int block_size) -> int[]"
    ),
    "moe_block_m": (
        "aiter::moe_block_m(int tokens, int topk, int num_experts, int inter_dim, int cu_num) -> int"
    ),
    "moe_ksplit": (
        "aiter::moe_ksplit(int tokens, int topk, int num_experts, int model_dim, int inter_dim, "
        "int block_m, int cu_num) -> int"
    ),
}


# The oracle: the formulas of the C++ comments, written out with Python integers.
def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padded_oracle(tokens: int) -> int:
    if tokens < 32768:
        return 1 << (tokens - 1).bit_length()
    return max(tier for tier in (32768, 65536, 131072) if tier <= tokens)


def tiers_oracle(padded: int) -> list[int]:
    return [padded] + [tier for tier in (131072, 65536, 32768) if tier < padded]


def sorting_oracle(tokens: int, topk: int, num_experts: int, block_size: int) -> tuple[int, int]:
    slots = tokens * topk + num_experts * block_size - topk
    return slots, ceil_div(slots, block_size)


def block_m_oracle(tokens: int, topk: int, num_experts: int, inter_dim: int, cu_num: int) -> int:
    r = ceil_div(tokens * topk, num_experts)
    block_m = 16 if r <= 16 else 32 if r <= 64 else 64
    while block_m > 16 and num_experts * ceil_div(r, block_m) * ceil_div(inter_dim, 64) < cu_num:
        block_m //= 2
    return block_m


def ksplit_oracle(
    tokens: int, topk: int, model_dim: int, inter_dim: int, block_m: int, cu_num: int
) -> int:
    blocks = ceil_div(tokens * topk, block_m) * ceil_div(inter_dim, 64)
    fits = [
        s
        for s in (1, 2, 4)
        if blocks * s <= cu_num and model_dim % (s * 256) == 0 and model_dim // s >= 1024
    ]
    return max(fits, default=1)


def test_ops_are_registered_as_torch_ops_aiter():
    for name, schema in SCHEMAS.items():
        assert str(getattr(torch.ops.aiter, name).default._schema) == schema


def test_get_padded_m_exhaustive():
    for tokens in range(1, 70001):
        assert moe_host.get_padded_M(tokens) == padded_oracle(tokens), tokens


@pytest.mark.parametrize(
    "tokens, padded",
    [
        (1, 1),
        (2, 2),
        (3, 4),
        (5, 8),
        (16384, 16384),
        (16385, 32768),
        (32767, 32768),
        (32768, 32768),
        (65535, 32768),
        (65536, 65536),
        (131071, 65536),
        (131072, 131072),
        (10**12, 131072),
    ],
)
def test_get_padded_m_by_hand(tokens, padded):
    assert moe_host.get_padded_M(tokens) == padded


def test_padded_tiers():
    assert moe_host.moe_padded_tiers(131072) == [131072, 65536, 32768]
    assert moe_host.moe_padded_tiers(65536) == [65536, 32768]
    assert moe_host.moe_padded_tiers(32768) == [32768]
    assert moe_host.moe_padded_tiers(1) == [1]
    for shift in range(18):
        assert moe_host.moe_padded_tiers(1 << shift) == tiers_oracle(1 << shift)
    # Every padded count a lookup can meet starts its own order.
    for tokens in (1, 7, 4096, 40000, 70000, 200000):
        padded = moe_host.get_padded_M(tokens)
        assert moe_host.moe_padded_tiers(padded)[0] == padded


def test_sorting_sizes():
    assert moe_host.moe_sorting_sizes(5, 2, 8, 32) == (264, 9)  # 10 + 256 - 2; ceil(264 / 32)
    assert moe_host.moe_sorting_sizes(1, 1, 1, 1) == (1, 1)
    for tokens in [*range(1, 600), 4096, 65536, 200000]:
        for num_experts, topk in ((8, 2), (128, 8), (256, 8), (64, 6)):
            for block_size in (16, 32, 64, 128):
                got = moe_host.moe_sorting_sizes(tokens, topk, num_experts, block_size)
                assert got == sorting_oracle(tokens, topk, num_experts, block_size)
                assert type(got[0]) is int and type(got[1]) is int


@pytest.mark.parametrize("cu_num", CU_NUMS)
@pytest.mark.parametrize("num_experts, topk, model_dim, inter_dim", MODELS)
def test_block_m_and_ksplit_at_every_token_count(num_experts, topk, model_dim, inter_dim, cu_num):
    switches = 0
    previous = None
    for tokens in TOKENS:
        block_m = moe_host.moe_block_m(tokens, topk, num_experts, inter_dim, cu_num)
        assert block_m == block_m_oracle(tokens, topk, num_experts, inter_dim, cu_num), tokens
        for bm in {16, 32, 64, block_m}:
            got = moe_host.moe_ksplit(tokens, topk, num_experts, model_dim, inter_dim, bm, cu_num)
            assert got == ksplit_oracle(tokens, topk, model_dim, inter_dim, bm, cu_num), (
                tokens,
                bm,
            )
        ksplit = moe_host.moe_ksplit(
            tokens, topk, num_experts, model_dim, inter_dim, block_m, cu_num
        )
        switches += previous is not None and previous != (block_m, ksplit)
        previous = (block_m, ksplit)
    assert switches >= 1  # the walk crosses switch points, so a wrong one would show


@pytest.mark.parametrize(
    "tokens, model, cu_num, block_m",
    [
        (64, (8, 2, 1792), 304, 16),  # r = 16
        (100, (8, 2, 1792), 304, 16),  # r = 25 -> 32; 8 * 1 * 28 = 224 blocks < 304 -> 16
        (100, (8, 2, 1792), 80, 32),  # 224 blocks >= 80
        (200, (8, 2, 1792), 304, 32),  # r = 50; 8 * 2 * 28 = 448 blocks
        (300, (8, 2, 1792), 304, 64),  # r = 75; 8 * 2 * 28 = 448 blocks
        (170, (64, 6, 1408), 304, 16),  # r = ceil(1020 / 64) = 16
        (171, (64, 6, 1408), 304, 32),  # r = 17; 64 * 1 * 22 = 1408 blocks
        (2049, (256, 8, 2048), 304, 64),  # r = 65
    ],
)
def test_block_m_by_hand(tokens, model, cu_num, block_m):
    num_experts, topk, inter_dim = model
    assert moe_host.moe_block_m(tokens, topk, num_experts, inter_dim, cu_num) == block_m


@pytest.mark.parametrize(
    "tokens, model, block_m, cu_num, ksplit",
    [
        (1, (8, 2, 4096, 1792), 16, 304, 4),  # 28 blocks; 4096 / 4 = 1024
        (1, (8, 2, 4096, 1792), 16, 80, 2),  # 4 * 28 = 112 > 80
        (1, (128, 8, 2048, 768), 16, 304, 2),  # 2048 / 4 = 512 < 1024
        (17, (128, 8, 2048, 768), 16, 304, 2),  # ceil(136 / 16) * 12 = 108 blocks; 216 <= 304
        (32, (128, 8, 2048, 768), 16, 304, 1),  # 16 * 12 = 192 blocks; 384 > 304
        (1, (256, 8, 7168, 2048), 16, 304, 4),  # 32 blocks; 7168 / 4 = 1792
        (1, (256, 8, 7168, 2048), 16, 80, 2),  # 128 > 80; 64 <= 80
        (1, (8, 2, 4352, 1792), 16, 304, 1),  # 4352 % 512 != 0
    ],
)
def test_ksplit_by_hand(tokens, model, block_m, cu_num, ksplit):
    num_experts, topk, model_dim, inter_dim = model
    got = moe_host.moe_ksplit(tokens, topk, num_experts, model_dim, inter_dim, block_m, cu_num)
    assert got == ksplit


def test_choice_moves_inside_one_padded_bucket():
    # block_m: DeepSeek-V2-Lite, 304 CUs; 170 and 171 tokens both pad to 256.
    assert moe_host.get_padded_M(170) == moe_host.get_padded_M(171) == 256
    assert moe_host.moe_block_m(170, 6, 64, 1408, 304) == 16
    assert moe_host.moe_block_m(171, 6, 64, 1408, 304) == 32
    # ksplit: Qwen3-30B-A3B, 304 CUs, block_m 16 at both; 17 and 32 tokens both pad to 32.
    assert moe_host.get_padded_M(17) == moe_host.get_padded_M(32) == 32
    assert moe_host.moe_block_m(17, 8, 128, 768, 304) == moe_host.moe_block_m(32, 8, 128, 768, 304)
    assert moe_host.moe_ksplit(17, 8, 128, 2048, 768, 16, 304) == 2
    assert moe_host.moe_ksplit(32, 8, 128, 2048, 768, 16, 304) == 1


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.integers(1, 300000),
    topk=st.integers(1, 16),
    extra_experts=st.integers(0, 512),
    block_size=st.sampled_from([16, 32, 64, 128]),
    model_dim=st.integers(1, 160).map(lambda n: n * 128),
    inter_dim=st.integers(1, 8192),
    cu_num=st.integers(1, 512),
)
def test_planner_matches_formulas_anywhere(
    tokens, topk, extra_experts, block_size, model_dim, inter_dim, cu_num
):
    num_experts = topk + extra_experts
    assert moe_host.moe_sorting_sizes(tokens, topk, num_experts, block_size) == sorting_oracle(
        tokens, topk, num_experts, block_size
    )
    block_m = moe_host.moe_block_m(tokens, topk, num_experts, inter_dim, cu_num)
    assert block_m == block_m_oracle(tokens, topk, num_experts, inter_dim, cu_num)
    ksplit = moe_host.moe_ksplit(tokens, topk, num_experts, model_dim, inter_dim, block_m, cu_num)
    assert ksplit == ksplit_oracle(tokens, topk, model_dim, inter_dim, block_m, cu_num)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: moe_host.get_padded_M(0), "get_padded_M: tokens must be >= 1, got 0"),
        (lambda: moe_host.get_padded_M(-3), "get_padded_M: tokens must be >= 1, got -3"),
        (lambda: moe_host.moe_padded_tiers(0), "moe_padded_tiers: padded must be a value"),
        (lambda: moe_host.moe_padded_tiers(24576), "padded must be a value .* got 24576"),
        (lambda: moe_host.moe_padded_tiers(262144), "padded must be a value .* got 262144"),
        (lambda: moe_host.moe_sorting_sizes(0, 2, 8, 32), "moe_sorting_sizes: tokens must be >= 1"),
        (lambda: moe_host.moe_sorting_sizes(5, 0, 8, 32), "moe_sorting_sizes: topk must be >= 1"),
        (lambda: moe_host.moe_sorting_sizes(5, 2, 0, 32), "num_experts must be >= 1, got 0"),
        (lambda: moe_host.moe_sorting_sizes(5, 2, 8, 0), "block_size must be >= 1, got 0"),
        (
            lambda: moe_host.moe_sorting_sizes(5, 9, 8, 32),
            r"moe_sorting_sizes: topk must be <= num_experts \(8\), got 9",
        ),
        (
            lambda: moe_host.moe_sorting_sizes(2**62, 8, 8, 32),
            r"moe_sorting_sizes: tokens \* topk overflows int64",
        ),
        (lambda: moe_host.moe_block_m(0, 2, 8, 1792, 304), "moe_block_m: tokens must be >= 1"),
        (lambda: moe_host.moe_block_m(5, 2, 8, 0, 304), "moe_block_m: inter_dim must be >= 1"),
        (lambda: moe_host.moe_block_m(5, 2, 8, 1792, 0), "moe_block_m: cu_num must be >= 1"),
        (lambda: moe_host.moe_block_m(5, 3, 2, 1792, 304), "moe_block_m: topk must be <="),
        (
            lambda: moe_host.moe_ksplit(5, 2, 8, 0, 1792, 16, 304),
            "moe_ksplit: model_dim must be >= 1, got 0",
        ),
        (
            lambda: moe_host.moe_ksplit(5, 2, 8, 4096, -1, 16, 304),
            "moe_ksplit: inter_dim must be >= 1, got -1",
        ),
        (
            lambda: moe_host.moe_ksplit(5, 2, 8, 4096, 1792, 0, 304),
            "moe_ksplit: block_m must be >= 1, got 0",
        ),
        (
            lambda: moe_host.moe_ksplit(5, 2, 8, 4096, 1792, 16, 0),
            "moe_ksplit: cu_num must be >= 1, got 0",
        ),
        (lambda: moe_host.get_padded_M(2**64), "get_padded_M: tokens must fit in int64"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_value_error_carries_the_cpp_message():
    with pytest.raises(RuntimeError) as raw:
        torch.ops.aiter.moe_block_m(5, 2, 8, 1792, 0)
    with pytest.raises(ValueError) as converted:
        moe_host.moe_block_m(5, 2, 8, 1792, 0)
    assert str(converted.value) == str(raw.value) == "moe_block_m: cu_num must be >= 1, got 0"


@pytest.mark.parametrize("value, kind", [(3.0, "float"), (True, "bool"), ("3", "str")])
def test_non_int_arguments_raise_type_error(value, kind):
    with pytest.raises(TypeError, match=f"moe_ksplit: cu_num must be an int, got {kind}"):
        moe_host.moe_ksplit(5, 2, 8, 4096, 1792, 16, value)


def _every_op() -> list:
    return [
        moe_host.get_padded_M(300),
        moe_host.moe_padded_tiers(131072),
        moe_host.moe_sorting_sizes(300, 8, 128, 32),
        moe_host.moe_block_m(300, 8, 128, 768, 304),
        moe_host.moe_ksplit(300, 8, 128, 2048, 768, 32, 304),
        torch.ops.aiter.get_padded_M(300),
        torch.ops.aiter.moe_padded_tiers(65536),
        torch.ops.aiter.moe_sorting_sizes(300, 8, 128, 32),
        torch.ops.aiter.moe_block_m(300, 8, 128, 768, 304),
        torch.ops.aiter.moe_ksplit(300, 8, 128, 2048, 768, 32, 304),
    ]


def _ints(values: list) -> list:
    flat = []
    for value in values:
        flat.extend(value if isinstance(value, list | tuple) else [value])
    return flat


def test_ops_run_for_real_under_fake_tensor_mode():
    expected = _every_op()
    with FakeTensorMode():
        hidden = torch.empty(300, 2048)
        assert isinstance(hidden, FakeTensor)
        got = _every_op()
        assert moe_host.moe_block_m(hidden.shape[0], 8, 128, 768, 304) == expected[3]
        with pytest.raises(ValueError, match="get_padded_M: tokens must be >= 1, got 0"):
            moe_host.get_padded_M(0)
    assert got == expected
    assert all(type(value) is int for value in _ints(got))


def test_ops_run_inside_a_dry_run():
    with dry_run("gfx942", 304, bridge.MODE_NAME):
        hidden = torch.empty(300, 2048, dtype=torch.bfloat16, device="cuda")
        assert isinstance(hidden, FakeTensor)
        tokens, cu_num = hidden.shape[0], device.cu_num()
        block_m = moe_host.moe_block_m(tokens, 8, 128, 768, cu_num)
        ksplit = moe_host.moe_ksplit(tokens, 8, 128, 2048, 768, block_m, cu_num)
        padded = moe_host.get_padded_M(tokens)
    assert (padded, block_m, ksplit) == (512, 32, 1)
    assert type(block_m) is int and type(ksplit) is int and type(padded) is int


def test_missing_extension_says_how_to_build_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter._moe_host", None)  # makes its import fail
    spec = importlib.util.find_spec("aiter.ops.moe.host_planner")
    fresh = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match=r"not built .*pip install --no-build-isolation -e \."):
        spec.loader.exec_module(fresh)
