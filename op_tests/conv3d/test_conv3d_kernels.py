"""Tests of the conv3d implicit-GEMM FlyDSL kernels without a GPU: their index math, the conv
kernel, split-K epilogue and pre-transpose emulated on CPU from conv3d_index.py against
torch.nn.functional.conv3d, the weight packing and torch fallbacks (FakeTensors included), the
launchers' argument checks, and compilation per arch."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.conv3d.kernels import implicit_gemm as cv
from aiter.ops.conv3d.kernels import implicit_gemm_index as ix
from aiter.ops.shared import gemm_index as a16
from op_tests.compile_child import LIST_THEN_BUILD, compile_env, disassemble_or_skip, run_child


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
    assert cv.K_STEP == ix.K_STEP == 64 and ix.K_STEP % a16.K_BLOCK == 0
    assert cv.LAYOUTS == ("NCDHW", "NDHWC")
    assert cv.MMA_FLAVOURS == ("mfma", "wmma")
    assert cv.WORKSPACE_DTYPE is torch.float32
    assert cv.INPUT_DTYPES == INPUT_DTYPES
    for mma in cv.MMA_FLAVOURS:
        assert ix.run_fits_a_tap(a16.WAVE_SIZE[mma])


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
    # Only the layouts whose wave sub-tile is not a multiple of 16 are missing.
    shapes = {(t.tile_m, t.tile_n, t.wave_m, t.wave_n) for t in tiles}
    assert (32, 32, 1, 4) not in shapes and (32, 64, 4, 1) not in shapes
    assert (128, 128, 1, 4) in shapes and (32, 32, 2, 2) in shapes


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
def test_every_tile_element_has_one_owner(mma: str) -> None:
    """Across waves, MMA repeats, lanes and accumulator elements a work-group covers its tile
    once, and the B row a lane loads is the column its accumulators hold."""
    wsz = a16.WAVE_SIZE[mma]
    rpl = a16.acc_rows_per_lane(wsz)
    for tile in {(t.tile_m, t.tile_n, t.wave_m, t.wave_n) for t in cv.SUPPORTED_TILES[mma]}:
        reps_m, reps_n = ix.wave_repeats(*tile)
        owners = torch.zeros(tile[0], tile[1], dtype=torch.int32)
        loaded = set()
        for wave in range(ix.WAVES_PER_BLOCK):
            wave_m, wave_n = ix.wave_origin(wave, *tile)
            for lane in range(wsz):
                for i in range(reps_m):
                    loaded.add(a16.operand_row(0, wave_m, i, lane))
                for j in range(reps_n):
                    b_row = a16.operand_row(0, wave_n, j, lane)
                    for i in range(reps_m):
                        for e in range(rpl):
                            r, c = a16.c_coord(0, 0, wave_m, wave_n, i, j, lane, e, wsz)
                            assert c == b_row
                            owners[r, c] += 1
        assert loaded == set(range(tile[0])), tile
        assert torch.equal(owners, torch.ones_like(owners)), tile


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


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
@pytest.mark.parametrize("cg", [1, 3, 16, 17, 40])
def test_runs_stay_in_one_tap(mma: str, cg: int) -> None:
    """Every lane's run starts at a multiple of its length, so with Cgp a multiple of 16 its
    elements share one tap and are consecutive channels of it."""
    wsz = a16.WAVE_SIZE[mma]
    run = a16.k_run(wsz)
    cgp = ix.padded_channels(cg)
    assert cgp % ix.CHANNEL_VECTOR == 0 and cg <= cgp < cg + ix.CHANNEL_VECTOR
    reduction = ix.reduction_size(cgp, 3, 2, 3)
    for kb in range(ix.num_k_blocks(reduction)):
        for lane in range(wsz):
            r = ix.run_start(kb, lane, wsz)
            first = ix.reduction_coords(r, cgp, 2, 3)
            last = ix.reduction_coords(r + run - 1, cgp, 2, 3)
            assert first[:3] == last[:3] and last[3] == first[3] + run - 1


def test_reduction_coords_invert_the_packing() -> None:
    kh, kw, cgp = 2, 3, 32
    r = 0
    for t in range(2):
        for h in range(kh):
            for w in range(kw):
                for c in range(cgp):
                    assert ix.packed_weight_index(5, t, h, w, c, kh, kw, cgp) == (5, r)
                    assert ix.reduction_coords(r, cgp, kh, kw) == (t, h, w, c)
                    r += 1


@pytest.mark.parametrize("split_k", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("reduction", [16, 32, 48, 64, 80, 432, 1024])
def test_split_ranges_cover_the_reduction_once(split_k: int, reduction: int) -> None:
    """The unmasked runs of all splits' steps cover every reduction index exactly once (per
    operand row: the lanes of one row, lane % 16 == 0 here, split each k-block into runs)."""
    for wsz in (32, 64):
        run = a16.k_run(wsz)
        covered = torch.zeros(reduction, dtype=torch.int32)
        for split in range(split_k):
            kb_begin, steps, r_end = ix.split_range(split, reduction, split_k, _pick)
            assert r_end <= reduction and r_end % ix.CHANNEL_VECTOR == 0
            for step in range(steps):
                for sub in range(ix.BLOCKS_PER_STEP):
                    for lane in range(0, wsz, ix.MMA_MN):
                        r = ix.run_start(ix.step_block(kb_begin, step, sub), lane, wsz)
                        if r < r_end:
                            assert r + run <= r_end
                            covered[r : r + run] += 1
        assert torch.equal(covered, torch.ones_like(covered)), (wsz, split_k)


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


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
def test_acc_coord_is_the_gemm_c_coord(mma: str) -> None:
    wsz = a16.WAVE_SIZE[mma]
    for lane in range(wsz):
        row0, col0 = ix.acc_origin(32, 64, 16, 48, lane, wsz)
        for i in range(3):
            for j in range(2):
                for e in range(a16.acc_rows_per_lane(wsz)):
                    assert ix.acc_coord(row0, col0, i, j, e) == a16.c_coord(
                        32, 64, 16, 48, i, j, lane, e, wsz
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


def emulate_conv(x_padded, packed, bias, geo, tile, split_k: int, layout: str, mma: str,
                 out_dtype):  # fmt: skip
    """The conv kernel work-group by work-group, as the GPU would run it.

    Within a work-group, the threads (waves x lanes), MMA repeats and the split's k-blocks are
    torch dimensions; each lane's runs are gathered from the flat padded input and packed
    weight at the offsets conv3d_index computes, placed into 16 x 32 MMA operand tiles at the
    (row, k) the a16w16 lane math gives, multiplied, and read back through acc_row/acc_col.
    Returns (destination, write counts): out flattened when split_k == 1 (after bias and the
    cast), else the fp32 [split_k, M, K] staging buffer.
    """
    wsz = a16.WAVE_SIZE[mma]
    run = a16.k_run(wsz)
    rpl = a16.acc_rows_per_lane(wsz)
    shape = (tile.tile_m, tile.tile_n, tile.wave_m, tile.wave_n)
    reps_m, reps_n = ix.wave_repeats(*shape)
    positions, kg, k, groups = geo.positions, geo.kg, geo.k, geo.groups
    out_d, out_h, out_w = geo.out_spatial
    spatial = out_d * out_h * out_w
    cgp, c_total, reduction = geo.cgp, geo.padded_c, geo.reduction
    xf, wf = x_padded.float().reshape(-1), packed.float().reshape(-1)
    grid_x, grid_y, grid_z = ix.conv_grid(positions, kg, groups, tile.tile_m, tile.tile_n, split_k)
    assert grid_z == 1
    m_tiles, n_tiles = ix.tile_counts(positions, kg, tile.tile_m, tile.tile_n)

    tid = torch.arange(ix.WAVES_PER_BLOCK * wsz)
    lane, wave = tid % wsz, tid // wsz
    wave_m, wave_n = ix.wave_origin(wave, *shape)
    rep_m = torch.arange(reps_m)[:, None]
    rep_n = torch.arange(reps_n)[:, None]
    elems = torch.arange(run)
    op_row = a16.lane_operand_row(lane)
    op_k = a16.lane_k_offset(lane, wsz)[:, None] + elems  # [threads, run]
    # Epilogue coordinates: [reps_m, reps_n, threads, rpl]
    ei, ej = torch.arange(reps_m)[:, None, None, None], torch.arange(reps_n)[None, :, None, None]
    el, ee = lane[None, None, :, None], torch.arange(rpl)[None, None, None, :]
    ew = wave[None, None, :, None]
    acc_r, acc_c = a16.acc_row(el, ee, wsz), a16.acc_col(el)

    size = split_k * positions * k if split_k > 1 else positions * k
    dst = torch.zeros(size, dtype=torch.float32)
    writes = torch.zeros(size, dtype=torch.int32)
    for bx in range(grid_x):
        tm, tn = ix.tile_of_block(bx, m_tiles, n_tiles, tile.wgm, _pick)
        origin_m, origin_n = ix.tile_origin(tm, tn, tile.tile_m, tile.tile_n)
        m = a16.operand_row(origin_m, wave_m[None], rep_m, lane[None])  # [reps_m, threads]
        m = _where(m < positions, m, positions - 1)
        n, od, oh, ow = ix.position_coords(m, out_d, out_h, out_w)
        d0 = ix.input_origin(od, geo.stride[0], geo.padding[0])
        h0 = ix.input_origin(oh, geo.stride[1], geo.padding[1])
        w0 = ix.input_origin(ow, geo.stride[2], geo.padding[2])
        col = a16.operand_row(origin_n, wave_n[None], rep_n, lane[None])  # [reps_n, threads]
        col = _where(col < kg, col, kg - 1)
        for by in range(grid_y):
            g, split = ix.group_and_split(by, split_k)
            b_row = ix.weight_offset(ix.out_channel(g, kg, col), reduction, 0)
            kb_begin, steps, r_end = ix.split_range(split, reduction, split_k, _pick)
            kbs = torch.tensor(
                [ix.step_block(kb_begin, s, sub) for s in range(steps)
                 for sub in range(ix.BLOCKS_PER_STEP)], dtype=torch.long,
            ).reshape(-1, 1)  # fmt: skip
            r = ix.run_start(kbs, lane[None], wsz)  # [kbs, threads]
            live = r < r_end
            r = _where(live, r, 0)
            t, hh, ww, c = ix.reduction_coords(r, cgp, geo.kh, geo.kw)
            c_index = ix.group_channel(g, cgp, c)[:, None]
            di = ix.tap_coord(d0[None], t[:, None], geo.dilation[0])  # [kbs, reps_m, threads]
            hi = ix.tap_coord(h0[None], hh[:, None], geo.dilation[1])
            wi = ix.tap_coord(w0[None], ww[:, None], geo.dilation[2])
            ok = live[:, None] & ix.inside(di, geo.d) & ix.inside(hi, geo.h) & ix.inside(wi, geo.w)
            voxel = _where(ok, ix.voxel_index(n[None], di, hi, wi, geo.d, geo.h, geo.w), 0)
            a_off = ix.x_offset(voxel, c_index, c_total)
            # A run never leaves its voxel's group channels, nor the input.
            assert bool(((c[:, None] + run <= cgp) | ~ok).all())
            assert (
                a_off.numel() == 0 or 0 <= int(a_off.min()) <= int(a_off.max()) + run <= xf.numel()
            )
            a_vals = _where(ok[..., None], xf[a_off[..., None] + elems], 0.0)
            b_off = b_row[None] + r[:, None]  # [kbs, reps_n, threads]
            assert (
                b_off.numel() == 0 or 0 <= int(b_off.min()) <= int(b_off.max()) + run <= wf.numel()
            )
            b_vals = _where(live[:, None, :, None], wf[b_off[..., None] + elems], 0.0)
            nkb = kbs.shape[0]
            a_tiles = torch.zeros(nkb, reps_m, ix.WAVES_PER_BLOCK, ix.MMA_MN, a16.K_BLOCK)
            b_tiles = torch.zeros(nkb, reps_n, ix.WAVES_PER_BLOCK, ix.MMA_MN, a16.K_BLOCK)
            index = (wave[:, None], op_row[:, None], op_k)
            a_tiles[(slice(None), slice(None)) + index] = a_vals
            b_tiles[(slice(None), slice(None)) + index] = b_vals
            # The MMAs of every k-block, summed: accs[wave, i, j, row, col].
            accs = torch.einsum("biwrk,bjwck->wijrc", a_tiles, b_tiles)
            values = accs[ew, ei, ej, acc_r, acc_c]
            # The kernel's epilogue: a column part per B repeat, a row part per row.
            row0, col0 = ix.acc_origin(origin_m, origin_n, wave_m, wave_n, lane, wsz)
            row, _ = ix.acc_coord(row0[None, None, :, None], 0, ei, 0, ee)
            _, ccol = ix.acc_coord(0, col0[None, None, :, None], 0, ej, 0)
            channel = ix.out_channel(g, kg, _where(ccol < kg, ccol, kg - 1))
            mask = (row < positions) & (ccol < kg)
            if split_k > 1:
                off = ix.staging_row_offset(split, row, positions, k) + channel
            else:
                if bias is not None:
                    values = values + bias.float()[channel]
                values = values.to(out_dtype).float()
                n_row = row // spatial if layout == "NCDHW" else 0
                off = ix.out_row_offset(row, n_row, k, spatial, layout)
                off = off + ix.out_col_offset(channel, spatial, layout)
            off = off[mask]
            dst[off] = values[mask]
            writes.index_put_((off,), torch.ones_like(off, dtype=torch.int32), accumulate=True)
    return dst, writes


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


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
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
    dst, writes = emulate_conv(x_padded, packed, bias, geo, case["tile"], split_k, layout,
                               case["mma"], dtype)  # fmt: skip
    assert torch.equal(writes, torch.ones_like(writes))  # every element exactly once
    if split_k > 1:
        out, out_writes = emulate_epilogue(dst, bias, geo, split_k, layout, dtype)
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
    ("mfma", "bfloat16"): "v_mfma_f32_16x16x16_bf16",
    ("mfma", "float16"): "v_mfma_f32_16x16x16_f16",
    ("wmma", "bfloat16"): "v_wmma_f32_16x16x32_bf16",
    ("wmma", "float16"): "v_wmma_f32_16x16x32_f16",
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
            assert (MNEMONIC[(mma, cfg[-1])] in text) == (name == "conv3d_implicit"), path
            assert other not in text, path


@pytest.mark.slow
def test_isa_listing(compiled: dict) -> None:
    """FlyDSL's ISA listing of every kernel: the arch and wave size, the MMA of the input dtype
    in the conv kernel only, and no register spills."""
    arch, mma = compiled["arch"], compiled["mma"]
    wave = a16.WAVE_SIZE[mma]
    for idx, (cfg, listed) in enumerate(zip(COMPILED, compiled["listed"], strict=True)):
        kernels = {name.removesuffix("_kernel"): path for name, path in listed["isa"].items()}
        assert sorted(kernels) == sorted(JIT_NAMES[idx]), listed["isa"]
        for name, path in kernels.items():
            text = Path(path).read_text()
            assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text, name
            assert f".wavefront_size: {wave}" in text, name
            assert (MNEMONIC[(mma, cfg[-1])] in text) == (name == "conv3d_implicit"), (idx, name)
            assert ("v_wmma" if mma == "mfma" else "v_mfma") not in text, (idx, name)
            spills = re.findall(r"\.(?:v|s)gpr_spill_count:\s+(\d+)", text)
            assert spills and all(s == "0" for s in spills), (idx, name, spills)
