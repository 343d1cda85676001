"""Property: random valid GEMM tables (all four), built with `--csv` for gfx942, serve every call
inside what their rows serve from the cache alone, and an empty cache misses every such call.

A GEMM shape is replayed at every M from 1 to `--max-m`: its rows' buckets, and above its top row
the heuristic with the shape's key. Calls take M at the edges (1, the cap, each row's M and its
neighbours) and at random, with every caller variant the replay claims (the output dtype given or
left to its default, the weight preshuffled by `aiter.shuffle_weight` or passed as it is, the
preshuffled blockscale GEMM's x scales in either of aiter's views).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiter.ops.gemm.kernels.a8w8 import BLOCKSCALE_TILES, BPRESHUFFLE_TILES
from aiter.ops.gemm.kernels.a16w16 import SUPPORTED_TILES as A16W16_TILES
from aiter.ops.gemm.table import (
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A8W8_OUT_DTYPES,
    A16W16,
    A16W16_INPUT_DTYPES,
    A16W16_KERNELS,
    A16W16_OUT_DTYPES,
    BLOCKSCALE_BPRESHUFFLE_KERNELS,
    BLOCKSCALE_KERNELS,
    BPRESHUFFLE_KERNELS,
    LIBTYPE_FLYDSL,
    LIBTYPE_TORCH,
)
from tests.aot_cli import PropertyFigures, build_and_serve_tables, build_examples

pytestmark = pytest.mark.slow  # builds a cache per generated table set

MODULE = "aiter.aot.flydsl.gemm"
SPECS = (A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE, A8W8_BLOCKSCALE_BPRESHUFFLE)
ARCH, MMA = "gfx942", "mfma"
FP8 = "float8_e4m3fnuz"  # gfx942's flavour
CU_NUMS = (80, 304)
MAX_MS = (64, 256, 600)
EXAMPLES = 3
RANDOM_MS = 3  # random M per shape, besides the edges

# Shapes within each entry's documented constraints (a16w16: K % 32; bpreshuffle: N % 16 and
# K % 64; blockscale: N and K % 128), small so that a build stays short.
A16W16_NS, A16W16_KS = (1, 64, 100, 256, 1000), (32, 96, 256, 1024, 4096)
BPRE_NS, BPRE_KS = (16, 64, 256, 1280), (64, 192, 512, 8192)
BLOCK_NS, BLOCK_KS = (128, 256, 1536), (128, 512, 7168)
SPLIT_KS = (0, 1, 2, 3, 4, 8)  # 0: resolved per call
LIBTYPES = (LIBTYPE_FLYDSL, LIBTYPE_FLYDSL, LIBTYPE_FLYDSL, LIBTYPE_TORCH)


def _names(prefix: str, tiles) -> list[str]:
    return [f"{prefix}_{MMA}_{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in tiles[MMA]]


KERNEL_NAMES = {
    A16W16: _names(A16W16_KERNELS, A16W16_TILES),
    A8W8_BPRESHUFFLE: _names(BPRESHUFFLE_KERNELS, BPRESHUFFLE_TILES),
    A8W8_BLOCKSCALE: _names(BLOCKSCALE_KERNELS, BLOCKSCALE_TILES),
    A8W8_BLOCKSCALE_BPRESHUFFLE: _names(BLOCKSCALE_BPRESHUFFLE_KERNELS, BLOCKSCALE_TILES),
}


def _shape(spec) -> st.SearchStrategy[dict]:
    """The cells of a row's key but M."""
    if spec is A16W16:
        return st.fixed_dictionaries(
            {
                "N": st.sampled_from(A16W16_NS),
                "K": st.sampled_from(A16W16_KS),
                "bias": st.sampled_from((0, 1)),
                "dtype": st.sampled_from([f"torch.{d}" for d in A16W16_INPUT_DTYPES]),
                "outdtype": st.sampled_from([f"torch.{d}" for d in A16W16_OUT_DTYPES]),
            }
        )
    if spec is A8W8_BPRESHUFFLE:
        return st.fixed_dictionaries(
            {
                "N": st.sampled_from(BPRE_NS),
                "K": st.sampled_from(BPRE_KS),
                "q_dtype_w": st.sampled_from((f"torch.{FP8}", "torch.int8")),
            }
        )
    return st.fixed_dictionaries({"N": st.sampled_from(BLOCK_NS), "K": st.sampled_from(BLOCK_KS)})


@st.composite
def _choice(draw, spec) -> dict:
    """The cells a row chooses: libtype, kernel name, split-K, timing."""
    libtype = draw(st.sampled_from(LIBTYPES))
    name = draw(st.sampled_from(KERNEL_NAMES[spec]))
    cells = {
        "libtype": libtype,
        "kernelName": name if libtype == LIBTYPE_FLYDSL else draw(st.sampled_from(("", name))),
        "splitK": draw(st.sampled_from(SPLIT_KS)) if libtype == LIBTYPE_FLYDSL else 0,
        "us": draw(st.one_of(st.just(""), st.integers(1, 9999).map(lambda v: f"{v / 10:g}"))),
    }
    if spec is not A16W16:
        cells["kernelId"] = draw(st.integers(0, 40))
    return cells


@st.composite
def _table(draw, spec, cu_num: int, top: int) -> list[dict]:
    """1 to 4 rows of 1 or 2 shapes; a shape's rows at distinct M, some above the cap."""
    shapes = draw(
        st.lists(_shape(spec), min_size=1, max_size=2, unique_by=lambda s: tuple(s.items()))
    )
    rows = []
    for shape in shapes:
        m_values = st.one_of(st.sampled_from([1 << i for i in range(12) if 1 << i <= 2 * top]),
                             st.integers(1, 2 * top))  # fmt: skip
        for m in draw(st.lists(m_values, min_size=1, max_size=2, unique=True)):
            rows.append({"gfx": ARCH, "cu_num": cu_num, "M": m, **shape, **draw(_choice(spec))})
    return rows


def _serving_row(rows: list[dict], line_of: dict[int, int], m: int, spec) -> str:
    """The documented bucket: the row with the smallest tabled M >= m; above all, the heuristic."""
    above = [row for row in rows if row["M"] >= m]
    if above:
        row = min(above, key=lambda row: row["M"])
        return f"{spec.short_name}:{line_of[id(row)]}"
    top = max(rows, key=lambda row: row["M"])
    return f"heuristic above {spec.short_name}:{line_of[id(top)]}"


def _variants(spec, shape: dict) -> list[dict]:
    """The caller choices the replay claims for a shape."""
    if spec is A16W16:
        out = shape["outdtype"].removeprefix("torch.")
        outs = [out, None] if out == shape["dtype"].removeprefix("torch.") else [out]
        return [{"out_dtype": o} for o in outs]
    outs = (*A8W8_OUT_DTYPES, None)  # None: the entry's default (bf16)
    if spec is A8W8_BLOCKSCALE:  # its weight is not preshuffled
        return [{"out_dtype": o} for o in outs]
    if spec is A8W8_BLOCKSCALE_BPRESHUFFLE:  # x scales strided (1, M) or aiter's contiguous view
        return [{"out_dtype": o, "x_view": v} for o in outs for v in (True, False)]
    return [{"out_dtype": o, "shuffled": s} for o in outs for s in (True, False)]


def _calls(draw, spec, rows: list[dict], top: int) -> list[dict]:
    line_of = {id(row): line for line, row in enumerate(rows, start=2)}
    shapes: dict[tuple, list[dict]] = {}
    for row in rows:
        key = tuple(row[c] for c in spec.key if c not in ("gfx", "cu_num", "M"))
        shapes.setdefault(key, []).append(row)
    calls = []
    for shape_rows in shapes.values():
        edges = {1, top} | {row["M"] + d for row in shape_rows for d in (-1, 0, 1)}
        ms = sorted(m for m in edges if 1 <= m <= top)
        ms += draw(st.lists(st.integers(1, top), min_size=RANDOM_MS, max_size=RANDOM_MS))
        shape = shape_rows[0]
        variants = _variants(spec, shape)
        for m in ms:
            for variant in variants if m in edges else [draw(st.sampled_from(variants))]:
                call = {"table": spec.short_name, "row": _serving_row(shape_rows, line_of, m, spec),
                        "M": m, "N": shape["N"], "K": shape["K"], **variant}  # fmt: skip
                if spec is A16W16:
                    call.update(bias=shape["bias"], dtype=shape["dtype"].removeprefix("torch."))
                elif spec is A8W8_BPRESHUFFLE:
                    call["q_dtype"] = shape["q_dtype_w"].removeprefix("torch.")
                else:
                    call["q_dtype"] = FP8
                calls.append(call)
    return calls


SERVE = """
F32 = torch.float32

def serve(call):
    m, n, k = call["M"], call["N"], call["K"]
    out = getattr(torch, call["out_dtype"]) if call["out_dtype"] else None
    kwargs = {} if out is None else {"out_dtype": out}
    if call["table"] == "gemm_a16w16":
        dtype = getattr(torch, call["dtype"])
        bias = empty((n,), out or dtype) if call["bias"] else None
        aiter.gemm_a16w16(empty((m, k), dtype), empty((n, k), dtype), bias, **kwargs)
        return
    q = getattr(torch, call["q_dtype"])
    w = empty((n, k), q)
    if call["table"] == "gemm_a8w8_bpreshuffle":
        w = aiter.shuffle_weight(w) if call["shuffled"] else w
        scales = empty((m, 1), F32), empty((1, n), F32)
        aiter.gemm_a8w8_bpreshuffle(empty((m, k), q), w, *scales, **kwargs)
    elif call["table"] == "gemm_a8w8_blockscale":
        scales = empty((m, k // 128), F32), empty((n // 128, k // 128), F32)
        aiter.gemm_a8w8_blockscale(empty((m, k), q), w, *scales, **kwargs)
    else:
        x_scale = empty((m, k // 128), F32) if call["x_view"] else empty((k // 128, m), F32).mT
        w_scale = empty((n // 128, k // 128), F32)
        w = aiter.shuffle_weight(w)
        aiter.gemm_a8w8_blockscale_bpreshuffle(empty((m, k), q), w, x_scale, w_scale, **kwargs)
"""

FIGURES = {spec.short_name: PropertyFigures(spec.short_name) for spec in SPECS}


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    for figures in FIGURES.values():
        print(figures.line())


def test_random_gemm_tables_are_served_from_their_cache_alone(tmp_path):
    examples = iter(range(EXAMPLES * 4))

    @build_examples(EXAMPLES)
    @given(data=st.data())
    def check(data):
        cu_num = data.draw(st.sampled_from(CU_NUMS), label="cu_num")
        top = data.draw(st.sampled_from(MAX_MS), label="max_m")
        tables = {
            spec: data.draw(_table(spec, cu_num, top), label=spec.short_name) for spec in SPECS
        }
        calls = [c for spec, rows in tables.items() for c in _calls(data.draw, spec, rows, top)]
        work = tmp_path / f"example{next(examples)}"
        results, empty = build_and_serve_tables(
            MODULE, SPECS, tables, ARCH, cu_num, SERVE, calls, work, "--max-m", str(top)
        )
        for spec, rows in tables.items():
            mine = [i for i, call in enumerate(calls) if call["table"] == spec.short_name]
            FIGURES[spec.short_name].add(
                len(rows), [results[i] for i in mine], [empty[i] for i in mine]
            )

    check()
