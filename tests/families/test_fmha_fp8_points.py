"""The points the fp8 attention replay probes: the runs of the one-axis functions, the batch at
which the split predicate turns off, and the regions the points stand for, against brute force
over the plan's own functions."""

from __future__ import annotations

import itertools

import pytest

from aiter.aot.flydsl import fmha_fp8
from aiter.ops.fmha_fp8.plan import ONE_AXIS, kv_splits
from aiter.ops.fmha_fp8.table import FMHA_FP8
from aiter.tuning import Row

HEADER = FMHA_FP8.header


def _row(num_heads: int, head_dim_v: int, cu_num: int, max_batch: int, max_seqlen: int) -> Row:
    values = {
        "gfx": "gfx942", "cu_num": cu_num, "num_heads": num_heads, "num_kv_heads": 1,
        "head_dim": 128, "head_dim_v": head_dim_v, "layout": "dense", "causal": 1,
        "max_batch": max_batch, "max_seqlen": max_seqlen, "model": "test",
    }  # fmt: skip
    return Row({name: str(values[name]) for name in HEADER}, "t.csv", 2)


@pytest.mark.parametrize("axis", ["seqlen_q", "seqlen_k"])
def test_runs_are_the_maximal_runs_of_the_one_axis_functions(axis):
    top = 5000
    runs = fmha_fp8.runs(axis, top)
    assert runs[0][0] == 1 and runs[-1][1] == top
    for (_, hi), (lo, _) in itertools.pairwise(runs):
        assert lo == hi + 1
        assert [f(hi) for f in ONE_AXIS[axis]] != [f(lo) for f in ONE_AXIS[axis]]
    for lo, hi in runs:
        assert len({tuple(f(v) for f in ONE_AXIS[axis]) for v in range(lo, hi + 1)}) == 1


@pytest.mark.parametrize(
    "row",
    [_row(8, 128, 304, 8, 8192), _row(64, 128, 80, 64, 4096), _row(16, 256, 256, 3, 1100)],
    ids=["llama-tp8", "many-heads", "wide-v"],
)
def test_fewest_unsplit_batches_is_where_splitting_stops(row):
    heads, dv, cu = row.int("num_heads"), row.int("head_dim_v"), row.int("cu_num")
    for q, k in itertools.product((1, 128, 256, 257, 1100, 4096), (1, 960, 961, 4096)):
        splits = [
            kv_splits(b, heads, q, k, b * q, dv, cu) > 1 for b in range(1, 1 + row.int("max_batch"))
        ]
        assert splits == sorted(splits, reverse=True)  # never turns on as batch grows
        expected = next((b for b, s in enumerate(splits, 1) if not s), None)
        assert fmha_fp8.fewest_unsplit_batches(row, q, k) == expected


def test_points_stand_for_every_region_once():
    row = _row(8, 128, 304, 8, 8192)
    maxima = {"seqlen": 8192}
    planned = fmha_fp8.points(
        FMHA_FP8, row, {"return_lse": "false", "kv_splits": "planned"}, maxima
    )
    cells = [cell for _, cell in planned if cell]
    regions = [
        {"batch": [1, 8], "seqlen_q": list(q), "seqlen_k": list(k)}
        for q in fmha_fp8.runs("seqlen_q", 8192)
        for k in fmha_fp8.runs("seqlen_k", 8192)
    ]
    assert sorted(map(str, cells)) == sorted(map(str, regions))
    for values, _ in planned:
        assert 1 <= values["batch"] <= 8
    forced = fmha_fp8.points(FMHA_FP8, row, {"return_lse": "false", "kv_splits": "2"}, maxima)
    assert len(forced) == len(regions)
    assert all(values["batch"] == 1 for values, _ in forced)
