"""The tuned table of conv3d (`bf16_tuned_conv3d.csv`, aiter's columns) and its kernel-name
grammar, shared by the runtime lookup, the table generator and the AOT replay. No torch here.
"""

from __future__ import annotations

from aiter.tuning import BucketAxis, Column, TableSpec

LIBTYPE_FLYDSL = "flydsl"
LIBTYPE_TORCH = "torch"
LAYOUTS = ("NCDHW", "NDHWC")
# The input dtypes the entry takes: a bf16 table serves fp16 calls of its shapes as well.
INPUT_DTYPES = ("bfloat16", "float16")

KERNELS = "flydsl_conv3d"
MMA_KINDS = ("mfma", "wmma")
_NUMBER = "[1-9][0-9]*"  # as the generator writes it: no sign, no leading 0
KERNEL_PATTERN = (
    rf"{KERNELS}_(?P<mma>{'|'.join(MMA_KINDS)})_(?P<m>{_NUMBER})x(?P<n>{_NUMBER})"
    rf"_w(?P<wm>{_NUMBER})x(?P<wn>{_NUMBER})_g(?P<wgm>{_NUMBER})"
)
KERNEL_HELP = f"{KERNELS}_<mfma|wmma>_<tile_m>x<tile_n>_w<wave_m>x<wave_n>_g<wgm> or an empty cell"

# The frame count: the axis along which the kernels a layer needs change (through split-K and
# the tile a borrowed row lends).
FRAMES_AXIS = BucketAxis(name="frames", column="D")

# Same layer = same values in these columns; N, D, H and W may differ (a row lends its tile to
# calls of its layer whose output positions are within BORROW_RATIO of its own).
LAYER_COLUMNS = (
    "gfx", "cu_num", "C", "K", "kT", "kH", "kW",
    "stride_d", "stride_h", "stride_w", "pad_d", "pad_h", "pad_w",
    "dil_d", "dil_h", "dil_w", "groups", "bias",
)  # fmt: skip
VOLUME_COLUMNS = ("N", "D", "H", "W")
BORROW_RATIO = 4


def _positive(name: str) -> Column:
    return Column(name, "int", minimum=1)


CONV3D = TableSpec(
    name="bf16_tuned_conv3d.csv",
    short_name="conv3d",
    aot_module="conv3d",
    env_var="AITER_CONFIG_CONV3D",
    columns=(
        Column("gfx", "str"),
        _positive("cu_num"),
        *(_positive(name) for name in ("N", "C", "D", "H", "W", "K", "kT", "kH", "kW")),
        *(_positive(f"stride_{a}") for a in "dhw"),
        *(Column(f"pad_{a}", "int", minimum=0) for a in "dhw"),
        *(_positive(f"dil_{a}") for a in "dhw"),
        _positive("groups"),
        Column("bias", "bool01"),
        Column("tile_m", "int", minimum=0),
        Column("tile_n", "int", minimum=0),
        Column("wave_m", "int", minimum=0),
        Column("wave_n", "int", minimum=0),
        Column("wgm", "int", minimum=0),
        Column("splitK", "int", minimum=0),  # 0: resolved per call
        Column("us", "optional_float", minimum=0),
        Column("kernelName", "optional_str", pattern=KERNEL_PATTERN, pattern_help=KERNEL_HELP),
        # Empty (or absent): FlyDSL; "torch": torch.nn.functional.conv3d serves the shape.
        Column("libtype", "optional_str", choices=(LIBTYPE_FLYDSL, LIBTYPE_TORCH), required=False),
    ),
    key=(*LAYER_COLUMNS, *VOLUME_COLUMNS),
    axis=FRAMES_AXIS,
    # The caller picks the dtype and both layouts; the replay calls the entry with each.
    open_choices={"dtype": INPUT_DTYPES, "input_layout": LAYOUTS, "output_layout": LAYOUTS},
)
