"""Tests of the MoE stage FlyDSL kernels without a GPU: their index math, the whole layer
emulated block by block on CPU (with moe_sorting's CPU reference) against a dense torch
reference, the launchers' argument checks, and compilation per arch."""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from aiter.ops.moe.kernels import stages as mg
from aiter.ops.moe.kernels import stages_index as ix
from aiter.ops.moe.kernels.sorting_index import (
    moe_sorting_reference,
    pack_sorted_id,
    sentinel_id,
    sorting_sizes,
)
from aiter.ops.moe.reference import (
    act_reference,
    fused_moe_reference,
    local_experts,
    per_token_quant,
    split_gate_up,
)
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared.preshuffle import shuffle_weight
from aiter.ops.shared.tiles import GemmTile
from op_tests.compile_child import compile_env, disassemble_or_skip, run_child
from op_tests.shared.mainloop_emulation import (
    AccessStats,
    WorkGroup,
    conflict_summary,
    fast_first,
    round_to,
)

FNUZ, FN = torch.float8_e4m3fnuz, torch.float8_e4m3fn
FP8_DTYPES_ALL = (FNUZ, FN)


def _tmin(x, bound):
    return x.clamp(max=bound)


def _tmax(x, bound):
    return x.clamp(min=bound)


# --- pure index math ---------------------------------------------------------------------


def test_entry_fields_round_trip() -> None:
    m, topk = 50, 4
    for token in (0, 1, 17, m - 1):
        for slot in range(topk):
            entry = pack_sorted_id(token, slot)
            assert (ix.entry_token(entry), ix.entry_slot(entry)) == (token, slot)
            assert ix.entry_valid(token, slot, m, topk)
            assert ix.routed_row(token, slot, topk) == token * topk + slot
    pad = sentinel_id(m, topk)
    token, slot = ix.entry_token(pad), ix.entry_slot(pad)
    assert (token, slot) == (m, topk)
    assert not ix.entry_valid(token, slot, m, topk)
    # Padding loads nothing: its token is past M (stage 1) and its entry invalid (stage 2).
    assert token >= m
    # A padding id of a smaller token count is still recognised by its slot.
    assert not ix.entry_valid(3, topk, m, topk)


@pytest.mark.parametrize("gate_mode", ix.GATE_MODES)
@pytest.mark.parametrize("inter", [64, 128])
def test_gate_and_up_rows_cover_w1_once(gate_mode: str, inter: int) -> None:
    gates = [ix.gate_row(n, inter, gate_mode) for n in range(inter)]
    ups = [ix.up_row(n, inter, gate_mode) for n in range(inter)]
    assert sorted(gates + ups) == list(range(2 * inter))
    # The reference's reading of the w1 rows agrees.
    ref_gate, ref_up = split_gate_up(torch.arange(2 * inter), gate_mode)
    assert ref_gate.tolist() == gates and ref_up.tolist() == ups


def test_per_expert_preshuffle_is_the_preshuffle_of_the_stacked_rows() -> None:
    """The kernels read preshuffled w1/w2 through global rows e * rows + r: shuffling each
    expert's slab must equal shuffling the [E * rows, K] view."""
    gen = torch.Generator().manual_seed(0)
    experts, rows, k = 3, 96, 128
    w = torch.randint(-100, 100, (experts, rows, k), generator=gen, dtype=torch.int8)
    per_expert = torch.stack([shuffle_weight(w[e], (16, 16)) for e in range(experts)])
    assert torch.equal(per_expert.reshape(-1, k), shuffle_weight(w.reshape(-1, k), (16, 16)))
    flat = per_expert.reshape(-1)
    for e, r, kk in ((0, 0, 0), (1, 17, 63), (2, 95, 127), (1, 48, 16)):
        off = mx.shuffled_element(ix.expert_row(e, r, rows), kk, k)
        assert flat[off] == w[e, r, kk]


@pytest.mark.parametrize("mma", mg.MMA_FLAVOURS)
def test_stage_tiles_fit_the_kernels(mma: str) -> None:
    """Every supported tile fits the shared main loop on every arch of its flavour (stage 1
    streams 2 * tile_n B rows: its gate and up rows); a candidate that does not is refused."""
    refused = {t: mg.tile_problem(t, mma) for t in mg.CANDIDATE_TILES}
    print(mma, "refused tiles:", {f"{t.tile_m}x{t.tile_n}x{t.tile_k}": why
                                  for t, why in refused.items() if why})  # fmt: skip
    assert mg.STAGE_TILES[mma] == tuple(t for t, why in refused.items() if why is None)
    for tile in mg.STAGE_TILES[mma]:
        assert tile.tile_m % mx.MMA_MN == 0  # a sorting block size, whole MMA repeats
        assert tile.tile_n % (mx.WAVES_PER_BLOCK * mx.MMA_MN) == 0  # four waves along N
        assert tile.tile_k % mx.k_block(2) == 0 and tile.tile_k % mx.k_block(1) == 0
        for elem_bytes in (2, 1):
            assert mx.budget_problem(tile.tile_m, 2 * tile.tile_n, tile.tile_k, elem_bytes, 4,
                                     mma) is None  # fmt: skip
    # Stage 1's K (model_dim) has no tail; its N and stage 2's K (inter) are 16-byte steps.
    assert ix.MODEL_DIM_MULTIPLE % mx.k_block(1) == 0 and ix.MODEL_DIM_MULTIPLE % mx.k_block(2) == 0
    assert ix.MODEL_DIM_MULTIPLE % mx.MMA_MN == 0
    for element_bytes, multiple in ix.INTER_DIM_MULTIPLE.items():
        assert multiple * element_bytes == ix.TAIL_CHUNK_BYTES == mx.CHUNK_BYTES
    assert ix.inter_dim_multiple(1) % 16 == 0  # w2's (16, 16) preshuffle has K = inter


@pytest.mark.parametrize("mma", mg.MMA_FLAVOURS)
def test_stage1_accumulators_are_the_wide_main_loop_tiles(mma: str) -> None:
    """mma_k_tile_wide keeps A repeat i x B repeat j at i * (2 * reps_n) + j; stage 1's B
    repeats are the lane's reps_n gate rows, then its reps_n up rows."""
    for tile in mg.STAGE_TILES[mma]:
        reps_m, reps_n = mx.mma_repeats(tile.tile_m, tile.tile_n)
        gate = [ix.stage1_acc_index(i, j, reps_n, 0) for i in range(reps_m) for j in range(reps_n)]
        up = [ix.stage1_acc_index(i, j, reps_n, 1) for i in range(reps_m) for j in range(reps_n)]
        assert sorted(gate + up) == list(range(2 * reps_m * reps_n))
        for i in range(reps_m):
            for j in range(reps_n):
                assert ix.stage1_acc_index(i, j, reps_n, 0) == i * 2 * reps_n + j
                assert ix.stage1_acc_index(i, j, reps_n, 1) == i * 2 * reps_n + reps_n + j


def test_tile_origin_is_the_gemm_block_origin() -> None:
    """The kernels take their tile origin from the shared Pipeline (block_origin with the
    sorted block as the M block)."""
    for bid_block, bid_n, tile_m, tile_n in ((0, 0, 16, 64), (3, 1, 32, 128), (7, 2, 64, 64)):
        assert ix.tile_origin(bid_block, bid_n, tile_m, tile_n) == mx.block_origin(
            bid_block, bid_n, tile_m, tile_n
        )
        assert ix.tile_origin(bid_block, bid_n, tile_m, tile_n)[0] == ix.sorted_row(
            bid_block, tile_m, 0
        )


@pytest.mark.parametrize("num_kb", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("ksplit", [1, 2, 3, 4])
def test_k_splits_cover_the_k_blocks_once(num_kb: int, ksplit: int) -> None:
    seen = []
    for split in range(ksplit):
        begin, end = ix.k_split_range(split, num_kb, ksplit)
        seen.extend(range(begin, end))
    assert seen == list(range(num_kb))


# inter_dim of real shards (gpt-oss-120b at TP8, TP4, TP2: 360, 720, 1440) and small tails.
TAIL_INTERS = (8, 16, 24, 48, 360, 720, 1440)


@pytest.mark.parametrize("mma", mg.MMA_FLAVOURS)
@pytest.mark.parametrize("quant", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("inter", TAIL_INTERS)
def test_stage2_k_chunks_cover_inter_once(inter: int, quant: bool, mma: str) -> None:
    """Over stage_k_blocks(inter) k-blocks, the 16-byte chunks of A's copy and of each lane's
    B runs that lie below inter cover every K index once; with a K tail the others start at
    or past inter (they load zeros); every chunk is 16-byte aligned."""
    element_bytes = 1 if quant else 2
    if inter % ix.inter_dim_multiple(element_bytes):  # fp8 off its rule: refused, not run
        args, kwargs = _stage2_args(quant, inter=inter)
        with pytest.raises(ValueError, match="a2: inter .* multiple of 16 for"):
            mg.launch_moe_stage2(*args.values(), **kwargs)
        return
    k_block = mx.k_block(element_bytes)
    per_chunk = mx.CHUNK_BYTES // element_bytes
    num_kb = ix.stage_k_blocks(inter, k_block)
    assert ix.has_k_tail(inter, k_block) == (num_kb * k_block != inter)
    b_covered: Counter = Counter()
    for kb in range(num_kb):
        for lane in range(mx.WAVE_SIZE[mma]):
            if mx.operand_row(0, lane) != 0:
                continue  # the other rows' lanes repeat these K runs
            for piece in range(mx.operand_chunks(mma)):
                kk = kb * k_block + mx.operand_chunk(0, lane, piece, mma) * per_chunk
                assert (kk * element_bytes) % mx.CHUNK_BYTES == 0
                if kk < inter:
                    assert kk + per_chunk <= inter  # wholly inside
                    b_covered.update(range(kk, kk + per_chunk))
    assert b_covered == Counter(range(inter))
    a_covered: Counter = Counter()
    cpk = mx.chunks_per_k_block()
    for kb in range(num_kb):
        for chunk in range(cpk):
            kk = kb * k_block + chunk * per_chunk
            if kk < inter:
                a_covered.update(range(kk, kk + per_chunk))
    assert a_covered == Counter(range(inter))


@pytest.mark.parametrize("gate_mode", ix.GATE_MODES)
@pytest.mark.parametrize("inter", TAIL_INTERS)
def test_stage1_column_tiles_cover_inter_once(inter: int, gate_mode: str) -> None:
    """Stage 1's N tail: the column tiles store each column of inter once; a column past it
    loads zeros (its gate and up rows are not read) and stores nothing."""
    for tile_n in sorted({t.tile_n for tiles in mg.STAGE_TILES.values() for t in tiles}):
        grid_x, _, _ = ix.stage1_grid(inter, 1, tile_n, 1)
        stored: Counter = Counter()
        for bid_n in range(grid_x):
            _, origin_n = ix.tile_origin(0, bid_n, 16, tile_n)
            for col in range(origin_n, origin_n + tile_n):
                if col < inter:  # the load and store predicate
                    rows = (ix.gate_row(col, inter, gate_mode), ix.up_row(col, inter, gate_mode))
                    assert all(0 <= r < 2 * inter for r in rows)
                    stored[col] += 1
        assert stored == Counter(range(inter)), tile_n


@pytest.mark.parametrize("activation", ix.ACTIVATIONS)
def test_activation_formulas_match_the_reference(activation: str) -> None:
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(4096, generator=gen, dtype=torch.float64) * 6
    u = torch.randn(4096, generator=gen, dtype=torch.float64) * 6
    got = ix.activate(activation, g, u, torch.exp, _tmin, _tmax)
    torch.testing.assert_close(got, act_reference(activation, g, u), rtol=1e-12, atol=1e-12)
    # Plain Python floats through math.exp, min and max give the same numbers.
    for gv, uv in ((-9.0, 3.0), (0.5, -8.0), (8.5, 7.5), (2.0, 0.25)):
        want = float(act_reference(activation, torch.tensor(gv), torch.tensor(uv)))
        assert math.isclose(ix.activate(activation, gv, uv), want, rel_tol=1e-6, abs_tol=1e-9)


def test_constants_and_workspace_shapes() -> None:
    assert mg.STAGE_MODES == ("atomic", "reduce")
    assert mg.ACTIVATIONS == ("silu", "swiglu")
    assert mg.GATE_MODES == ("separated", "interleave")
    assert (mg.SWIGLU_ALPHA, mg.SWIGLU_LIMIT) == (1.702, 7.0)
    assert mg.WORKSPACE_DTYPE is torch.float32
    assert mg.MMA_FLAVOURS == ("mfma", "wmma")
    assert mg.stage1_workspace_shape(5, 3, 64) == (15, 128)
    assert mg.stage2_workspace_shape(5, 3, 256) == (15, 256)
    for mma in mg.MMA_FLAVOURS:
        assert len(mg.STAGE_TILES[mma]) == 17
    # The stage-1 workspace keeps gate at column n and up at inter + n whatever the gate mode.
    assert [ix.stage1_ws_gate_col(n) for n in range(3)] == [0, 1, 2]
    assert [ix.stage1_ws_up_col(n, 64) for n in range(3)] == [64, 65, 66]


def test_every_arch_has_the_packed_atomic_adds() -> None:
    """What the listings show (test_isa_listing): so "atomic" mode serves every flavour."""
    from aiter.arch import ARCHS

    assert set(mg.PACKED_ATOMIC_DTYPES) == set(ARCHS)
    for mma in mg.MMA_FLAVOURS:
        for dtype in mg.OUT_DTYPES:
            assert mg.atomic_mode_problem(mma, dtype) is None, (mma, dtype)


def test_the_plan_avoids_atomic_mode_without_a_packed_atomic_add(tmp_path, monkeypatch) -> None:
    """An arch without a packed fp16 atomic add: the planner's default and its fallbacks use
    "reduce" for fp16 outputs (bf16 keeps "atomic"), and a row naming an atomic stage-2 kernel
    for them is refused with its file and line."""
    from aiter import device
    from aiter.ops.moe import plan as moe_plan
    from aiter.ops.moe.table import FMOE
    from aiter.tuning import TableError

    monkeypatch.setitem(mg.PACKED_ATOMIC_DTYPES, "gfx942", (torch.bfloat16,))
    problem = mg.atomic_mode_problem("mfma", torch.float16)
    assert problem is not None and "gfx942" in problem and "'reduce'" in problem
    assert mg.atomic_mode_problem("mfma", torch.bfloat16) is None
    assert mg.atomic_mode_problem("wmma", torch.float16) is None
    f16 = moe_plan.MoeShape(2048, 256, 8, 2, "silu", "torch.float16", "torch.float16",
                            "torch.float16", False, False)  # fmt: skip
    bf16 = moe_plan.MoeShape(2048, 256, 8, 2, "silu", "torch.bfloat16", "torch.bfloat16",
                             "torch.bfloat16", False, False)  # fmt: skip
    assert moe_plan.stage2_modes(f16, "mfma") == ("reduce",)
    assert moe_plan.stage2_modes(f16, "wmma") == mg.STAGE_MODES
    assert moe_plan.heuristic_choice(bf16, 300, 304, "mfma").stage2_mode == "atomic"
    planned = moe_plan.heuristic_choice(f16, 300, 304, "mfma")
    assert planned.stage2_mode == "reduce"
    variants = moe_plan.equivalent_choices(planned, f16, 300, 304)
    assert variants and {v.stage2_mode for v in variants} == {"reduce"}

    cells = dict.fromkeys(FMOE.header, "")
    cells.update(
        gfx="gfx942", cu_num="304", token="512", model_dim="2048", inter_dim="256", expert="8",
        topk="2", act_type="ActivationType.Silu", dtype="torch.float16",
        q_dtype_a="torch.float16", q_dtype_w="torch.float16", q_type="QuantType.No",
        use_g1u1="1", doweight_stage1="0", block_m="0", ksplit="0", run_1stage="0",
        kernelName2="flydsl_moe2_mfma_32x64x64_atomic",
    )  # fmt: skip
    path = tmp_path / "fmoe.csv"
    path.write_text(",".join(FMOE.header) + "\n" + ",".join(cells.values()) + "\n")
    monkeypatch.setenv(FMOE.env_var, str(path))
    with device.simulate("gfx942", 304):
        assert moe_plan.plan(f16, 5).choice.stage2_mode == "reduce"  # no row: the default
        assert moe_plan.plan(bf16, 300).choice.stage2_mode == "atomic"
        with pytest.raises(TableError, match=rf"{path}:2: column 'kernelName2': .*gfx942 has no"):
            moe_plan.plan(f16, 300)


# --- the kernels' arithmetic, emulated on CPU --------------------------------------------


def _block_rows(routing, bid_block: int, tile_m: int, m: int, topk: int):
    """(sorted rows, tokens, slots, valid) of a sorted block, read as the kernel reads them."""
    sorted_ids = routing[0]
    rows = ix.sorted_row(bid_block, tile_m, torch.arange(tile_m))
    assert int(rows.max()) < sorted_ids.numel()  # only active blocks read sorted_ids
    entries = sorted_ids[rows].long()
    token, slot = ix.entry_token(entries), ix.entry_slot(entries)
    return rows, token, slot, ix.entry_valid(token, slot, m, topk)


def _active_expert(routing, bid_block: int, tile_m: int, num_experts: int) -> int | None:
    _, _, sorted_expert_ids, num_valid_ids = routing
    expert = int(sorted_expert_ids[bid_block])
    active = ix.block_active(bid_block, tile_m, int(num_valid_ids[0]))
    return expert if active & ix.expert_valid(expert, num_experts) else None


# The stages' work-groups, replayed thread by thread and phase by phase with the shared
# main-loop emulation (op_tests/shared/mainloop_emulation.py); this file adds the family's
# prologue (routing, gathered A rows, the expert's weight rows) and epilogues.

STATS: dict = defaultdict(AccessStats)  # LDS instructions of every emulated work-group
RACES: list[str] = []
PACKED_ADDS: Counter = Counter()  # stage 2 "atomic": packed adds per (token, column pair)


def _record(wg: WorkGroup) -> None:
    RACES.extend(wg.lds.races)
    for kind, s in wg.lds.stats.items():
        STATS[kind].instructions += s.instructions
        STATS[kind].cycles += s.cycles
        STATS[kind].ideal_cycles += s.ideal_cycles


def _arch(mma: str, quant_dtype=None) -> str:
    if mma == "wmma":
        return "gfx1250"
    return "gfx942" if quant_dtype in (None, FNUZ) else "gfx950"


class Stage1WorkGroup(WorkGroup):
    """Stage 1's main loop: A = the block's tokens' rows of x; B = the gate rows then the up
    rows of each wave's columns (2 * reps_n B repeats), as load_a_k_tile / load_b_rows /
    mma_k_tile_wide issue them."""

    def __init__(self, *, b_row, **kwargs):
        super().__init__(**kwargs)
        self.b_row = b_row  # (wave, j, lane) -> (row of the expert's slab, valid), j < reps_b
        self.reps_b = 2 * self.reps_n
        zero = self.zero
        self.zero = lambda count: zero(2 * count)  # main_loop's accumulators: 2 * reps_n wide

    def b_rows_of(self, wave, lane):
        return [self.b_row(wave, j, lane) for j in range(self.reps_b)]

    def mma_k_tile(self, b_runs, accs, reps_n=None):
        super().mma_k_tile(b_runs, accs, self.reps_b)


def _entry_of(sorted_ids, origin_m: int, r: int, tile_m: int, m: int, topk: int):
    """(token, slot, valid) of block row r, as the kernels' _entry reads it."""
    entry = int(sorted_ids[origin_m + r]) if r < tile_m else 0
    token, slot = ix.entry_token(entry), ix.entry_slot(entry)
    return token, slot, bool(ix.entry_valid(token, slot, m, topk))


def _f32(value: float) -> float:
    return round_to(value, torch.float32)


def _act32(activation: str, g: float, u: float) -> float:
    """The activation the emulations and the bit-exact references share (float64 math, then
    fp32); the kernels' v_exp_f32 is not modelled bit for bit."""
    return _f32(ix.activate(activation, g, u))


def emulate_stage1(a, w1_flat, a_scale, w1_scale, bias1, routing, out, workspace, *, topk,
                   tile, ksplit, activation, gate_mode, doweight, quant, mma="mfma",
                   arch=None):  # fmt: skip
    """moe_stage1 work-group by work-group (then the activation kernel when ksplit > 1).

    `a` and `w1_flat` hold the input values as fp32 (w1_flat preshuffled per expert for fp8).
    Returns how many times each element of out was written."""
    arch = arch or _arch(mma)
    m, k = a.shape
    inter = out.shape[1]
    two_inter = 2 * inter
    num_experts = w1_flat.numel() // (two_inter * k)
    eb = 1 if quant else 2
    tm, tn = tile.tile_m, tile.tile_n
    sorted_ids, sorted_weights = routing[0], routing[1]
    num_blocks = routing[2].numel()
    grid_x, grid_y, grid_z = ix.stage1_grid(inter, num_blocks, tn, ksplit)
    writes = torch.zeros(out.numel(), dtype=torch.int32)
    out_flat = out.view(-1)
    af, wf = a.double().reshape(-1), w1_flat.double()
    xs = a_scale.double().reshape(-1) if quant else None
    w1s = w1_scale.double().reshape(-1) if quant else None
    b1 = bias1.double().reshape(-1) if bias1 is not None else None
    out_bytes = 4 if ksplit > 1 else out.element_size()
    for bid_block in range(grid_y):
        expert = _active_expert(routing, bid_block, tm, num_experts)
        if expert is None:
            continue
        origin_m = bid_block * tm
        entries = [_entry_of(sorted_ids, origin_m, r, tm, m, topk) for r in range(tm)]
        for bid_n in range(grid_x):
            origin_n = bid_n * tn

            def a_rows(r, origin_m=origin_m):
                token = ix.entry_token(int(sorted_ids[origin_m + r]) if r < tm else 0)
                return token * k, token < m

            def b_row(wave, j, lane, origin_n=origin_n, reps_n=mx.mma_repeats(tm, tn)[1]):
                col = origin_n + mx.wave_col0(wave, tn) + mx.operand_row(j % reps_n, lane)
                fn = ix.gate_row if j < reps_n else ix.up_row
                return fn(col, inter, gate_mode), col < inter

            for split in range(grid_z):
                wg = Stage1WorkGroup(
                    mma=mma, arch=arch, tile=tile, elem_bytes=eb, a_flat=af, a_rows=a_rows,
                    b_flat=wf, b_base=expert * two_inter * k, b_rows=two_inter,
                    b_shuffled=quant, k=k, origin=(origin_m, origin_n),
                    lds_bytes=mx.lds_bytes(tm, tn, tile.tile_k, eb, out_bytes, mma), b_row=b_row,
                )  # fmt: skip
                kb_begin, kb_end = ix.k_split_range(split, k // mx.k_block(eb), ksplit)
                accs = wg.main_loop(kb_begin, kb_end)
                reps_n = wg.reps_n

                def gate_up(wave, i, j, lane, e, wg=wg, accs=accs, origin_n=origin_n,
                            entries=entries, expert=expert):  # fmt: skip
                    reps_n, reps_b = wg.reps_n, wg.reps_b
                    row = wg.lane_row(i, lane, e)
                    token, _, valid = entries[row]
                    col = origin_n + wg.lane_col(wave, j, lane)
                    g_row = expert * two_inter + ix.gate_row(col, inter, gate_mode)
                    u_row = expert * two_inter + ix.up_row(col, inter, gate_mode)
                    g = _f32(accs[wave][i * reps_b + j][lane][e])
                    u = _f32(accs[wave][i * reps_b + reps_n + j][lane][e])
                    if quant:
                        x = float(xs[token]) if valid else 0.0
                        gs = float(w1s[g_row]) if col < inter else 0.0
                        us = float(w1s[u_row]) if col < inter else 0.0
                        g, u = _f32(_f32(g * x) * gs), _f32(_f32(u * x) * us)
                    if b1 is not None and ksplit == 1 and col < inter:
                        g, u = _f32(g + float(b1[g_row])), _f32(u + float(b1[u_row]))
                    return g, u, row, col

                if ksplit > 1:  # fp32 atomic adds of the partials, straight from the accs
                    ws_flat = workspace.view(-1)
                    for wave in range(mx.WAVES_PER_BLOCK):
                        for i in range(wg.reps_m):
                            for j in range(reps_n):
                                for lane in range(wg.wsz):
                                    for e in range(mx.acc_rows_per_lane(mma)):
                                        g, u, row, col = gate_up(wave, i, j, lane, e)
                                        token, slot, valid = entries[row]
                                        if not (valid and col < inter):
                                            continue
                                        routed = ix.routed_row(token, slot, topk)
                                        g_off = routed * two_inter + ix.stage1_ws_gate_col(col)
                                        u_off = routed * two_inter + ix.stage1_ws_up_col(col, inter)
                                        ws_flat[g_off] = _f32(float(ws_flat[g_off]) + g)
                                        ws_flat[u_off] = _f32(float(ws_flat[u_off]) + u)
                    _record(wg)
                    continue

                def value_fn(wave, i, j, lane, e, _acc, gate_up=gate_up, origin_m=origin_m):
                    g, u, row, _ = gate_up(wave, i, j, lane, e)
                    y = _act32(activation, g, u)
                    if doweight:
                        y = _f32(y * float(sorted_weights[origin_m + row]))
                    return y

                def store(row, col, values, origin_n=origin_n, entries=entries):
                    token, slot, valid = entries[row]
                    col = origin_n + col
                    if not (valid and col < inter):
                        return
                    assert col + len(values) <= inter  # a run never crosses inter
                    off = ix.routed_row(token, slot, topk) * inter + col
                    out_flat[off : off + len(values)] = torch.tensor(values).to(out.dtype)
                    writes[off : off + len(values)] += 1

                wg.stage_and_store(accs, value_fn, out.dtype, store)
                _record(wg)
    if ksplit > 1:
        writes = emulate_activation(workspace, bias1, routing, out, topk=topk,
                                    num_experts=num_experts, tile_m=tm,
                                    activation=activation, gate_mode=gate_mode,
                                    doweight=doweight)  # fmt: skip
    return writes.view(out.shape)


def emulate_stage2(a2, w2_flat, a2_scale, w2_scale, bias2, routing, out, workspace, *, topk,
                   tile, mode, apply_weight, quant, mma="mfma", arch=None):  # fmt: skip
    """moe_stage2 work-group by work-group (then the top-k reduction for "reduce"): the shared
    main loop over the routed rows of a2 and the expert's w2 rows, K = inter (chunks past it
    load zeros), then the rows staged through LDS and read back as 16-byte runs: added into
    out[token] as packed 2-element atomics in out's dtype ("atomic"; each recorded in
    PACKED_ADDS by (token, column pair)) or stored as fp32 runs ("reduce").

    Returns how many times each element of the destination (out or the workspace) was written."""
    arch = arch or _arch(mma)
    m, model_dim = out.shape
    inter = a2.shape[1]
    num_experts = w2_flat.numel() // (model_dim * inter)
    eb = 1 if quant else 2
    tm, tn = tile.tile_m, tile.tile_n
    sorted_ids, sorted_weights = routing[0], routing[1]
    num_blocks = routing[2].numel()
    grid_x, grid_y, _ = ix.stage2_grid(model_dim, num_blocks, tn)
    dst = out if mode == "atomic" else workspace
    writes = torch.zeros(dst.numel(), dtype=torch.int32)
    dst_flat = dst.view(-1)
    af, wf = a2.double().reshape(-1), w2_flat.double()
    xs = a2_scale.double().reshape(-1) if quant else None
    w2s = w2_scale.double().reshape(-1) if quant else None
    b2 = bias2.double().reshape(-1) if bias2 is not None else None
    k_block = mx.k_block(eb)
    out_bytes = dst.element_size()
    for bid_block in range(grid_y):
        expert = _active_expert(routing, bid_block, tm, num_experts)
        if expert is None:
            continue
        origin_m = bid_block * tm
        entries = [_entry_of(sorted_ids, origin_m, r, tm, m, topk) for r in range(tm)]
        for bid_n in range(grid_x):
            origin_n = bid_n * tn

            def a_rows(r, origin_m=origin_m):
                token, slot, valid = _entry_of(sorted_ids, origin_m, r, tm, m, topk)
                return ix.routed_row(token, slot, topk) * inter, valid

            wg = WorkGroup(
                mma=mma, arch=arch, tile=tile, elem_bytes=eb, a_flat=af, a_rows=a_rows,
                b_flat=wf, b_base=(expert * model_dim + origin_n) * inter,
                b_rows=model_dim - origin_n, b_shuffled=quant, k=inter,
                origin=(origin_m, origin_n), k_tail=ix.has_k_tail(inter, k_block),
                lds_bytes=mx.lds_bytes(tm, tn, tile.tile_k, eb, out_bytes, mma),
            )  # fmt: skip
            accs = wg.main_loop(0, ix.stage_k_blocks(inter, k_block))

            def value_fn(wave, i, j, lane, e, acc, wg=wg, origin_m=origin_m, origin_n=origin_n,
                         entries=entries, expert=expert):  # fmt: skip
                row = wg.lane_row(i, lane, e)
                token, slot, valid = entries[row]
                col = origin_n + wg.lane_col(wave, j, lane)
                w_row = expert * model_dim + col
                y = acc
                if quant:
                    x = float(xs[ix.routed_row(token, slot, topk)]) if valid else 0.0
                    ws = float(w2s[w_row]) if col < model_dim else 0.0
                    y = _f32(_f32(y * x) * ws)
                if b2 is not None:
                    y = _f32(y + (float(b2[w_row]) if col < model_dim else 0.0))
                if apply_weight:
                    y = _f32(y * float(sorted_weights[origin_m + row]))
                return y

            block_adds: Counter = Counter()  # a block holds each token once: no add collides

            def store(row, col, values, origin_n=origin_n, entries=entries, block_adds=block_adds):
                token, slot, valid = entries[row]
                col = origin_n + col
                if not (valid and col < model_dim):
                    return
                assert col + len(values) <= model_dim  # a run never crosses model_dim
                if mode == "reduce":
                    off = ix.routed_row(token, slot, topk) * model_dim + col
                    dst_flat[off : off + len(values)] = torch.tensor(
                        values, dtype=torch.float64
                    ).float()
                    writes[off : off + len(values)] += 1
                    return
                # Packed adds: each a whole 32-bit word (an even element) of row `token`,
                # both halves added in out's dtype.
                for c in ix.atomic_pair_starts(len(values)):
                    off = token * model_dim + col + c
                    assert off % ix.ATOMIC_PAIR == 0 and col + c + ix.ATOMIC_PAIR <= model_dim
                    PACKED_ADDS[(token, (col + c) // ix.ATOMIC_PAIR)] += 1
                    block_adds[(token, col + c)] += 1
                    for h in range(ix.ATOMIC_PAIR):
                        y = values[c + h]
                        dst_flat[off + h] = round_to(float(dst_flat[off + h]) + y, dst.dtype)
                        writes[off + h] += 1

            # "atomic" stages out's dtype (the cast before the add), "reduce" fp32.
            wg.stage_and_store(accs, value_fn, dst.dtype, store)
            wg.lds.barrier()  # the kernel's end: the race check sees the staging phase
            assert max(block_adds.values(), default=0) <= 1
            _record(wg)
    if mode == "reduce":
        out_writes = emulate_topk_reduce(workspace, out, topk)
        assert torch.equal(out_writes, torch.ones_like(out_writes))  # every element once
    return writes.view(dst.shape)


def emulate_activation(workspace, bias1, routing, out, *, topk, num_experts, tile_m, activation,
                       gate_mode, doweight):  # fmt: skip
    """The activation kernel: one thread per (sorted row, column)."""
    sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids = routing
    m = out.shape[0] // topk
    inter = out.shape[1]
    num_rows = sorted_ids.numel()
    grid = ix.elementwise_grid(num_rows * inter)
    idx, row, col = ix.elementwise_index(
        torch.arange(grid)[:, None], torch.arange(ix.ELEMENTWISE_BLOCK)[None, :], inter
    )
    idx, row, col = idx.reshape(-1), row.reshape(-1), col.reshape(-1)
    live = (idx < num_rows * inter) & (row < int(num_valid_ids[0]))
    row, col = row[live], col[live]
    entries = sorted_ids[row].long()
    token, slot = ix.entry_token(entries), ix.entry_slot(entries)
    expert = sorted_expert_ids[ix.row_block(row, tile_m)].long()
    keep = ix.entry_valid(token, slot, m, topk) & ix.expert_valid(expert, num_experts)
    row, col, token, slot, expert = row[keep], col[keep], token[keep], slot[keep], expert[keep]
    routed = ix.routed_row(token, slot, topk)
    ws_flat = workspace.view(-1)
    g = ws_flat[ix.matrix_offset(routed, ix.stage1_ws_gate_col(col), 2 * inter)]
    u = ws_flat[ix.matrix_offset(routed, ix.stage1_ws_up_col(col, inter), 2 * inter)]
    if bias1 is not None:
        g = g + bias1.view(-1)[ix.expert_row(expert, ix.gate_row(col, inter, gate_mode), 2 * inter)]
        u = u + bias1.view(-1)[ix.expert_row(expert, ix.up_row(col, inter, gate_mode), 2 * inter)]
    y = ix.activate(activation, g, u, torch.exp, _tmin, _tmax)
    if doweight:
        y = y * sorted_weights[row]
    off = ix.matrix_offset(routed, col, inter)
    out.view(-1)[off] = y.to(out.dtype)
    writes = torch.zeros(out.numel(), dtype=torch.int32)
    writes.index_put_((off,), torch.ones_like(off, dtype=torch.int32), accumulate=True)
    return writes


def emulate_topk_reduce(workspace, out, topk: int):
    m, model_dim = out.shape
    grid = ix.elementwise_grid(m * model_dim)
    idx, token, col = ix.elementwise_index(
        torch.arange(grid)[:, None], torch.arange(ix.ELEMENTWISE_BLOCK)[None, :], model_dim
    )
    live = idx.reshape(-1) < m * model_dim
    idx, token, col = idx.reshape(-1)[live], token.reshape(-1)[live], col.reshape(-1)[live]
    ws_flat = workspace.view(-1)
    total = ws_flat[ix.topk_ws_offset(token, 0, col, topk, model_dim)]
    for slot in range(1, topk):
        total = total + ws_flat[ix.topk_ws_offset(token, slot, col, topk, model_dim)]
    out.view(-1)[idx] = total.to(out.dtype)
    writes = torch.zeros(out.numel(), dtype=torch.int32)
    writes.index_put_((idx,), torch.ones_like(idx, dtype=torch.int32), accumulate=True)
    return writes.view(out.shape)


def _expected_packed_adds(rows_per_token: list[int], model_dim: int) -> Counter:
    """Stage 2 "atomic": each routed row adds every column pair of its token's row once."""
    return Counter(
        {
            (token, pair): rows
            for token, rows in enumerate(rows_per_token)
            if rows
            for pair in range(model_dim // ix.ATOMIC_PAIR)
        }
    )


def _routed_pairs(topk_ids, expert_mask, num_local_tokens, num_global):
    """bool [M, topk]: the pairs some local expert computes."""
    m = topk_ids.shape[0]
    tokens = m if num_local_tokens is None else max(0, min(m, int(num_local_tokens[0])))
    local = local_experts(num_global, expert_mask)[topk_ids.long()]
    return (local >= 0) & (torch.arange(m)[:, None] < tokens)


def _make_case(idx: int) -> dict:
    rnd = random.Random(1000 + idx)
    quant = idx % 4 == 3
    experts = rnd.randint(1, 8)
    ep = idx % 3 == 1
    num_global = experts + (rnd.randint(1, 4) if ep else 0)
    topk = rnd.randint(1, min(4, num_global))
    act_dtype = rnd.choice([torch.bfloat16, torch.float16])
    dtype = (FNUZ if idx % 8 == 3 else FN) if quant else act_dtype
    return dict(
        quant=quant,
        dtype=dtype,
        act_dtype=act_dtype,
        # the lanes' K split of stage 2's tail k-block (fnuz is gfx942's, an MFMA arch)
        mma="mfma" if dtype == FNUZ else mg.MMA_FLAVOURS[(idx // 6) % 2],
        activation=ix.ACTIVATIONS[idx % 2],
        gate_mode=ix.GATE_MODES[(idx // 2) % 2],
        mode=mg.STAGE_MODES[(idx // 4) % 2],
        ksplit=(1, 2, 4)[idx % 3],
        block_m=(16, 32, 64)[(idx // 3) % 3],
        tile_n=rnd.choice([64, 128]),
        tile_k=rnd.choice([64, 128]),
        model_dim=rnd.choice([128, 256]),
        inter=rnd.choice([64, 128]),
        experts=experts,
        num_global=num_global,
        ep=ep,
        topk=topk,
        m=rnd.randint(1, 50),
        bias=rnd.random() < 0.5,
        doweight=rnd.random() < 0.5,
        local_tokens=rnd.random() < 0.25,
        seed=idx,
    )


def _tail_cases() -> list[dict]:
    """Two cases per inter of TAIL_INTERS (stage 1's N tail, stage 2's K tail), the second fp8
    where the dtype rule allows it, both stage-2 modes and both lane layouts."""
    cases = []
    for i, inter in enumerate(TAIL_INTERS):
        for j in range(2):
            case = _make_case(200 + 2 * i + j)
            quant = j == 1 and inter % ix.inter_dim_multiple(1) == 0
            dtype = (FNUZ if i % 3 == 0 else FN) if quant else case["act_dtype"]
            case.update(
                inter=inter, quant=quant, dtype=dtype, mode=mg.STAGE_MODES[(i + j) % 2],
                mma="mfma" if dtype == FNUZ else mg.MMA_FLAVOURS[j], model_dim=128,
                m=1 + case["m"] % 24,
            )  # fmt: skip
            cases.append(case)
    return cases


CASES = [_make_case(i) for i in range(40)] + _tail_cases()


def _case_id(c: dict) -> str:
    dtype = str(c["dtype"]).replace("torch.", "")
    return (
        f"{dtype}-{c['activation']}-{c['gate_mode']}-{c['mode']}-ks{c['ksplit']}-bm{c['block_m']}"
        f"-i{c['inter']}-{c['mma']}-m{c['m']}-e{c['experts']}of{c['num_global']}-k{c['topk']}"
        f"{'-bias' if c['bias'] else ''}{'-dw' if c['doweight'] else ''}"
        f"{'-nlt' if c['local_tokens'] else ''}"
    )


# The thread-by-thread emulation costs 5-15 s a case: the layer test runs the first twelve
# random cases (every option, see test_layer_cases_cover_every_option) and every third tail case.
LAYER_CASES = CASES[:12] + CASES[40::3]


@pytest.mark.parametrize("case", fast_first(LAYER_CASES, {1}, [_case_id(c) for c in LAYER_CASES]))
def test_emulated_layer_matches_the_reference(case: dict) -> None:
    gen = torch.Generator().manual_seed(case["seed"])
    m, d, inter, e, topk = (
        case["m"],
        case["model_dim"],
        case["inter"],
        case["experts"],
        case["topk"],
    )
    quant, dtype = case["quant"], case["dtype"]
    gain = 4.0 if case["activation"] == "swiglu" else 1.0  # push some g, u past the clamp
    hidden = torch.randn(m, d, generator=gen).to(case["act_dtype"])
    w1 = torch.randn(e, 2 * inter, d, generator=gen) * (gain / d**0.5)
    w2 = torch.randn(e, d, inter, generator=gen) / inter**0.5
    bias1 = torch.randn(e, 2 * inter, generator=gen) * 0.5 if case["bias"] else None
    bias2 = torch.randn(e, d, generator=gen) * 0.5 if case["bias"] else None
    scores = torch.rand(m, case["num_global"], generator=gen)
    topk_weights, topk_ids = scores.topk(topk, dim=1)
    topk_ids = topk_ids.to(torch.int32)
    expert_mask = None
    if case["ep"]:
        local = torch.randperm(case["num_global"], generator=gen)[:e]
        expert_mask = torch.zeros(case["num_global"], dtype=torch.int32)
        expert_mask[local] = 1
    num_local_tokens = None
    if case["local_tokens"]:
        num_local_tokens = torch.tensor([int(torch.randint(0, m + 1, (1,), generator=gen))])
    tile = GemmTile(case["block_m"], case["tile_n"], case["tile_k"])
    routing = moe_sorting_reference(
        topk_ids, topk_weights, case["num_global"], tile.tile_m, expert_mask, num_local_tokens
    )

    if quant:
        a, a_scale = per_token_quant(hidden, dtype)
        w1q, w1_scale = per_token_quant(w1.reshape(-1, d), dtype)
        w2q, w2_scale = per_token_quant(w2.reshape(-1, inter), dtype)
        w1q, w2q = w1q.view(e, 2 * inter, d), w2q.view(e, d, inter)
        w1_scale, w2_scale = w1_scale.view(e, 2 * inter, 1), w2_scale.view(e, d, 1)
        w1_kernel = torch.stack([shuffle_weight(w1q[i], (16, 16)) for i in range(e)])
        w2_kernel = torch.stack([shuffle_weight(w2q[i], (16, 16)) for i in range(e)])
        out1_dtype = out_dtype = hidden.dtype
        hidden_ref, w1_ref, w2_ref = hidden, w1q, w2q
    else:
        a = hidden
        a_scale = w1_scale = w2_scale = None
        w1_kernel, w2_kernel = w1.to(dtype), w2.to(dtype)
        out1_dtype = out_dtype = dtype
        hidden_ref, w1_ref, w2_ref = a, w1_kernel, w2_kernel

    out1 = torch.zeros(m * topk, inter, dtype=out1_dtype)
    ws1 = torch.zeros(mg.stage1_workspace_shape(m, topk, inter)) if case["ksplit"] > 1 else None
    writes1 = emulate_stage1(
        a.float(), w1_kernel.float().reshape(-1), a_scale, w1_scale, bias1, routing, out1, ws1,
        topk=topk, tile=tile, ksplit=case["ksplit"], activation=case["activation"],
        gate_mode=case["gate_mode"], doweight=case["doweight"], quant=quant, mma=case["mma"],
    )  # fmt: skip
    pairs = _routed_pairs(topk_ids, expert_mask, num_local_tokens, case["num_global"])
    expected_rows = pairs.reshape(-1, 1).to(torch.int32).expand(-1, inter)
    assert torch.equal(writes1, expected_rows)  # each routed row once, nothing else

    if quant:
        a2, a2_scale = per_token_quant(out1, dtype)
    else:
        a2, a2_scale = out1, None
    out = torch.zeros(m, d, dtype=out_dtype)
    ws2 = torch.zeros(mg.stage2_workspace_shape(m, topk, d)) if case["mode"] == "reduce" else None
    PACKED_ADDS.clear()
    writes2 = emulate_stage2(
        a2.float(), w2_kernel.float().reshape(-1), a2_scale, w2_scale, bias2, routing, out, ws2,
        topk=topk, tile=tile, mode=case["mode"], apply_weight=not case["doweight"], quant=quant,
        mma=case["mma"],
    )  # fmt: skip
    if case["mode"] == "reduce":
        assert torch.equal(writes2, pairs.reshape(-1, 1).to(torch.int32).expand(-1, d))
    else:
        per_token = pairs.sum(dim=1, dtype=torch.int32)
        assert torch.equal(writes2, per_token[:, None].expand(-1, d))
        # One packed add per routed row and column pair, nothing else.
        assert dict(PACKED_ADDS) == _expected_packed_adds(per_token.tolist(), d)

    ref = fused_moe_reference(
        hidden_ref, w1_ref, w2_ref, topk_weights, topk_ids, activation=case["activation"],
        gate_mode=case["gate_mode"], bias1=bias1, bias2=bias2, doweight_stage1=case["doweight"],
        expert_mask=expert_mask, num_local_tokens=num_local_tokens, w1_scale=w1_scale,
        w2_scale=w2_scale, quant=quant,
    )  # fmt: skip
    scale = float(ref.abs().max()) + 1e-6
    tol = 4e-2 if quant else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * scale)
    # Tokens routed to no local expert (or past num_local_tokens) keep zero rows.
    assert not out[~pairs.any(dim=1)].float().any()


# Bit-exact cases: small-integer operands (exact in bf16 and fp8), power-of-two scales and
# routing weights, half-integer biases, so every product and sum is exact in fp32 and the
# emulated kernels must match torch bit for bit. (stage, arch, dtype, tile, m, model_dim,
# inter, experts, topk, option: ksplit (stage 1) or mode (stage 2), activation, gate_mode,
# bias, weight).
EXACT = [
    (1, "gfx942", torch.bfloat16, (32, 64, 64), 21, 128, 64, 3, 2, 1, "silu", "separated", True, True),
    (1, "gfx950", torch.bfloat16, (16, 128, 128), 9, 256, 40, 2, 2, 1, "swiglu", "interleave", True, False),
    (1, "gfx1250", torch.float16, (16, 64, 64), 7, 128, 48, 3, 3, 2, "swiglu", "separated", True, True),
    (1, "gfx942", FNUZ, (16, 64, 128), 13, 128, 64, 2, 2, 1, "silu", "interleave", False, True),
    (1, "gfx950", FN, (32, 64, 64), 10, 192, 48, 3, 2, 3, "silu", "interleave", True, False),
    (1, "gfx1250", FN, (16, 128, 64), 6, 128, 32, 2, 1, 1, "swiglu", "separated", True, True),
    (2, "gfx942", torch.bfloat16, (32, 64, 64), 17, 128, 64, 3, 2, "atomic", "", "", True, True),
    (2, "gfx950", torch.bfloat16, (16, 64, 128), 9, 64, 40, 2, 2, "reduce", "", "", True, False),
    (2, "gfx1250", torch.float16, (16, 128, 64), 8, 128, 56, 3, 3, "atomic", "", "", False, True),
    (2, "gfx942", FNUZ, (32, 64, 128), 11, 128, 80, 2, 2, "reduce", "", "", True, True),
    (2, "gfx950", FN, (16, 64, 64), 7, 64, 48, 3, 2, "atomic", "", "", True, False),
    (2, "gfx1250", FN, (16, 64, 128), 5, 128, 64, 2, 2, "reduce", "", "", False, True),
]  # fmt: skip


def _small_ints(gen, shape, dtype):
    return torch.randint(-3, 4, shape, generator=gen).to(dtype)


def _pow2(gen, shape):
    return torch.exp2(torch.randint(-2, 2, shape, generator=gen).float())


def _exact_routing(gen, m, experts, topk, tile_m):
    scores = torch.rand(m, experts, generator=gen)
    _, topk_ids = scores.topk(topk, dim=1)
    topk_weights = _pow2(gen, (m, topk))
    return moe_sorting_reference(topk_ids.to(torch.int32), topk_weights, experts, tile_m)


def _stage1_exact_reference(x, w1, xs, w1s, bias1, routing, m, topk, inter, gate_mode,
                            activation, doweight, ksplit, quant, out_dtype, tile_m):  # fmt: skip
    """torch: per routed sorted row, h = x[token] @ w1[e]^T (exact), scaled, biased (ksplit 1),
    gate/up split; ksplit 1: act (the shared scalar formula) * weight cast to out; ksplit > 1:
    the fp32 workspace of (unbiased) partial sums."""
    sorted_ids, sorted_weights, sorted_expert_ids, num_valid = routing
    out = torch.zeros(m * topk, inter, dtype=out_dtype)
    ws = torch.zeros(m * topk, 2 * inter)
    for row in range(int(num_valid[0])):
        entry = int(sorted_ids[row])
        token, slot = ix.entry_token(entry), ix.entry_slot(entry)
        e = int(sorted_expert_ids[row // tile_m])
        if not (ix.entry_valid(token, slot, m, topk) and 0 <= e < w1.shape[0]):
            continue
        h = (x[token].double() @ w1[e].double().T).float()
        if quant:
            h = h * xs[token, 0] * w1s[e, :, 0]
        g_rows = torch.tensor([ix.gate_row(n, inter, gate_mode) for n in range(inter)])
        u_rows = torch.tensor([ix.up_row(n, inter, gate_mode) for n in range(inter)])
        routed = ix.routed_row(token, slot, topk)
        if ksplit > 1:
            ws[routed, :inter], ws[routed, inter:] = h[g_rows], h[u_rows]
            continue
        if bias1 is not None:
            h = h + bias1[e]
        g, u = h[g_rows].tolist(), h[u_rows].tolist()
        y = [_act32(activation, gv, uv) for gv, uv in zip(g, u, strict=True)]
        y = torch.tensor(y, dtype=torch.float32)
        if doweight:
            y = y * sorted_weights[row]
        out[routed] = y.to(out_dtype)
    return out, ws


def _stage2_exact_reference(a2, w2, xs, w2s, bias2, routing, m, topk, model_dim, mode,
                            apply_weight, quant, out_dtype, tile_m):  # fmt: skip
    """torch: per routed sorted row (in sorted order), z = a2[routed] @ w2[e]^T (exact), scaled,
    biased, weighted; "atomic": cast to out's dtype and added in it, in sorted-row order (the
    kernels' block order); "reduce": the fp32 rows summed per token over its slots, cast."""
    sorted_ids, sorted_weights, sorted_expert_ids, num_valid = routing
    out = torch.zeros(m, model_dim, dtype=out_dtype)
    ws = torch.zeros(m * topk, model_dim)
    for row in range(int(num_valid[0])):
        entry = int(sorted_ids[row])
        token, slot = ix.entry_token(entry), ix.entry_slot(entry)
        e = int(sorted_expert_ids[row // tile_m])
        if not (ix.entry_valid(token, slot, m, topk) and 0 <= e < w2.shape[0]):
            continue
        routed = ix.routed_row(token, slot, topk)
        z = (a2[routed].double() @ w2[e].double().T).float()
        if quant:
            z = z * xs[routed, 0] * w2s[e, :, 0]
        if bias2 is not None:
            z = z + bias2[e]
        if apply_weight:
            z = z * sorted_weights[row]
        if mode == "atomic":
            out[token] = (out[token].float() + z.to(out_dtype).float()).to(out_dtype)
        else:
            ws[routed] = z
    if mode == "reduce":
        out = ws.view(m, topk, model_dim).sum(1).to(out_dtype)
    return out, ws


@pytest.mark.parametrize(
    ("stage", "arch", "dtype", "tile", "m", "d", "inter", "e", "topk", "option", "activation",
     "gate_mode", "bias", "weight"), fast_first(EXACT, 1),
)  # fmt: skip
def test_emulated_work_groups_are_bit_exact(stage, arch, dtype, tile, m, d, inter, e, topk,
                                            option, activation, gate_mode, bias, weight):  # fmt: skip
    """Each stage's work-groups emulated thread by thread, phase by phase (the shared main loop
    plus the stages' prologue and epilogue) match torch bit for bit on exact data, write every
    routed element once, race nowhere in LDS, and copy and read A without bank conflicts."""
    gen = torch.Generator().manual_seed(stage * 100 + m + d + inter)
    quant = dtype in FP8_DTYPES_ALL
    mma = "wmma" if arch == "gfx1250" else "mfma"
    tile = GemmTile(*tile)
    routing = _exact_routing(gen, m, e, topk, tile.tile_m)
    out_dtype = torch.bfloat16 if quant else dtype
    RACES.clear()
    STATS.clear()
    PACKED_ADDS.clear()
    if stage == 1:
        x = _small_ints(gen, (m, d), dtype)
        w1 = _small_ints(gen, (e, 2 * inter, d), dtype)
        xs = _pow2(gen, (m, 1)) if quant else None
        w1s = _pow2(gen, (e, 2 * inter, 1)) if quant else None
        bias1 = torch.randint(-4, 5, (e, 2 * inter), generator=gen) / 2 if bias else None
        w_kernel = torch.stack([shuffle_weight(w1[i], (16, 16)) for i in range(e)]) if quant else w1
        out = torch.zeros(m * topk, inter, dtype=out_dtype)
        ws = torch.zeros(mg.stage1_workspace_shape(m, topk, inter)) if option > 1 else None
        writes = emulate_stage1(
            x.float(), w_kernel.float().reshape(-1), xs, w1s, bias1, routing, out, ws, topk=topk,
            tile=tile, ksplit=option, activation=activation, gate_mode=gate_mode,
            doweight=weight, quant=quant, mma=mma, arch=arch,
        )  # fmt: skip
        ref_out, ref_ws = _stage1_exact_reference(
            x, w1, xs, w1s, bias1, routing, m, topk, inter, gate_mode, activation, weight, option,
            quant, out_dtype, tile.tile_m,
        )  # fmt: skip
        if option > 1:
            assert torch.equal(ws, ref_ws)  # the exact partial sums
            # the activation kernel then finishes both alike
            ref_out = torch.zeros_like(out)
            emulate_activation(ref_ws, bias1, routing, ref_out, topk=topk, num_experts=e,
                               tile_m=tile.tile_m, activation=activation, gate_mode=gate_mode,
                               doweight=weight)  # fmt: skip
        assert torch.equal(out, ref_out)
    else:
        a2 = _small_ints(gen, (m * topk, inter), dtype)
        w2 = _small_ints(gen, (e, d, inter), dtype)
        xs = _pow2(gen, (m * topk, 1)) if quant else None
        w2s = _pow2(gen, (e, d, 1)) if quant else None
        bias2 = torch.randint(-4, 5, (e, d), generator=gen) / 2 if bias else None
        w_kernel = torch.stack([shuffle_weight(w2[i], (16, 16)) for i in range(e)]) if quant else w2
        out = torch.zeros(m, d, dtype=out_dtype)
        ws = torch.zeros(mg.stage2_workspace_shape(m, topk, d)) if option == "reduce" else None
        writes = emulate_stage2(
            a2.float(), w_kernel.float().reshape(-1), xs, w2s, bias2, routing, out, ws,
            topk=topk, tile=tile, mode=option, apply_weight=weight, quant=quant, mma=mma,
            arch=arch,
        )  # fmt: skip
        ref_out, ref_ws = _stage2_exact_reference(
            a2, w2, xs, w2s, bias2, routing, m, topk, d, option, weight, quant, out_dtype,
            tile.tile_m,
        )  # fmt: skip
        if option == "reduce":
            assert torch.equal(ws, ref_ws)
        else:
            entries = routing[0][: int(routing[3][0])].long()
            token, slot = ix.entry_token(entries), ix.entry_slot(entries)
            routed_tokens = token[ix.entry_valid(token, slot, m, topk)]
            per_token = torch.bincount(routed_tokens, minlength=m).to(torch.int32)
            assert torch.equal(writes, per_token[:, None].expand(-1, d))
            assert dict(PACKED_ADDS) == _expected_packed_adds(per_token.tolist(), d)
        assert torch.equal(out, ref_out)
    routed = int((routing[0][: int(routing[3][0])] & 0xFFFFFF < m).sum())
    assert int(writes.sum()) == routed * (inter if stage == 1 else d)
    assert int(writes.max()) == 1 or (stage == 2 and option == "atomic")
    print(f"stage {stage} {arch} {tile}: {conflict_summary(STATS)}")
    assert RACES == []
    for kind in ("A write", "A read"):
        assert STATS[kind].extra_cycles == 0, conflict_summary(STATS)


def test_cases_cover_every_option() -> None:
    seen = {key: {str(c[key]) for c in CASES} for key in CASES[0] if key != "seed"}
    assert seen["activation"] == set(ix.ACTIVATIONS)
    assert seen["gate_mode"] == set(ix.GATE_MODES)
    assert seen["mode"] == set(mg.STAGE_MODES)
    assert seen["ksplit"] == {"1", "2", "4"}
    assert seen["block_m"] == {"16", "32", "64"}
    for key in ("quant", "bias", "doweight", "ep", "local_tokens"):
        assert seen[key] == {"True", "False"}, key
    assert {"torch.float8_e4m3fnuz", "torch.float8_e4m3fn", "torch.bfloat16"} <= seen["dtype"]
    # fp8 meets both split paths, both stage-2 modes and both unquantized dtypes.
    fp8 = [c for c in CASES if c["quant"]]
    assert {c["ksplit"] > 1 for c in fp8} == {True, False}
    assert {c["mode"] for c in fp8} == set(mg.STAGE_MODES)
    assert {c["act_dtype"] for c in fp8} == {torch.bfloat16, torch.float16}
    assert seen["mma"] == set(mg.MMA_FLAVOURS)
    # Every tail inter, fp8 wherever its rule allows, both modes and lane layouts.
    tails = [c for c in CASES if c["inter"] in TAIL_INTERS]
    assert {c["inter"] for c in tails} == set(TAIL_INTERS)
    assert {c["inter"] for c in tails if c["quant"]} == {
        i for i in TAIL_INTERS if i % ix.inter_dim_multiple(1) == 0
    }
    assert {(c["mode"], c["mma"]) for c in tails} == {
        (mode, mma) for mode in mg.STAGE_MODES for mma in mg.MMA_FLAVOURS
    }


def test_layer_cases_cover_every_option() -> None:
    seen = {key: {str(c[key]) for c in LAYER_CASES} for key in LAYER_CASES[0] if key != "seed"}
    assert seen["activation"] == set(ix.ACTIVATIONS)
    assert seen["gate_mode"] == set(ix.GATE_MODES)
    assert seen["mode"] == set(mg.STAGE_MODES)
    assert seen["ksplit"] == {"1", "2", "4"}
    assert seen["block_m"] == {"16", "32", "64"}
    assert seen["mma"] == set(mg.MMA_FLAVOURS)
    for key in ("quant", "bias", "doweight", "ep"):
        assert seen[key] == {"True", "False"}, key
    assert {c["inter"] for c in LAYER_CASES if c["inter"] % 32}  # K tails run


def test_reference_skips_non_local_experts_and_tokens() -> None:
    """Hand-checked: with expert 1 of 2 local and one local token, only that pair counts."""
    hidden = torch.tensor([[1.0] * 64, [2.0] * 64])
    w1 = torch.zeros(1, 128, 64)
    w1[0, :64] = 0.01  # gate
    w1[0, 64:] = 0.02  # up
    w2 = torch.ones(1, 64, 64) * 0.5
    ids = torch.tensor([[1, 0], [1, 0]])
    weights = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    out = fused_moe_reference(
        hidden, w1, w2, weights, ids, activation="silu", gate_mode="separated",
        expert_mask=torch.tensor([0, 1]), num_local_tokens=1,
    )  # fmt: skip
    g, u = torch.tensor(0.64), torch.tensor(1.28)
    y = torch.nn.functional.silu(g) * u * 64 * 0.5 * 0.25
    torch.testing.assert_close(out[0], y.expand(64))
    assert torch.equal(out[1], torch.zeros(64))


# --- host entry --------------------------------------------------------------------------


def _stage1_args(quant=False, m=5, d=128, inter=64, e=2, topk=2, tile_m=16):
    dtype = FNUZ if quant else torch.bfloat16
    p, blocks = sorting_sizes(m, topk, e, tile_m)
    args = dict(
        a=torch.empty(m, d, dtype=dtype),
        w1=torch.empty(e, 2 * inter, d, dtype=dtype),
        sorted_ids=torch.empty(p, dtype=torch.int32),
        sorted_weights=torch.empty(p),
        sorted_expert_ids=torch.empty(blocks, dtype=torch.int32),
        num_valid_ids=torch.empty(2, dtype=torch.int32),
        out=torch.empty(m * topk, inter, dtype=torch.bfloat16),
    )
    kwargs = dict(topk=topk, tile=GemmTile(tile_m, 64, 64), ksplit=1, activation="silu",
                  gate_mode="separated", doweight=False, mma="mfma")  # fmt: skip
    if quant:
        kwargs.update(a_scale=torch.empty(m, 1), w1_scale=torch.empty(e, 2 * inter, 1))
    return args, kwargs


def _stage2_args(quant=False, m=5, d=128, inter=64, e=2, topk=2, tile_m=16):
    args, _ = _stage1_args(quant, m, d, inter, e, topk, tile_m)
    dtype = args["a"].dtype
    args = dict(
        a2=torch.empty(m * topk, inter, dtype=dtype),
        w2=torch.empty(e, d, inter, dtype=dtype),
        sorted_ids=args["sorted_ids"],
        sorted_weights=args["sorted_weights"],
        sorted_expert_ids=args["sorted_expert_ids"],
        num_valid_ids=args["num_valid_ids"],
        out=torch.empty(m, d, dtype=torch.bfloat16),
    )
    kwargs = dict(topk=topk, tile=GemmTile(tile_m, 64, 64), mode="atomic", apply_weight=True,
                  mma="mfma")  # fmt: skip
    if quant:
        kwargs.update(a2_scale=torch.empty(m * topk, 1), w2_scale=torch.empty(e, d, 1))
    return args, kwargs


STAGE1_BAD = [
    # (quant, replaced arguments, message); every case fails before any compile
    (False, dict(mma="xdl"), "mma: expected one of"),
    (False, dict(tile=GemmTile(128, 64, 64)), "tile: .* not supported"),
    (False, dict(tile=GemmTile(16, 64, 32)), "tile: .* not supported"),
    (False, dict(ksplit=0), "ksplit: expected an int >= 1"),
    (False, dict(ksplit=2), "workspace: expected a zeroed float32 \\[10, 128\\]"),
    (False, dict(ksplit=2, workspace=torch.empty(10, 64)), "workspace: expected shape"),
    (False, dict(topk=0), "topk: expected an int in"),
    (False, dict(activation="gelu"), "activation: expected one of"),
    (False, dict(gate_mode="mixed"), "gate_mode: expected one of"),
    (False, dict(doweight=1), "doweight: expected a bool"),
    (False, dict(a=torch.empty(5, 96, dtype=torch.bfloat16)), "a: model_dim .* multiple of 64"),
    (False, dict(a=torch.empty(5, 128, dtype=torch.float32)), "a: expected dtype in"),
    (False, dict(a=torch.empty(128, 5, dtype=torch.bfloat16).T), "a: expected a contiguous"),
    (
        False,
        dict(a=torch.empty(5, 256, dtype=torch.bfloat16).narrow(1, 0, 128)),
        "a: expected a contiguous",
    ),
    (
        False,
        dict(w1=torch.empty(2, 128, 128, dtype=torch.float16)),
        "w1: expected dtype torch.bfloat16",
    ),
    (
        False,
        dict(w1=torch.empty(2, 92, 128, dtype=torch.bfloat16)),
        "w1: inter = w1.shape.1. / 2 must be a positive multiple of 8 for torch.bfloat16 inputs, "
        "got 46",
    ),
    (True, dict(w1=torch.empty(2, 48, 128, dtype=FNUZ)), "w1: inter .* multiple of 16 for"),
    (False, dict(w1=torch.empty(2, 128, 64, dtype=torch.bfloat16)), "w1: expected shape"),
    (False, dict(w1=torch.empty(128, 128, dtype=torch.bfloat16)), "w1: expected a 3-D"),
    (
        False,
        dict(out=torch.empty(10, 64, dtype=torch.float16)),
        "out: expected dtype torch.bfloat16, got",
    ),
    (False, dict(out=torch.empty(5, 64, dtype=torch.bfloat16)), "out: expected shape \\[10, 64\\]"),
    (False, dict(sorted_ids=torch.empty(40, dtype=torch.int64)), "sorted_ids: expected dtype"),
    (False, dict(sorted_weights=torch.empty(41)), "sorted_weights: expected shape \\[40\\]"),
    (
        False,
        dict(sorted_expert_ids=torch.empty(3, 1, dtype=torch.int32)),
        "sorted_expert_ids: expected a 1-D",
    ),
    (False, dict(num_valid_ids=torch.empty(1, dtype=torch.int32)), "num_valid_ids: expected shape"),
    (False, dict(bias1=torch.empty(2, 128, dtype=torch.bfloat16)), "bias1: expected dtype"),
    (False, dict(bias1=torch.empty(2, 64)), "bias1: expected shape"),
    (False, dict(a_scale=torch.empty(5, 1)), "a_scale: expected None"),
    (True, dict(a_scale=None), "a_scale: expected a float32 \\[5, 1\\]"),
    (True, dict(w1_scale=torch.empty(2, 128)), "w1_scale: expected shape \\[2, 128, 1\\]"),
    (True, dict(out=torch.empty(10, 64)), "out: expected dtype"),
    (True, dict(w1=torch.empty(2, 128, 128, dtype=FN)), "w1: expected dtype torch.float8_e4m3fnuz"),
    (True, dict(mma="wmma"), "a: mma='wmma' .* takes float8_e4m3fn"),
]


@pytest.mark.parametrize(("quant", "change", "message"), STAGE1_BAD)
def test_stage1_rejects_bad_arguments(quant, change, message) -> None:
    args, kwargs = _stage1_args(quant)
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(ValueError, match=message):
        mg.launch_moe_stage1(*args.values(), **kwargs)


STAGE2_BAD = [
    (False, dict(mode="sum"), "mode: expected one of"),
    (False, dict(mode="reduce"), "workspace: expected a zeroed float32 \\[10, 128\\]"),
    (
        False,
        dict(mode="reduce", workspace=torch.empty(10, 128, dtype=torch.bfloat16)),
        "workspace: expected dtype",
    ),
    (False, dict(apply_weight=None), "apply_weight: expected a bool"),
    (False, dict(topk=3), "a2: expected 5 \\* 3 = 15 rows"),
    (False, dict(tile=GemmTile(16, 96, 64)), "tile: .* not supported"),
    (False, dict(a2=torch.empty(10, 100, dtype=torch.bfloat16)), "a2: inter .* multiple of 8 "),
    (True, dict(a2=torch.empty(10, 24, dtype=FNUZ)), "a2: inter .* multiple of 16 for"),
    (False, dict(w2=torch.empty(2, 128, 128, dtype=torch.bfloat16)), "w2: expected shape"),
    (
        False,
        dict(w2=torch.empty(2, 80, 64, dtype=torch.bfloat16)),
        "w2: model_dim .* multiple of 64",
    ),
    (False, dict(out=torch.empty(5, 128)), "out: expected dtype in"),
    (False, dict(out=torch.empty(5, 64, dtype=torch.bfloat16)), "out: expected shape \\[5, 128\\]"),
    (False, dict(bias2=torch.empty(2, 64)), "bias2: expected shape \\[2, 128\\]"),
    (False, dict(w2_scale=torch.empty(2, 128, 1)), "w2_scale: expected None"),
    (True, dict(a2_scale=torch.empty(5, 1)), "a2_scale: expected shape \\[10, 1\\]"),
    (True, dict(w2_scale=None), "w2_scale: expected a float32 \\[2, 128, 1\\]"),
    (True, dict(w2=torch.empty(2, 128, 64, dtype=torch.bfloat16)), "w2: expected dtype"),
]


@pytest.mark.parametrize(("quant", "change", "message"), STAGE2_BAD)
def test_stage2_rejects_bad_arguments(quant, change, message) -> None:
    args, kwargs = _stage2_args(quant)
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(ValueError, match=message):
        mg.launch_moe_stage2(*args.values(), **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", mg.STAGE_MODES)
def test_layer_numerics_on_gpu(mode: str) -> None:
    torch.manual_seed(0)
    m, d, inter, e, topk, tile = 33, 256, 128, 4, 2, GemmTile(32, 64, 64)
    hidden = torch.randn(m, d, dtype=torch.bfloat16)
    w1 = torch.randn(e, 2 * inter, d, dtype=torch.bfloat16) / d**0.5
    w2 = torch.randn(e, d, inter, dtype=torch.bfloat16) / inter**0.5
    topk_weights, topk_ids = torch.rand(m, e).topk(topk, dim=1)
    routing = moe_sorting_reference(topk_ids.to(torch.int32), topk_weights, e, tile.tile_m)
    cuda = [t.cuda() for t in routing]
    mma = "wmma" if "gfx1250" in torch.cuda.get_device_properties(0).gcnArchName else "mfma"
    out1 = torch.zeros(m * topk, inter, dtype=torch.bfloat16, device="cuda")
    mg.launch_moe_stage1(hidden.cuda(), w1.cuda(), *cuda, out1, topk=topk, tile=tile, ksplit=1,
                         activation="silu", gate_mode="separated", doweight=False, mma=mma)  # fmt: skip
    out = torch.zeros(m, d, dtype=torch.bfloat16, device="cuda")
    ws = torch.zeros(m * topk, d, device="cuda") if mode == "reduce" else None
    mg.launch_moe_stage2(out1, w2.cuda(), *cuda, out, topk=topk, tile=tile, mode=mode,
                         apply_weight=True, mma=mma, workspace=ws)  # fmt: skip
    ref = fused_moe_reference(hidden, w1, w2, topk_weights, topk_ids, activation="silu",
                              gate_mode="separated")  # fmt: skip
    torch.testing.assert_close(out.float().cpu(), ref, rtol=3e-2, atol=3e-2)


# --- compilation per arch ----------------------------------------------------------------

ARCH_MMA = {"gfx942": ("mfma", "float8_e4m3fnuz"), "gfx950": ("mfma", "float8_e4m3fn"),
            "gfx1250": ("wmma", "float8_e4m3fn")}  # fmt: skip
# stage, fp8, tile, ksplit (stage 1) or mode (stage 2), inter, out dtype. Stage 1: ksplit 1 is
# silu/separated with bias, ksplit 2 swiglu/interleave with bias and doweight; stage 2: atomic
# with bias and weight, reduce without. The child launches the odd configs on FakeTensors.
# Configs 4-6 are gpt-oss-120b shards: column tiles past inter (stage 1) and stage 2's K tail;
# the last adds fp16 rows (bf16 inputs: the MMA is the bf16 one).
COMPILED = [
    (1, False, (32, 64, 64), 1, 128, "bfloat16"),
    (1, True, (16, 128, 128), 2, 128, "bfloat16"),
    (2, False, (64, 128, 64), "atomic", 128, "bfloat16"),
    (2, True, (32, 64, 128), "reduce", 128, "bfloat16"),
    (1, False, (16, 128, 64), 1, 360, "bfloat16"),
    (2, False, (16, 64, 64), "atomic", 360, "bfloat16"),
    (2, True, (32, 128, 128), "atomic", 720, "bfloat16"),
    (2, False, (32, 128, 64), "atomic", 128, "float16"),
]
# The jit functions (cache directory prefixes) each config compiles.
JIT_NAMES = {
    0: ["moe_stage1"],
    1: ["moe_stage1", "moe_stage1_activation"],
    2: ["moe_stage2"],
    3: ["moe_stage2", "moe_topk_reduce"],
    4: ["moe_stage1"],
    5: ["moe_stage2"],
    6: ["moe_stage2"],
    7: ["moe_stage2"],
}
# The packed atomic add stage 2's "atomic" mode issues, by out dtype (every arch has both).
PACKED_ATOMIC = {"bfloat16": "global_atomic_pk_add_bf16", "float16": "global_atomic_pk_add_f16"}
MNEMONIC = {
    ("gfx942", False): "v_mfma_f32_16x16x16_bf16",
    ("gfx950", False): "v_mfma_f32_16x16x32_bf16",
    ("gfx942", True): "v_mfma_f32_16x16x32_fp8_fp8",
    ("gfx950", True): "v_mfma_scale_f32_16x16x128_f8f6f4",  # every fp8 config: tile_k 128
    ("gfx1250", False): "v_wmma_f32_16x16x32_bf16",
    ("gfx1250", True): "v_wmma_f32_16x16x64_fp8_fp8",
}

_CHILD = """
import contextlib, json, shutil, sys, time
from pathlib import Path
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from aiter.ops.moe.kernels import stages as mg
from aiter.ops.moe.kernels.sorting_index import sorting_sizes
from aiter.ops.shared.tiles import GemmTile

mma, fp8 = sys.argv[1], getattr(torch, sys.argv[2])
configs, cache = json.loads(sys.argv[3]), Path(sys.argv[4])
dump = Path(sys.argv[5]) if sys.argv[5] else None
keep = Path(sys.argv[6])
m, d, e, topk = 37, 256, 4, 2
results = []
for idx, (stage, quant, tile, option, inter, out_name) in enumerate(configs):
    # Even configs launch on CPU tensors, odd ones on FakeTensors on "cuda" (the AOT builder's).
    fake = idx % 2 == 1
    device = "cuda" if fake else "cpu"
    def empty(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device=device)
    dtype = fp8 if quant else torch.bfloat16
    tile = GemmTile(*tile)
    p, blocks = sorting_sizes(m, topk, e, tile.tile_m)
    if dump is not None:
        shutil.rmtree(dump, ignore_errors=True)
    before = set(cache.glob("*/*.pkl"))
    start = time.perf_counter()
    with FakeTensorMode() if fake else contextlib.nullcontext():
        routing = (empty(p, dtype=torch.int32), empty(p), empty(blocks, dtype=torch.int32),
                   empty(2, dtype=torch.int32))
        if stage == 1:
            scales = dict(a_scale=empty(m, 1), w1_scale=empty(e, 2 * inter, 1)) if quant else {}
            mg.launch_moe_stage1(
                empty(m, d, dtype=dtype), empty(e, 2 * inter, d, dtype=dtype), *routing,
                empty(m * topk, inter, dtype=torch.bfloat16), topk=topk, tile=tile, ksplit=option,
                activation="silu" if option == 1 else "swiglu",
                gate_mode="separated" if option == 1 else "interleave", doweight=option > 1,
                mma=mma, bias1=empty(e, 2 * inter),
                workspace=empty(m * topk, 2 * inter) if option > 1 else None, **scales)
        else:
            scales = dict(a2_scale=empty(m * topk, 1), w2_scale=empty(e, d, 1)) if quant else {}
            mg.launch_moe_stage2(
                empty(m * topk, inter, dtype=dtype), empty(e, d, inter, dtype=dtype), *routing,
                empty(m, d, dtype=getattr(torch, out_name)), topk=topk, tile=tile, mode=option,
                apply_weight=option == "atomic", mma=mma,
                bias2=empty(e, d) if option == "atomic" else None,
                workspace=empty(m * topk, d) if option == "reduce" else None, **scales)
    result = {"seconds": time.perf_counter() - start}
    result["entries"] = sorted(str(p) for p in set(cache.glob("*/*.pkl")) - before)
    if dump is not None:
        result["isa"] = {}
        for listing in sorted(dump.glob("*/*final_isa.s")):
            kernel = listing.parent.name.rsplit("_", 1)[0]
            target = keep / f"{idx}_{kernel}.s"
            target.write_text(listing.read_text())
            result["isa"][kernel] = str(target)
    results.append(result)
print(json.dumps(results))
"""


def _compile_child(arch: str, rocm_path: str, root: Path, dump: bool) -> list[dict]:
    """Compile COMPILED for one arch in a child process (one arch per process; an LLVM abort
    kills the child, not pytest). FlyDSL skips its disk cache while it dumps ISA, hence `dump`."""
    cache, keep = root / "cache", root / "isa"
    keep.mkdir(parents=True)
    mma, fp8 = ARCH_MMA[arch]
    env = compile_env(arch, rocm_path, cache, dump=root / "dump" if dump else None)
    args = [
        mma,
        fp8,
        json.dumps(COMPILED),
        str(cache),
        str(root / "dump") if dump else "",
        str(keep),
    ]
    child = run_child(_CHILD, args, env)
    assert child.returncode == 0, (
        f"{arch}: compile process exited with {child.returncode}"
        f" (negative: killed by signal)\n{child.stderr[-4000:]}"
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=list(ARCH_MMA))
def compiled(request, rocm_path: str, tmp_path_factory) -> dict:
    """The cache entries each config of COMPILED wrote for one arch."""
    arch = request.param
    results = _compile_child(arch, rocm_path, tmp_path_factory.mktemp(f"moe_{arch}"), dump=False)
    return {"arch": arch, "results": results}


@pytest.fixture(scope="module", params=list(ARCH_MMA))
def listed(request, rocm_path: str, tmp_path_factory) -> dict:
    """FlyDSL's ISA listing of every kernel of COMPILED for one arch."""
    arch = request.param
    root = tmp_path_factory.mktemp(f"moe_isa_{arch}")
    return {"arch": arch, "results": _compile_child(arch, rocm_path, root, dump=True)}


@pytest.mark.slow
def test_one_cache_entry_per_kernel(compiled: dict) -> None:
    results = compiled["results"]
    print(f"{compiled['arch']} compile seconds: {[round(r['seconds'], 2) for r in results]}")
    for idx, result in enumerate(results):
        names = sorted(Path(p).parent.name.rsplit("_", 1)[0] for p in result["entries"])
        assert names == JIT_NAMES[idx], (COMPILED[idx], result["entries"])


@pytest.mark.slow
def test_code_objects_target_the_arch(compiled: dict) -> None:
    from aiter.flydsl_bridge import elf, extract_code_objects

    for result in compiled["results"]:
        for entry in result["entries"]:
            codes = extract_code_objects(entry)
            assert len(codes) == 1, entry
            header = elf.parse_header(codes[0])
            assert header.e_machine == 224, entry
            assert header.e_flags & 0xFF == elf.ARCH_TO_MACH[compiled["arch"]], entry


@pytest.mark.slow
def test_disassembly_uses_the_arch_mma(compiled: dict) -> None:
    """llvm-objdump finds the MMA in the GEMM kernels' code objects, on every arch."""
    from aiter.flydsl_bridge import extract_code_objects

    arch = compiled["arch"]
    mma = ARCH_MMA[arch][0]
    other = "v_wmma" if mma == "mfma" else "v_mfma"
    for (stage, quant, *_), result in zip(COMPILED, compiled["results"], strict=True):
        for entry in result["entries"]:
            text = disassemble_or_skip(extract_code_objects(entry)[0], arch)
            is_gemm = Path(entry).parent.name.rsplit("_", 1)[0] == f"moe_stage{stage}"
            assert (MNEMONIC[(arch, quant)] in text) == is_gemm, entry
            assert other not in text, entry


@pytest.mark.slow
def test_isa_listing(listed: dict) -> None:
    """FlyDSL's ISA listing of every kernel: the arch and wave size, the MMA of the GEMM
    kernels, the exponential of the activation, and atomics exactly where the design has them:
    stage 2's "atomic" mode adds only through the packed bf16/fp16 atomic of its out dtype (no
    compare-and-swap loop), and only where the arch has it."""
    arch = listed["arch"]
    mma, _ = ARCH_MMA[arch]
    wave = mx.WAVE_SIZE[mma]
    for idx, ((stage, quant, _, option, _, out_name), result) in enumerate(
        zip(COMPILED, listed["results"], strict=True)
    ):
        kernels = {name.removesuffix("_kernel"): path for name, path in result["isa"].items()}
        assert sorted(kernels) == JIT_NAMES[idx], result["isa"]
        for name, path in kernels.items():
            text = Path(path).read_text()
            assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text, name
            assert f".wavefront_size: {wave}" in text, name
            is_gemm = name == f"moe_stage{stage}"
            assert (MNEMONIC[(arch, quant)] in text) == is_gemm, (idx, name)
            assert ("v_wmma" if mma == "mfma" else "v_mfma") not in text, (idx, name)
            activates = name == "moe_stage1_activation" or (name == "moe_stage1" and option == 1)
            assert ("v_exp_f32" in text) == activates, (idx, name)
            if name == "moe_stage2":  # operand runs and tail chunks: 16-byte loads only
                narrow = re.findall(
                    r"global_load_(?:[us]byte|[us]short|dwordx2|[bui]8|[bui]16|b64)\b", text
                )
                assert not narrow, (idx, name, sorted(set(narrow)))
            atomics = re.findall(r"global_atomic_\w+", text)
            wants_atomics = (name == "moe_stage1" and option != 1) or option == "atomic"
            assert bool(atomics) == wants_atomics, (idx, name, sorted(set(atomics)))
            if name == "moe_stage2":
                assert "cmpswap" not in text, (idx, sorted(set(atomics)))
            if name == "moe_stage2" and option == "atomic":
                assert out_name in (str(t).removeprefix("torch.") for t in
                                    mg.PACKED_ATOMIC_DTYPES[arch]), (idx, arch)  # fmt: skip
                assert set(atomics) == {PACKED_ATOMIC[out_name]}, (idx, sorted(set(atomics)))
                # Per lane: every staged 16-byte run of its tile_m rows, one add per word.
                tile_m, tile_n, _ = COMPILED[idx][2]
                runs = tile_m // mx.MMA_MN * mx.out_store_passes(tile_n, 2, mma)
                assert len(atomics) == runs * mx.CHUNK_BYTES // 4, (idx, len(atomics))
