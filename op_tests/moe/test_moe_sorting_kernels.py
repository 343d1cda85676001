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
from op_tests.shared.mainloop_emulation import Lds, fast_first

ARCHS = ("gfx942", "gfx950", "gfx1250")
WAVE_SIZE = {"gfx942": 64, "gfx950": 64, "gfx1250": 32}
KERNELS = ("moe_sorting_count", "moe_sorting_scan", "moe_sorting_scatter")


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


def _load(values: list, valid: bool, index: int):
    """A buffer load: the element where valid and inside the buffer, else the hardware's 0."""
    return values[index] if valid and 0 <= index < len(values) else 0


class WaveLds:
    """The LDS of one emulated block as 4-byte words, with the race check of the shared
    main-loop emulation (no word written by one wave and read or written by another inside a
    phase) and the rule a multi-lane write must keep: lanes writing one word write one value."""

    def __init__(self, words: int):
        self.lds = Lds(4 * words)

    def read(self, wave: int, words: list[int | None]) -> list[int | None]:
        self.lds.instruction("read", wave, [None if w is None else 4 * w for w in words], 4)
        return [None if w is None else self.lds.values[4 * w] for w in words]

    def write(self, wave: int, words: list[int | None], values: list) -> None:
        chosen: dict[int, int] = {}
        for w, v in zip(words, values, strict=True):
            if w is not None:
                assert chosen.setdefault(w, v) == v, f"lanes write {chosen[w]} and {v} to {w}"
        self.lds.instruction("write", wave, [None if w is None else 4 * w for w in words], 4)
        for w, v in chosen.items():
            self.lds.values[4 * w] = v

    def barrier(self) -> None:
        self.lds.barrier()

    @property
    def races(self) -> list[str]:
        return self.lds.races


def _ballot(bits: list[bool]) -> int:
    return sum(1 << lane for lane, on in enumerate(bits) if on)


def _rank_round(valid: list[bool], experts: list[int], wave_size: int):
    """Per lane (rank, count): the kernel's peer masks from one ballot per expert bit."""
    full = (1 << wave_size) - 1
    peers = [_ballot(valid)] * wave_size
    for bit in range(ix.EXPERT_BITS):
        on = [(x >> bit) & 1 != 0 for x in experts]
        lanes = _ballot(on)
        peers = [p & (lanes if on[i] else lanes ^ full) for i, p in enumerate(peers)]
    ranks = [bin(p & ((1 << lane) - 1)).count("1") for lane, p in enumerate(peers)]
    return ranks, [bin(p).count("1") for p in peers]


def _rank_rounds(lds: WaveLds, ids: list, chunk: int, entries: int, e: int, wave_size: int):
    """The count and scatter kernels' first phase, wave by wave and round by round: each
    round's entries ranked and counted into the wave's LDS row. Returns per wave and round
    the lanes' (flat entry, valid, word, rank, count)."""
    ranked = []
    for wave in range(ix.waves_per_block(wave_size)):
        rounds = []
        for rnd in range(ix.ROUNDS):
            flats = [ix.chunk_entry(chunk, wave, rnd, lane, wave_size) for lane in range(wave_size)]
            experts = [_load(ids, i < entries, i) for i in flats]
            valid = [i < entries and 0 <= x < e for i, x in zip(flats, experts, strict=True)]
            ranks, counts = _rank_round(valid, experts, wave_size)
            words = [
                ix.table_word(wave, x) if ok else ix.spare_word(wave * wave_size + lane, wave_size)
                for lane, (x, ok) in enumerate(zip(experts, valid, strict=True))
            ]
            before = lds.read(wave, words)
            lds.write(wave, words, [b + c for b, c in zip(before, counts, strict=True)])
            rounds.append(list(zip(flats, valid, words, ranks, counts, strict=True)))
        ranked.append(rounds)
    return ranked


def _zeroed_table(wave_size: int) -> WaveLds:
    lds = WaveLds(ix.table_words(wave_size))
    for i in range(ix.table_words(wave_size) // ix.THREADS):
        for wave in range(ix.waves_per_block(wave_size)):
            tids = range(wave * wave_size, (wave + 1) * wave_size)
            lds.write(wave, [i * ix.THREADS + t for t in tids], [0] * wave_size)
    lds.barrier()
    return lds


def _threads(count: int, wave_size: int):
    """(wave, [tids]) of a block of `count` threads."""
    return [(w, list(range(w * wave_size, (w + 1) * wave_size))) for w in range(count // wave_size)]


def emulate_moe_sorting(topk_ids, topk_weights, num_experts, block_size, expert_mask=None,
                        num_local_tokens=None, wave_size: int = 64):  # fmt: skip
    """Run the three kernels block by block, wave by wave and phase by phase (barrier to
    barrier), using only sorting_index, with the LDS checked for races.

    Returns the output Buffers (sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids),
    the workspace Buffer and the LDS races found.
    """
    m, topk = topk_ids.shape
    e, b = num_experts, block_size
    ids = topk_ids.reshape(-1).tolist()
    weights = topk_weights.reshape(-1).tolist()
    mask = None if expert_mask is None else expert_mask.tolist()
    n_local = None if num_local_tokens is None else int(num_local_tokens[0])
    p, num_blocks = ix.sorting_sizes(m, topk, e, b)
    chunks = ix.num_chunks(m, topk)
    out_ids, out_weights = Buffer(p), Buffer(p)
    out_blocks, out_valid = Buffer(num_blocks), Buffer(2)
    ws = Buffer(ix.workspace_size(m, topk, e))
    races: list[str] = []
    waves = ix.waves_per_block(wave_size)

    t = (
        m
        if n_local is None
        else ix.local_token_count(m, n_local, int(n_local < m), int(n_local < 0))
    )
    entries = ix.routed_entries(t, topk)

    # count: a block per chunk.
    for chunk in range(chunks):
        lds = _zeroed_table(wave_size)
        _rank_rounds(lds, ids, chunk, entries, e, wave_size)
        lds.barrier()
        for wave, tids in _threads(ix.THREADS, wave_size):
            for i in range(ix.MAX_EXPERTS // ix.THREADS):
                gs = [ix.experts_of_thread(tid)[i] for tid in tids]
                totals = [0] * wave_size
                for w in range(waves):
                    got = lds.read(wave, [ix.table_word(w, g) for g in gs])
                    totals = [x + y for x, y in zip(totals, got, strict=True)]
                for g, total in zip(gs, totals, strict=True):
                    if g < e:
                        ws.store(ix.count_slot(chunk, g, e), total)
        lds.barrier()
        races += lds.races

    # scan: one block of SCAN_THREADS, thread g for expert g.
    scan_waves = _threads(ix.SCAN_THREADS, wave_size)
    total, local, padded = {}, {}, {}
    for g in range(ix.SCAN_THREADS):
        running = 0
        for first_chunk in range(0, chunks, ix.SCAN_BATCH):
            batch = []
            for i in range(ix.SCAN_BATCH):
                valid = g < e and first_chunk + i < chunks
                slot = ix.count_slot(first_chunk + i, g, e)
                batch.append((slot, valid, ws.load(slot) if valid else 0))
            for slot, valid, count in batch:
                if valid:
                    ws.store(slot, running)
                running += count
        total[g] = running
        local[g] = int(g < e and (mask is None or _load(mask, True, g) != 0))
        padded[g] = local[g] * ix.padded_count(running, b)
    lds = WaveLds(3 * ix.SCAN_THREADS)
    values = {g: [padded[g], local[g]] for g in range(ix.SCAN_THREADS)}
    for step in ix.scan_steps():
        for wave, tids in scan_waves:
            for v in range(2):
                lds.write(
                    wave, [v * ix.SCAN_THREADS + g for g in tids], [values[g][v] for g in tids]
                )
        lds.barrier()
        for wave, tids in scan_waves:
            for v in range(2):
                src = [g - step if g >= step else g for g in tids]
                got = lds.read(wave, [v * ix.SCAN_THREADS + x for x in src])
                for g, x in zip(tids, got, strict=True):
                    values[g][v] += int(g >= step) * x
        lds.barrier()
    first = {g: values[g][0] - padded[g] for g in range(ix.SCAN_THREADS)}
    for wave, tids in scan_waves:
        lds.write(wave, tids, [first[g] for g in tids])
        lds.write(
            wave, [ix.SCAN_THREADS + g for g in tids], [values[g][1] - local[g] for g in tids]
        )
        lds.write(wave, [2 * ix.SCAN_THREADS + g for g in tids], [values[g][0] for g in tids])
    lds.barrier()
    sentinel = ix.sentinel_id(m, topk)
    for wave, tids in scan_waves:
        used = lds.read(wave, [3 * ix.SCAN_THREADS - 1] * wave_size)[0]
        for g in tids:
            if g < e:
                ws.store(ix.first_slot_index(g, e, chunks), first[g] if local[g] else p)
            pad_begin, pad_end = ix.run_padding(first[g], local[g] * total[g], b)
            for j in range(b):
                s = pad_begin + j
                if s < pad_end and s < p:
                    out_ids.store(s, sentinel)
                    out_weights.store(s, 0.0)
        used_blocks = used // b
        for first_block in range(0, used_blocks, ix.SCAN_THREADS):
            owners = [0] * wave_size
            for step in ix.search_steps():
                cand = [o + step for o in owners]
                got = lds.read(wave, cand)
                owners = [c if f <= (first_block + g) * b else o
                          for g, c, f, o in zip(tids, cand, got, owners, strict=True)]  # fmt: skip
            idx = lds.read(wave, [ix.SCAN_THREADS + o for o in owners])
            for g, x in zip(tids, idx, strict=True):
                blk = first_block + g
                if blk < used_blocks and blk < num_blocks:
                    out_blocks.store(blk, x)
        if wave == 0:
            cap = ix.valid_rows_cap(p, b)
            out_valid.store(0, ix.capped(used, cap, int(used > cap)))
            out_valid.store(1, t)
    races += lds.races

    # scatter: a block per chunk.
    for chunk in range(chunks):
        lds = _zeroed_table(wave_size)
        ranked = _rank_rounds(lds, ids, chunk, entries, e, wave_size)
        lds.barrier()
        for wave, tids in _threads(ix.THREADS, wave_size):
            for i in range(ix.MAX_EXPERTS // ix.THREADS):
                gs = [ix.experts_of_thread(tid)[i] for tid in tids]
                run = [
                    (ws.load(ix.first_slot_index(g, e, chunks)) + ws.load(ix.count_slot(chunk, g, e)))
                    if g < e else 0
                    for g in gs
                ]  # fmt: skip
                for w in range(waves):
                    words = [ix.table_word(w, g) for g in gs]
                    counts = lds.read(wave, words)
                    lds.write(wave, words, run)
                    run = [r + c for r, c in zip(run, counts, strict=True)]
        lds.barrier()
        for wave in range(waves):
            for lanes in ranked[wave]:
                words = [word for _, _, word, _, _ in lanes]
                before = lds.read(wave, words)
                lds.write(wave, words, [x + lane[4] for x, lane in zip(before, lanes, strict=True)])
                for (i, valid, _, rank, _), x in zip(lanes, before, strict=True):
                    pos = x + rank
                    if valid and pos < p:
                        token, slot = ix.entry_token_slot(i, topk)
                        out_ids.store(pos, ix.pack_sorted_id(token, slot))
                        out_weights.store(pos, _load(weights, True, i))
        lds.barrier()
        races += lds.races
    return (out_ids, out_weights, out_blocks, out_valid), ws, races


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
             distinct: bool = True, wave_size: int = 64) -> None:  # fmt: skip
    rng = random.Random(seed)
    topk_ids, topk_weights = make_routing(rng, m, topk, e, distinct)
    mask = make_mask(rng, e, mask_kind)
    n_local = None if local_tokens is None else torch.tensor([local_tokens], dtype=torch.int32)
    buffers, _, races = emulate_moe_sorting(
        topk_ids, topk_weights, e, b, mask, n_local, wave_size=wave_size
    )
    assert races == []
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
    (13, 20, 8, 130, 16, "none", None),  # most experts unused
    (14, 0, 4, 8, 16, "none", None),  # no tokens at all
    (15, 0, 2, 8, 32, "random", 3),
    (16, 256, 8, 8, 16, "none", None),  # exactly one chunk of 2048 entries
    (17, 700, 4, 33, 32, "random", 650),  # two chunks, the second partly routed
    (18, 3000, 8, 256, 64, "none", None),  # 12 chunks, two scan batches
    (19, 1100, 2, 512, 16, "random", None),  # the most experts
    (20, 600, 7, 511, 32, "none", 599),
]


# A block-by-block emulation costs about half a second a case: the first edge cases run in the
# inner loop, the other edge cases, the multi-chunk ones and the random ones in `make test`.
@pytest.mark.parametrize(
    "case", fast_first([(c,) for c in EDGE_CASES + _random_cases(110, seed=7)], 3)
)
def test_emulation_matches_reference_and_contract(case) -> None:
    run_case(*case)


@pytest.mark.parametrize(
    "case", fast_first([(c,) for c in EDGE_CASES[:4] + EDGE_CASES[15:18] + _random_cases(20, 8)], 1)
)
def test_wave32_emulation_matches_reference(case) -> None:
    """gfx1250's wave32: eight waves of a block, 32-lane ballots."""
    run_case(*case, wave_size=32)


@pytest.mark.parametrize(
    ("seed", "m", "topk", "e", "b"),
    fast_first(
        [
            (21, 11, 3, 1, 16),
            (22, 40, 8, 2, 16),
            (23, 9, 5, 3, 32),
            (24, 70, 4, 5, 64),
            (25, 3, 40, 1, 16),  # the entries alone overflow P = 120 + 16 - 40
            (26, 5, 100, 2, 16),
        ],
        {0, 4},
    ),
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
    buffers, _, races = emulate_moe_sorting(topk_ids, weights, 12, 16)
    assert races == []
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
    buffers, _, _ = emulate_moe_sorting(topk_ids, weights, 1, 16)
    ids, _, blocks, valid = emulated_outputs(buffers, 11, 3, 16)
    assert ix.sorting_sizes(11, 3, 1, 16) == (46, 3)
    assert valid.tolist() == [32, 11]
    assert blocks.tolist() == [0, 0, 0]
    assert sum(buffers[0].writes) == 46


@pytest.mark.slow
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
    _, ws, _ = emulate_moe_sorting(topk_ids, weights, 10, 16)
    # One chunk: its counts are written by the count kernel, rewritten by the scan as
    # prefixes; the first slots once by the scan.
    assert ws.writes == [2] * 10 + [1] * 10
    assert ms.sorting_workspace_size(20, 4, 10) == ix.workspace_size(20, 4, 10) == 20
    assert ix.workspace_size(3000, 8, 256) == (12 + 1) * 256


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
    assert ix.sorting_sizes(4, 2, 8, 32) == (4 * 2 + 8 * 32 - 2, -(-(8 + 256 - 2) // 32))
    for value, cap in ((3, 5), (5, 5), (9, 5)):
        assert ix.capped(value, cap, int(value > cap)) == min(value, cap)
    assert ix.valid_rows_cap(46, 16) == 32


@pytest.mark.parametrize("wave_size", [64, 32])
def test_chunks_cover_each_entry_once_in_flat_order(wave_size: int) -> None:
    """(chunk, wave, round, lane) in launch order names the flat entries 0, 1, 2, ...: ranking
    in that order is flat order. The LDS rows, spare words and expert sums do not overlap."""
    waves = ix.waves_per_block(wave_size)
    order = [
        ix.chunk_entry(c, w, r, lane, wave_size)
        for c in range(3) for w in range(waves) for r in range(ix.ROUNDS)
        for lane in range(wave_size)
    ]  # fmt: skip
    assert order == list(range(3 * ix.CHUNK))
    rows = {ix.table_word(w, g) for w in range(waves) for g in range(ix.MAX_EXPERTS)}
    spares = {ix.spare_word(t, wave_size) for t in range(ix.THREADS)}
    assert not rows & spares
    assert rows | spares == set(range(ix.table_words(wave_size)))
    summed = sorted(g for t in range(ix.THREADS) for g in ix.experts_of_thread(t))
    assert summed == list(range(ix.MAX_EXPERTS))
    assert 1 << ix.EXPERT_BITS == ix.MAX_EXPERTS == ix.SCAN_THREADS
    assert ix.num_chunks(0, 8) == 1 and ix.num_chunks(256, 8) == 1 and ix.num_chunks(257, 8) == 2


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
        workspace=torch.empty(ms.sorting_workspace_size(m, topk, e), dtype=ms.WORKSPACE_DTYPE),
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
        (dict(num_experts=513), "num_experts: expected at most 512 experts, got 513"),
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
    "workspace": "sorting_workspace_size\\(M, topk, E\\)",
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
    with pytest.raises(ValueError, match=r"^sorted_ids: P = .* must be < 2\*\*29"):
        _launch(_args(), num_experts=512, block_size=2**20)


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
        workspace=torch.empty(sorting_workspace_size(m, topk, e), **i32),
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
    torch.empty(nb, **i32), torch.empty(2, **i32),
    torch.empty(sorting_workspace_size(m, topk, e), **i32),
    num_experts=e, block_size=b, expert_mask=torch.empty(e, **i32),
    num_local_tokens=torch.empty(1, **i32),
)
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_isa_is_a_counting_sort_with_no_per_entry_wait(arch: str, rocm_path: str, tmp_path) -> None:
    """FlyDSL's ISA listing of each kernel: the arch's target and wave size; LDS tables and
    barriers; no atomics (each wave owns its LDS row); the count and scatter kernels have no
    loop at all (a lane's ROUNDS entries are loaded together, then ranked with ballots), and
    the scan's only loop that loads issues SCAN_BATCH loads per pass, so no loop waits on
    memory once per routed entry."""
    from aiter.flydsl_bridge import listing as isa

    env = compile_env(arch, rocm_path, tmp_path / "cache", dump=tmp_path / "dump")
    child = run_child(_ISA_CHILD, [], env)
    assert child.returncode == 0, child.stderr[-4000:]
    for kernel in KERNELS:
        listings = sorted((tmp_path / "dump").glob(f"{kernel}_kernel_*/*final_isa.s"))
        assert len(listings) == 1, (kernel, listings)
        text = listings[0].read_text()
        assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text
        assert f".wavefront_size: {WAVE_SIZE[arch]}" in text
        parsed = isa.parse_listing(text)
        mnemonics = [inst.mnemonic for inst in parsed.instructions]
        assert "s_endpgm" in mnemonics, kernel
        assert not [op for op in mnemonics if "atomic" in op], kernel
        assert any(op.startswith("ds_") for op in mnemonics), f"{kernel}: no LDS"
        assert any(op.startswith("s_barrier") for op in mnemonics), kernel
        found = isa.loops(parsed)
        if kernel != "moe_sorting_scan":
            assert found == [], f"{kernel}: loops at {[lp.label for lp in found]}"
            loads = sum(isa.vmem_kind(op) == "load" for op in mnemonics)
            assert loads >= ix.ROUNDS, (kernel, loads)
            continue
        for lp in found:
            loads = sum(isa.vmem_kind(i.mnemonic) == "load" for i in lp.body)
            assert loads in (0, ix.SCAN_BATCH) or lp.inner_loops, (lp.label, loads)
