"""The tuned tables of the GEMM entries and the caller contract they share with the AOT replay.

Light on purpose (no torch, no FlyDSL): the AOT driver reads these specs to decide, in a fraction
of a second, whether a cache is already complete. The entries derive their dtypes from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aiter.arch import arch_of_legacy_row
from aiter.ops.shared.gemm_index_8bit import SCALE_BLOCK
from aiter.tuning import BucketAxis, Column, Row, TableSpec
from aiter.tuning.foreign import AITER_LIBTYPES, FLYDSL, TORCH

LIBTYPE_FLYDSL = FLYDSL
LIBTYPE_TORCH = TORCH
# Every backend aiter's tuners write: a row of another backend is served by this library's choice
# (plan.py says how), and its extra columns (solidx, scaleAB, tflops, ...) are kept and ignored.
LIBTYPES = AITER_LIBTYPES

# Dtypes as torch names; the entries turn them into torch dtypes.
A16W16_INPUT_DTYPES = ("bfloat16", "float16")
A16W16_OUT_DTYPES = ("bfloat16", "float16", "float32")
A8W8_QUANT_DTYPES = ("float8_e4m3fnuz", "float8_e4m3fn", "int8")  # fp8 flavour follows the arch
A8W8_OUT_DTYPES = ("bfloat16", "float16")  # what a caller may pass as out_dtype

M_AXIS = BucketAxis(name="M", column="M")

# Kernel-name prefixes: names are <prefix>_<mfma|wmma>_<tile_m>x<tile_n>x<tile_k>.
A16W16_KERNELS = "flydsl_a16w16"
BPRESHUFFLE_KERNELS = "flydsl_a8w8_bpreshuffle"
BLOCKSCALE_KERNELS = "flydsl_a8w8_blockscale"
BLOCKSCALE_BPRESHUFFLE_KERNELS = "flydsl_a8w8_blockscale_bpreshuffle"
A4W4_KERNELS = "flydsl_a4w4"
MXFP8_KERNELS = "flydsl_a8w8_mxfp8"
# The libtype aiter's MXFP8 tuner writes for its own FlyDSL kernels.
LIBTYPE_AITER_FLYDSL_MXFP8 = "flydsl_mxfp8"
MXFP8_Q_DTYPE = "mxfp8"
MMA_KINDS = ("mfma", "wmma")
_TILE_NUMBER = "[1-9][0-9]*"  # written as the generator writes it: no sign, no leading 0


def kernel_name_pattern(prefix: str) -> str:
    """The grammar of a family's kernel names (whether the arch has that tile is the entry's
    business: it depends on the arch)."""
    n = _TILE_NUMBER
    return rf"{prefix}_(?P<mma>{'|'.join(MMA_KINDS)})_(?P<m>{n})x(?P<n>{n})x(?P<k>{n})"


def _kernel_name(prefix: str) -> Column:
    """Any text: a row of another backend names that backend's kernel (`_kernel_names` checks
    the names of FlyDSL rows)."""
    return Column("kernelName", "optional_str")


# Names this library's GEMM kernels take; aiter's own FlyDSL names (flydsl_gemm4_..., flydsl_bpreshuflle_...)
# start otherwise.
OUR_PREFIXES = ("flydsl_a16w16_", "flydsl_a8w8_", "flydsl_a4w4_")


def _kernel_names(prefix: str):
    """A FlyDSL row names one of this library's kernels of its family, or one of aiter's own
    FlyDSL kernels (`flydsl_...`, mapped onto this library's where its tile carries over)."""
    ours = re.compile(kernel_name_pattern(prefix), re.ASCII)

    def check(row: Row) -> tuple[str, str] | None:
        name = row.cells["kernelName"]
        if row.cells["libtype"] != LIBTYPE_FLYDSL or not name or ours.fullmatch(name):
            return None
        if name.startswith("flydsl_") and not name.startswith(OUR_PREFIXES):
            return None
        return (
            "kernelName",
            f"{prefix}_<{'|'.join(MMA_KINDS)}>_<tile_m>x<tile_n>x<tile_k>, one of aiter's own "
            "flydsl_... kernel names, or an empty cell",
        )

    return check


def _blockscale_shape(row: Row) -> str | None:
    """The blockscale entry takes [N / 128, K / 128] weight scales: aiter's CK kernels also
    serve N or K off the 128 grid (scales rounded up), which no call here can pass."""
    for column in ("N", "K"):
        if row.int(column) % SCALE_BLOCK:
            return f"{column} {row[column]}: this library's blockscale GEMM needs N and K multiples of {SCALE_BLOCK}"
    return None


# aiter's gfx1250 FlyDSL kernels of this table take e8m0 (MX) scales.
AITER_MXFP8_KERNELS = "flydsl_mxfp8_"


def _mx_scales(row: Row) -> str | None:
    """A row of aiter's MX-scaled fp8 kernels computes with e8m0 scales, which the entry does
    not take (its scales are fp32)."""
    name = row.cells["kernelName"].strip()
    if row.cells["libtype"] == LIBTYPE_FLYDSL and name.startswith(AITER_MXFP8_KERNELS):
        return f"aiter's {AITER_MXFP8_KERNELS}... kernels take e8m0 scales; this library's are fp32"
    return None


def _backend(row: Row) -> str:
    return row.cells["libtype"]


def _cells(names: tuple[str, ...]) -> tuple[str, ...]:
    """How a dtype is written in a table cell: str(torch dtype)."""
    return tuple(f"torch.{name}" for name in names)


_SHAPE = (Column("gfx", "str"), Column("cu_num", "int", minimum=1))
_MNK = (
    Column("M", "int", minimum=1),
    Column("N", "int", minimum=1),
    Column("K", "int", minimum=1),
)
_SPLIT_K = Column("splitK", "int", minimum=0)  # 0: the runtime chooses per call


def _a8w8_choice(prefix: str) -> tuple[Column, ...]:
    return (
        Column("libtype", "str", choices=LIBTYPES),
        Column("kernelId", "int", minimum=0),
        _SPLIT_K,
        Column("us", "optional_float", minimum=0),
        _kernel_name(prefix),
    )


# What a caller of the MX GEMMs chooses that their tables do not record: the output dtype, and
# whether it passes a bias (a kernel of its own).
MX_CALLER_VARIANTS = {"out_dtype": A8W8_OUT_DTYPES, "bias": ("false", "true")}


def _a4w4_backend(cells: Mapping[str, str]) -> str:
    """The libtype of a row of aiter's a4w4 tables, which have no libtype column: aiter's a4w4
    tuner writes its CK kernels (a4w4_blockscale_...), its asm kernels, or None where it found
    no kernel; FlyDSL names start with flydsl."""
    name = cells.get("kernelName", "").strip()
    if name.startswith(FLYDSL):
        return LIBTYPE_FLYDSL
    return "asm" if name.startswith("_Z") or "asm" in name.split("_")[0] else "ck"


A4W4 = TableSpec(
    name="a4w4_blockscale_tuned_gemm.csv",
    short_name="gemm_a4w4",
    aiter_name="a4w4_blockscale_tuned_gemm",
    aot_module="gemm",
    env_var="AITER_CONFIG_GEMM_A4W4",
    columns=(
        Column("gfx", "str", absent=arch_of_legacy_row),
        Column("cu_num", "int", minimum=1),
        *_MNK,
        Column("libtype", "str", choices=LIBTYPES, absent=_a4w4_backend),
        Column("kernelId", "int", minimum=-1),  # -1: aiter's tuner found no kernel
        _SPLIT_K,
        Column("us", "optional_float"),  # aiter writes nan where it found no kernel
        _kernel_name(A4W4_KERNELS),
    ),
    key=("gfx", "cu_num", "M", "N", "K"),
    axis=M_AXIS,
    row_checks=(_kernel_names(A4W4_KERNELS),),
    backend_of=_backend,
    open_choices=MX_CALLER_VARIANTS,
)

A16W16 = TableSpec(
    name="bf16_tuned_gemm.csv",
    short_name="gemm_a16w16",
    aiter_name="bf16_tuned_gemm",
    aot_module="gemm",
    env_var="AITER_CONFIG_GEMM_BF16",
    columns=(
        *_SHAPE,
        *_MNK,
        Column("bias", "bool01"),
        Column("dtype", "str", choices=_cells(A16W16_INPUT_DTYPES)),
        Column("outdtype", "str", choices=_cells(A16W16_OUT_DTYPES)),
        Column("libtype", "str", choices=LIBTYPES),
        _SPLIT_K,
        Column("us", "optional_float", minimum=0),
        _kernel_name(A16W16_KERNELS),
    ),
    key=("gfx", "cu_num", "M", "N", "K", "bias", "dtype", "outdtype"),
    axis=M_AXIS,
    row_checks=(_kernel_names(A16W16_KERNELS),),
    backend_of=_backend,
)

A8W8_BPRESHUFFLE = TableSpec(
    name="a8w8_bpreshuffle_tuned_gemm.csv",
    short_name="gemm_a8w8_bpreshuffle",
    aiter_name="a8w8_bpreshuffle_tuned_gemm",
    aot_module="gemm",
    env_var="AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE",
    columns=(
        *_SHAPE,
        *_MNK,
        Column("q_dtype_w", "str", choices=_cells(A8W8_QUANT_DTYPES)),
        *_a8w8_choice(BPRESHUFFLE_KERNELS),
    ),
    key=("gfx", "cu_num", "M", "N", "K", "q_dtype_w"),
    axis=M_AXIS,
    row_checks=(_kernel_names(BPRESHUFFLE_KERNELS),),
    backend_of=_backend,
    open_choices={"out_dtype": A8W8_OUT_DTYPES},
)

A8W8_BLOCKSCALE = TableSpec(
    name="a8w8_blockscale_tuned_gemm.csv",
    short_name="gemm_a8w8_blockscale",
    aiter_name="a8w8_blockscale_tuned_gemm",
    aot_module="gemm",
    env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE",
    columns=(*_SHAPE, *_MNK, *_a8w8_choice(BLOCKSCALE_KERNELS)),
    key=("gfx", "cu_num", "M", "N", "K"),
    axis=M_AXIS,
    row_checks=(_kernel_names(BLOCKSCALE_KERNELS),),
    unserved=(_blockscale_shape,),
    backend_of=_backend,
    open_choices={"out_dtype": A8W8_OUT_DTYPES},
)

A8W8_BLOCKSCALE_BPRESHUFFLE = TableSpec(
    name="a8w8_blockscale_bpreshuffle_tuned_gemm.csv",
    short_name="gemm_a8w8_blockscale_bpreshuffle",
    aiter_name="a8w8_blockscale_bpreshuffle_tuned_gemm",
    aot_module="gemm",
    env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE",
    columns=(*_SHAPE, *_MNK, *_a8w8_choice(BLOCKSCALE_BPRESHUFFLE_KERNELS)),
    key=("gfx", "cu_num", "M", "N", "K"),
    axis=M_AXIS,
    row_checks=(_kernel_names(BLOCKSCALE_BPRESHUFFLE_KERNELS),),
    unserved=(_blockscale_shape, _mx_scales),
    backend_of=_backend,
    open_choices={"out_dtype": A8W8_OUT_DTYPES},
)

MXFP8 = TableSpec(
    name="a8w8_bpreshuffle_mxfp8_tuned_gemm.csv",
    short_name="gemm_mxfp8",
    aiter_name="a8w8_bpreshuffle_mxfp8_tuned_gemm",
    aot_module="gemm",
    env_var="AITER_CONFIG_GEMM_MXFP8",
    columns=(
        *_SHAPE,
        *_MNK,
        Column("q_dtype_w", "str", choices=(MXFP8_Q_DTYPE,)),
        Column("libtype", "str", choices=(*LIBTYPES, LIBTYPE_AITER_FLYDSL_MXFP8)),
        Column("kernelId", "int", minimum=0),
        _SPLIT_K,
        Column("us", "optional_float", minimum=0),
        _kernel_name(MXFP8_KERNELS),
    ),
    key=("gfx", "cu_num", "M", "N", "K", "q_dtype_w"),
    axis=M_AXIS,
    row_checks=(_kernel_names(MXFP8_KERNELS),),
    backend_of=_backend,
    open_choices=MX_CALLER_VARIANTS,
    # Its columns are bpreshuffle's: a bare --csv file is taken by its aiter name only.
    assign_by_columns=False,
)
