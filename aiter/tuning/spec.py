"""The one declaration of a tuned table, shared by the runtime lookup, the table generator, the
AOT replay and the tests: file, environment variable, columns, shape key, bucket axis, variants.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .kinds import Column
from .row import Row
from .table import RowCheck, TunedTable, Unserved, load_table

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
CONFIG_DIR_ENV = "AITER_CONFIG_DIR"  # a directory of default tables that replaces aiter/configs

# What a deployment serves by default on an axis that counts tokens (a prefill of 32k tokens).
TOKEN_AXIS_DEFAULT_MAX = 32768


@dataclass(frozen=True)
class BucketAxis:
    """An integer call argument the table buckets on: a row serves the values above the
    previous tabled value up to its own, and the top row's shape is served up to `default_max`
    (the heuristic serves what lies above the last row)."""

    name: str  # how callers and reports name it, e.g. "M", "tokens"
    column: str  # the table column holding the tabled value
    default_max: int = TOKEN_AXIS_DEFAULT_MAX

    @property
    def option(self) -> str:
        """The AOT command-line option that sets the largest value a deployment serves."""
        return "--max-" + self.name.lower().replace("_", "-")


@dataclass(frozen=True)
class TableSpec:
    """A tuned table: the default file in the config directory merged with `env_var`'s files.

    `open_choices` are caller arguments the table does not record (for example the output dtype
    of an fp8 GEMM): the AOT replay calls the entry once per combination of their values.
    """

    name: str  # file name in aiter/configs
    short_name: str  # how the AOT command line names it: --csv SHORT=PATH
    env_var: str  # extra tables, os.pathsep-separated
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # shape columns, the axis column included
    axis: BucketAxis
    open_choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    directory: Path | None = None  # where the default file lives; None: AITER_CONFIG_DIR or configs
    # Rows this library cannot serve, by cell text: column -> texts (validated, then dropped).
    exclude: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    aot_module: str = ""  # the AOT module that replays it (`--module`), for messages
    # Checks of whole rows at load, for constraints between cells (see load_table).
    row_checks: tuple[RowCheck, ...] = ()
    # Why this library serves no call of a valid row (set aside with the reason, see load_table).
    unserved: tuple[Unserved, ...] = ()
    # The backend a row names (aiter's libtype, or what its kernel names say), for the summary.
    backend_of: Callable[[Row], str] | None = None
    # The base name of aiter's tuned files for this table (e.g. "bf16_tuned_gemm"): aiter's
    # runtime merges <name>.csv with every model_configs/*<name>*.csv (see aiter_files).
    aiter_name: str = ""
    # For a table of shapes the runtime never looks up: whether a row covers the call whose
    # covering row's cells (a dispatch record's table_row) are given.
    covers: Callable[[Row, Mapping[str, str]], bool] | None = None
    # Whether the AOT builder may assign a bare `--csv PATH` to this table by its columns; False
    # for a table whose columns repeat another's (it then takes a file by its aiter name only).
    assign_by_columns: bool = True

    def __post_init__(self) -> None:
        _SPECS[self.short_name] = self

    def __hash__(self) -> int:
        return hash((self.name, self.env_var))

    @property
    def header(self) -> tuple[str, ...]:
        """Column names in the order the default file writes them."""
        return tuple(c.name for c in self.columns)

    @property
    def default_path(self) -> Path:
        directory = self.directory or Path(os.environ.get(CONFIG_DIR_ENV) or CONFIG_DIR)
        return directory / self.name

    def env_paths(self) -> list[str]:
        """The files `env_var` names now, in merge order."""
        value = os.environ.get(self.env_var, "")
        return [p.strip() for p in re.split(f"[,{re.escape(os.pathsep)}]", value) if p.strip()]

    def paths(self, extra_paths: Sequence[str] = ()) -> list[str]:
        """Every file the merged table is read from, in merge order: the default file, those
        `env_var` names, then `extra_paths` (the AOT builder's --csv files)."""
        return [str(self.default_path), *self.env_paths(), *extra_paths]

    def env_value(self, extra_paths: Sequence[str] = ()) -> str:
        """The value of `env_var` that names its files now and then `extra_paths`: what a
        process sets so that its lookups merge `extra_paths` as `load(extra_paths)` does."""
        now = os.environ.get(self.env_var, "")
        return os.pathsep.join([*([now] if now else []), *extra_paths])

    def load(self, extra_paths: Sequence[str] = ()) -> TunedTable:
        """The merged table as the runtime sees it now, with `extra_paths` merged after the
        files `env_var` names (cached per value of env_var and extra paths)."""
        env_value = os.environ.get(self.env_var, "")
        return _load_cached(self, self.default_path, env_value, tuple(extra_paths))

    def lookup(self, key: Mapping[str, object], value: int) -> Row | None:
        """The row serving `value` of the axis for the shape `key` (None: no row does)."""
        return self.load().lookup(key, value)

    def variants(self) -> list[dict[str, str]]:
        """Every combination of the open caller choices (one empty variant when there are none)."""
        names = list(self.open_choices)
        return [
            dict(zip(names, values, strict=True))
            for values in itertools.product(*(self.open_choices[n] for n in names))
        ]

    def row_axis_value(self, row: Row) -> int:
        return row.int(self.axis.column)

    @property
    def required_columns(self) -> tuple[str, ...]:
        """The columns every file of the table must have (the others have an `absent` rule)."""
        return tuple(c.name for c in self.columns if c.required and c.absent is None)

    def aiter_files(self, configs: Path) -> list[Path]:
        """The files of a directory laid out as aiter's `aiter/configs` that aiter's runtime
        merges into this table: <aiter_name>.csv, then model_configs/*<aiter_name>*.csv (their
        untuned siblings left out), in name order."""
        if not self.aiter_name:
            return []
        files = [configs / f"{self.aiter_name}.csv"]
        files += sorted((configs / "model_configs").glob(f"*{self.aiter_name}*.csv"))
        return [f for f in files if f.is_file() and "untuned" not in f.name]


_SPECS: dict[str, TableSpec] = {}  # every spec declared in this process, by short name


def find_spec(short_name: str) -> TableSpec | None:
    """The spec declared with `short_name` (the one a dispatch record names), None when no
    module of this process declared it."""
    return _SPECS.get(short_name)


@functools.cache
def _load_cached(
    spec: TableSpec, default_path: Path, _env_value: str, extra_paths: tuple[str, ...]
) -> TunedTable:
    return load_table(
        default_path,
        columns=spec.columns,
        key=spec.key,
        m_column=spec.axis.column,
        env_var=spec.env_var,
        extra_paths=extra_paths,
        exclude=spec.exclude,
        row_checks=spec.row_checks,
        unserved=spec.unserved,
    )


def describe_variant(variant: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in variant.items())
