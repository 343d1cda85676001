"""Property: random valid chunk_gdn_h tables, built with `--csv` for gfx942, serve every call
inside what their rows serve from the cache alone, and an empty cache misses every such call.

A table serves each of its layers (head dims, heads, dtype, gates and states, dense or varlen) at
every number of sequences and every total token count up to the deployment's maximum tokens
(`--max-tokens`): a row's own BV where N is its N and the tokens fall in its bucket, the
grid-fill rule's elsewhere (above the table's largest T_flat and N included). Calls take each
axis at the edges (1, the deployment's maximum, both sides of the rule's switches and of the
row's own N and T_flat) paired with each other, and at random, with fp32 or bf16 gates; varlen
batches are ragged (random lengths, empty sequences included).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiter.ops.chunk_gdn_h import plan
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from tests.aot_cli import PropertyFigures, build_and_serve_tables, build_examples

pytestmark = pytest.mark.slow  # builds a cache per generated table

MODULE = "aiter.aot.flydsl.chunk_gdn_h"
ARCH = "gfx942"
CU_NUMS = (80, 304)
MAX_TOKENS = (4096, 1500)
EXAMPLES = 2
RANDOM_POINTS = 4  # random (sequences, tokens) per row, besides the edges


@st.composite
def _row(draw, cu_num: int) -> dict:
    key_heads = draw(st.sampled_from((1, 2, 4)))
    heads = key_heads * draw(st.sampled_from((1, 2, 4)))
    head_dim_v = draw(st.sampled_from((64, 128, 48, 96)))
    seqs = draw(st.integers(1, 12))
    varlen = draw(st.sampled_from((0, 1)))
    tokens = draw(st.integers(1, 3000))
    if not varlen:
        tokens = seqs * max(1, tokens // seqs)
    return {
        "gfx": ARCH,
        "cu_num": cu_num,
        "dtype": draw(st.sampled_from(("torch.bfloat16", "torch.float16"))),
        "K": draw(st.sampled_from((128, 64))),
        "V": head_dim_v,
        "BT": 64,
        "H": heads,
        "Hg": key_heads,
        "is_varlen": varlen,
        "use_g": draw(st.sampled_from((1, 0))),
        "use_gk": draw(st.sampled_from((0, 1))),
        "use_h0": draw(st.sampled_from((0, 1))),
        "store_fs": draw(st.sampled_from((0, 1))),
        "save_vn": draw(st.sampled_from((1, 0))),
        "T_flat": tokens,
        "N": seqs,
        "BV": draw(st.sampled_from(plan.legal_block_vs(head_dim_v))),
        "us": draw(st.sampled_from(("", "12.5"))),
    }


@st.composite
def _setup(draw) -> tuple[int, int, list[dict]]:
    cu_num = draw(st.sampled_from(CU_NUMS))
    top = draw(st.sampled_from(MAX_TOKENS))
    first = draw(_row(cu_num))
    second = {**draw(_row(cu_num)), "is_varlen": 1 - first["is_varlen"]}
    if not second["is_varlen"]:
        second["T_flat"] = second["N"] * max(1, second["T_flat"] // second["N"])
    return cu_num, top, [first, second]


def _edges(top: int, *marks: int) -> list[int]:
    return sorted({p for m in (1, top, *marks) for p in (m - 1, m, m + 1) if 1 <= p <= top})


def _calls(draw, rows: list[dict], top: int) -> list[dict]:
    calls = []
    for line, row in enumerate(rows, start=2):
        switches = plan.block_v_switch_points(row["H"], row["V"], row["cu_num"])
        seqs = _edges(top, row["N"], *switches)
        tokens = _edges(top, row["T_flat"])
        points = [(n, t) for n in seqs for t in tokens if t >= n or row["is_varlen"]]
        for _ in range(RANDOM_POINTS):
            n = draw(st.integers(1, 2 * row["N"] + 2))
            points.append((n, draw(st.integers(n, max(n, top)))))
        for n, t in points:
            call = {"row": f"{CHUNK_GDN_H.short_name}:{line}", "seqs": n, "tokens": t,
                    **{c: row[c] for c in CHUNK_GDN_H.header if c not in ("us", "BV")}}  # fmt: skip
            call["gate_dtype"] = draw(st.sampled_from(("float32", "bfloat16")))
            if row["is_varlen"]:
                lengths = random.Random(draw(st.integers(0, 2**32 - 1)))  # n may be thousands
                cuts = sorted(lengths.randint(0, t) for _ in range(n - 1))
                call["cu_seqlens"] = [0, *cuts, t]
            calls.append(call)
    return calls


SERVE = """
from aiter.aot.flydsl.dry_run import host_tensor

def serve(call):
    dtype = getattr(torch, call["dtype"].removeprefix("torch."))
    n, hg, h, k, v = (call[c] for c in ("seqs", "Hg", "H", "K", "V"))
    if call["is_varlen"]:
        b, t = 1, call["tokens"]
        cu = host_tensor(call["cu_seqlens"], torch.int32)
    else:
        b, t, cu = n, max(1, call["tokens"] // n), None
    f32, gate = torch.float32, getattr(torch, call["gate_dtype"])
    aiter.chunk_gated_delta_rule_fwd_h(
        empty((b, t, hg, k), dtype), empty((b, t, h, k), dtype), empty((b, t, h, v), dtype),
        g=empty((b, t, h), gate) if call["use_g"] else None,
        gk=empty((b, t, h, k), gate) if call["use_gk"] else None,
        initial_state=empty((n, h, k, v), f32) if call["use_h0"] else None,
        output_final_state=bool(call["store_fs"]), chunk_size=call["BT"],
        save_new_value=bool(call["save_vn"]), cu_seqlens=cu)
"""

FIGURES = PropertyFigures(CHUNK_GDN_H.short_name)


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    print(FIGURES.line())


def test_random_chunk_gdn_h_tables_are_served_from_their_cache_alone(tmp_path):
    examples = iter(range(EXAMPLES * 4))

    @build_examples(EXAMPLES)
    @given(data=st.data())
    def check(data):
        cu_num, top, rows = data.draw(_setup(), label="table")
        calls = _calls(data.draw, rows, top)
        work = tmp_path / f"example{next(examples)}"
        results, empty = build_and_serve_tables(
            MODULE, (CHUNK_GDN_H,), {CHUNK_GDN_H: rows}, ARCH, cu_num, SERVE, calls, work,
            "--max-tokens", str(top),
        )  # fmt: skip
        FIGURES.add(len(rows), results, empty)

    check()
