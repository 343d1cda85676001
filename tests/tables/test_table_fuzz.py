"""Damaged GEMM tables either load or raise TableError naming the file (and the line, when one is
known); generated with hypothesis from the real specs of aiter.ops.gemm.table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiter.ops.gemm.table import A8W8_BLOCKSCALE, A8W8_BPRESHUFFLE, A16W16
from aiter.tuning import Column, TableError, TableSpec, TunedTable, load_table

pytestmark = pytest.mark.slow  # over a thousand generated tables

SPECS = (A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE)
ARCHS = ("gfx942", "gfx950", "gfx1250")
# Few values per shape column, so that generated tables repeat shapes.
SHAPE_VALUES = {"cu_num": (80, 256, 304), "M": (1, 16, 256), "N": (1024, 4096), "K": (512, 8192)}
# Characters no number of any spelling holds.
NOT_NUMERIC = "#@!?;x/"
INVALID_UTF8 = (b"\xff", b"\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")
NASTY = (
    "",
    " ",
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "-0",
    "1.5",
    "1_000",
    "0x10",
    "1e400",
    "1e-400",
    "\u0661\u0662\u0663",
    "torch.float64",
    '"',
    '""',
    "a,b",
    "\x00",
    "\ufeff",
    "\u2028",
)

# Generated tables: 180 + 150 + 150 + 200 + 100 + 150 + 300 = 1,230 across the tests.
FAST = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def table_text(exclude_characters: str = "", **size) -> st.SearchStrategy[str]:
    """Text a table file can hold: any character UTF-8 encodes (no lone surrogates)."""
    characters = st.characters(codec="utf-8", exclude_characters=exclude_characters)
    return st.text(characters, **size)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tables")


def load(spec: TableSpec, path: Path) -> TunedTable:
    return load_table(path, columns=spec.columns, key=spec.key, m_column=spec.axis.column)


# --- generating tables ---


@st.composite
def int_text(draw, value: int) -> str:
    """`value` spelled any way an int cell accepts."""
    spelled = draw(st.sampled_from((str(value), f"{value}.0", f"{float(value):e}", f"+{value}")))
    return draw(st.sampled_from(("", " ", "\t"))) + spelled + draw(st.sampled_from(("", " ")))


@st.composite
def us_text(draw) -> tuple[str, float]:
    """An `us` cell and the time it stands for (empty and nan never win)."""
    kind = draw(st.sampled_from(("number", "number", "empty", "nan")))
    if kind == "empty":
        return "", math.inf
    if kind == "nan":
        return "nan", math.inf
    value = draw(st.floats(0, 1000, allow_nan=False).map(lambda v: round(v, 2)))
    return repr(value), value


@st.composite
def good_row(draw, spec: TableSpec) -> tuple[list[str], tuple, float]:
    """Cells of a valid row, the shape they stand for, and its `us`."""
    cells, values, us = [], {}, math.inf
    for column in spec.columns:
        name = column.name
        if name in SHAPE_VALUES:
            values[name] = draw(st.sampled_from(SHAPE_VALUES[name]))
            cells.append(draw(int_text(values[name])))
        elif name == "gfx":
            values[name] = draw(st.sampled_from(ARCHS))
            cells.append(values[name])
        elif name == "us":
            text, us = draw(us_text())
            cells.append(text)
        elif column.choices:
            values[name] = draw(st.sampled_from(column.choices))
            cells.append(values[name])
        elif column.kind == "bool01":
            text = draw(st.sampled_from(("0", "1", "True", "False", "true", "0.0", "1.0")))
            values[name] = text.lower() in ("1", "true", "1.0")
            cells.append(text)
        elif column.kind == "int":
            low = 0 if column.minimum is None else column.minimum
            high = 64 if column.maximum is None else column.maximum
            cells.append(draw(int_text(draw(st.integers(low, max(low, high))))))
        elif column.pattern is not None:  # kernelName: empty, or a name of its grammar
            cells.append(draw(st.just("") | st.from_regex(column.pattern, fullmatch=True)))
        else:
            cells.append(draw(table_text(exclude_characters="\r\n", max_size=12)))
    shape = tuple(values[name] for name in spec.key)
    return cells, shape, us


@st.composite
def good_table(draw, spec: TableSpec, min_rows: int = 0) -> tuple[list[str], list]:
    rows = draw(st.lists(good_row(spec), min_size=min_rows, max_size=8))
    return list(spec.header), rows


def quoted(cell: str) -> str:
    """A cell as CSV writes it: quoted when it holds a comma, a quote or a line break."""
    if any(c in cell for c in ',"\r\n'):
        return '"' + cell.replace('"', '""') + '"'
    return cell


def render(header: Sequence[str], rows: Sequence[Sequence[str]], crlf: bool = False) -> str:
    end = "\r\n" if crlf else "\n"
    return "".join(",".join(map(quoted, cells)) + end for cells in [header, *rows])


def spec_strategy() -> st.SearchStrategy[TableSpec]:
    return st.sampled_from(SPECS)


# --- what every outcome must satisfy ---


def check(spec: TableSpec, path: Path) -> TunedTable | TableError:
    """Load the file: a table whose every row is found again, or a TableError that starts with
    the file's name (and its line, when the error knows one). Anything else fails the test."""
    try:
        table = load(spec, path)
    except TableError as err:
        message = str(err)
        assert err.path == str(path), message
        assert message.startswith(f"{path}:"), message
        if err.line is not None:
            # A missing column is a fault of the whole file: it names the column instead.
            whole_file = message.startswith(f"{path}: missing required column {err.column!r}")
            assert whole_file or message.startswith(f"{path}:{err.line}: "), message
        if err.column is not None:
            assert repr(err.column) in message, message
        return err
    m_column = spec.axis.column
    for row in table.rows:
        key = {name: row.cells[name] for name in spec.key if name != m_column}
        assert table.lookup(key, row.int(m_column)) is row
        assert table.bucket_of(row)[1] == row.int(m_column)
    return table


def write(workdir: Path, spec: TableSpec, data: bytes) -> Path:
    path = workdir / spec.name
    path.write_bytes(data)
    return path


# --- valid tables ---


@settings(max_examples=180, **FAST)
@given(spec=spec_strategy(), data=st.data(), crlf=st.booleans(), bom=st.booleans())
def test_a_valid_table_keeps_the_fastest_row_of_each_shape(workdir, spec, data, crlf, bom):
    header, rows = data.draw(good_table(spec))
    text = render(header, [cells for cells, _, _ in rows], crlf)
    path = write(workdir, spec, (b"\xef\xbb\xbf" if bom else b"") + text.encode())
    table = check(spec, path)
    assert isinstance(table, TunedTable), table
    # The oracle: per shape the lowest us, a tie to the later row; empty and nan lose.
    winners: dict[tuple, tuple[float, int]] = {}
    for line, (_, shape, us) in enumerate(rows, start=2):
        if shape not in winners or us <= winners[shape][0]:
            winners[shape] = (us, line)
    assert sorted(row.line for row in table.rows) == sorted(line for _, line in winners.values())


# --- one kind of damage at a time, with the error it must raise ---


@settings(max_examples=150, **FAST)
@given(spec=spec_strategy(), data=st.data())
def test_a_dropped_or_renamed_column_is_named(workdir, spec, data):
    header, rows = data.draw(good_table(spec))
    cells = [list(c) for c, _, _ in rows]
    index = data.draw(st.integers(0, len(header) - 1), label="column")
    old = header[index]
    # Not U+FEFF: at the start of the file it is the byte-order mark, which is dropped.
    names = table_text(exclude_characters="\ufeff", max_size=10)
    new = data.draw(st.none() | names | st.sampled_from(header), label="new name")
    if new is None:
        del header[index]
        for row in cells:
            del row[index]
    else:
        header[index] = new
    outcome = check(spec, write(workdir, spec, render(header, cells).encode()))
    name = None if new is None else new.strip()
    if name == old:
        assert isinstance(outcome, TunedTable)  # surrounding whitespace is not part of a name
    elif name == "":
        assert isinstance(outcome, TableError) and outcome.line == 1
        assert f"header cell {index + 1} is empty" in str(outcome)
    elif name in header[:index] + header[index + 1 :]:
        assert isinstance(outcome, TableError) and outcome.line == 1
        assert f"column {name!r} appears twice in the header" in str(outcome)
    else:
        assert isinstance(outcome, TableError)
        assert f"missing required column {old!r}" in str(outcome)
        assert outcome.column == old


@settings(max_examples=150, **FAST)
@given(spec=spec_strategy(), data=st.data())
def test_a_short_or_long_row_names_its_line(workdir, spec, data):
    header, rows = data.draw(good_table(spec, min_rows=1))
    cells = [list(c) for c, _, _ in rows]
    which = data.draw(st.integers(0, len(cells) - 1), label="row")
    row = cells[which]
    if data.draw(st.booleans(), label="short"):
        start = data.draw(st.integers(1, len(row) - 1), label="cut from")
        del row[start : start + data.draw(st.integers(1, len(row) - start), label="cut")]
    else:
        row += data.draw(st.lists(table_text(exclude_characters="\r\n"), min_size=1))
    outcome = check(spec, write(workdir, spec, render(header, cells).encode()))
    assert isinstance(outcome, TableError)
    line = which + 2
    assert str(outcome).startswith(
        f"{outcome.path}:{line}: expected {len(header)} cells ({', '.join(header)}), "
        f"found {len(row)}"
    )


def bad_values(column: Column) -> st.SearchStrategy[str] | None:
    """Cells a column must refuse; None when it takes any text."""
    with_junk = table_text(max_size=6).map(lambda t: t + NOT_NUMERIC[len(t) % len(NOT_NUMERIC)])
    if column.choices:
        return (table_text(max_size=12) | st.sampled_from(NASTY)).filter(
            lambda t: t.strip() not in column.choices
        )
    if column.pattern is not None:
        names = table_text(max_size=30) | st.from_regex(column.pattern, fullmatch=True).flatmap(
            lambda name: st.sampled_from((name + "x", "x" + name, name.replace("_", "-")))
        )
        return names.filter(lambda t: t.strip() and not re.fullmatch(column.pattern, t.strip()))
    out_of_range = st.nothing()
    if column.minimum is not None:
        out_of_range |= st.integers(column.minimum - 10**6, column.minimum - 1).map(str)
    if column.maximum is not None:
        out_of_range |= st.integers(column.maximum + 1, column.maximum + 10**6).map(str)
    if column.kind == "int":
        fixed = ("", " ", "nan", "inf", "1.5", "1_000", "0x10", "1e400", "12abc", "--1", "1,5")
        return st.sampled_from(fixed) | with_junk | out_of_range
    if column.kind == "bool01":
        return st.sampled_from(("2", "-1", "0.5", "yes", "no", "nan", "", "T", "1e400")) | with_junk
    if column.kind in ("optional_float", "float"):
        fixed = ("abc", "1_0", "--1", "1e", "1,5", "0x1p3")
        return st.sampled_from(fixed) | with_junk | out_of_range
    if column.kind == "str":
        return st.sampled_from(("", " ", "\t"))
    return None  # optional_str without a pattern: any text


@settings(max_examples=200, **FAST)
@given(spec=spec_strategy(), data=st.data())
def test_a_bad_cell_names_its_file_line_and_column(workdir, spec, data):
    header, rows = data.draw(good_table(spec, min_rows=1))
    cells = [list(c) for c, _, _ in rows]
    refusing = [i for i, c in enumerate(spec.columns) if bad_values(c) is not None]
    index = data.draw(st.sampled_from(refusing), label="column")
    which = data.draw(st.integers(0, len(cells) - 1), label="row")
    value = data.draw(bad_values(spec.columns[index]), label="cell")
    cells[which][index] = value
    outcome = check(spec, write(workdir, spec, render(header, cells).encode()))
    assert isinstance(outcome, TableError), value
    assert outcome.line == which + 2 and outcome.column == header[index]
    assert str(outcome).startswith(
        f"{outcome.path}:{which + 2}: column {header[index]!r}: expected"
    )


# --- damaged bytes ---


@settings(max_examples=100, **FAST)
@given(spec=spec_strategy(), data=st.data())
def test_invalid_utf8_anywhere_is_named(workdir, spec, data):
    header, rows = data.draw(good_table(spec))
    raw = render(header, [c for c, _, _ in rows]).encode()
    at = data.draw(st.integers(0, len(raw)), label="at")
    bad = data.draw(st.sampled_from(INVALID_UTF8), label="bytes")
    outcome = check(spec, write(workdir, spec, raw[:at] + bad + raw[at:]))
    assert isinstance(outcome, TableError)
    assert str(outcome).startswith(f"{outcome.path}: not UTF-8 text")


@settings(max_examples=150, **FAST)
@given(spec=spec_strategy(), data=st.data())
def test_nul_bytes_and_truncation_load_or_are_named(workdir, spec, data):
    header, rows = data.draw(good_table(spec, min_rows=1))
    raw = render(header, [c for c, _, _ in rows]).encode()
    for _ in range(data.draw(st.integers(0, 3), label="NULs")):
        at = data.draw(st.integers(0, len(raw)))
        raw = raw[:at] + b"\x00" + raw[at:]
    cut = data.draw(st.integers(0, len(raw)), label="cut at")
    outcome = check(spec, write(workdir, spec, raw[:cut]))
    if isinstance(outcome, TunedTable):
        assert len(outcome) <= len(rows)


# --- any damage at all ---


def mutate_cells(data, header: list[str], cells: list[list[str]]) -> None:
    """One change of the header or the rows, as a person or a tool might make it."""
    kind = data.draw(
        st.sampled_from(("drop", "rename", "short", "long", "cell", "sign", "dup", "quote")),
        label="change",
    )
    column = data.draw(st.integers(0, len(header) - 1))
    row = data.draw(st.integers(0, len(cells) - 1)) if cells else None
    if kind == "drop":
        del header[column]
        for r in cells:
            if column < len(r):
                del r[column]
    elif kind == "rename":
        header[column] = data.draw(table_text(max_size=8) | st.sampled_from(header))
    elif row is None:
        return
    elif kind == "short":
        del cells[row][data.draw(st.integers(0, len(cells[row]))) :]
    elif kind == "long":
        cells[row] += data.draw(st.lists(table_text(max_size=4), min_size=1, max_size=3))
    elif kind in ("cell", "sign") and column < len(cells[row]):
        if kind == "cell":
            value = data.draw(table_text(max_size=10) | st.sampled_from(NASTY))
        else:
            value = data.draw(st.sampled_from(("0", "-1", "-256", "-0.0", "-1e3")))
        cells[row][column] = value
    elif kind == "dup":
        cells.insert(data.draw(st.integers(0, len(cells))), list(cells[row]))
    elif kind == "quote" and column < len(cells[row]):
        cell = cells[row][column]
        cells[row][column] = data.draw(
            st.sampled_from((f'"{cell}"', f'"{cell}', f'{cell}"', f'"{cell}"x', cell + "\n")),
        )


def mutate_bytes(data, raw: bytes) -> bytes:
    """One change of the file's bytes."""
    kind = data.draw(st.sampled_from(("bytes", "utf8", "nul", "quote", "cut", "eol")))
    at = data.draw(st.integers(0, len(raw)))
    if kind == "bytes":
        return raw[:at] + data.draw(st.binary(min_size=1, max_size=6)) + raw[at:]
    if kind == "utf8":
        return raw[:at] + data.draw(st.sampled_from(INVALID_UTF8)) + raw[at:]
    if kind == "nul":
        return raw[:at] + b"\x00" + raw[at:]
    if kind == "quote":
        return raw[:at] + b'"' + raw[at:]
    if kind == "eol":
        return raw[:at] + data.draw(st.sampled_from((b"\r", b"\n", b"\r\n", b"\n\n"))) + raw[at:]
    return raw[:at]


@settings(max_examples=300, **FAST)
@given(spec=spec_strategy(), data=st.data(), bom=st.booleans())
def test_any_damage_loads_or_names_the_file(workdir, spec, data, bom):
    header, rows = data.draw(good_table(spec))
    cells = [list(c) for c, _, _ in rows]
    for _ in range(data.draw(st.integers(0, 3), label="cell changes")):
        mutate_cells(data, header, cells)
    raw = (b"\xef\xbb\xbf" if bom else b"") + render(header, cells).encode()
    for _ in range(data.draw(st.integers(0, 3), label="byte changes")):
        raw = mutate_bytes(data, raw)
    check(spec, write(workdir, spec, raw))


# --- regression examples ---

HEADER = ",".join(A16W16.header)
ROW = "gfx942,304,256,4096,1024,0,torch.bfloat16,torch.bfloat16,flydsl,0,{us},{name}"
NAME = "flydsl_a16w16_mfma_16x64x64"
# Damage to the file as a whole; a bad cell of any family's table: tests/tables/test_bad_tables.py.


def line(us: str = "10", name: str = NAME) -> str:
    return ROW.format(us=us, name=name)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", ": empty file, expected a header line of column names"),
        (f"{HEADER}\n{line()}\n{line()[:30]}", ":3: expected 12 cells"),
        (f'{HEADER}\n{line()}\n"{line()}', ":3: malformed CSV (unexpected end of data)"),
        (f'{HEADER}\n"gfx942"x{line()[6:]}\n', ":2: malformed CSV"),
        (f"{HEADER.replace(',us,', ',US,')}\n{line()}\n", ": missing required column 'us'"),
        (f"{HEADER},M\n{line()},1\n", ":1: column 'M' appears twice in the header"),
        (f"{HEADER},\n{line()},\n", ":1: header cell 13 is empty"),
    ],
    ids=[
        "empty",
        "truncated-row",
        "unclosed-quote",
        "text-after-quote",
        "renamed-column",
        "duplicate-column",
        "trailing-comma",
    ],
)
def test_a_damaged_table_names_where(tmp_path, text, message):
    path = tmp_path / A16W16.name
    path.write_text(text)
    with pytest.raises(TableError) as caught:
        load(A16W16, path)
    assert str(caught.value).startswith(f"{path}{message}"), str(caught.value)


def test_invalid_utf8_in_a_kernel_name_is_named(tmp_path):
    path = tmp_path / A16W16.name
    path.write_bytes(f"{HEADER}\n{line()}".encode() + b"\xff\n")
    with pytest.raises(TableError, match=re.escape(f"{path}: not UTF-8 text")):
        load(A16W16, path)


def test_spreadsheet_exports_load(tmp_path):
    """A byte-order mark, CRLF line ends, quoted cells and blank lines are all fine."""
    path = tmp_path / A16W16.name
    rows = [line("9"), "", line().replace("256", '"256.0"'), line("nan").replace("4096", "8192")]
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join([HEADER, *rows, ""]).encode())
    table = load(A16W16, path)
    # The second row (us 10) has the first one's shape (M 256.0 is M 256) and loses to us 9.
    assert [(row.line, row.cells["M"], row.cells["us"]) for row in table.rows] == [
        (2, "256", "9"),
        (5, "256", "nan"),
    ]


def test_duplicate_shapes_keep_the_fastest_and_a_tie_goes_to_the_later_row(tmp_path):
    path = tmp_path / A16W16.name
    rows = [line("5"), line(""), line("nan"), line("5.0"), line("7")]
    path.write_text("\n".join([HEADER, *rows, ""]))
    (row,) = load(A16W16, path).rows
    assert (row.line, row.cells["us"]) == (5, "5.0")
