"""The manifest: updates under a lock keep every arch's and module's part, an unreadable one is
started anew, and entries are judged whole by their bytes and code objects."""

from __future__ import annotations

import pytest


def test_an_unreadable_manifest_is_started_anew(tmp_path):
    from aiter.flydsl_bridge import manifest

    (tmp_path / manifest.MANIFEST_NAME).write_text("{ not json")
    with pytest.raises(ValueError, match="not a valid aiter manifest"):
        manifest.read_manifest(tmp_path)
    manifest.update_manifest(tmp_path, "gfx942", "gemm", {"a/b.pkl": {"size": 1}}, {"aiter": "x"})
    assert manifest.read_manifest(tmp_path)["archs"] == {
        "gfx942": {"gemm": {"a/b.pkl": {"size": 1}}}
    }


def _update_many(cache_dir: str, arch: str) -> None:
    from aiter.flydsl_bridge import manifest

    for i in range(20):
        manifest.update_manifest(cache_dir, arch, f"m{i % 3}", {f"{arch}/{i}.pkl": {}}, {})


def test_concurrent_manifest_updates_keep_every_part(tmp_path):
    import multiprocessing

    from aiter.flydsl_bridge import manifest

    archs = [f"gfx{n}" for n in range(6)]
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_update_many, args=(str(tmp_path), a)) for a in archs]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    assert all(p.exitcode == 0 for p in processes)
    data = manifest.read_manifest(tmp_path)
    assert sorted(data["archs"]) == archs
    assert all(sorted(data["archs"][a]) == ["m0", "m1", "m2"] for a in archs)
