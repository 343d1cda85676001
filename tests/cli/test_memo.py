"""The build memo: a rebuild whose fingerprint the cache holds replays nothing, and any change of
a fingerprint input, --no-memo or a damaged cache entry makes it replay (and restore the entry).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from aiter.aot.flydsl.execution import fingerprint
from aiter.flydsl_bridge import manifest
from tests.aot_cli import REPO, lines_starting, read_report, run_aot, run_aot_together

pytestmark = pytest.mark.slow  # builds a cache

MODULE = "tests.fixtures.axis_family"
TABLE = "gfx,cu_num,tokens,experts\ngfx942,304,512,8\n"
BUILD_KEY = manifest.build_key(["axis"], ["gfx942"])
# A value of one of FlyDSL's cache-key variables other than the one this process runs with.
OPT_LEVEL = "2" if os.environ.get("FLYDSL_COMPILE_OPT_LEVEL") == "3" else "3"


def _build(cache: Path, env: dict[str, str], *args: str):
    return MODULE, ["--cache-dir", str(cache), "-j", "2", *args], env


def _replayed(proc) -> bool:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replaying = "replaying axis for gfx942 (build" in proc.stderr
    assert replaying != ("up to date" in proc.stdout), proc.stdout + proc.stderr
    return replaying


def _entries(cache: Path) -> dict[str, manifest.KernelEntry]:
    """The manifest's entries of the axis module (for gfx942)."""
    return manifest.read(cache).archs["gfx942"]["axis"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Two identical builds: one whose copies the rebuilds start from, one whose table changes."""
    work = tmp_path_factory.mktemp("memo")
    setups = {}
    for name in ("main", "table"):
        tables = work / f"tables-{name}"
        tables.mkdir()
        (tables / "axis.csv").write_text(TABLE)
        env = {"AITER_TEST_AXIS_DIR": str(tables), "GPU_ARCHS": "gfx942"}
        setups[name] = (work / f"cache-{name}", env, tables / "axis.csv")
    procs = run_aot_together([_build(cache, env) for cache, env, _ in setups.values()])
    for proc in procs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return work, setups


@pytest.fixture(scope="module")
def rebuilds(base):
    """Every rebuild side by side, each over its own copy of the built cache."""
    work, setups = base
    cache, env, _ = setups["main"]
    victim = sorted(_entries(cache))[0]
    caches, problems = {}, {}
    for name in ("unchanged", "aiter_env", "flydsl_env", "no_memo", "corrupt", "deleted"):
        caches[name] = work / f"cache-{name}"
        shutil.copytree(cache, caches[name])
    entry = caches["corrupt"] / victim
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    (caches["deleted"] / victim).unlink()
    for name in ("corrupt", "deleted"):
        problems[name] = manifest.entry_problem(
            caches[name], "gfx942", victim, _entries(cache)[victim]
        )
    table_cache, table_env, table = setups["table"]
    table.write_text(TABLE.replace(",8\n", ",9\n"))  # one byte: experts 8 -> 9
    # The unchanged rebuild runs alone, so its time is its own.
    module, args, _ = _build(caches["unchanged"], env, "--report", str(work / "unchanged.json"))
    start = time.perf_counter()
    unchanged = run_aot(module, *args, env=env)
    seconds = time.perf_counter() - start
    runs = {
        "aiter_env": _build(caches["aiter_env"], {**env, "AITER_TEST_MEMO_NOTE": "1"}),
        "flydsl_env": _build(caches["flydsl_env"], {**env, "FLYDSL_COMPILE_OPT_LEVEL": OPT_LEVEL}),
        "no_memo": _build(
            caches["no_memo"], env, "--no-memo", "--report", str(work / "no_memo.json")
        ),
        "corrupt": _build(caches["corrupt"], env),
        "deleted": _build(caches["deleted"], env),
        "table": _build(table_cache, table_env),
    }
    procs = dict(zip(runs, run_aot_together(list(runs.values())), strict=True))
    procs["unchanged"] = unchanged
    return {
        "procs": procs,
        "caches": caches,
        "victim": victim,
        "problems": problems,
        "work": work,
        "unchanged_seconds": seconds,
    }


def test_an_unchanged_rebuild_replays_nothing(rebuilds):
    proc = rebuilds["procs"]["unchanged"]
    assert not _replayed(proc)
    count = len(_entries(rebuilds["caches"]["unchanged"]))
    assert f"up to date: the fingerprint matches and all {count} kernels of axis" in proc.stdout
    assert "nothing replayed" in proc.stdout
    assert not lines_starting(proc.stderr, "[gfx942]"), proc.stderr  # not even a progress line
    # The report says so, and holds no replay.
    document = json.loads((rebuilds["work"] / "unchanged.json").read_text())
    assert document["up_to_date"] is True and document["archs"] == []
    # Deciding that needs neither torch nor FlyDSL: far below what starting a replay costs.
    assert rebuilds["unchanged_seconds"] < 5, rebuilds["unchanged_seconds"]


def test_one_byte_of_the_table_makes_it_replay(rebuilds):
    proc = rebuilds["procs"]["table"]
    assert _replayed(proc)
    assert "memo: no build with this fingerprint in the cache; replaying" in proc.stderr


def test_an_aiter_variable_makes_it_replay(rebuilds):
    proc = rebuilds["procs"]["aiter_env"]
    assert _replayed(proc)
    assert "memo: no build with this fingerprint in the cache; replaying" in proc.stderr


def test_a_flydsl_cache_key_variable_makes_it_replay(rebuilds):
    proc = rebuilds["procs"]["flydsl_env"]
    assert _replayed(proc)
    assert "memo: no build with this fingerprint in the cache; replaying" in proc.stderr
    # FlyDSL keys its entries on the variable too: the replay compiled entries of its own.
    before = set(_entries(rebuilds["caches"]["unchanged"]))
    assert set(_entries(rebuilds["caches"]["flydsl_env"])).isdisjoint(before)


def test_no_memo_forces_a_replay(rebuilds):
    proc = rebuilds["procs"]["no_memo"]
    assert _replayed(proc)
    assert not lines_starting(proc.stderr, "memo:")
    (report,) = read_report(rebuilds["work"] / "no_memo.json")
    assert report.results and not report.compiled()  # every kernel was there already


def test_a_deleted_entry_is_replayed_and_restored(rebuilds):
    victim, cache = rebuilds["victim"], rebuilds["caches"]["deleted"]
    assert rebuilds["problems"]["deleted"] == "missing"
    proc = rebuilds["procs"]["deleted"]
    assert _replayed(proc)
    assert f"memo: 1 entries not as built ({victim}: missing); replaying" in proc.stderr
    assert manifest.entry_problem(cache, "gfx942", victim, _entries(cache)[victim]) is None


def test_a_corrupted_entry_is_replayed_and_restored(rebuilds):
    victim, cache = rebuilds["victim"], rebuilds["caches"]["corrupt"]
    assert rebuilds["problems"]["corrupt"].startswith("changed since the build")
    proc = rebuilds["procs"]["corrupt"]
    assert _replayed(proc)
    assert f"memo: 1 entries not as built ({victim}: changed since the build" in proc.stderr
    assert manifest.entry_problem(cache, "gfx942", victim, _entries(cache)[victim]) is None


def test_entry_problem_names_what_is_wrong(base, tmp_path):
    work, setups = base
    cache = setups["main"][0]
    entries = _entries(cache)
    assert entries and all(
        manifest.entry_problem(cache, "gfx942", r, e) is None for r, e in entries.items()
    )
    rel, entry = sorted(entries.items())[0]
    wrong_arch = manifest.entry_problem(cache, "gfx950", rel, entry)
    assert wrong_arch == "holds code objects for ['gfx942'], expected gfx950"
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    (copy / rel).write_bytes((copy / rel).read_bytes() + b"\0")
    assert manifest.entry_problem(copy, "gfx942", rel, entry).startswith("changed since the build")
    (copy / rel).unlink()
    assert manifest.entry_problem(copy, "gfx942", rel, entry) == "missing"


def _recorded_inputs(cache: Path) -> tuple[str, fingerprint.FingerprintInputs]:
    """The fingerprint the build recorded, and its inputs rebuilt from the manifest."""
    recorded = manifest.read(cache).builds[BUILD_KEY]
    described = recorded.inputs

    def path(shown: str) -> str:
        return shown if os.path.isabs(shown) else str(REPO / shown)

    inputs = fingerprint.FingerprintInputs(
        sources=tuple(path(p) for p in described["sources"]),
        tables=tuple(path(p) for p in described["tables"]),
        env=tuple(sorted(described["env"].items())),
        versions=tuple(sorted(described["versions"].items())),
        targets=tuple(described["targets"]),
        options=tuple(sorted(described["options"].items())),
    )
    return recorded.fingerprint, inputs


def test_the_fingerprint_covers_aiter_sources_and_the_module(base):
    _, setups = base
    recorded, inputs = _recorded_inputs(setups["main"][0])
    described = manifest.read(setups["main"][0]).builds[BUILD_KEY].inputs
    assert "aiter/aot/flydsl/replay/arch_process.py" in described["sources"]
    assert "tests/fixtures/axis_family.py" in described["sources"]
    assert ("FLYDSL_COMPILE_OPT_LEVEL", os.environ.get("FLYDSL_COMPILE_OPT_LEVEL", "")) in (
        inputs.env
    )
    # The recorded inputs give the recorded fingerprint back: nothing else enters it.
    assert fingerprint.compute(inputs) == recorded


def test_one_byte_of_a_source_file_changes_the_fingerprint(base, tmp_path):
    _, setups = base
    _, inputs = _recorded_inputs(setups["main"][0])
    original = REPO / "aiter" / "aot" / "flydsl" / "jobs" / "family.py"
    copy = tmp_path / "family.py"
    shutil.copyfile(original, copy)
    sources = tuple(str(copy) if p == str(original) else p for p in inputs.sources)
    assert str(copy) in sources
    with_copy = dataclasses.replace(inputs, sources=sources)
    before = fingerprint.compute(with_copy)
    data = bytearray(copy.read_bytes())
    data[-2] ^= 0x01
    copy.write_bytes(bytes(data))
    assert fingerprint.compute(with_copy) != before


def test_another_flydsl_version_misses_the_memo(base):
    _, setups = base
    cache = setups["main"][0]
    recorded, inputs = _recorded_inputs(cache)
    versions = dict(inputs.versions)
    assert versions["flydsl"] not in ("", "missing")
    other = dataclasses.replace(
        inputs, versions=tuple(sorted({**versions, "flydsl": versions["flydsl"] + ".1"}.items()))
    )
    other_fingerprint = fingerprint.compute(other)
    assert other_fingerprint != recorded
    built = manifest.read(cache)
    listed = built.build_entries(["axis"], ["gfx942"], recorded)
    assert listed == {"gfx942": _entries(cache)}
    assert built.build_entries(["axis"], ["gfx942"], other_fingerprint) is None
