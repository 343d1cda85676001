"""`capture suggest` for every family with a tuned table: a call no row serves records the row
that would serve it as the heuristic did; that row, loaded through the table's env var, serves
the same call with the same kernels and parameters."""

from __future__ import annotations

import csv

import pytest

from aiter import capture, dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl import registry
from aiter.aot.flydsl.capture.cli import suggested_rows
from aiter.aot.flydsl.capture.files import CapturedCall, CaptureRead
from aiter.aot.flydsl.dry_run import dry_run
from aiter.tuning import CONFIG_DIR_ENV

# A point inside a default row's range, per family (a caller's arguments).
POINTS = {
    "gemm": lambda row: {"M": 300},
    "moe": lambda row: {"tokens": 300},
    "conv3d": lambda row: {"frames": row.int("D")},
    "chunk_gdn_h": lambda row: {"seqs": row.int("N"), "tokens": row.int("T_flat")},
}


def _served(family, spec, row, point) -> list[dispatch.DispatchRecord]:
    """The records of the spec's table serving the caller of `row` at `point`, on gfx942."""
    variant = family.variants_of(spec, row)[0]
    with dispatch.observe() as records, dry_run("gfx942", 304, bridge.MODE_NAME):
        family.caller(spec, row, variant)(**point)
    return [r for r in records if r.table == spec.short_name]


def _choice(record: dispatch.DispatchRecord) -> tuple:
    """What a record says was launched (how the row was found aside)."""
    return record.kernel, {k: v for k, v in record.params.items() if k != "match"}


def _empty_tables(family, directory) -> None:
    """Header-only copies of the family's default tables: every call is untuned."""
    for spec in family.tables:
        (directory / spec.name).write_text(",".join(spec.header) + "\n")


@pytest.mark.parametrize("name", sorted(POINTS))
def test_a_suggested_row_serves_the_untuned_call_as_the_heuristic_did(
    name, tmp_path, monkeypatch
) -> None:
    family = registry.load(registry.MODULES[name])
    spec = family.tables[0]
    row = next(r for r in spec.load().rows if r["gfx"] == "gfx942")
    point = POINTS[name](row)
    defaults = tmp_path / "defaults"
    defaults.mkdir()
    _empty_tables(family, defaults)
    monkeypatch.setenv(CONFIG_DIR_ENV, str(defaults))
    monkeypatch.delenv(spec.env_var, raising=False)

    untuned = _served(family, spec, row, point)
    assert untuned and all(r.source == "heuristic" and r.table_row for r in untuned), untuned
    call = CapturedCall(name, "gfx942", 304, [], {}, "c.jsonl:1", capture._served(untuned))
    tables = suggested_rows(CaptureRead(calls=[call, call]))  # one row however often called
    header, rows = tables[spec.short_name]
    assert header == list(spec.header) and len(rows) == 1

    suggested = tmp_path / spec.name
    with suggested.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    monkeypatch.setenv(spec.env_var, spec.env_value([str(suggested)]))
    tuned = _served(family, spec, row, point)
    assert [r.row for r in tuned] == [f"{suggested}:2"] * len(untuned)
    assert [_choice(r) for r in tuned] == [_choice(r) for r in untuned]
    assert all(r.table_row is None for r in tuned)


@pytest.mark.parametrize("name", sorted(POINTS))
def test_a_call_a_row_serves_suggests_nothing(name) -> None:
    family = registry.load(registry.MODULES[name])
    spec = family.tables[0]
    row = next(r for r in spec.load().rows if r["gfx"] == "gfx942")
    tabled = _served(family, spec, row, POINTS[name](row))
    assert tabled and all(r.row for r in tabled)
    call = CapturedCall(name, "gfx942", 304, [], {}, "c.jsonl:1", capture._served(tabled))
    assert suggested_rows(CaptureRead(calls=[call])) == {}
