"""The arch process is told what to do by the ArchProcessSpec the driver writes, read as typed
JSON: it refuses to run without one, or for another arch than FlyDSL targets, and it applies the
spec's --csv tables to its own environment, the way a serving process is configured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aiter.aot.flydsl.jobs.family import Family
from aiter.aot.flydsl.jobs.records import ArchProcessSpec, Mode, from_json, to_json
from aiter.aot.flydsl.replay.arch_process import USAGE, apply_extra_tables, read_spec
from aiter.tuning import BucketAxis, Column, TableSpec
from tests.aot_cli import run_aot

REPLAY = "aiter.aot.flydsl.replay.arch_process"


def _spec(**changes) -> ArchProcessSpec:
    fields = dict(
        modules=["tests.fixtures.axis_family"],
        arch="gfx950",
        cu_num=None,
        mode=Mode.LIST,
        workers=1,
        maxima={"tokens": 64},
        sample=0,
        seed=0,
        timeout=60.0,
    )
    return ArchProcessSpec(**{**fields, **changes})


def _write(spec: ArchProcessSpec, path: Path) -> Path:
    path.write_text(json.dumps(to_json(spec)))
    return path


def test_the_spec_round_trips_through_json(tmp_path) -> None:
    spec = _spec(
        cu_num=256,
        mode=Mode.CHECK,
        sample=4,
        extra_tables={"axis.csv": ["/t/a.csv", "/t/b.csv"]},
        estimates={"scale": 1.5},
        progress_fd=7,
    )
    again = read_spec(str(_write(spec, tmp_path / "spec.json")))
    assert again == spec
    assert type(again.mode) is Mode and again.mode == "check"
    assert from_json(ArchProcessSpec, to_json(_spec())).progress_fd is None


@pytest.mark.parametrize(
    "text", ["", "{}", '{"modules": [], "arch": "gfx942", "mode": "nope"}', "not json"]
)
def test_a_file_that_holds_no_spec_is_refused(tmp_path, text) -> None:
    path = tmp_path / "spec.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{path}: no arch process spec the driver wrote"):
        read_spec(str(path))


@pytest.mark.parametrize(
    "args",
    [(), ("--arch-process", "--module", "m", "--arch", "gfx942"), ("a.json", "b.json"), ("-h",)],
    ids=["none", "old-options", "two", "help"],
)
def test_run_without_the_driver_it_is_a_usage_error(args) -> None:
    proc = run_aot(REPLAY, *args, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == USAGE


def test_a_missing_spec_file_is_a_usage_error(tmp_path) -> None:
    proc = run_aot(REPLAY, str(tmp_path / "nope.json"), timeout=120)
    assert proc.returncode == 2
    assert f"error: {tmp_path / 'nope.json'}: no arch process spec the driver wrote" in proc.stderr
    assert USAGE in proc.stderr


def test_it_refuses_a_process_answering_another_arch(tmp_path) -> None:
    spec = _write(_spec(arch="gfx950"), tmp_path / "spec.json")
    env = {"ARCH": "gfx942", "FLYDSL_GPU_ARCH": "gfx942", "FLYDSL_RUNTIME_CACHE_DIR": str(tmp_path)}
    proc = run_aot(REPLAY, str(spec), env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "replay process for gfx950 finds FlyDSL targeting gfx942" in proc.stderr
    assert not list(tmp_path.glob("*/*.pkl"))  # not one cache entry


COLUMNS = (Column("gfx", "str"), Column("cu_num", "int"), Column("M", "int"))


def _no_call(spec, row, variant):
    return lambda **values: None


def _table(tmp_path: Path, env_var: str) -> TableSpec:
    (tmp_path / "t.csv").write_text("gfx,cu_num,M\ngfx942,304,16\n")
    return TableSpec(
        name="t.csv",
        short_name="t",
        env_var=env_var,
        columns=COLUMNS,
        key=("gfx", "cu_num", "M"),
        axis=BucketAxis("M", "M"),
        directory=tmp_path,
    )


def test_extra_tables_extend_the_tables_variable(tmp_path, monkeypatch) -> None:
    env_var = "AITER_TEST_ARCH_PROCESS_CSV"
    table = _table(tmp_path, env_var)
    (tmp_path / "env.csv").write_text("gfx,cu_num,M\ngfx942,304,32\n")
    (tmp_path / "csv.csv").write_text("gfx,cu_num,M\ngfx950,256,64\n")
    monkeypatch.setenv(env_var, str(tmp_path / "env.csv"))
    extra = [str(tmp_path / "csv.csv")]
    explicit = table.load(extra)  # what the driver reads, without touching its environment
    assert os.environ[env_var] == str(tmp_path / "env.csv")
    assert table.paths(extra) == [str(tmp_path / f) for f in ("t.csv", "env.csv", "csv.csv")]
    family = Family(name="t", tables=(table,), caller=_no_call)
    apply_extra_tables(_spec(extra_tables={"t.csv": extra}), [family])
    # The variable now names its own file, then the --csv file: as a serving process sets it.
    assert os.environ[env_var] == os.pathsep.join([str(tmp_path / "env.csv"), *extra])
    assert (
        table.paths()
        == table.paths([])
        == [str(tmp_path / f) for f in ("t.csv", "env.csv", "csv.csv")]
    )
    assert [dict(r.cells) for r in table.load().rows] == [dict(r.cells) for r in explicit.rows]
    assert {(r["gfx"], r.int("M")) for r in table.load().rows} == {
        ("gfx942", 16),
        ("gfx942", 32),
        ("gfx950", 64),
    }


def test_no_extra_tables_leave_the_environment_alone(tmp_path, monkeypatch) -> None:
    env_var = "AITER_TEST_ARCH_PROCESS_NONE"
    monkeypatch.delenv(env_var, raising=False)
    family = Family(name="t", tables=(_table(tmp_path, env_var),), caller=_no_call)
    before = dict(os.environ)
    apply_extra_tables(_spec(), [family])
    assert dict(os.environ) == before
