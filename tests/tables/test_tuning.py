"""Tests of aiter.tuning: reading, merging, deduplicating and looking up tuned tables.

Every table is a small CSV written under tmp_path; expectations are exact.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from aiter.tuning import Column, Row, TableError, TunedTable, load_table

COLUMNS = (
    Column("cu_num", "int"),
    Column("M", "int"),
    Column("N", "int"),
    Column("K", "int"),
    Column("dtype", "str"),
    Column("splitK", "int"),
    Column("preshuffle", "bool01"),
    Column("us", "optional_float"),
)
KEY = ("cu_num", "M", "N", "K", "dtype")
HEADER = "cu_num,M,N,K,dtype,splitK,preshuffle,us"
ENV = "AITER_TEST_TUNED_CSV"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load(default: str, *extra: str, env_var: str | None = None) -> TunedTable:
    return load_table(default, columns=COLUMNS, key=KEY, env_var=env_var, extra_paths=extra)


def cells(table: TunedTable) -> list[dict[str, str]]:
    return [dict(row.cells) for row in table.rows]


def shape(n: object = 4096, k: object = 1024, dtype: object = "bf16", cu: object = 304):
    return {"cu_num": cu, "N": n, "K": k, "dtype": dtype}


# --- reading and writing as text -------------------------------------------------------


def test_cells_are_kept_as_written_after_strip(tmp_path):
    path = write(
        tmp_path,
        "t.csv",
        f"{HEADER}\n304, 256.0 ,4096,1024, bf16,1,True,1e-3\n304,32,4096,1024,bf16,0,0,\n",
    )
    table = load(path)
    assert table.columns == tuple(HEADER.split(","))
    assert cells(table) == [
        {
            "cu_num": "304",
            "M": "256.0",
            "N": "4096",
            "K": "1024",
            "dtype": "bf16",
            "splitK": "1",
            "preshuffle": "True",
            "us": "1e-3",
        },
        {
            "cu_num": "304",
            "M": "32",
            "N": "4096",
            "K": "1024",
            "dtype": "bf16",
            "splitK": "0",
            "preshuffle": "0",
            "us": "",
        },
    ]
    first = table.rows[0]
    assert (first.source, first.line) == (path, 2)
    assert first.int("M") == 256
    assert type(first.int("M")) is int
    assert first.float("us") == 0.001
    assert table.rows[1].float("us") is None


def test_to_csv_round_trip_keeps_every_cell(tmp_path):
    default = write(
        tmp_path,
        "default.csv",
        f'{HEADER},kernelName\n304,256.0,4096,1024, bf16 ,1,True,1e-3,"a,b"\n'
        f"304,64,4096,1024,bf16,0,0,,k64\n",
    )
    extra = write(tmp_path, "extra.csv", f"{HEADER},note\n304,8,4096,1024,bf16,0,1,2.50,x\n")
    table = load(default, extra)
    out = tmp_path / "out.csv"
    table.to_csv(out)
    assert out.read_text() == (
        f"{HEADER},kernelName,note\n"
        '304,256.0,4096,1024,bf16,1,True,1e-3,"a,b",\n'
        "304,64,4096,1024,bf16,0,0,,k64,\n"
        "304,8,4096,1024,bf16,0,1,2.50,,x\n"
    )
    again = load(str(out))
    assert again.columns == table.columns
    assert cells(again) == cells(table)
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == []


def test_blank_lines_are_skipped_and_line_numbers_stay_physical(tmp_path):
    path = write(tmp_path, "t.csv", f"{HEADER}\n\n304,16,4096,1024,bf16,0,0,\n")
    (row,) = load(path).rows
    assert row.line == 3


# --- dedupe on numeric value ---------------------------------------------------------


def test_256_and_256_0_are_one_shape_and_lowest_us_wins(tmp_path):
    default = write(tmp_path, "d.csv", f"{HEADER}\n304,256,4096,1024,bf16,1,0,10\n")
    extra = write(tmp_path, "e.csv", f"{HEADER}\n304, 256.0 ,4096.0,1024,bf16,2,0,5\n")
    table = load(default, extra)
    (row,) = table.rows
    assert (row.source, row["M"], row["N"], row["splitK"]) == (extra, "256.0", "4096.0", "2")

    slower = write(tmp_path, "slow.csv", f"{HEADER}\n304,2.56e2,4096,1024,bf16,3,0,12\n")
    (row,) = load(default, slower).rows
    assert (row.source, row["splitK"]) == (default, "1")


def test_dtype_is_compared_as_text(tmp_path):
    path = write(
        tmp_path,
        "t.csv",
        f"{HEADER}\n304,256,4096,1024,bf16,1,0,10\n304,256,4096,1024,fp16,2,0,10\n",
    )
    assert [row["dtype"] for row in load(path).rows] == ["bf16", "fp16"]


def test_empty_us_loses_to_any_time(tmp_path):
    timed = write(tmp_path, "timed.csv", f"{HEADER}\n304,256,4096,1024,bf16,1,0,100\n")
    untimed = write(tmp_path, "untimed.csv", f"{HEADER}\n304,256,4096,1024,bf16,2,0,\n")
    assert load(timed, untimed).rows[0]["splitK"] == "1"
    assert load(untimed, timed).rows[0]["splitK"] == "1"


def test_nan_us_loses_to_any_time(tmp_path):
    timed = write(tmp_path, "timed.csv", f"{HEADER}\n304,256,4096,1024,bf16,1,0,100\n")
    failed = write(tmp_path, "failed.csv", f"{HEADER}\n304,256,4096,1024,bf16,2,0,nan\n")
    assert load(timed, failed).rows[0]["splitK"] == "1"
    assert load(failed, timed).rows[0]["splitK"] == "1"


def test_tie_keeps_the_later_files_row_at_the_first_rows_position(tmp_path):
    default = write(
        tmp_path,
        "d.csv",
        f"{HEADER}\n304,256,4096,1024,bf16,1,0,7\n304,512,4096,1024,bf16,1,0,9\n",
    )
    extra = write(tmp_path, "e.csv", f"{HEADER}\n304,256,4096,1024,bf16,4,0,7.0\n")
    table = load(default, extra)
    assert [(row.source, row["M"], row["splitK"]) for row in table.rows] == [
        (extra, "256", "4"),
        (default, "512", "1"),
    ]
    both_empty = write(tmp_path, "x.csv", f"{HEADER}\n304,256,4096,1024,bf16,5,0,\n")
    also_empty = write(tmp_path, "y.csv", f"{HEADER}\n304,256,4096,1024,bf16,6,0,\n")
    assert load(both_empty, also_empty).rows[0]["splitK"] == "6"


# --- merging ---------------------------------------------------------------------------


def test_env_var_files_come_after_default_and_before_extra_paths(tmp_path, monkeypatch):
    default = write(tmp_path, "d.csv", f"{HEADER}\n304,16,4096,1024,bf16,0,0,\n")
    env_a = write(tmp_path, "a.csv", f"{HEADER}\n304,32,4096,1024,bf16,0,0,\n")
    env_b = write(tmp_path, "b.csv", f"{HEADER}\n304,64,4096,1024,bf16,0,0,\n")
    env_c = write(tmp_path, "c.csv", f"{HEADER}\n304,128,4096,1024,bf16,0,0,\n")
    extra = write(tmp_path, "e.csv", f"{HEADER}\n304,256,4096,1024,bf16,0,0,\n")
    monkeypatch.setenv(ENV, f"{env_a}{os.pathsep}{env_b}, {env_c},")
    table = load(default, extra, env_var=ENV)
    assert table.sources == (default, env_a, env_b, env_c, extra)
    assert [row["M"] for row in table.rows] == ["16", "32", "64", "128", "256"]


def test_env_var_row_overrides_default_on_a_tie(tmp_path, monkeypatch):
    default = write(tmp_path, "d.csv", f"{HEADER}\n304,16,4096,1024,bf16,0,0,3\n")
    override = write(tmp_path, "o.csv", f"{HEADER}\n304,16,4096,1024,bf16,8,0,3\n")
    monkeypatch.setenv(ENV, override)
    assert load(default, env_var=ENV).rows[0]["splitK"] == "8"


@pytest.mark.parametrize("value", [None, ""])
def test_unset_or_empty_env_var_adds_nothing(tmp_path, monkeypatch, value):
    default = write(tmp_path, "d.csv", f"{HEADER}\n304,16,4096,1024,bf16,0,0,\n")
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert load(default, env_var=ENV).sources == (default,)


def test_later_files_may_add_columns(tmp_path):
    default = write(tmp_path, "d.csv", f"{HEADER}\n304,16,4096,1024,bf16,0,0,\n")
    extra = write(tmp_path, "e.csv", f"note,{HEADER},bias\nfast,304,32,4096,1024,bf16,0,0,,1\n")
    table = load(default, extra)
    assert table.columns == (*HEADER.split(","), "note", "bias")
    assert [(row["note"], row["bias"]) for row in table.rows] == [("", ""), ("fast", "1")]


def test_a_column_files_may_leave_out_reads_as_empty(tmp_path):
    columns = (*COLUMNS, Column("libtype", "optional_str", choices=("torch",), required=False))
    path = write(tmp_path, "d.csv", f"{HEADER}\n304,16,4096,1024,bf16,0,0,\n")
    table = load_table(path, columns=columns, key=KEY)
    assert [row["libtype"] for row in table.rows] == [""]
    bad = write(tmp_path, "b.csv", f"{HEADER},libtype\n304,16,4096,1024,bf16,0,0,,tensorflow\n")
    with pytest.raises(TableError, match="column 'libtype': expected one of torch"):
        load_table(bad, columns=columns, key=KEY)


def test_a_column_files_may_leave_out_must_have_an_optional_kind():
    with pytest.raises(ValueError, match="needs an optional kind"):
        Column("libtype", "str", required=False)


def test_rows_can_be_excluded_by_cell_text(tmp_path):
    columns = (*COLUMNS, Column("_tag", "optional_str"))
    path = write(
        tmp_path,
        "d.csv",
        f"{HEADER},_tag\n304,16,4096,1024,bf16,0,0,,skip\n304,32,4096,1024,bf16,0,0,,\n",
    )
    table = load_table(path, columns=columns, key=KEY, exclude={"_tag": ("skip",)})
    assert [row["M"] for row in table.rows] == ["32"]


# --- lookup and buckets ----------------------------------------------------------------


@pytest.fixture
def bucketed(tmp_path) -> TunedTable:
    path = write(
        tmp_path,
        "t.csv",
        f"{HEADER}\n"
        "304,256,4096,1024,bf16,4,0,\n"
        "304,16,4096,1024,bf16,1,0,\n"
        "304,64.0,4096,1024,bf16,2,0,\n"
        "304,32,8192,1024,bf16,3,0,\n",
    )
    return load(path)


def test_exact_m_lookup(bucketed):
    assert bucketed.lookup(shape(), 64)["splitK"] == "2"
    assert bucketed.lookup(shape(n=8192), 32)["splitK"] == "3"


def test_bucket_lookup_takes_smallest_tabled_m_at_or_above(bucketed):
    assert bucketed.lookup(shape(), 1)["splitK"] == "1"
    assert bucketed.lookup(shape(), 16)["splitK"] == "1"
    assert bucketed.lookup(shape(), 17)["splitK"] == "2"
    assert bucketed.lookup(shape(), 65)["splitK"] == "4"
    assert bucketed.lookup(shape(), 256)["splitK"] == "4"


def test_m_above_every_tabled_m_is_untuned(bucketed):
    assert bucketed.lookup(shape(), 257) is None
    assert bucketed.lookup(shape(n=8192), 33) is None


def test_unknown_shape_is_untuned(bucketed):
    assert bucketed.lookup(shape(n=2048), 16) is None
    assert bucketed.lookup(shape(dtype="fp16"), 16) is None
    assert bucketed.lookup(shape(cu=80), 16) is None


def test_lookup_values_compare_like_cells(bucketed):
    assert (
        bucketed.lookup(shape(n="4096", k=1024.0, dtype=" bf16", cu="304.0"), 64)["splitK"] == "2"
    )
    assert bucketed.lookup(shape(n=4096.5), 64) is None


def test_lookup_key_errors_name_the_column(bucketed):
    with pytest.raises(ValueError, match="lookup key lacks column 'dtype'"):
        bucketed.lookup({"cu_num": 304, "N": 4096, "K": 1024}, 16)
    with pytest.raises(ValueError, match="lookup key column 'N': expected an integer, found '4k'"):
        bucketed.lookup(shape(n="4k"), 16)


def test_dtype_names_match_torch_dtype_text(tmp_path):
    torch = pytest.importorskip("torch")
    path = write(tmp_path, "t.csv", f"{HEADER}\n304,16,4096,1024,torch.bfloat16,1,0,\n")
    assert load(path).lookup(shape(dtype=torch.bfloat16), 8)["splitK"] == "1"


def test_bucket_of_ranges(bucketed):
    by_split = {row["splitK"]: row for row in bucketed.rows}
    assert bucketed.bucket_of(by_split["1"]) == (1, 16)
    assert bucketed.bucket_of(by_split["2"]) == (17, 64)
    assert bucketed.bucket_of(by_split["4"]) == (65, 256)
    assert bucketed.bucket_of(by_split["3"]) == (1, 32)


def test_bucket_of_a_row_dropped_by_dedupe_is_an_error(tmp_path):
    path = write(
        tmp_path,
        "t.csv",
        f"{HEADER}\n304,16,4096,1024,bf16,1,0,9\n304,16,4096,1024,bf16,2,0,3\n",
    )
    table = load(path)
    (kept,) = table.rows
    dropped = Row(
        {**kept.cells, "splitK": "1", "us": "9"},
        source=path,
        line=2,
    )
    assert table.bucket_of(kept) == (1, 16)
    with pytest.raises(ValueError, match=rf"{re.escape(path)}:2: row is not in this table"):
        table.bucket_of(dropped)


# --- errors ----------------------------------------------------------------------------


def test_missing_default_file(tmp_path):
    path = str(tmp_path / "nope.csv")
    with pytest.raises(TableError) as info:
        load(path)
    assert str(info.value) == f"tuned table {path} not found (asked for by the default table)"


def test_missing_env_var_file(tmp_path, monkeypatch):
    default = write(tmp_path, "d.csv", f"{HEADER}\n")
    missing = str(tmp_path / "gone.csv")
    monkeypatch.setenv(ENV, missing)
    with pytest.raises(TableError) as info:
        load(default, env_var=ENV)
    assert str(info.value) == (
        f"tuned table {missing} not found (asked for by environment variable {ENV})"
    )


def test_missing_extra_file(tmp_path):
    default = write(tmp_path, "d.csv", f"{HEADER}\n")
    missing = str(tmp_path / "gone.csv")
    with pytest.raises(TableError) as info:
        load(default, missing)
    assert str(info.value) == f"tuned table {missing} not found (asked for by --csv)"


def test_missing_required_column_in_any_file(tmp_path):
    default = write(tmp_path, "d.csv", f"{HEADER}\n")
    extra = write(tmp_path, "e.csv", "cu_num,M,N,K,dtype,us\n304,16,4096,1024,bf16,\n")
    with pytest.raises(TableError) as info:
        load(default, extra)
    assert str(info.value) == (
        f"{extra}: missing required column 'splitK'; columns found: cu_num, M, N, K, dtype, us"
    )
    assert (info.value.path, info.value.line, info.value.column) == (extra, 1, "splitK")


@pytest.mark.parametrize(
    ("row", "column", "expected", "found"),
    [
        ("304,16,12x,1024,bf16,0,0,", "N", "an integer", "'12x'"),
        ("304,16,4096,,bf16,0,0,", "K", "an integer", "''"),
        ("304,16.5,4096,1024,bf16,0,0,", "M", "an integer", "'16.5'"),
        ("304,16,4096,1024,,0,0,", "dtype", "non-empty text", "''"),
        ("304,16,4096,1024,bf16,0,2,", "preshuffle", "0/1 or True/False", "'2'"),
        ("304,16,4096,1024,bf16,0,0,fast", "us", "a number or an empty cell", "'fast'"),
    ],
)
def test_bad_cell_names_file_line_column_and_kind(tmp_path, row, column, expected, found):
    path = write(tmp_path, "t.csv", f"{HEADER}\n304,8,4096,1024,bf16,0,0,\n{row}\n")
    with pytest.raises(TableError) as info:
        load(path)
    assert str(info.value) == f"{path}:3: column {column!r}: expected {expected}, found {found}"
    assert (info.value.path, info.value.line, info.value.column) == (path, 3, column)


def test_bad_cell_in_extra_column_is_caught_by_typed_access(tmp_path):
    path = write(tmp_path, "t.csv", f"{HEADER},tiles\n304,8,4096,1024,bf16,0,0,,12x\n")
    (row,) = load(path).rows
    with pytest.raises(
        TableError, match=rf"^{re.escape(path)}:2: column 'tiles': expected an integer"
    ):
        row.int("tiles")
    with pytest.raises(
        TableError, match=rf"^{re.escape(path)}:2: column 'tiles': expected a number or an"
    ):
        row.float("tiles")
    with pytest.raises(KeyError, match="no column 'tile'"):
        row["tile"]


@pytest.mark.parametrize(
    ("row", "found"), [("304,16,4096,1024,bf16,0", 6), ("1,2,3,4,5,6,7,8,9", 9)]
)
def test_wrong_number_of_cells_names_file_and_line(tmp_path, row, found):
    path = write(tmp_path, "t.csv", f"{HEADER}\n304,8,4096,1024,bf16,0,0,\n{row}\n")
    with pytest.raises(TableError) as info:
        load(path)
    assert (
        str(info.value)
        == f"{path}:3: expected 8 cells ({HEADER.replace(',', ', ')}), found {found}"
    )
    assert (info.value.path, info.value.line) == (path, 3)


def test_empty_file_and_bad_header(tmp_path):
    empty = write(tmp_path, "empty.csv", "\n")
    with pytest.raises(TableError, match=rf"^{re.escape(empty)}: empty file, expected a header"):
        load(empty)
    twice = write(tmp_path, "twice.csv", f"{HEADER},M\n")
    with pytest.raises(
        TableError, match=rf"^{re.escape(twice)}:1: column 'M' appears twice in the header"
    ):
        load(twice)


def test_schema_mistakes_are_value_errors(tmp_path):
    path = write(tmp_path, "t.csv", f"{HEADER}\n")
    with pytest.raises(ValueError, match="key column 'tile' is not among the declared columns"):
        load_table(path, columns=COLUMNS, key=(*KEY, "tile"))
    floats = tuple(Column(c.name, "float" if c.name == "M" else c.kind) for c in COLUMNS)
    with pytest.raises(ValueError, match="M column 'M' must be of kind 'int', not 'float'"):
        load_table(path, columns=floats, key=KEY)
    with pytest.raises(ValueError, match="unknown kind 'integer'"):
        Column("M", "integer")


def test_an_unreadable_table_is_a_table_error(tmp_path, monkeypatch):
    from aiter.tuning import csvio

    path = tmp_path / "t.csv"
    path.write_text("gfx,cu_num,M\n")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(csvio, "open", refuse, raising=False)
    with pytest.raises(TableError, match="is not readable: check its permissions"):
        csvio.read_table_file(path, "a test")


@pytest.mark.parametrize(
    "cell, message",
    [
        ("0", "column 'N': expected an integer from 1 to 4096, found '0'"),
        ("8192", "column 'N': expected an integer from 1 to 4096, found '8192'"),
    ],
)
def test_bounds_declared_by_a_column_are_checked_at_load(tmp_path, cell, message):
    path = tmp_path / "t.csv"
    path.write_text(f"gfx,M,N,kernel\ngfx942,1,64,k_1\ngfx942,2,{cell},k_2\n")
    columns = [
        Column("gfx", "str"),
        Column("M", "int", minimum=1),
        Column("N", "int", minimum=1, maximum=4096),
        Column("kernel", "optional_str", pattern=r"k_[0-9]+", pattern_help="k_<n>"),
    ]
    with pytest.raises(TableError) as info:
        load_table(path, columns=columns, key=["gfx", "N", "M"])
    assert str(info.value) == f"{path}:3: {message}"
    assert (info.value.line, info.value.column) == (3, "N")


def test_a_pattern_is_matched_whole_and_an_empty_optional_cell_passes(tmp_path):
    columns = [Column("M", "int"), Column("kernel", "optional_str", pattern=r"k_[0-9]+")]
    good = tmp_path / "good.csv"
    good.write_text("M,kernel\n1,k_1\n2,\n")
    assert len(load_table(good, columns=columns, key=["M"])) == 2
    bad = tmp_path / "bad.csv"
    bad.write_text("M,kernel\n1,k_1x\n")
    with pytest.raises(TableError, match=r"bad.csv:2: column 'kernel': expected text matching"):
        load_table(bad, columns=columns, key=["M"])
