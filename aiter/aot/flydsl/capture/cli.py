"""`python -m aiter.aot.flydsl.capture.cli`: what to do with serving captures besides building
from them (`python -m aiter.aot.flydsl --capture PATH`).

- `merge A B ... -o C`: one capture of the distinct calls of several (hosts, ranks, days),
  each bad line reported as `file:line`; C is written whole or not at all.
- `suggest PATH ... [-o DIR]`: per table, the rows that would serve the captured untuned calls
  as the heuristic served them, in the table's own columns, ready for `--csv TABLE=PATH`
  (written to DIR/<table file> with -o). Each family's dispatch records carry these cells
  (`DispatchRecord.table_row`); a call torch served because no kernel could has none.

Exit status: 0, or 1 when some line could not be used as written, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from aiter.aot.flydsl.capture.files import CaptureRead, read_captures
from aiter.aot.flydsl.jobs.records import EXIT_FAIL, EXIT_OK, EXIT_USAGE


def _read(paths: Sequence[str]) -> CaptureRead | None:
    for path in paths:
        if not Path(path).is_file():
            print(f"error: {path}: no such file", file=sys.stderr)
            return None
    try:
        read = read_captures(paths)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    for problem in read.problems:
        print(f"capture: {problem}", file=sys.stderr)
    return read


def merge(paths: Sequence[str], output: str) -> int:
    """Write the distinct calls of `paths` to `output` (first seen first)."""
    read = _read(paths)
    if read is None:
        return EXIT_USAGE
    target = Path(output)
    if target.is_dir() or not target.parent.is_dir():
        print(f"error: -o {output}: expected a file in an existing directory", file=sys.stderr)
        return EXIT_USAGE
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.writelines(call.text + "\n" for call in read.calls)
    os.replace(temporary, target)  # an input named as the output is read before it is replaced
    dropped = f", {read.refused} refused at serving left out" if read.refused else ""
    print(
        f"{output}: {len(read.calls)} distinct calls from {len(paths)} capture(s) "
        f"({read.duplicates} repeats{dropped})",
        file=sys.stderr,
    )
    return EXIT_FAIL if read.problems else EXIT_OK


def suggested_rows(read: CaptureRead) -> dict[str, tuple[list[str], list[dict[str, str]]]]:
    """Per table (short name): its header and the rows that would serve the captured calls a
    heuristic served, as it served them (one per distinct row)."""
    from aiter.aot.flydsl import registry
    from aiter.tuning import find_spec

    for module in registry.registered().values():
        registry.load(module)  # declares the tables find_spec names
    tables: dict[str, tuple[list[str], list[dict[str, str]]]] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for call in read.calls:
        for served in call.served:
            cells = served.get("table_row")
            spec = find_spec(served.get("table") or "")
            if served.get("row") or not cells or spec is None:
                continue
            if spec.covers is not None and any(spec.covers(r, cells) for r in spec.load().rows):
                continue  # a table of shapes already covers it
            header = list(spec.header)
            values = tuple(str(cells.get(column, "")) for column in header)
            if (spec.short_name, values) in seen:
                continue
            seen.add((spec.short_name, values))
            tables.setdefault(spec.short_name, (header, []))[1].append(
                dict(zip(header, values, strict=True))
            )
    return tables


def suggest(paths: Sequence[str], output_dir: str | None = None) -> int:
    """Print, per table, the rows for the captured untuned calls; with `output_dir`, also write
    each table's rows to a file there named as the table is."""
    read = _read(paths)
    if read is None:
        return EXIT_USAGE
    if output_dir is not None and not Path(output_dir).is_dir():
        print(f"error: -o {output_dir}: expected an existing directory", file=sys.stderr)
        return EXIT_USAGE
    tables = suggested_rows(read)
    if not tables:
        print("every captured call was served by a table row: nothing to suggest", file=sys.stderr)
    for name, (header, rows) in tables.items():
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        target = "PATH"
        if output_dir is not None:
            from aiter.tuning import find_spec

            path = Path(output_dir) / find_spec(name).name
            path.write_text(text.getvalue())
            target = str(path)
        print(f"# {name}: {len(rows)} row(s) for --csv {name}={target}")
        print(text.getvalue(), end="")
    return EXIT_FAIL if read.problems else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aiter.aot.flydsl.capture.cli",
        description="Merge serving captures, or suggest table rows for their untuned calls.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge captures into one, deduplicated")
    merging.add_argument("captures", nargs="+", metavar="PATH")
    merging.add_argument("-o", "--output", required=True, metavar="PATH")
    suggesting = commands.add_parser("suggest", help="table rows for the untuned calls")
    suggesting.add_argument("captures", nargs="+", metavar="PATH")
    suggesting.add_argument(
        "-o", "--output-dir", metavar="DIR", help="also write each table's rows to DIR/<table>"
    )
    args = parser.parse_args(argv)
    if args.command == "merge":
        return merge(args.captures, args.output)
    return suggest(args.captures, args.output_dir)


if __name__ == "__main__":
    sys.exit(main())
