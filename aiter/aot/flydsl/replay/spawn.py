"""Starting the per-arch replay processes: forked from a warm driver, or fresh interpreters.

Every arch process needs torch, torch._dynamo (which FakeTensorMode imports at its first use),
FlyDSL and the families' operator modules before its first job: about 5 s of CPU, the same in
each. So the driver, once it knows it must replay, imports them once (`warm_up`) and forks the
arch processes from itself; each then sets its own environment and runs `arch_process_main` as
`python -m aiter.aot.flydsl.replay.arch_process` would. Nothing arch-specific is read before the fork:
FlyDSL reads its target and cache directory at a kernel's first call, aiter's runtime its
settings at an entry's first call, and the driver calls neither. A driver that cannot fork
safely (no os.fork, other threads running) or `AITER_AOT_WARM_FORK=0` starts fresh
interpreters instead.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

from aiter.aot.flydsl.execution.workers import exit_child, fork
from aiter.aot.flydsl.jobs.records import EXIT_INTERRUPTED
from aiter.aot.flydsl.replay import operators

WARM_FORK_ENV = "AITER_AOT_WARM_FORK"
EXIT_CRASHED = 1  # the arch process raised: the traceback is on stderr


def can_fork() -> bool:
    """Whether arch processes are forked from this process: single-threaded (a fork keeps only
    the calling thread), on a platform with fork, not turned off by AITER_AOT_WARM_FORK=0."""
    return (
        hasattr(os, "fork")
        and os.environ.get(WARM_FORK_ENV, "1") != "0"
        and threading.active_count() == 1
    )


def warm_up(module_paths: Iterable[str]) -> None:
    """Import, without calling, what every arch process loads before its first job: torch and
    torch._dynamo, the dry run and naming, FlyDSL's jit machinery, every operator entry of
    aiter and their kernel modules, each AOT module and the packages it declares as its
    runtime."""
    import torch
    import torch._dynamo  # noqa: F401  (what FakeTensorMode imports at its first use)

    from aiter.aot.flydsl import dry_run, registry  # noqa: F401
    from aiter.aot.flydsl.replay import naming  # noqa: F401
    from aiter.flydsl_bridge import internals

    internals.jit_function()
    operators.import_all()
    for path in module_paths:
        for package in registry.load(path).sources:
            importlib.import_module(package)
    torch.set_num_threads(1)  # as every arch process sets it


class ForkedProcess:
    """The part of subprocess.Popen the driver uses, for a child forked from it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:  # not reaped yet: the pid is still this child's
            os.kill(self.pid, signal.SIGKILL)


def start(
    spec_path: str, env: dict[str, str], pass_fds: Sequence[int], close_fds: Sequence[int]
) -> Any:
    """Start the arch process of the spec at `spec_path` with environment `env`, keeping
    `pass_fds` open in it; forked (the fds in `close_fds`, the driver's own, closed in the
    child) where `can_fork()`, else a fresh interpreter. Returns a Popen or a ForkedProcess."""
    if not can_fork():
        cmd = [sys.executable, "-m", "aiter.aot.flydsl.replay.arch_process", spec_path]
        return subprocess.Popen(cmd, env=env, pass_fds=tuple(pass_fds))
    return ForkedProcess(fork(lambda: _child(spec_path, env, close_fds)))


def _child(spec_path: str, env: dict[str, str], close_fds: Sequence[int]) -> None:
    """The forked arch process: never returns into the driver's code, never runs its exit
    handlers (its temporary directory is the driver's to remove)."""
    code = EXIT_CRASHED
    try:
        for fd in close_fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        from aiter.aot.flydsl.replay.arch_process import arch_process_main

        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        code = arch_process_main(spec_path)
    except KeyboardInterrupt:  # the driver says so, once, for every arch
        code = EXIT_INTERRUPTED
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else EXIT_CRASHED
    except BaseException:
        traceback.print_exc()
    finally:
        exit_child(code)
