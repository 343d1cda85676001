"""Runs tasks in forked child processes, a few at a time.

A child that dies (an LLVM abort is a SIGABRT) fails its own task; the parent carries on.
"""

from __future__ import annotations

import json
import os
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


@dataclass(frozen=True)
class TaskOutcome:
    index: int
    ok: bool
    result: Any  # what the task returned (JSON-able), when ok
    error: str | None  # why it failed, when not ok


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"worker killed by {name}"
    return f"worker exited with status {os.WEXITSTATUS(status)}"


def _child(task: Any, run: Callable[[Any], Any], out_path: Path) -> None:
    code = 0
    try:
        text = json.dumps({"ok": True, "result": run(task)})
    except BaseException as err:  # the parent must hear about every failure
        code = 1
        if isinstance(err, (TypeError, ValueError)) and "JSON" in str(err):
            detail = f"the task's result is not JSON-serialisable: {err}"
        else:
            detail = traceback.format_exception_only(type(err), err)[-1].strip()
        text = json.dumps({"ok": False, "error": detail})
    try:
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, out_path)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_forked(
    tasks: Sequence[Any],
    run: Callable[[Any], Any],
    workers: int,
    on_done: Callable[[TaskOutcome], None] | None = None,
) -> list[TaskOutcome]:
    """Run `run(task)` for each task in a forked child, at most `workers` at once."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    outcomes: list[TaskOutcome | None] = [None] * len(tasks)
    running: dict[int, tuple[int, Path]] = {}  # pid -> (task index, result file)
    pending = list(range(len(tasks)))
    with tempfile.TemporaryDirectory(prefix="aiter-workers-") as tmp:
        while pending or running:
            while pending and len(running) < workers:
                index = pending.pop(0)
                out_path = Path(tmp) / f"{index}.json"
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(tasks[index], run, out_path)
                running[pid] = (index, out_path)
            pid, status = _wait_for_one(running)
            index, out_path = running.pop(pid)
            outcome = _collect(index, status, out_path)
            outcomes[index] = outcome
            if on_done is not None:
                on_done(outcome)
    return [o for o in outcomes if o is not None]


def _wait_for_one(running: dict[int, tuple[int, Path]]) -> tuple[int, int]:
    """Reap one of our own workers; other children of this process keep their status."""
    while True:
        for pid in running:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return pid, status
        time.sleep(POLL_SECONDS)


def _collect(index: int, status: int, out_path: Path) -> TaskOutcome:
    payload = None
    if out_path.is_file():
        payload = json.loads(out_path.read_text())
    if payload is not None and payload["ok"] and status == 0:
        return TaskOutcome(index, True, payload["result"], None)
    if payload is not None and not payload["ok"]:
        return TaskOutcome(index, False, None, payload["error"])
    return TaskOutcome(index, False, None, _describe_status(status))
