"""A malformed row of any family's table is a TableError naming file, line and column: refused
at load (and by the builder, exit 2) when a cell breaks its column, or when a call reaches a row
naming what the arch cannot serve. Each case is a family, a bad cell and what the error says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import aiter
from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.dry_run import dry_run
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from aiter.ops.conv3d.table import CONV3D
from aiter.ops.fmha_fp8.table import FMHA_FP8
from aiter.ops.gemm.table import A8W8_BLOCKSCALE, A8W8_BPRESHUFFLE, A16W16
from aiter.ops.moe.table import FMOE
from aiter.tuning import TableError, TableSpec
from tests.aot_cli import lines_starting, run_aot

BF16, FNUZ, I32 = torch.bfloat16, torch.float8_e4m3fnuz, torch.int32
A16, BP, BS = "flydsl_a16w16", "flydsl_a8w8_bpreshuffle", "flydsl_a8w8_blockscale"
BS_TILES = ", ".join(f"{m}x{n}x128" for m in (16, 32, 64, 128, 256) for n in (64, 128))


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _served(cu_num: int, call: Callable[[], object]) -> dispatch.DispatchRecord:
    """The one dispatch record of `call()` in a gfx942 naming dry run (nothing compiles)."""
    with dry_run("gfx942", cu_num, bridge.MODE_NAME), dispatch.observe() as records:
        call()
    (record,) = records
    return record


@dataclass(frozen=True)
class Family:
    """A table spec, the cells of a valid row (in header order), and, where an entry reads the
    table, `call(value)`: the dispatch record of a call at that value of the table's axis."""

    spec: TableSpec
    cells: str
    call: Callable[[int], dispatch.DispatchRecord] | None = None
    good: int = 4  # the good row's axis value (line 2)
    bad: tuple[int, ...] = (8, 5)  # the bad row's axis value (line 3), then one it serves

    def table(self, bad: dict[str, str]) -> str:
        """A table of the good row at `good` (line 2) and, at `bad[0]`, the row with `bad`."""
        header, axis = self.spec.header, self.spec.axis.column
        assert set(bad) <= set(header), f"{self.spec.name} has no column {set(bad)}"
        row = dict(zip(header, self.cells.split(","), strict=True))
        rows = [{**row, axis: str(self.good)}, {**row, axis: str(self.bad[0]), **bad}]
        return "".join(",".join(cells) + "\n" for cells in [header, *(r.values() for r in rows)])


FAMILIES = {
    "a16w16": Family(A16W16, f"gfx942,304,8,320,64,0,torch.bfloat16,torch.bfloat16,flydsl,0,,{A16}_mfma_16x64x64",
        lambda m: _served(304, lambda: aiter.gemm_a16w16(_t(m, 64, dtype=BF16), _t(320, 64, dtype=BF16)))),
    "bpreshuffle": Family(A8W8_BPRESHUFFLE, f"gfx942,304,8,320,640,{FNUZ},flydsl,0,0,,{BP}_mfma_16x64x64",
        lambda m: _served(304, lambda: aiter.gemm_a8w8_bpreshuffle(
            _t(m, 640, dtype=FNUZ), _t(320, 640, dtype=FNUZ), _t(m, 1), _t(1, 320), BF16))),
    "blockscale": Family(A8W8_BLOCKSCALE, f"gfx942,304,8,256,256,flydsl,0,0,,{BS}_mfma_16x64x128",
        lambda m: _served(304, lambda: aiter.gemm_a8w8_blockscale(
            _t(m, 256, dtype=FNUZ), _t(256, 256, dtype=FNUZ), _t(m, 2), _t(2, 2), BF16))),
    # N C D H W K kT kH kW, strides, pads, dilations, groups, bias, tile, splitK, us, name, libtype;
    # 7 frames borrow the 8-frame row (nearer by ratio than the 4-frame one).
    "conv3d": Family(CONV3D, "gfx942,80,1,32,8,8,8,32,3,3,3,1,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,,,",
        lambda d: _served(80, lambda: aiter.conv3d(
            _t(1, 32, d, 8, 8, dtype=BF16), _t(32, 32, 3, 3, 3, dtype=BF16), _t(32, dtype=BF16), padding=1)),
        bad=(8, 7)),
    # 50 tokens pad to the 64-token row.
    "moe": Family(FMOE, "gfx942,304,8,2048,256,8,2,ActivationType.Silu,torch.bfloat16,torch.bfloat16,"
        "torch.bfloat16,QuantType.No,1,0,0,0,,,,,,,,0,,,",
        lambda n: _served(304, lambda: aiter.fused_moe(_t(n, 2048, dtype=BF16), _t(8, 512, 2048, dtype=BF16),
            _t(8, 2048, 256, dtype=BF16), _t(n, 2), _t(n, 2, dtype=I32))),
        good=32, bad=(64, 50)),
    "fmha_fp8": Family(FMHA_FP8, "gfx942,304,8,1,128,128,dense,1,8,8,m"),  # no entry reads it
    # 8 varlen sequences; 5 tokens fall in the 8-token row's bucket.
    "chunk_gdn_h": Family(CHUNK_GDN_H, "gfx942,304,torch.bfloat16,128,128,64,32,16,1,1,0,0,1,1,8,8,64,",
        lambda t: _served(304, lambda: aiter.chunk_gated_delta_rule_fwd_h(
            _t(1, t, 16, 128, dtype=BF16), _t(1, t, 32, 128, dtype=BF16), _t(1, t, 32, 128, dtype=BF16),
            g=_t(1, t, 32), output_final_state=True, cu_seqlens=SEQLENS[t]))),
}  # fmt: skip


# Host tensors of 8 sequences over t tokens, made outside any dry run: the entry reads them.
SEQLENS = {t: torch.tensor([t * i // 8 for i in range(9)], dtype=I32) for t in (4, 5, 8)}


def _case(family: str, column: str, value: str, message: str, **more: str):
    """The bad row (line 3) is the family's good row with `column` = `value` (and `more`);
    `message` is what the error says after "FILE:3: column 'COLUMN': " (ending in "...": its
    start)."""
    cells = {column: value, **more}
    return pytest.param(family, column, cells, message, id=f"{family}-{column}-{value or 'empty'}")


def _grammar(prefix: str, found: str, tail: str = "") -> str:
    """What a name off the grammar `prefix`_<mma>_<m>x<n>x<k>`tail` is told."""
    expected = f"{prefix}_<mfma|wmma>_<tile_m>x<tile_n>x<tile_k>{tail} or an empty cell"
    return f"expected {expected}, found {found!r}"


def _gemm_grammar(prefix: str, found: str) -> str:
    """What a FlyDSL GEMM row naming neither a kernel of its family nor one of aiter's is told."""
    expected = (
        f"{prefix}_<mfma|wmma>_<tile_m>x<tile_n>x<tile_k>, one of aiter's own flydsl_... kernel "
        "names, or an empty cell"
    )
    return f"expected {expected}, found {found!r}"


LIBTYPES = "flydsl, torch, asm, ck, cktile, triton, opus, hipblaslt, rocblas, skinny"


def _no_tile(name: str, supported: str = "...") -> str:
    return f"{name!r}: tile not supported by the mfma kernel; supported: {supported}"


def _other_mma(name: str, tail: str = " kernels") -> str:
    return f"{name!r} names a wmma kernel, but this arch uses mfma{tail}"


CONV_GRAMMAR = "flydsl_conv3d_<mfma|wmma>_<tile_m>x<tile_n>_w<wave_m>x<wave_n>_g<wgm>"
CONV_TILE = dict(tile_m="64", tile_n="32", wave_m="2", wave_n="2", wgm="1")
MOE1, MOE2 = "flydsl_moe1_mfma_32x64x64", "flydsl_moe2_mfma_32x64x64_atomc"

# Cells that break their column: the table is refused as it loads.
AT_LOAD = [
    _case("a16w16", "kernelName", f"{A16}_mfma_64x64", _gemm_grammar(A16, f"{A16}_mfma_64x64")),
    _case("a16w16", "kernelName", f"{A16}_xmma_16x64x64", _gemm_grammar(A16, f"{A16}_xmma_16x64x64")),
    _case("a16w16", "kernelName", "gemm_16x64x64", _gemm_grammar(A16, "gemm_16x64x64")),
    _case("a16w16", "kernelName", f"{A16}_mfma_016x64x64", _gemm_grammar(A16, f"{A16}_mfma_016x64x64")),
    _case("a16w16", "kernelName", f"{BS}_mfma_16x64x64", _gemm_grammar(A16, f"{BS}_mfma_16x64x64")),
    _case("a16w16", "M", "0", "expected an integer from 1 to 2147483647, found '0'"),
    _case("a16w16", "N", "-320", "expected an integer from 1 to 2147483647, found '-320'"),
    _case("a16w16", "K", "0", "expected an integer from 1 to 2147483647, found '0'"),
    _case("a16w16", "cu_num", "0", "expected an integer from 1 to 2147483647, found '0'"),
    _case("a16w16", "M", "2\x0056", "expected an integer, found '2\\x0056'"),
    _case("a16w16", "splitK", "-1", "expected an integer from 0 to 2147483647, found '-1'"),
    _case("a16w16", "bias", "1_000", "expected 0/1 or True/False, found '1_000'"),
    _case("a16w16", "us", "fast", "expected a number or an empty cell, found 'fast'"),
    _case("a16w16", "dtype", "torch.int8", "expected one of torch.bfloat16, torch.float16, found 'torch.int8'"),
    _case("a16w16", "libtype", "cublas", f"expected one of {LIBTYPES}, found 'cublas'"),
    _case("bpreshuffle", "kernelName", f"{BS}_mfma_16x64x128", _gemm_grammar(BP, f"{BS}_mfma_16x64x128")),
    _case("bpreshuffle", "libtype", "cublas", f"expected one of {LIBTYPES}, found 'cublas'"),
    _case("blockscale", "kernelId", "-1", "expected an integer from 0 to 2147483647, found '-1'"),
    _case("conv3d", "kernelName", "flydsl_conv3d_mfma_32x32", f"expected {CONV_GRAMMAR} or an empty cell, found 'flydsl_conv3d_mfma_32x32'"),
    _case("moe", "kernelName2", MOE2, _grammar("flydsl_moe2", MOE2, "_<atomic|reduce>")),
    _case("fmha_fp8", "layout", "sparse", "expected one of dense, varlen, found 'sparse'"),
    _case("fmha_fp8", "head_dim", "32", "expected an integer from 64 to 256, found '32'"),
    _case("chunk_gdn_h", "BV", "48", "expected one of 16, 32, 64, found '48'"),
    _case("chunk_gdn_h", "BV", "64", "expected a V tile width that divides V (96), found '64'", V="96"),
    _case("chunk_gdn_h", "H", "24", "expected a multiple of Hg (16): value heads share key heads in groups, found '24'"),
    _case("moe", "inter_dim", "100", "expected a multiple of 8, found '100'"),
    _case("moe", "model_dim", "2080", "expected a multiple of 64, found '2080'"),
    # A constraint between cells: fp8 weights are covered in 16-wide K steps.
    _case("moe", "inter_dim", "360", "expected a multiple of 16 for fp8 weights, found '360'",
          q_dtype_w="torch.float8_e4m3fnuz", q_dtype_a="torch.float8_e4m3fnuz",
          q_type="QuantType.per_Token"),
]  # fmt: skip

# Integer cells past 32 bits: no kernel takes such a size, so no row may name one. The builder
# refuses them by the same check: one of them runs it.
PAST_32_BITS = [
    _case("a16w16", "M", "1000000000000000000000000000000000000000", "expected an integer from 1 to 2147483647, found '1000000000000000000000000000000000000000'"),
    _case("bpreshuffle", "N", "2147483648", "expected an integer from 1 to 2147483647, found '2147483648'"),
    _case("blockscale", "K", "1e30", "expected an integer from 1 to 2147483647, found '1e30'"),
    _case("conv3d", "D", "1000000000000000000000000000000000000000", "expected an integer from 1 to 2147483647, found '1000000000000000000000000000000000000000'"),
    _case("moe", "inter_dim", "1000000000000000000000000000000000000000", "expected an integer from 1 to 2147483647, found '1000000000000000000000000000000000000000'"),
    _case("fmha_fp8", "max_seqlen", "1000000000000000000000000000000000000000", "expected an integer from 1 to 2147483647, found '1000000000000000000000000000000000000000'"),
]  # fmt: skip

# Rows that load but name what the arch (gfx942) cannot serve: refused when a call reaches them.
AT_CALL = [
    _case("a16w16", "kernelName", f"{A16}_mfma_48x64x64", _no_tile(f"{A16}_mfma_48x64x64")),
    _case("a16w16", "kernelName", f"{A16}_wmma_16x64x64", _other_mma(f"{A16}_wmma_16x64x64")),
    _case("a16w16", "kernelName", "", f"'' is not a {A16} kernel name: ..."),
    _case("bpreshuffle", "kernelName", f"{BP}_mfma_16x64x32", _no_tile(f"{BP}_mfma_16x64x32")),
    _case("bpreshuffle", "kernelName", f"{BP}_wmma_16x64x128", _other_mma(f"{BP}_wmma_16x64x128")),
    _case("bpreshuffle", "kernelName", "", f"'' is not a {BP} kernel name: ..."),
    _case("blockscale", "kernelName", f"{BS}_mfma_16x64x64", _no_tile(f"{BS}_mfma_16x64x64", BS_TILES)),
    _case("conv3d", "kernelName", "flydsl_conv3d_wmma_32x32_w2x2_g1", "'flydsl_conv3d_wmma_32x32_w2x2_g1' names a wmma kernel; this arch uses mfma"),
    _case("conv3d", "kernelName", "flydsl_conv3d_mfma_32x32_w2x2_g1", "'flydsl_conv3d_mfma_32x32_w2x2_g1' disagrees with the row's tile columns (64, 32, 2, 2, 1)", **CONV_TILE),
    _case("conv3d", "tile_m", "64", "tile columns must be all set or all 0, got (64, 0, 0, 0, 0)"),
    _case("moe", "kernelName1", MOE1, "tile_m 32 differs from the row's block_m 16", block_m="16"),
    _case("moe", "kernelName1", "flydsl_moe1_wmma_32x64x64", _other_mma("flydsl_moe1_wmma_32x64x64", "")),
    _case("moe", "kernelName2", "flydsl_moe2_mfma_128x64x64_atomic", _no_tile("flydsl_moe2_mfma_128x64x64_atomic")),
]  # fmt: skip


def _says(text: str, start: str, message: str) -> None:
    """`text` is `start` + `message` (or starts so, when `message` ends in "...")."""
    if message.endswith("..."):
        assert text.startswith(start + message.removesuffix("...")), text
    else:
        assert text == start + message


def _refused(call: Callable[[], object], path: Path, column: str, message: str) -> None:
    with pytest.raises(TableError) as info:
        call()
    _says(str(info.value), f"{path}:3: column {column!r}: ", message)
    assert (info.value.path, info.value.line, info.value.column) == (str(path), 3, column)


def _extend(tmp_path: Path, monkeypatch, family: Family, bad: dict[str, str]) -> Path:
    """A file with the good and the bad row, merged into the family's table for this test."""
    path = tmp_path / f"bad_{family.spec.name}"
    path.write_text(family.table(bad))
    monkeypatch.setenv(family.spec.env_var, str(path))
    return path


@pytest.mark.parametrize("name, column, cells, message", AT_LOAD + PAST_32_BITS)
def test_a_bad_cell_fails_the_whole_table_at_load(
    tmp_path, monkeypatch, name, column, cells, message
):
    family = FAMILIES[name]
    path = _extend(tmp_path, monkeypatch, family, cells)
    _refused(family.spec.load, path, column, message)
    if family.call is not None:  # the entry refuses the table before any row serves
        _refused(lambda: family.call(family.good), path, column, message)


def _first_of_each_family(params):
    """The params, the first of each family in the inner loop and the rest marked slow: each
    case starts a builder process."""
    seen = set()
    out = []
    for param in params:
        family = param.values[0]
        marks = pytest.mark.slow if family in seen else ()
        seen.add(family)
        out.append(pytest.param(*param.values, id=param.id, marks=marks))
    return out


@pytest.mark.parametrize(
    "name, column, cells, message", _first_of_each_family(AT_LOAD + PAST_32_BITS[:1])
)
def test_the_builder_refuses_a_bad_cell_with_one_line_and_exit_2(
    tmp_path, name, column, cells, message
):
    family, path = FAMILIES[name], tmp_path / "mine.csv"
    path.write_text(family.table(cells))
    args = ("--module", family.spec.aot_module, "--list", "--cache-dir", str(tmp_path / "cache"))
    proc = run_aot("aiter.aot.flydsl", *args, "--csv", f"{family.spec.short_name}={path}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    (line,) = lines_starting(proc.stderr, "error:")
    _says(line, f"error: {path}:3: column {column!r}: ", message)


@pytest.mark.parametrize("name, column, cells, message", AT_CALL)
def test_a_row_the_arch_cannot_serve_is_named_when_a_call_reaches_it(
    tmp_path, monkeypatch, name, column, cells, message
):
    family = FAMILIES[name]
    path = _extend(tmp_path, monkeypatch, family, cells)
    record = family.call(family.good)  # the good row on line 2 still serves its value
    assert (record.source, record.row) == ("table", f"{path}:2")
    if family.spec.short_name.startswith("gemm"):  # the good row names its kernel
        assert record.kernel == family.cells.rsplit(",", 1)[1]
    for value in family.bad:  # the bad row's own value, and one it serves
        _refused(lambda v=value: family.call(v), path, column, message)
