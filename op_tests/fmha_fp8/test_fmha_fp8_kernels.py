"""Tests of the fp8 flash-attention FlyDSL kernels without a GPU: their index math, the forward
and split-KV combine kernels emulated on CPU from flash_attn_fp8_index.py (K and V staged
through LDS, the mask skipped where nothing is masked) against
torch.nn.functional.scaled_dot_product_attention, the key loop's LDS phases with a race check,
the launcher's argument checks, and compilation per arch with the key loop's listing."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
import torch

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.fmha_fp8.kernels import flash_attn as fa
from aiter.ops.fmha_fp8.kernels import flash_attn_index as ix
from aiter.ops.fmha_fp8.reference import NEG_INF, reference, rows_view
from aiter.ops.shared.mainloop_index import LDS_BYTES
from op_tests.compile_child import LIST_THEN_BUILD, compile_env, disassemble_or_skip, run_child
from op_tests.shared.mainloop_emulation import Lds, fast_first

FNUZ, FN = torch.float8_e4m3fnuz, torch.float8_e4m3fn


def _pick(cond, a, b):
    """What the kernels' `cond.select(a, b)` computes, on Python values."""
    return a if cond else b


def _where(cond, a, b):
    """What the kernels' `cond.select(a, b)` computes, on torch tensors."""
    return torch.where(torch.as_tensor(cond), torch.as_tensor(a), torch.as_tensor(b))


# --- pure index math ---------------------------------------------------------------------


def test_constants() -> None:
    assert fa.BLOCK_MS == ix.BLOCK_MS == (64, 128)
    assert fa.BLOCK_N == ix.BLOCK_N == 64
    assert fa.HEAD_DIMS == ix.HEAD_DIMS == (64, 96, 128, 160, 192, 224, 256)
    assert fa.MMA_FLAVOURS == ("mfma", "wmma")
    assert fa.FP8_DTYPES == (FNUZ, FN)
    assert fa.WORKSPACE_DTYPE is torch.float32
    assert fa.split_workspace_shapes(10, 4, 128, 3) == ((3, 10, 4, 128), (3, 10, 4, 2))
    # P <= 2**threshold must fit both fp8 flavours.
    assert 2**fa.MAX_RESCALE_THRESHOLD <= torch.finfo(FNUZ).max <= torch.finfo(FN).max
    for block_m in ix.BLOCK_MS:
        assert ix.waves_per_block(block_m) * ix.MMA_MN == block_m
        assert ix.block_threads(block_m, "mfma") <= 1024
    assert ix.V_LDS_STRIDE % 8 == 0 and ix.V_LDS_STRIDE >= ix.BLOCK_N
    assert ix.V_COPY_BYTES == ix.K_COPY_BYTES == ix.IDLE_SLOT_BYTES == 16
    for d in ix.HEAD_DIMS:
        assert ix.k_lds_stride(d) % 16 == 0 and d % ix.K_COPY_BYTES == 0
        assert d % ix.V_PIECE_COLS == 0
    assert ix.BLOCK_N % ix.V_PIECE_KEYS == 0
    assert ix.BLOCK_N % max(ix.MMA_K.values()) == 0


@pytest.mark.parametrize("batch", [1, 2, 5, 6])
def test_interleaved_batch_alternates_ends(batch: int) -> None:
    plain = [ix.interleaved_batch(s, batch, 0) for s in range(batch)]
    assert plain == list(range(batch))
    mixed = [ix.interleaved_batch(s, batch, 1) for s in range(batch)]
    assert sorted(mixed) == list(range(batch))
    for s in range(0, batch - 1, 2):
        assert mixed[s] == s // 2 and mixed[s + 1] == batch - 1 - s // 2


@pytest.mark.parametrize("interleave", [0, 1])
@pytest.mark.parametrize(
    ("batch", "hq", "q_blocks", "splits"), [(1, 1, 1, 1), (3, 2, 4, 1), (4, 8, 2, 3), (2, 3, 5, 7)]
)
def test_work_items_cover_the_grid_once(batch, hq, q_blocks, splits, interleave) -> None:
    grid = ix.grid_size(batch, hq, q_blocks, splits)
    items = [ix.work_item(wg, batch, hq, q_blocks, interleave) for wg in range(grid)]
    assert sorted(items) == list(
        itertools.product(range(batch), range(hq), range(q_blocks), range(splits))
    )
    # Consecutive work-groups walk the batch slots; the last query block starts first.
    for wg in range(0, grid - batch + 1, batch):
        run = items[wg : wg + batch]
        assert [b for b, _, _, _ in run] == [
            ix.interleaved_batch(s, batch, interleave) for s in range(batch)
        ]
        assert len({(h, qb, s) for _, h, qb, s in run}) == 1
    assert items[0][2] == q_blocks - 1


@pytest.mark.parametrize(("hq", "hkv"), [(8, 8), (8, 2), (8, 1), (12, 3)])
def test_gqa_heads(hq: int, hkv: int) -> None:
    heads = [ix.kv_head(h, hq, hkv) for h in range(hq)]
    assert heads == [h // (hq // hkv) for h in range(hq)]
    assert sorted(set(heads)) == list(range(hkv))
    # The reference repeats kv heads the same way.
    assert torch.arange(hkv).repeat_interleave(hq // hkv).tolist() == heads


@pytest.mark.parametrize("blocks", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("splits", [1, 2, 3, 7])
def test_split_ranges_cover_the_key_blocks_once(blocks: int, splits: int) -> None:
    seen = []
    for split in range(splits):
        begin, end = ix.split_range(split, blocks, splits)
        assert 0 <= begin <= end <= blocks
        seen.extend(range(begin, end))
    assert seen == list(range(blocks))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_m", ix.BLOCK_MS)
@pytest.mark.parametrize(("sq", "sk"), [(1, 1), (100, 100), (70, 200), (200, 70), (5, 0), (0, 9)])
def test_kv_end_is_the_last_visible_key(sq: int, sk: int, block_m: int, causal: bool) -> None:
    for q_block in range(ix.num_q_blocks(max(sq, 1), block_m) + 1):
        q0 = q_block * block_m
        rows = range(q0, min(q0 + block_m, sq))
        visible = [j for i in rows for j in range(sk) if ix.key_valid(j, i, sq, sk, causal)]
        want = max(visible) + 1 if visible else 0
        end = ix.kv_end(q0, block_m, sq, sk, causal, _pick)
        if rows:
            # Every visible key is read; a causal block may read masked keys up to its last row.
            assert end >= want and (end == want or not causal or want == 0)
            assert end <= sk
            if not causal:
                assert end == sk
        else:
            assert end == 0
        assert ix.kv_blocks(end) * ix.BLOCK_N >= end > (ix.kv_blocks(end) - 1) * ix.BLOCK_N or (
            end == 0 and ix.kv_blocks(end) == 0
        )


def test_bottom_right_causal_mask() -> None:
    # Sq = 3, Sk = 5: query 0 sees keys 0..2, query 2 sees all five.
    grid = [[ix.key_valid(j, i, 3, 5, True) for j in range(6)] for i in range(3)]
    assert grid == [
        [True, True, True, False, False, False],
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
    ]
    # Sq = 4, Sk = 2: the first two queries see no key.
    assert [sum(ix.key_valid(j, i, 4, 2, True) for j in range(2)) for i in range(4)] == [0, 0, 1, 2]
    assert [ix.key_valid(j, 0, 4, 2, False) for j in range(3)] == [True, True, False]


@pytest.mark.parametrize("mma", fa.MMA_FLAVOURS)
@pytest.mark.parametrize("block_m", ix.BLOCK_MS)
def test_lane_layout_of_scores_and_output(mma: str, block_m: int) -> None:
    """A wave's 16 queries: every lane's query is its column; the lanes of a query hold every
    key of the block once (their P bytes), the P@V steps take every key once with the V bytes
    of the same keys, the K rows loaded are the block's keys, and O^T's elements hold every
    value column of a query once."""
    wsz = ix.WAVE_SIZE[mma]
    rpl = ix.acc_rows_per_lane(wsz)
    positions = sorted(
        ix.query_pos(3, block_m, w, lane)
        for w in range(ix.waves_per_block(block_m))
        for lane in range(ix.MMA_MN)
    )
    assert positions == list(range(3 * block_m, 4 * block_m))
    for w in range(ix.waves_per_block(block_m)):
        assert {ix.query_pos(0, block_m, w, lane) for lane in range(wsz)} == {
            ix.query_pos(0, block_m, w, lane) for lane in range(ix.MMA_MN)
        }
    kv0 = 128
    per = ix.pv_tiles_per_step(mma)
    for col in range(ix.MMA_MN):
        lanes = [lane for lane in range(wsz) if lane % ix.MMA_MN == col]
        keys = [
            ix.acc_key(kv0, t, lane, e, wsz)
            for lane in lanes
            for t in range(ix.KEY_TILES)
            for e in range(rpl)
        ]
        assert sorted(keys) == list(range(kv0, kv0 + ix.BLOCK_N))
        # P@V step s: the lane's P bytes are tiles s * per ... (in order), rpl each; the V^T
        # operand reads the same keys from LDS at v_lds_offset(col, key - kv0).
        step_keys = [
            ix.acc_key(kv0, t, lane, e, wsz)
            for s in range(ix.pv_steps(mma))
            for lane in lanes
            for t in range(s * per, (s + 1) * per)
            for e in range(rpl)
        ]
        assert sorted(step_keys) == sorted(keys)
        for lane in lanes:
            for t in range(ix.KEY_TILES):
                first = ix.acc_key(0, t, lane, 0, wsz)
                assert [ix.v_lds_offset(5, first) + e for e in range(rpl)] == [
                    ix.v_lds_offset(5, ix.acc_key(0, t, lane, e, wsz)) for e in range(rpl)
                ]
        value_cols = [
            ix.acc_value_col(dt, lane, e, wsz) for lane in lanes for dt in range(2)
            for e in range(rpl)
        ]  # fmt: skip
        assert sorted(value_cols) == list(range(2 * ix.MMA_MN))
    assert sorted(ix.operand_key(kv0, t, lane) for t in range(ix.KEY_TILES) for lane in
                  range(ix.MMA_MN)) == list(range(kv0, kv0 + ix.BLOCK_N))  # fmt: skip
    assert {ix.operand_key(kv0, 1, lane) for lane in range(wsz)} == {
        ix.operand_key(kv0, 1, lane) for lane in range(ix.MMA_MN)
    }
    assert [ix.operand_value_col(2, lane) for lane in range(ix.MMA_MN)] == list(range(32, 48))


@pytest.mark.parametrize("mma", fa.MMA_FLAVOURS)
@pytest.mark.parametrize("head_dim", ix.HEAD_DIMS)
def test_head_dim_runs_cover_a_row_once(mma: str, head_dim: int) -> None:
    """The lanes of one Q (or K) row load every head-dim byte once; the WMMA half chunk's
    16-byte runs are padded to 32 bytes with zeros, on Q and K alike."""
    wsz = ix.WAVE_SIZE[mma]
    covered = []
    for lane in range(0, wsz, ix.MMA_MN):
        for c in range(ix.full_chunks(head_dim)):
            start = ix.chunk_offset(c, lane, wsz, False)
            covered.extend(range(start, start + ix.chunk_run(wsz, False)))
        if ix.has_half_chunk(head_dim):
            start = ix.chunk_offset(ix.full_chunks(head_dim), lane, wsz, True)
            covered.extend(range(start, start + ix.chunk_run(wsz, True)))
    assert sorted(covered) == list(range(head_dim))
    # A full run is whole MMA operands (8 bytes per MFMA lane, 32 per WMMA lane); a half
    # run is one MFMA operand or half a WMMA operand (padded).
    operand = ix.MMA_K[mma] * ix.MMA_MN // wsz
    assert ix.chunk_run(wsz, False) == (ix.D_CHUNK // ix.MMA_K[mma]) * operand
    assert ix.chunk_run(wsz, True) == (operand if mma == "mfma" else operand // 2)


def _k_copies(step: int, threads: int, d: int):
    """Per thread of a K copy step: (key, first head-dim byte, real) as Python lists."""
    return [ix.k_copy_piece(step, tid, threads, d, _pick) for tid in range(threads)]


def _v_copies(step: int, threads: int, dv: int):
    return [ix.v_copy_piece(step, tid, threads, dv, _pick) for tid in range(threads)]


@pytest.mark.parametrize("mma", fa.MMA_FLAVOURS)
@pytest.mark.parametrize("block_m", ix.BLOCK_MS)
@pytest.mark.parametrize("dim", ix.HEAD_DIMS)
def test_k_and_v_staging_cover_the_block_once(mma: str, block_m: int, dim: int) -> None:
    """The threads' real K pieces cover the K tile's bytes once and their V pieces the V tile's
    bytes once (inside their LDS regions); the rest write only their wave's idle slot."""
    threads = ix.block_threads(block_m, mma)
    waves = ix.waves_per_block(block_m)
    k_base, v_base, idle_base, total = ix.lds_layout(dim, dim, waves)
    k_cells = torch.zeros(ix.BLOCK_N, dim, dtype=torch.int32)
    v_cells = torch.zeros(ix.BLOCK_N, dim, dtype=torch.int32)
    region = torch.zeros(total, dtype=torch.int32)  # 1 K, 2 V, 3 idle
    for step in range(ix.k_copy_steps(dim, threads)):
        for tid, (key, col, real) in enumerate(_k_copies(step, threads, dim)):
            if not real:
                slot = ix.idle_slot(idle_base, tid // ix.WAVE_SIZE[mma])
                region[slot : slot + ix.K_COPY_BYTES] = 3
                continue
            k_cells[key, col : col + ix.K_COPY_BYTES] += 1
            off = k_base + ix.k_lds_offset(key, col, dim)
            assert ix.k_lds_offset(key, col, dim) % ix.K_COPY_BYTES == 0
            region[off : off + ix.K_COPY_BYTES] = 1
    for step in range(ix.v_copy_steps(dim, threads)):
        for key0, col, real in _v_copies(step, threads, dim):
            if not real:
                continue
            assert key0 % ix.V_PIECE_KEYS == 0 and col % ix.V_PIECE_COLS == 0
            v_cells[key0 : key0 + ix.V_PIECE_KEYS, col : col + ix.V_PIECE_COLS] += 1
            for c in range(ix.V_PIECE_COLS):
                off = v_base + ix.v_lds_offset(col + c, key0)
                assert off % 4 == 0  # one 4-byte LDS word
                region[off : off + ix.V_PIECE_KEYS] = 2
    assert torch.equal(k_cells, torch.ones_like(k_cells))
    assert torch.equal(v_cells, torch.ones_like(v_cells))
    assert int((region == 1).sum()) == ix.BLOCK_N * dim == int((region == 2).sum())
    assert set(region[idle_base:].tolist()) <= {0, 3} and int(region[:v_base].eq(2).sum()) == 0
    assert int(region[v_base:idle_base].eq(1).sum()) == 0


def test_idle_loads_fall_outside_every_block_buffer() -> None:
    """A thread without a piece loads at IDLE_LOAD_OFFSET, past the buffer of any block the
    launcher accepts (BLOCK_N rows of Hkv x D bytes, Hkv below fa.MAX_KV_HEADS)."""
    for d in ix.HEAD_DIMS:
        assert ix.BLOCK_N * (fa.MAX_KV_HEADS - 1) * d <= ix.IDLE_LOAD_OFFSET
        assert ix.kv_piece_offset(3, 16, 1, 2, d, False, _pick) == ix.IDLE_LOAD_OFFSET
        assert ix.kv_piece_offset(3, 16, 1, 2, d, True, _pick) == (3 * 2 + 1) * d + 16
    assert ix.IDLE_LOAD_OFFSET + ix.K_COPY_BYTES < 2**31


def test_v_transpose_moves_each_byte_to_its_column() -> None:
    src = [key * ix.V_PIECE_COLS + col for key in range(4) for col in range(4)]
    moved = [src[ix.v_transpose_source(i)] for i in range(ix.V_COPY_BYTES)]
    # Word c holds column c of keys 0..3.
    assert moved == [key * ix.V_PIECE_COLS + c for c in range(4) for key in range(4)]


@pytest.mark.parametrize("arch", sorted(LDS_BYTES))
def test_lds_fits_every_head_dim(arch: str) -> None:
    """K and V tiles plus the idle slots fit the arch's LDS for every head dim pair."""
    waves = max(ix.waves_per_block(b) for b in ix.BLOCK_MS)
    worst = ix.lds_layout(max(ix.HEAD_DIMS), max(ix.HEAD_DIMS), waves)[3]
    assert worst <= LDS_BYTES[arch], (arch, worst)


def test_k_tile_reads_are_bank_conflict_free() -> None:
    """The 8 lanes a 16-byte LDS read serves per cycle read 8 consecutive keys at one head-dim
    offset: the 16-byte row padding puts them in 8 distinct 4-bank groups for every D."""
    for d in ix.HEAD_DIMS:
        groups = {ix.k_lds_offset(key, 0, d) // 16 % 8 for key in range(8)}
        assert len(groups) == 8, d


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("sq", "sk"), [(100, 100), (70, 200), (200, 70), (64, 64), (1, 300)])
def test_block_mask_skipped_only_where_nothing_is_masked(sq, sk, causal) -> None:
    """A block that skips the mask holds no key any query of the work-group must not see; the
    blocks crossing the diagonal and the tail block evaluate it; the skipping blocks are the
    leading unmasked_blocks ones."""
    for block_m in ix.BLOCK_MS:
        for q_block in range(ix.num_q_blocks(sq, block_m)):
            q0 = q_block * block_m
            blocks = ix.kv_blocks(ix.kv_end(q0, block_m, sq, sk, causal, _pick))
            for kb in range(blocks):
                kv0 = kb * ix.BLOCK_N
                pairs = [ix.key_valid(j, i, sq, sk, causal) for i in range(q0, q0 + block_m)
                         for j in range(kv0, kv0 + ix.BLOCK_N)]  # fmt: skip
                need = ix.block_needs_mask(kv0, q0, sq, sk, causal)
                # The kernel's unmasked loop runs exactly the blocks that need no mask.
                assert need == (kb >= ix.unmasked_blocks(q0, sq, sk, causal, _pick)), (q0, kb)
                if not need:
                    assert all(pairs), (q0, kv0)
                elif kv0 + ix.BLOCK_N <= sk:
                    # Without a tail, only a causal block on the diagonal masks.
                    assert causal and kv0 + ix.BLOCK_N - 1 > ix.key_limit(q0, sq, sk)
    assert not ix.block_needs_mask(0, 64, 128, 128, True)
    assert ix.block_needs_mask(64, 64, 128, 128, True)
    assert ix.block_needs_mask(64, 0, 128, 100, False)


def _phase_writes(lds: Lds, mma: str, block_m: int, d: int, dv: int) -> None:
    """Every wave's LDS writes of one key block's K and V copies, instruction by instruction."""
    wsz = ix.WAVE_SIZE[mma]
    threads = ix.block_threads(block_m, mma)
    k_base, v_base, idle_base, _ = ix.lds_layout(d, dv, threads // wsz)
    for step in range(ix.k_copy_steps(d, threads)):
        copies = _k_copies(step, threads, d)
        for w in range(threads // wsz):
            lane_bytes = []
            for tid in range(w * wsz, (w + 1) * wsz):
                key, col, real = copies[tid]
                idle = ix.idle_slot(idle_base, w)
                lane_bytes.append(k_base + ix.k_lds_offset(key, col, d) if real else idle)
            lds.instruction("k_write", w, lane_bytes, ix.K_COPY_BYTES)
    for step in range(ix.v_copy_steps(dv, threads)):
        copies = _v_copies(step, threads, dv)
        for w in range(threads // wsz):
            for c in range(ix.V_PIECE_COLS):
                lane_bytes = []
                for tid in range(w * wsz, (w + 1) * wsz):
                    key0, col, real = copies[tid]
                    off = v_base + ix.v_lds_offset(col + c, key0)
                    lane_bytes.append(off if real else ix.idle_slot(idle_base, w))
                lds.instruction("v_write", w, lane_bytes, ix.V_PIECE_KEYS)


def _phase_reads(lds: Lds, mma: str, block_m: int, d: int, dv: int) -> None:
    """Every wave's K operand reads (S^T = K Q^T) and V^T operand reads (P@V) of one block."""
    wsz = ix.WAVE_SIZE[mma]
    rpl = ix.acc_rows_per_lane(wsz)
    k_base, v_base, _, _ = ix.lds_layout(d, dv, ix.waves_per_block(block_m))
    chunks = ix.full_chunks(d) + ix.has_half_chunk(d)
    for w in range(ix.waves_per_block(block_m)):
        for t in range(ix.KEY_TILES):
            for c in range(chunks):
                half = c == ix.full_chunks(d)
                run = ix.chunk_run(wsz, half)
                for part in range(0, run, 16):  # a 32-byte run is two 16-byte reads
                    lane_bytes = [
                        k_base + part + ix.k_lds_offset(ix.operand_key(0, t, lane),
                                                        ix.chunk_offset(c, lane, wsz, half), d)
                        for lane in range(wsz)
                    ]  # fmt: skip
                    lds.instruction("k_read", w, lane_bytes, min(run, 16))
        for dt in range(dv // ix.MMA_MN):
            for t in range(ix.KEY_TILES):
                lane_bytes = [
                    v_base + ix.v_lds_offset(ix.operand_value_col(dt, lane),
                                             ix.acc_key(0, t, lane, 0, wsz))
                    for lane in range(wsz)
                ]  # fmt: skip
                lds.instruction("v_read", w, lane_bytes, rpl)


@pytest.mark.parametrize(
    ("mma", "block_m", "d", "dv"),
    fast_first([("mfma", 64, 128, 128), ("mfma", 128, 192, 128), ("mfma", 64, 96, 160),
                ("wmma", 64, 256, 64), ("wmma", 128, 160, 96)], {3}),
)  # fmt: skip
def test_lds_phases_have_no_races(mma: str, block_m: int, d: int, dv: int) -> None:
    """The key loop's LDS phases, two blocks: barrier, every wave writes its K and V copies,
    barrier, every wave reads its K and V^T operands. No byte is written by one wave and read
    or written by another in one phase; the 16-byte K operand reads and the V writes and reads
    have no bank conflicts (the 8-byte reads of a K half chunk may; the bank model's cycles per
    kind are printed). Without
    the barrier between the writes and the reads the check finds the race."""
    k_base, v_base, idle_base, total = ix.lds_layout(d, dv, ix.waves_per_block(block_m))
    lds = Lds(total)
    for _ in range(2):
        lds.barrier()
        _phase_writes(lds, mma, block_m, d, dv)
        lds.barrier()
        _phase_reads(lds, mma, block_m, d, dv)
    lds.barrier()
    assert lds.races == []
    if not ix.has_half_chunk(d):
        assert lds.stats["k_read"].extra_cycles == 0
    assert lds.stats["v_write"].extra_cycles == 0 and lds.stats["v_read"].extra_cycles == 0
    print({kind: (st.instructions, st.cycles, st.ideal_cycles) for kind, st in lds.stats.items()})
    racy = Lds(total)
    _phase_writes(racy, mma, block_m, d, dv)
    _phase_reads(racy, mma, block_m, d, dv)
    racy.barrier()
    assert racy.races


def test_offsets_address_the_layouts() -> None:
    rows, hq, dv, splits = 7, 3, 32, 4
    ws = torch.arange(splits * rows * hq * dv).reshape(splits, rows, hq, dv)
    for s, r, h, c in ((0, 0, 0, 0), (3, 6, 2, 31), (1, 4, 1, 17)):
        assert int(ws.view(-1)[ix.ws_out_offset(s, r, h, c, rows, hq, dv)]) == int(ws[s, r, h, c])
    pairs = torch.arange(splits * rows * hq * 2).reshape(splits, rows, hq, 2)
    assert int(pairs.view(-1)[ix.ws_lse_offset(2, 5, 1, rows, hq)]) == int(pairs[2, 5, 1, 0])
    x = torch.arange(2 * 5 * 3 * 8).reshape(2, 5, 3, 8)
    assert int(x.view(-1)[ix.head_offset(1 * 5 + 2, 1, 3, 8)]) == int(x[1, 2, 1, 0])
    lse = torch.arange(2 * 3 * 5).reshape(2, 3, 5)
    b, pos = ix.lse_position(1 * 5 + 4, 5)
    assert int(lse.view(-1)[ix.lse_offset(b, 2, pos, 3, 5)]) == int(lse[1, 2, 4])
    varlen_lse = torch.arange(3 * 11).reshape(3, 11)
    assert ix.lse_position(9, 11) == (0, 9)
    assert int(varlen_lse.view(-1)[ix.lse_offset(0, 2, 9, 3, 11)]) == int(varlen_lse[2, 9])
    seen = set()
    for bid in range(ix.combine_grid(rows, hq, dv)):
        for tid in range(ix.COMBINE_BLOCK):
            idx, r, h, c = ix.combine_element(bid, tid, hq, dv)
            if idx < rows * hq * dv:
                assert idx == ix.head_offset(r, h, hq, dv) + c
                seen.add(idx)
    assert seen == set(range(rows * hq * dv))


def test_online_softmax_rules() -> None:
    assert not ix.needs_rescale(NEG_INF, NEG_INF, 0.0)
    assert ix.needs_rescale(NEG_INF, -50.0, 7.0)
    assert ix.needs_rescale(1.0, 1.5, 0.0)
    assert not ix.needs_rescale(1.0, 1.5, 1.0)
    assert not ix.needs_rescale(1.0, 1.0, 0.0)
    assert ix.needs_rescale(1.0, 8.0, 6.0)
    assert ix.exp_base(NEG_INF, NEG_INF, _pick) == 0.0
    assert ix.exp_base(-3.5, NEG_INF, _pick) == -3.5
    assert ix.lse_from(NEG_INF, 0.0, NEG_INF, math.log2, _pick) == NEG_INF
    assert math.isclose(
        ix.lse_from(3.0, 6.0, NEG_INF, math.log2, _pick), (3.0 + math.log2(6.0)) * math.log(2)
    )


# --- the kernels' arithmetic, emulated on CPU --------------------------------------------


def _buffer_gather(flat, base, nbytes, offsets, count):
    """What buffer loads of `count` fp8 bytes at `offsets` from element `base` return: zeros
    for a load past the buffer's `nbytes` (the hardware's out-of-range zeros)."""
    inside = offsets + count <= nbytes
    idx = torch.where(inside, offsets, 0)[:, None] + torch.arange(count)
    return torch.where(inside[:, None], flat[(base + idx).clamp(max=flat.numel() - 1)], 0.0)


def _stage_block(kf, vf, k_start, kv0, sk, live, hk, d, dv, threads, wsz):
    """Every thread's K and V copies of the key block at kv0 into a work-group's LDS (one value
    per byte, NaN where nothing was written), as the kernel's buffer loads and LDS writes do."""
    waves = threads // wsz
    hkv = kf.shape[1]
    k_base, v_base, idle_base, total = ix.lds_layout(d, dv, waves)
    lds = torch.full((total,), float("nan"))
    tid = torch.arange(threads)
    idle = ix.idle_slot(idle_base, tid // wsz)
    rows = ix.kv_block_rows(kv0, sk, live, _pick)
    k_flat, v_flat = kf.reshape(-1), vf.reshape(-1)
    for step in range(ix.k_copy_steps(d, threads)):
        key, col, real = ix.k_copy_piece(step, tid, threads, d, _where)
        values = _buffer_gather(
            k_flat,
            (k_start + kv0) * hkv * d,
            rows * hkv * d,
            ix.kv_piece_offset(key, col, hk, hkv, d, real, _where),
            ix.K_COPY_BYTES,
        )
        off = torch.where(real, k_base + ix.k_lds_offset(key, col, d), idle)
        lds[off[:, None] + torch.arange(ix.K_COPY_BYTES)] = values
    order = torch.tensor([ix.v_transpose_source(i) for i in range(ix.V_COPY_BYTES)])
    for step in range(ix.v_copy_steps(dv, threads)):
        key0, col, real = ix.v_copy_piece(step, tid, threads, dv, _where)
        offsets = [ix.kv_piece_offset(key0 + j, col, hk, hkv, dv, real, _where)
                   for j in range(ix.V_PIECE_KEYS)]  # fmt: skip
        loaded = torch.cat(
            [_buffer_gather(v_flat, (k_start + kv0) * hkv * dv, rows * hkv * dv, off,
                            ix.V_PIECE_COLS) for off in offsets],
            dim=1,
        )  # fmt: skip
        moved = loaded[:, order]
        for c in range(ix.V_PIECE_COLS):
            off = torch.where(real, v_base + ix.v_lds_offset(col + c, key0), idle)
            lds[off[:, None] + torch.arange(ix.V_PIECE_KEYS)] = moved[:, 4 * c : 4 * c + 4]
    return lds


_READS: dict = {}


def _operand_reads(mma: str, d: int, dv: int, waves: int):
    """The LDS bytes a wave's lanes read as K operands ((key, head-dim byte) -> byte) and as V^T
    operands ((key, value column) -> byte), from the index functions; the same for every
    wave."""
    if (mma, d, dv) not in _READS:
        wsz = ix.WAVE_SIZE[mma]
        k_base, v_base, _, _ = ix.lds_layout(d, dv, waves)
        k_map, v_map = {}, {}
        chunks = ix.full_chunks(d) + ix.has_half_chunk(d)
        for lane in range(wsz):
            for t in range(ix.KEY_TILES):
                key = ix.operand_key(0, t, lane)
                for c in range(chunks):
                    half = c == ix.full_chunks(d)
                    start = ix.chunk_offset(c, lane, wsz, half)
                    for i in range(ix.chunk_run(wsz, half)):
                        k_map[(key, start + i)] = k_base + ix.k_lds_offset(key, start, d) + i
            for dt in range(dv // ix.MMA_MN):
                col = ix.operand_value_col(dt, lane)
                for t in range(ix.KEY_TILES):
                    first = ix.acc_key(0, t, lane, 0, wsz)
                    for e in range(ix.acc_rows_per_lane(wsz)):
                        v_map[(first + e, col)] = v_base + ix.v_lds_offset(col, first) + e
        assert len(k_map) == ix.BLOCK_N * d and len(v_map) == ix.BLOCK_N * dv
        index = {}
        for name, table in (("k", k_map), ("v", v_map)):
            keys = torch.tensor([kk for kk, _ in table])
            cols = torch.tensor([cc for _, cc in table])
            index[name] = (keys, cols, torch.tensor(list(table.values())))
        _READS[(mma, d, dv)] = index
    return _READS[(mma, d, dv)]


def _read_tiles(lds, mma, d, dv, waves):
    """K [BLOCK_N, D] and V [BLOCK_N, Dv] of the block as the lanes' LDS operand reads see
    them."""
    reads = _operand_reads(mma, d, dv, waves)
    tiles = []
    for name, cols in (("k", d), ("v", dv)):
        keys, idx, byte = reads[name]
        tile = torch.full((ix.BLOCK_N, cols), float("nan"))
        tile[keys, idx] = lds[byte]
        tiles.append(tile)
    return tiles


def emulate(q, k, v, descales, softmax_scale, causal, *, block_m, threshold, num_splits,
            interleave, mma, cu_q=None, cu_k=None, max_seqlen_q=None, round_p=True):  # fmt: skip
    """The forward kernel work-group by work-group and key block by key block, then the
    combine, from flash_attn_fp8_index only. Returns the fp32 values the kernels cast to bf16
    (out [rows, Hq, Dv]), lse in its launch layout, and counts of (head, query row, key row)
    visits, of out/lse writes per (row, head), of workspace writes per (split, row, head), and
    of the lazy rescale events."""
    varlen = cu_q is not None
    qf, kf, vf = (rows_view(x, varlen) for x in (q, k, v))
    rows, hq, _ = qf.shape
    hkv, dv = kf.shape[1], vf.shape[2]
    if varlen:
        batch, seqlen_q, seqlen_k = len(cu_q) - 1, max_seqlen_q, None
        lse_len = rows
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        lse_len = seqlen_q
    wsz = ix.WAVE_SIZE[mma]
    rpl = ix.acc_rows_per_lane(wsz)
    qd, kd, vd = (torch.tensor(d, dtype=torch.float32) for d in descales)
    scale = qd * kd * torch.tensor(softmax_scale, dtype=torch.float32) * ix.LOG2E
    q_blocks = ix.num_q_blocks(seqlen_q, block_m)
    out = torch.full((rows * hq * dv,), float("nan"))
    lse = torch.full((rows * hq,), float("nan"))
    ws_out = torch.full((num_splits * rows * hq * dv,), float("nan"))
    ws_lse = torch.full((num_splits * rows * hq * 2,), float("nan"))
    visits = torch.zeros(hq, rows, kf.shape[0], dtype=torch.int32)
    writes = torch.zeros(rows, hq, dtype=torch.int32)
    ws_writes = torch.zeros(num_splits, rows, hq, dtype=torch.int32)
    stats = {"rescales": 0, "lazy": 0, "p_max": 0.0, "masked": 0, "unmasked": 0}
    threads = ix.block_threads(block_m, mma)
    cols = torch.arange(dv)
    waves = torch.arange(ix.waves_per_block(block_m))[:, None]
    lanes = torch.arange(ix.MMA_MN)[None, :]
    for wg in range(ix.grid_size(batch, hq, q_blocks, num_splits)):
        b, h, q_block, split = ix.work_item(wg, batch, hq, q_blocks, int(interleave))
        if varlen:
            q_start, sq, k_start, sk = ix.varlen_bounds(cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1])
        else:
            q_start, sq, k_start, sk = ix.dense_bounds(b, seqlen_q, seqlen_k)
        hk = ix.kv_head(h, hq, hkv)
        pos = ix.query_pos(q_block, block_m, waves, lanes).reshape(-1)
        row_ok = pos < sq
        q_rows = ix.safe_row(row_ok, q_start + pos, _where)
        assert int(q_rows.min()) >= 0 and int(q_rows.max()) < rows
        q_tile = qf[q_rows, h]
        blocks = ix.kv_blocks(ix.kv_end(q_block * block_m, block_m, sq, sk, causal, _pick))
        kb_range = ix.split_range(split, blocks, num_splits) if num_splits > 1 else (0, blocks)
        m_used = torch.full((block_m,), NEG_INF)
        l_sum = torch.zeros(block_m)
        o = torch.zeros(block_m, dv)
        # The first block is loaded before the loop, each next one during the current block.
        kb_begin, kb_end = kb_range
        staged = _stage_block(kf, vf, k_start, kb_begin * ix.BLOCK_N, sk, kb_begin < kb_end, hk,
                              kf.shape[2], dv, threads, wsz)  # fmt: skip
        for kb in range(*kb_range):
            kv0 = kb * ix.BLOCK_N
            lds = staged
            staged = _stage_block(kf, vf, k_start, kv0 + ix.BLOCK_N, sk, kb + 1 < kb_end, hk,
                                  kf.shape[2], dv, threads, wsz)  # fmt: skip
            k_tile, v_tile = _read_tiles(lds, mma, kf.shape[2], dv, threads // wsz)
            keys = torch.tensor(
                [
                    ix.acc_key(kv0, t, g * ix.MMA_MN, e, wsz)
                    for t in range(ix.KEY_TILES)
                    for g in range(wsz // ix.MMA_MN)
                    for e in range(rpl)
                ]
            )
            k_rows = k_start + ix.clamp_index(keys, sk, _where)
            assert int(k_rows.min()) >= 0 and int(k_rows.max()) < kf.shape[0]
            assert keys.tolist() == list(range(kv0, kv0 + ix.BLOCK_N))
            # The staged tiles hold the block's keys, zeros past the sequence end.
            inside = (keys < sk)[:, None]
            assert torch.equal(k_tile, torch.where(inside, kf[k_rows, hk], 0.0))
            assert torch.equal(v_tile, torch.where(inside, vf[k_rows, hk], 0.0))
            acc = q_tile @ k_tile.T
            valid = ix.key_valid(keys[None, :], pos[:, None], sq, sk, causal)
            if kb >= ix.unmasked_blocks(q_block * block_m, sq, sk, causal, _pick):
                scores = torch.where(valid, acc * scale, NEG_INF)
                stats["masked"] += 1
            else:
                # Rows past the sequence may differ; they are never stored.
                assert bool((valid | ~row_ok[:, None]).all())
                scores = acc * scale
                stats["unmasked"] += 1
            m_candidate = torch.maximum(m_used, scores.max(dim=1).values)
            rescale = ix.needs_rescale(m_used, m_candidate, threshold)
            stats["rescales"] += int(rescale.sum())
            stats["lazy"] += int(((m_candidate > m_used) & ~rescale).sum())
            factor = torch.exp2(m_used - m_candidate)
            o = torch.where(rescale[:, None], o * factor[:, None], o)
            l_sum = torch.where(rescale, l_sum * factor, l_sum)
            m_used = torch.where(rescale, m_candidate, m_used)
            p = torch.exp2(scores - ix.exp_base(m_used, NEG_INF, _where)[:, None])
            stats["p_max"] = max(stats["p_max"], float(p.max()))
            l_sum = l_sum + p.sum(dim=1)
            if round_p:
                p = p.to(q.dtype).float()
            o = o + p @ v_tile
            seen = valid & row_ok[:, None]
            r_idx, k_idx = seen.nonzero(as_tuple=True)
            visits[h, (q_start + pos)[r_idx], k_rows[k_idx]] += 1
        out_rows = q_start + pos
        if num_splits == 1:
            inv = torch.where(l_sum > 0, vd / torch.where(l_sum > 0, l_sum, 1.0), 0.0)
            values = o * inv[:, None]
            offs = ix.head_offset(out_rows[:, None], h, hq, dv) + cols[None, :]
            out[offs[row_ok]] = values[row_ok]
            writes[out_rows[row_ok], h] += 1
            value = ix.lse_from(m_used, l_sum, NEG_INF, torch.log2, _where)
            if varlen:
                offs = ix.lse_offset(0, h, out_rows, hq, rows)
            else:
                offs = ix.lse_offset(b, h, pos, hq, seqlen_q)
            lse[offs[row_ok]] = value[row_ok]
        else:
            offs = ix.ws_out_offset(split, out_rows[:, None], h, cols[None, :], rows, hq, dv)
            ws_out[offs[row_ok]] = o[row_ok]
            offs = ix.ws_lse_offset(split, out_rows, h, rows, hq)
            ws_lse[offs[row_ok]] = m_used[row_ok]
            ws_lse[offs[row_ok] + 1] = l_sum[row_ok]
            ws_writes[split, out_rows[row_ok], h] += 1
    if num_splits > 1:
        _emulate_combine(ws_out, ws_lse, vd, out, lse, writes, rows, hq, dv, num_splits, lse_len)
    return {
        "out": out.view(rows, hq, dv),
        "lse": lse,
        "visits": visits,
        "writes": writes,
        "ws_writes": ws_writes,
        "stats": stats,
    }


def _emulate_combine(ws_out, ws_lse, vd, out, lse, writes, rows, hq, dv, splits, lse_len):
    """The combine kernel, all threads at once."""
    bid = torch.arange(ix.combine_grid(rows, hq, dv))[:, None]
    tid = torch.arange(ix.COMBINE_BLOCK)[None, :]
    idx, row, head, col = (x.reshape(-1) for x in ix.combine_element(bid, tid, hq, dv))
    live = idx < rows * hq * dv
    idx, row, head, col = idx[live], row[live], head[live], col[live]
    m_max = torch.full(idx.shape, NEG_INF)
    for s in range(splits):
        m_max = torch.maximum(m_max, ws_lse[ix.ws_lse_offset(s, row, head, rows, hq)])
    base = ix.exp_base(m_max, NEG_INF, _where)
    acc = torch.zeros(idx.shape)
    den = torch.zeros(idx.shape)
    for s in range(splits):
        off = ix.ws_lse_offset(s, row, head, rows, hq)
        w = torch.exp2(ws_lse[off] - base)
        acc = acc + w * ws_out[ix.ws_out_offset(s, row, head, col, rows, hq, dv)]
        den = den + w * ws_lse[off + 1]
    out[idx] = torch.where(den > 0, acc * (vd / torch.where(den > 0, den, 1.0)), 0.0)
    first = col == 0
    writes.index_put_((row[first], head[first]), torch.ones(int(first.sum()), dtype=torch.int32),
                      accumulate=True)  # fmt: skip
    batch, pos = ix.lse_position(row[first], lse_len)
    value = ix.lse_from(m_max[first], den[first], NEG_INF, torch.log2, _where)
    lse[ix.lse_offset(batch, head[first], pos, hq, lse_len)] = value


def _make_inputs(case: dict, seed: int):
    """fp8 q, k, v of a case (dense or varlen), descales, and the varlen arguments."""
    gen = torch.Generator().manual_seed(seed)
    dtype, d, dv, hq, hkv = case["dtype"], case["d"], case["dv"], case["hq"], case["hkv"]
    if "q_lens" in case:
        cu_q = [0, *itertools.accumulate(case["q_lens"])]
        cu_k = [0, *itertools.accumulate(case["k_lens"])]
        q_lead, k_lead = (cu_q[-1],), (cu_k[-1],)
        extra = dict(cu_q=cu_q, cu_k=cu_k, max_seqlen_q=max(case["q_lens"]) + case.get("pad", 0))
    else:
        q_lead, k_lead = (case["b"], case["sq"]), (case["b"], case["sk"])
        extra = {}

    def rand(*shape, spread=1.0):
        return (torch.randn(shape, generator=gen) * spread).to(dtype)

    q = rand(*q_lead, hq, d, spread=case.get("spread", 1.0))
    k = rand(*k_lead, hkv, d)
    if case.get("growing"):
        # Keys grow along the sequence, so a row's max keeps growing over the key blocks.
        ramp = torch.linspace(0.3, 2.0, k.shape[-3]).view(-1, 1, 1)
        k = (k.float() * ramp).to(dtype)
    v = rand(*k_lead, hkv, dv)
    return q, k, v, case.get("descales", (0.5, 0.25, 2.0)), extra


_BASE = dict(dtype=FNUZ, d=128, dv=128, hq=4, hkv=4, causal=True, block_m=64, threshold=6.0,
             splits=1, interleave=False, mma="mfma")  # fmt: skip
CASES = [
    dict(_BASE, b=2, sq=100, sk=100),
    dict(_BASE, b=2, sq=70, sk=150, causal=False, interleave=True, splits=2, dtype=FN),
    dict(_BASE, b=3, sq=150, sk=90, hq=8, hkv=2, block_m=128, splits=3, interleave=True),
    dict(_BASE, b=1, sq=64, sk=300, hq=8, hkv=1, d=192, splits=7, mma="wmma", dtype=FN),
    dict(_BASE, b=2, sq=40, sk=200, d=64, causal=False, threshold=0.0, splits=3),
    dict(_BASE, b=2, sq=130, sk=130, d=192, dv=128, block_m=128, hq=8, hkv=2, threshold=7.0),
    dict(_BASE, b=1, sq=200, sk=260, hq=2, hkv=2, growing=True, spread=2.0, splits=2),
    dict(_BASE, b=1, sq=200, sk=260, hq=2, hkv=2, growing=True, spread=2.0, threshold=0.0),
    dict(_BASE, q_lens=[5, 0, 70, 33, 130], k_lens=[9, 4, 0, 150, 64], hq=8, hkv=2, pad=7),
    dict(_BASE, q_lens=[1, 64, 65, 0], k_lens=[200, 64, 3, 0], causal=False, splits=3,
         interleave=True, block_m=128, d=96, dv=160, mma="wmma", dtype=FN),  # fmt: skip
    dict(_BASE, q_lens=[100, 17, 3], k_lens=[90, 300, 3], hq=4, hkv=1, splits=7, d=256, dv=64,
         threshold=0.0),  # fmt: skip
]


def _run_case(case: dict, seed: int, round_p: bool):
    q, k, v, descales, extra = _make_inputs(case, seed)
    scale = 1.0 / math.sqrt(case["d"])
    got = emulate(
        q, k, v, descales, scale, case["causal"], block_m=case["block_m"],
        threshold=case["threshold"], num_splits=case["splits"], interleave=case["interleave"],
        mma=case["mma"], round_p=round_p, **extra,
    )  # fmt: skip
    want = reference(q, k, v, descales, scale, case["causal"], extra.get("cu_q"), extra.get("cu_k"))
    return got, want, extra


def _lse_as_heads_rows(lse: torch.Tensor, case: dict, rows: int, hq: int) -> torch.Tensor:
    """Emulated lse (dense [B, Hq, Sq] or varlen [Hq, Tq]) as [Hq, rows]."""
    if "q_lens" in case:
        return lse.view(hq, rows)
    return lse.view(case["b"], hq, case["sq"]).transpose(0, 1).reshape(hq, rows)


# The inner loop keeps a case of each kind (causal, split and interleaved, a growing max,
# varlen on wmma); the others run in `make test`.
@pytest.mark.parametrize(
    "case", fast_first(CASES, {0, 1, 6, 9}, [str(i) for i in range(len(CASES))])
)
def test_emulation_matches_sdpa(case: dict) -> None:
    """With fp32 P the emulated kernels equal SDPA up to fp32 rounding; with P rounded to fp8
    as the kernel does, up to fp8 rounding of the probabilities. lse never sees the rounding."""
    (exact, (ref_out, ref_lse, visible), _), rounded = (
        _run_case(case, 1, round_p=False),
        _run_case(case, 1, round_p=True)[0],
    )
    rows, hq, _ = ref_out.shape
    torch.testing.assert_close(exact["out"], ref_out, rtol=1e-4, atol=1e-5)
    for got in (exact, rounded):
        lse = _lse_as_heads_rows(got["lse"], case, rows, hq)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-4)
    # fp8 P: each probability has a relative error of at most 2**-4 (3 mantissa bits) and the
    # errors partly cancel over the keys; the output moves by a fraction of max |v|.
    err = (rounded["out"] - ref_out).abs()
    v_max = float(ref_out.abs().max()) + 1e-6
    assert float(err.max()) <= 0.08 * v_max, float(err.max())
    assert float(err.mean()) <= 0.01 * v_max, float(err.mean())
    # bf16 is what the kernels store.
    assert torch.isfinite(rounded["out"].to(torch.bfloat16).float()).all()
    # Every visible (query row, key) pair once per head, nothing else; every row written once.
    assert torch.equal(exact["visits"], visible)
    assert torch.equal(exact["writes"], torch.ones_like(exact["writes"]))
    if case["splits"] > 1:
        assert torch.equal(exact["ws_writes"], torch.ones_like(exact["ws_writes"]))
    # P stays below 2**threshold (fp8 holds it).
    assert exact["stats"]["p_max"] <= 2 ** case["threshold"]


def test_lazy_rescale_skips_small_growth() -> None:
    """With threshold 0 every growth of a row max rescales; with 6 small growths keep the old
    max (and the result is the same)."""
    growing = next(c for c in CASES if c.get("growing") and c["threshold"] == 0.0)
    eager = _run_case(growing, 2, round_p=False)[0]
    lazy = _run_case(dict(growing, threshold=6.0), 2, round_p=False)[0]
    assert eager["stats"]["lazy"] == 0 and eager["stats"]["rescales"] > 0
    assert lazy["stats"]["lazy"] > 0
    assert lazy["stats"]["rescales"] < eager["stats"]["rescales"]
    assert lazy["stats"]["p_max"] > 1.0
    torch.testing.assert_close(lazy["out"], eager["out"], rtol=1e-4, atol=1e-5)


def test_cases_cover_every_option() -> None:
    assert {c["causal"] for c in CASES} == {False, True}
    assert {"q_lens" in c for c in CASES} == {False, True}
    assert {c["block_m"] for c in CASES} == set(ix.BLOCK_MS)
    assert {c["splits"] for c in CASES} >= {1, 2, 3, 7}
    assert {c["interleave"] for c in CASES} == {False, True}
    assert {c["hq"] // c["hkv"] for c in CASES} >= {1, 4, 8}
    assert {c["d"] for c in CASES} >= {64, 128, 192}
    assert any(c["d"] == 192 and c["dv"] == 128 for c in CASES)
    assert {c["mma"] for c in CASES} == set(fa.MMA_FLAVOURS)
    assert {c["dtype"] for c in CASES} == set(fa.FP8_DTYPES)
    assert {c["threshold"] for c in CASES} >= {0.0, 6.0, 7.0}
    assert any("q_lens" not in c and c["sq"] != c["sk"] for c in CASES)
    assert any(0 in c.get("q_lens", ()) for c in CASES)
    assert any(0 in c.get("k_lens", ()) for c in CASES)


# --- launcher argument checks --------------------------------------------------------------


def _dense_args() -> tuple[dict, dict]:
    b, sq, sk, hq, hkv, d, dv = 2, 33, 40, 4, 2, 128, 128
    args = dict(
        q=torch.empty(b, sq, hq, d, dtype=FNUZ),
        k=torch.empty(b, sk, hkv, d, dtype=FNUZ),
        v=torch.empty(b, sk, hkv, dv, dtype=FNUZ),
        out=torch.empty(b, sq, hq, dv, dtype=torch.bfloat16),
        lse=torch.empty(b, hq, sq),
        q_descale=torch.ones(1),
        k_descale=torch.ones(1),
        v_descale=torch.ones(1),
    )
    kwargs = dict(softmax_scale=d**-0.5, causal=True, block_m=64, rescale_threshold=6.0,
                  num_kv_splits=1, interleave=False, mma="mfma")  # fmt: skip
    return args, kwargs


def _varlen_args() -> tuple[dict, dict]:
    args, kwargs = _dense_args()
    tq, tk, hq, hkv = 50, 70, 4, 2
    args.update(
        q=torch.empty(tq, hq, 128, dtype=FN),
        k=torch.empty(tk, hkv, 128, dtype=FN),
        v=torch.empty(tk, hkv, 64, dtype=FN),
        out=torch.empty(tq, hq, 64, dtype=torch.bfloat16),
        lse=torch.empty(hq, tq),
    )
    kwargs.update(
        cu_seqlens_q=torch.tensor([0, 20, 50], dtype=torch.int32),
        cu_seqlens_k=torch.tensor([0, 30, 70], dtype=torch.int32),
        max_seqlen_q=30,
        max_seqlen_k=40,
    )
    return args, kwargs


def _ws(rows, hq, dv, splits, which):
    return torch.empty(fa.split_workspace_shapes(rows, hq, dv, splits)[which])


BAD = [
    (False, dict(mma="xdl"), ValueError, "mma: expected one of"),
    (False, dict(block_m=32), ValueError, "block_m: expected one of \\(64, 128\\)"),
    (False, dict(softmax_scale="0.1"), TypeError, "softmax_scale: expected a Python float"),
    (False, dict(softmax_scale=float("nan")), ValueError, "softmax_scale: expected a finite"),
    (False, dict(causal=1), TypeError, "causal: expected a bool"),
    (False, dict(rescale_threshold=8.0), ValueError, "rescale_threshold: expected a float in"),
    (False, dict(rescale_threshold=-1.0), ValueError, "rescale_threshold: expected a float in"),
    (False, dict(rescale_threshold=None), TypeError, "rescale_threshold: expected a Python"),
    (False, dict(num_kv_splits=0), ValueError, "num_kv_splits: expected an int >= 1"),
    (False, dict(interleave=2), ValueError, "interleave: expected a bool or 0/1"),
    (False, dict(num_kv_splits=2), ValueError, "workspace_out: expected a float32 \\[2, 66, 4, 128\\]"),
    (
        False,
        dict(num_kv_splits=2, workspace_out=_ws(66, 4, 128, 2, 0)),
        ValueError,
        "workspace_lse: expected a float32 \\[2, 66, 4, 2\\]",
    ),
    (
        False,
        dict(num_kv_splits=2, workspace_out=_ws(66, 4, 128, 3, 0), workspace_lse=_ws(66, 4, 128, 2, 1)),
        ValueError,
        "workspace_out: expected shape",
    ),
    (False, dict(q=torch.empty(2, 33, 4, 128, dtype=torch.bfloat16)), ValueError, "q: expected dtype in"),
    (False, dict(k=torch.empty(2, 40, 2, 128, dtype=FN)), ValueError, "k: expected dtype torch.float8_e4m3fnuz, got"),
    (False, dict(v=torch.empty(2, 40, 2, 128, dtype=FN)), ValueError, "v: expected dtype torch.float8_e4m3fnuz, got"),
    (False, dict(q=torch.empty(2, 33, 4, 80, dtype=FNUZ)), ValueError, "q: D = .* must be one of"),
    (False, dict(v=torch.empty(2, 40, 2, 288, dtype=FNUZ)), ValueError, "v: Dv = .* must be one of"),
    (False, dict(k=torch.empty(2, 40, 3, 128, dtype=FNUZ)), ValueError, "k: Hq = 4 must be a multiple"),
    (False, dict(k=torch.empty(2, 41, 2, 128, dtype=FNUZ)), ValueError, "v: expected shape"),
    (False, dict(k=torch.empty(3, 40, 2, 128, dtype=FNUZ)), ValueError, "k: expected shape"),
    (False, dict(q=torch.empty(33, 4, 128, dtype=FNUZ)), ValueError, "q: expected a 4-D"),
    (False, dict(q=torch.empty(2, 0, 4, 128, dtype=FNUZ)), ValueError, "q, k: B, Sq and Sk"),
    (
        False,
        dict(q=torch.empty(2, 4, 33, 128, dtype=FNUZ).transpose(1, 2)),
        ValueError,
        "q: expected a contiguous",
    ),
    (False, dict(out=torch.empty(2, 33, 4, 128)), ValueError, "out: expected dtype torch.bfloat16, got"),
    (False, dict(out=torch.empty(2, 33, 4, 64, dtype=torch.bfloat16)), ValueError, "out: expected shape"),
    (False, dict(lse=torch.empty(2, 33, 4)), ValueError, "lse: expected shape \\[B, Hq, Sq\\]"),
    (False, dict(lse=torch.empty(2, 4, 33, dtype=torch.float16)), ValueError, "lse: expected dtype"),
    (False, dict(q_descale=torch.ones(2)), ValueError, "q_descale: expected shape"),
    (False, dict(v_descale=torch.ones(1, dtype=torch.float64)), ValueError, "v_descale: expected dtype"),
    (False, dict(k_descale=1.0), TypeError, "k_descale: expected a torch.Tensor"),
    (False, dict(q=None), TypeError, "q: expected a torch.Tensor"),
    (False, dict(max_seqlen_q=30), ValueError, "cu_seqlens_q, cu_seqlens_k, max_seqlen_k: varlen needs"),
    (True, dict(max_seqlen_k=None), ValueError, "max_seqlen_k: varlen needs all"),
    (True, dict(max_seqlen_q=0), ValueError, "max_seqlen_q: expected an int >= 1"),
    (True, dict(max_seqlen_q=30.0), ValueError, "max_seqlen_q: expected an int"),
    (
        True,
        dict(cu_seqlens_q=torch.tensor([0, 20, 50], dtype=torch.int64)),
        ValueError,
        "cu_seqlens_q: expected dtype",
    ),
    (
        True,
        dict(cu_seqlens_k=torch.tensor([0, 70], dtype=torch.int32)),
        ValueError,
        "cu_seqlens_k: expected shape \\[B \\+ 1\\] = \\[3\\]",
    ),
    (True, dict(cu_seqlens_q=torch.tensor([0], dtype=torch.int32)), ValueError, "cu_seqlens_q: expected at least 2"),
    (True, dict(q=torch.empty(2, 25, 4, 128, dtype=FN)), ValueError, "q: expected a 3-D"),
    (True, dict(lse=torch.empty(2, 25, 4)), ValueError, "lse: expected shape \\[Hq, Tq\\]"),
    (True, dict(out=torch.empty(50, 4, 128, dtype=torch.bfloat16)), ValueError, "out: expected shape \\[Tq, Hq, Dv\\]"),
    (True, dict(num_kv_splits=3), ValueError, "workspace_out: expected a float32 \\[3, 50, 4, 64\\]"),
]  # fmt: skip


@pytest.mark.parametrize(("varlen", "change", "error", "message"), BAD)
def test_launch_rejects_bad_arguments(varlen, change, error, message) -> None:
    args, kwargs = _varlen_args() if varlen else _dense_args()
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(error, match=message):
        fa.launch_flash_attn_fp8(*args.values(), **kwargs)


def _named_requests(varlen: bool, **changes) -> list:
    """The kernels a launch on FakeTensors asks for in a gfx942 dry run (nothing compiles)."""
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:
        b, sq, sk = changes.pop("shape", (2, 33, 40))
        hq, hkv = changes.pop("heads", (4, 2))
        d, dv = changes.pop("dims", (128, 128))
        splits = changes.get("num_kv_splits", 1)

        def empty(*shape, dtype=torch.float32):
            return torch.empty(shape, dtype=dtype, device="cuda")

        kwargs = dict(softmax_scale=0.1, causal=True, block_m=64, rescale_threshold=6.0,
                      num_kv_splits=1, interleave=False, mma="mfma")  # fmt: skip
        kwargs.update(changes)
        if varlen:
            lead_q, lead_k, rows = (b * sq,), (b * sk,), b * sq
            kwargs.update(cu_seqlens_q=empty(b + 1, dtype=torch.int32),
                          cu_seqlens_k=empty(b + 1, dtype=torch.int32), max_seqlen_q=sq,
                          max_seqlen_k=sk)  # fmt: skip
            lse = empty(hq, rows)
        else:
            lead_q, lead_k, rows = (b, sq), (b, sk), b * sq
            lse = empty(b, hq, sq)
        if splits > 1:
            out_shape, lse_shape = fa.split_workspace_shapes(rows, hq, dv, splits)
            kwargs.update(workspace_out=empty(*out_shape), workspace_lse=empty(*lse_shape))
        fa.launch_flash_attn_fp8(
            empty(*lead_q, hq, d, dtype=FNUZ), empty(*lead_k, hkv, d, dtype=FNUZ),
            empty(*lead_k, hkv, dv, dtype=FNUZ), empty(*lead_q, hq, dv, dtype=torch.bfloat16),
            lse, empty(1), empty(1), empty(1), **kwargs,
        )  # fmt: skip
    return list(requests)


def test_runtime_sizes_change_no_kernel() -> None:
    """Launches on FakeTensors name their kernels; batch, lengths, heads (the GQA ratio), the
    split count, interleave and softmax_scale are runtime arguments, the rest Constexpr."""
    base = _named_requests(False)
    assert [r.function for r in base] == ["flash_attn_fp8_fwd"]
    params = dict(base[0].params)
    assert params["block_m"] == "64" and params["head_dim"] == "128"
    assert params["causal"] == "True" and params["has_lse"] == "True"
    assert params["use_split"] == "False" and params["rescale_threshold"] == "6.0"
    same = _named_requests(False, shape=(5, 300, 17), heads=(8, 1), interleave=True,
                           softmax_scale=0.3)  # fmt: skip
    assert [r.key for r in same] == [r.key for r in base]
    for changes in (dict(causal=False), dict(dims=(192, 128)), dict(block_m=128),
                    dict(rescale_threshold=0.0)):  # fmt: skip
        assert _named_requests(False, **changes)[0].key != base[0].key, changes
    varlen = _named_requests(True)
    assert varlen[0].key != base[0].key and dict(varlen[0].params)["varlen"] == "True"
    split = _named_requests(False, num_kv_splits=2)
    assert [r.function for r in split] == ["flash_attn_fp8_fwd", "flash_attn_fp8_combine"]
    assert [r.key for r in _named_requests(False, num_kv_splits=7, shape=(3, 9, 500))] == [
        r.key for r in split
    ]
    assert dict(split[0].params)["has_lse"] == "False"


# --- compilation per arch ----------------------------------------------------------------

ARCH_MMA = {"gfx942": ("mfma", "float8_e4m3fnuz"), "gfx950": ("mfma", "float8_e4m3fn"),
            "gfx1250": ("wmma", "float8_e4m3fn")}  # fmt: skip
# (varlen, causal, lse, D, Dv, block_m, splits)
COMPILED = [
    (False, True, True, 128, 128, 64, 1),
    (False, True, False, 128, 128, 64, 1),
    (True, True, True, 128, 128, 128, 1),
    (False, True, True, 192, 128, 64, 3),
]
JIT_NAMES = [
    ["flash_attn_fp8_fwd"],
    ["flash_attn_fp8_fwd"],
    ["flash_attn_fp8_fwd"],
    ["flash_attn_fp8_fwd", "flash_attn_fp8_combine"],
]
MNEMONIC = {"mfma": "v_mfma_f32_16x16x32_fp8_fp8", "wmma": "v_wmma_f32_16x16x64_fp8_fp8"}

_CHILD = """
import json, os, shutil, sys, time
from pathlib import Path
import torch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.fmha_fp8.kernels import flash_attn as fa

arch, mma, fp8, configs = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), json.loads(sys.argv[4])
dump, keep = Path(sys.argv[5]), Path(sys.argv[6])

def launch(cfg, device):
    varlen, causal, with_lse, d, dv, block_m, splits = cfg
    b, sq, sk, hq, hkv = 2, 77, 90, 8, 2
    def empty(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device=device)
    kwargs = {}
    if varlen:
        lead_q, lead_k, rows = (b * sq,), (b * sk,), b * sq
        kwargs.update(cu_seqlens_q=empty(b + 1, dtype=torch.int32),
                      cu_seqlens_k=empty(b + 1, dtype=torch.int32), max_seqlen_q=sq,
                      max_seqlen_k=sk)
        lse = empty(hq, rows) if with_lse else None
    else:
        lead_q, lead_k, rows = (b, sq), (b, sk), b * sq
        lse = empty(b, hq, sq) if with_lse else None
    if splits > 1:
        out_shape, lse_shape = fa.split_workspace_shapes(rows, hq, dv, splits)
        kwargs.update(workspace_out=empty(*out_shape), workspace_lse=empty(*lse_shape))
    start = time.perf_counter()
    fa.launch_flash_attn_fp8(
        empty(*lead_q, hq, d, dtype=fp8), empty(*lead_k, hkv, d, dtype=fp8),
        empty(*lead_k, hkv, dv, dtype=fp8), empty(*lead_q, hq, dv, dtype=torch.bfloat16), lse,
        empty(1), empty(1), empty(1), softmax_scale=d ** -0.5, causal=causal, block_m=block_m,
        rescale_threshold=6.0, num_kv_splits=splits, interleave=True, mma=mma, **kwargs)
    return time.perf_counter() - start

""" + LIST_THEN_BUILD


@pytest.fixture(scope="module", params=list(ARCH_MMA))
def compiled(request, rocm_path: str, tmp_path_factory) -> dict:
    """One child process per arch compiles COMPILED twice: with FlyDSL's ISA listing, then
    into a disk cache inside a compiling dry run."""
    arch = request.param
    mma, fp8 = ARCH_MMA[arch]
    root = tmp_path_factory.mktemp(f"flash_attn_fp8_{arch}")
    (root / "isa").mkdir()
    env = compile_env(arch, rocm_path, root / "cache")
    args = [arch, mma, fp8, json.dumps(COMPILED), str(root / "dump"), str(root / "isa")]
    child = run_child(_CHILD, args, env)
    assert child.returncode == 0, (
        f"{arch}: compile process exited with {child.returncode}"
        f" (negative: killed by signal)\n{child.stderr[-4000:]}"
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    return {"arch": arch, "mma": mma, **result}


@pytest.mark.slow
def test_one_cache_entry_per_kernel(compiled: dict) -> None:
    print(f"\n{compiled['arch']} compile seconds (listing, cache build):")
    for cfg, listed, built in zip(COMPILED, compiled["listed"], compiled["built"], strict=True):
        print(cfg, round(listed["seconds"], 2), round(built["seconds"], 2))
    for idx, built in enumerate(compiled["built"]):
        assert [name for name, _ in built["entries"]] == JIT_NAMES[idx]
        for _, path in built["entries"]:
            assert Path(path).is_file(), path
            assert Path(path).parent.name.rsplit("_", 1)[0] in JIT_NAMES[idx]


@pytest.mark.slow
def test_code_objects_target_the_arch(compiled: dict) -> None:
    from aiter.flydsl_bridge import elf, extract_code_objects

    for built in compiled["built"]:
        for _, path in built["entries"]:
            codes = extract_code_objects(path)
            assert len(codes) == 1, path
            header = elf.parse_header(codes[0])
            assert header.e_machine == 224, path
            assert header.e_flags & 0xFF == elf.ARCH_TO_MACH[compiled["arch"]], path


@pytest.mark.slow
def test_disassembly_uses_the_arch_mma(compiled: dict) -> None:
    """llvm-objdump, where an installed one knows the arch, finds the fp8 MMA in the forward
    kernel only."""
    from aiter.flydsl_bridge import extract_code_objects

    arch, mma = compiled["arch"], compiled["mma"]
    other = "v_wmma" if mma == "mfma" else "v_mfma"
    for built in compiled["built"]:
        for name, path in built["entries"]:
            text = disassemble_or_skip(extract_code_objects(path)[0], arch)
            assert (MNEMONIC[mma] in text) == (name == "flash_attn_fp8_fwd"), path
            assert other not in text, path


@pytest.mark.slow
def test_isa_listing(compiled: dict) -> None:
    """FlyDSL's ISA listing of every kernel: the arch and wave size, the fp8 MMA, the fp8
    conversion of P and the LDS staging of K and V in the forward kernel only (no byte-wide LDS
    writes anywhere), exp2 in both kernels, and no register spills."""
    arch, mma = compiled["arch"], compiled["mma"]
    wave = ix.WAVE_SIZE[mma]
    for idx, listed in enumerate(compiled["listed"]):
        kernels = {name.removesuffix("_kernel"): path for name, path in listed["isa"].items()}
        assert sorted(kernels) == sorted(JIT_NAMES[idx]), listed["isa"]
        for name, path in kernels.items():
            text = Path(path).read_text()
            is_fwd = name == "flash_attn_fp8_fwd"
            assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text, name
            assert f".wavefront_size: {wave}" in text, name
            assert (MNEMONIC[mma] in text) == is_fwd, (idx, name)
            assert ("v_wmma" if mma == "mfma" else "v_mfma") not in text, (idx, name)
            assert ("v_cvt_pk_fp8_f32" in text) == is_fwd, (idx, name)
            # K and V reach LDS in 16- and 4-byte writes, never byte by byte.
            assert not re.search(r"\bds_(?:write|store)_b8", text), (idx, name)
            assert bool(re.search(r"\bds_(?:write|store)_b128", text)) == is_fwd, (idx, name)
            assert "v_exp_f32" in text, (idx, name)
            spills = re.findall(r"\.(?:v|s)gpr_spill_count:\s+(\d+)", text)
            assert spills and all(s == "0" for s in spills), (idx, name, spills)


@pytest.mark.slow
def test_key_loop_stages_k_and_v_once_per_work_group(compiled: dict) -> None:
    """The forward kernel's key loop, per key block: the work-group's loads are its threads'
    staged copies of the K and V tiles (BLOCK_N x (D + Dv) bytes, plus the repeats of threads
    without a piece), buffer loads, where every wave used to load the whole K tile itself; two
    barriers; the loads (the next block's) issued after the second barrier, before the MMAs
    that follow it, and no wait before the first MMA forces one of them; the listing's LDS is
    the layout's."""
    from aiter.flydsl_bridge import listing as L

    mma = compiled["mma"]
    wsz = ix.WAVE_SIZE[mma]
    for idx, listed in enumerate(compiled["listed"]):
        _, _, _, d, dv, block_m, _ = COMPILED[idx]
        text = Path(listed["isa"]["flash_attn_fp8_fwd_kernel"]).read_text()
        listing = L.parse_listing(text)
        loop = L.main_loop(listing)
        assert loop is not None, idx
        fig = L.loop_figures(loop, wsz)
        threads = ix.block_threads(block_m, mma)
        waves = threads // wsz
        staged = threads * (ix.k_copy_steps(d, threads) * ix.K_COPY_BYTES
                            + ix.v_copy_steps(dv, threads) * ix.V_COPY_BYTES)  # fmt: skip
        assert ix.BLOCK_N * (d + dv) <= staged < ix.BLOCK_N * (d + dv) + threads * 2 * 16
        assert fig.global_load_bytes * waves == staged, (idx, fig.to_dict())
        assert fig.global_load_bytes < ix.BLOCK_N * d  # less than one K tile per wave
        assert fig.buffer_load_count == fig.global_load_count, idx
        assert fig.barriers == 2, idx
        assert not fig.exposed_wait, fig.exposed_wait_detail
        assert not any(re.match(r"ds_(?:write|store)_b8", i.mnemonic) for i in loop.body), idx
        # The next block's loads stand between the barrier that publishes this block's tiles
        # and the MMAs that follow it.
        body = loop.body
        last_barrier = max(i for i, x in enumerate(body) if x.mnemonic.startswith("s_barrier"))
        loads = [i for i, x in enumerate(body) if L.vmem_kind(x.mnemonic) == "load"]
        next_mma = min(i for i, x in enumerate(body) if L.is_mma(x.mnemonic) and i > last_barrier)
        assert last_barrier < min(loads) and max(loads) < next_mma, (idx, loads, next_mma)
        per_row = ix.full_chunks(d) * (ix.D_CHUNK // ix.MMA_K[mma]) + ix.has_half_chunk(d)
        assert fig.mma_count == ix.KEY_TILES * per_row + (dv // ix.MMA_MN) * ix.pv_steps(mma)
        assert listing.lds_bytes == ix.lds_layout(d, dv, waves)[3], idx


@pytest.mark.slow
def test_only_the_second_key_loop_evaluates_the_mask(compiled: dict) -> None:
    """The forward kernel has two key loops, the blocks that need no mask and then the
    diagonal and tail blocks: only the second orders key indices against limits (the causal
    and sequence-end tests), and the first issues fewer VALU per block."""
    from aiter.flydsl_bridge import listing as L

    wsz = ix.WAVE_SIZE[compiled["mma"]]
    for idx, listed in enumerate(compiled["listed"]):
        text = Path(listed["isa"]["flash_attn_fp8_fwd_kernel"]).read_text()
        key_loops = [lp for lp in L.loops(L.parse_listing(text)) if lp.mma_count]
        assert len(key_loops) == 2, idx
        compares = [
            [i for i in lp.body if re.match(r"v_cmp_[lg][te]_[iu]32", i.mnemonic)]
            for lp in key_loops
        ]
        assert compares[0] == [] and compares[1], idx
        valu = [L.loop_figures(lp, wsz).valu_count for lp in key_loops]
        assert valu[0] < valu[1], (idx, valu)
