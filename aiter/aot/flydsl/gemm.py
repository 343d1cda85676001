"""AOT replay of every GEMM table: a row and caller variant become a call of its public entry.

The tables, their variants and the scale shapes come from the entries' own declarations; run
`python -m aiter.aot.flydsl.gemm [--list | --check]` (or `python -m aiter.aot.flydsl` for all).

Why bisection along M finds every kernel a row serves: the lookup changes only at tabled M
values and bucket edges, which naming probes on both sides; inside a bucket the kernels are a
function of the plan's tile and split-K, and along M the tile never goes back (tile_m grows with
M, then tile_n with the blocks) while within one tile split-K only shrinks as the blocks grow.
So each choice holds on one run of M, and two probes asking for the same kernels bound a run of
them (tests/replay/test_bisection_exact.py checks this densely).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from aiter.aot.flydsl.jobs.axes import dims_along
from aiter.aot.flydsl.jobs.family import Call, CapturedOp, Family
from aiter.aot.flydsl.jobs.fixed_inputs import FixedInputs
from aiter.ops.gemm.table import (
    A4W4,
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A16W16,
    MXFP8,
)
from aiter.tuning import Row, TableSpec


def _dtype(name: str):
    import torch

    return getattr(torch, name.removeprefix("torch."))  # the table's spec vetted the name


def _empty(shape: tuple[int, ...], dtype):
    import torch

    return torch.empty(shape, dtype=dtype, device="cuda")


def _a16w16(row: Row, variant: Mapping[str, str]) -> Call:
    from aiter.ops.gemm.entry import gemm_a16w16

    n, k, with_bias = row.int("N"), row.int("K"), row.flag("bias")
    fixed = FixedInputs()  # the layer's weight and bias, kept across calls

    def call(M: int) -> None:
        dtype, out_dtype = _dtype(row["dtype"]), _dtype(row["outdtype"])
        bias = fixed.empty("bias", (n,), out_dtype) if with_bias else None
        weight = fixed.empty("B", (n, k), dtype)
        gemm_a16w16(_empty((M, k), dtype), weight, bias, out_dtype=out_dtype)

    return call


def _a8w8_bpreshuffle(row: Row, variant: Mapping[str, str]) -> Call:
    from aiter.ops.gemm import entry as gemm_a8w8

    n, k = row.int("N"), row.int("K")
    fixed = FixedInputs()  # the layer's weight and its scales, kept across calls

    def call(M: int) -> None:
        q_dtype = _dtype(row["q_dtype_w"])
        x_shape, w_shape = gemm_a8w8.bpreshuffle_scale_shapes(M, n)
        gemm_a8w8.gemm_a8w8_bpreshuffle(
            _empty((M, k), q_dtype),
            fixed.empty("WQ", (n, k), q_dtype),  # preshuffled: the plain weight's shape
            _empty(x_shape, gemm_a8w8.SCALE_DTYPE),
            fixed.empty("w_scale", w_shape, gemm_a8w8.SCALE_DTYPE),
            out_dtype=_dtype(variant["out_dtype"]),
        )

    return call


def _a8w8_blockscale(row: Row, variant: Mapping[str, str]) -> Call:
    from aiter import device
    from aiter.ops.gemm import entry as gemm_a8w8

    n, k = row.int("N"), row.int("K")
    fixed = FixedInputs()  # the layer's weight and its scales, kept across calls

    def call(M: int) -> None:
        q_dtype = device.fp8_dtype()  # the table leaves it to the arch, as a caller would
        x_shape, w_shape = gemm_a8w8.blockscale_scale_shapes(M, n, k)
        gemm_a8w8.gemm_a8w8_blockscale(
            _empty((M, k), q_dtype),
            fixed.empty("WQ", (n, k), q_dtype),
            _empty(x_shape, gemm_a8w8.SCALE_DTYPE),
            fixed.empty("w_scale", w_shape, gemm_a8w8.SCALE_DTYPE),
            out_dtype=_dtype(variant["out_dtype"]),
        )

    return call


def _a8w8_blockscale_bpreshuffle(row: Row, variant: Mapping[str, str]) -> Call:
    from aiter import device
    from aiter.ops.gemm import entry as gemm_a8w8

    n, k = row.int("N"), row.int("K")
    fixed = FixedInputs()  # the layer's weight and its scales, kept across calls

    def call(M: int) -> None:
        q_dtype = device.fp8_dtype()
        x_shape, w_shape = gemm_a8w8.blockscale_scale_shapes(M, n, k)
        gemm_a8w8.gemm_a8w8_blockscale_bpreshuffle(
            _empty((M, k), q_dtype),
            fixed.empty("WQ", (n, k), q_dtype),  # preshuffled: the plain weight's shape
            _empty(x_shape, gemm_a8w8.SCALE_DTYPE),  # aiter's contiguous view of [K/128, M]
            fixed.empty("w_scale", w_shape, gemm_a8w8.SCALE_DTYPE),
            out_dtype=_dtype(variant["out_dtype"]),
        )

    return call


def _mx(fmt: str):
    def caller(row: Row, variant: Mapping[str, str]) -> Call:
        import torch

        from aiter.ops.gemm import mx_entry

        n, k = row.int("N"), row.int("K")
        element = torch.float4_e2m1fn_x2 if fmt == "fp4" else torch.float8_e4m3fn
        row_bytes = k // 2 if fmt == "fp4" else k
        entry = mx_entry.gemm_a4w4 if fmt == "fp4" else mx_entry.gemm_mxfp8
        scale = torch.float8_e8m0fnu
        fixed = FixedInputs()  # the layer's weight, its scales and bias, kept across calls

        def call(M: int) -> None:
            out_dtype = _dtype(variant["out_dtype"])
            bias = fixed.empty("bias", (n,), out_dtype) if variant["bias"] == "true" else None
            entry(
                _empty((M, row_bytes), element),
                fixed.empty("B", (n, row_bytes), element),  # preshuffled: the plain shape
                _empty(mx_entry.mx_scale_shape(M, k), scale),
                fixed.empty("B_scale", mx_entry.mx_scale_shape(n, k), scale),
                bias,
                out_dtype=out_dtype,
            )

        return call

    return caller


_CALLERS = {
    A16W16: _a16w16,
    A8W8_BPRESHUFFLE: _a8w8_bpreshuffle,
    A8W8_BLOCKSCALE: _a8w8_blockscale,
    A8W8_BLOCKSCALE_BPRESHUFFLE: _a8w8_blockscale_bpreshuffle,
    A4W4: _mx("fp4"),
    MXFP8: _mx("fp8"),
}


def caller(spec: TableSpec, row: Row, variant: Mapping[str, str]) -> Call:
    return _CALLERS[spec](row, variant)


_ENTRY = "aiter.ops.gemm.entry"
# The token count M is the activation's rows, and the per-token scales' rows with it.
CAPTURED = {
    "gemm_a16w16": CapturedOp(f"{_ENTRY}:gemm_a16w16", dims_along("M", {"A": 0})),
    "gemm_a8w8_bpreshuffle": CapturedOp(
        f"{_ENTRY}:gemm_a8w8_bpreshuffle", dims_along("M", {"XQ": 0, "x_scale": 0})
    ),
    "gemm_a8w8_blockscale": CapturedOp(
        f"{_ENTRY}:gemm_a8w8_blockscale", dims_along("M", {"XQ": 0, "x_scale": 0})
    ),
    "gemm_a4w4": CapturedOp(
        "aiter.ops.gemm.mx_entry:gemm_a4w4", dims_along("M", {"A": 0, "A_scale": 0})
    ),
    "gemm_mxfp8": CapturedOp(
        "aiter.ops.gemm.mx_entry:gemm_mxfp8", dims_along("M", {"A": 0, "A_scale": 0})
    ),
    "gemm_a8w8_blockscale_bpreshuffle": CapturedOp(
        f"{_ENTRY}:gemm_a8w8_blockscale_bpreshuffle", dims_along("M", {"XQ": 0, "x_scale": 0})
    ),
}
FAMILY = Family(name="gemm", tables=tuple(_CALLERS), caller=caller, captured=CAPTURED)


def run(argv: Sequence[str] | None = None) -> int:
    from aiter.aot.flydsl.driver import main

    return main(["aiter.aot.flydsl.gemm"], argv)


if __name__ == "__main__":
    sys.exit(run())
