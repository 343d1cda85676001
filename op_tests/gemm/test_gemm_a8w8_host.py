"""Host side of the fp8/int8 GEMMs: kernel names, the tile and split-K heuristic on a8w8 tiles,
and gemm_a8w8_bpreshuffle / gemm_a8w8_blockscale inside a gfx942 dry run (naming mode, no compile).

Expected tiles and splits are worked out by hand from the rules in aiter.ops.gemm.plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import aiter
from aiter import device, dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.gemm import entry as entries
from aiter.ops.gemm import plan as config
from aiter.ops.gemm.kernels import a8w8 as kernels
from aiter.ops.gemm.kernels.a8w8 import BLOCKSCALE_TILES, BPRESHUFFLE_TILES, A8W8Tile
from aiter.ops.gemm.plan import plan
from aiter.ops.gemm.table import A8W8_BLOCKSCALE, A8W8_BPRESHUFFLE
from aiter.ops.shared import preshuffle

FNUZ, FN, I8 = torch.float8_e4m3fnuz, torch.float8_e4m3fn, torch.int8
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
BP, BS = "flydsl_a8w8_bpreshuffle", "flydsl_a8w8_blockscale"
BP_HEADER = ",".join(A8W8_BPRESHUFFLE.header)
BS_HEADER = ",".join(A8W8_BLOCKSCALE.header)
GFX1250_REASON = "flydsl_a8w8_blockscale has no wmma kernels (only mfma)"
ALL_BP_TILES = ", ".join(
    f"{m}x{n}x{k}"
    for m in (16, 32, 64, 128, 256)
    for n in (64, 128, 256)
    for k in (64, 128, 256)
    if (m, n, k) != (256, 256, 128)  # over the register budget
    and (m, k) != (256, 256)  # a 64 KiB A stage: over MAX_A_STAGE_BYTES
)
ALL_BS_TILES = ", ".join(f"{m}x{n}x128" for m in (16, 32, 64, 128, 256) for n in (64, 128))
FAMILY_TILES = [
    pytest.param(
        family,
        mma,
        tile,
        id=f"{family.prefix[12:]}-{mma}-{tile.tile_m}x{tile.tile_n}x{tile.tile_k}",
    )
    for family in (config.BPRESHUFFLE, config.BLOCKSCALE)
    for mma, tiles in family.tiles.items()
    for tile in tiles
]


def default_row_ref(spec, prefix: str) -> str:
    """'<default table>:<line>' of the one default row of `spec` starting with `prefix`."""
    path = spec.default_path
    hits = [
        i + 1 for i, line in enumerate(path.read_text().splitlines()) if line.startswith(prefix)
    ]
    assert len(hits) == 1, (prefix, hits)
    return f"{path}:{hits[0]}"


def bp_row(m: int, n: int, k: int) -> str:
    return default_row_ref(A8W8_BPRESHUFFLE, f"gfx942,304,{m},{n},{k},torch.float8_e4m3fnuz,")


def bs_row(m: int, n: int, k: int) -> str:
    return default_row_ref(A8W8_BLOCKSCALE, f"gfx942,304,{m},{n},{k},")


# --- kernel names ---


def test_supported_tiles() -> None:
    assert set(BPRESHUFFLE_TILES) == {"mfma", "wmma"}
    assert set(BLOCKSCALE_TILES) == {"mfma"}  # no gfx1250 blockscale kernel
    bp = [f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in BPRESHUFFLE_TILES["mfma"]]
    assert ", ".join(bp) == ALL_BP_TILES
    assert BPRESHUFFLE_TILES["wmma"] == BPRESHUFFLE_TILES["mfma"]
    bs = [f"{t.tile_m}x{t.tile_n}x{t.tile_k}" for t in BLOCKSCALE_TILES["mfma"]]
    assert ", ".join(bs) == ALL_BS_TILES
    assert (config.BPRESHUFFLE.prefix, config.BLOCKSCALE.prefix) == (BP, BS)


@pytest.mark.parametrize("family, mma, tile", FAMILY_TILES)
def test_kernel_name_round_trip(family, mma: str, tile: A8W8Tile) -> None:
    name = family.kernel_name(mma, tile)
    assert name == f"{family.prefix}_{mma}_{tile.tile_m}x{tile.tile_n}x{tile.tile_k}"
    assert family.parse_kernel_name(name, mma) == tile
    assert family.parse_kernel_name(f" {name}  ", mma) == tile
    assert family.choose(1, 64, 128, 304, mma, tile, 1).name == name


@pytest.mark.parametrize(
    "family, mma, examples",
    [
        (config.BPRESHUFFLE, "mfma", f"{BP}_mfma_16x64x64, {BP}_mfma_16x64x128"),
        (config.BPRESHUFFLE, "wmma", f"{BP}_wmma_16x64x64, {BP}_wmma_16x64x128"),
        (config.BLOCKSCALE, "mfma", f"{BS}_mfma_16x64x128, {BS}_mfma_16x128x128"),
    ],
)
@pytest.mark.parametrize(
    "suffix",
    ["", "_mfma_16x64", "_mfma_16x64x128x128", "_MFMA_16x64x128", "_mfma_16x64x128_v2", "_mfma_x"],
)
def test_malformed_name_shows_the_grammar(family, mma: str, examples: str, suffix: str) -> None:
    name = family.prefix + suffix
    with pytest.raises(ValueError) as info:
        family.parse_kernel_name(name, mma)
    flavours = "mfma|wmma" if family is config.BPRESHUFFLE else "mfma"
    assert str(info.value) == (
        f"{name!r} is not a {family.prefix} kernel name: expected "
        f"{family.prefix}_<{flavours}>_<tile_m>x<tile_n>x<tile_k>, e.g. {examples}"
    )


@pytest.mark.parametrize(
    "family, other",
    [(config.BPRESHUFFLE, BS), (config.BLOCKSCALE, BP), (config.BPRESHUFFLE, "flydsl_a16w16")],
)
def test_another_familys_name_is_malformed(family, other: str) -> None:
    name = f"{other}_mfma_16x64x128"
    with pytest.raises(ValueError, match=f"^'{name}' is not a {family.prefix} kernel name: "):
        family.parse_kernel_name(name, "mfma")


@pytest.mark.parametrize(
    "family, name, arch_mma, named",
    [
        (config.BPRESHUFFLE, f"{BP}_wmma_16x64x128", "mfma", "wmma"),
        (config.BPRESHUFFLE, f"{BP}_mfma_128x128x128", "wmma", "mfma"),
        (config.BLOCKSCALE, f"{BS}_wmma_16x64x128", "mfma", "wmma"),
        (config.BLOCKSCALE, f"{BS}_mfma_16x64x128", "wmma", "mfma"),
    ],
)
def test_wrong_flavour(family, name: str, arch_mma: str, named: str) -> None:
    with pytest.raises(ValueError) as info:
        family.parse_kernel_name(name, arch_mma)
    assert str(info.value) == (
        f"{name!r} names a {named} kernel, but this arch uses {arch_mma} kernels"
    )


def test_blockscale_has_no_wmma_kernels() -> None:
    name = f"{BS}_wmma_16x64x128"
    with pytest.raises(ValueError) as info:
        config.BLOCKSCALE.parse_kernel_name(name, "wmma")
    assert str(info.value) == f"{name!r}: {BS} has no wmma kernels"


def test_malformed_blockscale_name_on_wmma_offers_no_wmma_examples() -> None:
    with pytest.raises(ValueError) as info:
        config.BLOCKSCALE.parse_kernel_name("nonsense", "wmma")
    assert f"{BS}_wmma_" not in str(info.value)


@pytest.mark.parametrize(
    "family, mma, tile, supported",
    [
        (config.BPRESHUFFLE, "mfma", "16x64x32", ALL_BP_TILES),  # an a16w16 tile_k
        (config.BPRESHUFFLE, "wmma", "48x64x128", ALL_BP_TILES),
        (config.BPRESHUFFLE, "mfma", "16x96x128", ALL_BP_TILES),
        (config.BPRESHUFFLE, "mfma", "48x128x128", ALL_BP_TILES),
        (config.BLOCKSCALE, "mfma", "16x64x64", ALL_BS_TILES),  # tile_k is the 128 scale block
        (config.BLOCKSCALE, "mfma", "128x128x256", ALL_BS_TILES),
    ],
)
def test_unsupported_tile(family, mma: str, tile: str, supported: str) -> None:
    name = f"{family.prefix}_{mma}_{tile}"
    with pytest.raises(ValueError) as info:
        family.parse_kernel_name(name, mma)
    assert str(info.value) == (
        f"{name!r}: tile not supported by the {mma} kernel; supported: {supported}"
    )


@pytest.mark.parametrize("mma", ["mfma", "wmma"])
@pytest.mark.parametrize("tile, reason", [
    ("256x64x256", "stages 65536 bytes of A per k-tile: over 32768, the kernel runs out of SGPRs"),
    ("256x256x128", "needs about 432 VGPRs per lane (estimate)"),
])  # fmt: skip
def test_a_tile_that_does_not_fit_is_refused_with_the_reason(mma, tile, reason) -> None:
    if mma == "wmma" and "VGPRs" in reason:
        reason = "needs about 864 VGPRs per lane (estimate)"
    name = f"{BP}_{mma}_{tile}"
    with pytest.raises(ValueError) as info:
        config.BPRESHUFFLE.parse_kernel_name(name, mma)
    assert str(info.value).startswith(f"{name!r}: the tile does not fit: it {reason}")


# --- heuristic on a8w8 tiles (tile_k 64, 128 or 256) ---


@pytest.mark.parametrize(
    "family, m, n, k, cu_num, expected_tile, expected_split",
    [
        # tile_m 16 >= 1; n=128: 1 x 32 blocks < 304, n=64: 1 x 64 < 304 -> narrowest 64;
        # A decode tile takes 256 bytes of K per row: 256 | 4096. Split: 64 blocks, 16 k-tiles:
        # 2 (128, 8), 4 (256, 4), not 8 (512 > 304).
        (config.BPRESHUFFLE, 1, 4096, 4096, 304, (16, 64, 256), 4),
        # tile_m 128 >= 100; n=128: 1 x 64 = 64 < 80, n=64: 1 x 128 >= 80 -> 64;
        # 192 = 1.5 x 128, 3 x 64 -> tile_k 64. Split: 128 blocks x 2 > 80 -> 1.
        (config.BPRESHUFFLE, 100, 8192, 192, 80, (128, 64, 64), 1),
        # tile_m 256 (capped); n=256: 16 x 16 = 256 < 304 blocks, n=128: 512 >= 304. The
        # output fills the GPU.
        (config.BPRESHUFFLE, 4096, 4096, 8192, 304, (256, 128, 128), 1),
        # tile_m 16; 1 x 20 blocks of n=64; 256 | 8192. 20 blocks, 32 k-tiles: 2, 4, 8 all fit
        # (160 <= 304, 32 // 8 = 4 >= 4): MAX_SPLIT_K.
        (config.BPRESHUFFLE, 3, 1280, 8192, 304, (16, 64, 256), 8),
        # 256 does not divide 640, 128 does: 5 k-tiles, a split of 2 would leave 2 < 4 each.
        (config.BPRESHUFFLE, 3, 320, 640, 304, (16, 64, 128), 1),
        # tile_m 64 >= 33; n=128: 56 blocks, n=64: 112, both < 304 -> 64; tile_k is always 128.
        # 112 blocks, 56 k-tiles: 2 (224 <= 304, 28 >= 4), not 4 (448 > 304).
        (config.BLOCKSCALE, 33, 7168, 7168, 304, (64, 64, 128), 2),
        # tile_m 128 >= 100 on 80 CUs: n=128: 1 x 16 < 80, n=64: 32 < 80 -> 64.
        # 32 blocks, 16 k-tiles: 2 (64 <= 80, 8 >= 4), not 4 (128 > 80).
        (config.BLOCKSCALE, 100, 2048, 2048, 80, (128, 64, 128), 2),
    ],
)
def test_heuristic(family, m, n, k, cu_num, expected_tile, expected_split) -> None:
    tile = A8W8Tile(*expected_tile)
    for mma in family.tiles:
        assert family.heuristic_tile(m, n, k, cu_num, mma) == tile
        assert family.heuristic_split_k(m, n, k, cu_num, tile) == expected_split
        choice = family.choose(m, n, k, cu_num, mma, None, 0)
        assert (choice.tile, choice.split_k, choice.mma) == (tile, expected_split, mma)


def test_split_k_changes_inside_one_m_bucket() -> None:
    # Default row gfx942/304, N=1280, K=8192 (Llama-3.1-70B TP8) at M=512 serves M in
    # [257, 512] with 128x64x128 and splitK 0. 20 column blocks, 64 k-tiles.
    # 3 row blocks (M <= 384): 60 blocks; 120, 240 <= 304, 480 > 304 -> split 4.
    # 4 row blocks (M >= 385): 80 blocks; 160 <= 304, 320 > 304 -> split 2.
    tile = A8W8Tile(128, 64, 128)
    split = config.BPRESHUFFLE.heuristic_split_k
    assert {m: split(m, 1280, 8192, 304, tile) for m in (257, 384, 385, 512)} == {
        257: 4,
        384: 4,
        385: 2,
        512: 2,
    }


# --- the entries in a gfx942 dry run ---


def _t(*shape, dtype=FP32, device="cuda"):
    return torch.empty(*shape, dtype=dtype, device=device)


def bp_args(m, n, k, q=FNUZ):
    return _t(m, k, dtype=q), _t(n, k, dtype=q), _t(m, 1), _t(1, n)


def bs_args(m, n, k, q=FNUZ):
    return _t(m, k, dtype=q), _t(n, k, dtype=q), _t(m, k // 128), _t(n // 128, k // 128)


@pytest.fixture
def run(monkeypatch):
    """Call an entry on fakes in a gfx942 naming dry run.

    Returns (out, records, requests, launches): launches holds, per FlyDSL launch the entry made,
    the workspace and semaphore it allocated and the tile, split_k and mma it asked for.
    """
    launches = []

    def spy(name):
        original = getattr(entries, name)

        def launch(xq, wq, x_scale, w_scale, out, workspace, semaphore, **kw):
            launches.append((workspace, semaphore, kw["tile"], kw["split_k"], kw["mma"]))
            return original(xq, wq, x_scale, w_scale, out, workspace, semaphore, **kw)

        monkeypatch.setattr(entries, name, launch)

    spy("launch_gemm_a8w8_bpreshuffle")
    spy("launch_gemm_a8w8_blockscale")

    def call(entry, make_args, *shape, q=FNUZ, out_dtype=BF16):
        launches.clear()
        with dry_run("gfx942", 304, bridge.MODE_NAME) as requests, dispatch.observe() as records:
            out = entry(*make_args(*shape, q=q), out_dtype)
            assert isinstance(out, FakeTensor)
            assert out.device == torch.device("cuda", 0)
            return out, list(records), list(requests), list(launches)

    return call


def params(request) -> dict[str, str]:
    return dict(request.params)


def bpreshuffle(run, m, n, k, **kw):
    return run(aiter.gemm_a8w8_bpreshuffle, bp_args, m, n, k, **kw)


def blockscale(run, m, n, k, **kw):
    return run(aiter.gemm_a8w8_blockscale, bs_args, m, n, k, **kw)


def test_entries_are_lazy_attributes_of_aiter() -> None:
    assert aiter.gemm_a8w8_bpreshuffle is entries.gemm_a8w8_bpreshuffle
    assert aiter.gemm_a8w8_blockscale is entries.gemm_a8w8_blockscale
    assert aiter.shuffle_weight is preshuffle.shuffle_weight
    assert aiter.unshuffle_weight is preshuffle.unshuffle_weight


def _check_split_k_buffers(m, n, record, request, launch) -> None:
    """The entry allocates split-K buffers exactly when the kernel splits K."""
    workspace, semaphore, tile, split_k, _ = launch
    assert record.params == {"split_k": split_k}
    p = params(request)
    assert p["split_k"] == str(split_k)
    if split_k > 1:
        assert (workspace.shape, workspace.dtype) == ((split_k, m, n), FP32)
        slots = -(-m // tile.tile_m) * -(-n // tile.tile_n)
        assert kernels.semaphore_size(m, n, tile) == slots
        assert (semaphore.shape, semaphore.dtype) == ((slots,), torch.int64)
        assert (p["workspace"], p["semaphore"]) == ("float32", "int64")
    else:
        assert (workspace, semaphore) == (None, None)
        # The launcher passes x_scale in their place: no int64 semaphore is part of the key.
        assert (p["workspace"], p["semaphore"]) == ("float32", "float32")


@pytest.mark.parametrize("out_dtype", [BF16, FP16])
@pytest.mark.parametrize(
    "m, row_m, tile, split_k",
    [
        # Row M=1, 16x64x256, splitK 0: 20 blocks, 32 k-tiles -> 8 (160 <= 304, 4 each).
        (1, 1, (16, 64, 256), 8),
        # M=20 is in the bucket [17, 32] of row M=32 (32x64x256): 20 blocks -> 8.
        (20, 32, (32, 64, 256), 8),
        # Row M=256 (256x64x128): 1 x 20 = 20 blocks: 40, 80, 160 <= 304, 64 k-tiles -> 8.
        (200, 256, (256, 64, 128), 8),
        # Row M=4096 (256x64x128): 16 x 20 = 320 blocks >= 304 -> 1.
        (4000, 4096, (256, 64, 128), 1),
    ],
)
def test_bpreshuffle_table_shape(run, m, row_m, tile, split_k, out_dtype) -> None:
    name = f"{BP}_mfma_{'x'.join(map(str, tile))}"
    out, records, requests, launches = bpreshuffle(run, m, 1280, 8192, out_dtype=out_dtype)
    assert (out.shape, out.dtype) == ((m, 1280), out_dtype)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a8w8_bpreshuffle",
            "flydsl",
            name,
            "table",
            bp_row(row_m, 1280, 8192),
            {"split_k": split_k},
        )
    ]
    assert [r.function for r in requests] == ["gemm_a8w8_bpreshuffle"]
    p = params(requests[0])
    assert {key: p[key] for key in ("tile_m", "tile_n", "tile_k", "mma")} == {
        "tile_m": str(tile[0]),
        "tile_n": str(tile[1]),
        "tile_k": str(tile[2]),
        "mma": "'mfma'",
    }
    assert (p["xq"], p["wq"], p["x_scale"], p["w_scale"], p["out"]) == (
        "float8_e4m3fnuz",
        "float8_e4m3fnuz",
        "float32",
        "float32",
        str(out_dtype).removeprefix("torch."),
    )
    assert len(launches) == 1 and launches[0][2:] == (A8W8Tile(*tile), split_k, "mfma")
    _check_split_k_buffers(m, 1280, records[0], requests[0], launches[0])


def test_split_k_changes_inside_one_bucket_through_the_entry(run) -> None:
    # Row M=1024 (256x64x128), 20 N tiles: 3 M tiles up to M=768 (60 blocks: 4 splits), 4 from
    # 769 (80 blocks: 2).
    ref = bp_row(1024, 1280, 8192)
    seen = {}
    for m in (513, 768, 769, 1024):
        _, (record,), (request,), (launch,) = bpreshuffle(run, m, 1280, 8192)
        assert (record.kernel, record.source, record.row) == (f"{BP}_mfma_256x64x128", "table", ref)
        _check_split_k_buffers(m, 1280, record, request, launch)
        seen[m] = record.params["split_k"]
    assert seen == {513: 4, 768: 4, 769: 2, 1024: 2}


@pytest.mark.parametrize(
    "m, n, k, kernel, split_k",
    [
        # The tabled Llama shape, but int8 is another q_dtype_w: untuned.
        # 16x64x256 (1 x 20 blocks < 304), 32 k-tiles -> 8.
        (3, 1280, 8192, f"{BP}_mfma_16x64x256", 8),
        # 16x64x128 (256 does not divide 640); 5 k-tiles -> 1.
        (3, 320, 640, f"{BP}_mfma_16x64x128", 1),
        # 64 | 192, 128 does not: tile_k 64. tile_m 128 >= 100; 1 x 3 blocks of n=64 -> 64.
        # 3 blocks, 3 k-tiles -> 1.
        (100, 192, 192, f"{BP}_mfma_128x64x64", 1),
    ],
)
def test_bpreshuffle_int8_untuned_uses_the_heuristic(run, m, n, k, kernel, split_k) -> None:
    out, records, requests, launches = bpreshuffle(run, m, n, k, q=I8)
    assert (out.shape, out.dtype) == ((m, n), BF16)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a8w8_bpreshuffle", "flydsl", kernel, "heuristic", None, {"split_k": split_k}
        )
    ]
    (request,) = requests
    assert (params(request)["xq"], params(request)["wq"]) == ("int8", "int8")
    _check_split_k_buffers(m, n, records[0], request, launches[0])


@pytest.mark.parametrize(
    "m, row_m, tile, split_k",
    [
        # M=5 is in the bucket [5, 8] of row M=8 (16x64x128): 1 x 112 blocks, 16 k-tiles:
        # 2 (224 <= 304, 16 // 2 = 8 >= 4), not 4 (448 > 304) -> 2.
        (5, 8, (16, 64, 128), 2),
        # Row M=4096 (256x128x128): 16 x 56 = 896 blocks -> 1.
        (4096, 4096, (256, 128, 128), 1),
    ],
)
@pytest.mark.parametrize("out_dtype", [BF16, FP16])
def test_blockscale_table_shape(run, m, row_m, tile, split_k, out_dtype) -> None:
    name = f"{BS}_mfma_{'x'.join(map(str, tile))}"
    out, records, requests, launches = blockscale(run, m, 7168, 2048, out_dtype=out_dtype)
    assert (out.shape, out.dtype) == ((m, 7168), out_dtype)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a8w8_blockscale",
            "flydsl",
            name,
            "table",
            bs_row(row_m, 7168, 2048),
            {"split_k": split_k},
        )
    ]
    assert [r.function for r in requests] == ["gemm_a8w8_blockscale"]
    p = params(requests[0])
    assert (p["xq"], p["wq"], p["out"], p["tile_k"]) == (
        "float8_e4m3fnuz",
        "float8_e4m3fnuz",
        str(out_dtype).removeprefix("torch."),
        "128",
    )
    _check_split_k_buffers(m, 7168, records[0], requests[0], launches[0])


@pytest.mark.parametrize(
    "entry, make_args, n, k, prefix",
    [
        pytest.param(
            "gemm_a8w8_bpreshuffle",
            bp_args,
            64,
            128,
            "gfx942,304,{m},64,128,torch.float8_e4m3fnuz,torch,",
            id="bpreshuffle",
        ),
        pytest.param(
            "gemm_a8w8_blockscale",
            bs_args,
            128,
            128,
            "gfx942,304,{m},128,128,torch,",
            id="blockscale",
        ),
    ],
)
@pytest.mark.parametrize("m, row_m", [(1, 1), (3, 4), (16, 16)], ids=["M1", "M3", "M16"])
@pytest.mark.parametrize("out_dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_torch_rows(run, entry, make_args, n, k, prefix, m, row_m, out_dtype) -> None:
    out, records, requests, launches = run(
        getattr(aiter, entry), make_args, m, n, k, out_dtype=out_dtype
    )
    assert (out.shape, out.dtype) == ((m, n), out_dtype)
    spec = A8W8_BPRESHUFFLE if entry == "gemm_a8w8_bpreshuffle" else A8W8_BLOCKSCALE
    ref = default_row_ref(spec, prefix.format(m=row_m))
    assert records == [dispatch.DispatchRecord(entry, "torch", None, "table", ref)]
    assert (requests, launches) == ([], [])


def test_torch_rows_end_at_their_top_bucket(run) -> None:
    _, (record,), _, _ = bpreshuffle(run, 17, 64, 128)  # above every tabled M: untuned
    assert (record.backend, record.source, record.kernel) == (
        "flydsl",
        "heuristic",
        f"{BP}_mfma_32x64x128",
    )


# --- shapes no FlyDSL kernel serves go to torch ---


@pytest.mark.parametrize(
    "family, n, k, mma, reason",
    [
        (config.BPRESHUFFLE, 64, 96, "mfma", "K % 64 != 0 (K=96)"),
        (config.BPRESHUFFLE, 64, 80, "wmma", "K % 64 != 0 (K=80)"),
        (config.BPRESHUFFLE, 72, 128, "mfma", "N % 16 != 0 (N=72)"),
        (config.BPRESHUFFLE, 64, 128, "wmma", None),
        (config.BLOCKSCALE, 128, 128, "mfma", None),
        (config.BLOCKSCALE, 128, 128, "wmma", GFX1250_REASON),
        (config.BLOCKSCALE, 128, 192, "mfma", "K % 128 != 0 (K=192)"),
    ],
)
def test_what_the_kernels_cannot_serve(family, n, k, mma, reason) -> None:
    assert family.cannot_serve(4, n, k, mma) == reason
    assert family.cannot_serve(2**20, n, k, mma) == reason  # no M * N limit


def test_bpreshuffle_k_off_the_kernels_grid_is_served_by_torch(run) -> None:
    # A 16x16-preshuffled weight with K = 96: torch unshuffles it; the kernels need K % 64.
    out, records, requests, launches = bpreshuffle(run, 4, 64, 96, out_dtype=FP16)
    assert (out.shape, out.dtype) == ((4, 64), FP16)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a8w8_bpreshuffle",
            "torch",
            None,
            "heuristic",
            None,
            {"reason": "K % 64 != 0 (K=96)"},
        )
    ]
    assert (requests, launches) == ([], [])


def test_a_tuned_bpreshuffle_row_the_kernels_cannot_serve_falls_to_torch(
    tmp_path, monkeypatch, run
) -> None:
    path = _extra_table(
        tmp_path,
        monkeypatch,
        A8W8_BPRESHUFFLE,
        f"gfx942,304,32,1024,1056,torch.int8,flydsl,0,1,,{BP}_mfma_32x64x64",
    )
    _, records, requests, launches = bpreshuffle(run, 20, 1024, 1056, q=I8)
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a8w8_bpreshuffle",
            "torch",
            None,
            "table",
            f"{path}:2",
            {"reason": "K % 64 != 0 (K=1056)"},
        )
    ]
    assert (requests, launches) == ([], [])


# --- validation (what no backend serves is an error before anything runs) ---


def _bp_valid(m=4, n=64, k=128, q=FNUZ):
    return list(bp_args(m, n, k, q=q))


def _bs_valid(m=4, n=256, k=256, q=FNUZ):
    return list(bs_args(m, n, k, q=q))


def _replace(make, index, value):
    def build():
        args = make()
        args[index] = value() if callable(value) else value
        return args

    return build


BP_CASES = [
    pytest.param(
        _replace(_bp_valid, 0, lambda: _t(128, dtype=FNUZ)),
        {},
        ValueError,
        "XQ must be a 2-D tensor [M, K], got shape [128]",
        id="XQ-1d",
    ),
    pytest.param(
        _replace(_bp_valid, 0, lambda: _t(2, 4, 128, dtype=FNUZ)),
        {},
        ValueError,
        "XQ must be a 2-D tensor [M, K], got shape [2, 4, 128]",
        id="XQ-3d",
    ),
    pytest.param(
        _replace(_bp_valid, 1, lambda: _t(64, 128, 1, dtype=FNUZ)),
        {},
        ValueError,
        "WQ must be a 2-D tensor [N, K], got shape [64, 128, 1]",
        id="WQ-3d",
    ),
    pytest.param(
        _replace(_bp_valid, 0, lambda: _t(0, 128, dtype=FNUZ)),
        {},
        ValueError,
        "XQ must have at least one row, got shape [0, 128]",
        id="M-zero",
    ),
    pytest.param(
        _replace(_bp_valid, 0, lambda: _t(4, 128, dtype=BF16)),
        {},
        TypeError,
        "XQ must have dtype in (torch.float8_e4m3fnuz, torch.int8) on gfx942 (its fp8 flavour), "
        "got torch.bfloat16",
        id="XQ-bf16",
    ),
    pytest.param(
        lambda: _bp_valid(q=FN),
        {},
        TypeError,
        "XQ must have dtype in (torch.float8_e4m3fnuz, torch.int8) on gfx942 (its fp8 flavour), "
        "got torch.float8_e4m3fn",
        id="XQ-fn-on-gfx942",
    ),
    pytest.param(
        _replace(_bp_valid, 1, lambda: _t(64, 128, dtype=I8)),
        {},
        TypeError,
        "WQ must have dtype in (torch.float8_e4m3fnuz,), got torch.int8",
        id="WQ-dtype-differs",
    ),
    pytest.param(
        _replace(_bp_valid, 1, lambda: _t(64, 256, dtype=FNUZ)),
        {},
        ValueError,
        "WQ must have shape [64, 128], got [64, 256]",
        id="K-mismatch",
    ),
    pytest.param(
        _replace(_bp_valid, 0, lambda: _t(4, 128, dtype=FNUZ, device="cpu")),
        {},
        ValueError,
        "XQ must be on a GPU device, got cpu",
        id="XQ-on-cpu",
    ),
    pytest.param(
        _replace(_bp_valid, 1, lambda: _t(128, 64, dtype=FNUZ).transpose(0, 1)),
        {},
        ValueError,
        "WQ must be contiguous, got strides (1, 64)",
        id="WQ-transposed",
    ),
    pytest.param(
        _replace(_bp_valid, 2, lambda: _t(4)),
        {},
        ValueError,
        "x_scale must have shape [4, 1], got [4]",
        id="x_scale-1d",
    ),
    pytest.param(
        _replace(_bp_valid, 2, lambda: _t(1, 4)),
        {},
        ValueError,
        "x_scale must have shape [4, 1], got [1, 4]",
        id="x_scale-transposed-shape",
    ),
    pytest.param(
        _replace(_bp_valid, 2, lambda: _t(4, 1, dtype=BF16)),
        {},
        TypeError,
        "x_scale must have dtype in (torch.float32,), got torch.bfloat16",
        id="x_scale-bf16",
    ),
    pytest.param(
        _replace(_bp_valid, 2, [[1.0]] * 4),
        {},
        TypeError,
        "x_scale must be a torch.Tensor, got list",
        id="x_scale-list",
    ),
    pytest.param(
        _replace(_bp_valid, 3, lambda: _t(64, 1)),
        {},
        ValueError,
        "w_scale must have shape [1, 64], got [64, 1]",
        id="w_scale-shape",
    ),
    pytest.param(
        _bp_valid,
        {"out_dtype": FP32},
        TypeError,
        "out_dtype must be one of (torch.bfloat16, torch.float16), got torch.float32",
        id="out-fp32",
    ),
    pytest.param(
        lambda: _bp_valid(n=72, k=128),
        {},
        ValueError,
        "WQ is preshuffled in 16x16 blocks: N % 16 == 0 and K % 16 == 0 are needed, "
        "got N=72, K=128",
        id="N-not-multiple-of-16",
    ),
    pytest.param(
        lambda: _bp_valid(n=64, k=72),
        {},
        ValueError,
        "WQ is preshuffled in 16x16 blocks: N % 16 == 0 and K % 16 == 0 are needed, "
        "got N=64, K=72",
        id="K-not-multiple-of-16",
    ),
]

BS_CASES = [
    pytest.param(
        _replace(_bs_valid, 0, lambda: _t(256, dtype=FNUZ)),
        {},
        ValueError,
        "XQ must be a 2-D tensor [M, K], got shape [256]",
        id="XQ-1d",
    ),
    pytest.param(
        lambda: _bs_valid(q=I8),
        {},
        TypeError,
        "XQ must have dtype in (torch.float8_e4m3fnuz,) on gfx942 (its fp8 flavour), "
        "got torch.int8",
        id="int8",
    ),
    pytest.param(
        lambda: _bs_valid(q=FN),
        {},
        TypeError,
        "XQ must have dtype in (torch.float8_e4m3fnuz,) on gfx942 (its fp8 flavour), "
        "got torch.float8_e4m3fn",
        id="XQ-fn-on-gfx942",
    ),
    pytest.param(
        _replace(_bs_valid, 1, lambda: _t(256, 256, dtype=FN)),
        {},
        TypeError,
        "WQ must have dtype in (torch.float8_e4m3fnuz,), got torch.float8_e4m3fn",
        id="WQ-dtype-differs",
    ),
    pytest.param(
        _replace(_bs_valid, 1, lambda: _t(256, 384, dtype=FNUZ)),
        {},
        ValueError,
        "WQ must have shape [256, 256], got [256, 384]",
        id="K-mismatch",
    ),
    pytest.param(
        lambda: _bs_valid(n=192),
        {},
        ValueError,
        "gemm_a8w8_blockscale needs N and K multiples of 128, got N=192, K=256",
        id="N-not-multiple-of-128",
    ),
    pytest.param(
        lambda: _bs_valid(k=320),
        {},
        ValueError,
        "gemm_a8w8_blockscale needs N and K multiples of 128, got N=256, K=320",
        id="K-not-multiple-of-128",
    ),
    pytest.param(
        _replace(_bs_valid, 2, lambda: _t(4, 1)),
        {},
        ValueError,
        "x_scale must have shape [4, 2], got [4, 1]",
        id="x_scale-per-token",
    ),
    pytest.param(
        _replace(_bs_valid, 2, lambda: _t(4, 2, dtype=BF16)),
        {},
        TypeError,
        "x_scale must have dtype in (torch.float32,), got torch.bfloat16",
        id="x_scale-bf16",
    ),
    pytest.param(
        _replace(_bs_valid, 3, lambda: _t(1, 256)),
        {},
        ValueError,
        "w_scale must have shape [2, 2], got [1, 256]",
        id="w_scale-per-channel",
    ),
    pytest.param(
        _replace(_bs_valid, 3, lambda: _t(256, 2)),
        {},
        ValueError,
        "w_scale must have shape [2, 2], got [256, 2]",
        id="w_scale-per-row",
    ),
    pytest.param(
        _bs_valid,
        {"out_dtype": FP32},
        TypeError,
        "out_dtype must be one of (torch.bfloat16, torch.float16), got torch.float32",
        id="out-fp32",
    ),
]


@pytest.mark.parametrize(
    "entry, make, kwargs, error, message",
    [pytest.param("gemm_a8w8_bpreshuffle", *p.values, id=f"bpreshuffle-{p.id}") for p in BP_CASES]
    + [pytest.param("gemm_a8w8_blockscale", *p.values, id=f"blockscale-{p.id}") for p in BS_CASES],
)
def test_validation_errors_name_the_argument(entry, make, kwargs, error, message) -> None:
    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests, dispatch.observe() as records:
        args = make()
        with pytest.raises(error) as info:
            getattr(aiter, entry)(*args, **kwargs)
        assert str(info.value) == message
        assert records == [] and requests == []


# --- extra tables ---


def _extra_table(tmp_path: Path, monkeypatch, spec, *rows: str, name: str = "extra.csv") -> Path:
    header = BP_HEADER if spec is A8W8_BPRESHUFFLE else BS_HEADER
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    monkeypatch.setenv(spec.env_var, str(path))
    return path


def test_table_env_vars() -> None:
    assert A8W8_BPRESHUFFLE.env_var == "AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE"
    assert A8W8_BLOCKSCALE.env_var == "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE"


def test_extra_row_with_a_lower_us_overrides_the_default(tmp_path, monkeypatch, run) -> None:
    # Two extra files for the default row M=512 of N=1280, K=8192; the default's us is empty.
    # The earlier file's row has the lower us, so it wins over the later file's row as well.
    fast = tmp_path / "fast.csv"
    fast.write_text(
        f"{BP_HEADER}\n"
        f"gfx942,304,512,1280,8192,torch.float8_e4m3fnuz,flydsl,0,2,3.5,{BP}_mfma_64x128x64\n"
    )
    slow = tmp_path / "slow.csv"
    slow.write_text(
        f"{BP_HEADER}\n"
        f"gfx942,304,512,1280,8192,torch.float8_e4m3fnuz,flydsl,0,0,7.25,{BP}_mfma_32x64x64\n"
    )
    monkeypatch.setenv(A8W8_BPRESHUFFLE.env_var, f"{fast}:{slow}")
    _, (record,), (request,), (launch,) = bpreshuffle(run, 300, 1280, 8192)
    assert record == dispatch.DispatchRecord(
        "gemm_a8w8_bpreshuffle",
        "flydsl",
        f"{BP}_mfma_64x128x64",
        "table",
        f"{fast}:2",
        {"split_k": 2},  # the row's splitK, not the heuristic
    )
    p = params(request)
    assert (p["tile_m"], p["tile_n"], p["tile_k"], p["split_k"]) == ("64", "128", "64", "2")
    _check_split_k_buffers(300, 1280, record, request, launch)
    # Buckets of the other default rows are untouched.
    _, (record,), _, _ = bpreshuffle(run, 200, 1280, 8192)
    assert (record.kernel, record.row) == (f"{BP}_mfma_256x64x128", bp_row(256, 1280, 8192))


def test_extra_row_wins_a_tie_with_the_default(tmp_path, monkeypatch, run) -> None:
    # us empty on both the default and the extra row: the later file wins the tie.
    path = _extra_table(
        tmp_path,
        monkeypatch,
        A8W8_BLOCKSCALE,
        f"gfx942,304,8,7168,2048,flydsl,0,1,,{BS}_mfma_16x128x128",
    )
    _, (record,), _, (launch,) = blockscale(run, 5, 7168, 2048)
    assert (record.kernel, record.row, record.params) == (
        f"{BS}_mfma_16x128x128",
        f"{path}:2",
        {"split_k": 1},
    )
    assert launch[:2] == (None, None)


# --- gfx1250: plan only (FlyDSL's arch is frozen per process, so no gfx1250 launch here) ---


def _plan_blockscale(m, n, k):
    return plan(
        "gemm_a8w8_blockscale", A8W8_BLOCKSCALE, config.BLOCKSCALE, {"N": n, "K": k}, m, n, k
    )


def test_blockscale_on_gfx1250_is_served_by_torch() -> None:
    # No gfx1250 row in the default blockscale table, and no wmma kernel: torch serves it.
    with device.simulate("gfx1250", 256), dispatch.observe() as records:
        served = _plan_blockscale(5, 7168, 2048)
        served.report()
    assert served.use_torch and served.reason == GFX1250_REASON
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a8w8_blockscale", "torch", None, "heuristic", None, {"reason": GFX1250_REASON}
        )
    ]


def test_gfx1250_flydsl_blockscale_row_is_served_by_torch(tmp_path, monkeypatch) -> None:
    path = _extra_table(
        tmp_path,
        monkeypatch,
        A8W8_BLOCKSCALE,
        f"gfx1250,256,8,7168,2048,flydsl,0,0,,{BS}_mfma_16x64x128",
    )
    with device.simulate("gfx1250", 256), dispatch.observe() as records:
        _plan_blockscale(5, 7168, 2048).report()
    assert records == [
        dispatch.DispatchRecord(
            "gemm_a8w8_blockscale", "torch", None, "table", f"{path}:2", {"reason": GFX1250_REASON}
        )
    ]


def test_gfx1250_torch_row_is_still_served_by_torch(tmp_path, monkeypatch) -> None:
    path = _extra_table(
        tmp_path, monkeypatch, A8W8_BLOCKSCALE, "gfx1250,256,16,7168,2048,torch,0,0,,"
    )
    with device.simulate("gfx1250", 256), dispatch.observe() as records:
        served = _plan_blockscale(5, 7168, 2048)
        assert served.use_torch and served.choice is None and served.reason is None
        assert (served.row.source, served.row.line) == (str(path), 2)
        served.report()
        _plan_blockscale(17, 7168, 2048).report()  # above the torch row's top bucket
    assert records == [
        dispatch.DispatchRecord("gemm_a8w8_blockscale", "torch", None, "table", f"{path}:2"),
        dispatch.DispatchRecord(
            "gemm_a8w8_blockscale", "torch", None, "heuristic", None, {"reason": GFX1250_REASON}
        ),
    ]


def test_bpreshuffle_on_gfx1250_plans_wmma_kernels() -> None:
    key = {"N": 1280, "K": 8192, "q_dtype_w": "torch.float8_e4m3fn"}
    with device.simulate("gfx1250", 256):
        served = plan(
            "gemm_a8w8_bpreshuffle", A8W8_BPRESHUFFLE, config.BPRESHUFFLE, key, 20, 1280, 8192
        )
        untuned = plan(
            "gemm_a8w8_bpreshuffle",
            A8W8_BPRESHUFFLE,
            config.BPRESHUFFLE,
            {**key, "q_dtype_w": "torch.int8"},
            20,
            1280,
            8192,
        )
    # Row M=32 (wmma 32x64x256): 20 blocks, 32 k-tiles: 2, 4, 8 fit (160 <= 256) -> 8.
    assert (served.choice.name, served.choice.split_k) == (f"{BP}_wmma_32x64x256", 8)
    assert served.row.line == int(
        default_row_ref(A8W8_BPRESHUFFLE, "gfx1250,256,32,1280,8192,").rsplit(":", 1)[1]
    )
    assert (untuned.row, untuned.choice.name, untuned.choice.split_k) == (
        None,
        f"{BP}_wmma_32x64x256",
        8,
    )


# --- weight preshuffle ---


def test_shuffle_weight_round_trip() -> None:
    n, k = 48, 96
    w = torch.arange(n * k, dtype=torch.int32).remainder(251).to(I8).reshape(n, k)
    shuffled = aiter.shuffle_weight(w)
    assert (shuffled.shape, shuffled.dtype, shuffled.is_contiguous()) == ((n, k), I8, True)
    assert not torch.equal(shuffled, w)
    flat = shuffled.flatten()
    for row, col in [(0, 0), (1, 0), (0, 17), (15, 15), (16, 0), (33, 95), (47, 50)]:
        # ((n // 16) * (K / 16) + k // 16) * 256 + (n % 16) * 16 + k % 16
        offset = ((row // 16) * (k // 16) + col // 16) * 256 + (row % 16) * 16 + col % 16
        assert flat[offset] == w[row, col], (row, col)
    assert torch.equal(aiter.unshuffle_weight(shuffled), w)
    assert kernels.BPRESHUFFLE_LAYOUT == (16, 16)


@pytest.mark.parametrize("dtype", [FNUZ, FN])
def test_shuffle_weight_round_trip_fp8(dtype) -> None:
    w = (torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    back = aiter.unshuffle_weight(aiter.shuffle_weight(w))
    assert back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), w.view(torch.uint8))


def test_shuffle_weight_other_layout() -> None:
    w = torch.arange(32 * 64, dtype=torch.int32).to(torch.int16).reshape(32, 64)
    shuffled = aiter.shuffle_weight(w, (8, 32))
    # [32/8, 8, 64/32, 32] -> [4, 2, 8, 32]: row 9 col 40 -> ((1 * 2) + 1) * 256 + 1 * 32 + 8.
    assert shuffled.flatten()[3 * 256 + 32 + 8] == w[9, 40]
    assert torch.equal(aiter.unshuffle_weight(shuffled, (8, 32)), w)
    assert not torch.equal(aiter.unshuffle_weight(shuffled), w)


@pytest.mark.parametrize(
    "shape, layout, message",
    [
        ((24, 32), (16, 16), "w: N = w.shape[-2] = 24 must be a multiple of layout[0] = 16"),
        ((32, 40), (16, 16), "w: K = w.shape[-1] = 40 must be a multiple of layout[1] = 16"),
        ((32,), (16, 16), "w: expected a [..., N, K] tensor, got shape [32]"),
        ((32, 32), (16, 0), "layout: expected a pair of positive ints, got (16, 0)"),
        ((32, 32), [16, 16], "layout: expected a pair of positive ints, got [16, 16]"),
    ],
)
def test_shuffle_weight_errors(shape, layout, message) -> None:
    w = torch.zeros(shape, dtype=I8)
    for fn in (aiter.shuffle_weight, aiter.unshuffle_weight):
        with pytest.raises(ValueError) as info:
            fn(w, layout)
        assert str(info.value) == message


@pytest.mark.parametrize(
    "name", ["flydsl_a8w8_bpreshuffle_mfma_016x64x128", "flydsl_a8w8_bpreshuffle_mfma_16x64x0128"]
)
def test_kernel_names_with_leading_zeros_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not a flydsl_a8w8_bpreshuffle kernel name"):
        config.BPRESHUFFLE.parse_kernel_name(name, "mfma")


@pytest.mark.parametrize("entry", [entries.gemm_a8w8_bpreshuffle, entries.gemm_a8w8_blockscale])
def test_non_tensor_inputs_are_type_errors(entry) -> None:
    expected = pytest.raises(TypeError, match="^XQ must be a torch.Tensor, got list$")
    with dry_run("gfx942", 304, bridge.MODE_NAME), expected:
        entry([[0]], None, None, None)
