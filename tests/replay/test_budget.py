"""Tests of aiter.aot.flydsl.execution.budget: one pool of worker tokens in a pipe, shared by processes.

Includes a real child process that opens the pool from its environment and competes for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiter.aot.flydsl.execution.budget import BUDGET_ENV, WorkerBudget

REPO = Path(__file__).resolve().parents[2]

# Takes up to 2 tokens without waiting, prints how many it got and gives them back.
CHILD = """
from aiter.aot.flydsl.execution.budget import WorkerBudget
budget = WorkerBudget.from_env()
got = sum(budget.try_acquire() for _ in range(2))
print(got)
budget.release_all()
"""


@pytest.fixture
def budget() -> Iterator[WorkerBudget]:
    pool = WorkerBudget.create(3)
    yield pool
    pool.close()


def _drain(pool: WorkerBudget) -> int:
    """How many tokens are free: takes them all, then gives back everything held."""
    count = 0
    while pool.try_acquire():
        count += 1
    pool.release_all()
    return count


def test_acquire_and_release_count_held_tokens(budget: WorkerBudget) -> None:
    assert budget.held == 0
    assert budget.acquire(timeout=1.0)
    assert budget.try_acquire()
    assert budget.held == 2
    budget.release()
    assert budget.held == 1
    budget.release()
    assert budget.held == 0
    assert _drain(budget) == 3


def test_try_acquire_on_an_empty_pool_returns_false_at_once(budget: WorkerBudget) -> None:
    assert all(budget.try_acquire() for _ in range(3))
    start = time.monotonic()
    assert not budget.try_acquire()
    assert time.monotonic() - start < 1.0
    assert budget.held == 3


def test_acquire_with_a_timeout_gives_up_on_an_empty_pool(budget: WorkerBudget) -> None:
    assert all(budget.try_acquire() for _ in range(3))
    start = time.monotonic()
    assert not budget.acquire(timeout=0.2)
    assert time.monotonic() - start >= 0.1
    assert budget.held == 3


def test_release_without_a_held_token_is_refused(budget: WorkerBudget) -> None:
    with pytest.raises(RuntimeError):
        budget.release()
    assert _drain(budget) == 3


def test_release_all_gives_back_every_held_token(budget: WorkerBudget) -> None:
    assert all(budget.try_acquire() for _ in range(3))
    assert budget.release_all() == 3
    assert budget.held == 0
    assert budget.release_all() == 0
    assert _drain(budget) == 3


def test_add_refills_the_pool(budget: WorkerBudget) -> None:
    assert all(budget.try_acquire() for _ in range(3))
    budget.add(2)
    assert budget.try_acquire()
    assert budget.try_acquire()
    assert not budget.try_acquire()
    with pytest.raises(ValueError):
        budget.add(-1)


def test_create_needs_at_least_one_token() -> None:
    with pytest.raises(ValueError):
        WorkerBudget.create(0)


def test_local_budget_works_alone() -> None:
    pool = WorkerBudget.local(1)
    try:
        assert pool.try_acquire()
        assert not pool.try_acquire()
        pool.release()
        assert pool.held == 0
    finally:
        pool.close()


def test_child_env_names_the_fds(budget: WorkerBudget) -> None:
    read_fd, write_fd = budget.fds
    assert budget.child_env() == {BUDGET_ENV: f"{read_fd},{write_fd}"}
    assert os.get_inheritable(read_fd) and os.get_inheritable(write_fd)
    assert not os.get_blocking(read_fd)


def test_from_env_round_trip(budget: WorkerBudget) -> None:
    other = WorkerBudget.from_env(budget.child_env())
    assert other is not None
    assert other.fds == budget.fds
    assert other.held == 0
    # The same pipe: tokens one side takes, the other cannot.
    assert other.try_acquire() and other.try_acquire()
    assert budget.try_acquire()
    assert not budget.try_acquire()
    assert not other.try_acquire()
    other.release_all()
    budget.release_all()


def test_from_env_without_the_variable_is_none() -> None:
    assert WorkerBudget.from_env({}) is None


@pytest.mark.parametrize("value", ["", "3", "a,b", "1,2,3", "4;5"])
def test_from_env_rejects_a_malformed_value(value: str) -> None:
    with pytest.raises(ValueError, match=BUDGET_ENV):
        WorkerBudget.from_env({BUDGET_ENV: value})


def test_from_env_rejects_fds_that_are_not_open_pipes(tmp_path: Path) -> None:
    with open(tmp_path / "file", "w") as handle:
        fd = handle.fileno()
        with pytest.raises(ValueError, match=BUDGET_ENV):
            WorkerBudget.from_env({BUDGET_ENV: f"{fd},{fd}"})
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    os.close(write_fd)
    with pytest.raises(ValueError, match=BUDGET_ENV):
        WorkerBudget.from_env({BUDGET_ENV: f"{read_fd},{write_fd}"})


def test_a_child_process_shares_the_pool(budget: WorkerBudget) -> None:
    assert budget.try_acquire() and budget.try_acquire()
    env = {**os.environ, **budget.child_env()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        pass_fds=budget.fds,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "1"
    # The child gave its token back before exiting.
    budget.release_all()
    assert _drain(budget) == 3


def test_a_forked_child_does_not_inherit_held_tokens(budget: WorkerBudget) -> None:
    assert budget.try_acquire()
    pid = os.fork()
    if pid == 0:
        code = 0 if budget.held == 0 and budget.release_all() == 0 else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert budget.held == 1
    budget.release_all()
    assert _drain(budget) == 3


def test_a_closed_budget_refuses_use() -> None:
    pool = WorkerBudget.create(1)
    pool.close()
    pool.close()
    with pytest.raises(ValueError):
        pool.try_acquire()
    with pytest.raises(ValueError):
        pool.acquire(timeout=0)
