"""One budget of worker processes shared by every per-arch process, like make's jobserver:
a pipe of one-byte tokens; take one before forking a worker and give it back once reaped.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import stat
import time
from collections.abc import Mapping

BUDGET_ENV = "AITER_AOT_BUDGET_FDS"  # "read_fd,write_fd" handed to child processes

# A pipe holds at least this many bytes, so filling it never blocks the writer.
MAX_TOKENS = 4096

_TOKEN = b"+"


class WorkerBudget:
    """Tokens in a pipe; any process holding both ends can take and give back tokens.

    `held` counts what this process has taken and not yet given back. A forked child starts at
    zero, so it can never give back tokens its parent holds.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._held = 0
        self._pid = os.getpid()
        self._closed = False
        for fd in (read_fd, write_fd):
            os.set_inheritable(fd, True)
        # Shared with every process that has the pipe; nobody may block in read().
        os.set_blocking(read_fd, False)

    @classmethod
    def create(cls, tokens: int) -> WorkerBudget:
        """A new pipe holding `tokens` tokens."""
        _check_count(tokens, minimum=1)
        read_fd, write_fd = os.pipe()
        budget = cls(read_fd, write_fd)
        budget._write(tokens)
        return budget

    @classmethod
    def local(cls, tokens: int) -> WorkerBudget:
        """The budget of a process that runs on its own, with no driver sharing it."""
        return cls.create(tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerBudget | None:
        """The budget the parent passed down in BUDGET_ENV, or None when it passed none."""
        env = os.environ if environ is None else environ
        value = env.get(BUDGET_ENV)
        if value is None:
            return None
        try:
            read_text, write_text = value.split(",")
            read_fd, write_fd = int(read_text), int(write_text)
        except ValueError:
            raise ValueError(
                f"{BUDGET_ENV}={value!r} is malformed; expected 'read_fd,write_fd'"
            ) from None
        for fd in (read_fd, write_fd):
            # The variable can outlive the fds it names: a process that got it without pass_fds.
            try:
                is_pipe = fd >= 0 and stat.S_ISFIFO(os.fstat(fd).st_mode)
            except OSError:
                is_pipe = False
            if not is_pipe:
                raise ValueError(
                    f"{BUDGET_ENV}={value!r}: fd {fd} is not an open pipe in this process; "
                    "pass both fds to the child (subprocess pass_fds)"
                )
        return cls(read_fd, write_fd)

    def child_env(self) -> dict[str, str]:
        """The environment entry that lets a child process open this budget with from_env()."""
        return {BUDGET_ENV: f"{self._read_fd},{self._write_fd}"}

    @property
    def fds(self) -> tuple[int, int]:
        """The pipe's (read, write) fds, for subprocess pass_fds."""
        return (self._read_fd, self._write_fd)

    @property
    def held(self) -> int:
        """Tokens this process has taken and not given back."""
        self._forget_parent_tokens()
        return self._held

    def try_acquire(self) -> bool:
        """Take a token if one is free; never blocks."""
        self._check_open()
        self._forget_parent_tokens()
        while True:
            try:
                data = os.read(self._read_fd, 1)
            except InterruptedError:
                continue
            except BlockingIOError:
                return False
            except OSError as err:
                if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return False
                raise
            if not data:
                # Unreachable while this process holds the write end.
                raise RuntimeError("worker budget pipe has no writer left")
            self._held += 1
            return True

    def acquire(self, timeout: float | None = None) -> bool:
        """Take a token, waiting up to `timeout` seconds (forever when None) for one to free up.

        Returns whether a token was taken.
        """
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        while True:
            if self.try_acquire():
                return True
            if deadline is None:
                wait_ms = None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait_ms = max(1, math.ceil(left * 1000))
            try:
                # Another process may take the token first; try_acquire then just fails again.
                poller.poll(wait_ms)
            except InterruptedError:
                continue

    def release(self) -> None:
        """Give back one token this process holds."""
        self._check_open()
        self._forget_parent_tokens()
        if self._held < 1:
            raise RuntimeError("release() without a held token would grow the worker budget")
        self._write(1)
        self._held -= 1

    def release_all(self) -> int:
        """Give back every token this process holds; returns how many."""
        self._check_open()
        self._forget_parent_tokens()
        count = self._held
        if count:
            self._write(count)
            self._held = 0
        return count

    def add(self, tokens: int) -> None:
        """Put tokens into the pool that no process holds any more, e.g. a child's that died."""
        self._check_open()
        _check_count(tokens, minimum=0)
        self._write(tokens)

    def close(self) -> None:
        """Close this process's ends of the pipe; held tokens are not given back."""
        if self._closed:
            return
        self._closed = True
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _write(self, tokens: int) -> None:
        data = _TOKEN * tokens
        while data:
            try:
                written = os.write(self._write_fd, data)
            except InterruptedError:
                continue
            data = data[written:]

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("worker budget is closed")

    def _forget_parent_tokens(self) -> None:
        # After fork the parent's count is copied; those tokens stay the parent's to give back.
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            self._held = 0


def _check_count(tokens: int, minimum: int) -> None:
    if not minimum <= tokens <= MAX_TOKENS:
        raise ValueError(f"token count must be in {minimum}..{MAX_TOKENS}, got {tokens}")
