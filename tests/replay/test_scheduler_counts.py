"""The arch process's progress counts (jobs named, failed) are kept as results arrive, and always
equal a recount over the results: a job failed by its naming worker, a job whose compile failed
after it was named, and a result that replaces another."""

from __future__ import annotations

from types import SimpleNamespace

from aiter.aot.flydsl.jobs.records import JobInfo, JobResult, Mode, Tag
from aiter.aot.flydsl.replay.arch_process import ProgressPipe, _Scheduler


def _scheduler(jobs: int) -> _Scheduler:
    infos = [
        JobInfo("m", "t.csv", f"t.csv:{i + 2}", "gfx942", 304, "", "M", 1, 8) for i in range(jobs)
    ]
    pool = SimpleNamespace(busy=False, workers=2)
    entries = SimpleNamespace(forget=lambda files: None)
    return _Scheduler(
        [SimpleNamespace(info=info) for info in infos],
        [None] * jobs,
        Mode.CHECK,
        0,
        0,
        {},
        pool,
        ProgressPipe(None),
        entries,
    )


def _recount(scheduler: _Scheduler) -> tuple[int, int]:
    results = [r for r in scheduler.results if r is not None]
    return len(results), sum(r.tag == Tag.FAIL for r in results)


def test_counts_follow_every_way_a_result_arrives_or_changes() -> None:
    scheduler = _scheduler(5)
    info = scheduler.jobs
    scheduler.accept(0, JobResult(info[0].info, Tag.OK))
    scheduler.accept(1, JobResult(info[1].info, Tag.FAIL, "naming worker: killed"))
    scheduler.accept(2, JobResult(info[2].info, Tag.SKIP, "runtime declines"))
    assert (scheduler.done, scheduler.failed) == _recount(scheduler) == (3, 1)
    scheduler.accept(1, JobResult(info[1].info, Tag.OK))  # a result replacing a failed one
    assert (scheduler.done, scheduler.failed) == _recount(scheduler) == (3, 0)

    task = SimpleNamespace(job=0, files=(), values={"M": 4})
    scheduler._compiled(task, SimpleNamespace(ok=False, error="compiler crashed"))
    assert scheduler.results[0].tag == Tag.FAIL
    assert (scheduler.done, scheduler.failed) == _recount(scheduler) == (3, 1)
    scheduler._compiled(task, SimpleNamespace(ok=False, error="again"))  # already failed
    assert (scheduler.done, scheduler.failed) == _recount(scheduler) == (3, 1)
    scheduler.send_counts()  # as the run loop does after each finished task
    assert scheduler.pipe.counts["jobs_done"] == 3 and scheduler.pipe.counts["failed"] == 1
