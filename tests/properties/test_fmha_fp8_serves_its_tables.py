"""Property: random valid fp8 attention shape tables, built with `--csv` for gfx950, serve every
call inside what their rows serve from the cache alone, and an empty cache misses every such call.

A row serves its heads, layout and causality at every batch up to its max_batch and every query
and key length up to its max_seqlen (cut at `--max-seqlen`). Calls take each length at the edges
(1, the top, both sides of the launcher's documented switches: the split gate at 128 queries, the
query block at 256, the split gate at 16 key blocks) paired with each other, and at random, with
the log-sum-exp asked for or not, causality passed or left to its default, and varlen batches
ragged (fewer rows than batch times the longest lengths).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiter.ops.fmha_fp8.table import FMHA_FP8, LAYOUTS
from tests.aot_cli import PropertyFigures, build_and_serve_tables, build_examples

pytestmark = pytest.mark.slow  # builds a cache per generated table

MODULE = "aiter.aot.flydsl.fmha_fp8"
ARCH = "gfx950"
CU_NUMS = (80, 256)
MAX_SEQLENS = (1024, 512, 1100)
EXAMPLES = 2
RANDOM_POINTS = 4  # random (batch, query length, key length) per row, besides the edges
# Head dims: multiples of 32 from 64 to 256 (the entry's); Dv may differ from D.
HEAD_DIMS = (128, 64, 96, 192, 256)
# Both sides of the documented switches: KV splits from 128 queries, query block 128 above 256
# queries, KV splits from 16 key blocks of 64 (961 keys).
SWITCHES = (127, 128, 256, 257, 960, 961)


@st.composite
def _row(draw, cu_num: int) -> dict:
    kv_heads = draw(st.sampled_from((1, 2, 4)))
    head_dim = draw(st.sampled_from(HEAD_DIMS))
    return {
        "gfx": ARCH,
        "cu_num": cu_num,
        "num_heads": kv_heads * draw(st.sampled_from((4, 1, 2, 8))),
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "head_dim_v": draw(st.sampled_from((head_dim, *HEAD_DIMS))),
        "layout": draw(st.sampled_from(LAYOUTS)),
        "causal": draw(st.sampled_from((1, 0))),
        "max_batch": draw(st.integers(1, 3)),
        "max_seqlen": draw(st.one_of(st.sampled_from((1024, *SWITCHES)), st.integers(1, 1200))),
        "model": draw(st.sampled_from(("", "test", "Llama-3.1-70B"))),
    }


@st.composite
def _setup(draw) -> tuple[int, int, list[dict]]:
    """(CU count, --max-seqlen, two rows): the second of the other layout and causality, so
    that every table has both of each."""
    cu_num = draw(st.sampled_from(CU_NUMS))
    top = draw(st.sampled_from(MAX_SEQLENS))
    first = draw(_row(cu_num))
    other = {
        "layout": next(v for v in LAYOUTS if v != first["layout"]),
        "causal": 1 - first["causal"],
    }
    return cu_num, top, [first, {**draw(_row(cu_num)), **other}]


def _calls(draw, rows: list[dict], top: int) -> list[dict]:
    calls = []
    for line, row in enumerate(rows, start=2):
        longest = min(row["max_seqlen"], top)
        edges = sorted({1, longest, *(s for s in SWITCHES if s <= longest)})
        points = [(draw(st.integers(1, row["max_batch"])), q, k) for q in edges for k in edges]
        points += [(1, longest, longest), (row["max_batch"], longest, longest)]
        lengths = st.integers(1, longest)
        for _ in range(RANDOM_POINTS):
            points.append((draw(st.integers(1, row["max_batch"])), draw(lengths), draw(lengths)))
        for batch, sq, sk in points:
            call = {
                "row": f"{FMHA_FP8.short_name}:{line}",
                "batch": batch, "sq": sq, "sk": sk,
                **{c: row[c] for c in ("num_heads", "num_kv_heads", "head_dim", "head_dim_v")},
                "varlen": row["layout"] == "varlen", "causal": bool(row["causal"]),
                "lse": draw(st.booleans()), "spelled": draw(st.booleans()),
            }  # fmt: skip
            if call["varlen"]:  # ragged: one sequence of the longest length, the others shorter
                call["tq"] = draw(st.integers(sq + batch - 1, batch * sq))
                call["tk"] = draw(st.integers(sk + batch - 1, batch * sk))
            calls.append(call)
    return calls


SERVE = """
from aiter import device

def serve(call):
    fp8 = device.fp8_dtype()
    b, sq, sk = call["batch"], call["sq"], call["sk"]
    hq, hkv, d, dv = (call[c] for c in ("num_heads", "num_kv_heads", "head_dim", "head_dim_v"))
    kw = {n: empty((1,), torch.float32) for n in ("q_descale", "k_descale", "v_descale")}
    if call["spelled"] or not call["causal"]:  # causal is the default
        kw["causal"] = call["causal"]
    if call["spelled"] or call["lse"]:
        kw["return_lse"] = call["lse"]
    if call["varlen"]:
        kw.update(cu_seqlens_q=empty((b + 1,), torch.int32),
                  cu_seqlens_kv=empty((b + 1,), torch.int32), max_seqlen_q=sq, max_seqlen_kv=sk)
        q, k, v = empty((call["tq"], hq, d), fp8), empty((call["tk"], hkv, d), fp8), empty(
            (call["tk"], hkv, dv), fp8)
    else:
        q, k, v = empty((b, sq, hq, d), fp8), empty((b, sk, hkv, d), fp8), empty(
            (b, sk, hkv, dv), fp8)
    aiter.flash_attn_fp8(q, k, v, **kw)
"""

FIGURES = PropertyFigures(FMHA_FP8.short_name)


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    print(FIGURES.line())


def test_random_fmha_fp8_tables_are_served_from_their_cache_alone(tmp_path):
    examples = iter(range(EXAMPLES * 4))

    @build_examples(EXAMPLES)
    @given(data=st.data())
    def check(data):
        cu_num, top, rows = data.draw(_setup(), label="table")
        calls = _calls(data.draw, rows, top)
        work = tmp_path / f"example{next(examples)}"
        results, empty = build_and_serve_tables(
            MODULE, (FMHA_FP8,), {FMHA_FP8: rows}, ARCH, cu_num, SERVE, calls, work,
            "--max-seqlen", str(top),
        )  # fmt: skip
        FIGURES.add(len(rows), results, empty)

    check()
