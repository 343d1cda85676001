"""One row of a tuned table: its cells as written and where it came from.

Typed accessors parse on demand and name file, line and column when a cell is bad.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import TableError
from .kinds import EXPECTED, parse_bool01, parse_int, parse_optional_float


def row_name(ref: str) -> str:
    """A row reference "path:line" as "file:line", the same from any checkout or install of the
    tables; any other reference (a grid point's label) as it is."""
    source, _, line = ref.rpartition(":")
    return f"{Path(source).name}:{line}" if source and line.isdigit() else ref


@dataclass(frozen=True)
class Row:
    """Cells exactly as written (surrounding whitespace stripped), with file and line."""

    cells: Mapping[str, str]
    source: str
    line: int

    # A row is identified by its place in a file; its cells mapping need not be hashable.
    def __hash__(self) -> int:
        return hash((self.source, self.line))

    def __getitem__(self, name: str) -> str:
        try:
            return self.cells[name]
        except KeyError:
            raise KeyError(
                f"{self.source}:{self.line}: no column {name!r}; "
                f"columns are {', '.join(self.cells)}"
            ) from None

    def int(self, name: str) -> int:
        """The cell as an integer ("256.0" reads as 256); TableError if it is not one."""
        text = self[name]
        try:
            return parse_int(text)
        except ValueError:
            raise self._bad_cell(name, text, "int") from None

    def flag(self, name: str) -> bool:
        """The cell as a flag (0/1 or True/False, as aiter's tuners write either); TableError if
        it is neither."""
        text = self[name]
        try:
            return bool(parse_bool01(text))
        except ValueError:
            raise self._bad_cell(name, text, "bool01") from None

    def float(self, name: str) -> float | None:
        """The cell as a float, None when empty; TableError if it is not a number."""
        text = self[name]
        try:
            return parse_optional_float(text)
        except ValueError:
            raise self._bad_cell(name, text, "optional_float") from None

    def _bad_cell(self, name: str, text: str, kind: str) -> TableError:
        return bad_cell(self.source, self.line, name, text, kind)


def bad_cell(source: str, line: int, column: str, text: str, kind: str) -> TableError:
    return TableError(
        f"{source}:{line}: column {column!r}: expected {EXPECTED[kind]}, found {text!r}",
        path=source,
        line=line,
        column=column,
    )
