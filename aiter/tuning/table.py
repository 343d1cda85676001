"""Loading tuned tables: merging files, validating cells and keeping one row per shape.

The default table comes first, then files named by an environment variable, then --csv.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from types import MappingProxyType

from .csvio import RawTable, read_table_file, write_table_file
from .errors import TableError
from .kinds import EXPECTED, NORMALIZERS, PARSERS, Column, parse_float
from .lookup import MBuckets
from .row import Row, bad_cell

US_COLUMN = "us"

PathLike = str | os.PathLike
# A check of a whole row, for what no single cell shows: None, or (column, what was expected).
RowCheck = Callable[[Row], tuple[str, str] | None]
# Why this library serves no call a valid row describes (a quantization it has no kernel for),
# or None; such a row is set aside with its reason, never an error.
Unserved = Callable[[Row], str | None]


class TunedTable:
    """Merged, validated, deduplicated rows with an index from shape to M buckets."""

    def __init__(
        self,
        columns: Sequence[str],
        rows: Sequence[Row],
        *,
        kinds: Mapping[str, str],
        key: Sequence[str],
        m_column: str = "M",
        sources: Sequence[str] = (),
        set_aside: Sequence[tuple[Row, str]] = (),
    ) -> None:
        self.columns: tuple[str, ...] = tuple(columns)
        # Valid rows this library serves no call of, each with the reason (in file order).
        self.set_aside: tuple[tuple[Row, str], ...] = tuple(set_aside)
        self.rows: tuple[Row, ...] = tuple(rows)
        self.m_column = m_column
        # Shape key without M, in the caller's order; M is handled by the buckets.
        self.key: tuple[str, ...] = tuple(name for name in key if name != m_column)
        self.sources: tuple[str, ...] = tuple(sources)
        self._kinds = dict(kinds)
        self._parsers = tuple(PARSERS[kinds[name]] for name in self.key)
        self._normalizers = tuple((name, NORMALIZERS[kinds[name]]) for name in self.key)
        self._buckets = MBuckets((self._row_key(row), row.int(m_column), row) for row in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def lookup(self, key: Mapping[str, object], m: int) -> Row | None:
        """The row tabled at exactly M == m, else the one whose M bucket holds m, else None.

        `key` maps each non-M key column to a value compared like the table's cells
        (numerically for numeric kinds, as text otherwise; extra entries are ignored).
        """
        try:
            shape = tuple(normalize(key[name]) for name, normalize in self._normalizers)
        except (KeyError, TypeError, ValueError):
            raise self._bad_key(key) from None
        return self._buckets.find(shape, m)

    def bucket_of(self, row: Row) -> tuple[int, int]:
        """Inclusive range of M the row serves: (previous tabled M + 1, its M), from 1."""
        return self._buckets.bucket(self._row_key(row), row.int(self.m_column), row)

    def is_top(self, row: Row) -> bool:
        """Whether no row of the same shape has a larger M: above it the heuristic serves."""
        return self._buckets.is_top(self._row_key(row), row.int(self.m_column))

    def to_csv(self, path: PathLike) -> None:
        """Write every column and cell as text, so reading it back gives the same cells."""
        write_table_file(
            path, self.columns, ([row.cells[name] for name in self.columns] for row in self.rows)
        )

    def _bad_key(self, key: Mapping[str, object]) -> ValueError:
        # Off the hot path: find which entry spoiled the lookup and say so.
        for name, normalize in self._normalizers:
            if name not in key:
                return ValueError(
                    f"lookup key lacks column {name!r}; expected {', '.join(self.key)}"
                )
            try:
                normalize(key[name])
            except (TypeError, ValueError):
                kind = self._kinds[name]
                return ValueError(
                    f"lookup key column {name!r}: expected {EXPECTED[kind]}, "
                    f"found {key[name]!r}"
                )
        return ValueError(f"bad lookup key {key!r}")

    def _row_key(self, row: Row) -> tuple[Hashable, ...]:
        return tuple(
            parse(row.cells[name]) for name, parse in zip(self.key, self._parsers, strict=True)
        )


def load_table(
    default_path: PathLike,
    *,
    columns: Sequence[Column],
    key: Sequence[str],
    m_column: str = "M",
    env_var: str | None = None,
    extra_paths: Sequence[PathLike] = (),
    exclude: Mapping[str, tuple[str, ...]] | None = None,
    row_checks: Sequence[RowCheck] = (),
    unserved: Sequence[Unserved] = (),
) -> TunedTable:
    """Read the default table, then files listed in `env_var`, then `extra_paths`.

    Every file must hold every column in `columns`, with cells of its kind. Rows with
    the same shape (`key`, which always includes `m_column`) are one: the lowest `us`
    wins, an empty `us` loses, and on a tie the later file's row wins. A row whose cell in a
    column of `exclude` is one of that column's texts is validated, then dropped. Each of
    `row_checks` sees every row whose cells passed their columns: a (column, expected) it
    returns refuses the table there, as a bad cell does. A row for which one of `unserved`
    gives a reason is set aside with it (`TunedTable.set_aside`). A column a file leaves out
    reads as its `absent` text (or what its `absent` function makes of the row's cells).
    """
    kinds = _check_schema(columns, key, m_column)
    constrained = {c.name: c for c in columns if c.constrained}
    shape_columns = tuple(dict.fromkeys([*key, m_column]))

    raws = [read_table_file(default_path, "the default table")]
    for path in _env_paths(env_var):
        raws.append(read_table_file(path, f"environment variable {env_var}"))
    for path in extra_paths:
        raws.append(read_table_file(path, "--csv"))

    # Columns a file may leave out still have a cell in every row (empty).
    all_columns = tuple(dict.fromkeys([*(name for raw in raws for name in raw.header), *kinds]))
    required = {c.name: c.kind for c in columns if c.required and c.absent is None}
    absent = {c.name: c.absent for c in columns if c.absent is not None}
    winners: dict[tuple[Hashable, ...], tuple[float, Row]] = {}
    set_aside: list[tuple[Row, str]] = []
    for raw in raws:
        _check_columns(raw, required)
        fill = {name: how for name, how in absent.items() if name not in raw.header}
        for row in _rows(raw, all_columns, kinds, constrained, fill, required):
            _check_row(row, row_checks)
            if exclude and any(row.cells[c].strip() in v for c, v in exclude.items()):
                continue
            reason = next((r for r in (check(row) for check in unserved) if r), None)
            if reason is not None:
                set_aside.append((row, reason))
                continue
            shape = tuple(PARSERS[kinds[name]](row.cells[name]) for name in shape_columns)
            us = _us(row)
            best = winners.get(shape)
            # <= so a tie goes to the later row: an extra table overrides the default.
            if best is None or us <= best[0]:
                # Assigning to an existing key keeps the shape at its first position.
                winners[shape] = (us, row)

    return TunedTable(
        all_columns,
        [row for _, row in winners.values()],
        kinds=kinds,
        key=shape_columns,
        m_column=m_column,
        sources=[raw.path for raw in raws],
        set_aside=set_aside,
    )


def _check_schema(columns: Sequence[Column], key: Sequence[str], m_column: str) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for column in columns:
        if kinds.setdefault(column.name, column.kind) != column.kind:
            raise ValueError(f"column {column.name!r} is declared twice with different kinds")
    for name in [*key, m_column]:
        if name not in kinds:
            raise ValueError(f"key column {name!r} is not among the declared columns")
    if kinds[m_column] != "int":
        raise ValueError(f"M column {m_column!r} must be of kind 'int', not {kinds[m_column]!r}")
    return kinds


def _env_paths(env_var: str | None) -> list[str]:
    if not env_var:
        return []
    value = os.environ.get(env_var, "")
    return [part.strip() for part in re.split(f"[,{re.escape(os.pathsep)}]", value) if part.strip()]


def _check_columns(raw: RawTable, kinds: Mapping[str, str]) -> None:
    for name in kinds:
        if name not in raw.header:
            raise TableError(
                f"{raw.path}: missing required column {name!r}; "
                f"columns found: {', '.join(raw.header)}",
                path=raw.path,
                line=raw.header_line,
                column=name,
            )


def _rows(
    raw: RawTable,
    all_columns: Sequence[str],
    kinds: Mapping[str, str],
    constrained: Mapping[str, Column],
    fill: Mapping[str, str | Callable[[Mapping[str, str]], str]],
    needed: Collection[str],
) -> list[Row]:
    rows = []
    for line, values in raw.records:
        cells = dict.fromkeys(all_columns, "")
        # A short record's trailing cells stay empty.
        cells.update(zip(raw.header, values, strict=False))
        if len(values) < len(raw.header) and any(c in needed for c in raw.header[len(values) :]):
            header = raw.header
            raise TableError(
                f"{raw.path}:{line}: expected {len(header)} cells ({', '.join(header)}), "
                f"found {len(values)}",
                path=raw.path,
                line=line,
            )
        written = dict(cells)
        for name, how in fill.items():
            try:
                cells[name] = how if isinstance(how, str) else how(written)
            except ValueError as err:
                raise TableError(
                    f"{raw.path}:{line}: column {name!r} is not in the file and {err}",
                    path=raw.path,
                    line=line,
                    column=name,
                ) from None
        for name, kind in kinds.items():
            try:
                PARSERS[kind](cells[name])
            except ValueError:
                raise bad_cell(raw.path, line, name, cells[name], kind) from None
        for name, column in constrained.items():
            expected = column.violation(cells[name])
            if expected is not None:
                raise TableError(
                    f"{raw.path}:{line}: column {name!r}: expected {expected}, "
                    f"found {cells[name]!r}",
                    path=raw.path,
                    line=line,
                    column=name,
                )
        rows.append(Row(MappingProxyType(cells), raw.path, line))
    return rows


def _check_row(row: Row, row_checks: Sequence[RowCheck]) -> None:
    for check in row_checks:
        broken = check(row)
        if broken is not None:
            column, expected = broken
            raise TableError(
                f"{row.source}:{row.line}: column {column!r}: expected {expected}, "
                f"found {row.cells[column]!r}",
                path=row.source,
                line=row.line,
                column=column,
            )


def _us(row: Row) -> float:
    text = row.cells.get(US_COLUMN, "")
    if text == "":
        return math.inf
    try:
        value = parse_float(text)
    except ValueError:
        raise bad_cell(row.source, row.line, US_COLUMN, text, "optional_float") from None
    # A failed tuning run may record nan; it must never beat a measured time.
    return math.inf if math.isnan(value) else value
