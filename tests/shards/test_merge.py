"""`python -m aiter.aot.flydsl merge`: the union of caches built apart, checked before anything
is written (incomplete, corrupt or differently built inputs are refused, naming what), entries
copied whole, one copy kept of an entry held twice (the smallest digest where the bytes
differ), manifests joined under the lock, and what was merged verified. The entries here are
stand-ins (the code-object check is left out); tests/shards/test_shard_build.py merges real
shard builds."""

from __future__ import annotations

import hashlib
import multiprocessing
from pathlib import Path

import pytest

from aiter.aot.flydsl.distribution import merge
from aiter.flydsl_bridge import manifest
from aiter.flydsl_bridge.manifest import KernelEntry, Requester

INPUTS = {
    "sources": ["aiter/x.py"],
    "versions": {"flydsl": "0.4.2"},
    "env": {"GPU_ARCHS": "gfx942"},
}


@pytest.fixture(autouse=True)
def stand_in_entries(monkeypatch):
    """Any file is a whole entry of its arch; the manifest is read anew by each test."""
    monkeypatch.setattr(manifest, "entry_defect", lambda path, arch: None)
    monkeypatch.setattr(manifest, "_read_before", {})


def _cache(directory: Path, entries: dict[str, bytes], *, arch: str = "gfx942", shard: str = "",
           fingerprint: str = "fp", inputs: dict | None = None, complete: bool = True) -> Path:  # fmt: skip
    """A cache as a build leaves it: the entry files, its manifest, its build record."""
    kernels = {}
    for rel, data in entries.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        asked = Requester("gemm", "t.csv", f"/x/t.csv:{len(kernels) + 2}", "M", 1, 64)
        digest = hashlib.sha256(data).hexdigest()
        kernels[rel] = KernelEntry("f", "", len(data), digest, 1.0, [asked])
    manifest.update_manifest(directory, arch, "gemm", kernels, {"flydsl": "0.4.2"}, merge=True)
    if complete:
        inputs = inputs or {**INPUTS, "env": {"GPU_ARCHS": arch}}
        manifest.record_build(directory, ["gemm"], [arch], [arch], fingerprint, inputs, shard)
    return directory


def _merge(capsys, *directories: Path, into: Path) -> tuple[int, str, str]:
    code = merge.main([*map(str, directories), "--into", str(into)])
    out, err = capsys.readouterr()
    return code, out, err


def test_shards_merge_into_their_union_and_a_complete_build(tmp_path, capsys) -> None:
    a = _cache(tmp_path / "a", {"k1/x.pkl": b"one", "k2/y.pkl": b"two"}, shard="0/2")
    b = _cache(tmp_path / "b", {"k2/y.pkl": b"two", "k3/z.pkl": b"three"}, shard="1/2")
    code, out, _ = _merge(capsys, a, b, into=tmp_path / "m")
    assert code == 0, out
    merged = manifest.read(tmp_path / "m")
    assert set(merged.entries("gfx942")) == {"k1/x.pkl", "k2/y.pkl", "k3/z.pkl"}
    assert (tmp_path / "m" / "k3/z.pkl").read_bytes() == b"three"
    assert len(merged.entries()["k2/y.pkl"].requested_by) == 2  # both shards asked
    # Both shards of one build: the build is recorded whole, so a rebuild over it is memoized.
    assert merged.build_entries(["gemm"], ["gfx942"], "fp") is not None
    assert "3 of 3 entries present, whole and of their arch" in out


def test_an_entry_compiled_to_other_bytes_keeps_the_smallest_digest(tmp_path, capsys) -> None:
    a = _cache(tmp_path / "a", {"k/x.pkl": b"compile one"}, shard="0/2")
    b = _cache(tmp_path / "b", {"k/x.pkl": b"compile two"}, shard="1/2")
    kept = min([b"compile one", b"compile two"], key=lambda d: hashlib.sha256(d).hexdigest())
    for order, into in (((a, b), "ab"), ((b, a), "ba")):
        code, _, err = _merge(capsys, *order, into=tmp_path / into)
        assert code == 0
        assert (tmp_path / into / "k/x.pkl").read_bytes() == kept
        assert "kept one: k/x.pkl: different compiles" in err and "the smallest digest" in err
        entry = manifest.read(tmp_path / into).entries()["k/x.pkl"]
        assert entry.sha256 == hashlib.sha256(kept).hexdigest()


def test_an_incomplete_shard_is_refused_and_nothing_is_written(tmp_path, capsys) -> None:
    a = _cache(tmp_path / "a", {"k/x.pkl": b"one"}, shard="0/2")
    b = _cache(tmp_path / "b", {"k/y.pkl": b"two"}, shard="1/2", complete=False)
    code, _, err = _merge(capsys, a, b, into=tmp_path / "m")
    assert code == 1
    assert f"refused: {b}: incomplete: its manifest records no completed build" in err
    assert not (tmp_path / "m").exists()
    killed = tmp_path / "killed"
    (killed / "k").mkdir(parents=True)  # entries written, the manifest never was
    code, _, err = _merge(capsys, a, killed, into=tmp_path / "m")
    assert code == 1 and f"refused: {killed}: incomplete: no manifest" in err


def test_a_corrupt_shard_is_refused_naming_the_entry(tmp_path, capsys) -> None:
    target = _cache(tmp_path / "m", {"k/old.pkl": b"old"})
    before = manifest.manifest_path(target).read_bytes()
    a = _cache(tmp_path / "a", {"k/x.pkl": b"one"}, shard="0/2")
    (a / "k/x.pkl").write_bytes(b"on")
    code, _, err = _merge(capsys, a, into=target)
    assert code == 1
    assert f"refused: {a}: corrupt: k/x.pkl: changed since the build that listed it" in err
    assert manifest.manifest_path(target).read_bytes() == before
    assert not (target / "k/x.pkl").exists()


def test_builds_from_other_inputs_are_refused_naming_the_difference(tmp_path, capsys) -> None:
    a = _cache(tmp_path / "a", {"k/x.pkl": b"one"}, shard="0/2")
    other = {**INPUTS, "versions": {"flydsl": "0.4.3"}}
    b = _cache(tmp_path / "b", {"k/y.pkl": b"two"}, shard="1/2", fingerprint="fp2", inputs=other)
    code, _, err = _merge(capsys, a, b, into=tmp_path / "m")
    assert code == 1
    assert f"refused: {b} (shard 1/2): built from other inputs than {a} (shard 0/2)" in err
    assert "versions: flydsl is '0.4.2' here, '0.4.3' there" in err


def test_builds_of_other_archs_may_differ_in_their_targets_only(tmp_path, capsys) -> None:
    a = _cache(tmp_path / "a", {"k1/x.pkl": b"one"})
    b = _cache(tmp_path / "b", {"k2/y.pkl": b"two"}, arch="gfx950", fingerprint="fp950")
    code, out, _ = _merge(capsys, a, b, into=tmp_path / "m")
    assert code == 0, out
    merged = manifest.read(tmp_path / "m")
    assert set(merged.entries("gfx942")) == {"k1/x.pkl"}
    assert set(merged.entries("gfx950")) == {"k2/y.pkl"}


def _merge_in_child(args: list[str]) -> int:
    return merge.main(args)


def test_two_merges_into_one_directory_at_once_lose_nothing(tmp_path) -> None:
    parts = [
        _cache(tmp_path / f"s{i}", {f"k{i}_{j}/e.pkl": f"{i}-{j}".encode() for j in range(20)},
               shard=f"{i}/4")  # fmt: skip
        for i in range(4)
    ]
    into = str(tmp_path / "m")
    jobs = [[str(parts[0]), str(parts[1]), "--into", into],
            [str(parts[2]), str(parts[3]), "--into", into]]  # fmt: skip
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(_merge_in_child, jobs) == [0, 0]
    manifest._read_before.clear()
    merged = manifest.read(tmp_path / "m")
    assert len(merged.entries()) == 80
    assert all((tmp_path / "m" / rel).is_file() for rel in merged.entries())
    assert merged.build_entries(["gemm"], ["gfx942"], "fp") is not None  # all four shards


def test_the_target_may_not_be_an_input(tmp_path, capsys) -> None:
    a = _cache(tmp_path / "a", {"k/x.pkl": b"one"})
    code, _, err = _merge(capsys, a, into=a)
    assert code == 2 and "is also an input" in err
