"""The tuned table of fused MoE (`tuned_fmoe.csv`, aiter's columns) and its kernel-name grammar,
shared by the runtime lookup, the table generator and the AOT replay. Light: no torch, no FlyDSL.
"""

from __future__ import annotations

from aiter.ops.moe.kernels.quant_index import MAX_K as QUANT_MAX_K
from aiter.ops.moe.kernels.sorting_index import MAX_TOPK
from aiter.ops.moe.kernels.stages_index import (
    INTER_DIM_MULTIPLE,
    MODEL_DIM_MULTIPLE,
    inter_dim_multiple,
)
from aiter.tuning import BucketAxis, Column, TableSpec
from aiter.tuning.kinds import PARSERS

# How aiter writes the enum cells.
ACT_SILU = "ActivationType.Silu"
ACT_SWIGLU = "ActivationType.Swiglu"
ACTIVATION_CELLS = {"silu": ACT_SILU, "swiglu": ACT_SWIGLU}
QUANT_NONE = "QuantType.No"
QUANT_PER_TOKEN = "QuantType.per_Token"
QUANT_CELLS = {None: QUANT_NONE, "per_token": QUANT_PER_TOKEN}

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


def _fp8_inter_dim(row):
    """fp8 weights are covered in wider K steps: inter_dim needs their multiple."""
    if "float8" not in row.cells["q_dtype_w"]:
        return None
    multiple = inter_dim_multiple(1)
    if PARSERS["int"](row.cells["inter_dim"]) % multiple:
        return "inter_dim", f"a multiple of {multiple} for fp8 weights"
    return None


def _quantized_row_length(row):
    """Per-token quantization holds a row of model_dim (inter_dim) in one block's registers."""
    if row.cells["q_type"] != QUANT_PER_TOKEN:
        return None
    for column in ("model_dim", "inter_dim"):
        if PARSERS["int"](row.cells[column]) > QUANT_MAX_K:
            return column, f"at most {QUANT_MAX_K} for per-token quantization"
    return None


def _cells(names: tuple[str, ...]) -> tuple[str, ...]:
    """How a dtype is written in a table cell: str(torch dtype)."""
    return tuple(f"torch.{name}" for name in names)


_ANY_DTYPE = _cells(ACTIVATION_DTYPES + FP8_DTYPES)

FMOE = TableSpec(
    name="tuned_fmoe.csv",
    short_name="fmoe",
    aot_module="moe",
    env_var="AITER_CONFIG_FMOE",
    columns=(
        Column("gfx", "str"),
        Column("cu_num", "int", minimum=1),
        Column("token", "int", minimum=1),
        Column("model_dim", "int", minimum=1, multiple=MODEL_DIM_MULTIPLE),
        Column("inter_dim", "int", minimum=1, multiple=INTER_DIM_CELL_MULTIPLE),
        Column("expert", "int", minimum=1),
        Column("topk", "int", minimum=1, maximum=MAX_TOPK),
        Column("act_type", "str", choices=tuple(ACTIVATION_CELLS.values())),
        Column("dtype", "str", choices=_cells(ACTIVATION_DTYPES)),
        Column("q_dtype_a", "str", choices=_ANY_DTYPE),
        Column("q_dtype_w", "str", choices=_ANY_DTYPE),
        Column("q_type", "str", choices=tuple(QUANT_CELLS.values())),
        Column("use_g1u1", "bool01"),
        Column("doweight_stage1", "bool01"),
        Column("block_m", "int", choices=(PLANNER_CHOOSES, *BLOCK_MS)),
        Column("ksplit", "int", choices=(PLANNER_CHOOSES, *KSPLITS)),
        Column("us1", "optional_float", minimum=0),
        Column("kernelName1", "optional_str", pattern=STAGE1_PATTERN, pattern_help=STAGE1_HELP),
        Column("err1", "optional_str"),
        Column("us2", "optional_float", minimum=0),
        Column("kernelName2", "optional_str", pattern=STAGE2_PATTERN, pattern_help=STAGE2_HELP),
        Column("err2", "optional_str"),
        Column("us", "optional_float", minimum=0),
        Column("run_1stage", "bool01"),
        Column("tflops", "optional_float"),
        Column("bw", "optional_float"),
        Column("_tag", "optional_str"),
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
    exclude={"_tag": (FALLBACK_TAG,), "run_1stage": ("1", "True", "true", "1.0")},
    row_checks=(_fp8_inter_dim, _quantized_row_length),
)
