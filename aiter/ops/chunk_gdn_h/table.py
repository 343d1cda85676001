"""The tuned table of chunk_gdn_h (`bf16_tuned_chunk_gdn_h.csv`, aiter's columns): per layer
shape and batch shape, the V-tile width BV. No torch here.

A row is a layer (head dims, chunk size, heads, dtype, which gates and states it uses, dense or
varlen) at N sequences; it serves calls of that layer with exactly N sequences and at most its
T_flat tokens (above the previous row's), T_flat counting every sequence's tokens (B * T for a
dense batch). Other calls take BV from the grid-fill rule (plan.py).
"""

from __future__ import annotations

from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import BLOCK_VS, CHUNK_SIZES, HEAD_DIMS
from aiter.tuning import BucketAxis, Column, Row, TableSpec
from aiter.tuning.kinds import parse_bool01

INPUT_DTYPES = ("torch.bfloat16", "torch.float16")


def _cells(values: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


# Total tokens: what a row's BV serves up to, and what the AOT grid walks.
TOKENS_AXIS = BucketAxis(name="tokens", column="T_flat")

FLAG_COLUMNS = ("is_varlen", "use_g", "use_gk", "use_h0", "store_fs", "save_vn")
LAYER_COLUMNS = ("gfx", "cu_num", "dtype", "K", "V", "BT", "H", "Hg", *FLAG_COLUMNS)


def _heads_group(row: Row) -> tuple[str, str] | None:
    if row.int("H") % row.int("Hg"):
        return "H", f"a multiple of Hg ({row['Hg']}): value heads share key heads in groups"
    return None


def _sequences_fit(row: Row) -> tuple[str, str] | None:
    tokens, seqs = row.int("T_flat"), row.int("N")
    if not row.flag("is_varlen") and tokens % seqs:
        return "T_flat", f"a multiple of N ({seqs}) for a dense batch: N sequences of T tokens"
    return None


# aiter's K5 "opt" table (chunk_gdn_h_opt_tuned.csv) leaves out the switches its kernel fixes:
# scalar gates, no per-key gates, v_new saved. Its extra columns say how the states are stored.
OPT_FIXED = {"use_g": "1", "use_gk": "0", "save_vn": "1"}


def _unserved_storage(row: Row) -> str | None:
    """This library keeps the per-chunk states in the input dtype and the final state in fp32;
    a row of aiter's opt kernel asking otherwise names a kernel it does not have."""
    snapshot, state = row.cells.get("snapshot_bf16", ""), row.cells.get("state_bf16", "")
    if snapshot and not parse_bool01(snapshot):
        return "fp32 per-chunk states (snapshot_bf16=False): this library stores the input dtype"
    if snapshot and row.cells["dtype"] != "torch.bfloat16":
        return f"bf16 per-chunk states of {row.cells['dtype']} inputs (snapshot_bf16=True)"
    if state and parse_bool01(state):
        return "a bf16 final state (state_bf16=True): this library keeps it in fp32"
    return None


def _tile_fits(row: Row) -> tuple[str, str] | None:
    if row.int("V") % row.int("BV"):
        return "BV", f"a V tile width that divides V ({row['V']})"
    return None


CHUNK_GDN_H = TableSpec(
    name="bf16_tuned_chunk_gdn_h.csv",
    short_name="chunk_gdn_h",
    aiter_name="chunk_gdn_h_opt_tuned",
    aot_module="chunk_gdn_h",
    env_var="AITER_CONFIG_CHUNK_GDN_H",
    columns=(
        Column("gfx", "str"),
        Column("cu_num", "int", minimum=1),
        Column("dtype", "str", choices=INPUT_DTYPES),
        Column("K", "int", choices=_cells(HEAD_DIMS)),
        Column("V", "int", minimum=16, maximum=512, multiple=16),
        Column("BT", "int", choices=_cells(CHUNK_SIZES)),
        Column("H", "int", minimum=1),
        Column("Hg", "int", minimum=1),
        *(Column(name, "bool01", absent=OPT_FIXED.get(name)) for name in FLAG_COLUMNS),
        Column("T_flat", "int", minimum=1),
        Column("N", "int", minimum=1),
        Column("BV", "int", choices=_cells(BLOCK_VS)),
        Column("us", "optional_float", minimum=0),
    ),
    key=(*LAYER_COLUMNS, "N", "T_flat"),
    axis=TOKENS_AXIS,
    row_checks=(_heads_group, _sequences_fit, _tile_fits),
    unserved=(_unserved_storage,),
    backend_of=lambda row: "flydsl",
)
