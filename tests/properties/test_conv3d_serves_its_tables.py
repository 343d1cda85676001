"""Property: random valid conv3d tables, built with `--csv` for gfx942, serve every call inside what
their rows serve from the cache alone, and an empty cache misses every such call.

What a row serves, as documented: a call of its exact shape, and a call of its layer (the same
fields but N, D, H, W) whose output positions are within 4x of its own and nearer (by ratio) than
any other row's (torch rows lend nothing); the rest is the heuristic's and is not built. Calls
vary the frame count D of each tabled (N, H, W), at the edges (1, the cap, each row's D and its
neighbours, the ends of every served run) and at random, with every dtype and layout pair the
entry takes and stride, padding and dilation given as ints or triples. A call at one (N, H, W)
may be served by a row of another (N, H, W) of its layer: the second test pins such a table.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiter.ops.conv3d.kernels.implicit_gemm import SUPPORTED_TILES
from aiter.ops.conv3d.table import (
    BORROW_RATIO,
    CONV3D,
    INPUT_DTYPES,
    KERNELS,
    LAYER_COLUMNS,
    LAYOUTS,
    LIBTYPE_FLYDSL,
    LIBTYPE_TORCH,
)
from tests.aot_cli import PropertyFigures, build_and_serve_tables, build_examples

pytestmark = pytest.mark.slow  # builds a cache per generated table

MODULE = "aiter.aot.flydsl.conv3d"
ARCH, MMA = "gfx942", "mfma"
CU_NUMS = (80, 304)
MAX_FRAMES = (8, 16, 32)
EXAMPLES = 3
RANDOM_FRAMES = 3  # random frame counts per (N, H, W), besides the edges
KERNEL_SIZES = ((3, 3, 3), (1, 3, 3), (3, 1, 1), (1, 2, 2), (1, 1, 1))
STRIDES = ((1, 1, 1), (1, 2, 2), (2, 1, 1))
DILATIONS = ((1, 1, 1), (1, 1, 1), (2, 1, 1))
CHANNELS, GROUPS = (4, 16, 32, 48), (1, 1, 2, 4)
LIBTYPES = ("", "", LIBTYPE_FLYDSL, LIBTYPE_TORCH)  # empty: FlyDSL
SPLIT_KS = (0, 1, 2, 4, 8)  # 0: resolved per call
TILE_COLUMNS = ("tile_m", "tile_n", "wave_m", "wave_n", "wgm")
LAYOUT_PAIRS = [(i, o) for i in LAYOUTS for o in LAYOUTS]


def _axes(name: str, values) -> dict[str, int]:
    return {f"{name}_{a}": v for a, v in zip("dhw", values, strict=True)}


@st.composite
def _layer(draw) -> dict:
    """The cells of LAYER_COLUMNS but gfx and cu_num."""
    kernel = draw(st.sampled_from(KERNEL_SIZES))
    stride = draw(st.sampled_from(STRIDES))
    dilation = draw(st.sampled_from(DILATIONS))
    same = draw(st.booleans())  # padding keeps the size (at stride 1) or none
    padding = tuple(d * (k - 1) // 2 if same else 0 for k, d in zip(kernel, dilation, strict=True))
    c, k = draw(st.sampled_from(CHANNELS)), draw(st.sampled_from(CHANNELS))
    groups = draw(st.sampled_from([g for g in GROUPS if c % g == 0 and k % g == 0]))
    return {
        "C": c, "K": k, "kT": kernel[0], "kH": kernel[1], "kW": kernel[2],
        **_axes("stride", stride), **_axes("pad", padding), **_axes("dil", dilation),
        "groups": groups, "bias": draw(st.sampled_from((1, 0))),
    }  # fmt: skip


def _out(size: int, kernel: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (kernel - 1) - 1) // stride + 1


def positions(layer: dict, n: int, d: int, h: int, w: int) -> int | None:
    """Output positions N * D' * H' * W', None when the input is too small for the kernel."""
    sizes = [
        _out(v, layer[kernel], layer[f"stride_{a}"], layer[f"pad_{a}"], layer[f"dil_{a}"])
        for a, kernel, v in zip("dhw", ("kT", "kH", "kW"), (d, h, w), strict=True)
    ]
    return n * math.prod(sizes) if min(sizes) >= 1 else None


@st.composite
def _choice(draw) -> dict:
    """libtype, tile columns and kernel name (0 and empty: the heuristic's tile), split-K."""
    tile = draw(st.sampled_from(SUPPORTED_TILES[MMA]))
    values = dict(zip(TILE_COLUMNS, (tile.tile_m, tile.tile_n, tile.wave_m, tile.wave_n,
                                     tile.wgm), strict=True))  # fmt: skip
    name = f"{KERNELS}_{MMA}_{tile.tile_m}x{tile.tile_n}_w{tile.wave_m}x{tile.wave_n}_g{tile.wgm}"
    how = draw(st.sampled_from(("heuristic", "columns", "both", "name")))
    cells = dict.fromkeys(TILE_COLUMNS, 0) if how in ("heuristic", "name") else values
    return {
        **cells,
        "kernelName": name if how in ("both", "name") else "",
        "splitK": draw(st.sampled_from(SPLIT_KS)),
        "us": draw(st.one_of(st.just(""), st.integers(1, 9999).map(lambda v: f"{v / 10:g}"))),
        "libtype": draw(st.sampled_from(LIBTYPES)),
    }


@st.composite
def _table(draw, cu_num: int) -> list[dict]:
    """1 or 2 layers; 1 or 2 (N, H, W) of a layer (two resolutions first: a row then lends its
    tile to the other's calls); 1 or 2 frame counts of each; at most 4 rows."""
    rows: list[dict] = []
    for layer in draw(st.lists(_layer(), min_size=1, max_size=2, unique_by=str)):
        count = draw(st.sampled_from((2, 1)))
        volumes = st.tuples(st.sampled_from((1, 2)), st.integers(4, 16), st.integers(4, 16))
        for n, h, w in draw(st.lists(volumes, min_size=count, max_size=count, unique=True)):
            fits = [d for d in range(1, 11) if positions(layer, n, d, h, w)]
            for d in draw(st.lists(st.sampled_from(fits), min_size=1, max_size=2, unique=True)):
                if len(rows) < 4:
                    rows.append({"gfx": ARCH, "cu_num": cu_num, **layer, "N": n, "D": d, "H": h,
                                 "W": w, **draw(_choice())})  # fmt: skip
    return rows


def _layer_of(row: dict) -> tuple:
    return tuple(row[c] for c in LAYER_COLUMNS)


def lookup(rows: list[dict], layer: tuple, n: int, d: int, h: int, w: int) -> tuple[int, str]:
    """(index of the serving row, "exact" | "borrowed"), (-1, "heuristic") when none serves."""
    mine = [(i, row) for i, row in enumerate(rows) if _layer_of(row) == layer]
    for i, row in mine:
        if (row["N"], row["D"], row["H"], row["W"]) == (n, d, h, w):
            return i, "exact"
    cells = dict(zip(LAYER_COLUMNS, layer, strict=True))
    wanted = positions(cells, n, d, h, w)
    best = None
    for i, row in mine:
        if row["libtype"] == LIBTYPE_TORCH:
            continue
        own = positions(row, row["N"], row["D"], row["H"], row["W"])
        if max(own, wanted) / min(own, wanted) <= BORROW_RATIO:
            rank = (abs(math.log(own / wanted)), own, i)
            best = min(best or rank, rank)
    return (best[2], "borrowed") if best else (-1, "heuristic")


def _calls(draw, rows: list[dict], top: int, exhaustive: bool = False) -> list[dict]:
    calls = []
    volumes = {(_layer_of(r), r["N"], r["H"], r["W"]): r for r in rows}
    for (layer, n, h, w), row in volumes.items():
        frames = range(1, top + 1)
        served = {
            d: lookup(rows, layer, n, d, h, w)
            for d in frames
            if positions(row, n, d, h, w) and lookup(rows, layer, n, d, h, w)[0] >= 0
        }
        own = {r["D"] for r in rows if (_layer_of(r), r["N"], r["H"], r["W"]) == (layer, n, h, w)}
        ends = {d for d in served if d - 1 not in served or d + 1 not in served}
        edges = {1, top} | ends | {d + s for d in own for s in (-1, 0, 1)}
        chosen = sorted(served if exhaustive else (d for d in edges if d in served))
        if served and not exhaustive:
            chosen += draw(st.lists(st.sampled_from(sorted(served)), min_size=RANDOM_FRAMES,
                                    max_size=RANDOM_FRAMES))  # fmt: skip
        variants = [(t, i, o) for t in INPUT_DTYPES for i, o in LAYOUT_PAIRS]
        for d in chosen:
            index, match = served[d]
            some = draw(st.lists(st.sampled_from(variants), min_size=2, max_size=2, unique=True))
            for dtype, layout_in, layout_out in variants if exhaustive or d in own else some:
                calls.append({
                    "row": f"{CONV3D.short_name}:{index + 2} {match}",
                    **{c: row[c] for c in LAYER_COLUMNS if c not in ("gfx", "cu_num")},
                    "N": n, "D": d, "H": h, "W": w, "dtype": dtype,
                    "input_layout": layout_in, "output_layout": layout_out,
                    "ints": draw(st.booleans()),
                })  # fmt: skip
    return calls


SERVE = """
def _spelled(values, ints):
    return values[0] if ints and len(set(values)) == 1 else tuple(values)

def serve(call):
    dtype = getattr(torch, call["dtype"])
    n, c, d, h, w, k, g = (call[x] for x in ("N", "C", "D", "H", "W", "K", "groups"))
    ndhwc = call["input_layout"] == "NDHWC"
    x = empty((n, d, h, w, c) if ndhwc else (n, c, d, h, w), dtype)
    weight = empty((k, c // g, call["kT"], call["kH"], call["kW"]), dtype)
    bias = empty((k,), dtype) if call["bias"] else None
    kw = {name: _spelled([call[f"{short}_{a}"] for a in "dhw"], call["ints"])
          for name, short in (("stride", "stride"), ("padding", "pad"), ("dilation", "dil"))}
    if ndhwc or not call["ints"]:  # NCDHW is the default: leave it out now and then
        kw["input_layout"] = call["input_layout"]
    if call["output_layout"] != "NCDHW" or not call["ints"]:
        kw["output_layout"] = call["output_layout"]
    aiter.conv3d(x, weight, bias, groups=g, **kw)
"""

FIGURES = PropertyFigures(CONV3D.short_name)


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    print(FIGURES.line())


def _check(tmp_path, setups: st.SearchStrategy, examples: int, exhaustive=False) -> None:
    """Build each table `setups` draws ((CU count, --max-frames, rows)) and serve random calls
    inside what its rows serve (`exhaustive`: every frame count each serves, with every dtype and
    layout pair)."""
    numbers = iter(range(examples * 4))

    @build_examples(examples)
    @given(data=st.data())
    def check(data):
        cu_num, top, rows = data.draw(setups, label="table")
        calls = _calls(data.draw, rows, top, exhaustive)
        work = tmp_path / f"example{next(numbers)}"
        results, empty = build_and_serve_tables(
            MODULE, (CONV3D,), {CONV3D: rows}, ARCH, cu_num, SERVE, calls, work,
            "--max-frames", str(top),
        )  # fmt: skip
        FIGURES.add(len(rows), results, empty)

    check()


@st.composite
def _setup(draw) -> tuple[int, int, list[dict]]:
    cu_num = draw(st.sampled_from(CU_NUMS))
    return cu_num, draw(st.sampled_from(MAX_FRAMES)), draw(_table(cu_num))


def test_random_conv3d_tables_are_served_from_their_cache_alone(tmp_path):
    _check(tmp_path, _setup(), EXAMPLES)


# One layer (32 -> 32 channels, 3x3x3, padding 1) at two resolutions, on 80 CUs, 8 frames at most:
# the 8x8 row (8 frames, 512 positions) is nearer than the 16x16 row (1 frame, 256 positions) to
# every 16x16 call from 2 frames on (512 to 2048 positions), and lends them its tile (the
# heuristic's, its tile columns being 0) with split-K resolved per call: split 1 from 6 frames,
# tile_m 64 at 8 frames, which no 8x8 call (512 positions at most) asks for. The 16x16 row lends
# its tile to the 8x8 call of 1 frame (64 positions, 4x below its own).
_LAYER = {
    "gfx": ARCH, "cu_num": 80, "C": 32, "K": 32, "kT": 3, "kH": 3, "kW": 3,
    **_axes("stride", (1, 1, 1)), **_axes("pad", (1, 1, 1)), **_axes("dil", (1, 1, 1)),
    "groups": 1, "bias": 1, **dict.fromkeys(TILE_COLUMNS, 0), "splitK": 0, "libtype": "",
}  # fmt: skip
TWO_RESOLUTIONS = [
    {**_LAYER, "N": 1, "D": 1, "H": 16, "W": 16},
    {**_LAYER, "N": 1, "D": 8, "H": 8, "W": 8},
]


def test_a_row_lending_its_tile_to_another_resolution_is_served(tmp_path):
    # One example is Hypothesis's simplest, whose random draws all take the first choice.
    _check(tmp_path, st.just((80, 8, TWO_RESOLUTIONS)), 1, exhaustive=True)
