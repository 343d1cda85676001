"""The tuned table of fused MoE (`tuned_fmoe.csv`, aiter's columns) and its kernel-name grammar,
shared by the runtime lookup, the table generator and the AOT replay. Light: no torch, no FlyDSL.
"""

from __future__ import annotations

import re

from aiter.arch import arch_of_legacy_row
from aiter.ops.moe.kernels.quant_index import MAX_K as QUANT_MAX_K
from aiter.ops.moe.kernels.sorting_index import MAX_TOPK
from aiter.ops.moe.kernels.stages_index import (
    INTER_DIM_MULTIPLE,
    MODEL_DIM_MULTIPLE,
    inter_dim_multiple,
)
from aiter.tuning import BucketAxis, Column, Row, TableSpec
from aiter.tuning.foreign import kernel_backend
from aiter.tuning.kinds import PARSERS

# How aiter writes the enum cells.
ACT_SILU = "ActivationType.Silu"
ACT_SWIGLU = "ActivationType.Swiglu"
ACTIVATION_CELLS = {"silu": ACT_SILU, "swiglu": ACT_SWIGLU}
QUANT_NONE = "QuantType.No"
QUANT_PER_TOKEN = "QuantType.per_Token"
QUANT_CELLS = {None: QUANT_NONE, "per_token": QUANT_PER_TOKEN}
# Every cell aiter's MoE tuners write; a row of one this library has no kernel for is set aside
# with the reason (`_unserved_*`), never an error.
AITER_ACTIVATIONS = (ACT_SILU, ACT_SWIGLU, "ActivationType.Gelu", "ActivationType.Situv2")
AITER_QUANT_TYPES = (
    QUANT_NONE,
    QUANT_PER_TOKEN,
    "QuantType.per_Tensor",
    "QuantType.per_1x128",
    "QuantType.per_1x32",
)
AITER_QUANT_DTYPES = ("float4_e2m1fn_x2", "int8", "int4", "uint8")

# Dtypes as torch names; the entry turns them into torch dtypes.
ACTIVATION_DTYPES = ("bfloat16", "float16")
FP8_DTYPES = ("float8_e4m3fnuz", "float8_e4m3fn")  # which one follows the arch

BLOCK_MS = ("16", "32", "64")
KSPLITS = ("1", "2", "4")
PLANNER_CHOOSES = "0"  # block_m / ksplit 0: the C++ planner decides per call
# Rows the FlyDSL runtime must not serve: aiter tags rows it moved to another backend, and
# one-stage rows name kernels this library does not have.
FALLBACK_TAG = "flydsl_fallback"

STAGE1_KERNELS = "flydsl_moe1"
STAGE2_KERNELS = "flydsl_moe2"
MMA_KINDS = ("mfma", "wmma")
STAGE2_MODES = ("atomic", "reduce")
_NUMBER = "[1-9][0-9]*"  # as the generator writes it: no sign, no leading 0
_TILE = rf"(?P<mma>{'|'.join(MMA_KINDS)})_(?P<m>{_NUMBER})x(?P<n>{_NUMBER})x(?P<k>{_NUMBER})"
STAGE1_PATTERN = rf"{STAGE1_KERNELS}_{_TILE}"
STAGE2_PATTERN = rf"{STAGE2_KERNELS}_{_TILE}_(?P<mode>{'|'.join(STAGE2_MODES)})"
STAGE1_HELP = f"{STAGE1_KERNELS}_<mfma|wmma>_<tile_m>x<tile_n>x<tile_k> or an empty cell"
STAGE2_HELP = (
    f"{STAGE2_KERNELS}_<mfma|wmma>_<tile_m>x<tile_n>x<tile_k>_<atomic|reduce> or an empty cell"
)

# What a caller may choose that the table does not record; the AOT replay calls the entry with
# each combination. Expert bias exists only for swiglu (gpt-oss); the others apply to every row.
GATE_MODES = ("separated", "interleave")
CALLER_VARIANTS = {
    "gate_mode": GATE_MODES,
    "local_tokens": ("all", "given"),  # num_local_tokens omitted or passed
    "experts": ("all", "masked"),  # expert_mask omitted or passed (expert parallelism)
}
SWIGLU_VARIANTS = {"bias": ("none", "both")}

TOKENS_AXIS = BucketAxis(name="tokens", column="token")


# The finest inter_dim any dtype serves (bf16/fp16); fp8 weights need more (`_fp8_inter_dim`).
INTER_DIM_CELL_MULTIPLE = min(INTER_DIM_MULTIPLE.values())


_OUR_NAMES = {
    "kernelName1": re.compile(STAGE1_PATTERN, re.ASCII),
    "kernelName2": re.compile(STAGE2_PATTERN, re.ASCII),
}


# This library's stage names start so; aiter's own FlyDSL stages (flydsl_moe1_afp8_...) do not.
_OUR_STARTS = tuple(f"{s}_{mma}_" for s in (STAGE1_KERNELS, STAGE2_KERNELS) for mma in MMA_KINDS)


def names_our_kernels(row: Row) -> bool:
    """Whether the row's stage kernels are this library's (or left to its planner: empty), not
    aiter's CK, asm or FlyDSL stage kernels."""
    return all(not row.cells[c] or row.cells[c].startswith(_OUR_STARTS) for c in _OUR_NAMES)


def _our_names(row: Row) -> tuple[str, str] | None:
    """A name of this library's stage kernels must follow their grammar."""
    for (column, pattern), help_text in zip(
        _OUR_NAMES.items(), (STAGE1_HELP, STAGE2_HELP), strict=True
    ):
        name = row.cells[column]
        if name.startswith(_OUR_STARTS) and not pattern.fullmatch(name):
            return column, help_text
    return None


def _limits(row: Row) -> tuple[str, str] | None:
    """What this library's kernels need of a row's dimensions: (column, expected) or None."""
    for column, multiple in (
        ("model_dim", MODEL_DIM_MULTIPLE),
        ("inter_dim", INTER_DIM_CELL_MULTIPLE),
    ):
        if PARSERS["int"](row.cells[column]) % multiple:
            return column, f"a multiple of {multiple}"
    # fp8 weights are covered in wider K steps: inter_dim needs their multiple.
    fp8_multiple = inter_dim_multiple(1)
    if "float8" in row.cells["q_dtype_w"] and PARSERS["int"](row.cells["inter_dim"]) % fp8_multiple:
        return "inter_dim", f"a multiple of {fp8_multiple} for fp8 weights"
    # Per-token quantization holds a row of model_dim (inter_dim) in one block's registers.
    if row.cells["q_type"] == QUANT_PER_TOKEN:
        for column in ("model_dim", "inter_dim"):
            if PARSERS["int"](row.cells[column]) > QUANT_MAX_K:
                return column, f"at most {QUANT_MAX_K} for per-token quantization"
    return None


def _our_row(row: Row) -> tuple[str, str] | None:
    """A row naming this library's kernels must name what they can serve."""
    if not names_our_kernels(row) or _unserved_kind(row) is not None:
        return None
    for column, choices in (
        ("block_m", (PLANNER_CHOOSES, *BLOCK_MS)),
        ("ksplit", (PLANNER_CHOOSES, *KSPLITS)),
    ):
        if str(PARSERS["int"](row.cells[column])) not in choices:
            return column, "one of " + ", ".join(choices)
    return _limits(row)


def _unserved_kind(row: Row) -> str | None:
    """Why this library has no kernel for what the row computes, or None."""
    cells = row.cells
    if cells["_tag"] == FALLBACK_TAG:
        return f"aiter tagged it {FALLBACK_TAG}: its shape is served by another backend"
    if PARSERS["bool01"](cells["run_1stage"]):
        return "a one-stage kernel (run_1stage=1); this library's planner serves the shape"
    if cells["act_type"] not in ACTIVATION_CELLS.values():
        return f"{cells['act_type']}: this library's fused_moe has silu and swiglu"
    if cells["q_type"] not in QUANT_CELLS.values():
        return f"{cells['q_type']} experts: this library has bf16/fp16 and per-token fp8 experts"
    quantized = cells["q_type"] == QUANT_PER_TOKEN
    for column in ("q_dtype_a", "q_dtype_w"):
        if quantized != ("float8" in cells[column]):
            return (
                f"{column} {cells[column]} with {cells['q_type']}: this library has bf16/fp16 "
                "and per-token fp8 experts"
            )
    return None


def _unserved_foreign(row: Row) -> str | None:
    """A row of aiter's own stage kernels whose dimensions this library's kernels cannot take."""
    if names_our_kernels(row):
        return None
    broken = _limits(row)
    if broken is None:
        return None
    column, expected = broken
    return f"{column} {row.cells[column]}: this library's kernels need {expected}"


def backend_of(row: Row) -> str:
    """The backend a row's stage kernels belong to (aiter's CK or asm, FlyDSL)."""
    if PARSERS["bool01"](row.cells["run_1stage"]):
        return "asm"
    return next(
        (kernel_backend(row.cells[c]) for c in ("kernelName1", "kernelName2") if row.cells[c]),
        "flydsl",
    )


def _cells(names: tuple[str, ...]) -> tuple[str, ...]:
    """How a dtype is written in a table cell: str(torch dtype)."""
    return tuple(f"torch.{name}" for name in names)


_ANY_DTYPE = _cells(ACTIVATION_DTYPES + FP8_DTYPES + AITER_QUANT_DTYPES)

FMOE = TableSpec(
    name="tuned_fmoe.csv",
    short_name="fmoe",
    aiter_name="tuned_fmoe",
    aot_module="moe",
    env_var="AITER_CONFIG_FMOE",
    columns=(
        # aiter's older tables key rows by cu_num alone: the arch follows by aiter's rule.
        Column("gfx", "str", absent=arch_of_legacy_row),
        Column("cu_num", "int", minimum=1),
        Column("token", "int", minimum=1),
        Column("model_dim", "int", minimum=1),
        Column("inter_dim", "int", minimum=1),
        Column("expert", "int", minimum=1),
        Column("topk", "int", minimum=1, maximum=MAX_TOPK),
        Column("act_type", "str", choices=AITER_ACTIVATIONS),
        Column("dtype", "str", choices=_cells(ACTIVATION_DTYPES)),
        Column("q_dtype_a", "str", choices=_ANY_DTYPE),
        Column("q_dtype_w", "str", choices=_ANY_DTYPE),
        Column("q_type", "str", choices=AITER_QUANT_TYPES),
        Column("use_g1u1", "bool01"),
        Column("doweight_stage1", "bool01"),
        Column("block_m", "int", minimum=0),  # this library's tiles or aiter's CK/asm ones
        Column("ksplit", "int", minimum=0),
        Column("us1", "optional_float", minimum=0),
        Column("kernelName1", "optional_str"),  # this library's stage 1, or aiter's CK/asm one
        Column("err1", "optional_str"),
        Column("us2", "optional_float", minimum=0),
        Column("kernelName2", "optional_str"),
        Column("err2", "optional_str"),
        Column("us", "optional_float", minimum=0),
        Column("run_1stage", "bool01"),
        # What aiter's tuners measured, and its row tags: files written without them load too.
        Column("tflops", "optional_float", required=False),
        Column("bw", "optional_float", required=False),
        Column("_tag", "optional_str", required=False),
    ),
    key=(
        "gfx",
        "cu_num",
        "token",
        "model_dim",
        "inter_dim",
        "expert",
        "topk",
        "act_type",
        "dtype",
        "q_dtype_a",
        "q_dtype_w",
        "q_type",
        "use_g1u1",
        "doweight_stage1",
    ),
    axis=TOKENS_AXIS,
    open_choices=CALLER_VARIANTS,
    row_checks=(_our_names, _our_row),
    unserved=(_unserved_kind, _unserved_foreign),
    backend_of=backend_of,
)
