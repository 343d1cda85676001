"""Host side of fused MoE: fused_topk on CPU tensors, and moe_sorting / fused_moe inside a dry run
(naming mode, no compile): the table lookup with aiter's tiers, the planner's choices, the kernels
each call launches, the dispatch record and the errors that name the argument or the row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import aiter
from aiter import device, dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.moe import host_planner as moe_host
from aiter.ops.moe import plan as moe_plan
from aiter.ops.moe.table import FMOE
from aiter.tuning import TableError

BF16, FN, FNUZ = torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz
SHAPE = dict(model_dim=2048, inter=256, experts=8, topk=2)


def empty(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="cuda")


def moe_args(tokens: int, *, local: int = 8, dtype=BF16, model_dim=2048, inter=256, topk=2):
    return (
        empty((tokens, model_dim), BF16),
        empty((local, 2 * inter, model_dim), dtype),
        empty((local, model_dim, inter), dtype),
        empty((tokens, topk), torch.float32),
        empty((tokens, topk), torch.int32),
    )


def run_moe(tokens: int, arch=("gfx942", 304), args=None, tensors=None, **kwargs):
    """fused_moe in a naming dry run: (functions launched, their params, the dispatch record).
    `args` and `tensors` (keyword tensors) are made inside the dry run, where "cuda" is fake."""
    with dry_run(*arch, bridge.MODE_NAME) as requests, dispatch.observe() as records:
        args = args() if args else moe_args(tokens)
        kwargs.update(tensors() if tensors else {})
        out = aiter.fused_moe(*args, **kwargs)
        assert tuple(out.shape) == (tokens, args[0].shape[1]) and out.dtype == BF16
    assert len(records) == 1
    return [r.function for r in requests], [r.params for r in requests], records[0]


def write_table(directory: Path, *rows: dict[str, str]) -> str:
    lines = [",".join(FMOE.header)]
    for row in rows:
        cells = dict.fromkeys(FMOE.header, "")
        cells.update(
            gfx="gfx942", cu_num="304", model_dim="2048", inter_dim="256", expert="8", topk="2",
            act_type="ActivationType.Silu", dtype="torch.bfloat16", q_dtype_a="torch.bfloat16",
            q_dtype_w="torch.bfloat16", q_type="QuantType.No", use_g1u1="1",
            doweight_stage1="0", block_m="0", ksplit="0", run_1stage="0",
        )  # fmt: skip
        cells.update(row)
        lines.append(",".join(cells[name] for name in FMOE.header))
    path = directory / "fmoe.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def table(tmp_path, monkeypatch):
    def use(*rows: dict[str, str]) -> str:
        path = write_table(tmp_path, *rows)
        monkeypatch.setenv(FMOE.env_var, path)
        return path

    return use


# --- fused_topk ---


@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_topk_matches_softmax_topk(renormalize):
    gen = torch.Generator().manual_seed(3)
    gating = torch.randn((7, 16), generator=gen, dtype=BF16)
    weights, ids = aiter.fused_topk(torch.empty((7, 32)), gating, 3, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    probs = torch.softmax(gating.float(), dim=-1)
    expected_w, expected_ids = torch.topk(probs, 3, dim=-1)
    if renormalize:
        expected_w = expected_w / expected_w.sum(-1, keepdim=True)
    assert torch.equal(ids, expected_ids.int())
    torch.testing.assert_close(weights, expected_w)


@pytest.mark.parametrize(
    "hidden, gating, topk, message",
    [
        ((4, 8), (4, 8), 9, "topk must be at most num_experts = 8"),
        ((5, 8), (4, 8), 2, "hidden_states must have M = 4 rows"),
        ((4, 8), (4, 8), 0, "topk must be a positive int"),
        ((4, 8), (4,), 1, "gating_output must be [M, num_experts]"),
    ],
)
def test_fused_topk_errors_name_the_argument(hidden, gating, topk, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        aiter.fused_topk(torch.empty(hidden), torch.empty(gating), topk, True)


# --- moe_sorting ---


def test_moe_sorting_allocates_aiters_buffers():
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:
        ids = empty((5, 2), torch.int32)
        out = aiter.moe_sorting(ids, empty((5, 2), torch.float32), 8, 256, BF16, 32)
    sorted_ids, sorted_weights, sorted_experts, num_valid, moe_buf = out
    slots = 5 * 2 + 8 * 32 - 2
    assert tuple(sorted_ids.shape) == (slots,) and sorted_ids.dtype == torch.int32
    assert tuple(sorted_weights.shape) == (slots,) and sorted_weights.dtype == torch.float32
    assert tuple(sorted_experts.shape) == (-(-slots // 32),)
    assert tuple(num_valid.shape) == (2,)
    assert tuple(moe_buf.shape) == (5, 256) and moe_buf.dtype == BF16
    assert {r.function for r in requests} >= {"moe_sorting_count", "moe_sorting_scatter"}


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"ids_dtype": torch.int64}, TypeError, "topk_ids must have dtype torch.int32"),
        ({"block_size": 24}, ValueError, "block_size must be a multiple of 16"),
        ({"mask": (7,)}, ValueError, r"expert_mask must have shape \[8\]"),
        ({"num_experts": 0}, ValueError, "num_experts must be a positive int"),
    ],
)
def test_moe_sorting_errors_name_the_argument(change, error, message):
    with dry_run("gfx942", 304, bridge.MODE_NAME), pytest.raises(error, match=message):
        ids = empty((5, 2), change.get("ids_dtype", torch.int32))
        mask = empty(change["mask"], torch.int32) if "mask" in change else None
        aiter.moe_sorting(
            ids, empty((5, 2), torch.float32), change.get("num_experts", 8), 256, BF16,
            change.get("block_size", 32), expert_mask=mask,
        )  # fmt: skip


# --- fused_moe: what serves a call ---


@pytest.mark.parametrize("tokens", [1, 40, 300, 305, 1000, 5000])
def test_untuned_calls_follow_the_planner(table, tokens):
    table()  # an empty extra table: nothing tuned for this shape
    functions, _, record = run_moe(tokens)
    block_m = moe_host.moe_block_m(tokens, 2, 8, 256, 304)
    ksplit = moe_host.moe_ksplit(tokens, 2, 8, 2048, 256, block_m, 304)
    assert record.source == "heuristic" and record.row is None
    assert record.params["block_m"] == block_m and record.params["ksplit"] == ksplit
    assert record.params["padded_tokens"] == moe_host.get_padded_M(tokens)
    s1 = f"flydsl_moe1_mfma_{block_m}x64x64"
    assert record.kernel == f"{s1}+flydsl_moe2_mfma_{block_m}x64x64_atomic"
    assert {"moe_stage1", "moe_stage2", "moe_sorting_scatter"} <= set(functions)
    assert ("moe_stage1_activation" in functions) == (ksplit > 1)
    assert "moe_topk_reduce" not in functions


def test_the_k_split_changes_inside_one_padded_bucket(table):
    table()
    assert moe_host.get_padded_M(300) == moe_host.get_padded_M(305) == 512
    _, _, low = run_moe(300)
    _, _, high = run_moe(305)
    assert low.params["ksplit"] == 2 and high.params["ksplit"] == 1


def test_equivalent_choices_try_other_splits_and_modes_then_the_planner():
    from aiter.ops.shared.tiles import GemmTile

    shape = moe_plan.MoeShape(2048, 256, 8, 2, "silu", str(BF16), str(BF16), str(BF16),
                                False, False)  # fmt: skip
    tile = GemmTile(128, 64, 64)
    planned = moe_plan.MoeChoice("mfma", 128, tile, tile, 4, "reduce")
    variants = moe_plan.equivalent_choices(planned, shape, 300, 304)
    heuristic = moe_plan.heuristic_choice(shape, 300, 304, "mfma")
    assert [(v.block_m, v.ksplit, v.stage2_mode) for v in variants] == [
        (128, 1, "reduce"),
        (128, 2, "reduce"),
        (128, 1, "atomic"),
        (128, 2, "atomic"),
        (128, 4, "atomic"),
        (heuristic.block_m, heuristic.ksplit, "atomic"),
    ]
    assert moe_plan.describe(planned) == (
        "flydsl_moe1_mfma_128x64x64+flydsl_moe2_mfma_128x64x64_reduce ksplit=4"
    )


def test_a_row_names_the_kernels(table):
    path = table(
        {
            "token": "512",
            "block_m": "32",
            "ksplit": "4",
            "kernelName1": "flydsl_moe1_mfma_32x128x128",
            "kernelName2": "flydsl_moe2_mfma_32x64x64_reduce",
            "us": "12.5",
        }
    )
    functions, _, record = run_moe(400)
    assert record.source == "table" and record.row == f"{path}:2"
    assert record.kernel == "flydsl_moe1_mfma_32x128x128+flydsl_moe2_mfma_32x64x64_reduce"
    assert record.params == {
        "padded_tokens": 512, "block_m": 32, "ksplit": 4, "stage2_mode": "reduce",
    }  # fmt: skip
    assert "moe_topk_reduce" in functions and "moe_stage1_activation" in functions


def test_tiers_above_32768_fall_back_to_smaller_ones(table):
    path = table({"token": "32768", "block_m": "64", "ksplit": "1"})
    for tokens in (20000, 40000, 70000, 200000):
        padded, row = moe_plan.tuned_row(_key(), tokens)
        assert padded == moe_host.get_padded_M(tokens)
        assert (row is not None) == (tokens > 16384), tokens
        if row is not None:
            assert f"{row.source}:{row.line}" == f"{path}:2"


def _key() -> dict[str, object]:
    shape = moe_plan.MoeShape(
        model_dim=2048, inter_dim=256, experts=8, topk=2, activation="silu",
        dtype="torch.bfloat16", q_dtype_a="torch.bfloat16", q_dtype_w="torch.bfloat16",
        quantized=False, doweight_stage1=False,
    )  # fmt: skip
    return shape.key("gfx942", 304)


def test_fallback_tagged_and_one_stage_rows_are_skipped(table):
    table(
        {"token": "64", "block_m": "32", "_tag": "flydsl_fallback"},
        {"token": "128", "block_m": "32", "run_1stage": "1"},
    )
    assert moe_plan.tuned_row(_key(), 60)[1] is None
    assert moe_plan.tuned_row(_key(), 100)[1] is None


def test_default_table_rows_serve_their_shapes():
    functions, _, record = run_moe(
        100, args=lambda: moe_args(100, model_dim=4096, inter=1792, topk=2)
    )
    assert record.source == "table" and record.row.endswith(":9")  # gfx942 Mixtral bf16, token 128


@pytest.mark.parametrize("variant", ["interleave", "mask", "local", "swiglu_bias", "doweight"])
def test_caller_variants_launch(table, variant):
    table()
    kwargs: dict = {}
    local = 1 if variant == "mask" else 8
    tensors = {
        "mask": lambda: {"expert_mask": empty((8,), torch.int32)},
        "local": lambda: {"num_local_tokens": empty((1,), torch.int32)},
        "swiglu_bias": lambda: {
            "bias1": empty((8, 512), torch.float32),
            "bias2": empty((8, 2048), torch.float32),
        },
    }.get(variant)
    if variant == "interleave":
        kwargs["gate_mode"] = "interleave"
    elif variant == "swiglu_bias":
        kwargs["activation"] = "swiglu"
    elif variant == "doweight":
        kwargs["doweight_stage1"] = True
    functions, params, _ = run_moe(
        64, args=lambda: moe_args(64, local=local), tensors=tensors, **kwargs
    )
    assert {"moe_sorting_count", "moe_stage1", "moe_stage2"} <= set(functions)


def test_fp8_per_token_uses_the_arch_flavour(table):
    table()

    def scales():
        return {
            "w1_scale": empty((8, 512, 1), torch.float32),
            "w2_scale": empty((8, 2048, 1), torch.float32),
        }

    args = lambda: moe_args(16, dtype=FNUZ)  # noqa: E731
    _, _, record = run_moe(16, args=args, tensors=scales, quant_type="per_token")
    assert record.kernel.startswith("flydsl_moe1_mfma_16x64x128")
    # Validation precedes any launch: a simulated gfx950 and fake tensors are enough (one arch
    # per process for dry runs).
    expected = pytest.raises(TypeError, match="w1 must have dtype torch.float8_e4m3fn")
    with device.simulate("gfx950", 256), FakeTensorMode(), expected:
        aiter.fused_moe(*args(), quant_type="per_token", **scales())


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"activation": "gelu"}, ValueError, "activation must be one of"),
        ({"gate_mode": "mixed"}, ValueError, "gate_mode must be one of"),
        ({"quant_type": "per_tensor"}, ValueError, "quant_type must be one of"),
        ({"bias1": "b"}, NotImplementedError, "supported with swiglu only"),
        ({"quant_type": "per_token"}, TypeError, "w1 must have dtype"),
        ({"w1_scale": "s"}, ValueError, "only for quant_type='per_token'"),
    ],
)
def test_fused_moe_errors_name_the_argument(table, kwargs, error, message):
    table()
    tensors = None
    if kwargs.get("bias1") == "b":
        kwargs.pop("bias1")
        tensors = lambda: {"bias1": empty((8, 512), torch.float32)}  # noqa: E731
    if kwargs.get("w1_scale") == "s":
        kwargs.pop("w1_scale")
        tensors = lambda: {"w1_scale": empty((8, 512, 1), torch.float32)}  # noqa: E731
    with pytest.raises(error, match=message):
        run_moe(8, tensors=tensors, **kwargs)


def test_bad_weight_shapes_are_named(table):
    table()

    def replaced(index: int, shape):
        def make():
            args = list(moe_args(8))
            args[index] = empty(shape, BF16)
            return args

        return make

    with pytest.raises(ValueError, match=r"w1 must be \[E, 2 \* inter_dim, model_dim = 2048\]"):
        run_moe(8, args=replaced(1, (8, 512, 1024)))
    with pytest.raises(ValueError, match=r"w2 must have shape \[8, 2048, 256\]"):
        run_moe(8, args=replaced(2, (8, 2048, 128)))


def test_kernel_keys_ignore_sizes_of_one(table):
    """topk_ids [M, 1], a [1, model_dim] and the per-token scales [M, 1] key as wider ones do:
    one tuned choice asks for the same kernel files at every M and topk."""
    table({"token": "8", "block_m": "16", "ksplit": "1", "topk": "1"},
          {"token": "8", "block_m": "16", "ksplit": "1", "topk": "2"})  # fmt: skip
    files = {}
    for tokens, topk in ((1, 1), (5, 1), (1, 2), (5, 2)):
        with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:
            args = moe_args(tokens, dtype=FNUZ, topk=topk)
            aiter.fused_moe(
                *args, quant_type="per_token", w1_scale=empty((8, 512, 1), torch.float32),
                w2_scale=empty((8, 2048, 1), torch.float32),
            )  # fmt: skip
        files[tokens, topk] = {(r.function, r.file_name) for r in requests}
    assert len({frozenset(f) for f in files.values()}) == 1, files
    assert {name for name, _ in files[1, 1]} >= {"moe_sorting_scatter", "moe_stage1", "moe_stage2"}


GPT_OSS = dict(model_dim=2880, experts=128, topk=4)


@pytest.mark.parametrize("inter", [360, 720, 1440])
def test_gpt_oss_shards_are_served(table, inter):
    """gpt-oss-120b at TP8, TP4 and TP2: swiglu with expert biases, column tiles past inter_dim
    in stage 1 and a K tail in stage 2 (360 = 11 * 32 + 8)."""
    table()

    def args():
        return (
            empty((40, 2880), BF16), empty((128, 2 * inter, 2880), BF16),
            empty((128, 2880, inter), BF16), empty((40, 4), torch.float32),
            empty((40, 4), torch.int32),
        )  # fmt: skip

    def biases():
        return {"bias1": empty((128, 2 * inter), torch.float32),
                "bias2": empty((128, 2880), torch.float32)}  # fmt: skip

    _, params, record = run_moe(40, args=args, tensors=biases, activation="swiglu")
    (stage2,) = [dict(p) for p in params if "k_tail" in dict(p)]
    assert stage2["k_tail"] == repr(inter % 32 != 0), stage2
    assert record.kernel.startswith("flydsl_moe1_mfma_")


@pytest.mark.parametrize(
    "shape, quantized, message",
    [
        ((2880, 100), False, r"w1: inter_dim = w1.shape\[1\] / 2 must be a positive multiple of "
                             r"8 for torch.bfloat16 weights, got 100"),
        ((2880, 360), True, r"w1: inter_dim .* multiple of 16 for torch.float8_e4m3fnuz weights"),
        ((2000, 256), False, r"hidden_states: model_dim = hidden_states.shape\[1\] must be a "
                             r"positive multiple of 64, got 2000"),
        ((16448, 256), True, r"hidden_states, w1: per-token quantization serves model_dim and "
                             r"inter_dim up to 16384, got model_dim = 16448 and inter_dim = 256"),
    ],
)  # fmt: skip
def test_shapes_the_kernels_cannot_serve_are_refused_before_any_launch(
    table, shape, quantized, message
):
    table()
    model_dim, inter = shape
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:
        kwargs = {}
        if quantized:
            kwargs = dict(quant_type="per_token", w1_scale=empty((8, 2 * inter, 1), torch.float32),
                          w2_scale=empty((8, model_dim, 1), torch.float32))  # fmt: skip
        args = moe_args(8, dtype=FNUZ if quantized else BF16, model_dim=model_dim, inter=inter)
        with pytest.raises(ValueError, match=message):
            aiter.fused_moe(*args, **kwargs)
    assert requests == []  # not even the sorting kernels


def test_topk_past_the_sorted_id_is_refused(table):
    table()
    refused = pytest.raises(ValueError, match="topk_ids: at most topk = 127 fits a sorted id")
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests, refused:
        aiter.fused_moe(*moe_args(2, local=8, topk=128))
    assert requests == []


def test_calls_past_int32_indices_are_refused_before_any_launch(table):
    """P * inter_dim over 2**31 (a huge prefill): named, before the sorting kernels run."""
    table()
    refused = pytest.raises(ValueError, match=r"hidden_states: P \* inter_dim = .* too large")
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests, refused:
        aiter.fused_moe(*moe_args(600_000, inter=2048))
    assert requests == []


@pytest.mark.parametrize(
    "column, value, expected",
    [
        ("inter_dim", "100", "a multiple of 8"),
        ("model_dim", "2000", "a multiple of 64"),
        ("topk", "200", "an integer from 1 to 127"),
    ],
)
def test_rows_the_kernels_cannot_serve_are_refused_at_load(table, column, value, expected):
    path = table({"token": "64"}, {"token": "128", column: value})
    message = f"{path}:3: column {column!r}: expected {expected}, found {value!r}"
    with pytest.raises(TableError) as info:
        FMOE.load()
    assert str(info.value) == message
    with pytest.raises(TableError, match=re.escape(message)):  # a call loads the table first
        run_moe(8)


def test_quantized_rows_longer_than_a_block_holds_are_refused_at_load(table):
    quantized = {"q_type": "QuantType.per_Token", "q_dtype_a": "torch.float8_e4m3fnuz",
                 "q_dtype_w": "torch.float8_e4m3fnuz"}  # fmt: skip
    path = table({"token": "64", **quantized, "model_dim": "16448"})
    message = (f"{path}:2: column 'model_dim': expected at most 16384 for per-token "
               "quantization, found '16448'")  # fmt: skip
    with pytest.raises(TableError) as info:
        FMOE.load()
    assert str(info.value) == message
