"""The command line's decisions made in-process, without replaying: which table a --csv
extends, which modules --module names, and the usage errors for both."""

from __future__ import annotations

import pytest

from aiter.aot.flydsl import registry
from aiter.aot.flydsl.options import UsageError, assign_csv
from aiter.ops.gemm.table import A8W8_BLOCKSCALE, A8W8_BPRESHUFFLE, A16W16

SPECS = [A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE]


def _csv(tmp_path, columns, name="extra.csv"):
    path = tmp_path / name
    path.write_text(",".join(columns) + "\n")
    return path


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.short_name)
def test_a_bare_path_goes_to_the_one_table_with_its_columns(tmp_path, spec) -> None:
    path = _csv(tmp_path, spec.header)
    assert assign_csv(SPECS, [str(path)]) == {spec: [str(path.resolve())]}


@pytest.mark.parametrize("name", ["gemm_a8w8_blockscale", "a8w8_blockscale_tuned_gemm.csv"])
def test_table_equals_path_names_the_table(tmp_path, name) -> None:
    # bpreshuffle's columns are a superset of blockscale's: the name decides, not the columns
    path = _csv(tmp_path, A8W8_BPRESHUFFLE.header)
    assert assign_csv(SPECS, [f"{name}={path}"]) == {A8W8_BLOCKSCALE: [str(path.resolve())]}


def test_several_files_for_one_table_keep_their_order(tmp_path) -> None:
    first = _csv(tmp_path, A16W16.header, "a.csv")
    second = _csv(tmp_path, A16W16.header, "b.csv")
    items = [f"gemm_a16w16={second}", str(first)]
    assert assign_csv(SPECS, items) == {A16W16: [str(second.resolve()), str(first.resolve())]}


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: str(p), "is a directory, expected a CSV file"),
        (lambda p: str(p / "nope.csv"), "no such file"),
        (lambda p: "gemm_a16w16=", "no path after '='; expected --csv gemm_a16w16=PATH"),
        (lambda p: f"nosuch={_csv(p, A16W16.header)}", "no table named 'nosuch'"),
        (lambda p: f"gemm_a16w16={_csv(p, A8W8_BLOCKSCALE.header)}", "lacks gemm_a16w16's columns"),
        (lambda p: str(_csv(p, ("gfx", "M"))), "fit none of the tables"),
    ],
    ids=["directory", "missing", "no-path", "unknown-table", "lacking", "no-fit"],
)
def test_bad_csv_is_a_usage_error(tmp_path, make, message) -> None:
    with pytest.raises(UsageError, match="^--csv ") as info:
        assign_csv(SPECS, [make(tmp_path)])
    assert message in str(info.value)


def test_a_bare_path_that_fits_no_table_lists_the_choices(tmp_path) -> None:
    path = _csv(tmp_path, ("gfx", "M"))
    with pytest.raises(UsageError) as info:
        assign_csv(SPECS, [str(path)])
    for spec in SPECS:
        assert f"{spec.short_name} ({spec.name})" in str(info.value)


def test_module_answers_to_its_report_name_and_its_import_path() -> None:
    assert registry.select(["gemm"]) == {"gemm": "aiter.aot.flydsl.gemm"}
    assert registry.select(["aiter.aot.flydsl.gemm"]) == {"gemm": "aiter.aot.flydsl.gemm"}
    assert registry.select(None) == registry.registered()


def test_an_unknown_module_lists_the_registered_ones() -> None:
    with pytest.raises(
        ValueError,
        match="--module nope: no such AOT module; registered: conv3d, fmha_fp8, gemm, moe",
    ):
        registry.select(["nope"])


def test_extra_modules_join_the_registry(monkeypatch) -> None:
    monkeypatch.setenv(registry.EXTRA_MODULES_ENV, "tests.fixtures.tag_family")
    assert registry.registered()["tag_family"] == "tests.fixtures.tag_family"
    assert registry.select(["tags"]) == {"tag_family": "tests.fixtures.tag_family"}
