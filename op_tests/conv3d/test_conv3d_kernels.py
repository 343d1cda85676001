"""Tests of the conv3d implicit-GEMM FlyDSL kernels without a GPU: their index math; the conv
kernel replayed work-group by work-group, phase by phase, on the shared main-loop emulator
(op_tests/shared/mainloop_emulation.py) with the kernel's own index functions (bit-exact against
torch.nn.functional.conv3d, no LDS race, bank conflicts counted); the split-K epilogue and
pre-transpose emulated on CPU; the weight packing and torch fallbacks (FakeTensors included), the
launchers' argument checks, and compilation per arch."""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.conv3d.kernels import implicit_gemm as cv
from aiter.ops.conv3d.kernels import implicit_gemm_index as ix
from aiter.ops.shared import mainloop_index as mx
from op_tests.compile_child import LIST_THEN_BUILD, compile_env, disassemble_or_skip, run_child
from op_tests.shared.mainloop_emulation import (
    AccessStats,
    WorkGroup,
    _buffer_load,
    conflict_summary,
    fast_first,
    round_to,
)


def _pick(cond, a, b):
    """What the kernels' `cond.select(a, b)` computes, on Python ints."""
    return a if cond else b


def _where(cond, a, b):
    """What the kernels' `cond.select(a, b)` computes, on torch tensors."""
    return torch.where(cond, torch.as_tensor(a), torch.as_tensor(b))


INPUT_DTYPES = (torch.bfloat16, torch.float16)


# --- pure index math ---------------------------------------------------------------------


def test_constants() -> None:
    assert cv.CHANNEL_VECTOR == ix.CHANNEL_VECTOR == 16
    assert cv.K_STEP == ix.K_STEP == ix.TILE_K == 64 and ix.TILE_K % ix.K_BLOCK == 0
    assert ix.K_BLOCK == mx.k_block(2) == 32
    assert cv.LAYOUTS == ("NCDHW", "NDHWC")
    assert cv.MMA_FLAVOURS == ("mfma", "wmma")
    assert cv.WORKSPACE_DTYPE is torch.float32
    assert cv.INPUT_DTYPES == INPUT_DTYPES
    # A copied chunk (8 elements) and a lane's MMA run (8 or 16) start at multiples of their
    # length, so with Cgp a multiple of 16 none crosses a tap.
    for mma in cv.MMA_FLAVOURS:
        assert ix.CHANNEL_VECTOR % mx.lane_run(mma) == 0
    assert ix.CHANNEL_VECTOR % (mx.CHUNK_BYTES // 2) == 0
    # Every thread copies the same chunk of its rows in every pass (the tap math is shared).
    for mma in cv.MMA_FLAVOURS:
        for tile_k in (ix.TILE_K, ix.SMALL_TILE_K):
            assert mx.threads(mma) % mx.chunks_per_row(tile_k, 2) == 0


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
def test_supported_tiles_fit_the_kernel(mma: str) -> None:
    tiles = cv.SUPPORTED_TILES[mma]
    assert len(tiles) == len(set(tiles)) == 84
    for tile in tiles:
        assert tile.tile_m in (32, 64, 128) and tile.tile_n in (32, 64, 128)
        assert (tile.wave_m, tile.wave_n) in ((1, 4), (2, 2), (4, 1))
        assert tile.wgm in (1, 2, 4, 8)
        assert tile.wave_m * tile.wave_n == ix.WAVES_PER_BLOCK
        rows, cols = ix.wave_tile(tile.tile_m, tile.tile_n, tile.wave_m, tile.wave_n)
        assert rows % ix.MMA_MN == 0 and cols % ix.MMA_MN == 0 and rows and cols
        assert cv.tile_problem(tile, mma) is None
        # The LDS holds the A stage of the shared loop and every wave's staging area.
        for ob, by_column in ((2, True), (2, False), (4, False)):
            shape = (tile.tile_m, tile.tile_n, tile.wave_m, tile.wave_n)
            lds = ix.conv_lds_bytes(*shape, ob, by_column, mma)
            assert lds >= mx.a_stage_bytes(tile.tile_m, ix.tile_k_of(*shape), 2)
            assert lds >= ix.WAVES_PER_BLOCK * ix.stage_bytes(cols, ob, by_column)
    # Only the layouts whose wave sub-tile is not a multiple of 16 are missing.
    shapes = {(t.tile_m, t.tile_n, t.wave_m, t.wave_n) for t in tiles}
    assert (32, 32, 1, 4) not in shapes and (32, 64, 4, 1) not in shapes
    assert (128, 128, 1, 4) in shapes and (32, 32, 2, 2) in shapes
    budgets = {str(t): cv.tile_problem(t, mma) for t in tiles}
    print(f"\n{mma}: all {len(budgets)} conv tiles fit (tile_problem is None)")


@pytest.mark.slow  # every registry tile, thread by thread: seconds
@pytest.mark.parametrize("mma", ["mfma", "wmma"])
def test_every_tile_element_has_one_owner(mma: str) -> None:
    """Across waves, MMA repeats, lanes and accumulator elements a work-group covers its tile
    once, the B row a lane streams is the column its accumulators hold, the A rows a wave reads
    are its own, and a wave's offset A stage reads the bytes of its rows (the swizzle repeats
    every swizzle_period rows)."""
    wsz = mx.WAVE_SIZE[mma]
    rpl = mx.acc_rows_per_lane(mma)
    for tile in {(t.tile_m, t.tile_n, t.wave_m, t.wave_n) for t in cv.SUPPORTED_TILES[mma]}:
        tile_k = ix.tile_k_of(*tile)
        assert tile_k in (ix.TILE_K, ix.SMALL_TILE_K)
        cpr = mx.chunks_per_row(tile_k, 2)
        assert ix.MMA_MN % ix.swizzle_period(tile_k, 2) == 0
        reps_m, reps_n = ix.wave_repeats(*tile)
        owners = torch.zeros(tile[0], tile[1], dtype=torch.int32)
        loaded = set()
        for wave in range(ix.WAVES_PER_BLOCK):
            row0, col0 = ix.wave_origin(wave, *tile)
            for lane in range(wsz):
                for i in range(reps_m):
                    row = mx.operand_row(i, lane)
                    loaded.add(row0 + row)
                    for chunk in range(cpr):
                        assert ix.a_wave_lds_byte(row0, tile_k, 2) + mx.a_lds_byte(
                            row, chunk, cpr
                        ) == mx.a_lds_byte(row0 + row, chunk, cpr)
                for j in range(reps_n):
                    b_row = col0 + mx.operand_row(j, lane)
                    for i in range(reps_m):
                        for e in range(rpl):
                            r = row0 + i * ix.MMA_MN + mx.acc_row(lane, e, mma)
                            c = col0 + j * ix.MMA_MN + mx.acc_col(lane)
                            assert c == b_row
                            owners[r, c] += 1
        assert loaded == set(range(tile[0])), tile
        assert torch.equal(owners, torch.ones_like(owners)), tile


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
@pytest.mark.parametrize("by_column", [False, True])
@pytest.mark.parametrize("out_bytes", [2, 4])
def test_staging_reads_back_every_element_once(mma: str, by_column: bool, out_bytes: int) -> None:
    """The epilogue's staging: every accumulator element of a wave's 16 rows has its own LDS
    place inside the wave's area, and the 16-byte runs read back cover each exactly once, at
    the (row, column) it holds."""
    if by_column and out_bytes == 4:
        pytest.skip("NCDHW staging holds the output dtype (2 bytes) only")
    wsz = mx.WAVE_SIZE[mma]
    vec = mx.CHUNK_BYTES // out_bytes
    for wave_cols in (16, 32, 64, 128):
        reps_n = wave_cols // ix.MMA_MN
        area = ix.stage_bytes(wave_cols, out_bytes, by_column)
        place = {}
        for j in range(reps_n):
            for lane in range(wsz):
                first = ix.stage_write_byte(1, j, lane, 0, wave_cols, out_bytes, by_column, mma)
                for e in range(mx.acc_rows_per_lane(mma)):
                    byte = ix.stage_write_byte(1, j, lane, e, wave_cols, out_bytes, by_column, mma)
                    if by_column:
                        assert byte == first + e * out_bytes  # one vector per lane
                    assert area <= byte < 2 * area
                    key = (mx.acc_row(lane, e, mma), j * ix.MMA_MN + mx.acc_col(lane))
                    assert byte not in place.values()
                    place[key] = byte - area
        assert len(place) == ix.MMA_MN * wave_cols
        seen = set()
        for store_pass in range(ix.stage_read_passes(wave_cols, out_bytes, by_column, mma)):
            for lane in range(wsz):
                row, col, real, byte = ix.stage_read_coord(store_pass, lane, wave_cols,
                                                           out_bytes, by_column, mma)  # fmt: skip
                if not real:
                    continue
                assert byte % mx.CHUNK_BYTES == 0
                for e in range(vec):
                    key = (row + e, col) if by_column else (row, col + e)
                    assert place[key] == byte + e * out_bytes
                    assert key not in seen
                    seen.add(key)
        assert seen == set(place)


@pytest.mark.parametrize("wgm", cv.WGM_CHOICES)
@pytest.mark.parametrize(("m_tiles", "n_tiles"), [(1, 1), (1, 5), (3, 1), (7, 3), (8, 2), (13, 4)])
def test_work_group_order(wgm: int, m_tiles: int, n_tiles: int) -> None:
    """Every (M tile, N tile) is one work-group's; consecutive ids walk up to wgm M tiles of an
    N tile before the next N tile."""
    tiles = [ix.tile_of_block(b, m_tiles, n_tiles, wgm, _pick) for b in range(m_tiles * n_tiles)]
    assert sorted(tiles) == [(m, n) for m in range(m_tiles) for n in range(n_tiles)]
    first = min(wgm, m_tiles)
    assert tiles[:first] == [(m, 0) for m in range(first)]
    if n_tiles > 1:
        assert tiles[first] == (0, 1)
    for b, (m, _) in enumerate(tiles):
        assert m // wgm == b // (wgm * n_tiles)  # a group of wgm M tiles at a time


def test_grid_and_groups() -> None:
    assert ix.conv_grid(100, 40, 3, 32, 32, 2) == (4 * 2, 6, 1)
    assert [ix.group_and_split(y, 3) for y in range(6)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)
    ]  # fmt: skip


@pytest.mark.parametrize("cg", [1, 3, 16, 17, 40])
def test_chunks_stay_in_one_tap(cg: int) -> None:
    """Every 16-byte chunk the main loop copies starts at a multiple of 8, so with Cgp a
    multiple of 16 its elements share one tap and are consecutive channels of it; the element
    a_chunk_element gives is that tap's input element."""
    per_chunk = mx.CHUNK_BYTES // 2
    cgp = ix.padded_channels(cg)
    assert cgp % ix.CHANNEL_VECTOR == 0 and cg <= cgp < cg + ix.CHANNEL_VECTOR
    kernel = (3, 2, 3)
    reduction = ix.reduction_size(cgp, *kernel)
    for r in range(0, reduction, per_chunk):
        first = ix.reduction_coords(r, cgp, 2, 3)
        last = ix.reduction_coords(r + per_chunk - 1, cgp, 2, 3)
        assert first[:3] == last[:3] and last[3] == first[3] + per_chunk - 1


@pytest.mark.parametrize("tile_k", [ix.TILE_K, ix.SMALL_TILE_K])
@pytest.mark.parametrize("split_k", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("reduction", [16, 32, 48, 64, 80, 432, 1024])
def test_split_ranges_cover_the_reduction_once(split_k: int, reduction: int, tile_k: int) -> None:
    """The chunks the main loop loads unmasked (k-block before the split's end, index before the
    reduction's end when the taps are odd) cover every reduction index exactly once."""
    per_chunk = mx.CHUNK_BYTES // 2
    cpr = mx.chunks_per_row(tile_k, 2)
    blocks = tile_k // ix.K_BLOCK
    covered = torch.zeros(reduction, dtype=torch.int32)
    for split in range(split_k):
        kb_begin, kb_end = ix.split_blocks(split, reduction, split_k)
        for t in range(mx.k_tiles(kb_begin, kb_end, blocks)):
            kb0 = kb_begin + t * blocks
            for chunk in range(cpr):
                kk = kb0 * ix.K_BLOCK + chunk * per_chunk
                if mx.chunk_k_block(kb0, chunk) < kb_end and kk < reduction:
                    covered[kk : kk + per_chunk] += 1
    assert torch.equal(covered, torch.ones_like(covered)), split_k
    # The tail flag: a reduction of an odd tap count can end inside a k-block, never of an even.
    for kernel in ((1, 1, 1), (3, 3, 3), (2, 3, 1), (3, 2, 3)):
        for cg in (1, 16, 17, 32, 48):
            tail = ix.reduction_size(ix.padded_channels(cg), *kernel) % ix.K_BLOCK != 0
            assert not tail or ix.has_k_tail_taps(kernel)


@pytest.mark.parametrize("layout", cv.LAYOUTS)
def test_out_offsets_address_the_layout(layout: str) -> None:
    """out_offset addresses element (position m, channel) of a tensor in `layout`, splits into
    a row and a column part, and out_element inverts it."""
    n, k, out_d, out_h, out_w = 3, 5, 2, 3, 4
    spatial = out_d * out_h * out_w
    # flat[n, channel, d, h, w]: the element's offset in a contiguous tensor of the layout.
    flat = torch.arange(n * k * spatial).view(n, k, out_d, out_h, out_w)
    if layout == "NDHWC":
        flat = torch.arange(n * k * spatial).view(n, out_d, out_h, out_w, k)
        flat = flat.permute(0, 4, 1, 2, 3)
    for m in range(n * spatial):
        sample, od, oh, ow = ix.position_coords(m, out_d, out_h, out_w)
        for c in range(k):
            off = ix.out_offset(m, m // spatial, c, k, spatial, layout)
            assert off == int(flat[sample, c, od, oh, ow])
            assert off == ix.out_row_offset(m, m // spatial, k, spatial, layout) + (
                ix.out_col_offset(c, spatial, layout)
            )
            assert ix.out_element(off, k, spatial, layout) == (m, c)
    for m in range(n * spatial):
        for c in range(k):
            split = 2
            assert ix.staging_offset(split, m, c, n * spatial, k) == (
                (split * n * spatial + m) * k + c
            )


def test_position_coords_round_trip() -> None:
    out_d, out_h, out_w = 3, 4, 5
    spatial = out_d * out_h * out_w
    for m in range(2 * spatial):
        n, od, oh, ow = ix.position_coords(m, out_d, out_h, out_w)
        assert n * spatial + ix.spatial_index(od, oh, ow, out_h, out_w) == m
        assert od < out_d and oh < out_h and ow < out_w


# --- geometry ----------------------------------------------------------------------------


def test_geometry_derived_sizes() -> None:
    g = cv.conv3d_geometry(
        (2, 6, 9, 10, 11), (8, 3, 3, 1, 3), stride=(1, 2, 2), padding=(1, 0, 2), dilation=(2, 1, 1),
        groups=2,
    )  # fmt: skip
    ref = F.conv3d(torch.zeros(2, 6, 9, 10, 11), torch.zeros(8, 3, 3, 1, 3), None, (1, 2, 2),
                   (1, 0, 2), (2, 1, 1), 2)  # fmt: skip
    assert (g.n, g.k) + g.out_spatial == tuple(ref.shape[:2]) + tuple(ref.shape[2:])
    assert (g.cg, g.kg, g.cgp, g.taps) == (3, 4, 16, 9)
    assert g.reduction == 9 * 16 and g.positions == 2 * g.out_d * g.out_h * g.out_w
    assert g.x_padded_shape() == (2, 9, 10, 11, 32)
    assert g.packed_weight_shape() == (8, 144)
    assert g.out_shape("NCDHW") == tuple(ref.shape)
    assert g.out_shape("NDHWC") == (2, *ref.shape[2:], 8)
    assert cv.conv3d_workspace_shape(g, 3) == (3, g.positions, 8)
    ndhwc = cv.conv3d_geometry((2, 9, 10, 11, 6), (8, 3, 3, 1, 3), stride=(1, 2, 2),
                               padding=(1, 0, 2), dilation=(2, 1, 1), groups=2,
                               input_layout="NDHWC")  # fmt: skip
    assert ndhwc == g
    assert cv.Conv3dGeometry(1, 4, 5, 5, 5, 8, 3, 3, 3, stride=2).stride == (2, 2, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(stride=0), "stride: expected an int or a 3-tuple of ints >= 1"),
        (dict(stride=(1, 2)), "stride: expected"),
        (dict(padding=-1), "padding: expected an int or a 3-tuple of ints >= 0"),
        (dict(padding=(1, 0, 1.5)), "padding: expected"),
        (dict(dilation=(1, 0, 1)), "dilation: expected"),
        (dict(groups=0), "groups: expected an int >= 1"),
        (dict(groups=4), "groups: C = 6 is not divisible by groups = 4"),
        (dict(w=(8, 2, 1, 1, 1), groups=3), "groups: K = 8 is not divisible by groups = 3"),
        (dict(w=(8, 3, 3, 3, 3)), r"weight: expected shape \[K, C / groups = 6"),
        (dict(w=(8, 6, 3, 3)), "weight: expected a 5-D shape"),
        (dict(x=(1, 6, 4, 4)), "x: expected a 5-D shape"),
        (dict(x=(1, 6, 2, 4, 4)), "x: input too small for kernel/dilation along D"),
        (dict(dilation=(1, 2, 1)), "x: input too small for kernel/dilation along H"),
        (dict(x=(0, 6, 4, 4, 4)), "n: expected an int >= 1"),
        (dict(input_layout="NHWC"), "input_layout: expected one of"),
    ],
)
def test_geometry_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    x = kwargs.pop("x", (1, 6, 4, 4, 4))
    w = kwargs.pop("w", (8, 6, 3, 3, 3))
    with pytest.raises(ValueError, match=message):
        cv.conv3d_geometry(x, w, **kwargs)


def test_geometry_padding_saves_a_small_input() -> None:
    g = cv.conv3d_geometry((1, 6, 2, 4, 4), (8, 6, 3, 3, 3), padding=(1, 0, 0))
    assert g.out_spatial == (2, 2, 2)


# --- weights and inputs in torch -----------------------------------------------------------


def _hand_packed(weight: torch.Tensor) -> torch.Tensor:
    k, cg, kt, kh, kw = weight.shape
    cgp = ix.padded_channels(cg)
    packed = torch.full((k, kt * kh * kw * cgp), float("nan"))
    for kk in range(k):
        for t in range(kt):
            for h in range(kh):
                for w in range(kw):
                    for c in range(cgp):
                        row, col = ix.packed_weight_index(kk, t, h, w, c, kh, kw, cgp)
                        packed[row, col] = weight[kk, c, t, h, w] if c < cg else 0.0
    return packed


@pytest.mark.parametrize(
    ("shape", "groups"), [((4, 3, 3, 2, 3), 1), ((6, 16, 1, 3, 3), 2), ((5, 20, 3, 1, 1), 5)]
)
def test_pack_weight_matches_a_hand_reference(shape, groups) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(shape, generator=gen)
    packed = cv.pack_conv3d_weight(weight, groups)
    assert packed.is_contiguous() and packed.dtype == weight.dtype
    assert torch.equal(packed, _hand_packed(weight))
    # A non-contiguous weight packs to the same thing.
    strided = weight.permute(4, 3, 2, 1, 0).contiguous().permute(4, 3, 2, 1, 0)
    assert not strided.is_contiguous()
    assert torch.equal(cv.pack_conv3d_weight(strided, groups), packed)
    half = cv.pack_conv3d_weight(weight.to(torch.bfloat16), groups)
    assert half.dtype == torch.bfloat16 and torch.equal(half, packed.to(torch.bfloat16))


def test_pack_weight_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="groups: K = 6 is not divisible by groups = 4"):
        cv.pack_conv3d_weight(torch.empty(6, 2, 1, 1, 1), 4)
    with pytest.raises(ValueError, match="weight: expected a 5-D"):
        cv.pack_conv3d_weight(torch.empty(6, 2, 1, 1), 1)


def _reference_padded(x_ncdhw: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, d, h, w = x_ncdhw.shape
    cg = c // groups
    cgp = ix.padded_channels(cg)
    out = torch.zeros(n, d, h, w, groups, cgp, dtype=x_ncdhw.dtype)
    out[..., :cg] = x_ncdhw.permute(0, 2, 3, 4, 1).reshape(n, d, h, w, groups, cg)
    return out.reshape(n, d, h, w, groups * cgp)


@pytest.mark.parametrize(("c", "groups"), [(3, 1), (16, 1), (12, 3), (32, 2), (4, 4)])
def test_torch_padded_input_both_layouts(c: int, groups: int) -> None:
    x = torch.randn(2, c, 3, 4, 5)
    want = _reference_padded(x, groups)
    got = cv.to_padded_ndhwc_torch(x, groups, "NCDHW")
    assert got.is_contiguous() and torch.equal(got, want)
    ndhwc = x.permute(0, 2, 3, 4, 1)  # a non-contiguous NDHWC view
    assert torch.equal(cv.to_padded_ndhwc_torch(ndhwc, groups, "NDHWC"), want)
    assert torch.equal(cv.to_padded_ndhwc_torch(ndhwc.contiguous(), groups, "NDHWC"), want)
    ready = (c // groups) % ix.CHANNEL_VECTOR == 0
    assert cv.ndhwc_input_ready(ndhwc.contiguous(), groups) == ready
    assert not cv.ndhwc_input_ready(ndhwc, groups)  # not contiguous
    if ready:
        assert torch.equal(ndhwc.contiguous(), want)


def test_torch_paths_work_on_fake_tensors_in_the_dry_run() -> None:
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:
        weight = torch.empty(8, 5, 3, 3, 3, dtype=torch.bfloat16, device="cuda")
        packed = cv.pack_conv3d_weight(weight, 2)
        assert tuple(packed.shape) == (8, 27 * 16) and packed.is_contiguous()
        strided = torch.empty(3, 3, 3, 5, 8, dtype=torch.bfloat16, device="cuda").permute(
            4, 3, 0, 1, 2
        )
        assert tuple(cv.pack_conv3d_weight(strided, 1).shape) == (8, 432)
        w16 = torch.empty(4, 16, 1, 1, 1, dtype=torch.float16, device="cuda")
        assert tuple(cv.pack_conv3d_weight(w16, 1).shape) == (4, 16)
        for c, groups in ((5, 1), (32, 2)):
            x = torch.empty(2, c, 3, 4, 5, dtype=torch.bfloat16, device="cuda")
            cgp = ix.padded_channels(c // groups)
            for layout, t in (("NCDHW", x), ("NDHWC", x.permute(0, 2, 3, 4, 1))):
                padded = cv.to_padded_ndhwc_torch(t, groups, layout)
                assert tuple(padded.shape) == (2, 3, 4, 5, groups * cgp)
                assert padded.is_contiguous() and padded.device.type == "cuda"
            assert not cv.ndhwc_input_ready(x.permute(0, 2, 3, 4, 1), groups)
        assert requests == []


# --- the kernels' arithmetic, emulated on CPU --------------------------------------------


@dataclass(frozen=True)
class _MainTile:
    """The shared main loop's tile of a conv tile (WorkGroup reads these three)."""

    tile_m: int
    tile_n: int
    tile_k: int


class ConvWorkGroup(WorkGroup):
    """One conv3d work-group on the shared main loop, emulated thread by thread: the shared
    WorkGroup with the conv kernel's wave_m x wave_n layout (each wave's MMA repeats, B rows
    from its first column, A read from its first row's offset in the stage, as _wave_layout
    sets them up), A read at a base offset (the block's first frame), and the conv epilogue
    (staging by rows or by columns, runs stored to out or the workspace)."""

    def __init__(self, *, conv_tile, a_base, **kwargs):
        super().__init__(**kwargs)
        self.conv_tile = conv_tile
        shape = (conv_tile.tile_m, conv_tile.tile_n, conv_tile.wave_m, conv_tile.wave_n)
        self.shape = shape
        self.reps_m, self.reps_n = ix.wave_repeats(*shape)
        self.wave_cols = conv_tile.tile_n // conv_tile.wave_n
        self.a_base = a_base
        self.a_limit = len(self.a_flat) - a_base
        self.chunks = {"A valid": 0, "A padding or masked": 0}

    def load_a(self, element, valid):
        if valid:  # a real tap lies inside the block's buffer: nothing relies on OOB
            assert element >= 0 and element + self.per_chunk <= self.a_limit
        self.chunks["A valid" if valid else "A padding or masked"] += 1
        return _buffer_load(self.a_flat, self.a_base, self.a_limit, valid, element,
                            self.per_chunk)  # fmt: skip

    def b_rows_of(self, wave, lane):
        _, col0 = ix.wave_origin(wave, *self.shape)
        rows = []
        for j in range(self.reps_n):
            row = col0 + mx.operand_row(j, lane)
            rows.append((row, row < self.b_rows))
        return rows

    def a_read_offset(self, wave):
        row0, _ = ix.wave_origin(wave, *self.shape)
        return ix.a_wave_lds_byte(row0, self.tile.tile_k, self.eb)

    def epilogue(self, accs, value_fn, staged_dtype, by_column: bool, store):
        """Per wave and A repeat: stage the 16 rows (value_fn(wave, i, j, lane, e, acc) -> fp32,
        then the cast), read the runs back and store(row, col, values, along_rows) with
        block-relative coordinates; as the kernel's epilogue, in its order."""
        ob = torch.empty((), dtype=staged_dtype).element_size()
        vec = mx.CHUNK_BYTES // ob
        rpl = mx.acc_rows_per_lane(self.mma)
        wc = self.wave_cols
        area = ix.stage_bytes(wc, ob, by_column)
        for wave in range(mx.WAVES_PER_BLOCK):
            row0, col0 = ix.wave_origin(wave, *self.shape)
            for i in range(self.reps_m):
                for j in range(self.reps_n):
                    per_e = [0] if by_column else list(range(rpl))
                    for e0 in per_e:
                        lane_bytes = []
                        for lane in range(self.wsz):
                            byte = ix.stage_write_byte(wave, j, lane, e0, wc, ob, by_column,
                                                       self.mma)  # fmt: skip
                            acc = accs[wave][i * self.reps_n + j][lane]
                            elems = range(rpl) if by_column else [e0]
                            values = [
                                round_to(value_fn(wave, i, j, lane, e, round_to(acc[e],
                                                                                torch.float32)),
                                         staged_dtype)
                                for e in elems
                            ]  # fmt: skip
                            self.lds.store(wave, byte, values, ob)
                            lane_bytes.append(byte)
                        width = rpl * ob if by_column else ob
                        self.lds.instruction("C write", wave, lane_bytes, width)
                passes = ix.stage_read_passes(wc, ob, by_column, self.mma)
                for store_pass in range(passes):
                    lane_bytes = []
                    for lane in range(self.wsz):
                        row16, col, real, byte = ix.stage_read_coord(store_pass, lane, wc, ob,
                                                                     by_column, self.mma)  # fmt: skip
                        byte = wave * area + byte
                        lane_bytes.append(byte if real else None)
                        if real:
                            values = self.lds.load(byte, vec, ob)
                            store(row0 + i * ix.MMA_MN + row16, col0 + col, values, by_column)
                    self.lds.instruction("C read", wave, lane_bytes, mx.CHUNK_BYTES)


def emulate_conv(x_padded, packed, bias, geo, tile, split_k: int, layout: str, mma: str,
                 out_dtype, arch: str):  # fmt: skip
    """The conv kernel work-group by work-group, each one thread by thread and phase by phase
    (ConvWorkGroup on the shared WorkGroup), with the index functions the kernel calls.
    Returns (destination, write counts, races, LDS stats, chunk counts): out flattened when
    split_k == 1 (after bias and the cast), else the fp32 [split_k, M, K] staging buffer."""
    positions, kg, k, groups = geo.positions, geo.kg, geo.k, geo.groups
    out_dhw, in_dhw = geo.out_spatial, (geo.d, geo.h, geo.w)
    spatial = geo.out_d * geo.out_h * geo.out_w
    cgp, c_total, reduction = geo.cgp, geo.padded_c, geo.reduction
    xf, wf = x_padded.double().reshape(-1), packed.double().reshape(-1)
    by_column = split_k == 1 and layout == "NCDHW"
    staged_dtype = out_dtype if split_k == 1 else torch.float32
    ob = torch.empty((), dtype=staged_dtype).element_size()
    grid_x, grid_y, grid_z = ix.conv_grid(positions, kg, groups, tile.tile_m, tile.tile_n, split_k)
    assert grid_z == 1
    m_tiles, n_tiles = ix.tile_counts(positions, kg, tile.tile_m, tile.tile_n)
    span = ix.input_span_frames(tile.tile_m, geo.n, geo.d, geo.out_d, geo.out_h, geo.out_w,
                                geo.kt, geo.stride[0], geo.dilation[0])  # fmt: skip
    frame = geo.h * geo.w * c_total
    size = split_k * positions * k if split_k > 1 else positions * k
    dst = torch.zeros(size, dtype=torch.float64)
    writes = torch.zeros(size, dtype=torch.int32)
    races: list[str] = []
    stats: dict = defaultdict(AccessStats)
    chunks: dict = defaultdict(int)
    shape = (tile.tile_m, tile.tile_n, tile.wave_m, tile.wave_n)
    lds_bytes = ix.conv_lds_bytes(*shape, ob, by_column, mma)
    for bx in range(grid_x):
        tm, tn = ix.tile_of_block(bx, m_tiles, n_tiles, tile.wgm, _pick)
        origin_m, origin_n = ix.tile_origin(tm, tn, tile.tile_m, tile.tile_n)
        base = ix.block_input_base(origin_m, out_dhw, geo.stride[0], geo.padding[0], _pick)
        first_frame = base[0] * geo.d + base[1]
        for by in range(grid_y):
            g, split = ix.group_and_split(by, split_k)

            def a_rows(r, origin_m=origin_m, base=base, g=g):
                return ix.a_row_info(origin_m + r, base, ix.group_channel(g, cgp, 0), out_dhw,
                                     in_dhw, c_total, geo.stride, geo.padding, positions)  # fmt: skip

            def a_chunk(info, kk):
                element, valid = ix.a_chunk_element(info, kk, cgp, in_dhw, c_total,
                                                    geo.kernel_size, geo.dilation, geo.padding)  # fmt: skip
                if valid and kk < reduction:
                    assert element < span * frame  # input_span_frames bounds the offsets
                return element, valid

            wg = ConvWorkGroup(
                conv_tile=tile, a_base=first_frame * frame, mma=mma, arch=arch,
                tile=_MainTile(tile.tile_m, tile.tile_n, ix.tile_k_of(*shape)), elem_bytes=2, a_flat=xf,
                a_rows=a_rows, a_chunk=a_chunk, b_flat=wf,
                b_base=ix.out_channel(g, kg, origin_n) * reduction, b_rows=kg - origin_n,
                b_shuffled=False, k=reduction, origin=(origin_m, origin_n), lds_bytes=lds_bytes,
                k_tail=ix.has_k_tail_taps(geo.kernel_size),
            )  # fmt: skip
            kb_begin, kb_end = ix.split_blocks(split, reduction, split_k)
            accs = wg.main_loop(kb_begin, kb_end)

            def value_fn(wave, i, j, lane, e, acc, wg=wg, origin_n=origin_n, g=g):
                if bias is None or split_k > 1:
                    return acc
                _, col0 = ix.wave_origin(wave, *wg.shape)
                col = origin_n + col0 + j * ix.MMA_MN + mx.acc_col(lane)
                lane_bias = float(bias[ix.out_channel(g, kg, col)]) if col < kg else 0.0
                return round_to(acc + lane_bias, torch.float32)

            def store(row, col, values, along_col, origin_m=origin_m, origin_n=origin_n, g=g,
                      split=split):  # fmt: skip
                row, col = origin_m + row, origin_n + col
                for e, value in enumerate(values):
                    m, c = (row + e, col) if along_col else (row, col + e)
                    if m >= positions or c >= kg:
                        continue
                    channel = ix.out_channel(g, kg, c)
                    if split_k > 1:
                        off = ix.staging_offset(split, m, channel, positions, k)
                    else:
                        off = ix.out_offset(m, m // spatial, channel, k, spatial, layout)
                    dst[off] = value
                    writes[off] += 1

            wg.epilogue(accs, value_fn, staged_dtype, by_column, store)
            races += wg.lds.races
            for kind, st in wg.lds.stats.items():
                stats[kind].instructions += st.instructions
                stats[kind].cycles += st.cycles
                stats[kind].ideal_cycles += st.ideal_cycles
            for kind, count in wg.chunks.items():
                chunks[kind] += count
    return dst, writes, races, stats, chunks


def emulate_epilogue(staging, bias, geo, split_k: int, layout: str, out_dtype):
    """The split-K epilogue: one thread per element of out, in out's layout order."""
    positions, k = geo.positions, geo.k
    spatial = positions // geo.n
    total = positions * k
    grid = ix.elementwise_grid(total)
    idx = ix.elementwise_index(torch.arange(grid)[:, None], torch.arange(ix.ELEMENTWISE_BLOCK))
    idx = idx.reshape(-1)
    idx = idx[idx < total]
    m, channel = ix.out_element(idx, k, spatial, layout)
    value = staging[ix.staging_offset(0, m, channel, positions, k)]
    for s in range(1, split_k):
        value = value + staging[ix.staging_offset(s, m, channel, positions, k)]
    if bias is not None:
        value = value + bias.float()[channel]
    out = torch.zeros(total, dtype=out_dtype)
    out[idx] = value.to(out_dtype)
    writes = torch.zeros(total, dtype=torch.int32)
    writes.index_put_((idx,), torch.ones_like(idx, dtype=torch.int32), accumulate=True)
    return out, writes


def emulate_pretranspose(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-transpose: one thread per element of the padded NDHWC output."""
    n, c, d, h, w = x.shape
    cg = c // groups
    cgp = ix.padded_channels(cg)
    spatial = d * h * w
    total = n * spatial * groups * cgp
    grid = ix.elementwise_grid(total)
    idx = ix.elementwise_index(torch.arange(grid)[:, None], torch.arange(ix.ELEMENTWISE_BLOCK))
    idx = idx.reshape(-1)
    idx = idx[idx < total]
    real, src = ix.pretranspose_element(idx, spatial, groups, cgp, cg, _where)
    assert int(src.min()) >= 0 and int(src.max()) < x.numel()
    out = torch.full((total,), float("nan"), dtype=x.dtype)
    out[idx] = _where(real, x.reshape(-1)[src], 0.0).to(x.dtype)
    writes = torch.zeros(total, dtype=torch.int32)
    writes.index_put_((idx,), torch.ones_like(idx, dtype=torch.int32), accumulate=True)
    return out.view(n, d, h, w, groups * cgp), writes


KERNELS = [(1, 1, 1), (3, 3, 3), (1, 3, 3), (3, 1, 1), (2, 3, 1), (3, 2, 3)]
STRIDES = [1, 2, (1, 2, 2), (2, 1, 1)]
PADDINGS = [0, 1, (1, 0, 2)]
DILATIONS = [1, 2, (2, 1, 1)]


def _make_case(idx: int) -> dict:
    rnd = random.Random(7000 + idx)
    mma = cv.MMA_FLAVOURS[idx % 2]
    kind = idx % 5  # 0, 1: groups 1; 2: two groups; 3: channel-wise; 4: groups 1, wide C
    if kind == 3:
        c = rnd.choice([2, 3, 4])
        groups, k = c, c * rnd.choice([1, 2])
    elif kind == 2:
        groups = 2
        c, k = 2 * rnd.randint(1, 12), 2 * rnd.randint(1, 20)
    else:
        groups = 1
        c = (16, 32, rnd.randint(17, 40))[idx // 5 % 3] if kind == 4 else rnd.randint(1, 16)
        k = rnd.randint(1, 72)
    while True:
        kernel = rnd.choice(KERNELS)
        stride, padding, dilation = rnd.choice(STRIDES), rnd.choice(PADDINGS), rnd.choice(DILATIONS)
        spatial = (rnd.randint(1, 7), rnd.randint(1, 9), rnd.randint(1, 9))
        try:
            geo = cv.conv3d_geometry(
                (rnd.randint(1, 2), c, *spatial), (k, c // groups, *kernel), stride=stride,
                padding=padding, dilation=dilation, groups=groups,
            )  # fmt: skip
        except ValueError:
            continue
        if geo.positions <= 400:
            break
    tiles = cv.SUPPORTED_TILES[mma]
    tile = rnd.choice([t for t in tiles if t.wgm == cv.WGM_CHOICES[(idx // 2) % 4]])
    return dict(
        geo=geo,
        tile=tile,
        split_k=(1, 2, 3)[idx % 3],
        layout=cv.LAYOUTS[(idx // 3) % 2],
        mma=mma,
        dtype=(torch.bfloat16, torch.float16)[(idx // 4) % 2],
        bias=idx % 7 != 3,
        seed=idx,
        arch="gfx1250" if mma == "wmma" else ("gfx942", "gfx950")[(idx // 2) % 2],
    )


CASES = [_make_case(i) for i in range(48)]


def _case_id(case: dict) -> str:
    g, t = case["geo"], case["tile"]
    return (
        f"{case['mma']}-x{g.n}x{g.c}x{g.d}x{g.h}x{g.w}-k{g.k}-ks{g.kt}{g.kh}{g.kw}"
        f"-s{''.join(map(str, g.stride))}-p{''.join(map(str, g.padding))}"
        f"-d{''.join(map(str, g.dilation))}-g{g.groups}-t{t.tile_m}x{t.tile_n}w{t.wave_m}"
        f"{t.wave_n}m{t.wgm}-sk{case['split_k']}-{case['layout']}"
    )


@pytest.mark.parametrize("case", fast_first(CASES, 2, [_case_id(c) for c in CASES]))
def test_emulated_conv_matches_torch(case: dict) -> None:
    geo, dtype, split_k, layout = case["geo"], case["dtype"], case["split_k"], case["layout"]
    gen = torch.Generator().manual_seed(case["seed"])
    # Small integers: every fp32 sum is exact, so kernel and torch agree bit for bit.
    x = torch.randint(-3, 4, (geo.n, geo.c, geo.d, geo.h, geo.w), generator=gen).to(dtype)
    weight = torch.randint(-3, 4, (geo.k, geo.cg, *geo.kernel_size), generator=gen).to(dtype)
    bias = torch.randint(-9, 10, (geo.k,), generator=gen).to(dtype) if case["bias"] else None

    x_padded, pre_writes = emulate_pretranspose(x, geo.groups)
    assert torch.equal(pre_writes, torch.ones_like(pre_writes))
    assert torch.equal(x_padded, cv.to_padded_ndhwc_torch(x, geo.groups, "NCDHW"))
    packed = cv.pack_conv3d_weight(weight, geo.groups)
    dst, writes, races, stats, chunks = emulate_conv(
        x_padded, packed, bias, geo, case["tile"], split_k, layout, case["mma"], dtype,
        case["arch"],
    )  # fmt: skip
    assert torch.equal(writes, torch.ones_like(writes))  # every element exactly once
    assert races == []  # no LDS race in any phase of any work-group
    print(f"\n{case['arch']} LDS model: {conflict_summary(stats)}; A chunks: {dict(chunks)}")
    for kind in ("A write", "A read"):
        assert stats[kind].instructions > 0 and stats[kind].extra_cycles == 0, kind
    if split_k > 1:
        out, out_writes = emulate_epilogue(dst.float(), bias, geo, split_k, layout, dtype)
        assert torch.equal(out_writes, torch.ones_like(out_writes))
    else:
        out = dst.to(dtype)
    out = out.view(geo.out_shape(layout))
    if layout == "NDHWC":
        out = out.permute(0, 4, 1, 2, 3)

    ref = F.conv3d(
        x.float(), weight.float(), None if bias is None else bias.float(), geo.stride,
        geo.padding, geo.dilation, geo.groups,
    )  # fmt: skip
    assert torch.equal(out, ref.to(dtype))


def test_cases_cover_every_option() -> None:
    seen = {
        "wgm": {c["tile"].wgm for c in CASES},
        "split_k": {c["split_k"] for c in CASES},
        "layout": {c["layout"] for c in CASES},
        "mma": {c["mma"] for c in CASES},
        "dtype": {c["dtype"] for c in CASES},
        "bias": {c["bias"] for c in CASES},
        "waves": {(c["tile"].wave_m, c["tile"].wave_n) for c in CASES},
        "stride": {c["geo"].stride for c in CASES},
        "padding": {c["geo"].padding for c in CASES},
        "dilation": {c["geo"].dilation for c in CASES},
        "kernel": {c["geo"].kernel_size for c in CASES},
    }
    assert seen["wgm"] == set(cv.WGM_CHOICES)
    assert seen["split_k"] == {1, 2, 3}
    assert seen["layout"] == set(cv.LAYOUTS) and seen["mma"] == set(cv.MMA_FLAVOURS)
    assert seen["dtype"] == set(cv.INPUT_DTYPES) and seen["bias"] == {True, False}
    assert seen["waves"] == {(1, 4), (2, 2), (4, 1)}
    assert {(1, 1, 1), (2, 2, 2)} <= seen["stride"]
    assert {(0, 0, 0), (1, 1, 1), (1, 0, 2)} <= seen["padding"]
    assert {(1, 1, 1), (2, 2, 2)} <= seen["dilation"]
    assert {(1, 1, 1), (3, 3, 3), (1, 3, 3), (3, 1, 1)} <= seen["kernel"]
    groups = {c["geo"].groups for c in CASES}
    assert 1 in groups and 2 in groups
    assert any(c["geo"].groups == c["geo"].c > 1 for c in CASES)  # channel-wise
    assert any(c["geo"].cg > ix.CHANNEL_VECTOR for c in CASES)  # Cgp of two vectors or more
    assert any(c["geo"].cg % ix.CHANNEL_VECTOR == 0 for c in CASES)  # no channel padding


# --- host entry --------------------------------------------------------------------------


GEO = cv.conv3d_geometry((2, 5, 4, 6, 7), (12, 5, 3, 3, 3), padding=1)


def _launch_args(split_k: int = 1, layout: str = "NCDHW", dtype=torch.bfloat16, geo=GEO):
    args = dict(
        x_padded_ndhwc=torch.empty(geo.x_padded_shape(), dtype=dtype),
        packed_weight=torch.empty(geo.packed_weight_shape(), dtype=dtype),
        bias=torch.empty(geo.k, dtype=dtype),
        out=torch.empty(geo.out_shape(layout), dtype=dtype),
        workspace=torch.empty(cv.conv3d_workspace_shape(geo, split_k)) if split_k > 1 else None,
    )
    kwargs = dict(geometry=geo, tile=cv.ConvTile(32, 32, 2, 2, 1), split_k=split_k,
                  output_layout=layout, mma="mfma")  # fmt: skip
    return args, kwargs


LAUNCH_BAD = [
    # (replaced arguments, exception, message); every case fails before any compile
    (dict(geometry=(2, 5)), TypeError, "geometry: expected a Conv3dGeometry"),
    (dict(mma="xdl"), ValueError, "mma: expected one of"),
    (dict(tile=cv.ConvTile(32, 32, 1, 4, 1)), ValueError, "tile: .* not supported"),
    (dict(tile=cv.ConvTile(32, 32, 2, 2, 3)), ValueError, "tile: .* not supported"),
    (dict(split_k=0), ValueError, "split_k: expected an int >= 1"),
    (dict(split_k=True), ValueError, "split_k: expected an int >= 1"),
    (dict(output_layout="NHWC"), ValueError, "output_layout: expected one of"),
    (dict(split_k=2), ValueError, r"workspace: expected a float32 \[2, 336, 12\]"),
    (dict(split_k=2, workspace=torch.empty(2, 336, 12, dtype=torch.bfloat16)), ValueError,
     "workspace: expected dtype"),  # fmt: skip
    (dict(split_k=2, workspace=torch.empty(3, 336, 12)), ValueError, "workspace: expected shape"),
    (dict(x_padded_ndhwc=torch.empty(2, 4, 6, 7, 5, dtype=torch.bfloat16)), ValueError,
     r"x_padded_ndhwc: expected shape \[2, 4, 6, 7, 16\]"),  # fmt: skip
    (
        dict(x_padded_ndhwc=torch.empty(2, 4, 6, 7, 16)),
        ValueError,
        "x_padded_ndhwc: expected dtype",
    ),
    (dict(x_padded_ndhwc=torch.empty(2, 4, 6, 16, 7, dtype=torch.bfloat16).transpose(3, 4)),
     ValueError, "x_padded_ndhwc: expected a contiguous"),  # fmt: skip
    (dict(x_padded_ndhwc=[1, 2]), TypeError, "x_padded_ndhwc: expected a torch.Tensor"),
    (dict(packed_weight=torch.empty(12, 27 * 5, dtype=torch.bfloat16)), ValueError,
     r"packed_weight: expected shape \[12, 432\]"),  # fmt: skip
    (dict(packed_weight=torch.empty(12, 432, dtype=torch.float16)), ValueError,
     "packed_weight: expected dtype"),  # fmt: skip
    (dict(bias=torch.empty(12)), ValueError, "bias: expected dtype"),
    (dict(bias=torch.empty(13, dtype=torch.bfloat16)), ValueError, r"bias: expected shape \[12\]"),
    (dict(out=torch.empty(2, 4, 6, 7, 12, dtype=torch.bfloat16)), ValueError,
     r"out: expected shape \[2, 12, 4, 6, 7\]"),  # fmt: skip
    (dict(out=torch.empty(2, 12, 4, 6, 7, dtype=torch.float32)), ValueError, "out: expected dtype"),
]


@pytest.mark.parametrize(("change", "error", "message"), LAUNCH_BAD)
def test_launch_rejects_bad_arguments(change: dict, error: type, message: str) -> None:
    args, kwargs = _launch_args()
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(error, match=message):
        cv.launch_conv3d(*args.values(), **kwargs)


def test_launch_rejects_too_many_grid_rows() -> None:
    geo = cv.conv3d_geometry((1, 4, 2, 2, 2), (4, 1, 1, 1, 1), groups=4)
    args, kwargs = _launch_args(split_k=20000, geo=geo)
    with pytest.raises(ValueError, match="split_k: groups \\* split_k = 80000 exceeds"):
        cv.launch_conv3d(*args.values(), **kwargs)


PRE_BAD = [
    (dict(x=torch.empty(2, 6, 3, 3, 3)), ValueError, "x: expected dtype"),
    (dict(x=torch.empty(2, 6, 3, 3, dtype=torch.bfloat16)), ValueError, "x: expected a 5-D"),
    (dict(x=torch.empty(2, 3, 3, 3, 6, dtype=torch.bfloat16).permute(0, 4, 1, 2, 3)), ValueError,
     "x: expected a contiguous"),  # fmt: skip
    (dict(groups=4), ValueError, "groups: C = 6 is not divisible by groups = 4"),
    (dict(groups=0), ValueError, "groups: expected an int >= 1"),
    (dict(out=torch.empty(2, 3, 3, 3, 6, dtype=torch.bfloat16)), ValueError,
     r"out: expected shape \[2, 3, 3, 3, 32\]"),  # fmt: skip
    (dict(out=torch.empty(2, 3, 3, 3, 32, dtype=torch.float16)), ValueError, "out: expected dtype"),
    (dict(x=None), TypeError, "x: expected a torch.Tensor"),
]


@pytest.mark.parametrize(("change", "error", "message"), PRE_BAD)
def test_pretranspose_rejects_bad_arguments(change: dict, error: type, message: str) -> None:
    kwargs = dict(
        x=torch.empty(2, 6, 3, 3, 3, dtype=torch.bfloat16),
        out=torch.empty(2, 3, 3, 3, 32, dtype=torch.bfloat16),
        groups=2,
    )
    kwargs.update(change)
    with pytest.raises(error, match=message):
        cv.launch_conv3d_pretranspose(kwargs.pop("x"), kwargs.pop("out"), **kwargs)


def test_pretranspose_supported() -> None:
    assert cv.pretranspose_supported((2, 6, 3, 3, 3), 2)
    assert not cv.pretranspose_supported((2, 6, 3, 3, 3), 4)
    assert not cv.pretranspose_supported((2, 6, 3, 3), 1)
    assert not cv.pretranspose_supported((1, 1, 2048, 1024, 1024), 1)  # 2**31 elements
    # 3 channels padded to 16: the padded output passes 2**31 first.
    assert not cv.pretranspose_supported((1, 3, 128, 1024, 1024), 1)
    assert cv.pretranspose_supported((1, 16, 127, 1024, 1024), 1)


def _named_requests(geo, split_k: int, layout: str, with_bias: bool = True) -> list:
    """The kernels a launch on FakeTensors asks for in a gfx942 dry run (nothing compiles)."""
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:

        def empty(shape, dtype=torch.bfloat16):
            return torch.empty(shape, dtype=dtype, device="cuda")

        cv.launch_conv3d(
            empty(geo.x_padded_shape()), empty(geo.packed_weight_shape()),
            empty((geo.k,)) if with_bias else None, empty(geo.out_shape(layout)),
            empty(cv.conv3d_workspace_shape(geo, split_k), torch.float32) if split_k > 1 else None,
            geometry=geo, tile=cv.ConvTile(64, 32, 2, 2, 4), split_k=split_k,
            output_layout=layout, mma="mfma",
        )  # fmt: skip
        cv.launch_conv3d_pretranspose(
            empty((geo.n, geo.c, geo.d, geo.h, geo.w)), empty(geo.x_padded_shape()),
            groups=geo.groups,
        )  # fmt: skip
    return list(requests)


def test_frame_count_changes_no_kernel() -> None:
    """Launchers run on FakeTensors in the dry run, and the frame count D, like N, H, W and
    the channel counts, is a runtime argument: only layer constants pick a kernel."""
    base = _named_requests(GEO, 1, "NCDHW")
    assert [r.function for r in base] == ["conv3d_implicit", "conv3d_pretranspose"]
    params = dict(base[0].params)
    assert params["kernel_size"] == "(3, 3, 3)" and params["split_k"] == "1"
    assert params["output_layout"] == "'NCDHW'" and params["has_bias"] == "True"
    for other in (
        cv.conv3d_geometry((2, 5, 9, 6, 7), (12, 5, 3, 3, 3), padding=1),  # more frames
        cv.conv3d_geometry((1, 20, 17, 3, 11), (40, 20, 3, 3, 3), padding=1),  # all sizes
    ):
        assert [r.key for r in _named_requests(other, 1, "NCDHW")] == [r.key for r in base]
    split = _named_requests(GEO, 2, "NDHWC", with_bias=False)
    assert [r.function for r in split] == [
        "conv3d_implicit", "conv3d_splitk_epilogue", "conv3d_pretranspose"
    ]  # fmt: skip
    assert split[0].key != base[0].key and split[2].key == base[1].key
    assert dict(split[1].params)["output_layout"] == "'NDHWC'"
    # A layer constant (here the stride) is a different kernel.
    strided = cv.conv3d_geometry((2, 5, 4, 6, 7), (12, 5, 3, 3, 3), padding=1, stride=2)
    assert _named_requests(strided, 1, "NCDHW")[0].key != base[0].key


# --- compilation per arch ----------------------------------------------------------------

ARCH_MMA = {"gfx942": "mfma", "gfx950": "mfma", "gfx1250": "wmma"}
# (x NCDHW shape, weight shape, padding, groups, tile, split_k, output layout, bias, dtype):
# split_k 1 writes NCDHW with the bias, split_k 2 goes through the epilogue to NDHWC; each
# config also compiles the pre-transpose (one kernel per dtype).
COMPILED = [
    ((2, 5, 4, 6, 7), (24, 5, 3, 3, 3), 1, 1, (64, 64, 2, 2, 2), 1, "NCDHW", True, "bfloat16"),
    ((1, 32, 3, 5, 5), (16, 16, 1, 3, 3), 0, 2, (32, 64, 1, 4, 1), 2, "NDHWC", False, "float16"),
]
JIT_NAMES = [
    ["conv3d_implicit", "conv3d_pretranspose"],
    ["conv3d_implicit", "conv3d_splitk_epilogue", "conv3d_pretranspose"],
]
MNEMONIC = {
    ("gfx942", "bfloat16"): "v_mfma_f32_16x16x16_bf16",
    ("gfx942", "float16"): "v_mfma_f32_16x16x16_f16",
    ("gfx950", "bfloat16"): "v_mfma_f32_16x16x32_bf16",
    ("gfx950", "float16"): "v_mfma_f32_16x16x32_f16",
    ("gfx1250", "bfloat16"): "v_wmma_f32_16x16x32_bf16",
    ("gfx1250", "float16"): "v_wmma_f32_16x16x32_f16",
}

_CHILD = """
import json, os, shutil, sys, time
from pathlib import Path
import torch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.conv3d.kernels import implicit_gemm as cv

arch, mma, configs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
dump, keep = Path(sys.argv[4]), Path(sys.argv[5])

def launch(cfg, device):
    x_shape, w_shape, padding, groups, tile, split_k, layout, bias, dtype = cfg
    dtype = getattr(torch, dtype)
    geo = cv.conv3d_geometry(x_shape, w_shape, padding=padding, groups=groups)
    def empty(shape, dt=dtype):
        return torch.empty(shape, dtype=dt, device=device)
    times = {}
    start = time.perf_counter()
    cv.launch_conv3d(
        empty(geo.x_padded_shape()), empty(geo.packed_weight_shape()),
        empty((geo.k,)) if bias else None, empty(geo.out_shape(layout)),
        empty(cv.conv3d_workspace_shape(geo, split_k), torch.float32) if split_k > 1 else None,
        geometry=geo, tile=cv.ConvTile(*tile), split_k=split_k, output_layout=layout, mma=mma)
    times["conv"] = time.perf_counter() - start
    start = time.perf_counter()
    cv.launch_conv3d_pretranspose(empty(x_shape), empty(geo.x_padded_shape()), groups=groups)
    times["pretranspose"] = time.perf_counter() - start
    return times

""" + LIST_THEN_BUILD


@pytest.fixture(scope="module", params=list(ARCH_MMA))
def compiled(request, rocm_path: str, tmp_path_factory) -> dict:
    """One child process per arch compiles COMPILED twice: with FlyDSL's ISA listing, then
    into a disk cache inside a compiling dry run."""
    arch = request.param
    root = tmp_path_factory.mktemp(f"conv3d_{arch}")
    (root / "isa").mkdir()
    env = compile_env(arch, rocm_path, root / "cache")
    args = [arch, ARCH_MMA[arch], json.dumps(COMPILED), str(root / "dump"), str(root / "isa")]
    child = run_child(_CHILD, args, env)
    assert child.returncode == 0, (
        f"{arch}: compile process exited with {child.returncode}"
        f" (negative: killed by signal)\n{child.stderr[-4000:]}"
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    return {"arch": arch, "mma": ARCH_MMA[arch], **result}


@pytest.mark.slow
def test_one_cache_entry_per_kernel(compiled: dict) -> None:
    print(f"\n{compiled['arch']} compile seconds (listing, cache build):")
    for listed, built in zip(compiled["listed"], compiled["built"], strict=True):
        print({k: round(v, 2) for k, v in listed["seconds"].items()},
              {k: round(v, 2) for k, v in built["seconds"].items()})  # fmt: skip
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
    """llvm-objdump, where an installed one knows the arch, finds the MMA in the conv kernel
    only."""
    from aiter.flydsl_bridge import extract_code_objects

    arch, mma = compiled["arch"], compiled["mma"]
    other = "v_wmma" if mma == "mfma" else "v_mfma"
    for cfg, built in zip(COMPILED, compiled["built"], strict=True):
        for name, path in built["entries"]:
            text = disassemble_or_skip(extract_code_objects(path)[0], arch)
            assert (MNEMONIC[(arch, cfg[-1])] in text) == (name == "conv3d_implicit"), path
            assert other not in text, path


@pytest.mark.slow
def test_isa_listing(compiled: dict) -> None:
    """FlyDSL's ISA listing of every kernel: the arch and wave size, the MMA of the input dtype
    in the conv kernel only, and no register spills."""
    arch, mma = compiled["arch"], compiled["mma"]
    wave = mx.WAVE_SIZE[mma]
    for idx, (cfg, listed) in enumerate(zip(COMPILED, compiled["listed"], strict=True)):
        kernels = {name.removesuffix("_kernel"): path for name, path in listed["isa"].items()}
        assert sorted(kernels) == sorted(JIT_NAMES[idx]), listed["isa"]
        for name, path in kernels.items():
            text = Path(path).read_text()
            assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text, name
            assert f".wavefront_size: {wave}" in text, name
            assert (MNEMONIC[(arch, cfg[-1])] in text) == (name == "conv3d_implicit"), (idx, name)
            assert ("v_wmma" if mma == "mfma" else "v_mfma") not in text, (idx, name)
            spills = re.findall(r"\.(?:v|s)gpr_spill_count:\s+(\d+)", text)
            assert spills and all(s == "0" for s in spills), (idx, name, spills)
