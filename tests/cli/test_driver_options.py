"""The command line's decisions made in-process, without replaying: which table a --csv
extends (and which of aiter's tables no family here reads), which modules --module names, the
usage errors for both, and that --csv reaches the replay as data of the Build (and its
fingerprint), never as a change of the driver's environment.
"""

from __future__ import annotations

import os

import pytest

from aiter.aot.flydsl import gemm, registry
from aiter.aot.flydsl.execution.options import UsageError, assign_csv, parse
from aiter.ops.gemm.table import (
    A4W4,
    A8W8_BLOCKSCALE,
    A8W8_BLOCKSCALE_BPRESHUFFLE,
    A8W8_BPRESHUFFLE,
    A16W16,
)

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
        match="--module nope: no such AOT module; registered: chunk_gdn_h, conv3d, fmha_fp8, gemm, moe",
    ):
        registry.select(["nope"])


def test_extra_modules_join_the_registry(monkeypatch) -> None:
    monkeypatch.setenv(registry.EXTRA_MODULES_ENV, "tests.fixtures.tag_family")
    assert registry.registered()["tag_family"] == "tests.fixtures.tag_family"
    assert registry.select(["tags"]) == {"tag_family": "tests.fixtures.tag_family"}


@pytest.mark.parametrize("extra", ["a.tag_family,b.tag_family", "mine.gemm"])
def test_extra_modules_of_one_name_are_a_usage_error(monkeypatch, extra) -> None:
    monkeypatch.setenv(registry.EXTRA_MODULES_ENV, extra)
    with pytest.raises(ValueError, match=f"{registry.EXTRA_MODULES_ENV}: .* are both AOT module"):
        registry.registered()
    with pytest.raises(UsageError, match="are both AOT module"):
        parse(None, [])


def test_an_extra_module_named_twice_is_one_module(monkeypatch) -> None:
    monkeypatch.setenv(
        registry.EXTRA_MODULES_ENV, "tests.fixtures.tag_family,tests.fixtures.tag_family"
    )
    assert registry.registered()["tag_family"] == "tests.fixtures.tag_family"


# --- --csv is data of the Build, never a change of the driver's environment ---

MODULE_SOURCE = """
from pathlib import Path

from aiter.aot.flydsl.jobs.family import Family
from aiter.tuning import BucketAxis, Column, TableSpec

TABLE = TableSpec(
    name="opt.csv",
    short_name="opt",
    env_var="AITER_TEST_OPTIONS_CSV",
    columns=(Column("gfx", "str"), Column("cu_num", "int"), Column("M", "int")),
    key=("gfx", "cu_num", "M"),
    axis=BucketAxis("M", "M"),
    directory=Path(__file__).parent,
)
FAMILY = Family(name="opt", tables=(TABLE,), caller=lambda spec, row, variant: None)
"""
ENV_VAR = "AITER_TEST_OPTIONS_CSV"
HEADER = "gfx,cu_num,M\n"


@pytest.fixture
def csv_module(tmp_path, monkeypatch, request):
    """An AOT module (its import path) whose default table holds gfx942 rows only, an extra
    table its variable names, and a --csv file that adds gfx950."""
    name = f"options_csv_module_{abs(hash(request.node.name))}"
    (tmp_path / f"{name}.py").write_text(MODULE_SOURCE)
    (tmp_path / "opt.csv").write_text(HEADER + "gfx942,304,16\n")
    (tmp_path / "env.csv").write_text(HEADER + "gfx942,304,32\n")
    (tmp_path / "mine.csv").write_text(HEADER + "gfx950,256,64\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env.csv"))
    monkeypatch.delenv("GPU_ARCHS", raising=False)
    return name


def test_csv_extends_the_build_not_the_environment(csv_module, tmp_path, capsys) -> None:
    from aiter.aot.flydsl.execution.options import parse
    from aiter.aot.flydsl.jobs.records import Mode

    before = dict(os.environ)
    mine = str(tmp_path / "mine.csv")
    argv = ["--list", "--csv", f"opt={mine}", "--cache-dir", str(tmp_path / "cache")]
    build = parse([csv_module], argv)
    assert dict(os.environ) == before
    assert build.mode is Mode.LIST
    assert build.extra_tables == {"opt.csv": [mine]}
    assert capsys.readouterr().err == f"--csv: {mine} extend opt.csv\n"
    # The archs come from the tables merged with the --csv file: gfx950 is only in it.
    assert [str(t) for t in build.targets] == ["gfx942", "gfx950"]
    (spec,) = build.specs()
    assert spec.paths(build.extra_paths(spec)) == [
        str(tmp_path / f) for f in ("opt.csv", "env.csv", "mine.csv")
    ]
    # What the arch processes set, and a serving process sets the same way.
    env_csv = str(tmp_path / "env.csv")
    assert build.table_env() == {ENV_VAR: os.pathsep.join([env_csv, mine])}


def test_without_csv_the_targets_are_the_tables_own(csv_module, tmp_path) -> None:
    from aiter.aot.flydsl.execution.options import parse

    build = parse([csv_module], ["--list", "--cache-dir", str(tmp_path / "cache")])
    assert build.extra_tables == {} and build.table_env() == {}
    assert [str(t) for t in build.targets] == ["gfx942"]


def test_the_fingerprint_covers_the_csv_file(csv_module, tmp_path) -> None:
    from aiter.aot.flydsl.execution import memo
    from aiter.aot.flydsl.execution.options import parse

    mine = tmp_path / "mine.csv"
    argv = ["--csv", f"opt={mine}", "--cache-dir", str(tmp_path / "cache")]
    build = parse([csv_module], argv)
    before, inputs = memo.fingerprint(build)
    assert inputs["tables"][-1] == str(mine)
    assert inputs["env"][ENV_VAR] == os.pathsep.join([str(tmp_path / "env.csv"), str(mine)])
    assert memo.fingerprint(build)[0] == before
    mine.write_text(HEADER + "gfx950,256,65\n")
    assert memo.fingerprint(build)[0] != before
    without = parse([csv_module], ["--cache-dir", str(tmp_path / "cache")])
    assert memo.fingerprint(without)[0] != before


A4W4_HEADER = ("gfx", "cu_num", "M", "N", "K", "kernelId", "splitK", "us", "kernelName")
BATCHED_HEADER = ("gfx", "cu_num", "B", "M", "N", "K", "kernelId", "splitK", "us", "kernelName")
MOE_HEADER = ("gfx", "cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "kernelName1")


@pytest.mark.parametrize(
    "name, columns, reason",
    [
        ("tuned_grouped_fmoe.csv", MOE_HEADER, "no family here serves grouped MoE yet"),
        ("tuned_fhmoe.csv", MOE_HEADER, "aiter's fused heterogeneous MoE"),
        ("a8w8_tuned_batched_gemm.csv", BATCHED_HEADER, "no family here serves batched GEMM"),
        ("bf16_tuned_batched_gemm.csv", BATCHED_HEADER, "no family here serves batched GEMM"),
        # the columns of a table here do not make it one: the name says what it computes
        (
            "batched_gemm_a8w8_blockscale_mxscale_tuned.csv",
            A8W8_BLOCKSCALE.header,
            "no family here serves batched GEMM",
        ),
    ],
    ids=["grouped-fmoe", "fhmoe", "a8w8-batched", "bf16-batched", "mxscale-gemm-columns"],
)
def test_a_bare_path_of_an_aiter_table_no_family_serves_says_so(
    tmp_path, name, columns, reason
) -> None:
    path = _csv(tmp_path, columns, name)
    specs = list(gemm.FAMILY.tables)
    with pytest.raises(UsageError) as info:
        assign_csv(specs, [str(path)])
    message = str(info.value)
    assert message.startswith(f"--csv {path}: not served by this library: "), message
    assert reason in message
    assert "TABLE=" not in message  # naming a table would not help


def test_aiter_names_of_tables_served_here_are_not_taken_for_unserved_ones(tmp_path) -> None:
    specs = list(gemm.FAMILY.tables)
    blockscale = _csv(tmp_path, A8W8_BLOCKSCALE.header, "dsv4_a8w8_blockscale_tuned_gemm.csv")
    preshuffled = _csv(
        tmp_path, A8W8_BLOCKSCALE.header, "glm5_a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
    )
    a4w4 = _csv(tmp_path, A4W4_HEADER, "kimik3_a4w4_blockscale_tuned_gemm.csv")
    assert assign_csv(specs, [str(blockscale), str(preshuffled), str(a4w4)]) == {
        A8W8_BLOCKSCALE: [str(blockscale.resolve())],
        A8W8_BLOCKSCALE_BPRESHUFFLE: [str(preshuffled.resolve())],
        A4W4: [str(a4w4.resolve())],
    }
