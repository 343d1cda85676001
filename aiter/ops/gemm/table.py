"""The tuned tables of the GEMM entries and the caller contract they share with the AOT replay.

Light on purpose (no torch, no FlyDSL): the AOT driver reads these specs to decide, in a fraction
of a second, whether a cache is already complete. The entries derive their dtypes from here.
"""

from __future__ import annotations

from aiter.tuning import BucketAxis, Column, TableSpec

LIBTYPE_FLYDSL = "flydsl"
LIBTYPE_TORCH = "torch"
LIBTYPES = (LIBTYPE_FLYDSL, LIBTYPE_TORCH)

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
MMA_KINDS = ("mfma", "wmma")
_TILE_NUMBER = "[1-9][0-9]*"  # written as the generator writes it: no sign, no leading 0


def kernel_name_pattern(prefix: str) -> str:
    """The grammar of a family's kernel names (whether the arch has that tile is the entry's
    business: it depends on the arch)."""
    n = _TILE_NUMBER
    return rf"{prefix}_(?P<mma>{'|'.join(MMA_KINDS)})_(?P<m>{n})x(?P<n>{n})x(?P<k>{n})"


def _kernel_name(prefix: str) -> Column:
    return Column(
        "kernelName",
        "optional_str",
        pattern=kernel_name_pattern(prefix),
        pattern_help=f"{prefix}_<{'|'.join(MMA_KINDS)}>_<tile_m>x<tile_n>x<tile_k> or an empty cell",
    )


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


A16W16 = TableSpec(
    name="bf16_tuned_gemm.csv",
    short_name="gemm_a16w16",
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
)

A8W8_BPRESHUFFLE = TableSpec(
    name="a8w8_bpreshuffle_tuned_gemm.csv",
    short_name="gemm_a8w8_bpreshuffle",
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
    open_choices={"out_dtype": A8W8_OUT_DTYPES},
)

A8W8_BLOCKSCALE = TableSpec(
    name="a8w8_blockscale_tuned_gemm.csv",
    short_name="gemm_a8w8_blockscale",
    aot_module="gemm",
    env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE",
    columns=(*_SHAPE, *_MNK, *_a8w8_choice(BLOCKSCALE_KERNELS)),
    key=("gfx", "cu_num", "M", "N", "K"),
    axis=M_AXIS,
    open_choices={"out_dtype": A8W8_OUT_DTYPES},
)
