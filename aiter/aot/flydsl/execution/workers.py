"""Runs tasks in forked child processes, a few at a time.

A child that dies (an LLVM abort is a SIGABRT) fails its own task; the parent carries on.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.005
CANNOT_REPORT = 113  # a worker's exit status when it could not write its result (rare by design)


@dataclass(frozen=True)
class TaskOutcome:
    index: int
    ok: bool
    result: Any  # what the task returned (picklable: passed back as is), when ok
    error: str | None  # why it failed, when not ok


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"worker killed by {name}"
    if os.WEXITSTATUS(status) == CANNOT_REPORT:
        return (
            "the worker could not write its result "
            "(the disk is full or a file-size limit was reached)"
        )
    return f"worker exited with status {os.WEXITSTATUS(status)}"


def _child(task: Any, run: Callable[[Any], Any], out_path: Path) -> None:
    """Run the task and write its outcome; whatever happens, the child never returns to the
    parent's code (os._exit in the outer finally), and never prints a traceback."""
    code = CANNOT_REPORT
    try:
        try:
            # A Ctrl-C that came during the fork is raised here and reported as a failure.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            data, failed = _pickled({"ok": True, "result": run(task)}), False
        except BaseException as err:  # the parent must hear about every failure
            data, failed = _pickled({"ok": False, "error": _failure(err)}), True
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the outcome is known: write it
        tmp = out_path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out_path)
        code = 1 if failed else 0
    except BaseException:
        pass  # no result file: the parent reports CANNOT_REPORT
    finally:
        exit_child(code)


class _Unpicklable(Exception):
    """The task's result cannot be passed back to the parent."""


def _pickled(outcome: dict[str, Any]) -> bytes:
    try:
        return pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:
        raise _Unpicklable(f"the task's result cannot be pickled: {err}") from None


def _failure(err: BaseException) -> str:
    if isinstance(err, _Unpicklable):
        return str(err)
    return traceback.format_exception_only(type(err), err)[-1].strip()


def exit_child(code: int) -> None:
    """End a forked child with `code`: its output flushed, no exit handler of the parent run."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def fork(child: Callable[[], None], record: Callable[[int], None] = lambda pid: None) -> int:
    """Fork a process that runs `child`, which must end in os._exit; in the parent,
    `record(pid)` runs before a Ctrl-C can land. Returns the pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    # Objects that exist now are never collected in the child: its garbage collector then
    # leaves them alone, so fewer of the parent's pages are copied into it.
    gc.freeze()
    # Ctrl-C waits until the fork is over: in the child, Python's at-fork hooks would print its
    # KeyboardInterrupt as a traceback; in the parent, the pid must be recorded first.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = os.fork()
        if pid == 0:
            child()
        gc.unfreeze()
        record(pid)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return pid


class ForkPool:
    """Forked workers started one task at a time, at most `workers` at once and, with a budget
    shared by several processes, only while a token of that budget is held."""

    def __init__(self, workers: int, budget: Any = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.budget = budget  # a WorkerBudget, or None for this process alone
        self._running: dict[int, tuple[Any, Path]] = {}  # pid -> (task key, result file)
        self._deadlines: dict[int, tuple[float, float]] = {}  # pid -> (monotonic end, limit)
        self._tmp = tempfile.TemporaryDirectory(prefix="aiter-workers-")
        self._serial = 0

    @property
    def busy(self) -> int:
        return len(self._running)

    def reserve(self) -> bool:
        """Claim a slot for one more worker; True means start() may be called once."""
        if len(self._running) >= self.workers:
            return False
        return self.budget is None or self.budget.try_acquire()

    def start(
        self, key: Any, task: Any, run: Callable[[Any], Any], timeout: float | None = None
    ) -> None:
        """Fork a worker for `task` in a slot claimed by reserve(); a worker still running
        after `timeout` seconds is killed and its task fails."""
        self._serial += 1
        out_path = Path(self._tmp.name) / f"{self._serial}.pickle"

        def record(pid: int) -> None:
            self._running[pid] = (key, out_path)
            if timeout is not None:
                self._deadlines[pid] = (time.monotonic() + timeout, timeout)

        fork(lambda: _child(task, run, out_path), record)

    def wait(self, timeout: float | None = None) -> tuple[Any, TaskOutcome] | None:
        """Reap one finished worker: (its task key, outcome); None if none ended in `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._running and timeout:
            time.sleep(min(timeout, 0.05))  # waiting for another process's token: do not spin
        while self._running:
            for pid in list(self._running):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return self._reaped(pid, _collect(-1, status, self._running[pid][1]))
                end, limit = self._deadlines.get(pid, (None, None))
                if end is not None and time.monotonic() >= end:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    error = f"timed out after {limit:g} s; the worker was killed"
                    return self._reaped(pid, TaskOutcome(-1, False, None, error))
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(POLL_SECONDS)
        return None

    def _reaped(self, pid: int, outcome: TaskOutcome) -> tuple[Any, TaskOutcome]:
        key, _ = self._running.pop(pid)
        self._deadlines.pop(pid, None)
        if self.budget is not None:
            self.budget.release()
        return key, outcome

    def close(self) -> None:
        """Kill workers still running (the caller gave up on them) and remove the results."""
        for pid in list(self._running):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self._reaped(pid, TaskOutcome(-1, False, None, "abandoned"))
        self._tmp.cleanup()


def run_forked(
    tasks: Sequence[Any],
    run: Callable[[Any], Any],
    workers: int,
    on_done: Callable[[TaskOutcome], None] | None = None,
    budget: Any = None,
    timeout: float | None = None,
) -> list[TaskOutcome]:
    """Run `run(task)` for each task in a forked child, at most `workers` at once; a task
    still running after `timeout` seconds fails and its child is killed."""
    pool = ForkPool(workers, budget)
    outcomes: list[TaskOutcome | None] = [None] * len(tasks)
    pending = list(range(len(tasks)))
    try:
        while pending or pool.busy:
            while pending and pool.reserve():
                index = pending.pop(0)
                pool.start(index, tasks[index], run, timeout)
            finished = pool.wait(timeout=0.05)
            if finished is None:
                continue
            index, outcome = finished
            outcome = TaskOutcome(index, outcome.ok, outcome.result, outcome.error)
            outcomes[index] = outcome
            if on_done is not None:
                on_done(outcome)
    finally:
        pool.close()
    return [o for o in outcomes if o is not None]


def _collect(index: int, status: int, out_path: Path) -> TaskOutcome:
    payload = None
    if out_path.is_file():
        payload = pickle.loads(out_path.read_bytes())
    if payload is not None and payload["ok"] and status == 0:
        return TaskOutcome(index, True, payload["result"], None)
    if payload is not None and not payload["ok"]:
        return TaskOutcome(index, False, None, payload["error"])
    return TaskOutcome(index, False, None, _describe_status(status))
