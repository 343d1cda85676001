"""chunk_gdn_h's math on the CPU: the chunked pass against the token-by-token gated delta rule,
and the work-group emulation from the kernel's index arithmetic against the chunked pass,
over random shapes, both gate kinds, initial state or none, dense and ragged varlen batches.
"""

from __future__ import annotations

import random

import pytest
import torch

from aiter.ops.chunk_gdn_h.plan import legal_block_vs
from aiter.ops.chunk_gdn_h.reference import chunk_states, naive_states, wy_inputs
from op_tests.chunk_gdn_h.emulation import emulate, emulate_lanes
from op_tests.shared.mainloop_emulation import fast_first

F64 = torch.float64


def _decays(gen, tokens, *shape):
    """Per-token log2 decays in [-0.5, 0): states shrink, as the models' gates make them."""
    return -0.5 * torch.rand(tokens, *shape, generator=gen, dtype=F64)


@pytest.mark.parametrize("gates", ["g", "gk", "both", "none"])
@pytest.mark.parametrize("tokens, chunk", [(1, 64), (64, 64), (150, 64), (37, 16)])
def test_the_chunked_pass_is_the_token_recurrence(gates, tokens, chunk) -> None:
    gen = torch.Generator().manual_seed(tokens * 7 + len(gates))
    kd, vd = 32, 24
    k = torch.nn.functional.normalize(torch.randn(tokens, kd, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(tokens, vd, generator=gen, dtype=F64)
    beta = torch.rand(tokens, generator=gen, dtype=F64)
    g = _decays(gen, tokens) if gates in ("g", "both") else None
    gk = _decays(gen, tokens, kd) if gates in ("gk", "both") else None
    h0 = torch.randn(kd, vd, generator=gen, dtype=F64)

    states = naive_states(k, v, beta, g, gk, h0)
    kg, w, u, g_cum, gk_cum = wy_inputs(k, v, beta, g, gk, chunk)
    as_batch = [None if t is None else t.unsqueeze(0).unsqueeze(2) for t in (kg, w, u, g_cum)]
    gk_batch = None if gk_cum is None else gk_cum[None, :, None]
    h, _, final = chunk_states(
        *as_batch[:3], as_batch[3], gk_batch, h0[None, None], True, chunk, False, rounded=False
    )
    starts = states[0:tokens:chunk]
    torch.testing.assert_close(h[0, :, 0], starts, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final[0, 0], states[-1], rtol=1e-10, atol=1e-10)


def _case(seed: int) -> dict:
    rng = random.Random(seed)
    key_heads = rng.choice([1, 2])
    varlen = rng.random() < 0.5
    lens = [rng.choice([0, 1, 63, 64, 65, rng.randint(1, 200)]) for _ in range(rng.randint(1, 4))]
    if not varlen:
        lens = [max(1, lens[0])] * rng.randint(1, 3)
    return dict(
        seed=seed,
        lens=lens,
        varlen=varlen,
        key_heads=key_heads,
        heads=key_heads * rng.choice([1, 2, 3]),
        head_dim=rng.choice([64, 128]),
        head_dim_v=(vd := rng.choice([16, 48, 64, 80, 96])),
        block_v=rng.choice(legal_block_vs(vd)),
        dtype=rng.choice([torch.bfloat16, torch.float16]),
        gates=rng.choice(["g", "gk", "both", "none"]),
        h0=rng.random() < 0.5,
        final=rng.random() < 0.7,
        save=rng.random() < 0.8,
    )


CASES = [_case(seed) for seed in range(24)]


def _inputs(case: dict):
    gen = torch.Generator().manual_seed(case["seed"])
    lens, dtype = case["lens"], case["dtype"]
    hg, h, kd, vd = case["key_heads"], case["heads"], case["head_dim"], case["head_dim_v"]
    batch, seqlen = (1, sum(lens)) if case["varlen"] else (len(lens), lens[0])

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    k = rand(batch, seqlen, hg, kd, scale=kd**-0.5)
    w = rand(batch, seqlen, h, kd, scale=kd**-0.5)
    u = rand(batch, seqlen, h, vd)
    g = gk = None
    if case["gates"] in ("g", "both"):
        g = -torch.rand(batch, seqlen, h, generator=gen) * 4  # cumulative within chunks
    if case["gates"] in ("gk", "both"):
        gk = -torch.rand(batch, seqlen, h, kd, generator=gen) * 4
    n = len(lens) if case["varlen"] else batch
    h0 = torch.randn(n, h, kd, vd, generator=gen) if case["h0"] else None
    cu = None
    if case["varlen"]:
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return (k, w, u, g, gk, h0, case["final"], 64, case["save"], cu)


@pytest.mark.parametrize("case", CASES, ids=[str(c["seed"]) for c in CASES])
def test_the_emulated_work_groups_match_the_chunked_pass(case: dict) -> None:
    args = _inputs(case)
    got = emulate(*args, block_v=case["block_v"])
    h, v_new, final = chunk_states(*args)
    torch.testing.assert_close(got.h.float(), h.float(), rtol=2e-2, atol=2e-2)
    if case["save"]:
        torch.testing.assert_close(got.v_new.float(), v_new.float(), rtol=2e-2, atol=2e-2)
    if case["final"]:
        torch.testing.assert_close(got.final, final, rtol=1e-3, atol=1e-3)
    assert torch.all(got.written["h"] == 1)
    if case["save"]:
        # Tokens of every sequence are written once; varlen tokens outside all sequences
        # do not exist (cu_seqlens spans k).
        assert torch.all(got.written["v_new"] == 1)
    if case["final"]:
        assert torch.all(got.written["final"] == 1)


_LANE = dict(key_heads=1, heads=2, head_dim=64, dtype=torch.bfloat16, h0=True, final=True,
             save=True)  # fmt: skip
LANE_CASES = [
    dict(_LANE, seed=1, arch="gfx942", lens=[70], varlen=False, head_dim_v=32, block_v=32,
         gates="g", dtype=torch.float16),
    dict(_LANE, seed=2, arch="gfx950", lens=[5, 0, 66], varlen=True, head_dim_v=64, block_v=32,
         gates="gk", head_dim=128),
    dict(_LANE, seed=3, arch="gfx1250", lens=[40, 40], varlen=False, head_dim_v=16,
         block_v=16, gates="both", key_heads=2, heads=4, h0=False),
]  # fmt: skip


# Lane by lane costs seconds a case: gfx942's runs in the inner loop, the others in make test.
@pytest.mark.parametrize("case", fast_first(LANE_CASES, 1, [c["arch"] for c in LANE_CASES]))
def test_the_lanes_compute_the_chunked_pass(case: dict) -> None:
    args = _inputs(case)
    got = emulate_lanes(*args, block_v=case["block_v"], arch=case["arch"])
    h, v_new, final = chunk_states(*args)
    assert got.lds_races == []
    torch.testing.assert_close(got.h.float(), h.float(), rtol=2e-2, atol=2e-2)
    if case["save"]:
        torch.testing.assert_close(got.v_new.float(), v_new.float(), rtol=2e-2, atol=2e-2)
        assert torch.all(got.written["v_new"] == 1)
    if case["final"]:
        torch.testing.assert_close(got.final, final, rtol=1e-3, atol=1e-3)
        assert torch.all(got.written["final"] == 1)
    assert torch.all(got.written["h"] == 1)
