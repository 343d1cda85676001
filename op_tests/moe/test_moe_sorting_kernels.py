"""Tests of the MoE sorting FlyDSL kernels without a GPU: the kernels' algorithm emulated on CPU
from the index functions, against the torch reference and a brute-force property check; the
launcher's argument checks; compilation per arch."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiter.ops.moe.kernels import sorting as ms
from aiter.ops.moe.kernels import sorting_index as ix
from op_tests.compile_child import compile_env, run_child

ARCHS = ("gfx942", "gfx950", "gfx1250")
WAVE_SIZE = {"gfx942": 64, "gfx950": 64, "gfx1250": 32}
KERNELS = ("moe_sorting_count", "moe_sorting_scan", "moe_sorting_fill")


# --- routings ----------------------------------------------------------------------------


def make_routing(rng: random.Random, m: int, topk: int, e: int, distinct: bool = True):
    """topk_ids [M, topk] (distinct experts per row when topk <= E and `distinct`) and
    topk_weights [M, topk] of random floats."""
    rows = []
    for _ in range(m):
        if distinct and topk <= e:
            rows.append(rng.sample(range(e), topk))
        else:
            rows.append([rng.randrange(e) for _ in range(topk)])
    ids = torch.tensor(rows, dtype=torch.int32).reshape(m, topk)
    weights = torch.tensor([[rng.random() for _ in range(topk)] for _ in range(m)])
    return ids, weights.reshape(m, topk).to(torch.float32)


def make_mask(rng: random.Random, e: int, kind: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "zeros":
        return torch.zeros(e, dtype=torch.int32)
    return torch.tensor([int(rng.random() < 0.5) for _ in range(e)], dtype=torch.int32)


# --- the kernels, emulated on CPU ---------------------------------------------------------


class Buffer:
    """An output the emulated kernels write: values, and how often each element was written."""

    def __init__(self, size: int):
        self.values: list = [None] * size
        self.writes = [0] * size

    def store(self, index: int, value) -> None:
        assert 0 <= index < len(self.values), (index, len(self.values))
        self.values[index] = value
        self.writes[index] += 1

    def load(self, index: int):
        assert 0 <= index < len(self.values), (index, len(self.values))
        assert self.values[index] is not None, f"read of unwritten element {index}"
        return self.values[index]


def _read(values: list, index: int):
    assert 0 <= index < len(values), (index, len(values))
    return values[index]


def emulate_moe_sorting(topk_ids, topk_weights, num_experts, block_size, expert_mask=None,
                        num_local_tokens=None):  # fmt: skip
    """Run the three kernels' threads in launch order, using only moe_sorting_index.

    Returns the output Buffers (sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids)
    and the workspace Buffer.
    """
    m, topk = topk_ids.shape
    e, b = num_experts, block_size
    ids = topk_ids.reshape(-1).tolist()
    weights = topk_weights.reshape(-1).tolist()
    mask = None if expert_mask is None else expert_mask.tolist()
    n_local = None if num_local_tokens is None else int(num_local_tokens[0])
    p, num_blocks = ix.sorting_sizes(m, topk, e, b)
    out_ids, out_weights = Buffer(p), Buffer(p)
    out_blocks, out_valid = Buffer(num_blocks), Buffer(2)
    ws = Buffer(ix.workspace_size(e))

    def routed_tokens():
        if n_local is None:
            return m
        return ix.local_token_count(m, n_local, int(n_local < m), int(n_local < 0))

    def local_flag(g):
        return 1 if mask is None else int(_read(mask, g) != 0)

    def expert_threads():
        for bid in range(ix.expert_grid(e)):
            for tid in range(ix.EXPERT_THREADS):
                g = ix.expert_of_thread(bid, tid)
                if ix.is_expert(g, e):
                    yield g

    # count: one thread per global expert.
    threads = 0
    for g in expert_threads():
        threads += 1
        end = ix.entry_bound(ix.routed_entries(routed_tokens(), topk), local_flag(g))
        count = 0
        for i in range(end):
            count += int(_read(ids, i) == g)
        ws.store(ix.count_slot(g), count)
    assert threads == e

    # scan: one thread.
    offset, local_idx = 0, 0
    for g in range(e):
        padded = ix.padded_count(ws.load(ix.count_slot(g)), b)
        ws.store(ix.offset_slot(g, e), offset)
        first_block, end_block = ix.block_range(offset, padded, b)
        end_block = ix.capped(end_block, num_blocks, int(end_block > num_blocks))
        for blk in range(first_block, end_block):
            out_blocks.store(blk, local_idx)
        offset, local_idx = ix.next_run(offset, local_idx, padded, local_flag(g))
    cap = ix.valid_rows_cap(p, b)
    out_valid.store(0, ix.capped(offset, cap, int(offset > cap)))
    out_valid.store(1, routed_tokens())

    # fill: one thread per global expert.
    for g in expert_threads():
        count = ws.load(ix.count_slot(g))
        first = ws.load(ix.offset_slot(g, e))
        end = ix.entry_bound(ix.routed_entries(routed_tokens(), topk), int(count > 0))
        pos = first
        for i in range(end):
            hit = _read(ids, i) == g
            if hit & ix.slot_in_range(pos, p):
                token, slot = ix.entry_token_slot(i, topk)
                out_ids.store(pos, ix.pack_sorted_id(token, slot))
                out_weights.store(pos, _read(weights, i))
            pos += int(hit)
        pad_begin, pad_end = ix.run_padding(first, count, b)
        pad_end = ix.capped(pad_end, p, int(pad_end > p))
        for s in range(pad_begin, pad_end):
            out_ids.store(s, ix.sentinel_id(m, topk))
            out_weights.store(s, 0.0)
    return (out_ids, out_weights, out_blocks, out_valid), ws


def _written_prefix(writes: list[int]) -> int:
    """Length of the prefix of written elements; each written once, none after it."""
    n = sum(writes)
    assert writes == [1] * n + [0] * (len(writes) - n)
    return n


def emulated_outputs(buffers, m: int, topk: int, block_size: int):
    """The emulation's outputs as tensors, the unwritten tail filled as the reference fills
    it, after checking that exactly the used slots and blocks were written, each once.

    Only when num_valid_ids[0] was capped (rows repeating an expert overflowed P) are all P
    slots and all blocks written.
    """
    out_ids, out_weights, out_blocks, out_valid = buffers
    assert out_valid.writes == [1, 1]
    used = out_valid.values[0]
    assert used % block_size == 0
    assert out_ids.writes == out_weights.writes
    p, num_blocks = len(out_ids.writes), len(out_blocks.writes)
    slots, blocks = _written_prefix(out_ids.writes), _written_prefix(out_blocks.writes)
    capped = used == ix.valid_rows_cap(p, block_size)
    assert slots == used or (capped and slots == p)
    assert blocks == used // block_size or (capped and blocks == num_blocks)
    sentinel = ix.sentinel_id(m, topk)
    return (
        torch.tensor([sentinel if v is None else v for v in out_ids.values], dtype=torch.int32),
        torch.tensor([0.0 if v is None else v for v in out_weights.values], dtype=torch.float32),
        torch.tensor([-1 if v is None else v for v in out_blocks.values], dtype=torch.int32),
        torch.tensor(out_valid.values, dtype=torch.int32),
    )


# --- an independent check of the contract ------------------------------------------------


def check_properties(outputs, topk_ids, topk_weights, num_experts, block_size, expert_mask,
                     num_local_tokens) -> None:  # fmt: skip
    """The contract of launch_moe_sorting, checked directly on one routing with distinct
    experts per row (no index function and no reference involved)."""
    sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids = (t.tolist() for t in outputs)
    m, topk = topk_ids.shape
    e, b = num_experts, block_size
    p = m * topk + e * b - topk
    assert len(sorted_ids) == len(sorted_weights) == p
    assert len(sorted_expert_ids) == -(-p // b)
    t_expected = m if num_local_tokens is None else max(0, min(m, int(num_local_tokens[0])))
    assert num_valid_ids[1] == t_expected
    local = [g for g in range(e) if expert_mask is None or int(expert_mask[g]) == 1]
    ids = topk_ids.tolist()
    ws = topk_weights.tolist()
    routed = {
        (t, k): ids[t][k] for t in range(t_expected) for k in range(topk) if ids[t][k] in local
    }
    used = num_valid_ids[0]
    assert 0 <= used <= p and used % b == 0
    sentinel = (topk << 24) | m

    seen: dict[tuple[int, int], int] = {}
    runs: dict[int, list[int]] = {}  # local index -> flat indices of its entries, in slot order
    for s in range(used):
        owner = sorted_expert_ids[s // b]
        assert 0 <= owner < len(local), (s, owner)
        value = sorted_ids[s]
        if value == sentinel:
            assert sorted_weights[s] == 0.0, s
            runs.setdefault(owner, [])
            continue
        t, k = value & 0xFFFFFF, value >> 24
        assert (t, k) not in seen, f"({t}, {k}) at slots {seen.get((t, k))} and {s}"
        seen[(t, k)] = s
        assert routed.get((t, k)) == local[owner], (s, t, k, owner)
        assert sorted_weights[s] == ws[t][k], (s, t, k)
        runs.setdefault(owner, []).append(t * topk + k)
    assert set(seen) == set(routed), "every routed (t, k) appears exactly once"

    owners = sorted_expert_ids[: used // b]
    assert owners == sorted(owners), "blocks follow the local expert order"
    for blk, owner in enumerate(owners):
        slots = range(blk * b, (blk + 1) * b)
        assert any(sorted_ids[s] != sentinel for s in slots), f"block {blk} holds only padding"
        # Inside an expert's run the entries come first, then the padding.
        if blk + 1 == len(owners) or owners[blk + 1] != owner:
            values = [sorted_ids[s] for s in slots]
            n_real = sum(v != sentinel for v in values)
            assert all(v == sentinel for v in values[n_real:]), blk
        else:
            assert all(sorted_ids[s] != sentinel for s in slots), blk
    for owner, flats in runs.items():
        assert flats == sorted(flats), f"local expert {owner}: entries in flat order"
        count = sum(1 for g in routed.values() if g == local[owner])
        assert owners.count(owner) == -(-count // b)
    assert used == sum(-(-sum(1 for g in routed.values() if g == x) // b) * b for x in local)


# --- one routing through all three --------------------------------------------------------


def run_case(seed: int, m: int, topk: int, e: int, b: int, mask_kind: str, local_tokens,
             distinct: bool = True) -> None:  # fmt: skip
    rng = random.Random(seed)
    topk_ids, topk_weights = make_routing(rng, m, topk, e, distinct)
    mask = make_mask(rng, e, mask_kind)
    n_local = None if local_tokens is None else torch.tensor([local_tokens], dtype=torch.int32)
    buffers, _ = emulate_moe_sorting(topk_ids, topk_weights, e, b, mask, n_local)
    emulated = emulated_outputs(buffers, m, topk, b)
    reference = ix.moe_sorting_reference(topk_ids, topk_weights, e, b, mask, n_local)
    names = ("sorted_ids", "sorted_weights", "sorted_expert_ids", "num_valid_ids")
    for name, got, want in zip(names, emulated, reference, strict=True):
        assert torch.equal(got, want), (name, seed, m, topk, e, b, mask_kind, local_tokens)
    if distinct and topk <= e:  # the contract's routings; more slots than P are capped
        check_properties(reference, topk_ids, topk_weights, e, b, mask, n_local)


def _random_cases(count: int, seed: int):
    rng = random.Random(seed)
    sizes = (1, 2, 3, 5, 8, 13, 31, 64, 100, 177, 300)
    cases = []
    for i in range(count):
        m = rng.choice(sizes)
        topk = rng.randint(1, 8)
        e = rng.randint(1, 64)
        b = rng.choice((16, 32, 64))
        mask_kind = rng.choice(("none", "none", "random", "zeros"))
        local_tokens = rng.choice((None, None, 0, m, m + 3, rng.randint(0, m), -1))
        cases.append((seed * 1000 + i, m, topk, e, b, mask_kind, local_tokens))
    return cases


EDGE_CASES = [
    # seed, M, topk, E, B, mask, num_local_tokens
    (1, 1, 1, 1, 16, "none", None),
    (2, 1, 8, 8, 16, "none", None),
    (3, 300, 8, 64, 64, "none", None),
    (4, 300, 8, 64, 16, "random", 150),
    (5, 64, 2, 64, 32, "zeros", None),
    (6, 40, 4, 4, 16, "random", 0),
    (7, 40, 4, 4, 16, "none", 1000),
    (8, 16, 1, 2, 48, "random", 7),  # a block size that is a multiple of 16, not a power
    (9, 50, 6, 70, 128, "none", -5),  # a negative count routes nothing
    (10, 33, 3, 3, 32, "random", 33),
    (11, 129, 1, 64, 16, "none", None),  # one full block of expert threads
    (12, 100, 2, 65, 16, "random", 99),  # two blocks of expert threads
    (13, 20, 8, 130, 16, "none", None),  # three blocks, most experts unused
    (14, 0, 4, 8, 16, "none", None),  # no tokens at all
    (15, 0, 2, 8, 32, "random", 3),
]


@pytest.mark.parametrize("case", EDGE_CASES + _random_cases(110, seed=7))
def test_emulation_matches_reference_and_contract(case) -> None:
    run_case(*case)


@pytest.mark.parametrize(
    ("seed", "m", "topk", "e", "b"),
    [
        (21, 11, 3, 1, 16),
        (22, 40, 8, 2, 16),
        (23, 9, 5, 3, 32),
        (24, 70, 4, 5, 64),
        (25, 3, 40, 1, 16),  # the entries alone overflow P = 120 + 16 - 40
        (26, 5, 100, 2, 16),
    ],
)
def test_rows_repeating_an_expert_stay_in_bounds(seed, m, topk, e, b) -> None:
    """Rows that repeat an expert may need more than P slots: the emulated kernels still write
    only inside the outputs, and agree with the reference, which truncates the same way."""
    run_case(seed, m, topk, e, b, "none", None, distinct=False)


def test_ids_outside_the_experts_are_routed_nowhere() -> None:
    rng = random.Random(11)
    topk_ids, weights = make_routing(rng, 30, 4, 12)
    topk_ids[3, 1] = -1
    topk_ids[7, 0] = 12
    topk_ids[9, 3] = 2**30
    buffers, _ = emulate_moe_sorting(topk_ids, weights, 12, 16)
    emulated = emulated_outputs(buffers, 30, 4, 16)
    reference = ix.moe_sorting_reference(topk_ids, weights, 12, 16)
    for got, want in zip(emulated, reference, strict=True):
        assert torch.equal(got, want)
    routed = {ix.unpack_sorted_id(v) for v in reference[0].tolist()}
    assert not {(3, 1), (7, 0), (9, 3)} & routed
    assert len(routed - {(30, 4)}) == 30 * 4 - 3


def test_repeated_expert_overflow_is_capped() -> None:
    # M = 11, topk = 3, E = 1, B = 16: 33 entries need 48 slots but P = 33 + 16 - 3 = 46.
    topk_ids = torch.zeros(11, 3, dtype=torch.int32)
    weights = torch.ones(11, 3)
    buffers, _ = emulate_moe_sorting(topk_ids, weights, 1, 16)
    ids, _, blocks, valid = emulated_outputs(buffers, 11, 3, 16)
    assert ix.sorting_sizes(11, 3, 1, 16) == (46, 3)
    assert valid.tolist() == [32, 11]
    assert blocks.tolist() == [0, 0, 0]
    assert sum(buffers[0].writes) == 46


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 60),
    topk=st.integers(1, 8),
    e=st.integers(1, 40),
    b=st.sampled_from((16, 32, 64)),
    mask_kind=st.sampled_from(("none", "random", "zeros")),
    local_tokens=st.one_of(st.none(), st.integers(-2, 70)),
    seed=st.integers(0, 2**16),
)
def test_emulation_on_generated_routings(m, topk, e, b, mask_kind, local_tokens, seed) -> None:
    run_case(seed, m, topk, e, b, mask_kind, local_tokens)


def test_workspace_is_written_before_it_is_read() -> None:
    rng = random.Random(3)
    topk_ids, weights = make_routing(rng, 20, 4, 10)
    _, ws = emulate_moe_sorting(topk_ids, weights, 10, 16)
    assert ws.writes == [1] * ix.workspace_size(10)
    assert ms.sorting_workspace_size(10) == ix.workspace_size(10) == 20


# --- index functions ---------------------------------------------------------------------


def test_sorted_id_packing() -> None:
    assert ix.TOKEN_BITS == 24
    for token, slot in ((0, 0), (5, 3), (ix.MAX_TOKENS, ix.MAX_TOPK), (123456, 7)):
        packed = ix.pack_sorted_id(token, slot)
        assert 0 <= packed < 2**31
        assert packed == (slot << 24) | token
        assert ix.unpack_sorted_id(packed) == (token, slot)
    assert ix.sentinel_id(300, 8) == (8 << 24) | 300
    assert ix.unpack_sorted_id(ix.sentinel_id(300, 8)) == (300, 8)


@pytest.mark.parametrize("m", [0, 1, 5, 300])
@pytest.mark.parametrize("n_local", [-7, -1, 0, 1, 4, 5, 6, 299, 300, 301, 10**6])
def test_local_token_count(m: int, n_local: int) -> None:
    got = ix.local_token_count(m, n_local, int(n_local < m), int(n_local < 0))
    assert got == min(m, max(n_local, 0))


def test_padding_blocks_and_sizes() -> None:
    for b in (16, 32, 48, 64):
        for count in range(0, 3 * b + 2):
            padded = ix.padded_count(count, b)
            assert padded % b == 0 and count <= padded < count + b
            begin, end = ix.run_padding(7 * b, count, b)
            assert (begin, end) == (7 * b + count, 7 * b + padded)
            assert ix.block_range(7 * b, padded, b) == (7, 7 + padded // b)
    assert ix.sorting_sizes(4, 2, 8, 32) == (4 * 2 + 8 * 32 - 2, -(-(8 + 256 - 2) // 32))
    for value, cap in ((3, 5), (5, 5), (9, 5)):
        assert ix.capped(value, cap, int(value > cap)) == min(value, cap)
    assert ix.valid_rows_cap(46, 16) == 32


@pytest.mark.parametrize("e", [1, 63, 64, 65, 128, 257])
def test_expert_grid_covers_each_expert_once(e: int) -> None:
    owners = [
        ix.expert_of_thread(bid, tid)
        for bid in range(ix.expert_grid(e))
        for tid in range(ix.EXPERT_THREADS)
    ]
    assert sorted(g for g in owners if ix.is_expert(g, e)) == list(range(e))
    assert len(owners) - e < ix.EXPERT_THREADS
    for wave in WAVE_SIZE.values():
        assert ix.EXPERT_THREADS % wave == 0


@pytest.mark.parametrize("seed", range(6))
def test_p_bounds_the_used_slots_for_distinct_rows(seed: int) -> None:
    """With distinct experts per row every expert pads at most B - 1 slots, so the used
    slots never exceed P: the worst case is every expert's count one past a multiple of B."""
    rng = random.Random(seed)
    e = rng.randint(1, 40)
    topk = rng.randint(1, min(8, e))
    b = rng.choice((16, 32, 64))
    m = rng.randint(1, 200)
    topk_ids, weights = make_routing(rng, m, topk, e)
    _, _, _, valid = ix.moe_sorting_reference(topk_ids, weights, e, b)
    counts = torch.bincount(topk_ids.reshape(-1).long(), minlength=e)
    assert int(valid[0]) == int(((counts + b - 1) // b * b).sum())
    assert int(valid[0]) <= ix.sorting_sizes(m, topk, e, b)[0]


def test_reference_example() -> None:
    topk_ids = torch.tensor([[0, 2], [2, 1], [0, 2]], dtype=torch.int32)
    weights = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    mask = torch.tensor([1, 0, 1, 1], dtype=torch.int32)
    ids, w, blocks, valid = ix.moe_sorting_reference(
        topk_ids, weights, 4, 16, mask, torch.tensor([2], dtype=torch.int32)
    )
    sentinel = (2 << 24) | 3
    assert ids.shape == (6 + 64 - 2,) and blocks.shape == (5,)
    # Expert 0 (local 0): (0, 0). Expert 2 (local 1): (0, 1), (1, 0). Token 2 is not routed.
    assert ids[:2].tolist() == [0, sentinel]
    assert ids[16:19].tolist() == [(1 << 24) | 0, 1, sentinel]
    assert w[16:18].tolist() == [weights[0, 1].item(), weights[1, 0].item()]
    assert blocks.tolist() == [0, 1, -1, -1, -1]
    assert valid.tolist() == [32, 2]


# --- the launcher's checks ----------------------------------------------------------------


def _args(m=5, topk=2, e=8, b=16):
    p, nb = ix.sorting_sizes(m, topk, e, b)
    return dict(
        topk_ids=torch.zeros(m, topk, dtype=torch.int32),
        topk_weights=torch.zeros(m, topk, dtype=torch.float32),
        sorted_ids=torch.empty(p, dtype=torch.int32),
        sorted_weights=torch.empty(p, dtype=torch.float32),
        sorted_expert_ids=torch.empty(nb, dtype=torch.int32),
        num_valid_ids=torch.empty(2, dtype=torch.int32),
        workspace=torch.empty(ms.sorting_workspace_size(e), dtype=ms.WORKSPACE_DTYPE),
    )


def _launch(args, **kwargs):
    kwargs.setdefault("num_experts", 8)
    kwargs.setdefault("block_size", 16)
    ms.launch_moe_sorting(**args, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(block_size=24), "block_size: expected a positive multiple of 16"),
        (dict(block_size=0), "block_size: expected an int >= 1"),
        (dict(block_size=16.0), "block_size: expected an int"),
        (dict(num_experts=0), "num_experts: expected an int >= 1"),
        (dict(num_experts=True), "num_experts: expected an int"),
    ],
)
def test_launch_rejects_bad_scalars(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        _launch(_args(), **kwargs)


def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view with t's shape and dtype."""
    if t.dim() == 2:
        return torch.empty(t.shape[1], t.shape[0], dtype=t.dtype).t()
    return torch.empty(2 * t.shape[0], dtype=t.dtype)[::2]


ARG_SHAPES = {
    "topk_weights": "\\[M, topk\\]",
    "sorted_ids": "\\[P\\]",
    "sorted_weights": "\\[P\\]",
    "sorted_expert_ids": "\\[ceil\\(P / B\\)\\]",
    "num_valid_ids": "\\[2\\]",
    "workspace": "sorting_workspace_size\\(E\\)",
}


@pytest.mark.parametrize("name", ["topk_ids", *ARG_SHAPES])
def test_launch_rejects_bad_tensors(name: str) -> None:
    good = _args()
    wrong_dtype = torch.float32 if good[name].dtype == torch.int32 else torch.int32
    with pytest.raises(ValueError, match=f"^{name}: expected dtype"):
        _launch({**good, name: good[name].to(wrong_dtype)})
    with pytest.raises(ValueError, match=f"^{name}: expected a contiguous tensor"):
        _launch({**good, name: _non_contiguous(good[name])})
    if name == "topk_ids":
        with pytest.raises(ValueError, match="^topk_ids: expected a 2-D"):
            _launch({**good, name: good[name].reshape(-1)})
        with pytest.raises(TypeError, match="^topk_ids: expected a torch.Tensor"):
            _launch({**good, name: [[0, 1]]})
        return
    bad_shape = torch.empty(good[name].numel() + 1, dtype=good[name].dtype)
    if good[name].dim() == 2:
        bad_shape = torch.empty(good[name].shape[0] + 1, good[name].shape[1])
    with pytest.raises(ValueError, match=f"^{name}: expected shape .*{ARG_SHAPES[name]}"):
        _launch({**good, name: bad_shape})
    with pytest.raises(TypeError, match=f"^{name}: expected a torch.Tensor"):
        _launch({**good, name: None})


def test_launch_rejects_bad_optional_tensors() -> None:
    good = _args()
    with pytest.raises(ValueError, match=r"^expert_mask: expected shape \[E\] = \[8\]"):
        _launch(good, expert_mask=torch.ones(7, dtype=torch.int32))
    with pytest.raises(ValueError, match="^expert_mask: expected dtype torch.int32"):
        _launch(good, expert_mask=torch.ones(8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^num_local_tokens: expected shape \[1\] = \[1\]"):
        _launch(good, num_local_tokens=torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="^num_local_tokens: expected dtype torch.int32"):
        _launch(good, num_local_tokens=torch.ones(1, dtype=torch.int64))
    # torch calls this size-1 view contiguous; FlyDSL wants a unit stride.
    strided = torch.ones(2, dtype=torch.int32)[1::2]
    assert strided.is_contiguous() and strided.stride() == (2,)
    with pytest.raises(ValueError, match="^num_local_tokens: expected a contiguous"):
        _launch(good, num_local_tokens=strided)
    with pytest.raises(ValueError, match="^expert_mask: expected a contiguous"):
        _launch(good, expert_mask=torch.ones(16, dtype=torch.int32)[::2])


def test_launch_rejects_out_of_range_sizes() -> None:
    with pytest.raises(ValueError, match=r"^topk_ids: topk = topk_ids.shape\[1\] must be in"):
        _launch(_args(m=2, topk=128, e=8))
    with pytest.raises(ValueError, match=r"^topk_ids: topk = topk_ids.shape\[1\] must be in"):
        _launch({**_args(), "topk_ids": torch.zeros(5, 0, dtype=torch.int32)})
    big = torch.empty(1, 1, dtype=torch.int32).expand(2**24, 1)
    with pytest.raises(ValueError, match=r"^topk_ids: M = topk_ids.shape\[0\] must be <="):
        _launch({**_args(), "topk_ids": big})
    with pytest.raises(ValueError, match=r"^sorted_ids: P = .* must be < 2\*\*31"):
        _launch(_args(), num_experts=2**20, block_size=2**11)


@pytest.mark.gpu
def test_kernels_match_the_reference_on_gpu() -> None:
    rng = random.Random(5)
    for m, topk, e, b, mask_kind, local_tokens in (
        (300, 8, 64, 32, "none", None),
        (77, 6, 40, 16, "random", 50),
        (5, 2, 8, 64, "zeros", 900),
    ):
        topk_ids, weights = make_routing(rng, m, topk, e)
        mask = make_mask(rng, e, mask_kind)
        n_local = None if local_tokens is None else torch.tensor([local_tokens], dtype=torch.int32)
        want = ix.moe_sorting_reference(topk_ids, weights, e, b, mask, n_local)
        args = {k: v.cuda() for k, v in _args(m, topk, e, b).items()}
        args.update(topk_ids=topk_ids.cuda(), topk_weights=weights.cuda())
        _launch(
            args,
            num_experts=e,
            block_size=b,
            expert_mask=None if mask is None else mask.cuda(),
            num_local_tokens=None if n_local is None else n_local.cuda(),
        )
        got = [args[k].cpu() for k in ("sorted_ids", "sorted_weights", "sorted_expert_ids")]
        valid = args["num_valid_ids"].cpu()
        assert torch.equal(valid, want[3])
        used = int(valid[0])
        assert torch.equal(got[0][:used], want[0][:used])
        assert torch.equal(got[1][:used], want[1][:used])
        assert torch.equal(got[2][: used // b], want[2][: used // b])


# --- compilation per arch ----------------------------------------------------------------

_CHILD = """
import json, sys, time
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from aiter.ops.moe.kernels.sorting import launch_moe_sorting, sorting_workspace_size
from aiter.ops.moe.kernels.sorting_index import sorting_sizes

m, topk, e, b = 37, 8, 64, 32
p, nb = sorting_sizes(m, topk, e, b)


def tensors(device):
    i32 = dict(dtype=torch.int32, device=device)
    return dict(
        topk_ids=torch.empty(m, topk, **i32),
        topk_weights=torch.empty(m, topk, dtype=torch.float32, device=device),
        sorted_ids=torch.empty(p, **i32),
        sorted_weights=torch.empty(p, dtype=torch.float32, device=device),
        sorted_expert_ids=torch.empty(nb, **i32),
        num_valid_ids=torch.empty(2, **i32),
        workspace=torch.empty(sorting_workspace_size(e), **i32),
        expert_mask=torch.empty(e, **i32),
        num_local_tokens=torch.empty(1, **i32),
    )


times = []
# Without the optional tensors on CPU tensors; with both on FakeTensors on "cuda".
t = tensors("cpu")
del t["expert_mask"], t["num_local_tokens"]
start = time.perf_counter()
launch_moe_sorting(**t, num_experts=e, block_size=b)
times.append(time.perf_counter() - start)
with FakeTensorMode():
    t = tensors("cuda")
    start = time.perf_counter()
    launch_moe_sorting(**t, num_experts=e, block_size=b)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


@pytest.fixture(scope="module", params=ARCHS)
def compiled(request, rocm_path: str, tmp_path_factory) -> dict:
    """Compile the three kernels with and without the optional inputs for one arch in a child
    process; the cache entries it wrote."""
    arch = request.param
    cache = tmp_path_factory.mktemp(f"cache_{arch}")
    child = run_child(_CHILD, [], compile_env(arch, rocm_path, cache))
    assert child.returncode == 0, (
        f"{arch}: compile process exited with {child.returncode}"
        f" (negative: killed by signal)\n{child.stderr[-4000:]}"
    )
    return {
        "arch": arch,
        "times": json.loads(child.stdout.strip().splitlines()[-1]),
        "entries": {k: sorted(cache.glob(f"{k}_[0-9a-f]*/*.pkl")) for k in KERNELS},
    }


@pytest.mark.slow
def test_one_cache_entry_per_flag_combination(compiled: dict) -> None:
    print(f"{compiled['arch']} compile seconds: {[round(t, 2) for t in compiled['times']]}")
    for kernel, entries in compiled["entries"].items():
        assert len(entries) == 2, (kernel, entries)


@pytest.mark.slow
def test_code_objects_target_the_arch(compiled: dict) -> None:
    from aiter.flydsl_bridge import elf, extract_code_objects

    for entries in compiled["entries"].values():
        for entry in entries:
            codes = extract_code_objects(entry)
            assert len(codes) == 1, entry
            header = elf.parse_header(codes[0])
            assert header.e_machine == elf.EM_AMDGPU, entry
            assert elf.code_object_arch(codes[0]) == compiled["arch"], entry


_ISA_CHILD = """
import torch
from aiter.ops.moe.kernels.sorting import launch_moe_sorting, sorting_workspace_size
from aiter.ops.moe.kernels.sorting_index import sorting_sizes

m, topk, e, b = 9, 2, 8, 16
p, nb = sorting_sizes(m, topk, e, b)
i32 = dict(dtype=torch.int32)
launch_moe_sorting(
    torch.empty(m, topk, **i32), torch.empty(m, topk), torch.empty(p, **i32), torch.empty(p),
    torch.empty(nb, **i32), torch.empty(2, **i32), torch.empty(sorting_workspace_size(e), **i32),
    num_experts=e, block_size=b, expert_mask=torch.empty(e, **i32),
    num_local_tokens=torch.empty(1, **i32),
)
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_isa_has_no_lds_barrier_or_atomic(arch: str, rocm_path: str, tmp_path) -> None:
    """FlyDSL's ISA listing of each kernel: the arch's target and wave size, and none of LDS,
    barriers or atomics (the design's claim of one writer per element, no sharing)."""
    env = compile_env(arch, rocm_path, tmp_path / "cache", dump=tmp_path / "dump")
    child = run_child(_ISA_CHILD, [], env)
    assert child.returncode == 0, child.stderr[-4000:]
    for kernel in KERNELS:
        listings = sorted((tmp_path / "dump").glob(f"{kernel}_kernel_*/*final_isa.s"))
        assert len(listings) == 1, (kernel, listings)
        text = listings[0].read_text()
        assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text
        assert f".wavefront_size: {WAVE_SIZE[arch]}" in text
        assert ".group_segment_fixed_size: 0" in text, kernel
        mnemonics = {
            line.split()[0]
            for line in text.splitlines()
            if line.startswith("\t") and line.split() and not line.split()[0].startswith((".", ";"))
        }
        assert "s_endpgm" in mnemonics, kernel
        bad = {op for op in mnemonics if op.startswith(("ds_", "s_barrier")) or "atomic" in op}
        assert not bad, (kernel, sorted(bad))
