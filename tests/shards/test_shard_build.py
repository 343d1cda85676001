"""Sharded builds of a small GEMM table, for real: two shards built apart merge into the cache
an unsharded build lists and `--check --sample` passes on it; a shard killed mid-build is
refused by merge until it is rerun alone, which completes it; `--estimates` splits by an
earlier manifest."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from aiter.flydsl_bridge import manifest
from tests.aot_cli import REPO, replay_reports, run_aot, start_aot

pytestmark = pytest.mark.slow  # each shard compiles about a dozen kernels

TABLES = {"AITER_CONFIG_DIR": str(REPO / ".ci" / "audit_tables"), "GPU_ARCHS": "gfx942"}


def build(cache: Path, *args: str) -> subprocess.CompletedProcess:
    return run_aot("aiter.aot.flydsl", "--module", "gemm", "--cache-dir", str(cache), "-j", "2",
                   *args, env=TABLES)  # fmt: skip


@pytest.fixture(scope="module")
def shard_caches(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("shards")
    caches = []
    for index in range(2):
        cache = root / f"shard{index}"
        proc = build(cache, "--shard", f"{index}/2")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"shard {index}/2 of gfx942: 2 of 4 jobs" in proc.stdout
        caches.append(cache)
    return caches


def _entries(cache: Path) -> set[str]:
    manifest._read_before.clear()
    return set(manifest.read(cache).entries("gfx942"))


def _listed(tmp_path: Path) -> set[str]:
    """What an unsharded build of the same table would compile, relative to a cache root."""
    cache = tmp_path / "listed"
    proc, reports = replay_reports(
        "aiter.aot.flydsl", TABLES, tmp_path / "list.json", "--list", "--module", "gemm",
        "--cache-dir", str(cache),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {os.path.relpath(path, cache) for path in reports["gfx942"].kernels()}


def test_merged_shards_are_the_unsharded_build(shard_caches, tmp_path) -> None:
    merged = tmp_path / "merged"
    proc = run_aot("aiter.aot.flydsl", "merge", *map(str, shard_caches), "--into", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _entries(merged) == _listed(tmp_path)
    assert _entries(merged) == _entries(shard_caches[0]) | _entries(shard_caches[1])
    check = build(merged, "--check", "--sample", "2")
    assert check.returncode == 0, check.stdout[-3000:]
    again = build(merged)
    assert again.returncode == 0 and "up to date: the fingerprint matches" in again.stdout


def test_a_shard_killed_mid_build_reruns_alone_and_completes(shard_caches, tmp_path) -> None:
    cache = tmp_path / "killed"
    args = ("--module", "gemm", "--cache-dir", str(cache), "-j", "1", "--shard", "0/2")
    proc = start_aot("aiter.aot.flydsl", *args, env=TABLES, start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 600
    while not list(cache.glob("*/*.pkl")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the shard ended before it compiled anything"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    merged = tmp_path / "merged"
    refused = run_aot("aiter.aot.flydsl", "merge", str(cache), str(shard_caches[1]),
                      "--into", str(merged))  # fmt: skip
    assert refused.returncode == 1 and f"refused: {cache}: incomplete" in refused.stderr
    assert not merged.exists()
    rerun = build(cache, "--shard", "0/2")
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert _entries(cache) == _entries(shard_caches[0])
    joined = run_aot("aiter.aot.flydsl", "merge", str(cache), str(shard_caches[1]),
                     "--into", str(merged))  # fmt: skip
    assert joined.returncode == 0, joined.stderr


def test_estimates_split_by_an_earlier_manifest(shard_caches, tmp_path) -> None:
    proc = build(tmp_path / "c", "--list", "--shard", "1/2", "--estimates", str(shard_caches[0]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shard 1/2 of gfx942:" in proc.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--estimates", "x"], "--estimates MANIFEST goes with --shard I/N"),
        (["--shard", "2/2"], "--shard 2/2: expected I/N with 0 <= I < N"),
        (["--shard", "0/2", "--estimates", "/nonexistent"], "--estimates /nonexistent: expected"),
    ],
)
def test_bad_shard_options_are_usage_errors(args, expected, tmp_path) -> None:
    proc = build(tmp_path / "c", "--list", *args)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
