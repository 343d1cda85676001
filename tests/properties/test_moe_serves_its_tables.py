"""Property: random valid fused-MoE tables, built with `--csv` for gfx942, serve every call inside
what their rows serve from the cache alone, and an empty cache misses every such call.

A shape of the table is replayed at every token count from 1 to `--max-tokens`: a row serves the
token counts whose padded count (`get_padded_M`) is its own, the C++ planner the others. Calls take
token counts at the edges (1, the cap, each row's count and its neighbours, both sides of every
padded bucket) and at random, with the caller choices the replay claims: gate mode, expert mask
(with any number of local experts) or none, num_local_tokens or none, and for swiglu the expert
biases (both or none, as the replay calls it, or either alone: each stage's kernel is then one
of those); fp8 weights preshuffled by `aiter.shuffle_weight` or not, routing from `fused_topk`
or not.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiter.ops.moe.kernels.stages import STAGE_TILES
from aiter.ops.moe.table import (
    ACT_SILU,
    ACT_SWIGLU,
    BLOCK_MS,
    FMOE,
    GATE_MODES,
    KSPLITS,
    PLANNER_CHOOSES,
    QUANT_NONE,
    QUANT_PER_TOKEN,
    STAGE1_KERNELS,
    STAGE2_KERNELS,
    STAGE2_MODES,
)
from tests.aot_cli import PropertyFigures, build_and_serve_tables, build_examples

pytestmark = pytest.mark.slow  # builds a cache per generated table

MODULE = "aiter.aot.flydsl.moe"
ARCH, MMA = "gfx942", "mfma"
FP8 = "float8_e4m3fnuz"  # gfx942's flavour
CU_NUMS = (80, 304)
MAX_TOKENS = (64, 300, 512)
EXAMPLES = 3
RANDOM_TOKENS = 3  # random token counts per shape, besides the edges
ACTIVATIONS = {ACT_SILU: "silu", ACT_SWIGLU: "swiglu"}
# model_dim and inter_dim: multiples of 64 (the kernels'); 2048 lets the planner split K.
MODEL_DIMS, INTER_DIMS, EXPERTS = (192, 256, 2048), (64, 128, 320), (2, 4, 8, 16)


def _tile_names() -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Stage-1 and stage-2 kernel names by tile_m, from the kernels' tile list."""
    stage1: dict[int, list[str]] = {}
    stage2: dict[int, list[str]] = {}
    for t in STAGE_TILES[MMA]:
        tile = f"{MMA}_{t.tile_m}x{t.tile_n}x{t.tile_k}"
        stage1.setdefault(t.tile_m, []).append(f"{STAGE1_KERNELS}_{tile}")
        for mode in STAGE2_MODES:
            stage2.setdefault(t.tile_m, []).append(f"{STAGE2_KERNELS}_{tile}_{mode}")
    return stage1, stage2


STAGE1_NAMES, STAGE2_NAMES = _tile_names()


@st.composite
def _shape(draw) -> dict:
    """A row's key but the token count."""
    experts = draw(st.sampled_from(EXPERTS))
    dtype = f"torch.{draw(st.sampled_from(('bfloat16', 'float16')))}"
    quantized = draw(st.sampled_from((True, False)))
    q_dtype = f"torch.{FP8}" if quantized else dtype
    return {
        "model_dim": draw(st.sampled_from(MODEL_DIMS)),
        "inter_dim": draw(st.sampled_from(INTER_DIMS)),
        "expert": experts,
        "topk": draw(st.integers(1, min(experts, 4))),
        "act_type": draw(st.sampled_from((ACT_SWIGLU, ACT_SILU))),
        "dtype": dtype,
        "q_dtype_a": q_dtype,
        "q_dtype_w": q_dtype,
        "q_type": QUANT_PER_TOKEN if quantized else QUANT_NONE,
        "use_g1u1": 1,
        "doweight_stage1": draw(st.sampled_from((0, 1))),
    }


@st.composite
def _choice(draw) -> dict:
    """block_m, ksplit and kernel names: 0 and empty leave them to the planner; a named tile's
    tile_m is the block size."""
    block_m = int(draw(st.sampled_from((PLANNER_CHOOSES, *BLOCK_MS))))
    names = {"kernelName1": "", "kernelName2": ""}
    tile_m = block_m or int(draw(st.sampled_from(BLOCK_MS)))
    for column, choices in (("kernelName1", STAGE1_NAMES), ("kernelName2", STAGE2_NAMES)):
        names[column] = draw(st.sampled_from(("", *choices[tile_m])))
    us = st.one_of(st.just(""), st.integers(1, 9999).map(lambda v: f"{v / 10:g}"))
    return {
        "block_m": block_m,
        "ksplit": int(draw(st.sampled_from((PLANNER_CHOOSES, *KSPLITS)))),
        **names,
        "us1": draw(us),
        "us2": draw(us),
        "us": draw(us),
        "run_1stage": 0,
    }


@st.composite
def _table(draw, cu_num: int, top: int) -> list[dict]:
    """Two shapes, the second of the other activation and quantization (so that every table has
    both of each), with 1 or 2 rows each at distinct token counts: mostly powers of two (a row
    serves its padded bucket), sometimes another count (it then serves nothing)."""
    first = draw(_shape())
    second = draw(_shape())
    second["act_type"] = ACT_SILU if first["act_type"] == ACT_SWIGLU else ACT_SWIGLU
    quantized = first["q_type"] == QUANT_NONE
    q_dtype = f"torch.{FP8}" if quantized else second["dtype"]
    second.update(q_type=QUANT_PER_TOKEN if quantized else QUANT_NONE, q_dtype_a=q_dtype,
                  q_dtype_w=q_dtype)  # fmt: skip
    counts = st.one_of(
        st.sampled_from([1 << i for i in range(16) if 1 << i <= 2 * top]),
        st.integers(1, 2 * top),
    )
    rows = []
    for shape in (first, second):
        for token in draw(st.lists(counts, min_size=1, max_size=2, unique=True)):
            rows.append({"gfx": ARCH, "cu_num": cu_num, "token": token, **shape, **draw(_choice())})
    return rows


def _padded(tokens: int) -> int:
    """get_padded_M below 32768, as documented: the smallest power of two at or above."""
    return 1 << (tokens - 1).bit_length()


def _variants(shape: dict) -> list[dict]:
    biases = [(False, False)]
    if shape["act_type"] == ACT_SWIGLU:
        biases = list(itertools.product((False, True), repeat=2))
    return [
        {"gate_mode": g, "masked": m, "local_tokens": lt, "bias1": b1, "bias2": b2}
        for g in GATE_MODES
        for m in (False, True)
        for lt in (False, True)
        for b1, b2 in biases
    ]


def _calls(draw, rows: list[dict], top: int) -> list[dict]:
    line_of = {id(row): line for line, row in enumerate(rows, start=2)}
    shapes: dict[tuple, list[dict]] = {}
    for row in rows:
        key = tuple(row[c] for c in FMOE.key if c not in ("gfx", "cu_num", "token"))
        shapes.setdefault(key, []).append(row)
    calls = []
    for shape_rows in shapes.values():
        shape = shape_rows[0]
        served = {_padded(r["token"]): r for r in shape_rows if r["token"] == _padded(r["token"])}
        buckets = {v for p in range(16) for v in ((1 << p), (1 << p) + 1)}
        edges = {1, top} | buckets | {r["token"] + d for r in shape_rows for d in (-1, 0, 1)}
        every = {min(shape["token"], top), top}  # every variant here, a few elsewhere
        tokens = sorted(t for t in edges if 1 <= t <= top)
        tokens += draw(
            st.lists(st.integers(1, top), min_size=RANDOM_TOKENS, max_size=RANDOM_TOKENS)
        )
        variants = _variants(shape)
        some = st.lists(st.sampled_from(variants), min_size=1, max_size=3, unique_by=str)
        for t in tokens:
            row = served.get(_padded(t))
            for variant in variants if t in every else draw(some):
                experts = shape["expert"]
                local = draw(st.integers(1, experts)) if variant["masked"] else experts
                calls.append(
                    {
                        "row": f"{FMOE.short_name}:{line_of[id(row)]}" if row else "planner",
                        "tokens": t,
                        "model_dim": shape["model_dim"],
                        "inter_dim": shape["inter_dim"],
                        "experts": experts,
                        "local": local,
                        "topk": shape["topk"],
                        "activation": ACTIVATIONS[shape["act_type"]],
                        "dtype": shape["dtype"].removeprefix("torch."),
                        "w_dtype": shape["q_dtype_w"].removeprefix("torch."),
                        "quantized": shape["q_type"] == QUANT_PER_TOKEN,
                        "doweight": bool(shape["doweight_stage1"]),
                        "shuffled": shape["q_type"] == QUANT_PER_TOKEN and draw(st.booleans()),
                        "routed": draw(st.booleans()),
                        **variant,
                    }
                )
    return calls


SERVE = """
F32, I32 = torch.float32, torch.int32

def serve(call):
    t, d, inter, topk = call["tokens"], call["model_dim"], call["inter_dim"], call["topk"]
    experts, local = call["experts"], call["local"]
    hidden = empty((t, d), getattr(torch, call["dtype"]))
    w_dtype = getattr(torch, call["w_dtype"])
    w1, w2 = empty((local, 2 * inter, d), w_dtype), empty((local, d, inter), w_dtype)
    if call["shuffled"]:
        w1, w2 = aiter.shuffle_weight(w1), aiter.shuffle_weight(w2)
    if call["routed"]:
        weights, ids = aiter.fused_topk(hidden, empty((t, experts), F32), topk, True)
    else:
        weights, ids = empty((t, topk), F32), empty((t, topk), I32)
    kw = {}
    if call["quantized"]:
        kw.update(quant_type="per_token", w1_scale=empty((local, 2 * inter, 1), F32),
                  w2_scale=empty((local, d, 1), F32))
    if call["bias1"]:
        kw["bias1"] = empty((local, 2 * inter), F32)
    if call["bias2"]:
        kw["bias2"] = empty((local, d), F32)
    if call["masked"]:
        kw["expert_mask"] = empty((experts,), I32)
    if call["local_tokens"]:
        kw["num_local_tokens"] = empty((1,), I32)
    aiter.fused_moe(hidden, w1, w2, weights, ids, activation=call["activation"],
                    gate_mode=call["gate_mode"], doweight_stage1=call["doweight"], **kw)
"""

FIGURES = PropertyFigures(FMOE.short_name)


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    print(FIGURES.line())


def test_random_moe_tables_are_served_from_their_cache_alone(tmp_path):
    examples = iter(range(EXAMPLES * 4))

    @build_examples(EXAMPLES)
    @given(data=st.data())
    def check(data):
        cu_num = data.draw(st.sampled_from(CU_NUMS), label="cu_num")
        top = data.draw(st.sampled_from(MAX_TOKENS), label="max_tokens")
        rows = data.draw(_table(cu_num, top), label=FMOE.short_name)
        calls = _calls(data.draw, rows, top)
        work = tmp_path / f"example{next(examples)}"
        results, empty = build_and_serve_tables(
            MODULE, (FMOE,), {FMOE: rows}, ARCH, cu_num, SERVE, calls, work,
            "--max-tokens", str(top),
        )  # fmt: skip
        FIGURES.add(len(rows), results, empty)

    check()
