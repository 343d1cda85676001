"""The manifest: one typed schema with one reader and one writer. A process reads an unchanged
manifest once and sees a rewrite; updates under a lock keep every arch's and module's part; an
unreadable one is started anew, an older format reads as empty; nothing else parses the file."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aiter.flydsl_bridge import manifest
from aiter.flydsl_bridge.entries import file_digest
from aiter.flydsl_bridge.manifest import BuildRecord, KernelEntry, Manifest, Requester
from aiter.typed_json import from_json, to_json

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch):
    """Each test starts with a process that has read no manifest."""
    monkeypatch.setattr(manifest, "_read_before", {})


def _entry(function: str = "gemm_a16w16", seconds: float = 0.0, **kw) -> KernelEntry:
    asked = Requester("gemm", "bf16_tuned_gemm.csv", "/t/bf16_tuned_gemm.csv:2", "M", 1, 32)
    return KernelEntry(
        function=function,
        params=kw.pop("params", "tile_m=32 split_k=1"),
        size=kw.pop("size", 10),
        sha256=kw.pop("sha256", "ab" * 32),
        compile_seconds=seconds,
        requested_by=kw.pop("requested_by", [asked]),
    )


def _write_raw(cache: Path, data: object) -> None:
    """The file as another writer (or a hand edit) leaves it, replaced as the writer does."""
    tmp = cache / "raw.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, manifest.manifest_path(cache))


def _count_loads(monkeypatch) -> list[int]:
    calls = [0]
    real = json.loads

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(manifest.json, "loads", counting)
    return calls


# --- the schema ---


def test_the_typed_schema_round_trips_through_the_file(tmp_path):
    grid = Requester("fmha_fp8", "grid", "b=1", "seqlen_q", 1, 64, {"batch": 1}, "causal=1")
    one = _entry(seconds=1.5, requested_by=[_entry().requested_by[0], grid])
    two = _entry("moe_stage1", params="ksplit=2", size=7)
    manifest.update_manifest(tmp_path, "gfx942", "gemm", {"k_1/one.pkl": one}, {"flydsl": "1"})
    manifest.update_manifest(tmp_path, "gfx950", "moe", {"k_2/two.pkl": two}, {"flydsl": "1"})
    inputs = {"sources": ["aiter/x.py"], "env": {"A": "1"}}
    manifest.record_build(tmp_path, ["moe", "gemm"], ["gfx950", "gfx942"], ["gfx942"], "fp", inputs)
    expected = Manifest(
        versions={"flydsl": "1"},
        archs={"gfx942": {"gemm": {"k_1/one.pkl": one}}, "gfx950": {"moe": {"k_2/two.pkl": two}}},
        builds={
            "gemm,moe|gfx942": BuildRecord(
                "fp", ["gemm", "moe"], ["gfx942", "gfx950"], inputs, targets=["gfx942"]
            )
        },
    )
    manifest._read_before.clear()  # read back from the file, not from what this process wrote
    assert manifest.read(tmp_path) == expected
    # The file stays plain, readable JSON of the same layout.
    data = json.loads(manifest.manifest_path(tmp_path).read_text())
    assert data["format"] == manifest.FORMAT == 3
    record = data["archs"]["gfx942"]["gemm"]["k_1/one.pkl"]
    assert record["requested_by"][1] == {
        "module": "fmha_fp8",
        "table": "grid",
        "row": "b=1",
        "axis": "seqlen_q",
        "lo": 1,
        "hi": 64,
        "fixed": {"batch": 1},
        "variant": "causal=1",
    }
    assert from_json(Manifest, json.loads(json.dumps(to_json(expected)))) == expected


def test_the_queries_of_the_callers(tmp_path):
    fast, slow, untimed = _entry(seconds=1.0), _entry(seconds=3.0), _entry("other")
    m = Manifest(
        archs={
            "gfx942": {"gemm": {"a/1.pkl": fast}, "moe": {"b/2.pkl": untimed}},
            "gfx950": {"gemm": {"c/3.pkl": slow}},
        },
        builds={
            manifest.build_key(["gemm"], ["gfx942"]): BuildRecord("fp", ["gemm"], ["gfx942"]),
            manifest.build_key(["moe"], ["gfx950"]): BuildRecord("fp", ["moe"], ["gfx950"]),
        },
    )
    assert m.entries("gfx942") == {"a/1.pkl": fast, "b/2.pkl": untimed}
    assert m.entries("gfx1250") == {}
    assert set(m.entries()) == {"a/1.pkl", "b/2.pkl", "c/3.pkl"}
    # An untimed entry does not pull its function's estimate down to zero.
    assert m.mean_compile_seconds() == {"gemm_a16w16": 2.0}
    assert m.compile_seconds("gfx942") == {"a/1.pkl": 1.0, "b/2.pkl": 0.0}
    assert m.build_entries(["gemm"], ["gfx942"], "fp") == {"gfx942": {"a/1.pkl": fast}}
    assert m.build_entries(["gemm"], ["gfx942"], "another") is None
    assert m.build_entries(["gemm"], ["gfx950"], "fp") is None  # no such build
    assert m.build_entries(["moe"], ["gfx950"], "fp") is None  # it listed entries now gone


def test_an_entry_is_judged_by_its_recorded_bytes(tmp_path):
    path = tmp_path / "k_1" / "one.pkl"
    path.parent.mkdir()
    path.write_bytes(b"entry")
    size, digest = file_digest(path)
    entry = _entry(size=size, sha256=digest)
    assert entry.mismatch(path) is None
    path.write_bytes(b"entry!")
    assert entry.mismatch(path) == "changed since the build that listed it (size 6, recorded 5)"
    assert manifest.entry_problem(tmp_path, "gfx942", "k_1/one.pkl", entry).startswith("changed")
    assert manifest.entry_problem(tmp_path, "gfx942", "k_1/two.pkl", entry) == "missing"


# --- the one reader ---


def test_a_process_reads_an_unchanged_manifest_once_and_sees_a_rewrite(tmp_path, monkeypatch):
    loads = _count_loads(monkeypatch)
    manifest.update_manifest(tmp_path, "gfx942", "gemm", {"a/1.pkl": _entry()}, {})
    assert loads[0] == 0  # the writer reads the file anew under its lock (there was none) ...
    first = manifest.read(tmp_path)
    assert loads[0] == 0  # ... and this process need not read back what it wrote
    assert manifest.read(tmp_path) is first and manifest.read(str(tmp_path)) is first
    assert loads[0] == 0

    # Another builder rewrites it: the next read sees its part.
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_update_many, args=(str(tmp_path), "gfx950", 1))
    child.start()
    child.join()
    assert child.exitcode == 0
    again = manifest.read(tmp_path)
    assert loads[0] == 1 and sorted(again.archs) == ["gfx942", "gfx950"]
    assert manifest.read(tmp_path) is again and loads[0] == 1

    # Even a rewrite of the same size and mtime is seen: every write replaces the file.
    path = manifest.manifest_path(tmp_path)
    text = path.read_text()
    before = path.stat()
    changed = text.replace('"gemm_a16w16"', '"gemm_a16w61"')
    assert len(changed) == len(text) and changed != text
    new = tmp_path / "new.tmp"
    new.write_text(changed)
    os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(new, path)
    assert path.stat().st_size == before.st_size
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert manifest.read(tmp_path).entries("gfx942")["a/1.pkl"].function == "gemm_a16w61"
    assert loads[0] == 2


def test_no_manifest_reads_as_empty(tmp_path):
    assert manifest.read(tmp_path) == Manifest()
    assert manifest.read(tmp_path / "absent") == Manifest()
    manifest.manifest_path(tmp_path).mkdir()
    assert manifest.read(tmp_path) == Manifest()


def test_an_older_format_reads_as_empty_and_is_rewritten(tmp_path):
    old = {
        "format": 2,
        "versions": {"flydsl": "0.1"},
        "archs": {"gfx942": {"gemm": {"a/1.pkl": {"function": "f", "params": "", "size": 1}}}},
        "builds": {"gemm|gfx942": {"fingerprint": "fp", "modules": ["gemm"], "archs": []}},
    }
    _write_raw(tmp_path, old)
    assert manifest.read(tmp_path) == Manifest()
    manifest.update_manifest(tmp_path, "gfx950", "moe", {"b/2.pkl": _entry()}, {"flydsl": "0.2"})
    manifest._read_before.clear()
    assert manifest.read(tmp_path) == Manifest(
        versions={"flydsl": "0.2"}, archs={"gfx950": {"moe": {"b/2.pkl": _entry()}}}
    )


@pytest.mark.parametrize(
    "text",
    [
        "{ not json",
        b"\xff\xfe{}",
        json.dumps({"format": 3, "archs": [], "builds": {}}),
        json.dumps({"format": 3, "archs": {"gfx942": {"gemm": {"a/1.pkl": {"size": 1}}}}}),
    ],
    ids=["not-json", "not-utf8", "archs-a-list", "entry-without-fields"],
)
def test_an_unreadable_manifest_names_the_file_and_the_fix(tmp_path, text):
    path = manifest.manifest_path(tmp_path)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match="not a valid aiter manifest") as err:
        manifest.read(tmp_path)
    assert str(err.value).startswith(f"{path}: ") and "delete it to rebuild" in str(err.value)


def test_an_unreadable_manifest_is_started_anew(tmp_path, capsys):
    (tmp_path / manifest.MANIFEST_NAME).write_text("{ not json")
    with pytest.raises(ValueError, match="not a valid aiter manifest"):
        manifest.read(tmp_path)
    manifest.update_manifest(tmp_path, "gfx942", "gemm", {"a/b.pkl": _entry()}, {"aiter": "x"})
    assert "writing a new manifest" in capsys.readouterr().err
    assert manifest.read(tmp_path).archs == {"gfx942": {"gemm": {"a/b.pkl": _entry()}}}


# --- the one writer ---


def test_an_update_keeps_other_parts_and_drops_builds_it_invalidates(tmp_path):
    for arch in ("gfx942", "gfx950"):
        for module in ("gemm", "moe"):
            manifest.update_manifest(tmp_path, arch, module, {f"{arch}/{module}": _entry()}, {})
    for arch in ("gfx942", "gfx950"):
        for module in ("gemm", "moe"):
            manifest.record_build(tmp_path, [module], [arch], [arch], "fp", {})
    manifest.record_build(tmp_path, ["gemm", "moe"], ["gfx942"], ["gfx942"], "fp", {})
    manifest.update_manifest(tmp_path, "gfx942", "gemm", {"gfx942/new": _entry("new")}, {})
    m = manifest.read(tmp_path)
    assert m.entries("gfx942") == {"gfx942/new": _entry("new"), "gfx942/moe": _entry()}
    assert set(m.entries("gfx950")) == {"gfx950/gemm", "gfx950/moe"}
    assert sorted(m.builds) == ["gemm|gfx950", "moe|gfx942", "moe|gfx950"]


def test_what_a_process_is_handed_is_not_the_writers_objects(tmp_path):
    kernels = {"a/1.pkl": _entry()}
    manifest.update_manifest(tmp_path, "gfx942", "gemm", kernels, {})
    kernels["a/1.pkl"].requested_by.clear()  # the caller's objects stay the caller's
    assert manifest.read(tmp_path).entries("gfx942")["a/1.pkl"] == _entry()


def _update_many(cache_dir: str, arch: str, count: int = 20) -> None:
    for i in range(count):
        manifest.update_manifest(cache_dir, arch, f"m{i % 3}", {f"{arch}/{i}.pkl": _entry()}, {})


def test_concurrent_manifest_updates_keep_every_part(tmp_path):
    archs = [f"gfx{n}" for n in range(6)]
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_update_many, args=(str(tmp_path), a)) for a in archs]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    assert all(p.exitcode == 0 for p in processes)
    data = manifest.read(tmp_path)
    assert sorted(data.archs) == archs
    assert all(sorted(data.archs[a]) == ["m0", "m1", "m2"] for a in archs)


# --- nothing else parses it ---


def _sources() -> list[Path]:
    return [
        path
        for top in ("aiter", "benchmarks")
        for path in sorted((REPO / top).rglob("*.py"))
        if path != REPO / "aiter" / "flydsl_bridge" / "manifest.py"
    ]


def test_no_other_module_parses_or_writes_the_manifest():
    """A module that names the manifest file does not parse or write JSON, and none spells the
    manifest's keys: they all go through the typed API of aiter.flydsl_bridge.manifest."""
    names_the_file = re.compile(r"MANIFEST_NAME|aiter_aot_manifest\.json|manifest_path\(")
    json_io = re.compile(r"\bjson\.(loads?|dumps?)\(")
    keys = re.compile(r"""["'](requested_by|compile_seconds)["']|\[["']builds["']\]""")
    offenders = []
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(REPO)
        if names_the_file.search(text) and json_io.search(text):
            offenders.append(f"{rel}: names the manifest file and reads or writes JSON")
        offenders += [f"{rel}: spells the manifest key {m.group(0)}" for m in keys.finditer(text)]
    assert offenders == []


def test_the_manifest_needs_neither_the_builder_nor_torch():
    code = (
        "import sys, aiter.flydsl_bridge.manifest, aiter.typed_json\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'flydsl')"
        " or m.startswith('aiter.aot')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == "[]"
