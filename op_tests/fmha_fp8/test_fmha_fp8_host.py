"""Host side of fp8 attention: the launcher's choices at their switch points, the monotonicity the
AOT grid relies on, and flash_attn_fp8 inside a dry run (naming mode): kernels, record, errors.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import aiter
from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.fmha_fp8 import plan
from aiter.ops.fmha_fp8.kernels.flash_attn import BLOCK_N

FNUZ = torch.float8_e4m3fnuz


def test_query_block_switches_after_short_queries():
    assert plan.query_block(plan.SHORT_QUERIES) == 64
    assert plan.query_block(plan.SHORT_QUERIES + 1) == 128


def test_rescale_threshold_follows_the_key_length():
    assert plan.rescale_threshold(plan.LAZY_RESCALE_KEYS) == plan.LAZY_RESCALE_LOG2
    assert plan.rescale_threshold(plan.LAZY_RESCALE_KEYS + 1) == 0.0


def test_split_gates_of_one_axis():
    assert not plan.queries_allow_split(plan.SPLIT_MIN_QUERIES - 1)
    assert plan.queries_allow_split(plan.SPLIT_MIN_QUERIES)
    first = (plan.SPLIT_MIN_KEY_BLOCKS - 1) * BLOCK_N + 1
    assert not plan.keys_allow_split(first - 1) and plan.keys_allow_split(first)


def test_the_cost_model_by_hand():
    # 1 x 8 heads x 2 query blocks = 16 work-groups on 304 CUs, 128 key blocks: one wave for up
    # to 19 splits, so 16 (the most) costs 1 * 8 + 2 and wins.
    assert plan.kv_splits(1, 8, 128, 8192, 128, 128, 304) == 16
    # 10 x 16 = 160 work-groups: more than half of 304 CUs, no split.
    assert plan.kv_splits(9, 8, 128, 8192, 9 * 128, 128, 304) > 1
    assert plan.kv_splits(10, 8, 128, 8192, 10 * 128, 128, 304) == 1
    # The workspace cap: 8 x 8192 rows x 16 heads x 128 x 4 bytes leaves room for fewer than 2.
    assert plan.kv_splits(1, 16, 8192 * 8, 8192, 8192 * 8, 128, 304 * 1000) == 1


def _splits(b, q, k, cu=304, hq=8, dv=128):
    return plan.kv_splits(b, hq, q, k, b * q, dv, cu) > 1


@pytest.mark.parametrize("cu", [80, 304])
def test_whether_to_split_never_turns_on_with_more_batch_or_queries(cu):
    """What the AOT grid's guarantee rests on (see aiter/aot/flydsl/fmha_fp8.py)."""
    qs = [128, 200, 256, 257, 300, 512, 1000, 2048]
    ks = [961, 2000, 4097, 8192]
    for b, q, k in itertools.product(range(1, 12), qs, ks):
        if _splits(b + 1, q, k, cu):
            assert _splits(b, q, k, cu), (b, q, k)
        later = [q2 for q2 in qs if q2 > q and plan.query_block(q2) == plan.query_block(q)]
        for q2 in later:
            if _splits(b, q2, k, cu):
                assert _splits(b, q, k, cu), (b, q, q2, k)


def test_interleave_pairs_even_causal_self_attention_batches():
    assert plan.interleave(True, 512, 512, 4, 1)
    assert not plan.interleave(True, 512, 512, 3, 1)
    assert not plan.interleave(True, 512, 1024, 4, 1)
    assert not plan.interleave(False, 512, 512, 4, 1)
    assert not plan.interleave(True, 512, 512, 4, 2)


def test_one_axis_functions_are_what_the_plan_uses():
    choice = plan.plan(mma="mfma", batch=2, num_heads=8, max_seqlen_q=300, max_seqlen_k=5000,
                       rows=600, head_dim=128, head_dim_v=128, causal=True, cu_num=304)  # fmt: skip
    assert choice.block_m == plan.query_block(300)
    assert choice.rescale_threshold == plan.rescale_threshold(5000)
    assert set(plan.ONE_AXIS) == {"seqlen_q", "seqlen_k"}


def test_equivalent_choices_change_the_block_then_the_rescale_then_the_split():
    planned = plan.AttnChoice("mfma", 128, 6.0, 4, False, 128, 128)
    call = dict(causal=True, batch=2, max_seqlen_q=300, max_seqlen_k=300)
    variants = plan.equivalent_choices(planned, **call)
    assert [(v.block_m, v.rescale_threshold, v.num_kv_splits, v.interleave) for v in variants] == [
        (64, 6.0, 4, False),
        (128, 0.0, 4, False),
        (64, 0.0, 4, False),
        (128, 6.0, 1, True),  # causal self-attention over an even batch, no split: interleaved
        (64, 6.0, 1, True),
        (128, 0.0, 1, True),
        (64, 0.0, 1, True),
    ]
    exact = plan.AttnChoice("mfma", 64, 0.0, 1, True, 128, 128)
    assert [v.block_m for v in plan.equivalent_choices(exact, **call)] == [128]
    assert plan.describe(planned) == "flydsl_fmha_fp8_mfma_bm128_d128x128_r6_split splits=4"


# --- the entry in a dry run ---


def attend(b, sq, sk, *, hq=8, hkv=1, d=128, dv=128, varlen=False, **kwargs):
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests, dispatch.observe() as records:

        def empty(shape, dtype=FNUZ):
            return torch.empty(shape, dtype=dtype, device="cuda")

        descales = {n: empty((1,), torch.float32) for n in ("q_descale", "k_descale", "v_descale")}
        if varlen:
            kwargs.update(
                cu_seqlens_q=empty((b + 1,), torch.int32),
                cu_seqlens_kv=empty((b + 1,), torch.int32),
                max_seqlen_q=sq,
                max_seqlen_kv=sk,
            )
            q, k, v = empty((b * sq, hq, d)), empty((b * sk, hkv, d)), empty((b * sk, hkv, dv))
        else:
            q, k, v = empty((b, sq, hq, d)), empty((b, sk, hkv, d)), empty((b, sk, hkv, dv))
        result = aiter.flash_attn_fp8(q, k, v, **descales, **kwargs)
    return result, [r.function for r in requests], records


@pytest.mark.parametrize("varlen", [False, True])
def test_outputs_and_kernels(varlen):
    (out, lse), functions, records = attend(2, 100, 300, varlen=varlen, return_lse=True)
    if varlen:
        assert tuple(out.shape) == (200, 8, 128) and tuple(lse.shape) == (8, 200)
    else:
        assert tuple(out.shape) == (2, 100, 8, 128) and tuple(lse.shape) == (2, 8, 100)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    (record,) = records
    assert record.params["layout"] == ("varlen" if varlen else "dense")
    assert record.params["block_m"] == 64 and record.params["num_kv_splits"] == 1
    assert functions and all(f.startswith("flash_attn_fp8") for f in functions)


def test_a_miss_names_the_shapes_row_that_would_serve_the_call(monkeypatch, tmp_path):
    from aiter import jit_monitor

    monkeypatch.delenv("AITER_CONFIG_DIR", raising=False)
    _, _, (record,) = attend(3, 100, 700, hq=16, hkv=2, d=192, dv=128, varlen=True,
                             causal=False)  # fmt: skip
    fix = jit_monitor.fix_hint(record, "gfx942", "304", "/srv/cache")
    assert fix.startswith(
        "add a row for this shape to fmha_fp8_shapes.csv, e.g. "
        "gfx942,304,16,2,192,128,varlen,0,3,700, (--csv fmha_fp8=PATH) and rebuild: "
        "GPU_ARCHS=gfx942:304 python -m aiter.aot.flydsl --module fmha_fp8"
    ), fix
    # The suggested row is one the table loads.
    from aiter.ops.fmha_fp8.table import FMHA_FP8

    row = fix.split("e.g. ")[1].split(" (")[0]
    table = tmp_path / "mine.csv"
    table.write_text(",".join(FMHA_FP8.header) + "\n" + row + "\n")
    monkeypatch.setenv(FMHA_FP8.env_var, str(table))
    loaded = [r for r in FMHA_FP8.load().rows if r.source == str(table)]
    assert [(r["num_heads"], r["max_seqlen"]) for r in loaded] == [("16", "700")]


def test_a_split_call_launches_the_combine_kernel():
    _, functions, records = attend(1, 128, 8192)
    assert records[0].params["num_kv_splits"] > 1
    assert len(set(functions)) == 2
    _, unsplit, _ = attend(1, 128, 8192, num_kv_splits=1)
    assert len(set(unsplit)) == 1


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"hq": 6, "hkv": 4}, ValueError, r"kv heads \(4\) must divide the query heads \(6\)"),
        ({"d": 80}, ValueError, "head dims must be multiples of 32 from 64"),
        ({"d": 288, "dv": 128}, NotImplementedError, "head dims above 256"),
        ({"num_kv_splits": 0}, ValueError, "num_kv_splits must be a positive int"),
    ],
)
def test_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        attend(1, 64, 64, **kwargs)


# --- no other backend: what the kernels cannot serve is an error before anything is reported ---


def _attend_with(make):
    """flash_attn_fp8 on the q, k, v `make` gives (descales [1]); the error, records, requests."""
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests, dispatch.observe() as records:
        descales = {
            n: torch.empty((1,), dtype=torch.float32, device="cuda")
            for n in ("q_descale", "k_descale", "v_descale")
        }
        q, k, v, kwargs = make()
        with pytest.raises(ValueError) as info:
            aiter.flash_attn_fp8(q, k, v, **descales, **kwargs)
    return str(info.value), list(records), list(requests)


def _empty(*shape):
    return torch.empty(shape, dtype=FNUZ, device="cuda")


@pytest.mark.parametrize(
    "make, message",
    [
        pytest.param(
            lambda: (_empty(2, 128, 8, 128)[:, ::2], _empty(2, 64, 1, 128),
                     _empty(2, 64, 1, 128), {}),
            "q must be contiguous, got strides [131072, 2048, 128, 1]",
            id="q-strided",
        ),
        pytest.param(
            lambda: (_empty(1, 64, 8, 128), _empty(1, 64, 1, 128),
                     _empty(1, 64, 2, 128)[:, :, :1], {}),
            "v must be contiguous, got strides [16384, 256, 128, 1]",
            id="v-head-slice",
        ),
        pytest.param(
            lambda: (_empty(2**31, 1, 64), _empty(64, 1, 64), _empty(64, 1, 64), dict(
                cu_seqlens_q=torch.empty((2,), dtype=torch.int32, device="cuda"),
                cu_seqlens_kv=torch.empty((2,), dtype=torch.int32, device="cuda"),
                max_seqlen_q=64, max_seqlen_kv=64)),
            "q, k: 2147483648 token rows are too many for the kernels' 32-bit indices",
            id="rows",
        ),
        pytest.param(
            lambda: (_empty(1, 2**17, 128, 128), _empty(1, 64, 1, 128),
                     _empty(1, 64, 1, 128), {}),
            "q, v: the output's rows * Hq * Dv = 2147483648 elements are too many for the "
            "kernels' 32-bit indices",
            id="output",
        ),
        pytest.param(
            lambda: (_empty(1, 64, 8, 128), _empty(1, 64, 1, 128), _empty(1, 64, 1, 128),
                     {"num_kv_splits": 2**28}),
            "num_kv_splits: 268435456 splits x 8 heads x 1 query blocks x 1 batches = "
            "2147483648 work-groups, too many for the kernels' 32-bit indices",
            id="splits",
        ),
    ],
)  # fmt: skip
def test_what_the_kernels_cannot_serve_is_an_error_first(make, message):
    error, records, requests = _attend_with(make)
    assert error == message
    assert records == [] and requests == []
