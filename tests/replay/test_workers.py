"""Tests of aiter.aot.flydsl.execution.workers: tasks in forked children, a few at a time.

A child that raises or dies fails only its own task; the parent (this pytest) carries on.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiter.aot.flydsl.execution.budget import WorkerBudget
from aiter.aot.flydsl.execution.workers import TaskOutcome, run_forked
from tests.aot_cli import default_signals


def test_results_come_back_per_task_in_order() -> None:
    parent = os.getpid()
    done: list[TaskOutcome] = []

    def run(task: dict) -> dict:
        time.sleep(task["sleep"])
        return {"id": task["id"], "square": task["id"] ** 2, "in_child": os.getpid() != parent}

    tasks = [{"id": i, "sleep": s} for i, s in enumerate([0.6, 0.0, 0.3, 0.0])]
    outcomes = run_forked(tasks, run, workers=4, on_done=done.append)
    assert outcomes == [
        TaskOutcome(i, True, {"id": i, "square": i * i, "in_child": True}, None) for i in range(4)
    ]
    # on_done hears each outcome once, as it finishes: the slow first task comes last.
    assert sorted(done, key=lambda o: o.index) == outcomes
    assert done[-1].index == 0


def test_empty_task_list() -> None:
    assert run_forked([], lambda task: task, workers=2) == []


def test_a_raising_task_fails_alone() -> None:
    def run(task: int) -> int:
        if task == 2:
            raise ValueError(f"bad task {task}")
        if task == 3:
            raise KeyError("missing")
        return task * 10

    outcomes = run_forked([0, 1, 2, 3, 4], run, workers=2)
    assert outcomes == [
        TaskOutcome(0, True, 0, None),
        TaskOutcome(1, True, 10, None),
        TaskOutcome(2, False, None, "ValueError: bad task 2"),
        TaskOutcome(3, False, None, "KeyError: 'missing'"),
        TaskOutcome(4, True, 40, None),
    ]


def test_system_exit_in_a_task_is_reported() -> None:
    def run(task: int) -> int:
        if task == 1:
            raise SystemExit(7)
        return task

    outcomes = run_forked([0, 1], run, workers=1)
    assert outcomes == [TaskOutcome(0, True, 0, None), TaskOutcome(1, False, None, "SystemExit: 7")]


@pytest.mark.parametrize("sig", [signal.SIGABRT, signal.SIGKILL, signal.SIGSEGV])
def test_a_task_killed_by_a_signal_fails_alone(sig: signal.Signals) -> None:
    def run(task: str) -> str:
        if task == "die":
            faulthandler.disable()  # no traceback dump on the test's stderr
            if sig != signal.SIGKILL:  # die of it even if this pytest inherited it ignored
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            time.sleep(5)
        return task.upper()

    outcomes = run_forked(["a", "die", "b", "c"], run, workers=2)
    assert outcomes == [
        TaskOutcome(0, True, "A", None),
        TaskOutcome(1, False, None, f"worker killed by {sig.name}"),
        TaskOutcome(2, True, "B", None),
        TaskOutcome(3, True, "C", None),
    ]


def test_a_task_exiting_without_a_result() -> None:
    def run(task: int) -> int:
        if task == 0:
            os._exit(3)
        return task

    assert run_forked([0, 1], run, workers=2) == [
        TaskOutcome(0, False, None, "worker exited with status 3"),
        TaskOutcome(1, True, 1, None),
    ]


def test_a_result_that_cannot_be_pickled_names_the_cause() -> None:
    (outcome,) = run_forked([0], lambda task: (lambda: task), workers=1)
    assert (outcome.ok, outcome.result) == (False, None)
    assert outcome.error.startswith("the task's result cannot be pickled")


def test_a_typed_result_comes_back_as_it_was() -> None:
    (outcome,) = run_forked([7], lambda task: TaskOutcome(task, True, {1, 2}, None), workers=1)
    assert outcome.result == TaskOutcome(7, True, {1, 2}, None)


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    return max(sum(1 for s, e in intervals if s <= start < e) for start, _ in intervals)


@pytest.mark.parametrize(
    "workers", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow)]
)
def test_at_most_workers_children_at_once(tmp_path: Path, workers: int) -> None:
    def run(task: int) -> int:
        start = time.monotonic()
        time.sleep(0.15)
        (tmp_path / f"{task}.json").write_text(json.dumps([start, time.monotonic()]))
        return task

    outcomes = run_forked(list(range(6)), run, workers=workers)
    assert [o.result for o in outcomes] == list(range(6))
    intervals = [tuple(json.loads((tmp_path / f"{i}.json").read_text())) for i in range(6)]
    # A new child is forked only after another was reaped, so the bound is exact, and with
    # sleeping tasks the workers do run side by side.
    assert _max_overlap(intervals) == workers


def test_a_shared_budget_bounds_the_workers_too(tmp_path: Path) -> None:
    """Three slots but two tokens, one of them held elsewhere: one child at a time, and every
    token is back when the pool is done."""
    budget = WorkerBudget.create(2)
    assert budget.try_acquire()  # another process of the build holds this one

    def run(task: int) -> int:
        start = time.monotonic()
        time.sleep(0.1)
        (tmp_path / f"{task}.json").write_text(json.dumps([start, time.monotonic()]))
        return task

    outcomes = run_forked(list(range(4)), run, workers=3, budget=budget)
    assert [o.result for o in outcomes] == list(range(4))
    intervals = [tuple(json.loads((tmp_path / f"{i}.json").read_text())) for i in range(4)]
    assert _max_overlap(intervals) == 1
    budget.release()
    assert budget.try_acquire() and budget.try_acquire() and not budget.try_acquire()


@pytest.mark.parametrize("workers", [0, -1])
def test_workers_below_one_refused(workers: int) -> None:
    ran = []
    with pytest.raises(ValueError) as info:
        run_forked([1], ran.append, workers=workers)
    assert str(info.value) == f"workers must be >= 1, got {workers}"
    assert ran == []


def test_other_children_of_the_parent_keep_their_status() -> None:
    other = subprocess.Popen(["sh", "-c", "exit 3"])
    time.sleep(0.2)  # let it finish before the workers start reaping
    assert run_forked([0], lambda task: time.sleep(0.2) or task, workers=1)[0].ok
    assert other.wait(timeout=10) == 3


def test_a_task_over_its_timeout_is_killed_and_fails_alone() -> None:
    def run(task: float) -> float:
        time.sleep(task)
        return task

    start = time.monotonic()
    outcomes = run_forked([30.0, 0.0, 0.05], run, workers=3, timeout=1.0)
    assert time.monotonic() - start < 20  # the 30 s task did not run its course
    assert outcomes[0] == TaskOutcome(0, False, None, "timed out after 1 s; the worker was killed")
    assert [o.ok for o in outcomes[1:]] == [True, True]


CTRL_C_DURING_FORK = """
import os, signal
from aiter.aot.flydsl.execution.workers import run_forked

# The child's at-fork hooks run before any worker code: a Ctrl-C there is the race to survive.
os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))
[outcome] = run_forked([1], lambda task: task, workers=1)
print(outcome.ok, outcome.error)
"""


def test_a_ctrl_c_during_the_fork_is_a_failed_task_not_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_DURING_FORK],
        preexec_fn=default_signals(signal.SIGINT),  # SIGINT raises, as in a terminal
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False KeyboardInterrupt"
    assert done.stderr == ""
