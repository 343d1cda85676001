"""The tuned tables the operators read: where each lives, its columns and its shape key.

Each table is the default file in aiter/configs merged with files named by its environment
variable; the AOT builder's --csv adds to that variable, so replay and runtime read the same rows.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from aiter.tuning import Column, TunedTable, load_table

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
CONFIG_DIR_ENV = "AITER_CONFIG_DIR"  # a directory of default tables that replaces aiter/configs


@dataclass(frozen=True)
class TableSpec:
    name: str  # file name in aiter/configs
    env_var: str  # extra tables, os.pathsep-separated
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # shape columns, M included
    directory: Path | None = None  # where the default file lives; None: AITER_CONFIG_DIR or configs

    @property
    def default_path(self) -> Path:
        directory = self.directory or Path(os.environ.get(CONFIG_DIR_ENV) or CONFIG_DIR)
        return directory / self.name

    def load(self) -> TunedTable:
        """The merged table as the runtime sees it now (cached per value of env_var)."""
        return _load_cached(self, self.default_path, os.environ.get(self.env_var, ""))


@functools.cache
def _load_cached(spec: TableSpec, default_path: Path, _env_value: str) -> TunedTable:
    return load_table(default_path, columns=spec.columns, key=spec.key, env_var=spec.env_var)


A16W16 = TableSpec(
    name="bf16_tuned_gemm.csv",
    env_var="AITER_CONFIG_GEMM_BF16",
    columns=(
        Column("gfx", "str"),
        Column("cu_num", "int"),
        Column("M", "int"),
        Column("N", "int"),
        Column("K", "int"),
        Column("bias", "bool01"),
        Column("dtype", "str"),
        Column("outdtype", "str"),
        Column("libtype", "str"),
        Column("splitK", "int"),
        Column("us", "optional_float"),
        Column("kernelName", "optional_str"),
    ),
    key=("gfx", "cu_num", "M", "N", "K", "bias", "dtype", "outdtype"),
)

_A8W8_COLUMNS = (
    Column("gfx", "str"),
    Column("cu_num", "int"),
    Column("M", "int"),
    Column("N", "int"),
    Column("K", "int"),
    Column("libtype", "str"),
    Column("kernelId", "int"),
    Column("splitK", "int"),
    Column("us", "optional_float"),
    Column("kernelName", "optional_str"),
)

A8W8_BPRESHUFFLE = TableSpec(
    name="a8w8_bpreshuffle_tuned_gemm.csv",
    env_var="AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE",
    columns=_A8W8_COLUMNS[:5] + (Column("q_dtype_w", "str"),) + _A8W8_COLUMNS[5:],
    key=("gfx", "cu_num", "M", "N", "K", "q_dtype_w"),
)

A8W8_BLOCKSCALE = TableSpec(
    name="a8w8_blockscale_tuned_gemm.csv",
    env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE",
    columns=_A8W8_COLUMNS,
    key=("gfx", "cu_num", "M", "N", "K"),
)

ALL_TABLES = (A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE)
