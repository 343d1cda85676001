"""Tests of the a8w8 (fp8/int8) GEMM FlyDSL kernels without a GPU: weight preshuffle, index math
and split-K semaphore protocol emulated on CPU against torch, MMA lane layouts, per-arch compiles.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiter.ops.gemm.kernels import a8w8 as g
from aiter.ops.shared import gemm_index_8bit as ix
from aiter.ops.shared import mainloop_index as mx
from aiter.ops.shared import preshuffle
from op_tests.compile_child import compile_env, disassemble_or_skip, run_child
from op_tests.shared.mainloop_emulation import WorkGroup, conflict_summary, fast_first, round_to

REPO = Path(__file__).resolve().parents[2]
FNUZ, FN, I8 = torch.float8_e4m3fnuz, torch.float8_e4m3fn, torch.int8


# --- FlyDSL's MMA atoms: what each lane's registers hold ---------------------------------


def _layout_size(shape) -> int:
    if isinstance(shape, int):
        return shape
    size = 1
    for sub in shape:
        size *= _layout_size(sub)
    return size


def _layout_offset(shape, stride, x: int) -> int:
    """Offset of flat coordinate x in a (nested) CuTe-style layout, first mode fastest."""
    if isinstance(shape, int):
        return x * stride
    offset = 0
    for sub_shape, sub_stride in zip(shape, stride, strict=True):
        size = _layout_size(sub_shape)
        offset += _layout_offset(sub_shape, sub_stride, x % size)
        x //= size
    return offset


def _tv_table(text: str, values: int) -> list[list[tuple[int, int]]]:
    """[lane][value] -> (row, column) inside a 16-row operand tile stored column-major."""
    body = re.fullmatch(r"!fly\.layout<(.*)>", str(text).strip()).group(1)
    shape, stride = (ast.literal_eval(part) for part in body.split(":"))
    (thr_shape, val_shape), (thr_stride, val_stride) = shape, stride
    assert _layout_size(val_shape) == values
    table = []
    for lane in range(_layout_size(thr_shape)):
        base = _layout_offset(thr_shape, thr_stride, lane)
        offsets = [base + _layout_offset(val_shape, val_stride, v) for v in range(values)]
        table.append([(off % 16, off // 16) for off in offsets])
    return table


def test_atom_layout_parser() -> None:
    # CDNA3 16x16x32 fp8 MFMA A operand: lane l holds row l % 16, K slots 8 * (l // 16) + v.
    table = _tv_table("!fly.layout<((16,4),8):((1,128),16)>", 8)
    assert table[0] == [(0, v) for v in range(8)]
    assert table[17] == [(1, 8 + v) for v in range(8)]
    assert table[63][7] == (15, 31)


_ATOM_CHILD = """
import json, sys
from flydsl._mlir import ir
from flydsl._mlir._mlir_libs._mlirDialectsFly import MmaAtomType
from flydsl._mlir._mlir_libs._mlirDialectsFlyROCDL import MmaOpCDNA3_MFMAType, MmaOpGFX1250_WMMAType

found = {}
for case in sys.argv[1:]:
    mma, dtype = case.split(":")
    with ir.Context(), ir.Location.unknown():
        elem = {
            "fnuz": ir.Float8E4M3FNUZType.get,
            "fn": ir.Float8E4M3FNType.get,
            "i8": lambda: ir.IntegerType.get_signless(8),
        }[dtype]()
        acc = ir.IntegerType.get_signless(32) if dtype == "i8" else ir.F32Type.get()
        cls, k = (MmaOpCDNA3_MFMAType, 32) if mma == "mfma" else (MmaOpGFX1250_WMMAType, 64)
        atom = MmaAtomType.get(cls.get(16, 16, k, elem, elem, acc))
        found[case] = [str(atom.thr_layout), str(atom.tv_layout_a), str(atom.tv_layout_b),
                       str(atom.tv_layout_c)]
print(json.dumps(found))
"""

# (flavour, input dtype) pairs whose FlyDSL atom the kernels' instruction corresponds to.
ATOM_CASES = [("mfma", "fnuz"), ("mfma", "fn"), ("mfma", "i8"), ("wmma", "fn"), ("wmma", "i8")]
ATOM_DTYPE = {FNUZ: "fnuz", FN: "fn", I8: "i8"}
_ATOMS: dict[tuple[str, str], dict[str, list]] = {}


def atom_tables(mma: str, dtype: str) -> dict[str, list]:
    """A, B and C thread-value tables of FlyDSL's atom for the kernel's MMA instruction.

    Built in a child process: FlyDSL asserts (aborting the process) on an atom it lacks.
    """
    if not _ATOMS:  # every case in one child: importing FlyDSL dominates its time
        child = subprocess.run(
            [sys.executable, "-c", _ATOM_CHILD, *(f"{m}:{d}" for m, d in ATOM_CASES)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == 0, child.stderr[-2000:]
        for case, (thr, a, b, c) in json.loads(child.stdout.strip().splitlines()[-1]).items():
            flavour, kind = case.split(":")
            wsz = ix.WAVE_SIZE[flavour]
            assert thr == f"!fly.layout<{wsz}:1>"
            per_lane = 16 * ix.MMA_K[flavour] // wsz
            _ATOMS[(flavour, kind)] = {
                "A": _tv_table(a, per_lane),
                "B": _tv_table(b, per_lane),
                "C": _tv_table(c, ix.acc_rows_per_lane(wsz)),
            }
    return _ATOMS[(mma, dtype)]


@pytest.mark.parametrize(("mma", "dtype"), ATOM_CASES)
def test_lane_layout_matches_flydsl_mma_atom(mma: str, dtype: str) -> None:
    """Lane l feeds operand row l % 16 for A and B with one shared K-slot order and reads C
    element (acc_row, acc_col); FlyDSL's atom for the same instruction must agree."""
    wsz = ix.WAVE_SIZE[mma]
    tables = atom_tables(mma, dtype)
    assert tables["A"] == tables["B"]
    for lane in range(wsz):
        for row, _ in tables["A"][lane]:
            assert row == ix.lane_operand_row(lane), lane
        for e, (row, col) in enumerate(tables["C"][lane]):
            assert (row, col) == (ix.acc_row(lane, e, wsz), ix.acc_col(lane)), (lane, e)


@pytest.mark.parametrize(("mma", "dtype"), ATOM_CASES)
def test_lane_k_runs_feed_every_k_once(mma: str, dtype: str) -> None:
    """Per operand row, the MMA K slots of all steps of a k-block map one to one onto the
    k-block's 64 k, through each lane's contiguous run (the kernel's operand_offset)."""
    wsz = ix.WAVE_SIZE[mma]
    per_mma = 16 * ix.MMA_K[mma] // wsz
    assert per_mma * ix.mma_steps(mma) == ix.k_run(wsz)
    table = atom_tables(mma, dtype)["A"]
    for row in range(16):
        seen = []
        for step in range(ix.mma_steps(mma)):
            slot_to_k = {}
            for lane in range(wsz):
                if ix.lane_operand_row(lane) != row:
                    continue
                for v, (_, slot) in enumerate(table[lane]):
                    slot_to_k[slot] = ix.lane_k_offset(lane, wsz) + step * per_mma + v
            assert sorted(slot_to_k) == list(range(ix.MMA_K[mma]))
            seen += slot_to_k.values()
        assert sorted(seen) == list(range(ix.K_BLOCK))


# --- weight preshuffle ---------------------------------------------------------------------


def _random_bytes(shape, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8).view(dtype)


@pytest.mark.parametrize("dtype", [FNUZ, FN, I8])
@pytest.mark.parametrize(
    ("shape", "layout"),
    [((16, 16), (16, 16)), ((32, 64), (16, 16)), ((48, 192), (16, 16)), ((64, 64), (32, 8))],
)
def test_shuffle_round_trip_is_identity(dtype, shape, layout) -> None:
    w = _random_bytes(shape, dtype, seed=shape[0] * shape[1])
    shuffled = preshuffle.shuffle_weight(w, layout)
    assert shuffled.shape == w.shape and shuffled.dtype == dtype and shuffled.is_contiguous()
    back = preshuffle.unshuffle_weight(shuffled, layout)
    # Compare bytes: random fp8 bytes include NaN encodings.
    assert torch.equal(back.view(torch.int8), w.view(torch.int8))
    if shape != layout:
        assert not torch.equal(shuffled.view(torch.int8), w.view(torch.int8))


def test_a_stack_of_weights_shuffles_each_slab_on_its_own() -> None:
    """MoE experts: shuffling [E, N, K] equals shuffling each [N, K] slab."""
    w = _random_bytes((3, 32, 64), FN, seed=7)
    shuffled = preshuffle.shuffle_weight(w)
    assert shuffled.shape == w.shape
    for e in range(3):
        assert torch.equal(
            shuffled[e].view(torch.int8), preshuffle.shuffle_weight(w[e]).view(torch.int8)
        )
    assert torch.equal(preshuffle.unshuffle_weight(shuffled).view(torch.int8), w.view(torch.int8))


def test_shuffle_matches_hand_written_reference() -> None:
    """Layout (16, 16): 16x16 blocks of W, N-group major then K chunk, each block row-major."""
    n, k = 32, 48
    w = torch.arange(n * k, dtype=torch.int32).reshape(n, k)
    blocks = [
        w[ng * 16 : (ng + 1) * 16, kc * 16 : (kc + 1) * 16].reshape(-1)
        for ng in range(n // 16)
        for kc in range(k // 16)
    ]
    expected = torch.cat(blocks)
    assert torch.equal(preshuffle.shuffle_weight(w).reshape(-1), expected)
    # First chunk: rows 0..15 of K 0..15; the second chunk continues row 0 at K 16.
    assert preshuffle.shuffle_weight(w).reshape(-1)[256].item() == w[0, 16].item()


def test_shuffled_offset_reads_the_right_element() -> None:
    n, k = 48, 128
    w = _random_bytes((n, k), I8, seed=7)
    flat = preshuffle.shuffle_weight(w, g.BPRESHUFFLE_LAYOUT).reshape(-1)
    for row in range(n):
        for kk in range(k):
            assert flat[ix.shuffled_offset(row, kk, k)] == w[row, kk], (row, kk)


def test_kernel_weight_chunks_read_w_rows() -> None:
    """Each 16-byte chunk the main loop loads from the shuffled weight (mx.shuffled_element,
    from a block's first row, a multiple of 16) is W[row, kk:kk + 16]."""
    n, k = 48, 256
    w = _random_bytes((n, k), I8, seed=11)
    flat = preshuffle.shuffle_weight(w).reshape(-1)
    for first in (0, 16, 32):
        base = first * k
        for row in range(n - first):
            for kk in range(0, k, 16):
                off = base + mx.shuffled_element(row, kk, k)
                assert torch.equal(flat[off : off + 16], w[first + row, kk : kk + 16]), (row, kk)


@pytest.mark.parametrize(
    ("shape", "layout", "message"),
    [
        ((24, 32), (16, 16), r"w: N = w.shape\[-2\] = 24 must be a multiple of layout\[0\] = 16"),
        ((32, 40), (16, 16), r"w: K = w.shape\[-1\] = 40 must be a multiple of layout\[1\] = 16"),
        ((16,), (16, 16), r"w: expected a \[\.\.\., N, K\] tensor"),
        ((16, 16), (16, 0), "layout: expected a pair of positive ints"),
        ((16, 16), [16, 16], "layout: expected a pair of positive ints"),
    ],
)
def test_shuffle_rejects_bad_shapes(shape, layout, message) -> None:
    w = torch.zeros(shape, dtype=I8)
    for fn in (preshuffle.shuffle_weight, preshuffle.unshuffle_weight):
        with pytest.raises(ValueError, match=message):
            fn(w, layout)


# --- tiles and constants ---------------------------------------------------------------------


def test_public_constants() -> None:
    assert set(g.BPRESHUFFLE_TILES) == {"mfma", "wmma"}
    assert set(g.BLOCKSCALE_TILES) == {"mfma"}
    assert g.BPRESHUFFLE_K_MULTIPLE == g.K_BLOCK == ix.K_BLOCK == 64
    assert g.BPRESHUFFLE_N_MULTIPLE == 16
    assert g.BPRESHUFFLE_LAYOUT == (16, 16)
    assert g.BLOCKSCALE_BLOCK == 128
    assert "int64" in g.SEMAPHORE_DTYPE_DOC and "int32" in g.SEMAPHORE_DTYPE_DOC
    assert g.semaphore_size(100, 200, g.A8W8Tile(32, 64, 64)) == 4 * 4
    assert g.semaphore_size(1, 64, g.A8W8Tile(16, 64, 64)) == 1


@pytest.mark.parametrize(
    "tiles, mma", [(g.BPRESHUFFLE_TILES, "mfma"), (g.BPRESHUFFLE_TILES, "wmma"), (g.BLOCKSCALE_TILES, "mfma")]  # fmt: skip
)
def test_tiles_fit_the_kernel(tiles, mma) -> None:
    for tile in tiles[mma]:
        assert tile.tile_m % 16 == 0 and tile.tile_n % (mx.WAVES_PER_BLOCK * 16) == 0
        assert tile.tile_k % g.K_BLOCK == 0
        if tiles is g.BLOCKSCALE_TILES:
            assert tile.tile_k == ix.SCALE_BLOCK and tile.tile_m <= mx.threads(mma)
        problem = (
            g.blockscale_tile_problem if tiles is g.BLOCKSCALE_TILES else g.bpreshuffle_tile_problem
        )
        assert problem(tile, mma) is None


# --- the kernels, emulated on CPU ---------------------------------------------------------


class A8W8Emulation:
    """One launch of gemm_a8w8_kernel, block by block in a given arrival order, each block a
    shared-main-loop WorkGroup phase by phase, with the kernel's scales and split-K hand-off."""

    def __init__(self, family, arch, xq, wq_stored, x_scale, w_scale, out_dtype, tile, split_k,
                 sem_dtype):  # fmt: skip
        self.family, self.arch, self.tile, self.split_k = family, arch, tile, split_k
        self.mma = "wmma" if arch == "gfx1250" else "mfma"
        self.m, self.k = xq.shape
        self.n = wq_stored.shape[0]
        self.int8 = xq.dtype == torch.int8
        self.x = xq.double().reshape(-1)
        self.w = wq_stored.double().reshape(-1)
        self.xs = x_scale.double().reshape(-1)
        self.ws = w_scale.double().reshape(-1)
        self.num_sb = self.k // 128
        self.out_dtype = out_dtype
        self.grid = mx.grid_size(self.m, self.n, tile.tile_m, tile.tile_n, split_k)
        self.out = torch.zeros(self.m * self.n, dtype=torch.float64)
        self.out_writes = torch.zeros(self.m * self.n, dtype=torch.int32)
        self.workspace = torch.full((split_k * self.m * self.n,), float("nan"), dtype=torch.float64)
        self.semaphore = torch.zeros(g.semaphore_size(self.m, self.n, tile), dtype=sem_dtype)
        self.reducers: dict[int, int] = {}
        self.races: list[str] = []
        self.stats: dict = {}

    def _store_out(self, row, col, value):
        if row < self.m and col < self.n:
            off = mx.c_offset(row, col, self.n)
            self.out[off] = round_to(value, self.out_dtype)
            self.out_writes[off] += 1

    def run_block(self, split, bid_m, bid_n):
        tile, m, n, k = self.tile, self.m, self.n, self.k
        blockscale = self.family == "blockscale"
        origin_m, origin_n = mx.block_origin(bid_m, bid_n, tile.tile_m, tile.tile_n)
        nthreads = mx.threads(self.mma)
        stage = mx.lds_bytes(tile.tile_m, tile.tile_n, tile.tile_k, 1, 4, self.mma)
        xs_base = -(-stage // 16) * 16  # the x-scale slots: their own allocation, after A's
        wg = WorkGroup(
            mma=self.mma, arch=self.arch, tile=tile, elem_bytes=1, a_flat=self.x,
            a_rows=lambda r: ((origin_m + r) * k, r < m - origin_m),
            b_flat=self.w, b_base=origin_n * k, b_rows=n - origin_n, b_shuffled=not blockscale,
            k=k, origin=(origin_m, origin_n), lds_bytes=xs_base + 4 * nthreads,
            int8=self.int8,
        )  # fmt: skip
        units = self.num_sb if blockscale else k // g.K_BLOCK
        unit_blocks = 2 if blockscale else 1
        sb_begin, sb_end = mx.split_k_range(split, units, self.split_k)

        def w_scale(col, sb):
            return float(self.ws[(col // 128) * self.num_sb + sb]) if col < n else 0.0

        def on_store(wg, t):  # every thread stages x_scale[row tid, sb] beside A
            sb = sb_begin + t
            for wave in range(mx.WAVES_PER_BLOCK):
                lane_bytes = []
                for lane in range(wg.wsz):
                    tid = wave * wg.wsz + lane
                    row = origin_m + tid
                    ok = tid < tile.tile_m and row < m and 0 <= sb < self.num_sb
                    value = float(self.xs[row * self.num_sb + sb]) if ok else 0.0
                    wg.lds.store(wave, xs_base + 4 * tid, [value], 4)
                    lane_bytes.append(xs_base + 4 * tid)
                wg.lds.instruction("x-scale write", wave, lane_bytes, 4)

        def k_tile(wg, b_runs, accs, t):  # each A repeat's partial, scaled, added
            sb = sb_begin + t
            rows_per_lane = mx.acc_rows_per_lane(wg.mma)
            for wave in range(mx.WAVES_PER_BLOCK):
                for i in range(wg.reps_m):
                    partial = wg.zero(wg.reps_n)
                    wg.mma_k_tile_rep(b_runs, wave, i, partial)
                    first = [xs_base + 4 * wg.lane_row(i, lane, 0) for lane in range(wg.wsz)]
                    wg.lds.instruction("x-scale read", wave, first, 4 * rows_per_lane)
                    for j in range(wg.reps_n):
                        for lane in range(wg.wsz):
                            xs = wg.lds.load(first[lane], rows_per_lane, 4)
                            ws = w_scale(origin_n + wg.lane_col(wave, j, lane), sb)
                            acc = accs[wave][i * wg.reps_n + j][lane]
                            for e in range(rows_per_lane):
                                scaled = round_to(
                                    round_to(partial[j][lane][e] * xs[e], torch.float32) * ws,
                                    torch.float32,
                                )
                                acc[e] = round_to(acc[e] + scaled, torch.float32)  # fmt: skip

        accs = wg.main_loop(sb_begin * unit_blocks, sb_end * unit_blocks,
                            k_tile=k_tile if blockscale else None,
                            on_store=on_store if blockscale else None)  # fmt: skip

        def scales_fn(wave, i, j, lane, e, acc):
            if blockscale or self.split_k > 1:
                return acc
            row = origin_m + wg.lane_row(i, lane, e)
            col = origin_n + wg.lane_col(wave, j, lane)
            xs = float(self.xs[row]) if row < m else 0.0
            ws = float(self.ws[col]) if col < n else 0.0
            return round_to(round_to(acc * xs, torch.float32) * ws, torch.float32)

        def store(row, col, values):
            row, col = origin_m + row, origin_n + col
            for e, value in enumerate(values):
                if row < m and col + e < n:
                    if self.split_k == 1:
                        self._store_out(row, col + e, value)
                    else:
                        self.workspace[mx.workspace_offset(split, row, col + e, m, n)] = value

        staged = self.out_dtype if self.split_k == 1 else torch.float32
        wg.stage_and_store(accs, scales_fn, staged, store)
        self.races += wg.lds.races
        self.stats = wg.lds.stats
        if self.split_k == 1:
            return
        slot = ix.semaphore_slot(bid_m, bid_n, self.grid[0])
        previous = int(self.semaphore[slot])
        self.semaphore[slot] += 1
        if not ix.is_last_arrival(previous, self.split_k):
            return
        assert slot not in self.reducers
        self.reducers[slot] = split
        for wave in range(mx.WAVES_PER_BLOCK):
            lanes = range(mx.WAVE_SIZE[self.mma])
            for ri in range(wg.reps_m):
                for store_pass in range(mx.out_store_passes(tile.tile_n, 4, self.mma)):
                    for lane in lanes:
                        row16, col, real = mx.out_read_coord(store_pass, lane, tile.tile_n, 4,
                                                             self.mma)  # fmt: skip
                        row = origin_m + ri * 16 + row16
                        col = origin_n + mx.wave_col0(wave, tile.tile_n) + col
                        if not (real and row < m and col < n):
                            continue
                        for e in range(4):
                            if col + e >= n:
                                continue
                            total = 0.0
                            for s in range(self.split_k):
                                part = float(self.workspace[mx.workspace_offset(s, row, col + e,
                                                                                m, n)])  # fmt: skip
                                assert part == part, "read a partial before it was written"
                                total = round_to(total + part, torch.float32)
                            if not blockscale:
                                total = round_to(total * float(self.xs[row]), torch.float32)
                                total = round_to(total * float(self.ws[col + e]), torch.float32)
                            self._store_out(row, col + e, total)
        self.semaphore[slot] = 0


def _inputs(family, dtype, m, n, k, seed):
    """Small-integer operands (exact in fp8 e4m3 and int8) and power-of-two scales, so every
    fp32 product and sum is exact and the emulation must match torch bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    xq = torch.randint(-3, 4, (m, k), generator=gen).to(dtype)
    wq = torch.randint(-3, 4, (n, k), generator=gen).to(dtype)
    if family == "bpreshuffle":
        xs_shape, ws_shape = (m, 1), (1, n)
    else:
        xs_shape, ws_shape = (m, k // 128), (n // 128, k // 128)
    x_scale = torch.exp2(torch.randint(-3, 3, xs_shape, generator=gen).float())
    w_scale = torch.exp2(torch.randint(-3, 3, ws_shape, generator=gen).float())
    return xq, wq, x_scale, w_scale


def _reference(family, xq, wq, x_scale, w_scale, out_dtype):
    x, w = xq.float(), wq.float()
    if family == "bpreshuffle":
        return ((x @ w.T) * x_scale * w_scale).to(out_dtype)
    out = torch.zeros(x.shape[0], w.shape[0])
    w_block = w_scale.repeat_interleave(128, dim=0)  # [N, K / 128]
    for kb in range(x.shape[1] // 128):
        part = x[:, kb * 128 : (kb + 1) * 128] @ w[:, kb * 128 : (kb + 1) * 128].T
        out += part * x_scale[:, kb : kb + 1] * w_block[:, kb][None, :]
    return out.to(out_dtype)


EMULATED = [
    # family, arch, in dtype, tile, split_k, M, N, K, out dtype, semaphore dtype
    ("bpreshuffle", "gfx942", FNUZ, (32, 64, 128), 1, 45, 80, 320, torch.bfloat16, None),
    ("bpreshuffle", "gfx942", I8, (16, 128, 64), 3, 7, 128, 192, torch.float16, torch.int64),
    ("bpreshuffle", "gfx950", FN, (64, 64, 64), 4, 70, 64, 128, torch.bfloat16, torch.int32),
    ("bpreshuffle", "gfx950", FN, (256, 128, 64), 1, 20, 144, 128, torch.bfloat16, None),
    ("bpreshuffle", "gfx950", FN, (64, 128, 128), 2, 70, 256, 384, torch.bfloat16, torch.int32),
    ("bpreshuffle", "gfx950", I8, (32, 64, 128), 1, 20, 64, 256, torch.float16, None),
    ("bpreshuffle", "gfx1250", FN, (32, 64, 128), 2, 33, 96, 320, torch.bfloat16, torch.int64),
    ("bpreshuffle", "gfx1250", I8, (128, 64, 64), 1, 20, 48, 128, torch.float16, None),
    ("blockscale", "gfx942", FNUZ, (32, 64, 128), 1, 40, 128, 256, torch.bfloat16, None),
    ("blockscale", "gfx950", FN, (16, 128, 128), 3, 9, 256, 384, torch.float16, torch.int32),
    ("blockscale", "gfx942", FNUZ, (64, 64, 128), 3, 65, 128, 256, torch.bfloat16, torch.int64),
]


@pytest.mark.parametrize(
    ("family", "arch", "dtype", "tile", "split_k", "m", "n", "k", "out_dtype", "sem_dtype"),
    fast_first(EMULATED, 1),
)
def test_emulated_work_groups_match_torch(family, arch, dtype, tile, split_k, m, n, k, out_dtype, sem_dtype) -> None:  # fmt: skip
    """Bit-exact against torch (small integers, power-of-two scales), every element written
    once, no LDS race, and the split-K hand-off reduces each tile once in its last block."""
    seed = m * 1000 + n + k + split_k
    xq, wq, x_scale, w_scale = _inputs(family, dtype, m, n, k, seed)
    stored = preshuffle.shuffle_weight(wq, g.BPRESHUFFLE_LAYOUT) if family == "bpreshuffle" else wq
    tile = g.A8W8Tile(*tile)
    emu = A8W8Emulation(family, arch, xq, stored, x_scale, w_scale, out_dtype, tile, split_k,
                        sem_dtype or torch.int64)  # fmt: skip
    grid_x, grid_y, grid_z = emu.grid
    blocks = [(s, by, bx) for s in range(grid_z) for by in range(grid_y) for bx in range(grid_x)]
    # Blocks of one launch arrive in any order: a seeded shuffle of the whole grid.
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed)).tolist()
    last_split = {}
    for idx in order:
        split, bid_m, bid_n = blocks[idx]
        emu.run_block(split, bid_m, bid_n)
        last_split[ix.semaphore_slot(bid_m, bid_n, grid_x)] = split

    expected = _reference(family, xq, wq, x_scale, w_scale, out_dtype)
    assert torch.equal(emu.out.view(m, n).to(out_dtype), expected)
    assert torch.equal(emu.out_writes.view(m, n), torch.ones(m, n, dtype=torch.int32))
    assert emu.races == []
    for kind in ("A write", "A read"):
        assert emu.stats[kind].extra_cycles == 0, conflict_summary(emu.stats)
    if split_k > 1:
        # The block that arrived last reduced its tile, every tile once, semaphores back to 0.
        assert emu.reducers == last_split
        assert len(emu.reducers) == g.semaphore_size(m, n, tile)
        assert torch.equal(emu.semaphore, torch.zeros_like(emu.semaphore))
        assert not torch.isnan(emu.workspace).any()  # every split wrote its whole partial


@pytest.mark.parametrize("num_sb, split_k", [(1, 3), (2, 4), (3, 3), (5, 2)])
def test_splits_cover_every_scale_block_once(num_sb: int, split_k: int) -> None:
    owned = [b for s in range(split_k) for b in range(*ix.split_k_range(s, num_sb, split_k))]
    assert owned == list(range(num_sb))


# --- host entries ----------------------------------------------------------------------------


def _args(family="bpreshuffle", m=4, n=128, k=256, dtype=FNUZ, out_dtype=torch.bfloat16):
    xq, wq = torch.empty(m, k, dtype=dtype), torch.empty(n, k, dtype=dtype)
    if family == "bpreshuffle":
        xs, ws = torch.empty(m, 1), torch.empty(1, n)
    else:
        xs, ws = torch.empty(m, k // 128), torch.empty(n // 128, k // 128)
    return xq, wq, xs, ws, torch.empty(m, n, dtype=out_dtype)


T_BP = g.A8W8Tile(32, 64, 64)
T_BS = g.A8W8Tile(32, 64, 128)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(tile=T_BP, split_k=1, mma="xdl"), ValueError, "mma: expected one of"),
        (dict(tile=g.A8W8Tile(32, 96, 64), split_k=1, mma="mfma"), ValueError, "tile: .* not supported"),  # fmt: skip
        (dict(tile=T_BP, split_k=0, mma="mfma"), ValueError, "split_k: expected an int >= 1"),
        (dict(tile=T_BP, split_k=2, mma="mfma"), ValueError, "workspace: expected a float32"),
    ],
)
def test_bpreshuffle_rejects_bad_arguments(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        g.launch_gemm_a8w8_bpreshuffle(*_args(), None, None, **kwargs)


def test_split_k_needs_a_semaphore_of_the_right_size() -> None:
    xq, wq, xs, ws, out = _args()
    workspace = torch.empty(2, 4, 128)
    with pytest.raises(ValueError, match="semaphore: expected an int64 or int32"):
        g.launch_gemm_a8w8_bpreshuffle(xq, wq, xs, ws, out, workspace, None, tile=T_BP, split_k=2, mma="mfma")  # fmt: skip
    with pytest.raises(ValueError, match="semaphore: expected an int64 or int32"):
        g.launch_gemm_a8w8_bpreshuffle(xq, wq, xs, ws, out, workspace, torch.zeros(2), tile=T_BP, split_k=2, mma="mfma")  # fmt: skip
    with pytest.raises(ValueError, match="semaphore: expected a 1-D tensor of at least 2"):
        g.launch_gemm_a8w8_bpreshuffle(xq, wq, xs, ws, out, workspace, torch.zeros(1, dtype=torch.int64), tile=T_BP, split_k=2, mma="mfma")  # fmt: skip
    with pytest.raises(ValueError, match=r"workspace: expected shape \[2, 4, 128\]"):
        g.launch_gemm_a8w8_bpreshuffle(xq, wq, xs, ws, out, torch.empty(3, 4, 128), torch.zeros(2, dtype=torch.int64), tile=T_BP, split_k=2, mma="mfma")  # fmt: skip


@pytest.mark.parametrize(
    ("family", "change", "message"),
    [
        ("bpreshuffle", dict(k=96), "xq: K = xq.shape.1. must be a positive multiple of 64"),
        ("bpreshuffle", dict(n=120), "wq: N = wq.shape.0. must be a multiple of 16"),
        ("bpreshuffle", dict(dtype=torch.bfloat16), "xq: expected dtype in"),
        ("bpreshuffle", dict(out_dtype=torch.float32), "out: expected dtype in"),
        ("blockscale", dict(k=192), "xq: K = xq.shape.1. must be a positive multiple of 128"),
        ("blockscale", dict(n=192), "wq: N = wq.shape.0. must be a multiple of 128"),
        ("blockscale", dict(dtype=I8), "xq: expected dtype in"),
    ],
)
def test_launch_rejects_bad_shapes(family, change, message) -> None:
    launch = getattr(g, f"launch_gemm_a8w8_{family}")
    tile = T_BP if family == "bpreshuffle" else T_BS
    with pytest.raises(ValueError, match=message):
        launch(*_args(family, **change), None, None, tile=tile, split_k=1, mma="mfma")


def test_launch_rejects_mismatched_tensors() -> None:
    xq, wq, xs, ws, out = _args()
    cases = [
        ((xq, wq.view(FN), xs, ws, out), "wq: expected dtype torch.float8_e4m3fnuz"),
        ((xq, wq, xs[:2], ws, out), r"x_scale: expected shape \[4, 1\]"),
        ((xq, wq, xs, ws.double(), out), "w_scale: expected dtype torch.float32"),
        ((xq, wq, xs, ws, out[:, :64]), "out: expected a contiguous tensor"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            g.launch_gemm_a8w8_bpreshuffle(*args, None, None, tile=T_BP, split_k=1, mma="mfma")


def test_blockscale_has_no_wmma_kernel() -> None:
    with pytest.raises(NotImplementedError, match="no gfx1250 WMMA blockscale kernel"):
        g.launch_gemm_a8w8_blockscale(
            *_args("blockscale", dtype=FN), None, None, tile=T_BS, split_k=1, mma="wmma"
        )


@pytest.mark.gpu
def test_kernel_numerics_on_gpu() -> None:
    fp8 = FNUZ  # gfx942; FN on gfx950/gfx1250
    m, n, k, split_k = 100, 256, 512, 3
    x = torch.randn(m, k, device="cuda").to(fp8)
    w = torch.randn(n, k, device="cuda").to(fp8)
    xs, ws = torch.rand(m, 1, device="cuda"), torch.rand(1, n, device="cuda")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    tile = g.A8W8Tile(32, 64, 128)
    workspace = torch.empty(split_k, m, n, device="cuda")
    sem = torch.zeros(g.semaphore_size(m, n, tile), dtype=torch.int64, device="cuda")
    ref = (x.float() @ w.float().T) * xs * ws
    for sk, wsp, sp in ((1, None, None), (split_k, workspace, sem)):
        g.launch_gemm_a8w8_bpreshuffle(
            x, preshuffle.shuffle_weight(w), xs, ws, out, wsp, sp, tile=tile, split_k=sk, mma="mfma"
        )
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    assert int(sem.abs().sum()) == 0


# --- compilation per arch ----------------------------------------------------------------

# family, mma, input dtype, tile, split_k, out dtype, semaphore dtype (None: split_k == 1)
COMPILED = {
    "gfx942": [
        ("bpreshuffle", "mfma", "float8_e4m3fnuz", (32, 64, 128), 1, "bfloat16", None),
        ("bpreshuffle", "mfma", "float8_e4m3fnuz", (64, 128, 64), 3, "float16", "int64"),
        ("bpreshuffle", "mfma", "float8_e4m3fnuz", (64, 128, 64), 3, "float16", "int32"),
        ("bpreshuffle", "mfma", "int8", (16, 64, 64), 1, "float16", None),
        ("bpreshuffle", "mfma", "int8", (32, 128, 128), 2, "bfloat16", "int64"),
        ("blockscale", "mfma", "float8_e4m3fnuz", (128, 128, 128), 1, "bfloat16", None),
        ("blockscale", "mfma", "float8_e4m3fnuz", (16, 64, 128), 2, "float16", "int32"),
    ],
    "gfx950": [
        ("bpreshuffle", "mfma", "float8_e4m3fn", (32, 64, 128), 1, "bfloat16", None),
        ("bpreshuffle", "mfma", "float8_e4m3fn", (64, 64, 64), 2, "float16", "int64"),
        ("bpreshuffle", "mfma", "int8", (16, 128, 64), 1, "bfloat16", None),
        ("blockscale", "mfma", "float8_e4m3fn", (32, 128, 128), 1, "bfloat16", None),
        ("blockscale", "mfma", "float8_e4m3fn", (64, 64, 128), 3, "float16", "int64"),
    ],
    "gfx1250": [
        ("bpreshuffle", "wmma", "float8_e4m3fn", (32, 64, 128), 1, "bfloat16", None),
        ("bpreshuffle", "wmma", "float8_e4m3fn", (64, 128, 64), 2, "float16", "int32"),
        ("bpreshuffle", "wmma", "float8_e4m3fn", (64, 128, 64), 2, "float16", "int64"),
        ("bpreshuffle", "wmma", "int8", (16, 64, 64), 1, "bfloat16", None),
    ],
}
# (flavour, input dtype) -> the instruction LLVM must select (gfx950 reads the fp8 bytes as
# OCP e4m3fn in the same mnemonic that gfx942 reads as e4m3fnuz).
MNEMONIC = {
    ("mfma", "float8_e4m3fnuz"): "v_mfma_f32_16x16x32_fp8_fp8",
    ("mfma", "float8_e4m3fn"): "v_mfma_f32_16x16x32_fp8_fp8",
    ("mfma", "int8"): "v_mfma_i32_16x16x32_i8",
    ("wmma", "float8_e4m3fn"): "v_wmma_f32_16x16x64_fp8_fp8",
    ("wmma", "int8"): "v_wmma_i32_16x16x64_iu8",
}


def expected_mnemonic(arch: str, mma: str, dtype: str, tile_k: int) -> str:
    """gfx950 has wider 8-bit MFMAs: 16x16x64 for int8, and for fp8 the scaled 16x16x128
    wherever a k-tile holds two 64-byte k-blocks."""
    if arch == "gfx950" and dtype == "int8":
        return "v_mfma_i32_16x16x64_i8"
    if arch == "gfx950" and tile_k >= 128:
        return "v_mfma_scale_f32_16x16x128_f8f6f4"
    return MNEMONIC[(mma, dtype)]


_CHILD = """
import json, shutil, sys, time
from pathlib import Path
import torch
from aiter.ops.gemm.kernels import a8w8 as g
from op_tests.compile_child import compile_env, linker_rocm_path, run_child

configs, cache = json.loads(sys.argv[1]), Path(sys.argv[2])
dump = Path(sys.argv[3]) if sys.argv[3] else None
keep = Path(sys.argv[4])
m, n, k = 37, 256, 512
results = []
for idx, (family, mma, dtype, tile, split_k, out_dtype, sem_dtype) in enumerate(configs):
    dtype, out_dtype = getattr(torch, dtype), getattr(torch, out_dtype)
    tile = g.A8W8Tile(*tile)
    xq, wq = torch.empty(m, k, dtype=dtype), torch.empty(n, k, dtype=dtype)
    if family == "bpreshuffle":
        xs, ws = torch.empty(m, 1), torch.empty(1, n)
    else:
        xs, ws = torch.empty(m, k // 128), torch.empty(n // 128, k // 128)
    out = torch.empty(m, n, dtype=out_dtype)
    workspace = semaphore = None
    if split_k > 1:
        workspace = torch.empty(split_k, m, n)
        semaphore = torch.zeros(g.semaphore_size(m, n, tile), dtype=getattr(torch, sem_dtype))
    before = set(cache.glob("*/*.pkl"))
    start = time.perf_counter()
    launch = getattr(g, f"launch_gemm_a8w8_{family}")
    launch(xq, wq, xs, ws, out, workspace, semaphore, tile=tile, split_k=split_k, mma=mma)
    result = {"seconds": time.perf_counter() - start}
    result["entries"] = sorted(str(p) for p in set(cache.glob("*/*.pkl")) - before)
    if dump is not None:
        # Each compile rewrites the kernel's listing in place: keep a copy per config.
        listings = sorted(dump.glob("*/*final_isa.s"))
        result["listings"] = len(listings)
        target = keep / f"{idx}.s"
        target.write_text(listings[-1].read_text())
        result["isa"] = str(target)
    results.append(result)
print(json.dumps(results))
"""


def _compile_child(arch: str, rocm_path: str, root: Path, dump: bool) -> list[dict]:
    """Compile COMPILED[arch] in a child process (one arch per process; an LLVM abort kills
    the child, not pytest). FlyDSL skips its disk cache while it dumps ISA, hence `dump`."""
    cache, keep = root / "cache", root / "isa"
    keep.mkdir(parents=True)
    env = compile_env(arch, rocm_path, cache, dump=root / "dump" if dump else None)
    args = [json.dumps(COMPILED[arch]), str(cache), str(root / "dump") if dump else "", str(keep)]
    child = run_child(_CHILD, args, env, cwd=root)
    assert child.returncode == 0, (
        f"{arch}: compile process exited with {child.returncode}"
        f" (negative: killed by signal)\n{child.stderr[-4000:]}"
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=list(COMPILED))
def compiled(request, rocm_path: str, tmp_path_factory) -> dict:
    """The cache entries COMPILED[arch] wrote, one compile per config."""
    arch = request.param
    root = tmp_path_factory.mktemp(f"a8w8_{arch}")
    results = _compile_child(arch, rocm_path, root, dump=False)
    return {"arch": arch, "configs": COMPILED[arch], "results": results}


@pytest.fixture(scope="module", params=list(COMPILED))
def listed(request, rocm_path: str, tmp_path_factory) -> dict:
    """FlyDSL's ISA listing of every config of COMPILED[arch]."""
    arch = request.param
    root = tmp_path_factory.mktemp(f"a8w8_isa_{arch}")
    results = _compile_child(arch, rocm_path, root, dump=True)
    return {"arch": arch, "configs": COMPILED[arch], "results": results}


@pytest.mark.slow
def test_one_cache_entry_per_specialization(compiled: dict) -> None:
    arch, configs, results = compiled["arch"], compiled["configs"], compiled["results"]
    print(f"{arch} compile seconds: {[round(r['seconds'], 2) for r in results]}")
    for config, result in zip(configs, results, strict=True):
        assert len(result["entries"]) == 1, (config, result["entries"])
        family = config[0]
        assert Path(result["entries"][0]).parent.name.startswith(f"gemm_a8w8_{family}_"), config
    all_entries = [r["entries"][0] for r in results]
    assert len(set(all_entries)) == len(configs)


@pytest.mark.slow
def test_semaphore_dtype_changes_the_kernel_key(compiled: dict) -> None:
    """Configs that differ only in the semaphore dtype (int32 vs int64) have their own entries."""
    configs, results = compiled["configs"], compiled["results"]
    by_rest: dict[tuple, dict[str, str]] = {}
    for config, result in zip(configs, results, strict=True):
        if config[-1] is not None:
            by_rest.setdefault(tuple(map(str, config[:-1])), {})[config[-1]] = result["entries"][0]
    pairs = [entries for entries in by_rest.values() if len(entries) == 2]
    if compiled["arch"] in ("gfx942", "gfx1250"):
        assert pairs, "COMPILED must hold an int32/int64 semaphore pair for this arch"
    for entries in pairs:
        assert entries["int32"] != entries["int64"]


@pytest.mark.slow
def test_code_objects_target_the_arch(compiled: dict) -> None:
    from aiter.flydsl_bridge import elf, extract_code_objects

    for result in compiled["results"]:
        codes = extract_code_objects(result["entries"][0])
        assert len(codes) == 1, result
        header = elf.parse_header(codes[0])
        assert header.e_machine == 224
        assert header.e_flags & 0xFF == elf.ARCH_TO_MACH[compiled["arch"]]


@pytest.mark.slow
def test_isa_listing_uses_the_expected_mma(listed: dict) -> None:
    """FlyDSL's ISA listing (LLVM's AMDGPU output) of every compile: the arch, the fp8/int8
    MMA or WMMA instruction, and for split-K the agent-scope atomics of the semaphore."""
    arch = listed["arch"]
    for config, result in zip(listed["configs"], listed["results"], strict=True):
        _, mma, dtype, tile, split_k, _, sem_dtype = config
        text = Path(result["isa"]).read_text()
        assert result["listings"] == 1, config
        assert f'.amdgcn_target "amdgcn-amd-amdhsa-unknown-{arch}"' in text
        assert expected_mnemonic(arch, mma, dtype, tile[2]) in text, config
        assert ("v_wmma" if mma == "mfma" else "v_mfma") not in text, config
        assert f".wavefront_size: {ix.WAVE_SIZE[mma]}" in text
        atomics = re.findall(r"global_atomic_(add|swap)\w*", text)
        if split_k == 1:
            assert not atomics, config
        else:
            assert sorted(set(atomics)) == ["add", "swap"], config
            wide = re.search(r"global_atomic_(add|swap)(_u64|_b64|_x2)", text) is not None
            assert wide == (sem_dtype == "int64"), config


@pytest.mark.slow
def test_disassembly_uses_the_arch_mma(compiled: dict) -> None:
    """llvm-objdump agrees with the listing on the MMA instruction, on every arch."""
    from aiter.flydsl_bridge import extract_code_objects

    arch = compiled["arch"]
    for config, result in zip(compiled["configs"], compiled["results"], strict=True):
        text = disassemble_or_skip(extract_code_objects(result["entries"][0])[0], arch)
        assert expected_mnemonic(arch, config[1], config[2], config[3][2]) in text, config
