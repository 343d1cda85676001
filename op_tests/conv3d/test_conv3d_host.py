"""Host side of conv3d: the lookup (exact row, a borrowed row within 4x the output positions,
the heuristic), the heuristic's tiles and split-K switch points along the frame count, and
aiter.conv3d inside a dry run (naming mode): the kernels each layout pair launches, the GEMM path,
the weight memo and the errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aiter
from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.conv3d import entry
from aiter.ops.conv3d import plan as config
from aiter.ops.conv3d.kernels import implicit_gemm as kernels
from aiter.ops.conv3d.kernels.implicit_gemm import Conv3dGeometry, ConvTile
from aiter.ops.conv3d.table import CONV3D

BF16 = torch.bfloat16
LAYER = dict(C="32", K="32", kT="3", kH="3", kW="3", pad_d="1", pad_h="1", pad_w="1")


def geometry(d: int = 8, c: int = 32, k: int = 32, h: int = 8, w: int = 8, **kw) -> Conv3dGeometry:
    kw = {"kt": 3, "kh": 3, "kw": 3, "padding": (1, 1, 1), **kw}
    return Conv3dGeometry(n=1, c=c, d=d, h=h, w=w, k=k, **kw)


def write_table(directory: Path, *rows: dict[str, str]) -> str:
    lines = [",".join(CONV3D.header)]
    for row in rows:
        cells = dict.fromkeys(CONV3D.header, "")
        cells.update(
            gfx="gfx942", cu_num="80", N="1", D="8", H="8", W="8", stride_d="1", stride_h="1",
            stride_w="1", dil_d="1", dil_h="1", dil_w="1",
            groups="1", bias="1", tile_m="0", tile_n="0", wave_m="0", wave_n="0", wgm="0",
            splitK="0", **LAYER,
        )  # fmt: skip
        cells.update(row)
        lines.append(",".join(cells[name] for name in CONV3D.header))
    path = directory / "conv.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def table(tmp_path, monkeypatch):
    def use(*rows: dict[str, str]) -> str:
        path = write_table(tmp_path, *rows)
        monkeypatch.setenv(CONV3D.env_var, path)
        return path

    return use


# --- lookup ---


def test_the_exact_shape_wins(table):
    path = table({"D": "8", "tile_m": "64", "tile_n": "32", "wave_m": "2", "wave_n": "2",
                  "wgm": "1", "splitK": "4"}, {"D": "9"})  # fmt: skip
    row, match = config.find_row(geometry(8), True, "gfx942", 80)
    assert (f"{row.source}:{row.line}", match) == (f"{path}:2", config.EXACT)


def test_a_row_within_4x_lends_its_tile(table):
    path = table({"D": "8"}, {"D": "32"})
    # 8 frames give 512 positions, 32 give 2048: 20 frames (1280) are nearer 2048 by ratio.
    for d, line in ((2, 2), (12, 2), (17, 3), (20, 3), (128, 3)):
        row, match = config.find_row(geometry(d), True, "gfx942", 80)
        assert (f"{row.source}:{row.line}", match) == (f"{path}:{line}", config.BORROWED), d
    assert config.find_row(geometry(129), True, "gfx942", 80) == (None, config.HEURISTIC)
    assert config.find_row(geometry(1), True, "gfx942", 80) == (None, config.HEURISTIC)


def test_other_layers_and_torch_rows_lend_nothing(table):
    table({"D": "8", "C": "64"}, {"D": "10", "libtype": "torch"}, {"D": "8", "bias": "0"})
    assert config.find_row(geometry(9), True, "gfx942", 80) == (None, config.HEURISTIC)
    row, match = config.find_row(geometry(10), True, "gfx942", 80)
    assert match == config.EXACT and row["libtype"] == "torch"


def test_heuristic_tile_ladder():
    assert config.heuristic_tile(geometry(8, k=32), "mfma") == ConvTile(32, 32, 2, 2, 4)
    assert config.heuristic_tile(geometry(8, k=64, h=32, w=32), "mfma") == ConvTile(64, 64, 2, 2, 8)
    big = geometry(16, k=256, h=64, w=64)  # 65536 positions
    assert config.heuristic_tile(big, "wmma") == ConvTile(128, 128, 2, 2, 8)


def test_split_k_follows_the_frame_count():
    tile = ConvTile(32, 32, 2, 2, 4)
    splits = {d: config.heuristic_split_k(geometry(d), tile, 80) for d in range(1, 41)}
    # 864-deep reduction: 14 steps of 64, so at most 2 splits of >= 4 steps. 64 output
    # positions a frame: 2 splits while 2 * ceil(64 d / 32) <= 80, that is d <= 20.
    assert {d for d, s in splits.items() if s == 2} == set(range(1, 21))
    assert {d for d, s in splits.items() if s == 1} == set(range(21, 41))


def test_equivalent_choices_try_other_splits_then_the_heuristic():
    g = geometry(8, k=64, h=32, w=32)  # heuristic: tile 64x64, split 1
    planned = config.ConvChoice("mfma", ConvTile(32, 32, 2, 2, 4), 4)
    variants = config.equivalent_choices(planned, g, 80)
    assert [(v.tile, v.split_k) for v in variants] == [
        (planned.tile, 1),
        (planned.tile, 2),
        (planned.tile, 8),
        (ConvTile(64, 64, 2, 2, 8), 1),
    ]
    assert config.describe(planned) == "flydsl_conv3d_mfma_32x32_w2x2_g4 split_k=4"


# --- the entry in a dry run ---


def run_conv(make, arch=("gfx942", 80), **kwargs):
    with dry_run(*arch, bridge.MODE_NAME) as requests, dispatch.observe() as records:
        x, w, b = make()
        out = aiter.conv3d(x, w, b, **kwargs)
    return out, [r.function for r in requests], records


def tensors(d=8, c=32, k=32, layout="NCDHW", kernel=(3, 3, 3), bias=True):
    def make():
        shape = (1, c, d, 8, 8) if layout == "NCDHW" else (1, d, 8, 8, c)
        x = torch.empty(shape, dtype=BF16, device="cuda")
        w = torch.empty((k, c, *kernel), dtype=BF16, device="cuda")
        return x, w, torch.empty((k,), dtype=BF16, device="cuda") if bias else None

    return make


@pytest.mark.parametrize("input_layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("output_layout", ["NCDHW", "NDHWC"])
def test_each_layout_pair_launches_its_kernels(table, input_layout, output_layout):
    table({"D": "8"})
    out, functions, records = run_conv(
        tensors(layout=input_layout), padding=1, input_layout=input_layout,
        output_layout=output_layout,
    )  # fmt: skip
    expected = (1, 32, 8, 8, 8) if output_layout == "NCDHW" else (1, 8, 8, 8, 32)
    assert tuple(out.shape) == expected
    assert ("conv3d_pretranspose" in functions) == (input_layout == "NCDHW")
    assert "conv3d_implicit" in functions and "conv3d_splitk_epilogue" in functions  # split 2
    (record,) = records
    assert record.backend == dispatch.BACKEND_FLYDSL and record.params["match"] == "exact"
    assert record.params["output_layout"] == output_layout


def test_an_unpadded_ndhwc_input_goes_through_torch(table):
    table()
    _, functions, records = run_conv(tensors(c=12, layout="NDHWC"), padding=1,
                                     input_layout="NDHWC")  # fmt: skip
    assert "conv3d_pretranspose" not in functions and "conv3d_implicit" in functions
    assert records[0].params["input"] == "torch permute"


def test_a_1x1x1_conv_is_a_gemm():
    _, functions, records = run_conv(tensors(kernel=(1, 1, 1)))
    assert functions == []
    assert records[0].backend == dispatch.BACKEND_TORCH and "GEMM" in records[0].params["reason"]


def test_weights_are_packed_once_per_tensor(table, monkeypatch):
    table()
    calls = []
    real = kernels.pack_conv3d_weight
    monkeypatch.setattr(kernels, "pack_conv3d_weight", lambda w, g: calls.append(w) or real(w, g))
    with dry_run("gfx942", 80, bridge.MODE_NAME):
        x, w, b = tensors()()
        aiter.conv3d(x, w, b, padding=1)
        aiter.conv3d(x, w, b, padding=1)
        assert len(calls) == 1
        w.add_(1)  # a new version of the weight packs again
        aiter.conv3d(x, w, b, padding=1)
        assert len(calls) == 2
    assert not [k for k in entry._packed if k == id(w)] or entry._packed[id(w)][0]() is w


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"input_layout": "NHWC"}, ValueError, "input_layout must be one of"),
        ({"stride": (1, 2)}, TypeError, "stride must be an int or a triple"),
        ({"padding": -1}, ValueError, "padding values must be >= 0"),
        ({"groups": 3}, ValueError, "groups = 3 must divide"),
    ],
)
def test_errors_name_the_argument(table, kwargs, error, message):
    table()
    with pytest.raises(error, match=message):
        run_conv(tensors(), **kwargs)


# --- calls the kernel cannot serve go to torch ---


@pytest.mark.parametrize(
    "g, split_k, reason",
    [
        (geometry(8), 2, None),
        # groups * split_k work-group rows: at most 65535.
        (geometry(8, c=4096, k=4096, groups=4096), 8, None),
        (geometry(8, c=4096, k=4096, groups=4096), 16,
         "groups * split_k = 65536 exceeds the kernel's 65535 grid rows"),
        (geometry(8, c=65536, k=65536, groups=65536), 1,
         "groups = 65536 exceeds the kernel's 65535 grid rows"),
        # 2**31 input positions: N * D * H * W must fit 32-bit indices.
        (geometry(2048, h=1024, w=1024), 1,
         "N * D * H * W = 2147483648 is too large for the kernel's 32-bit indices"),
        # The split-K epilogue's flat index: M * K + 256 <= 2**31.
        (geometry(16, k=128, h=1024, w=1024), 1, None),
        (geometry(16, k=128, h=1024, w=1024), 2,
         "M * K = 2147483648 is too large for the split-K epilogue's 32-bit indices "
         "(split_k=2)"),
    ],
)  # fmt: skip
def test_what_the_kernel_cannot_serve(g, split_k, reason):
    choice = config.ConvChoice("mfma", ConvTile(32, 32, 2, 2, 4), split_k)
    assert config.cannot_serve(g, "mfma", choice) == reason


def test_an_arch_without_conv3d_kernels_is_served_by_torch(table, monkeypatch):
    table({"D": "8"})
    monkeypatch.delitem(kernels.SUPPORTED_TILES, "mfma")
    out, functions, records = run_conv(tensors(), padding=1)
    assert tuple(out.shape) == (1, 32, 8, 8, 8) and functions == []
    (record,) = records
    assert (record.backend, record.source) == (dispatch.BACKEND_TORCH, "table")
    assert record.params == {"reason": "no mfma conv3d kernels (only wmma)"}


def test_a_tuned_split_the_kernel_cannot_launch_falls_to_torch(table):
    # A depthwise layer whose row asks for 32 splits: 4096 groups x 32 > 65535 grid rows.
    path = table({"C": "4096", "K": "4096", "groups": "4096", "splitK": "32"})

    def make():
        x = torch.empty((1, 4096, 8, 8, 8), dtype=BF16, device="cuda")
        w = torch.empty((4096, 1, 3, 3, 3), dtype=BF16, device="cuda")
        return x, w, torch.empty((4096,), dtype=BF16, device="cuda")

    out, functions, records = run_conv(make, padding=1, groups=4096)
    assert tuple(out.shape) == (1, 4096, 8, 8, 8) and functions == []
    assert records == [
        dispatch.DispatchRecord(
            config.OP, dispatch.BACKEND_TORCH, None, "table", f"{path}:2",
            {"reason": "groups * split_k = 131072 exceeds the kernel's 65535 grid rows"},
        )
    ]  # fmt: skip


def test_an_input_too_large_for_the_kernel_is_served_by_torch():
    def make():
        x = torch.empty((1, 16, 2048, 1024, 1024), dtype=BF16, device="cuda")
        return x, torch.empty((16, 16, 3, 3, 3), dtype=BF16, device="cuda"), None

    out, functions, records = run_conv(make, padding=1)
    assert tuple(out.shape) == (1, 16, 2048, 1024, 1024) and functions == []
    assert records == [
        dispatch.DispatchRecord(
            config.OP, dispatch.BACKEND_TORCH, None, "heuristic", None,
            {"reason": "N * D * H * W = 2147483648 is too large for the kernel's 32-bit indices"},
        )
    ]  # fmt: skip


def test_fallback_variants_leave_out_what_the_kernel_cannot_serve():
    # 16384 groups: 2 splits fit the 65535 grid rows, 4 and 8 do not.
    g = geometry(8, c=16384, k=16384, groups=16384)
    planned = config.ConvChoice("mfma", ConvTile(32, 32, 2, 2, 4), 1)
    variants = config.equivalent_choices(planned, g, 80)
    assert [(v.tile, v.split_k) for v in variants] == [(planned.tile, 2)]  # the heuristic's is 1
