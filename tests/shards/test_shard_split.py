"""--shard I/N's split: a partition of the jobs, the same for any order of the tables' files
and any checkout directory, balanced by job count, and with an earlier manifest by compile time,
jobs that share a kernel kept together."""

from __future__ import annotations

import random

import pytest

from aiter.aot.flydsl.jobs import shards
from aiter.aot.flydsl.jobs.records import JobInfo
from aiter.flydsl_bridge.manifest import KernelEntry, Manifest, Requester


def _job(row: int, lo: int = 1, hi: int = 64, root: str = "/a", group: str = "") -> JobInfo:
    return JobInfo("gemm", "bf16_tuned_gemm.csv", f"{root}/bf16_tuned_gemm.csv:{row}", "gfx942",
                   304, "", "M", lo, hi, group=group)  # fmt: skip


def test_every_job_is_in_exactly_one_shard() -> None:
    jobs = [_job(row) for row in range(2, 60)]
    parts = [shards.select(jobs, shards.Shard(i, 4)) for i in range(4)]
    assert sorted(i for part in parts for i in part) == list(range(len(jobs)))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # by job count


def test_the_split_is_the_same_from_another_directory_and_order() -> None:
    jobs = [_job(row) for row in range(2, 40)]
    moved = [_job(row, root="/elsewhere/checkout") for row in range(2, 40)]
    order = list(range(len(jobs)))
    random.Random(1).shuffle(order)
    shuffled = [moved[i] for i in order]
    assign = shards.assign(jobs, 3)
    again = shards.assign(shuffled, 3)
    assert [again[order.index(i)] for i in range(len(jobs))] == assign


def test_a_grid_group_stays_in_one_shard() -> None:
    grid = [_job(2, lo, lo + 9, group="/a/t.csv:2 causal=1") for lo in range(1, 200, 10)]
    others = [_job(row) for row in range(3, 23)]
    shard_of = shards.assign([*grid, *others], 4)
    assert len({shard_of[i] for i in range(len(grid))}) == 1


def _manifest(asked: dict[str, list[tuple[int, float]]]) -> Manifest:
    """An earlier build: each entry with the rows that asked for it and its compile seconds."""
    kernels = {}
    for rel, rows in asked.items():
        requesters = [Requester("gemm", "bf16_tuned_gemm.csv", f"/old/bf16_tuned_gemm.csv:{r}",
                                "M", 1, 64) for r, _ in rows]  # fmt: skip
        kernels[rel] = KernelEntry("f", "", 1, "0" * 64, rows[0][1], requesters)
    return Manifest(archs={"gfx942": {"gemm": kernels}})


def test_estimates_balance_compile_time_and_keep_sharers_together() -> None:
    # Rows 2-5 share one 40 s kernel; rows 6-9 each compile their own 10 s kernel.
    asked = {"k_shared/a.pkl": [(r, 40.0) for r in range(2, 6)]}
    asked |= {f"k_{r}/b.pkl": [(r, 10.0)] for r in range(6, 10)}
    estimates = shards.CompileEstimates(_manifest(asked))
    jobs = [_job(row) for row in range(2, 10)]
    shard_of = shards.assign(jobs, 2, estimates)
    assert len({shard_of[i] for i in range(4)}) == 1  # the sharers: one compile of the kernel
    assert {shard_of[i] for i in range(4, 8)} == {1 - shard_of[0]}  # 40 s against 4 x 10 s
    by_count = shards.assign(jobs, 2)
    assert len({by_count[i] for i in range(4)}) == 2  # without them the sharers split


def test_a_job_asks_for_what_its_range_overlapped() -> None:
    asked = {"k/a.pkl": [(2, 5.0)]}
    estimates = shards.CompileEstimates(_manifest(asked))
    assert estimates.kernels(_job(2, 33, 64)) == {"k/a.pkl": 5.0}
    assert estimates.kernels(_job(2, 65, 128)) == {}
    assert estimates.kernels(_job(3)) == {}


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/2", "0/0", ""])
def test_a_bad_shard_names_the_form(text) -> None:
    with pytest.raises(ValueError, match=rf"--shard {text}: expected I/N with 0 <= I < N"):
        shards.parse_shard(text)


def test_estimates_must_be_a_manifest(tmp_path) -> None:
    with pytest.raises(ValueError, match="--estimates .*: expected an aiter manifest"):
        shards.CompileEstimates.read(str(tmp_path))
