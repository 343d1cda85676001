"""Property: random valid MX GEMM tables (gemm_a4w4, gemm_mxfp8), built with `--csv` for gfx950,
serve every call inside what their rows serve from the cache alone, and an empty cache misses
every such call.

Calls take M at the edges (1, the cap, each row's M and its neighbours) and at random, with every
caller variant the replay claims: the output dtype given or left to its default, a bias or none.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiter.ops.gemm.kernels.mx import MX_TILES
from aiter.ops.gemm.table import (
    A4W4,
    A4W4_KERNELS,
    A8W8_OUT_DTYPES,
    LIBTYPE_FLYDSL,
    LIBTYPE_TORCH,
    MXFP8,
    MXFP8_KERNELS,
    MXFP8_Q_DTYPE,
)
from tests.aot_cli import PropertyFigures, build_and_serve_tables, build_examples

pytestmark = pytest.mark.slow  # builds a cache per generated table set

MODULE = "aiter.aot.flydsl.gemm"
SPECS = (A4W4, MXFP8)
ARCH, MMA, CU_NUM = "gfx950", "mfma", 256
MAX_MS = (64, 300)
EXAMPLES = 2
RANDOM_MS = 2
# Shapes within the entries' constraints (N % 16, K % 32), small so that a build stays short:
# K off the k-tiles (224, 800) and a partial scale group.
NS, KS = (16, 80, 576), (224, 800, 2048)
SPLIT_KS = (0, 1, 2, 3)  # 0: resolved per call
LIBTYPES = (LIBTYPE_FLYDSL, LIBTYPE_FLYDSL, LIBTYPE_TORCH)
# A few tiles of each family (every tile is one more kernel to compile per example).
TILES = {
    "fp4": ((16, 64, 512), (32, 64, 256), (64, 128, 128)),
    "fp8": ((16, 64, 256), (64, 64, 128)),
}
KERNEL_NAMES = {
    A4W4: [f"{A4W4_KERNELS}_{MMA}_{m}x{n}x{k}" for m, n, k in TILES["fp4"]],
    MXFP8: [f"{MXFP8_KERNELS}_{MMA}_{m}x{n}x{k}" for m, n, k in TILES["fp8"]],
}


def test_the_sampled_tiles_exist() -> None:
    for fmt, tiles in TILES.items():
        names = {(t.tile_m, t.tile_n, t.tile_k) for t in MX_TILES[fmt][MMA]}
        assert set(tiles) <= names


@st.composite
def _table(draw, spec, top: int) -> list[dict]:
    """1 to 3 rows of 1 or 2 shapes; a shape's rows at distinct M, some above the cap."""
    shapes = draw(
        st.lists(st.tuples(st.sampled_from(NS), st.sampled_from(KS)), min_size=1, max_size=2,
                 unique=True)  # fmt: skip
    )
    rows = []
    for n, k in shapes:
        for m in draw(st.lists(st.integers(1, 2 * top), min_size=1, max_size=2, unique=True)):
            libtype = draw(st.sampled_from(LIBTYPES))
            row = {"gfx": ARCH, "cu_num": CU_NUM, "M": m, "N": n, "K": k, "libtype": libtype,
                   "kernelId": 0, "us": ""}  # fmt: skip
            if libtype == LIBTYPE_FLYDSL:
                row["kernelName"] = draw(st.sampled_from(KERNEL_NAMES[spec]))
                row["splitK"] = draw(st.sampled_from(SPLIT_KS))
            else:
                row["kernelName"], row["splitK"] = "", 0
            if spec is MXFP8:
                row["q_dtype_w"] = MXFP8_Q_DTYPE
            rows.append(row)
    return rows


def _serving_row(rows: list[dict], line_of: dict[int, int], m: int, spec) -> str:
    above = [row for row in rows if row["M"] >= m]
    if above:
        row = min(above, key=lambda row: row["M"])
        return f"{spec.short_name}:{line_of[id(row)]}"
    top = max(rows, key=lambda row: row["M"])
    return f"heuristic above {spec.short_name}:{line_of[id(top)]}"


VARIANTS = [{"out_dtype": o, "bias": b} for o in (*A8W8_OUT_DTYPES, None) for b in (False, True)]


def _calls(draw, spec, rows: list[dict], top: int) -> list[dict]:
    line_of = {id(row): line for line, row in enumerate(rows, start=2)}
    shapes: dict[tuple, list[dict]] = {}
    for row in rows:
        shapes.setdefault((row["N"], row["K"]), []).append(row)
    calls = []
    for (n, k), shape_rows in shapes.items():
        edges = {1, top} | {row["M"] + d for row in shape_rows for d in (-1, 0, 1)}
        ms = sorted(m for m in edges if 1 <= m <= top)
        ms += draw(st.lists(st.integers(1, top), min_size=RANDOM_MS, max_size=RANDOM_MS))
        for m in ms:
            for variant in VARIANTS if m in edges else [draw(st.sampled_from(VARIANTS))]:
                row = _serving_row(shape_rows, line_of, m, spec)
                calls.append({"table": spec.short_name, "row": row, "M": m, "N": n, "K": k,
                              **variant})  # fmt: skip
    return calls


SERVE = """
from aiter.ops.gemm.kernels.mx import mx_scale_shape

def serve(call):
    m, n, k = call["M"], call["N"], call["K"]
    out = getattr(torch, call["out_dtype"]) if call["out_dtype"] else None
    kwargs = {} if out is None else {"out_dtype": out}
    bias = empty((n,), out or torch.bfloat16) if call["bias"] else None
    fp4 = call["table"] == "gemm_a4w4"
    element = torch.float4_e2m1fn_x2 if fp4 else torch.float8_e4m3fn
    row = k // 2 if fp4 else k
    scale = torch.float8_e8m0fnu
    entry = aiter.gemm_a4w4 if fp4 else aiter.gemm_mxfp8
    entry(empty((m, row), element), empty((n, row), element), empty(mx_scale_shape(m, k), scale),
          empty(mx_scale_shape(n, k), scale), bias, **kwargs)
"""

FIGURES = {spec.short_name: PropertyFigures(spec.short_name) for spec in SPECS}


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    for figures in FIGURES.values():
        print(figures.line())


def test_random_mx_tables_are_served_from_their_cache_alone(tmp_path):
    examples = iter(range(EXAMPLES * 4))

    @build_examples(EXAMPLES)
    @given(data=st.data())
    def check(data):
        top = data.draw(st.sampled_from(MAX_MS), label="max_m")
        tables = {spec: data.draw(_table(spec, top), label=spec.short_name) for spec in SPECS}
        calls = [c for spec, rows in tables.items() for c in _calls(data.draw, spec, rows, top)]
        work = tmp_path / f"example{next(examples)}"
        results, empty = build_and_serve_tables(
            MODULE, SPECS, tables, ARCH, CU_NUM, SERVE, calls, work, "--max-m", str(top)
        )
        for spec, rows in tables.items():
            mine = [i for i, call in enumerate(calls) if call["table"] == spec.short_name]
            FIGURES[spec.short_name].add(
                len(rows), [results[i] for i in mine], [empty[i] for i in mine]
            )

    check()
