"""Host side of the bf16/fp16 GEMM: kernel names, the tile and split-K heuristic, and
gemm_a16w16's validation and dispatch inside a gfx942 dry run (naming mode, no compile).

Expected tiles and splits are worked out by hand from the rules in gemm_plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.gemm import plan as gemm_plan
from aiter.ops.gemm.entry import gemm_a16w16
from aiter.ops.gemm.kernels.a16w16 import SUPPORTED_TILES, GemmTile
from aiter.ops.gemm.plan import KernelChoice
from aiter.ops.gemm.table import A16W16

BF16 = torch.bfloat16
DEFAULT_TABLE = A16W16.default_path
HEADER = ",".join(A16W16.header)
GRAMMAR = "expected flydsl_a16w16_<mfma|wmma>_<tile_m>x<tile_n>x<tile_k>"
ALL_TILES = [
    pytest.param(mma, tile, id=f"{mma}-{tile.tile_m}x{tile.tile_n}x{tile.tile_k}")
    for mma, tiles in SUPPORTED_TILES.items()
    for tile in tiles
]


def default_row_ref(prefix: str) -> str:
    """'<default table>:<line>' of the one default row starting with `prefix`."""
    lines = DEFAULT_TABLE.read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if line.startswith(prefix)]
    assert len(hits) == 1, (prefix, hits)
    return f"{DEFAULT_TABLE}:{hits[0]}"


# The a16w16 grid of tile_m, tile_n, tile_k (in registry order) less what is over gfx942's and
# gfx950's register budget.
OVER_BUDGET = {(256, 256, 64), (256, 256, 128), (256, 256, 256), (256, 128, 256)}
OVER_BUDGET |= {(128, 256, 256), (64, 256, 256), (256, 64, 256)}
MFMA_TILES = [
    (m, n, k)
    for m in (16, 32, 64, 128, 256)
    for n in (64, 128, 256)
    for k in (32, 64, 128, 256)
    if (m, n, k) not in OVER_BUDGET
]

# --- kernel names ---


def test_supported_tiles() -> None:
    """Every tile_k up to 256 where the register estimate fits: the deeper k-tiles drop the
    widest blocks (gfx1250's 1024 registers keep one more)."""
    assert set(SUPPORTED_TILES) == {"mfma", "wmma"}
    assert list(SUPPORTED_TILES["mfma"]) == [GemmTile(*t) for t in MFMA_TILES]
    assert set(SUPPORTED_TILES["wmma"]) == set(SUPPORTED_TILES["mfma"]) | {GemmTile(256, 64, 256)}


def test_a_tile_over_budget_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"does not fit: it needs about \d+ VGPRs"):
        gemm_plan.A16W16.parse_kernel_name("flydsl_a16w16_mfma_256x256x64", "mfma")


@pytest.mark.parametrize("mma, tile", ALL_TILES)
def test_kernel_name_round_trip(mma: str, tile: GemmTile) -> None:
    name = gemm_plan.A16W16.kernel_name(mma, tile)
    assert name == f"flydsl_a16w16_{mma}_{tile.tile_m}x{tile.tile_n}x{tile.tile_k}"
    assert gemm_plan.A16W16.parse_kernel_name(name, mma) == tile
    assert gemm_plan.A16W16.parse_kernel_name(f"  {name} ", mma) == tile
    assert KernelChoice(gemm_plan.A16W16, mma, tile, 1).name == name


@pytest.mark.parametrize(
    "name",
    [
        "flydsl_a16w16_mfma_64x64",
        "foo",
        "",
        "flydsl_a16w16_mfma_64x64x64x64",
        "flydsl_a16w16_MFMA_64x64x64",
        "flydsl_a8w8_mfma_64x64x64",
        "flydsl_a16w16_mfma_64x64x64_v2",
    ],
)
def test_malformed_name_shows_the_grammar(name: str) -> None:
    with pytest.raises(ValueError) as info:
        gemm_plan.A16W16.parse_kernel_name(name, "mfma")
    assert str(info.value) == (
        f"{name!r} is not a flydsl_a16w16 kernel name: {GRAMMAR}, "
        "e.g. flydsl_a16w16_mfma_16x64x32, flydsl_a16w16_mfma_16x64x64"
    )


def test_malformed_name_examples_follow_the_flavour() -> None:
    with pytest.raises(ValueError, match="e.g. flydsl_a16w16_wmma_16x64x32, flydsl_a16w16_wmma_16"):
        gemm_plan.A16W16.parse_kernel_name("foo", "wmma")


@pytest.mark.parametrize(
    "name, named, arch_mma",
    [
        ("flydsl_a16w16_wmma_16x64x64", "wmma", "mfma"),
        ("flydsl_a16w16_mfma_128x128x64", "mfma", "wmma"),
    ],
)
def test_wrong_flavour(name: str, named: str, arch_mma: str) -> None:
    with pytest.raises(ValueError) as info:
        gemm_plan.A16W16.parse_kernel_name(name, arch_mma)
    assert (
        str(info.value) == f"{name!r} names a {named} kernel, but this arch uses {arch_mma} kernels"
    )


@pytest.mark.parametrize("tile", ["48x64x64", "16x32x64", "16x64x16", "16x96x32"])
def test_unsupported_tile(tile: str) -> None:
    name = f"flydsl_a16w16_mfma_{tile}"
    with pytest.raises(ValueError) as info:
        gemm_plan.A16W16.parse_kernel_name(name, "mfma")
    supported = ", ".join(f"{m}x{n}x{k}" for m, n, k in MFMA_TILES)
    assert str(info.value) == (
        f"{name!r}: tile not supported by the mfma kernel; supported: {supported}"
    )


# --- heuristic ---


@pytest.mark.parametrize(
    "m, n, k, cu_num, expected",
    [
        # tile_m 16 >= 1; 1 x 32 and 1 x 64 blocks < 304 CUs -> narrowest n; a decode tile
        # takes 256 bytes of K per row: 128 | 4096.
        (1, 4096, 4096, 304, (16, 64, 128)),
        # tile_m 32 >= 17; 128 does not divide 4032, 64 does.
        (17, 4096, 4032, 304, (32, 64, 64)),
        # tile_m 128 (capped); 32 x 32 = 1024 blocks >= 304 with n=128.
        # tile_m 256 (the largest); 16 x 32 = 512 blocks of n=128 fill 304 CUs, n=256 not.
        (4096, 4096, 4096, 304, (256, 128, 64)),
        # tile_m 64 >= 33; K=96: 64 does not divide it, 32 does.
        (33, 96, 96, 304, (64, 64, 32)),
        # tile_m 256 >= 200: 1 x 128 blocks >= 80 with n=64 only; 4000 = 125 x 32.
        (200, 8192, 4000, 80, (256, 64, 32)),
        # tile_m 32 >= 17; K=48 divisible by neither: the smallest tile_k.
        (17, 4864, 48, 304, (32, 64, 32)),
        # Exactly one block per CU with n=128 (1 x 304), and one short of it (1 x 303).
        (128, 38912, 64, 304, (128, 128, 64)),
        (128, 38784, 64, 304, (128, 64, 64)),
        # M exactly a tile_m. On 80 CUs: 64 blocks of n=128 are too few, 80 are enough.
        (64, 4096, 4096, 304, (64, 64, 64)),
        (64, 8192, 4096, 80, (64, 64, 64)),
        (64, 10240, 4096, 80, (64, 128, 64)),
    ],
)
def test_heuristic_tile(m: int, n: int, k: int, cu_num: int, expected) -> None:
    assert gemm_plan.A16W16.heuristic_tile(m, n, k, cu_num, "mfma") == GemmTile(*expected)
    assert gemm_plan.A16W16.heuristic_tile(m, n, k, cu_num, "wmma") == GemmTile(*expected)


@pytest.mark.parametrize(
    "m, n, k, cu_num, tile, expected",
    [
        # 64 blocks, 64 k-tiles: 2 (128 <= 304), 4 (256 <= 304), not 8 (512 > 304).
        (1, 4096, 4096, 304, (16, 64, 64), 4),
        # 16 blocks, 128 k-tiles: up to MAX_SPLIT_K = 8 (128 <= 304).
        (1, 1024, 8192, 304, (16, 64, 64), 8),
        # 1 block but 4 k-tiles: a split of 2 would leave 2 < 4 k-tiles each.
        (1, 64, 256, 304, (16, 64, 64), 1),
        (1, 64, 512, 304, (16, 64, 64), 2),
        # ceil(4000 / 64) = 63 k-tiles: 63 // 8 = 7 >= 4.
        (1, 64, 4000, 304, (16, 64, 64), 8),
        # The output alone fills the GPU.
        (4096, 4096, 4096, 304, (128, 128, 64), 1),
        # 128 blocks: 256 <= 304 -> 2, 512 > 304.
        (129, 4096, 4096, 304, (128, 64, 64), 2),
        # Same on 80 CUs: 256 > 80 -> 1.
        (129, 4096, 4096, 80, (128, 64, 64), 1),
    ],
)
def test_heuristic_split_k(m, n, k, cu_num, tile, expected) -> None:
    assert gemm_plan.A16W16.heuristic_split_k(m, n, k, cu_num, GemmTile(*tile)) == expected


def test_split_k_changes_inside_one_m_bucket() -> None:
    # The default row gfx942/304, N=768, K=4096 at M=512 serves M in [257, 512] with 128x64x64.
    # 12 column blocks; 3 row blocks (M <= 384): 36 x 8 = 288 <= 304 -> split 8;
    # 4 row blocks (M >= 385): 48 x 8 = 384 > 304, 48 x 4 = 192 -> split 4.
    tile = GemmTile(128, 64, 64)
    splits = {
        m: gemm_plan.A16W16.heuristic_split_k(m, 768, 4096, 304, tile) for m in (257, 384, 385, 512)
    }
    assert splits == {257: 8, 384: 8, 385: 4, 512: 4}


def test_choose_keeps_the_row_and_fills_in_the_rest() -> None:
    tile = GemmTile(32, 128, 32)
    assert gemm_plan.A16W16.choose(1, 4096, 4096, 304, "mfma", tile, 3) == KernelChoice(
        gemm_plan.A16W16, "mfma", tile, 3
    )
    # splitK 0: the heuristic split for the row's tile: 32 blocks, 128 k-tiles of 32;
    # 256 <= 304 and 128 // 8 = 16 >= 4 -> 8.
    assert gemm_plan.A16W16.choose(1, 4096, 4096, 304, "mfma", tile, 0).split_k == 8
    assert gemm_plan.A16W16.choose(1, 4096, 4096, 304, "mfma", None, 0) == KernelChoice(
        gemm_plan.A16W16, "mfma", GemmTile(16, 64, 128), 4
    )


# --- gemm_a16w16 in a gfx942 dry run ---


@pytest.fixture
def run():
    """gemm_a16w16 on fakes in a gfx942 naming dry run; returns (out, records, requests)."""

    def call(m, n, k, dtype=BF16, bias_dtype=None, out_dtype=None, cu_num=304):
        with dry_run("gfx942", cu_num, bridge.MODE_NAME) as requests, dispatch.observe() as records:
            a = torch.empty(m, k, dtype=dtype, device="cuda")
            b = torch.empty(n, k, dtype=dtype, device="cuda")
            bias = None if bias_dtype is None else torch.empty(n, dtype=bias_dtype, device="cuda")
            out = gemm_a16w16(a, b, bias, out_dtype)
            assert isinstance(out, FakeTensor)
            assert out.device == torch.device("cuda", 0)
            return out, list(records), list(requests)

    return call


def params(request) -> dict[str, str]:
    return dict(request.params)


def test_table_shape_dispatches_to_flydsl_with_the_row(run) -> None:
    out, records, requests = run(64, 4096, 4096)
    assert (out.shape, out.dtype) == ((64, 4096), BF16)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a16w16",
            "flydsl",
            "flydsl_a16w16_mfma_64x64x64",
            "table",
            default_row_ref("gfx942,304,64,4096,4096,0,"),
            {"split_k": 4},
        )
    ]
    assert [r.function for r in requests] == ["gemm_a16w16", "gemm_a16w16_splitk_reduce"]
    main, reduce = (params(r) for r in requests)
    assert {k: main[k] for k in ("tile_m", "tile_n", "tile_k", "split_k", "mma", "has_bias")} == {
        "tile_m": "64",
        "tile_n": "64",
        "tile_k": "64",
        "split_k": "4",
        "mma": "'mfma'",
        "has_bias": "False",
    }
    assert main["a"] == main["b"] == "bfloat16"
    assert main["c"] == "float32"  # the split-K workspace
    assert (reduce["ws"], reduce["out"], reduce["split_k"]) == ("float32", "bfloat16", "4")


def test_m_inside_a_bucket_uses_the_bucket_row(run) -> None:
    _, records, _ = run(40, 4096, 4096)  # bucket [33, 64]
    (record,) = records
    assert (record.kernel, record.source) == ("flydsl_a16w16_mfma_64x64x64", "table")
    assert record.row == default_row_ref("gfx942,304,64,4096,4096,0,")


def test_split_k_changes_inside_one_bucket_through_the_entry(run) -> None:
    # Row M=1024 (256x64x64), 12 N tiles: 3 M tiles up to M=768 (36 blocks: 8 splits), 4 from
    # 769 (48 blocks: 8 x 48 = 384 > 304, so 4).
    ref = default_row_ref("gfx942,304,1024,768,4096,0,")
    seen = {}
    for m in (513, 768, 769, 1024):
        _, (record,), requests = run(m, 768, 4096)
        assert (record.kernel, record.source, record.row) == (
            "flydsl_a16w16_mfma_256x64x64",
            "table",
            ref,
        )
        seen[m] = (record.params["split_k"], params(requests[0])["split_k"])
    assert seen == {513: (8, "8"), 768: (8, "8"), 769: (4, "4"), 1024: (4, "4")}


def test_untuned_shape_uses_the_heuristic(run) -> None:
    out, records, requests = run(5, 96, 64)
    assert (out.shape, out.dtype) == ((5, 96), BF16)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a16w16",
            "flydsl",
            "flydsl_a16w16_mfma_16x64x64",
            "heuristic",
            None,
            {"split_k": 1},
        )
    ]
    assert [r.function for r in requests] == ["gemm_a16w16"]
    assert params(requests[0])["split_k"] == "1"


def test_cu_num_absent_from_the_table_uses_the_heuristic(run) -> None:
    # gfx942 with 80 CUs (MI308X): no rows. 64 x 64 tile; 64 blocks, 128 > 80 -> split 1.
    _, (record,), _ = run(64, 4096, 4096, cu_num=80)
    assert (record.kernel, record.source, record.row, record.params) == (
        "flydsl_a16w16_mfma_64x64x64",
        "heuristic",
        None,
        {"split_k": 1},
    )


def test_torch_row(run) -> None:
    out, records, requests = run(1, 64, 64)
    assert (out.shape, out.dtype) == ((1, 64), BF16)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a16w16", "torch", None, "table", default_row_ref("gfx942,304,1,64,64,0,")
        )
    ]
    assert requests == []


def test_torch_rows_end_at_their_top_bucket(run) -> None:
    _, (record,), _ = run(16, 64, 64)
    assert record.backend == "torch"
    assert record.row == default_row_ref("gfx942,304,16,64,64,0,")
    _, (record,), _ = run(17, 64, 64)  # above every tabled M: untuned
    assert (record.backend, record.source) == ("flydsl", "heuristic")


def test_torch_row_with_fp32_output(run) -> None:
    out, (record,), _ = run(1, 64, 64, out_dtype=torch.float32)
    # outdtype float32 is another shape: no row, so FlyDSL with the heuristic.
    assert (out.shape, out.dtype) == ((1, 64), torch.float32)
    assert record.source == "heuristic"


@pytest.mark.parametrize(
    "dtype, out_dtype, expected",
    [
        (BF16, None, BF16),
        (torch.float16, None, torch.float16),
        (BF16, torch.float32, torch.float32),
        (torch.float16, BF16, BF16),
    ],
)
def test_output_dtype(run, dtype, out_dtype, expected) -> None:
    out, (record,), requests = run(3, 192, 64, dtype=dtype, out_dtype=out_dtype)
    assert (out.shape, out.dtype) == ((3, 192), expected)
    assert record.backend == "flydsl"
    assert params(requests[0])["c"] == str(expected).replace("torch.", "")
    assert params(requests[0])["a"] == str(dtype).replace("torch.", "")


def test_bias_is_passed_to_the_kernel(run) -> None:
    out, (record,), requests = run(3, 192, 64, bias_dtype=torch.float32, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert record.source == "heuristic"  # bias=1 rows are not tabled
    assert params(requests[0])["has_bias"] == "True"
    assert params(requests[0])["bias"] == "float32"


# --- shapes no FlyDSL kernel serves go to torch ---

INDEX_LIMIT = "the kernels' 32-bit index limit"


@pytest.mark.parametrize(
    "m, n, k, mma, reason",
    [
        (4, 96, 100, "mfma", "K % 32 != 0 (K=100)"),
        (4, 96, 48, "wmma", "K % 32 != 0 (K=48)"),
        (4, 96, 0, "mfma", "empty operands (N=96, K=0)"),
        (4, 0, 64, "mfma", "empty operands (N=0, K=64)"),
        # The launcher indexes out in 32 bits: M * N + 255 < 2**31.
        (256, 8388608, 64, "mfma", f"M * N = {2**31} is above {2**31 - 256}, {INDEX_LIMIT}"),
        (256, 8388607, 64, "mfma", None),
        (1, 7, 32, "wmma", None),  # any N (N_MULTIPLE is 1)
        (4, 96, 100, "xdl", "flydsl_a16w16 has no xdl kernels (only mfma, wmma)"),
    ],
)
def test_what_the_kernels_cannot_serve(m, n, k, mma, reason) -> None:
    assert gemm_plan.A16W16.cannot_serve(m, n, k, mma) == reason


def test_k_off_the_kernels_grid_is_served_by_torch(run) -> None:
    # gemm_a16w16 used to raise ValueError here although torch serves any K.
    out, records, requests = run(4, 96, 100)
    assert (out.shape, out.dtype) == ((4, 96), BF16)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a16w16", "torch", None, "heuristic", None, {"reason": "K % 32 != 0 (K=100)"}
        )
    ]
    assert requests == []


def test_torch_adds_the_bias_in_the_output_dtype(run) -> None:
    out, (record,), requests = run(3, 80, 40, bias_dtype=torch.float32, out_dtype=torch.float32)
    assert (out.shape, out.dtype) == ((3, 80), torch.float32)
    assert (record.backend, record.params, requests) == (
        "torch",
        {"reason": "K % 32 != 0 (K=40)"},
        [],
    )


def test_output_too_large_for_the_kernels_is_served_by_torch(run) -> None:
    _, (record,), requests = run(256, 8388608, 64)
    assert (record.backend, record.source, requests) == ("torch", "heuristic", [])
    assert record.params["reason"].startswith("M * N = 2147483648 is above")
    _, (record,), requests = run(256, 8388607, 64)  # the largest output the kernels take
    assert record.backend == "flydsl" and requests


def test_a_tuned_flydsl_row_the_kernels_cannot_serve_falls_to_torch(tmp_path, monkeypatch, run):
    path = _extra_table(
        tmp_path,
        monkeypatch,
        "gfx942,304,64,4096,100,0,torch.bfloat16,torch.bfloat16,"
        "flydsl,2,,flydsl_a16w16_mfma_32x128x32",
    )
    out, records, requests = run(50, 4096, 100)
    assert out.shape == (50, 4096)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a16w16", "torch", None, "table", f"{path}:2", {"reason": "K % 32 != 0 (K=100)"}
        )
    ]
    assert requests == []


def test_a_bad_kernel_name_is_still_a_table_error(tmp_path, monkeypatch, run):
    from aiter.tuning import TableError

    path = _extra_table(
        tmp_path,
        monkeypatch,
        "gfx942,304,64,4096,100,0,torch.bfloat16,torch.bfloat16,flydsl,0,,flydsl_a16w16_mfma_48x64x32",
    )
    with pytest.raises(TableError, match=f"^{path}:2: column 'kernelName': .*tile not supported"):
        run(50, 4096, 100)


def test_the_replay_reports_a_row_torch_serves_unreached(tmp_path, monkeypatch):
    """What `--list` prints for the row: UNREACHED, served by torch, no kernel (not FAIL)."""
    from aiter.aot.flydsl import gemm as gemm_module
    from aiter.aot.flydsl.jobs.records import Tag
    from aiter.aot.flydsl.replay.naming import name_job

    path = _extra_table(
        tmp_path,
        monkeypatch,
        "gfx942,304,16,4096,100,0,torch.bfloat16,torch.bfloat16,"
        "flydsl,0,,flydsl_a16w16_mfma_16x64x32",
    )
    jobs = [
        j
        for j in gemm_module.FAMILY.jobs("gfx942", frozenset({304}), {"M": 64})
        if j.info.row == f"{path}:2"
    ]
    assert [(j.info.lo, j.info.hi) for j in jobs] == [(1, 64)]
    result = name_job(jobs[0], None)
    assert (result.tag, result.message) == (Tag.UNREACHED, "served by torch: K % 32 != 0 (K=100)")
    assert [(s.lo, s.hi, s.kernels, s.backends) for s in result.segments] == [
        (1, 64, [], ["torch"])
    ]


# --- validation ---


def _fake(*shape, dtype=BF16, device="cuda"):
    return torch.empty(*shape, dtype=dtype, device=device)


def _fake_bias(*shape, dtype=BF16):
    """A bias made later, inside the dry run."""
    return lambda: _fake(*shape, dtype=dtype)


CASES = [
    pytest.param(
        lambda: (_fake(64), _fake(64, 64)),
        {},
        ValueError,
        "A must be 2-D, got shape (64,)",
        id="A-not-2d",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(2, 64, 64)),
        {},
        ValueError,
        "B must be 2-D, got shape (2, 64, 64)",
        id="B-not-2d",
    ),
    pytest.param(
        lambda: ([[1.0]], _fake(64, 64)),
        {},
        TypeError,
        "A must be a torch.Tensor, got list",
        id="A-not-tensor",
    ),
    pytest.param(
        lambda: (_fake(4, 64, dtype=torch.float32), _fake(64, 64)),
        {},
        TypeError,
        "A must have dtype in (torch.bfloat16, torch.float16), got torch.float32",
        id="A-fp32",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64, dtype=torch.float16)),
        {},
        TypeError,
        "B must have A's dtype torch.bfloat16, got torch.float16",
        id="dtype-mismatch",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 32)),
        {},
        ValueError,
        "A is [M, K] and B is [N, K]: K differs, A (4, 64) vs B (64, 32)",
        id="K-mismatch",
    ),
    pytest.param(
        lambda: (_fake(0, 64), _fake(64, 64)),
        {},
        ValueError,
        "A must have at least one row, got shape (0, 64)",
        id="M-zero",
    ),
    pytest.param(
        lambda: (_fake(4, 64, device="cpu"), _fake(64, 64)),
        {},
        ValueError,
        "A must be on a GPU device, got cpu",
        id="A-on-cpu",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64).transpose(0, 1)),
        {},
        ValueError,
        "B must be row-major contiguous, got strides (1, 64)",
        id="B-transposed",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(96, 128)[:, :64]),
        {},
        ValueError,
        "B must be row-major contiguous, got strides (128, 1)",
        id="B-column-slice",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64)),
        {"out_dtype": torch.int8},
        TypeError,
        "out_dtype must be one of (torch.bfloat16, torch.float16, torch.float32) or None, "
        "got torch.int8",
        id="out-int8",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64)),
        {"bias": _fake_bias(32)},
        ValueError,
        "bias must have shape [N] = [64], got (32,)",
        id="bias-shape",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64)),
        {"bias": _fake_bias(1, 64)},
        ValueError,
        "bias must have shape [N] = [64], got (1, 64)",
        id="bias-2d",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64)),
        {"bias": _fake_bias(64, dtype=torch.float32)},
        TypeError,
        "bias must have the output dtype torch.bfloat16, got torch.float32",
        id="bias-dtype",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64)),
        {"bias": _fake_bias(64), "out_dtype": torch.float32},
        TypeError,
        "bias must have the output dtype torch.float32, got torch.bfloat16",
        id="bias-dtype-vs-out-dtype",
    ),
    pytest.param(
        lambda: (_fake(4, 64), _fake(64, 64)),
        {"bias": "bias"},
        TypeError,
        "bias must be a torch.Tensor or None, got str",
        id="bias-not-tensor",
    ),
]


@pytest.mark.parametrize("make, kwargs, error, message", CASES)
def test_validation_errors_name_the_argument(make, kwargs, error, message) -> None:
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests, dispatch.observe() as records:
        a, b = make()
        kwargs = {k: (v() if callable(v) else v) for k, v in kwargs.items()}
        with pytest.raises(error) as info:
            gemm_a16w16(a, b, **kwargs)
        assert str(info.value) == message
        assert records == [] and requests == []


# --- extra tables (bad rows: tests/tables/test_bad_tables.py) ---


def _extra_table(tmp_path: Path, monkeypatch, *rows: str) -> Path:
    path = tmp_path / "extra_bf16.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    monkeypatch.setenv(A16W16.env_var, str(path))
    return path


def test_extra_table_row_overrides_the_default_and_sets_split_k(tmp_path, monkeypatch, run):
    # Same shape as the default M=64 row, us empty on both: the later file wins the tie.
    path = _extra_table(
        tmp_path,
        monkeypatch,
        "gfx942,304,64,4096,4096,0,torch.bfloat16,torch.bfloat16,"
        "flydsl,2,,flydsl_a16w16_mfma_32x128x32",
    )
    _, (record,), requests = run(50, 4096, 4096)
    assert (record.kernel, record.source, record.row, record.params) == (
        "flydsl_a16w16_mfma_32x128x32",
        "table",
        f"{path}:2",
        {"split_k": 2},
    )
    main = params(requests[0])
    assert (main["tile_m"], main["tile_n"], main["tile_k"], main["split_k"]) == (
        "32",
        "128",
        "32",
        "2",
    )
    # Buckets of the other default rows are untouched.
    _, (record,), _ = run(20, 4096, 4096)
    assert record.row == default_row_ref("gfx942,304,32,4096,4096,0,")


def test_a_k_past_the_main_loops_buffer_offsets_is_not_served_by_flydsl() -> None:
    """A block's rows x K must fit 32-bit buffer offsets: a longer K goes to torch, with the
    reason, rather than reaching the launcher's refusal."""
    assert gemm_plan.A16W16.cannot_serve(16, 4096, 2**20, "mfma") is None
    reason = gemm_plan.A16W16.cannot_serve(16, 4096, 2**22, "mfma")
    assert (
        reason == "K = 4194304 is too long for the main loop's 32-bit buffer offsets over 256 rows"
    )
    assert gemm_plan.BPRESHUFFLE.cannot_serve(16, 4096, 2**22, "mfma") is None  # 1-byte inputs
    assert gemm_plan.BPRESHUFFLE.cannot_serve(16, 4096, 2**23, "mfma") is not None
