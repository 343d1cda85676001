"""Reading and writing one tuned-table CSV file as text.

Cells keep their text (stripped of surrounding whitespace); nothing is converted here.
"""

from __future__ import annotations

import contextlib
import csv
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import TableError


@dataclass(frozen=True)
class RawTable:
    """A file's header and its data records, each with its 1-based starting line. A record may
    hold fewer cells than the header (pandas, which aiter's tuners write with, reads the missing
    trailing cells as empty); `load_table` refuses one that leaves out a column it needs."""

    path: str
    header: tuple[str, ...]
    header_line: int
    records: tuple[tuple[int, tuple[str, ...]], ...]


def read_table_file(path: str | os.PathLike, origin: str) -> RawTable:
    """Read `path` as text; `origin` says who asked for it, for the not-found message."""
    name = os.fspath(path)
    try:
        # utf-8-sig drops the byte-order mark spreadsheet tools put in front of the header.
        with open(name, newline="", encoding="utf-8-sig") as handle:
            return _read(name, handle)
    except FileNotFoundError:
        raise TableError(
            f"tuned table {name} not found (asked for by {origin})", path=name
        ) from None
    except IsADirectoryError:
        raise TableError(
            f"tuned table {name} is a directory, expected a CSV file (asked for by {origin})",
            path=name,
        ) from None
    except UnicodeDecodeError as exc:
        raise TableError(f"{name}: not UTF-8 text ({exc.reason})", path=name) from None
    except PermissionError:
        raise TableError(
            f"tuned table {name} is not readable: check its permissions (asked for by {origin})",
            path=name,
        ) from None
    except OSError as exc:
        raise TableError(
            f"tuned table {name} cannot be read: {exc.strerror or exc} (asked for by {origin})",
            path=name,
        ) from None


def _read(name: str, handle: Iterable[str]) -> RawTable:
    reader = csv.reader(handle, strict=True)
    header: tuple[str, ...] | None = None
    header_line = 0
    records: list[tuple[int, tuple[str, ...]]] = []
    while True:
        # A quoted cell may span lines, so a record starts right after the previous one ended.
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise TableError(
                f"{name}:{start}: malformed CSV ({exc})", path=name, line=start
            ) from None
        cells = tuple(cell.strip() for cell in fields)
        if not any(cells) and len(cells) <= 1:
            continue  # blank line
        if header is None:
            header, header_line = _check_header(name, start, cells), start
            continue
        if len(cells) > len(header):
            raise TableError(
                f"{name}:{start}: expected {len(header)} cells ({', '.join(header)}), "
                f"found {len(cells)}",
                path=name,
                line=start,
            )
        records.append((start, cells))
    if header is None:
        raise TableError(f"{name}: empty file, expected a header line of column names", path=name)
    return RawTable(name, header, header_line, tuple(records))


def _check_header(name: str, line: int, header: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    for index, column in enumerate(header, start=1):
        if column == "":
            raise TableError(
                f"{name}:{line}: header cell {index} is empty, expected a column name",
                path=name,
                line=line,
            )
        if column in seen:
            raise TableError(
                f"{name}:{line}: column {column!r} appears twice in the header",
                path=name,
                line=line,
                column=column,
            )
        seen.add(column)
    return header


def write_table_file(
    path: str | os.PathLike, columns: Sequence[str], rows: Iterable[Sequence[str]]
) -> None:
    """Write header and cells as text; the file lands whole or not at all."""
    name = os.fspath(path)
    # Same directory, so os.replace is atomic and a reader never sees half a table.
    tmp = f"{name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(columns)
            writer.writerows(rows)
        os.replace(tmp, name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
